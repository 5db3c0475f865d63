//! The session's timers: request deadlines and the wait for a cancel's verdict, connect
//! retries, handshake, frame-head and progress limits, heartbeats, the deadlines of the
//! peer's recvs, and the linger of a closing connection. The session never reads the clock: the
//! loop asks [`Session::poll_timeout`] when the next one is due and calls
//! [`Session::handle_timeout`] with the time it read.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

use slab::Slab;

use crate::ctx::CtxKey;
use crate::error::{Error, ErrorKind};
use crate::stats::{add, RequestKind};
use crate::wire::Status;

use super::conn::{mark_dirty, Conn, Phase};
use super::reply::Spare;
use super::Session;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Timer {
    Deadline(u64),
    /// A recv whose deadline passed and whose `CANCEL` was sent: failed locally if the
    /// responder's verdict has not come by now.
    CancelWait(u64),
    /// The same for one recv fused into the request `handle`.
    MemberCancelWait {
        handle: u64,
        index: u32,
    },
    /// The deadline of one recv fused into the request `handle`.
    Member {
        handle: u64,
        index: u32,
    },
    Reconnect {
        slot: u32,
        generation: u32,
    },
    Handshake {
        slot: u32,
        generation: u32,
    },
    /// A connection whose protocol closed gets this long to flush its last frame.
    Close {
        slot: u32,
        generation: u32,
    },
    /// A connection's frame head (header and meta section) in progress must be complete
    /// `frame_timeout` after it started; at most one such timer per connection is pending.
    FrameHead {
        slot: u32,
        generation: u32,
    },
    /// A connection owing bytes must have delivered some in each `progress_timeout`
    /// window; at most one such timer per connection is pending.
    Progress {
        slot: u32,
        generation: u32,
    },
    /// An open connection's silence is checked: probed after `heartbeat_interval`, lost
    /// after `heartbeat_timeout`; at most one such timer per connection is pending.
    Heartbeat {
        slot: u32,
        generation: u32,
    },
    /// The deadline the peer gave its recv `handle` (its `timeout_ms`).
    ServeDeadline {
        slot: u32,
        generation: u32,
        handle: u64,
    },
}

/// Timers by due time; entries whose object is gone are skipped when they come up.
#[derive(Default)]
pub(crate) struct Timers {
    heap: BinaryHeap<Reverse<(Instant, Timer)>>,
}

impl Timers {
    pub fn with_capacity(n: usize) -> Timers {
        Timers {
            heap: BinaryHeap::with_capacity(n),
        }
    }

    pub fn push(&mut self, at: Instant, timer: Timer) {
        self.heap.push(Reverse((at, timer)));
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&Timer) -> bool) {
        self.heap.retain(|Reverse((_, t))| keep(t));
    }

    /// When the next timer is due.
    pub fn next(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _))| *at)
    }

    /// The next timer due at or before `now`.
    fn pop_due(&mut self, now: Instant) -> Option<Timer> {
        match self.heap.peek() {
            Some(Reverse((at, _))) if *at <= now => self.heap.pop().map(|Reverse((_, t))| t),
            _ => None,
        }
    }
}

