//! Request deadlines. A request whose deadline passes fails with a timeout; a recv that
//! was sent asks the responder to give it up (`CANCEL`) and waits a little for the verdict,
//! so that a tensor taken for it just before is delivered, not lost. A recv the session
//! fused has a deadline of its own and fails alone.

use std::time::{Duration, Instant};

use crate::ctx::CtxKey;
use crate::stats::RequestKind;

use super::super::conn::Phase;
use super::super::conns::Conns;
use super::super::timer::{Timer, Timers};
use super::{Ends, Requests};

/// How long a recv whose deadline passed waits for the responder's verdict on its `CANCEL`
/// before it fails without it (a peer that does not answer is also found by the heartbeat).
pub(crate) const CANCEL_WAIT: Duration = Duration::from_secs(1);

impl Requests {
    /// A request timer came up at `now`.
    pub(crate) fn timer_due(
        &mut self,
        timer: Timer,
        conns: &mut Conns,
        timers: &mut Timers,
        ends: &mut Ends<'_>,
    ) {
        match timer {
            Timer::Deadline(h) => {
                // A request on a closed connection fails with the connection's error when
                // the loop releases it.
                let closing = self
                    .get(h)
                    .is_some_and(|p| conns.get(p.conn).is_some_and(|c| c.phase == Phase::Closing));
                if closing || self.ask_verdict(h, None, conns, timers, ends.now) {
                    return;
                }
                self.give_up(h, true, conns, ends);
            }
            Timer::CancelWait(h) => self.give_up(h, false, conns, ends),
            Timer::Member { handle, index } => {
                if !self.ask_verdict(handle, Some(index), conns, timers, ends.now) {
                    self.member_timed_out(handle, index, conns, ends);
                }
            }
            Timer::MemberCancelWait { handle, index } => {
                self.member_timed_out(handle, index, conns, ends)
            }
            Timer::Conn { .. } | Timer::ServeDeadline { .. } => {}
        }
    }

    /// A recv (`handle`, or its fused member `index`) that was sent reached its deadline:
    /// asks the responder to give it up with a `CANCEL` and waits for the verdict (up to
    /// [`CANCEL_WAIT`]) instead of failing it now. Returns whether it asked.
    fn ask_verdict(
        &mut self,
        handle: u64,
        index: Option<u32>,
        conns: &mut Conns,
        timers: &mut Timers,
        now: Instant,
    ) -> bool {
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
        if !send_cancel(conns, p.conn, handle, items) {
            return false;
        }
        *asked = true;
        let timer = match index {
            None => Timer::CancelWait(handle),
            Some(index) => Timer::MemberCancelWait { handle, index },
        };
        timers.add(now + CANCEL_WAIT, timer);
        true
    }

    /// Fails request `handle` with a timeout now, its answer no longer awaited; when
    /// `tell` and it was sent, the responder is told with a `CANCEL` (it then drops what it
    /// holds for it, e.g. a push still arriving).
    fn give_up(&mut self, handle: u64, tell: bool, conns: &mut Conns, ends: &mut Ends<'_>) {
        let Ok(p) = self.ctxs.remove(CtxKey::from_raw(handle)) else {
            return;
        };
        self.abandon(handle, &p);
        if tell && p.sent.is_some() {
            send_cancel(conns, p.conn, handle, &[]);
        }
        let e = conns.timeout(p.conn);
        let peer = conns.peer_addr(p.conn);
        let (marks, sent) = (Some(p.marks), p.sent);
        ends.fail(
            peer,
            p.submitter,
            p.tag,
            p.kind,
            &p.fused,
            e,
            p.spare,
            sent,
            marks,
        );
    }

    /// One recv of a fused request reached its own deadline: it fails alone.
    fn member_timed_out(&mut self, handle: u64, index: u32, conns: &Conns, ends: &mut Ends<'_>) {
        let h = CtxKey::from_raw(handle);
        let Ok(p) = self.ctxs.get_mut(h) else {
            return;
        };
        let Some(m) = p.fused.get_mut(index as usize).filter(|m| !m.done) else {
            return;
        };
        m.done = true;
        let m = *m;
        let all_done = p.fused.iter().all(|m| m.done);
        let conn = p.conn;
        let timeout = conns.timeout(conn);
        let peer = conns.get(conn).map_or(u32::MAX, |c| c.peer);
        ends.member(&m, Err(timeout), peer, None);
        if all_done {
            if let Ok(p) = self.ctxs.remove(h) {
                self.abandon(handle, &p);
            }
        }
    }
}

/// Queues a `CANCEL` of `items` of request `handle` (all of it when empty) on connection
/// `slot`, if it can carry one; returns whether it did.
fn send_cancel(conns: &mut Conns, slot: u32, handle: u64, items: &[u32]) -> bool {
    let Some(c) = conns.get_mut(slot) else {
        return false;
    };
    if !c.can_send() || c.proto.encoder().cancel(handle, items).is_err() {
        return false;
    }
    conns.mark_dirty(slot);
    true
}
