//! Answers to this task's requests, matched by their echoed handle: `PONG`s, `ERROR`s,
//! `RESPONSE` entries and their payload, and the chunks of large answers. A forged, stale
//! or foreign handle, or an answer of the wrong form, is the peer's [`Violation`].

use std::time::Instant;

use crate::ctx::CtxKey;
use crate::error::{Error, ErrorKind};
use crate::proto::Frame;
use crate::stats::RequestKind;
use crate::tensor::{Tensor, TensorAllocator};
use crate::wire::{Body, ResponseEntries, Status};

use super::super::budget::ConnBudget;
use super::super::reply::Reply;
use super::super::violation::Violation;
use super::{remember_abandoned, Ends, Finished, InFlight, ReplyState, Requests, Source};

impl Requests {
    /// The request `handle` an answer on connection `slot` names: `None` for a request
    /// given up by deadline (its late answer is dropped).
    fn answered(
        &mut self,
        handle: u64,
        slot: u32,
        now: Instant,
    ) -> Result<Option<&mut InFlight>, Violation> {
        let key = CtxKey::from_raw(handle);
        let live = matches!(self.ctxs.get(key), Ok(p) if p.conn == slot && p.sent.is_some());
        // A handle given up is no live one (its slot's generation moved on): the given-up
        // ones are searched only for an answer to no request in flight, not for every one.
        if !live && self.abandoned.contains(&(handle, slot)) {
            return Ok(None);
        }
        match self.ctxs.get_mut(key) {
            Ok(p) if live => {
                p.marks.answered.get_or_insert(now);
                Ok(Some(p))
            }
            _ => Err(Violation::UnknownHandle(handle)),
        }
    }

    /// The kind of request `handle` a frame on connection `slot` answers, for its metrics.
    pub(crate) fn metered_kind(&self, handle: u64) -> Option<RequestKind> {
        self.get(handle).map(InFlight::metered_kind)
    }

    /// A `PONG` or an `ERROR` for request `f.header.handle`.
    pub(crate) fn on_pong_or_error(
        &mut self,
        f: &Frame<'_>,
        from: Source,
        ends: &mut Ends<'_>,
    ) -> Result<(), Violation> {
        let handle = f.header.handle;
        let now = ends.now;
        let Some(p) = self.answered(handle, from.slot, now)? else {
            return Ok(());
        };
        // An ERROR for a request: items already answered keep their answer (the others get
        // the status); with none answered the whole request fails.
        let partial = matches!(f.body, Body::Error(_)) && p.state.fail_open(f.header.status);
        let reply = match f.body {
            Body::Error(e) if partial => {
                if let ReplyState::Rows(r) = &mut p.state {
                    r.refused(&String::from_utf8_lossy(e.message));
                }
                None
            }
            Body::Error(e) => {
                // The responder's verdict on a deadline (its own, or our CANCEL after ours).
                let kind = match f.header.status {
                    Status::DeadlineExceeded | Status::Cancelled => ErrorKind::Timeout,
                    s => ErrorKind::Remote(s),
                };
                let message = String::from_utf8_lossy(e.message);
                let mut e = Error::new(kind);
                if let Some(peer) = from.addr {
                    e = e.with_peer(peer);
                }
                Some(Err(if message.is_empty() {
                    e
                } else {
                    e.with_message(&*message)
                }))
            }
            _ if matches!(p.state, ReplyState::Ping) => Some(Ok(Reply::Pong {
                rtt: p.sent.map_or(std::time::Duration::ZERO, |s| now - s),
                payload: f.header.payload_len,
            })),
            _ => return Err(p.state.wrong(handle, f.header.kind)),
        };
        if let Ok(p) = self.ctxs.remove(CtxKey::from_raw(handle)) {
            complete(p, reply, from, ends);
        }
        Ok(())
    }

    /// The entries of a `RESPONSE` to request `handle` (`end`: its last frame).
    pub(crate) fn on_response(
        &mut self,
        handle: u64,
        entries: ResponseEntries<'_>,
        end: bool,
        slot: u32,
        default: &dyn TensorAllocator,
        now: Instant,
    ) -> Result<(), Violation> {
        let Some(p) = self.answered(handle, slot, now)? else {
            return Ok(());
        };
        let InFlight { alloc, state, .. } = p;
        let alloc: &dyn TensorAllocator = match alloc {
            Some(a) => &**a,
            None => default,
        };
        state.accept(handle, entries, end, alloc)
    }

