//! The sans-IO protocol state of one event loop.
//!
//! A [`Session`] does no I/O and never reads the clock. The event loop feeds it what
//! happened — requests from handles, bytes received, bytes sent, connects that completed
//! or failed, the time — and asks it what to do: which connections have output
//! ([`Session::take_dirty`] and [`Session::transmit`], which lend the encoder's blocks),
//! where the next bytes of a connection must land ([`Session::lend_recv`], which lends the
//! buffer or tensor memory until [`Session::received`] gives it back), which sockets to
//! open or close ([`Session::poll_action`]) and when to call again
//! ([`Session::poll_timeout`]). So the protocol is tested in memory with simulated time
//! (`tests/`), no sockets involved.
//!
//! The session is one idea with parts that own their state; `Session` holds them and its
//! event methods only route between them:
//!
//! - data, at the bottom: what a request is (`request.rs`, and `spec.rs` for the tables a
//!   rows request names), what comes back (`reply.rs`), why a frame breaks the protocol
//!   (`violation.rs`);
//! - [`Requests`](requests::Requests): the client side — submitting, fusing, encoding,
//!   matching answers, deadlines;
//! - [`Server`](server::Server): the serving side — the service, the rendezvous, the
//!   handler pool;
//! - rows (`rows.rs`): encoding, serving and assembling packed rows;
//! - [`Conns`](conns::Conns) and [`Conn`](conn::Conn): the connections, each with one
//!   [`Inbound`](conn::Inbound) state for what it is receiving, its timers and its watches
//!   (`liveness.rs`); the bytes in and out (`io.rs`);
//! - [`Timers`](timer::Timers): a connection's timers set and stopped by kind, the
//!   requests' deadlines;
//! - [`Observer`](observer::Observer): metrics and trace, fed values;
//! - [`Outbox`](outbox::Outbox): where completions go; `members.rs`: retired addresses.

mod arriving;
mod assemble;
mod budget;
mod conn;
mod conns;
mod io;
mod liveness;
mod members;
mod observer;
mod outbox;
mod push;
mod refusal;
mod reply;
mod request;
mod requests;
mod respond;
mod rows;
mod server;
mod spec;
mod timer;
mod versioned;
mod violation;

#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_utils::CachePadded;

use crate::cluster::Retirements;
use crate::config::Config;
use crate::error::{Error, ErrorKind, OsError};
use crate::pool::Answer;
use crate::proto::{ConnEvent, Flow, Identity};
use crate::rendezvous::Delivery;
use crate::stats::{add, Counters};
use crate::tensor::SharedAllocator;
use crate::wire::{Body, FrameKind, Status};

pub(crate) use budget::Budget;
pub(crate) use conns::Action;
pub(crate) use io::{RecvLoan, RecvPlace, SendSink};
pub(crate) use outbox::HandleRings;
pub(crate) use reply::Spare;
pub use reply::{Callback, Completion, PulledRows, Reply};
pub(crate) use request::{Request, RequestOp, Stamp, Submitter};
pub(crate) use spec::RowsSpec;
pub use spec::{Rows, MAX_ROW_RANK};

use conn::{Conn, Inbound, Phase, Whose};
use conns::Conns;
use io::{BufferFull, Transmitted};
use liveness::{Verdict, HEARTBEAT_HANDLE};
use members::Members;
use observer::{served_kind, Observer};
use outbox::Outbox;
use request::FusedMember;
use requests::{Ends, Requests, Source};
pub(crate) use server::SessionParts;
use server::{Server, Serving};
use timer::{ConnTimer, Timer, Timers};
use violation::Violation;

/// Most requests taken from one handle's ring per drain pass (bounded work per step).
const DRAIN_BATCH: usize = 256;

/// Waiters of released connections taken out of the rendezvous per loop turn: each costs a
/// lock and a look at one key's entry, so a turn spends well under a millisecond on them.
const FORGET_BATCH: usize = 4096;

/// The loop's sans-IO protocol state. See the module docs.
pub(crate) struct Session {
    conns: Conns,
    requests: Requests,
    server: Server,
    timers: Timers,
    observer: Observer,
    outbox: Outbox,
    members: Members,
    allocator: SharedAllocator,
    /// Payload at least this long is received straight into its tensor.
    zero_copy_min: u64,
    /// What connections are watched against.
    limits: liveness::Limits,
    /// Requests of the embedding thread, taken in the next drain pass.
    local_requests: VecDeque<Request>,
    stopping: bool,
    /// The time of the latest event the loop reported (for what ends without one, e.g. a
    /// connection released).
    last_now: Instant,
}