impl Session {
    /// When [`handle_timeout`](Self::handle_timeout) should next run.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// Fires every timer due at `now`; returns whether any fired.
    pub(crate) fn handle_timeout(&mut self, now: Instant) -> bool {
        let mut progress = self.close_drained();
        while let Some(timer) = self.timers.pop_due(now) {
            progress = true;
            match timer {
                Timer::Deadline(h) => {
                    // A request on a closed connection fails with the connection's error
                    // when the loop releases it.
                    let closing = self.ctxs.get(CtxKey::from_raw(h)).is_ok_and(|p| {
                        self.conns
                            .get(p.conn as usize)
                            .is_some_and(|c| c.phase == Phase::Closing)
                    });
                    if closing {
                        continue;
                    }
                    if self.ask_verdict(h, None, now) {
                        continue;
                    }
                    self.give_up(h, true);
                }
                Timer::CancelWait(h) => self.give_up(h, false),
                Timer::Member { handle, index } => {
                    if !self.ask_verdict(handle, Some(index), now) {
                        self.member_timed_out(handle, index);
                    }
                }
                Timer::MemberCancelWait { handle, index } => self.member_timed_out(handle, index),
                Timer::Reconnect { slot, generation } => {
                    let live = self
                        .conns
                        .get(slot as usize)
                        .is_some_and(|c| c.generation == generation && c.phase == Phase::Backoff);
                    if live {
                        self.start_connect(slot, now);
                    }
                }
                Timer::Close { slot, generation } => {
                    let lingering = self
                        .conns
                        .get(slot as usize)
                        .is_some_and(|c| c.generation == generation && c.phase != Phase::Closing);
                    if lingering {
                        let failure = self.conns[slot as usize].failure.clone();
                        self.lose(slot, failure);
                    }
                }
                Timer::FrameHead { slot, generation } => self.frame_head_due(slot, generation, now),
                Timer::Progress { slot, generation } => self.progress_due(slot, generation, now),
                Timer::Heartbeat { slot, generation } => self.heartbeat_due(slot, generation, now),
                Timer::ServeDeadline {
                    slot,
                    generation,
                    handle,
                } => self.serve_deadline_due(slot, generation, handle),
                Timer::Handshake { slot, generation } => {
                    let stuck = self.conns.get(slot as usize).is_some_and(|c| {
                        c.generation == generation
                            && matches!(c.phase, Phase::Handshaking | Phase::Connecting)
                    });
                    if stuck {
                        log::warn!("connection {slot}: handshake timed out");
                        self.lose(slot, Error::new(ErrorKind::ConnectionLost));
                    }
                }
            }
        }
        progress
    }

    /// A recv (`handle`, or its fused member `index`) that was sent reached its deadline:
    /// asks the responder to give it up with a `CANCEL` and waits for the verdict (up to
    /// [`CANCEL_WAIT`]) instead of failing it now: a tensor the responder took for it just
    /// before then is on its way and is delivered, not lost. Returns whether it asked.
    fn ask_verdict(&mut self, handle: u64, index: Option<u32>, now: Instant) -> bool {
        let Ok(p) = self.ctxs.get_mut(CtxKey::from_raw(handle)) else {
            return false;
        };
        let recv = matches!(p.kind, RequestKind::Recv | RequestKind::FusedRecv);
        if !recv || p.sent.is_none() {
            return false;
        }
        let asked = match index {
            None => &mut p.cancel_sent,
            Some(i) => match p.fused.get_mut(i as usize).filter(|m| !m.done) {
                Some(m) => &mut m.cancel_sent,
                None => return false,
            },
        };
        if *asked {
            return false;
        }
        let items: &[u32] = match &index {
            Some(i) => std::slice::from_ref(i),
            None => &[],
        };
        if !send_cancel(&mut self.conns, &mut self.dirty, p.conn, handle, items) {
            return false;
        }
        *asked = true;
        let timer = match index {
            None => Timer::CancelWait(handle),
            Some(index) => Timer::MemberCancelWait { handle, index },
        };
        self.timers.push(now + CANCEL_WAIT, timer);
        true
    }

    /// Fails request `handle` with a timeout now, its answer no longer awaited; when
    /// `tell` and it was sent, the responder is told with a `CANCEL` (it then drops what it
    /// holds for it, e.g. a push still arriving).
    fn give_up(&mut self, handle: u64, tell: bool) {
        let Ok(mut p) = self.ctxs.remove(CtxKey::from_raw(handle)) else {
            return;
        };
        self.abandon(handle, &p);
        if tell && p.sent.is_some() {
            send_cancel(&mut self.conns, &mut self.dirty, p.conn, handle, &[]);
        }
        let e = Err(Error::new(ErrorKind::Timeout));
        let spare = std::mem::take(&mut p.spare);
        let peer = self.peer_of(p.conn);
        let t = Some((p.trace, p.sent));
        self.notify(peer, p.origin, p.tag, p.kind, &p.fused, e, spare, t);
    }

    /// One recv of a fused request reached its own deadline: it fails alone.
    fn member_timed_out(&mut self, handle: u64, index: u32) {
        let h = CtxKey::from_raw(handle);
        let Ok(p) = self.ctxs.get_mut(h) else {
            return;
        };
        let Some(m) = p.fused.get_mut(index as usize).filter(|m| !m.done) else {
            return;
        };
        m.done = true;
        let (origin, tag) = (m.origin, m.tag);
        let all_done = p.fused.iter().all(|m| m.done);
        let conn = p.conn;
        let mut timeout = Error::new(ErrorKind::Timeout);
        if let Some(peer) = self.peer_of(conn) {
            timeout = timeout.with_peer(peer);
        }
        let timeout = Err(timeout);
        let kind = RequestKind::Recv;
        let meter = super::metrics::Meter {
            block: self.peer_table.get(
                self.conns
                    .get(conn as usize)
                    .map_or(u32::MAX, |c| c.metrics),
            ),
            latency: None,
        };
        let spare = Spare::default();
        self.outbox
            .deliver(&self.counters, meter, origin, tag, kind, timeout, spare);
        if all_done {
            if let Ok(p) = self.ctxs.remove(h) {
                self.abandon(handle, &p);
            }
        }
    }