    /// A `RESPONSE` frame to request `handle` is in (its inline payload too): recv members
    /// whose tensors are whole complete, and so does the request once its whole answer is.
    pub(crate) fn on_response_end(&mut self, handle: u64, from: Source, ends: &mut Ends<'_>) {
        self.deliver_ready_members(handle, from, ends);
        self.try_complete(handle, from, ends);
    }

    /// The tensor receiving item `index` of request `handle` on connection `slot`; memory
    /// for a chunked tensor is taken from the request's allocator (or `default`) when its
    /// first bytes arrive.
    pub(crate) fn tensor_mut(
        &mut self,
        handle: u64,
        index: u32,
        slot: u32,
        default: &dyn TensorAllocator,
        budget: &ConnBudget,
    ) -> Option<&mut Tensor> {
        let p = self.ctxs.get_mut(CtxKey::from_raw(handle)).ok()?;
        if p.conn != slot {
            return None;
        }
        let InFlight { alloc, state, .. } = p;
        let alloc: &dyn TensorAllocator = match alloc {
            Some(a) => &**a,
            None => default,
        };
        state.tensor_mut(index, alloc, budget)
    }

    /// Chunk bytes of item `index` of request `handle` up to `end` arrived.
    pub(crate) fn on_chunk(
        &mut self,
        handle: u64,
        index: u32,
        end: u64,
        from: Source,
        ends: &mut Ends<'_>,
    ) {
        let ours = self.ctxs.get_mut(CtxKey::from_raw(handle));
        if let Some(p) = ours.into_iter().find(|p| p.conn == from.slot) {
            p.state.chunk_progress(index, end);
            self.deliver_ready_members(handle, from, ends);
            self.try_complete(handle, from, ends);
        }
    }

    /// For recvs the loop fused: completes each member whose tensor is fully in, without
    /// waiting for the others.
    fn deliver_ready_members(&mut self, handle: u64, from: Source, ends: &mut Ends<'_>) {
        let h = CtxKey::from_raw(handle);
        let Ok(p) = self.ctxs.get_mut(h) else {
            return;
        };
        if p.fused.is_empty() {
            return;
        }
        let sent = p.sent;
        let latency = sent.map(|s| ends.now.saturating_duration_since(s));
        for i in 0..p.fused.len() {
            if p.fused[i].done {
                continue;
            }
            let Some(r) = p.state.take_ready(i as u32) else {
                continue;
            };
            p.fused[i].done = true;
            let m = p.fused[i];
            let one = match r {
                // Given up by its deadline: the responder confirms no tensor is coming.
                Err(Status::Cancelled | Status::DeadlineExceeded) if m.cancel_sent => {
                    Err(Error::new(ErrorKind::Timeout))
                }
                r => Ok(Reply::Received(vec![r])),
            };
            let ended = super::super::observer::Ended {
                tag: m.tag,
                kind: RequestKind::Recv,
                peer: from.peer,
                outcome: crate::stats::Outcome::of(&one),
                latency,
                sent,
                marks: Some(p.marks),
            };
            ends.observer.traced(ends.now, &ended);
            ends.member(&m, one, from.peer, latency);
        }
        if p.fused.iter().all(|m| m.done) {
            let answered_fully = p.state.is_complete();
            self.ctxs.remove(h).ok();
            if !answered_fully {
                // More frames may still come for it; they are recognised and dropped.
                remember_abandoned(&mut self.abandoned, handle, from.slot);
            }
        }
    }

    /// Completes request `handle` if its whole answer has arrived.
    fn try_complete(&mut self, handle: u64, from: Source, ends: &mut Ends<'_>) {
        let h = CtxKey::from_raw(handle);
        if !self.ctxs.get(h).is_ok_and(|p| p.state.is_complete()) {
            return;
        }
        if let Ok(p) = self.ctxs.remove(h) {
            complete(p, None, from, ends);
        }
    }
}

/// Completes request `p`, answered by its peer, with `result`, or, when `None`, with the
/// answer it assembled.
fn complete(
    mut p: InFlight,
    result: Option<Result<Reply, Error>>,
    from: Source,
    ends: &mut Ends<'_>,
) {
    let result = match result {
        Some(r) => r,
        None => p.state.finish(&mut p.spare),
    };
    let latency = p.sent.map(|s| ends.now.saturating_duration_since(s));
    ends.finish(Finished {
        submitter: p.submitter,
        tag: p.tag,
        kind: p.kind,
        fused: &p.fused,
        result,
        spare: p.spare,
        peer: from.peer,
        latency,
        sent: p.sent,
        marks: Some(p.marks),
    });
}