impl Session {
    pub(crate) fn new(
        cfg: Arc<Config>,
        counters: Arc<CachePadded<Counters>>,
        parts: SessionParts,
    ) -> Session {
        let mut job = arrayvec::ArrayVec::new();
        job.try_extend_from_slice(cfg.job.as_bytes()).ok();
        let token = cfg.cluster_token.as_ref().map(|t| {
            let mut v = arrayvec::ArrayVec::new();
            v.try_extend_from_slice(t).ok();
            v
        });
        let identity = Identity {
            cluster_id: cfg.cluster_id,
            job,
            task_index: cfg.task_index,
            token,
            features: cfg.wire_features,
        };
        let stats_task = cfg
            .stats_endpoint
            .then(|| format!("{}:{}", cfg.job, cfg.task_index));
        let server = Server::new(
            parts.service,
            parts.rendezvous,
            parts.jobs,
            parts.index,
            stats_task,
            cfg.max_served,
            parts.checkpoints.ok_or(parts.no_checkpoints),
        );
        Session {
            conns: Conns::new(cfg.clone(), identity, parts.budget),
            requests: Requests::new(&cfg),
            server,
            timers: Timers::with_capacity(cfg.max_inflight.min(1 << 16)),
            observer: Observer::new(&cfg, counters),
            outbox: Outbox::default(),
            members: Members::default(),
            allocator: parts.allocator,
            zero_copy_min: parts.zero_copy_min,
            limits: liveness::Limits {
                frame_timeout: cfg.frame_timeout,
                progress_timeout: cfg.progress_timeout,
                heartbeat_interval: cfg.heartbeat_interval,
                heartbeat_timeout: cfg.heartbeat_timeout,
                answer_backlog: cfg.answer_backlog,
            },
            local_requests: VecDeque::new(),
            stopping: false,
            last_now: crate::stats::trace::epoch(),
        }
    }

    fn counters(&self) -> &Counters {
        self.observer.counters()
    }

    // ----- requests and completions -----

    /// Takes a new handle's rings.
    pub(crate) fn add_handle(&mut self, rings: HandleRings) {
        self.outbox.add(rings);
    }

    /// Whether a handle's ring holds requests not taken yet.
    pub(crate) fn requests_waiting(&self) -> bool {
        self.outbox.requests_waiting()
    }

    /// Queues a request of the embedding thread for the next drain pass.
    pub(crate) fn submit_local(&mut self, req: Request) {
        self.local_requests.push_back(req);
    }

    /// The next completion for the embedding thread.
    pub(crate) fn take_local(&mut self) -> Option<Completion> {
        self.outbox.local.pop_front()
    }

    /// Takes the requests waiting (a bounded batch per handle) and starts them; the recvs of
    /// the pass are fused. Returns whether there were any.
    pub(crate) fn drain_requests(&mut self, now: Instant) -> bool {
        let mut progress = false;
        self.last_now = now;
        self.observer.tick();
        // The embedding thread's requests first (embedded mode).
        while let Some(req) = self.local_requests.pop_front() {
            progress = true;
            self.take_request(req, Submitter::Local, now);
        }
        for i in 0..self.outbox.handles.len() {
            let mut batch = 0;
            while batch < DRAIN_BATCH {
                let Some(rings) = self.outbox.handles[i].as_mut() else {
                    break;
                };
                let Some(req) = rings.requests.pop() else {
                    if rings.requests.is_closed() && rings.requests.is_empty() {
                        // The handle is gone; completions still owed to it are dropped.
                        self.outbox.handles[i] = None;
                    }
                    break;
                };
                batch += 1;
                let submitter = self.outbox.submitter(i);
                self.take_request(req, submitter, now);
            }
            progress |= batch > 0;
        }
        self.submit_fused(now);
        progress
    }

    /// Starts a request from this drain pass, or holds a single-key recv back to be fused
    /// with the others of the pass.
    fn take_request(&mut self, req: Request, submitter: Submitter, now: Instant) {
        if let Some((req, submitter)) = self.requests.hold(req, submitter, self.stopping) {
            self.submit(req, submitter, Vec::new(), now);
        }
    }

