//! Acting on one connection's decoded frames: answers to this task's requests (matched by
//! their echoed handle), and requests from the peer for the service (see `serve.rs`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use slab::Slab;

use crate::ctx::{CtxKey, CtxSlab};
use crate::error::{Error, ErrorKind};
use crate::pool::Job;
use crate::proto::{ConnEvent, Encoder, Frame, PayloadTarget};
use crate::rendezvous::Rendezvous;
use crate::service::Service;
use crate::stats::{add, Counters, Outcome, RequestKind};
use crate::tensor::Tensor;
use crate::wire::{Body, FrameKind, ResponseEntries, Status};

use super::conn::{route, tensor_for};
use super::metrics::{self, Meter};
use super::outbox::{Outbox, Reply};
use super::reply::{IncomingPush, ReplyState, Spare};
use super::request::{remember_abandoned, Pending};
use super::serve::ServeScratch;

/// Acts on one connection's decoded events: answers to our requests, and requests from
/// the peer for the service.
pub(super) struct Dispatch<'a> {
    pub(super) slot: u32,
    pub(super) now: Instant,
    pub(super) ctxs: &'a mut CtxSlab<Pending>,
    pub(super) abandoned: &'a mut VecDeque<(u64, u32)>,
    pub(super) outbox: &'a mut Outbox,
    pub(super) counters: &'a Counters,
    pub(super) service: Option<&'a dyn Service>,
    pub(super) rendezvous: Option<&'a Rendezvous>,
    pub(super) jobs: Option<&'a std::sync::mpsc::SyncSender<Job>>,
    /// This loop's index and this connection's generation, for rendezvous waiters.
    pub(super) waiter_base: (usize, u32),
    pub(super) recvs: &'a mut Vec<(u64, u32)>,
    pub(super) allocator: &'a dyn crate::tensor::TensorAllocator,
    pub(super) out_tensors: &'a mut Slab<Arc<Tensor>>,
    pub(super) cur_handle: &'a mut u64,
    pub(super) cur_is_push: &'a mut bool,
    pub(super) cur_chunk: &'a mut (u64, u32, u64),
    pub(super) chunk_owners: &'a mut VecDeque<(bool, u64)>,
    pub(super) incoming: &'a mut Vec<IncomingPush>,
    /// The connection's account of the receive budget.
    pub(super) budget: &'a super::budget::ConnBudget,
    pub(super) serve: &'a mut ServeScratch,
    /// The session's timers (deadlines of the peer's recvs).
    pub(super) timers: &'a mut super::timer::Timers,
    /// Requests the peer may have waiting on this connection (`max_served`).
    pub(super) max_served: usize,
    /// The peer this connection was opened to (`None` for an accepted one).
    pub(super) peer: Option<std::net::SocketAddr>,
    /// The peer's metric block: of requests sent to it on an outgoing connection, of
    /// requests served to it on an accepted one.
    pub(super) metrics: Option<&'a crate::stats::PeerBlock>,
    /// The peer's index in the loop's peer table (for the trace).
    pub(super) peer_index: u32,
    pub(super) trace: &'a mut super::trace::Tracer,
    /// This task's name for stats answers; `None`: the stats endpoint is off.
    pub(super) stats_task: Option<&'a str>,
    pub(super) opened: bool,
    pub(super) violation: Option<&'static str>,
}