    /// A connection's frame-head timer came up: close it if the head it watches is late.
    fn frame_head_due(&mut self, slot: u32, generation: u32, now: Instant) {
        let timeout = self.cfg.frame_timeout;
        let Some(c) = timed_conn(&mut self.conns, slot, generation) else {
            return;
        };
        c.head_timer = false;
        let Some(since) = c.head_since else {
            return;
        };
        if since + timeout > now {
            // A later frame head: its own deadline.
            c.head_timer = true;
            let timer = Timer::FrameHead { slot, generation };
            self.timers.push(since + timeout, timer);
            return;
        }
        log::warn!(
            "connection {slot}: a frame's header and meta section did not arrive \
             within {timeout:?} (STARWIRE_FRAME_TIMEOUT_MS); closing"
        );
        add(&self.counters.progress_timeouts, 1);
        let why = "frame header and meta section not complete in time";
        self.stalled(slot, why, now);
    }

    /// A connection's `Progress` timer is due: close it if it owed bytes for a whole window
    /// and delivered fewer than [`PROGRESS_MIN_BYTES`].
    fn progress_due(&mut self, slot: u32, generation: u32, now: Instant) {
        let timeout = self.cfg.progress_timeout;
        let Some(c) = timed_conn(&mut self.conns, slot, generation) else {
            return;
        };
        c.progress.timer = false;
        let Some(since) = c.progress.since else {
            return; // nothing owed any more
        };
        let next = if since + timeout > now {
            since + timeout
        } else if c.progress.bytes >= PROGRESS_MIN_BYTES {
            // Enough arrived: a new window.
            c.progress.since = Some(now);
            c.progress.bytes = 0;
            now + timeout
        } else {
            log::warn!(
                "connection {slot}: the peer owes bytes of a frame or chunked tensor and sent \
                 {} bytes in {timeout:?} (STARWIRE_PROGRESS_TIMEOUT_MS); closing",
                c.progress.bytes
            );
            add(&self.counters.progress_timeouts, 1);
            self.stalled(
                slot,
                "no progress on a frame or chunked tensor in time",
                now,
            );
            return;
        };
        c.progress.timer = true;
        self.timers.push(next, Timer::Progress { slot, generation });
    }

    /// Connection `slot` stalled in the middle of what it sends: it is told why with an
    /// `ERROR` (status `DEADLINE_EXCEEDED`) and closed; its requests fail with
    /// [`ErrorKind::Timeout`].
    fn stalled(&mut self, slot: u32, why: &'static str, now: Instant) {
        let mut failure = Error::new(ErrorKind::Timeout).with_message(why);
        if let Some(peer) = self.peer_of(slot) {
            failure = failure.with_peer(peer);
        }
        self.close_with_error(slot, Status::DeadlineExceeded, why, failure, now);
    }

    /// Drops the deadline timers of requests and served recvs that are answered already,
    /// when they outnumber the live ones: such entries stay in the heap until they come
    /// up, so without this a long deadline on many short requests would grow it. Amortized
    /// O(1) per timer.
    pub(super) fn sweep_timers(&mut self) {
        if self.timers.len() <= self.sweep_at {
            return;
        }
        let (ctxs, conns) = (&self.ctxs, &self.conns);
        self.timers.retain(|t| match *t {
            Timer::Deadline(h) => ctxs.contains(CtxKey::from_raw(h)),
            Timer::ServeDeadline {
                slot,
                generation,
                handle,
            } => conns.get(slot as usize).is_some_and(|c| {
                c.generation == generation && c.recvs.iter().any(|&(h, _)| h == handle)
            }),
            _ => true,
        });
        self.sweep_at = 2 * self.timers.len() + SWEEP_MIN;
    }