    /// Starts the recvs held back in this drain pass, fused.
    fn submit_fused(&mut self, now: Instant) {
        let mut held = self.requests.take_held();
        if !held.is_empty() {
            requests::fuse(&mut held, |req, submitter, members| {
                self.submit(req, submitter, members, now)
            });
        }
        self.requests.restore_held(held);
    }

    /// Starts a request on the connection to its peer and lane (opened on demand); `fused`
    /// lists the original recvs when the session fused several.
    fn submit(
        &mut self,
        req: Request,
        submitter: Submitter,
        fused: Vec<FusedMember>,
        now: Instant,
    ) {
        let refused = if self.stopping {
            Some(Error::new(ErrorKind::Shutdown))
        } else {
            self.members.error_for(req.peer)
        };
        if let Some(e) = refused {
            let mut ends = Ends {
                observer: &mut self.observer,
                outbox: &mut self.outbox,
                now,
            };
            let kind = req.op.kind();
            let peer = Some(req.peer);
            return ends.fail(
                peer, submitter, req.tag, kind, &fused, e, req.spare, None, None,
            );
        }
        let observer = &mut self.observer;
        let index = || observer.client_peer(req.peer, req.task);
        let slot = self
            .conns
            .outgoing(req.peer, req.lane, index, &mut self.timers, now);
        if req.deadline.is_some() {
            self.sweep_timers();
        }
        let Session {
            conns,
            requests,
            timers,
            observer,
            outbox,
            ..
        } = self;
        let mut ends = Ends {
            observer,
            outbox,
            now,
        };
        requests.start(req, submitter, fused, conns, slot, timers, &mut ends);
    }

    /// Answers a recv whose key another thread published.
    pub(crate) fn deliver_recv(&mut self, d: Delivery) {
        let w = d.waiter;
        let back = match self
            .conns
            .get_mut(w.conn)
            .filter(|c| c.is_live(w.generation))
        {
            Some(conn) => {
                let back = Server::answer_recv(conn, w.handle, w.index, d.result, &self.observer);
                conn.release_tokens();
                self.conns.mark_dirty(w.conn);
                back
            }
            // The requester went away.
            None => Some(d.result),
        };
        // Not delivered (the recv was cancelled or expired while the tensor was on its
        // way here): the tensor goes back for the next recv.
        if let (Some(Ok(t)), Some(r)) = (back, self.server.rendezvous()) {
            r.restore(&d.key, t);
        }
    }

    /// Sends a pool handler's answer, if its connection is still there.
    pub(crate) fn take_answer(&mut self, a: Answer) {
        let to = a.to();
        let Some(conn) = self
            .conns
            .get_mut(to.conn)
            .filter(|c| c.is_live(to.generation))
        else {
            return;
        };
        self.server.take_answer(conn, a);
        conn.release_tokens();
        self.conns.mark_dirty(to.conn);
    }

    // ----- connections -----

    /// Asks the loop to connect `slot`; connect and handshake share one time limit.
    fn start_connect(&mut self, slot: u32, now: Instant) {
        self.conns.connect(slot, &mut self.timers, now);
    }

    /// The connect of `slot` succeeded: the handshake starts.
    pub(crate) fn connected(&mut self, slot: u32) {
        self.conns.connected(slot);
    }

    /// A connect attempt of `slot` failed for `why` (the loop has closed its socket): retry
    /// with backoff, or give up and fail what waits.
    pub(crate) fn connect_failed(&mut self, slot: u32, why: OsError, now: Instant) {
        let (retry, timers, observer) = (!self.stopping, &mut self.timers, &self.observer);
        (self.conns).connect_failed(slot, retry, why, timers, observer, now);
    }

    /// A connection accepted by the loop; returns its slot.
    pub(crate) fn adopt(&mut self, now: Instant) -> u32 {
        self.conns.adopt(&mut self.timers, now)
    }

    /// Replaces the receive buffer of connection `slot` before any byte arrived; returns
    /// the one it had, or `buf` back as the error when there is no such connection.
    pub(crate) fn swap_buffer(&mut self, slot: u32, buf: Vec<u8>) -> Result<Vec<u8>, Vec<u8>> {
        match self.conns.get_mut(slot) {
            Some(c) => Ok(c.proto.decoder().swap_buffer(buf)),
            None => Err(buf),
        }
    }

    /// The next socket operation the loop must start, if any.
    pub(crate) fn poll_action(&mut self) -> Option<Action> {
        self.conns.poll_action()
    }