impl Dispatch<'_> {
    pub(super) fn on_event(&mut self, ev: ConnEvent<'_>, enc: &mut Encoder) {
        if self.violation.is_some() {
            return;
        }
        match ev {
            ConnEvent::Opened => self.opened = true,
            ConnEvent::Frame(f) => {
                add(&self.counters.frames_in, 1);
                *self.cur_handle = f.header.handle;
                let is_push = matches!(f.header.kind, FrameKind::Push | FrameKind::PushRows);
                *self.cur_is_push = is_push;
                // Mirror the decoder's queue of chunked tensors (it keeps every one it
                // accepted, whatever we do with the frame), noting whose they are.
                for t in f.body.tensors().filter(|t| t.meta.chunked) {
                    self.chunk_owners.push_back((is_push, t.meta.byte_len));
                }
                let h = f.header.handle;
                self.count_frame(&f);
                let queued_before = metrics::queued(enc);
                let kind = f.header.kind;
                match f.body {
                    // The answer to a heartbeat: its arrival was the point.
                    Body::Pong if h == super::timer::HEARTBEAT_HANDLE => {}
                    Body::Pong | Body::Error(_) => self.on_pong_or_error(&f),
                    Body::Response(entries) => self.on_response(h, entries, f.header.end),
                    Body::Pull(_)
                    | Body::Push(_)
                    | Body::Recv(_)
                    | Body::FusedRecv(_)
                    | Body::PullRows(_)
                    | Body::PushRows(_)
                        if self.incoming.len() + self.recvs.len() >= self.max_served =>
                    {
                        // A peer may not pile up unanswered requests without limit. Its
                        // payload, if any, is still read and dropped.
                        let _ = enc.error(h, Status::ResourceExhausted, "too many requests");
                        if let Some(kind) = metrics::served_kind(f.header.kind) {
                            metrics::served_end(self.metrics, kind, Outcome::Refused);
                        }
                    }
                    Body::Cancel(items) => self.on_cancel(h, items, enc),
                    Body::Stats => self.serve_stats(h, enc),
                    Body::Pull(ids) => self.serve_pull(h, ids, enc),
                    Body::PullRows(tables) => self.serve_pull_rows(h, tables, enc),
                    Body::Push(_) | Body::PushRows(_) => {
                        if self.incoming.iter().any(|p| p.handle == h) {
                            self.violation = Some("push with a handle already in use");
                            return;
                        }
                        let spare = self.serve.push_vecs.pop().unwrap_or_default();
                        let mut push = match f.body {
                            Body::Push(entries) => {
                                IncomingPush::new(h, entries, self.allocator, spare)
                            }
                            Body::PushRows(tables) => {
                                IncomingPush::rows(h, tables, self.allocator, spare)
                            }
                            _ => return,
                        };
                        push.deadline = deadline_of(self.now, f.header.timeout_ms);
                        push.arrived = Some(self.now);
                        self.incoming.push(push);
                    }
                    Body::Recv(r) | Body::FusedRecv(r) => {
                        let deadline = deadline_of(self.now, f.header.timeout_ms);
                        self.serve_recv(h, r, deadline, enc)
                    }
                    Body::Chunk(c) => {
                        *self.cur_chunk = (h, c.index, c.offset + f.header.payload_len as u64);
                    }
                    _ => {}
                }
                self.count_answer(kind, queued_before, enc);
            }
            ConnEvent::Payload {
                target,
                offset,
                data,
            } => {
                add(&self.counters.payload_copied, data.len() as u64);
                self.on_payload(target, offset, data);
            }
            ConnEvent::FrameEnd(h) => match h.kind {
                FrameKind::Push | FrameKind::PushRows => {
                    if let Some(p) = self.incoming.iter_mut().find(|p| p.handle == h.handle) {
                        p.frame_done();
                    }
                    let queued_before = metrics::queued(enc);
                    self.finish_push(h.handle, enc);
                    self.count_answer(h.kind, queued_before, enc);
                }
                FrameKind::Response => {
                    self.deliver_ready_members(h.handle);
                    self.try_complete(h.handle);
                }
                FrameKind::Chunk => {
                    // All of the chunk's bytes have arrived, copied or received in place.
                    let (handle, index, end) = *self.cur_chunk;
                    if let Some(&(is_push, len)) = self.chunk_owners.front() {
                        if end == len {
                            self.chunk_owners.pop_front();
                        }
                        self.chunk_progress(is_push, handle, index, end, enc);
                    }
                }
                _ => {}
            },
        }
    }

    /// Looks up the request an answer names; a forged, stale or foreign handle is a
    /// protocol violation.
    fn answered(&mut self, handle: u64) -> Option<&mut Pending> {
        let slot = self.slot;
        if self.abandoned.contains(&(handle, slot)) {
            // A late answer to a request given up by deadline: ignored, payload dropped.
            return None;
        }
        match self.ctxs.get_mut(CtxKey::from_raw(handle)) {
            Ok(p) if p.conn == slot && p.sent.is_some() => {
                p.trace.answered.get_or_insert(self.now);
                Some(p)
            }
            _ => {
                self.violation = Some("answer with an unknown or stale handle");
                None
            }
        }
    }

    fn on_pong_or_error(&mut self, f: &Frame<'_>) {
        let handle = f.header.handle;
        let now = self.now;
        let Some(p) = self.answered(handle) else {
            return;
        };
        // An ERROR for a request: items already answered keep their answer (the others get
        // the status); with none answered the whole request fails.
        let partial = matches!(f.body, Body::Error(_)) && p.state.fail_open(f.header.status);
        let reply = match f.body {
            Body::Error(_) if partial => Ok(None),
            Body::Error(e) => {
                // The responder's verdict on a deadline (its own, or our CANCEL after ours).
                let status = match f.header.status {
                    Status::DeadlineExceeded | Status::Cancelled => ErrorKind::Timeout,
                    s => ErrorKind::Remote(s),
                };
                let message = String::from_utf8_lossy(e.message);
                let mut e = Error::new(status);
                if let Some(peer) = self.peer {
                    e = e.with_peer(peer);
                }
                Err(if message.is_empty() {
                    e
                } else {
                    e.with_message(&*message)
                })
            }
            _ if matches!(p.state, ReplyState::Ping) => Ok(Some(Reply::Pong {
                rtt: p.sent.map_or(Duration::ZERO, |s| now - s),
                payload: f.header.payload_len,
            })),
            _ => {
                self.violation = Some("pong for a request that is not a ping");
                return;
            }
        };
        if let Ok(p) = self.ctxs.remove(CtxKey::from_raw(handle)) {
            self.complete(p, reply.transpose());
        }
    }

    /// Completes request `p` with `result`, or, when `None`, with the answer it assembled.
    fn complete(&mut self, mut p: Pending, result: Option<Result<Reply, Error>>) {
        let result = result.unwrap_or_else(|| Ok(p.state.finish(&mut p.spare)));
        let (origin, tag, kind) = (p.origin, p.tag, p.kind);
        let marks = Some(&p.trace);
        let (now, index) = (self.now, self.peer_index);
        self.trace
            .ended(now, tag, kind, index, p.sent, marks, &result);
        let meter = Meter {
            block: self.metrics,
            latency: p.sent.map(|s| self.now.saturating_duration_since(s)),
        };
        self.outbox.notify(
            self.counters,
            meter,
            origin,
            tag,
            kind,
            &p.fused,
            result,
            p.spare,
        );
    }

    fn on_response(&mut self, handle: u64, entries: ResponseEntries<'_>, end: bool) {
        let default = self.allocator;
        let Some(p) = self.answered(handle) else {
            return;
        };
        let alloc: &dyn crate::tensor::TensorAllocator = match &p.alloc {
            Some(a) => &**a,
            None => default,
        };
        if let Err(why) = p.state.accept(entries, end, alloc) {
            self.violation = Some(why);
        }
    }

    /// For recvs the loop fused: completes each member whose tensor is fully in, without
    /// waiting for the others. Runs at the end of a `RESPONSE` frame (its inline payload has
    /// arrived) and at the end of a chunked tensor.
    fn deliver_ready_members(&mut self, handle: u64) {
        let h = CtxKey::from_raw(handle);
        let Ok(p) = self.ctxs.get_mut(h) else {
            return;
        };
        if p.fused.is_empty() {
            return;
        }
        let sent = p.sent;
        for i in 0..p.fused.len() {
            if p.fused[i].done {
                continue;
            }
            if let Some(r) = p.state.take_ready(i as u32) {
                p.fused[i].done = true;
                let m = p.fused[i];
                let one = match r {
                    // Given up by its deadline: the responder confirms no tensor is coming.
                    Err(Status::Cancelled | Status::DeadlineExceeded) if m.cancel_sent => {
                        Err(Error::new(ErrorKind::Timeout))
                    }
                    r => Ok(Reply::Received(vec![r])),
                };
                let meter = Meter {
                    block: self.metrics,
                    latency: sent.map(|s| self.now.saturating_duration_since(s)),
                };
                let (marks, index, now) = (Some(&p.trace), self.peer_index, self.now);
                self.trace
                    .ended(now, m.tag, RequestKind::Recv, index, sent, marks, &one);
                self.outbox.deliver(
                    self.counters,
                    meter,
                    m.origin,
                    m.tag,
                    RequestKind::Recv,
                    one,
                    Spare::default(),
                );
            }
        }
        if p.fused.iter().all(|m| m.done) {
            let answered_fully = p.state.is_complete();
            self.ctxs.remove(h).ok();
            if !answered_fully {
                // More frames may still come for it; they are recognised and dropped.
                remember_abandoned(self.abandoned, handle, self.slot);
            }
        }
    }

    /// Completes request `handle` if its whole answer has arrived.
    fn try_complete(&mut self, handle: u64) {
        let h = CtxKey::from_raw(handle);
        let done = self.ctxs.get(h).is_ok_and(|p| p.state.is_complete());
        if !done {
            return;
        }
        if let Ok(p) = self.ctxs.remove(h) {
            self.complete(p, None);
        }
    }

    fn on_payload(&mut self, target: PayloadTarget, offset: u64, data: &[u8]) {
        let Some(route) = route(
            target,
            *self.cur_handle,
            *self.cur_is_push,
            self.chunk_owners,
        ) else {
            return;
        };
        let end = offset + data.len() as u64;
        let slot = self.slot;
        let (alloc, budget) = (self.allocator, self.budget);
        if let Some(t) = tensor_for(self.ctxs, self.incoming, slot, route, alloc, budget) {
            let dst = t.bytes_mut();
            let (start, stop) = (offset as usize, end as usize);
            if stop <= dst.len() {
                dst[start..stop].copy_from_slice(data);
            }
        }
    }

    fn chunk_progress(
        &mut self,
        is_push: bool,
        handle: u64,
        index: u32,
        end: u64,
        enc: &mut Encoder,
    ) {
        if is_push {
            if let Some(p) = self.incoming.iter_mut().find(|p| p.handle == handle) {
                p.chunk_progress(index, end);
                self.finish_push(handle, enc);
            }
            return;
        }
        let slot = self.slot;
        let ours = self.ctxs.get_mut(CtxKey::from_raw(handle));
        if let Some(p) = ours.into_iter().find(|p| p.conn == slot) {
            p.state.chunk_progress(index, end);
            self.deliver_ready_members(handle);
            self.try_complete(handle);
        }
    }
}

/// When a request that arrived `now` with `timeout_ms` stops being waited for.
fn deadline_of(now: Instant, timeout_ms: u32) -> Option<Instant> {
    (timeout_ms > 0).then(|| now + Duration::from_millis(timeout_ms.into()))
}