    /// The peer's recv `handle` reached the deadline it carried: if still waiting, its
    /// waiters are removed and it is answered `DEADLINE_EXCEEDED`, so a tensor published
    /// after the requester stopped waiting stays for the next recv.
    fn serve_deadline_due(&mut self, slot: u32, generation: u32, handle: u64) {
        let Some(c) = timed_conn(&mut self.conns, slot, generation) else {
            return;
        };
        let Some(pos) = c.recvs.iter().position(|&(h, _)| h == handle) else {
            return;
        };
        c.recvs.swap_remove(pos);
        if let Some(r) = &self.rendezvous {
            r.forget_request((self.index, slot, generation), handle, None);
        }
        let block = self.peer_table.get(c.metrics);
        super::metrics::served_end(block, RequestKind::Recv, crate::stats::Outcome::Timeout);
        let why = "deadline passed before the tensor was published";
        let _ = c
            .proto
            .encoder()
            .error(handle, Status::DeadlineExceeded, why);
        mark_dirty(&mut self.dirty, c, slot);
    }

    /// A connection's `Heartbeat` timer is due: probe it when it has been silent for an
    /// interval, declare it lost when silent for the timeout.
    fn heartbeat_due(&mut self, slot: u32, generation: u32, now: Instant) {
        let (interval, timeout) = (self.cfg.heartbeat_interval, self.cfg.heartbeat_timeout);
        let Some(c) = timed_conn(&mut self.conns, slot, generation) else {
            return;
        };
        if c.phase != Phase::Open {
            return;
        }
        c.heartbeat_timer = false;
        let silent = now.saturating_duration_since(c.last_heard);
        if silent >= timeout {
            log::warn!(
                "connection {slot}: nothing received for {silent:?} \
                 (STARWIRE_HEARTBEAT_TIMEOUT_MS); the peer is lost"
            );
            add(&self.counters.heartbeat_losses, 1);
            let mut e = Error::new(ErrorKind::ConnectionLost)
                .with_message("no heartbeat answer from the peer in time");
            if let Some(peer) = self.peer_of(slot) {
                e = e.with_peer(peer);
            }
            self.lose(slot, e);
            return;
        }
        let next = if silent >= interval {
            if c.proto.encoder().ping(HEARTBEAT_HANDLE, &[]).is_ok() {
                add(&self.counters.heartbeats_sent, 1);
                mark_dirty(&mut self.dirty, c, slot);
            }
            now + interval
        } else {
            c.last_heard + interval
        };
        c.heartbeat_timer = true;
        let at = next.min(c.last_heard + timeout);
        self.timers.push(at, Timer::Heartbeat { slot, generation });
    }
}

/// Connection `slot` if it is the one a timer was set for (same `generation`) and not
/// closing.
fn timed_conn(conns: &mut Slab<Conn>, slot: u32, generation: u32) -> Option<&mut Conn> {
    conns
        .get_mut(slot as usize)
        .filter(|c| c.generation == generation && c.phase != Phase::Closing)
}

/// Queues a `CANCEL` of `items` of request `handle` (all of it when empty) on connection
/// `slot`, if it is open; returns whether it did.
fn send_cancel(
    conns: &mut Slab<Conn>,
    dirty: &mut Vec<u32>,
    slot: u32,
    handle: u64,
    items: &[u32],
) -> bool {
    let Some(c) = conns.get_mut(slot as usize) else {
        return false;
    };
    if c.phase != Phase::Open || c.proto.is_closed() {
        return false;
    }
    if c.proto.encoder().cancel(handle, items).is_err() {
        return false;
    }
    mark_dirty(dirty, c, slot);
    true
}

/// How long a recv whose deadline passed waits for the responder's verdict on its
/// `CANCEL` before it fails without it (a peer that does not answer is also found by the
/// heartbeat).
pub(crate) const CANCEL_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Timers kept before the first sweep of answered deadlines.
pub(super) const SWEEP_MIN: usize = 1024;

/// Bytes a connection that owes bytes must deliver in each `progress_timeout` window (or
/// finish what it owed): far below any working link, far above a trickle.
pub(crate) const PROGRESS_MIN_BYTES: u64 = 4096;

/// The handle of heartbeat `PING`s: generation 0, so it never names a request; their
/// `PONG`s are recognised by it and dropped.
pub(crate) const HEARTBEAT_HANDLE: u64 = CtxKey::internal(1).to_raw();