    /// Moves the connections with output into `out` (emptied first).
    pub(crate) fn take_dirty(&mut self, out: &mut Vec<u32>) {
        self.conns.take_dirty(out);
    }

    /// Decodes what connection `slot` has received and routes each event: answers to the
    /// requests part, the peer's requests to the server part.
    fn process(&mut self, slot: u32, now: Instant) {
        let Session {
            conns,
            requests,
            server,
            observer,
            outbox,
            timers,
            allocator,
            limits,
            ..
        } = self;
        let Some(conn) = conns.slab.get_mut(slot as usize) else {
            return;
        };
        // The peer's answers pile up unread: its requests wait (in its socket) until they
        // drain.
        let backlog = limits.answer_backlog;
        let serving = conn.outgoing.is_none();
        if serving && conn.answer_bytes() >= backlog {
            conn.paused = true;
            return;
        }
        let was_closed = conn.proto.is_closed();
        let (peer, generation, addr) = (conn.peer, conn.generation, conn.peer_addr());
        let source = Source { slot, peer, addr };
        let alloc = &**allocator;
        let mut opened = false;
        let mut violation: Option<Violation> = None;
        let Conn {
            proto,
            inbound,
            chunks,
            served,
            out_tensors,
            budget,
            held,
            ..
        } = &mut *conn;
        // A connection as the server part sees it, and where the requests part ends
        // requests, for the event at hand.
        macro_rules! serving {
            ($enc:expr) => {
                Serving {
                    slot,
                    generation,
                    peer,
                    enc: $enc,
                    out: &mut *out_tensors,
                    served: &mut *served,
                    budget,
                    held: &mut *held,
                    now,
                }
            };
        }
        macro_rules! ends {
            () => {
                Ends {
                    observer: &mut *observer,
                    outbox: &mut *outbox,
                    now,
                }
            };
        }
        proto.process(|ev, enc| {
            if violation.is_some() {
                return Flow::Continue;
            }
            let result = match ev {
                ConnEvent::Opened => {
                    opened = true;
                    Ok(())
                }
                ConnEvent::Frame(f) => {
                    let (h, kind) = (f.header.handle, f.header.kind);
                    conn::receiving(inbound, chunks, &f);
                    let metered = match kind {
                        FrameKind::Pong | FrameKind::Error | FrameKind::Response => {
                            requests.metered_kind(h)
                        }
                        FrameKind::Chunk => match chunks.front() {
                            Some(&(Whose::Peers, _)) => served.push(h).map(|p| p.kind()),
                            _ => requests.metered_kind(h),
                        },
                        k => served_kind(k),
                    };
                    observer.frame_in(peer, metered, &f);
                    let queued_before = enc.ready_bytes();
                    let r = match f.body {
                        // The answer to a heartbeat: its arrival was the point.
                        Body::Pong if h == HEARTBEAT_HANDLE => Ok(()),
                        Body::Pong | Body::Error(_) => {
                            let mut ends = ends!();
                            requests.on_pong_or_error(&f, source, &mut ends)
                        }
                        Body::Response(entries) => {
                            requests.on_response(h, entries, f.header.end, slot, alloc, now)
                        }
                        Body::Chunk(_) | Body::Hello(_) | Body::HelloAck(_) => Ok(()),
                        _ => {
                            let mut c = serving!(enc);
                            server.on_request(&mut c, &f, alloc, timers, observer)
                        }
                    };
                    observer.answer_out(peer, kind, queued_before, enc.ready_bytes());
                    r
                }
                ConnEvent::Payload {
                    target,
                    offset,
                    data,
                } => {
                    add(&observer.counters().payload_copied, data.len() as u64);
                    let route = conn::route(target, *inbound, chunks);
                    let t = route.and_then(|route| {
                        io::tensor_for(requests, served, slot, route, alloc, budget)
                    });
                    if let Some(t) = t {
                        let (start, stop) = (offset as usize, offset as usize + data.len());
                        if let Some(dst) = t.bytes_mut().get_mut(start..stop) {
                            dst.copy_from_slice(data);
                        }
                    }
                    Ok(())
                }
                ConnEvent::FrameEnd(h) => {
                    match h.kind {
                        FrameKind::Push | FrameKind::PushRows => {
                            let queued_before = enc.ready_bytes();
                            let mut c = serving!(enc);
                            server.on_push_end(&mut c, h.handle, observer);
                            observer.answer_out(peer, h.kind, queued_before, enc.ready_bytes());
                        }
                        FrameKind::Response => {
                            let mut ends = ends!();
                            requests.on_response_end(h.handle, source, &mut ends);
                        }
                        FrameKind::Chunk => {
                            // All of the chunk's bytes have arrived, copied or in place.
                            let Inbound::Chunk { handle, index, end } = *inbound else {
                                return Flow::Continue;
                            };
                            let Some(&(whose, len)) = chunks.front() else {
                                return Flow::Continue;
                            };
                            if end == len {
                                chunks.pop_front();
                            }
                            match whose {
                                Whose::Peers => {
                                    let mut c = serving!(enc);
                                    server.on_chunk(&mut c, handle, index, end, observer);
                                }
                                Whose::Ours => {
                                    let mut ends = ends!();
                                    requests.on_chunk(handle, index, end, source, &mut ends);
                                }
                            }
                        }
                        _ => {}
                    }
                    Ok(())
                }
            };
            if let Err(v) = result {
                violation = Some(v);
            }
            if serving && conn::answer_bytes(enc, held) >= backlog {
                Flow::Pause
            } else {
                Flow::Continue
            }
        });
        conn.paused = serving && conn.answer_bytes() >= backlog;
        conn.count_frames_in(observer);
        if let Some(v) = violation {
            log::warn!("connection {slot}: {v}; closing");
            conn.proto.abort(Status::Protocol, v.to_string());
        } else if let (false, Some(reason)) = (was_closed, conn.proto.close_reason()) {
            // The codec closed it: a malformed frame, or a refused handshake.
            log::warn!("connection {slot}: {reason}; closing");
        }
        let plain = conn.refused_for_features().filter(|_| !was_closed);
        conn.release_tokens();
        conns.dirty.mark(conn, slot);
        if let Some((addr, _)) = plain {
            self.conns.announce_nothing_to(addr);
        }
        if opened {
            self.opened(slot, now);
        }
        let Some(conn) = self.conns.get_mut(slot) else {
            return;
        };
        if conn.proto.is_closed() && !was_closed {
            let failure = conn.close_failure();
            self.linger_then_close(slot, failure, now);
        }
    }

    /// Connection `slot` completed its handshake: its peer's task names its metrics, the
    /// requests waiting for it go out, and its heartbeat starts.
    fn opened(&mut self, slot: u32, now: Instant) {
        let Some(conn) = self.conns.get_mut(slot) else {
            return;
        };
        conn.phase = Phase::Open;
        if let Some(peer) = conn.proto.peer() {
            let (job, index) = (peer.job_str().into_owned(), peer.task_index);
            let accepted = conn.outgoing.is_none();
            conn.peer = self.observer.opened(conn.peer, accepted, &job, index);
        }
        if conn.outgoing.is_some() {
            add(&self.observer.counters().connections_opened, 1);
            conn.attempts = 0;
            let mut ends = Ends {
                observer: &mut self.observer,
                outbox: &mut self.outbox,
                now,
            };
            self.requests.opened(&mut self.conns, slot, &mut ends);
        }
        if let Some(conn) = self.conns.get_mut(slot) {
            conn.start_heartbeat(slot, &mut self.timers, &self.limits, now);
        }
    }

    /// Closes connection `slot` for `why`: its requests fail once the loop releases it.
    pub(crate) fn lose(&mut self, slot: u32, why: Error) {
        self.conns.lose(slot, why, &self.observer);
    }

    /// The peer closed connection `slot` (its stream ended): closed cleanly, or lost when
    /// something was in flight on it ([`Conns::peer_closed`]).
    pub(crate) fn peer_closed(&mut self, slot: u32) {
        let requests = &self.requests;
        let ours = |c: &Conn| requests.any_on(slot, c);
        self.conns.peer_closed(slot, ours, &self.observer);
    }

    /// Connection `slot`, whose protocol has closed with an `ERROR` queued, fails its
    /// requests with `failure` once it is released, shortly.
    fn linger_then_close(&mut self, slot: u32, failure: Error, now: Instant) {
        self.conns.linger(slot, failure, &mut self.timers, now);
    }

    /// Connection `slot` stalled in the middle of what it sends: it is told why with an
    /// `ERROR` (status `DEADLINE_EXCEEDED`) and closed; its requests fail with
    /// [`ErrorKind::Timeout`].
    fn stalled(&mut self, slot: u32, why: &'static str, now: Instant) {
        add(&self.counters().progress_timeouts, 1);
        let mut failure = Error::new(ErrorKind::Timeout).with_message(why);
        if let Some(peer) = self.conns.peer_addr(slot) {
            failure = failure.with_peer(peer);
        }
        let Some(conn) = self.conns.get_mut(slot) else {
            return;
        };
        if conn.phase == Phase::Closing || conn.proto.is_closed() {
            return;
        }
        conn.proto.abort(Status::DeadlineExceeded, why);
        self.linger_then_close(slot, failure, now);
    }

    /// Frees closed connection `slot` once the loop has no operation in flight on it (a
    /// receive may write into a request's tensor until then): fails the requests waiting
    /// for or in flight on it, and returns its receive buffer.
    pub(crate) fn release(&mut self, slot: u32) -> Vec<u8> {
        let Session {
            conns,
            requests,
            server,
            observer,
            outbox,
            last_now,
            timers,
            ..
        } = self;
        let peer = conns.peer_addr(slot);
        // Requests that waited for a handshake a peer of an earlier release refused for its
        // features go to a connection that announces none.
        let again = conns.to_connect_plainly(slot);
        let Some(conn) = conns.get_mut(slot) else {
            return Vec::new();
        };
        debug_assert_eq!(conn.phase, Phase::Closing, "released before it was closed");
        let moved: Vec<u64> = again.map_or_else(Vec::new, |_| conn.waiting.drain(..).collect());
        let metrics_index = conn.peer;
        let why = conn.failure.clone();
        let now = *last_now;
        let mut ends = Ends {
            observer,
            outbox,
            now,
        };
        requests.release(slot, conn, peer, &why, &mut ends);
        server.release(slot, conn, ends.observer);
        // Unrouted when it was closed.
        let mut conn = conns.slab.remove(slot as usize);
        let counted = conn.arena_counted as u64;
        add(
            &ends.observer.counters().send_arena_bytes,
            counted.wrapping_neg(),
        );
        if let (Some((addr, lane)), false) = (again, moved.is_empty()) {
            let to = conns.outgoing(addr, lane, || metrics_index, timers, now);
            requests.rehome(conns, &moved, to, &mut ends);
        }
        conn.proto.decoder().swap_buffer(Vec::new())
    }

    /// Forgets connection `slot`, just adopted, whose socket the loop could not take on
    /// (nothing was received or sent on it).
    pub(crate) fn discard(&mut self, slot: u32) {
        if let Some(conn) = self.conns.get_mut(slot) {
            conn.phase = Phase::Closing;
            drop(self.release(slot));
        }
    }

    /// Stops: requests still in the rings fail with `SHUTDOWN`, every connection is
    /// aborted (an `ERROR` frame is queued) and closed.
    pub(crate) fn shutdown(&mut self, now: Instant) {
        self.stopping = true;
        for i in 0..self.outbox.handles.len() {
            let submitter = self.outbox.submitter(i);
            while let Some(req) = self.outbox.handles[i]
                .as_mut()
                .and_then(|h| h.requests.pop())
            {
                self.submit(req, submitter, Vec::new(), now);
            }
        }
        let slots: Vec<u32> = self.conns.slab.iter().map(|(s, _)| s as u32).collect();
        for slot in slots {
            if let Some(conn) = self.conns.get_mut(slot) {
                conn.proto.abort(Status::Shutdown, "shutting down");
                conn.failure = Error::new(ErrorKind::Shutdown);
            }
            self.lose(slot, Error::new(ErrorKind::Shutdown));
        }
    }

    /// Whether every connection has been released.
    pub(crate) fn is_empty(&self) -> bool {
        self.conns.slab.is_empty()
    }

    // ----- membership -----

    /// Takes `retired` as the addresses not to send to: later requests to them fail, and
    /// this loop's connections to them are drained and closed.
    pub(crate) fn set_retired(&mut self, retired: Arc<Retirements>) {
        self.members.retire(retired, &mut self.conns);
        self.members.close_drained(&mut self.conns, &self.requests);
    }

    // ----- timers -----

    /// When [`handle_timeout`](Self::handle_timeout) should next run.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        if self.server.is_forgetting() {
            // Work left for the next turn: no parking meanwhile.
            return Some(self.last_now);
        }
        self.timers.next()
    }

    /// Fires every timer due at `now`; returns whether any fired.
    pub(crate) fn handle_timeout(&mut self, now: Instant) -> bool {
        self.last_now = now;
        let mut progress = self.members.close_drained(&mut self.conns, &self.requests);
        progress |= self.server.forget_some(FORGET_BATCH);
        while let Some((at, timer)) = self.timers.pop_due(now) {
            progress = true;
            match timer {
                Timer::Conn { slot, generation } => self.conn_timers_due(slot, generation, at, now),
                Timer::ServeDeadline {
                    slot,
                    generation,
                    handle,
                } => {
                    let Some(conn) = self.conns.of_generation(slot, generation) else {
                        continue;
                    };
                    if self.server.deadline_due(conn, slot, handle, &self.observer) {
                        self.conns.mark_dirty(slot);
                    }
                }
                request => {
                    let Session {
                        conns,
                        requests,
                        timers,
                        observer,
                        outbox,
                        ..
                    } = self;
                    let mut ends = Ends {
                        observer,
                        outbox,
                        now,
                    };
                    requests.timer_due(request, conns, timers, &mut ends);
                }
            }
        }
        progress
    }

    /// The timers of connection `slot` (of `generation`) whose heap entry at `at` came up.
    fn conn_timers_due(&mut self, slot: u32, generation: u32, at: Instant, now: Instant) {
        let Some(conn) = self.conns.of_generation(slot, generation) else {
            return;
        };
        Timers::came_due(&mut conn.timers, at);
        while let Some(conn) = self.conns.of_generation(slot, generation) {
            let Some(kind) = conn.timers.pop_due(now) else {
                self.timers.schedule(&mut conn.timers, slot, generation);
                return;
            };
            let (timers, l) = (&mut self.timers, &self.limits);
            match kind {
                ConnTimer::Reconnect => {
                    if conn.phase == Phase::Backoff {
                        self.start_connect(slot, now);
                    }
                }
                ConnTimer::Handshake => self.conns.handshake_due(slot, &self.observer, now),
                ConnTimer::Close => {
                    let failure = conn.failure.clone();
                    self.lose(slot, failure);
                }
                ConnTimer::FrameHead => {
                    let v = conn.frame_head_due(slot, timers, l, now);
                    self.on_verdict(slot, v, now);
                }
                ConnTimer::Progress => {
                    let v = conn.progress_due(slot, timers, l, now);
                    self.on_verdict(slot, v, now);
                }
                ConnTimer::Heartbeat => {
                    let v = conn.heartbeat_due(slot, timers, l, now);
                    self.on_verdict(slot, v, now);
                }
            }
        }
    }

    /// Acts on what a connection's watch found.
    fn on_verdict(&mut self, slot: u32, verdict: Verdict, now: Instant) {
        match verdict {
            Verdict::Fine => {}
            Verdict::Probed => {
                add(&self.counters().heartbeats_sent, 1);
                self.conns.mark_dirty(slot);
            }
            Verdict::Stalled(why) => self.stalled(slot, why, now),
            Verdict::Silent(_) => {
                add(&self.counters().heartbeat_losses, 1);
                let mut e = Error::new(ErrorKind::ConnectionLost)
                    .with_message("no heartbeat answer from the peer in time");
                if let Some(peer) = self.conns.peer_addr(slot) {
                    e = e.with_peer(peer);
                }
                self.lose(slot, e);
            }
        }
    }

    /// Drops the heap entries of requests and served recvs that are answered already, and
    /// of connections gone, when they outnumber the live ones: such entries stay in the
    /// heap until they come up, so without this a long deadline on many short requests
    /// would grow it. Amortized O(1) per timer.
    fn sweep_timers(&mut self) {
        let (requests, conns) = (&self.requests, &self.conns);
        let conn_of =
            |slot: u32, generation: u32| conns.get(slot).filter(|c| c.generation == generation);
        self.timers.sweep(|t| match *t {
            Timer::Deadline(h) => requests.contains(h),
            Timer::ServeDeadline {
                slot,
                generation,
                handle,
            } => conn_of(slot, generation).is_some_and(|c| c.served.owes_recv(handle)),
            Timer::Conn { slot, generation } => conn_of(slot, generation).is_some(),
            _ => true,
        });
    }

    // ----- bytes in and out -----

    /// Lends out the memory the next bytes of connection `slot` must land in, or `None`
    /// when nothing is to be received on it (closed; or its buffer is full, which closes
    /// it). Until the memory comes back through [`received`](Self::received), the
    /// connection's buffer or the tensor is empty here: the session neither reads nor
    /// frees it, whatever happens to the request meanwhile.
    pub(crate) fn lend_recv(&mut self, slot: u32) -> Option<RecvPlace> {
        let conn = self.conns.get_mut(slot)?;
        let (alloc, min) = (&*self.allocator, self.zero_copy_min);
        match io::lend(conn, slot, &mut self.requests, alloc, min) {
            Ok(place) => place,
            Err(BufferFull) => {
                log::error!("connection {slot}: receive buffer full; closing");
                self.lose(slot, Error::new(ErrorKind::Protocol));
                None
            }
        }
    }

    /// The memory [`lend_recv`](Self::lend_recv) lent for connection `slot` is back, with
    /// `n` bytes written at the start of the range it named (0 when the receive failed or
    /// the stream ended). Puts it back; then, unless the connection is closing or `n` is 0,
    /// decodes the bytes and acts on what they complete.
    pub(crate) fn received(&mut self, slot: u32, mem: RecvLoan, n: usize, now: Instant) {
        let Some(conn) = self.conns.get_mut(slot) else {
            return;
        };
        let alloc = &*self.allocator;
        if !io::restore(conn, slot, &mut self.requests, alloc, mem, n) {
            return;
        }
        if conn.phase == Phase::Closing || n == 0 {
            return;
        }
        conn.last_heard = now;
        self.last_now = now;
        self.process(slot, now);
        self.watch(slot, now);
        self.sweep_timers();
    }

    /// Updates the watches on what connection `slot` owes after it decoded bytes at `now`.
    fn watch(&mut self, slot: u32, now: Instant) {
        if let Some(conn) = self.conns.get_mut(slot) {
            let (timers, l) = (&mut self.timers, &self.limits);
            conn.watch_frame_head(slot, timers, l, now);
            conn.watch_progress(slot, timers, l, now);
        }
    }

    /// Hands the output of connection `slot` to `sink`, piece by piece with the memory it
    /// is in, while the sink has room and holds less than `max` bytes; arena blocks are
    /// lent out (once each) until [`restore_block`](Self::restore_block), tensors shared.
    /// Returns whether it gave any. A connection closed by its protocol with nothing left
    /// to say is closed here.
    pub(crate) fn transmit(&mut self, slot: u32, max: u64, sink: &mut impl SendSink) -> bool {
        let Some(conn) = self.conns.get_mut(slot) else {
            return false;
        };
        match io::transmit(conn, max, sink, self.observer.counters()) {
            Transmitted::Gave(any) => any,
            Transmitted::Done => {
                // Nothing more to say: close.
                let failure = conn.failure.clone();
                self.lose(slot, failure);
                false
            }
            Transmitted::Broken => {
                log::error!("connection {slot}: output names a tensor it does not hold");
                self.lose(slot, Error::new(ErrorKind::Protocol));
                false
            }
        }
    }

    /// Arena block `block` of connection `slot`'s output, lent by
    /// [`transmit`](Self::transmit), is back: the write that read it has completed. Call
    /// before [`sent`](Self::sent).
    pub(crate) fn restore_block(&mut self, slot: u32, block: u32, buf: Box<[u8]>) {
        if let Some(conn) = self.conns.get_mut(slot) {
            conn.proto.encoder().restore_block(block, buf);
            io::count_arena(self.observer.counters(), conn);
        }
    }

    /// `n` bytes of connection `slot`'s output were written at `now`. A connection whose
    /// reading was paused for its unread answers resumes once they drain below the backlog:
    /// the requests buffered are decoded, and the loop may start a receive again.
    pub(crate) fn sent(&mut self, slot: u32, n: usize, now: Instant) {
        let Some(conn) = self.conns.get_mut(slot) else {
            return;
        };
        if conn.phase == Phase::Closing {
            return;
        }
        conn.proto.encoder().advance(n as u64);
        io::count_arena(self.observer.counters(), conn);
        conn.release_tokens();
        let drained = conn.answer_bytes() < self.limits.answer_backlog;
        let resume = conn.paused && drained;
        self.conns.mark_dirty(slot);
        if let Some(conn) = self.conns.get_mut(slot).filter(|_| resume) {
            conn.paused = false;
            // What arrived while paused was not the peer's silence.
            conn.last_heard = now;
            self.last_now = now;
            self.process(slot, now);
            self.watch(slot, now);
        }
    }
}
