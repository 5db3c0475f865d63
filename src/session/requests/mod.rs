//! The client side of requests: the context each request keeps while in flight, fusing the
//! recvs of one drain pass, encoding requests on their connection, matching answers to
//! them ([`answer`]), their deadlines ([`deadline`]), and how a request ends (its metrics,
//! its trace and its completion, through [`Ends`]).

mod answer;
pub(crate) mod deadline;
mod fuse;
mod in_flight;

pub(crate) use fuse::fuse;
pub(crate) use in_flight::{InFlight, ReplyState};

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::ctx::{CtxKey, CtxSlab, Full};
use crate::error::{Error, ErrorKind};
use crate::proto::{EncodeError, PushItem};
use crate::stats::{Outcome, RequestKind};
use crate::tensor::Tensor;
use crate::wire::WireFeatures;

use super::conn::{Conn, Phase};
use super::conns::Conns;
use super::observer::{Ended, Marks, Observer};
use super::outbox::Outbox;
use super::reply::{Reply, Spare};
use super::request::{FusedMember, Request, RequestOp, Submitter};
use super::respond::{out_tensor, recast};
use super::rows::{self, Grads, RowsEncodeScratch};
use super::timer::{Timer, Timers};

/// Requests given up by deadline whose late answers are recognised and ignored.
pub(crate) const ABANDONED_KEPT: usize = 4096;

/// Where a request's end goes: counted and traced by the observer, delivered by the
/// outbox.
pub(crate) struct Ends<'a> {
    pub observer: &'a mut Observer,
    pub outbox: &'a mut Outbox,
    pub now: Instant,
}

/// A request that ended, and how.
pub(crate) struct Finished<'a> {
    pub submitter: Submitter,
    pub tag: u64,
    pub kind: RequestKind,
    /// The recvs the session fused into it (each gets its own completion).
    pub fused: &'a [FusedMember],
    pub result: Result<Reply, Error>,
    pub spare: Spare,
    /// Its peer's index in the observer's table.
    pub peer: u32,
    /// When its peer answered it, the time since it was queued.
    pub latency: Option<Duration>,
    pub sent: Option<Instant>,
    pub marks: Option<Marks>,
}

impl Ends<'_> {
    /// Records a request's end and hands its completion (or, for recvs the session fused,
    /// one per original recv not completed yet) to its submitter.
    pub(crate) fn finish(&mut self, mut f: Finished<'_>) {
        if let Err(e) = f.result {
            f.result = Err(self.observer.named(f.peer, e));
        }
        let ended = Ended {
            tag: f.tag,
            kind: f.kind,
            peer: f.peer,
            outcome: Outcome::of(&f.result),
            latency: f.latency,
            sent: f.sent,
            marks: f.marks,
        };
        if f.fused.is_empty() {
            self.observer.ended(self.now, &ended);
            return self.outbox.deliver(f.submitter, f.tag, f.result, f.spare);
        }
        // Traced once, as the one request it travelled as; counted per original recv.
        self.observer.traced(self.now, &ended);
        let mut results = match f.result {
            Ok(Reply::Received(results)) => Ok(results.into_iter()),
            // A fused recv answered as something else is the peer's protocol error.
            other => Err(other.err().unwrap_or(Error::new(ErrorKind::Protocol))),
        };
        for m in f.fused {
            let one = match &mut results {
                Ok(r) => match r.next() {
                    Some(r) => Ok(Reply::Received(vec![r])),
                    None => break,
                },
                Err(e) => Err(e.clone()),
            };
            // Members whose own deadline already passed got their completion then.
            if !m.done {
                self.member(m, one, f.peer, f.latency);
            }
        }
    }

    /// Hands one fused recv its completion.
    pub(crate) fn member(
        &mut self,
        m: &FusedMember,
        result: Result<Reply, Error>,
        peer: u32,
        latency: Option<Duration>,
    ) {
        let result = result.map_err(|e| self.observer.named(peer, e));
        let outcome = Outcome::of(&result);
        self.observer
            .counted(RequestKind::Recv, outcome, peer, latency);
        self.outbox
            .deliver(m.submitter, m.tag, result, Spare::default());
    }

    /// Fails a request the loop never sent (or lost the connection of): its error names
    /// `peer`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fail(
        &mut self,
        peer: Option<SocketAddr>,
        submitter: Submitter,
        tag: u64,
        kind: RequestKind,
        fused: &[FusedMember],
        error: Error,
        spare: Spare,
        sent: Option<Instant>,
        marks: Option<Marks>,
    ) {
        // Most errors name their peer already (a clone of the connection's, shared).
        let error = match peer {
            Some(peer) if error.peer() != Some(peer) => error.with_peer(peer),
            _ => error,
        };
        let peer = self.observer.peer_of(peer);
        self.finish(Finished {
            submitter,
            tag,
            kind,
            fused,
            result: Err(error),
            spare,
            peer,
            // Not answered by its peer: no latency.
            latency: None,
            sent,
            marks,
        });
    }
}

/// The connection an answer arrived on.
#[derive(Clone, Copy)]
pub(crate) struct Source {
    pub slot: u32,
    /// Its peer's index in the observer's table.
    pub peer: u32,
    /// The peer it was opened to.
    pub addr: Option<SocketAddr>,
}

/// Vectors for encoding requests, reused from request to request.
#[derive(Default)]
struct EncodeScratch {
    tokens: Vec<u64>,
    items: Vec<PushItem<'static>>,
    rows: RowsEncodeScratch,
    /// Ping payload.
    zeros: Vec<u8>,
}

/// The requests of this loop: in flight, held back for fusion, and given up.
pub(crate) struct Requests {
    ctxs: CtxSlab<InFlight>,
    /// Requests given up by deadline after they were sent: handle and connection.
    abandoned: VecDeque<(u64, u32)>,
    /// Single-key recvs of the current drain pass, when tensor fusion is on.
    fuse_buf: Vec<(Request, Submitter)>,
    scratch: EncodeScratch,
    /// Whether single-key recvs of a drain pass are fused.
    fuse: bool,
}

impl Requests {
    pub(crate) fn new(cfg: &Config) -> Requests {
        Requests {
            ctxs: CtxSlab::with_capacity(cfg.max_inflight),
            abandoned: VecDeque::new(),
            fuse_buf: Vec::new(),
            scratch: EncodeScratch::default(),
            fuse: cfg.tensor_fuse,
        }
    }

    /// Holds `req` back to be fused with the other single-key recvs of this drain pass when
    /// tensor fusion is on and the loop is not stopping; otherwise gives it back, to be
    /// started now.
    pub(crate) fn hold(
        &mut self,
        req: Request,
        submitter: Submitter,
        stopping: bool,
    ) -> Option<(Request, Submitter)> {
        let single_recv = matches!(&req.op, RequestOp::Recv { keys, .. } if keys.len() == 1);
        if self.fuse && single_recv && !stopping {
            self.fuse_buf.push((req, submitter));
            return None;
        }
        Some((req, submitter))
    }

    /// The recvs held back in this drain pass (the vector goes back with
    /// [`restore_held`](Self::restore_held)).
    pub(crate) fn take_held(&mut self) -> Vec<(Request, Submitter)> {
        std::mem::take(&mut self.fuse_buf)
    }

    /// Gives back the vector of [`take_held`](Self::take_held), emptied.
    pub(crate) fn restore_held(&mut self, mut buf: Vec<(Request, Submitter)>) {
        buf.clear();
        self.fuse_buf = buf;
    }

    /// Whether request `handle` is in flight.
    pub(crate) fn contains(&self, handle: u64) -> bool {
        self.ctxs.contains(CtxKey::from_raw(handle))
    }

    /// Request `handle`, in flight.
    pub(crate) fn get(&self, handle: u64) -> Option<&InFlight> {
        self.ctxs.get(CtxKey::from_raw(handle)).ok()
    }

    /// Whether requests are waiting for or in flight on connection `slot` (`conn`).
    pub(crate) fn any_on(&self, slot: u32, conn: &Conn) -> bool {
        !conn.waiting.is_empty() || self.ctxs.iter().any(|(_, p)| p.conn == slot)
    }

    /// Starts `req` (from `submitter`; `fused` lists the original recvs when the session
    /// fused several) on connection `slot`: sent now if it is open, else when it opens.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        &mut self,
        req: Request,
        submitter: Submitter,
        fused: Vec<FusedMember>,
        conns: &mut Conns,
        slot: u32,
        timers: &mut Timers,
        ends: &mut Ends<'_>,
    ) {
        let now = ends.now;
        let kind = req.op.kind();
        let mut spare = req.spare;
        let peer = conns.get(slot).map_or(u32::MAX, |c| c.peer);
        if fused.is_empty() {
            let (tensors, rows) = req.op.items();
            ends.observer.started(peer, kind, tensors, rows);
        } else {
            // Recvs the session fused count one by one, as they complete.
            for _ in &fused {
                ends.observer.started(peer, RequestKind::Recv, 1, 0);
            }
        }
        let alloc = match &req.op {
            RequestOp::Pull { alloc, .. } | RequestOp::PullRows { alloc, .. } => alloc.clone(),
            _ => None,
        };
        let wire_deadline = if fused.is_empty() {
            req.deadline
        } else {
            fused
                .iter()
                .map(|m| m.deadline)
                .try_fold(None, |latest: Option<Instant>, d| {
                    Some(latest.max(Some(d?)))
                })
                .flatten()
        };
        let in_flight = InFlight {
            tag: req.tag,
            submitter,
            kind,
            state: ReplyState::of(&req.op, &mut spare),
            op: Some(req.op),
            alloc,
            conn: slot,
            sent: None,
            fused,
            wire_deadline,
            cancel_sent: false,
            spare,
            marks: Marks::taken(req.trace, now),
        };
        let handle = match self.ctxs.insert(in_flight) {
            Ok(h) => h.to_raw(),
            Err(Full(p)) => {
                let e = Error::new(ErrorKind::Backpressure);
                let marks = Some(p.marks);
                let (tag, fused) = (p.tag, &p.fused);
                return ends.fail(
                    Some(req.peer),
                    submitter,
                    tag,
                    kind,
                    fused,
                    e,
                    p.spare,
                    None,
                    marks,
                );
            }
        };
        if let Some(deadline) = req.deadline {
            timers.add(deadline, Timer::Deadline(handle));
        }
        if let Ok(p) = self.ctxs.get(CtxKey::from_raw(handle)) {
            for (i, m) in p.fused.iter().enumerate() {
                if let Some(at) = m.deadline {
                    let index = i as u32;
                    timers.add(at, Timer::Member { handle, index });
                }
            }
        }
        let Some(conn) = conns.get_mut(slot) else {
            return;
        };
        if conn.phase == Phase::Open {
            self.send(conns, slot, handle, ends);
        } else {
            conn.waiting.push_back(handle);
        }
    }

    /// Sends the requests that waited for connection `slot` to open.
    pub(crate) fn opened(&mut self, conns: &mut Conns, slot: u32, ends: &mut Ends<'_>) {
        while let Some(h) = conns.get_mut(slot).and_then(|c| c.waiting.pop_front()) {
            self.send(conns, slot, h, ends);
        }
    }

    /// Encodes request `handle` on connection `slot`.
    pub(crate) fn send(&mut self, conns: &mut Conns, slot: u32, handle: u64, ends: &mut Ends<'_>) {
        let now = ends.now;
        let Ok(p) = self.ctxs.get_mut(CtxKey::from_raw(handle)) else {
            return;
        };
        p.sent = Some(now);
        let Some(mut op) = p.op.take() else {
            return;
        };
        let Some(conn) = conns.get_mut(slot) else {
            return;
        };
        let formats = conn.proto.features().contains(WireFeatures::ROW_FORMATS);
        if !formats && op.fall_back() {
            // Rows asked in another dtype than their table's (or pushed with a loss scale)
            // of a peer that did not announce the feature: they travel as the table's.
            if let ReplyState::Rows(r) = &mut p.state {
                r.fall_back();
            }
            if !conn.told_fallback {
                conn.told_fallback = true;
                log::warn!(
                    "{} did not announce row_formats: rows travel to and from it in their \
                     tables' dtype, and loss scales are divided out before pushes are sent",
                    conn.outgoing
                        .map_or_else(|| "a peer".to_string(), |(a, _)| a.to_string())
                );
            }
        }
        if !conn.proto.features().contains(WireFeatures::ROW_VERSIONS) && op.drop_held() {
            // A peer that did not announce row versions: a plain pull, every row answered
            // as changed, of version 0 (unknown).
            if let ReplyState::Rows(r) = &mut p.state {
                r.unversioned();
            }
        }
        let over = conn
            .proto
            .peer()
            .and_then(|peer| op.over_limits(&peer.limits));
        if let Some(why) = over {
            log::debug!("request over the peer's limits: {why}");
            let e = Error::new(ErrorKind::InvalidArgument).with_message(why);
            return self.fail(handle, conns.peer_addr(slot), e, ends);
        }
        // The time the answer is still waited for, rounded up to whole milliseconds.
        let timeout_ms = p.wire_deadline.map_or(0, |d| {
            let left = d.saturating_duration_since(now);
            let ms = left.as_nanos().div_ceil(1_000_000);
            u32::try_from(ms).unwrap_or(u32::MAX).max(1)
        });
        let Conn {
            proto, out_tensors, ..
        } = conn;
        let enc = proto.encoder();
        enc.set_request_timeout(timeout_ms);
        let queued_before = enc.ready_bytes();
        let s = &mut self.scratch;
        let result = match &op {
            RequestOp::Ping { payload } => {
                let n = *payload as usize;
                if s.zeros.len() < n {
                    s.zeros.resize(n, 0);
                }
                enc.ping(handle, &s.zeros[..n])
            }
            RequestOp::Pull { ids, .. } => enc.pull(handle, ids),
            RequestOp::Push { items } => {
                encode_push(enc, out_tensors, handle, items, &mut s.tokens, &mut s.items)
            }
            RequestOp::Recv { step, keys } => enc.recv(handle, *step, keys, keys.len() != 1),
            RequestOp::PullRows {
                tables, ids, held, ..
            } => rows::encode_pull(enc, handle, tables, ids, held, &mut s.rows),
            RequestOp::PushRows {
                tables,
                ids,
                grads,
                shared,
            } => {
                let blocks = if shared.is_empty() {
                    Grads::Packed(grads)
                } else {
                    Grads::Shared(shared)
                };
                rows::encode_push(enc, out_tensors, handle, tables, ids, blocks, &mut s.rows)
            }
            RequestOp::Stats => enc.stats(handle),
            RequestOp::Checkpoint => enc.checkpoint(handle),
        };
        if result.is_ok() {
            let n = enc.ready_bytes() - queued_before + op.chunked_bytes(enc.chunk_limit());
            ends.observer.bytes_out(conn.peer, p.metered_kind(), n);
            p.marks.bytes = n;
        }
        // The request's vectors go back to its submitter with the completion.
        op.recycle_into(&mut p.spare);
        match result {
            Ok(()) => conns.mark_dirty(slot),
            Err(e) => {
                log::debug!("request not encodable: {e}");
                let e = Error::new(ErrorKind::InvalidArgument);
                self.fail(handle, conns.peer_addr(slot), e, ends);
            }
        }
    }

    /// Fails request `handle` with `error` (naming `peer`) and forgets it.
    pub(crate) fn fail(
        &mut self,
        handle: u64,
        peer: Option<SocketAddr>,
        error: Error,
        ends: &mut Ends<'_>,
    ) {
        if let Ok(p) = self.ctxs.remove(CtxKey::from_raw(handle)) {
            let (marks, sent) = (Some(p.marks), p.sent);
            let fused = &p.fused;
            ends.fail(
                peer,
                p.submitter,
                p.tag,
                p.kind,
                fused,
                error,
                p.spare,
                sent,
                marks,
            );
        }
    }

    /// Connection `slot` (`conn`, to `peer`) is being released: the requests waiting for it
    /// or in flight on it fail with `why`.
    pub(crate) fn release(
        &mut self,
        slot: u32,
        conn: &mut Conn,
        peer: Option<SocketAddr>,
        why: &Error,
        ends: &mut Ends<'_>,
    ) {
        let mut failed: Vec<u64> = conn.waiting.drain(..).collect();
        failed.extend(
            self.ctxs
                .iter()
                .filter(|(_, p)| p.conn == slot && p.sent.is_some())
                .map(|(h, _)| h.to_raw()),
        );
        for h in failed {
            self.fail(h, peer, why.clone(), ends);
        }
    }

    /// Requests `handles`, not sent, go out on connection `slot` instead of the one they
    /// waited for: at once when it is open, else when its handshake completes.
    pub(crate) fn rehome(
        &mut self,
        conns: &mut Conns,
        handles: &[u64],
        slot: u32,
        ends: &mut Ends<'_>,
    ) {
        for &h in handles {
            let Ok(p) = self.ctxs.get_mut(CtxKey::from_raw(h)) else {
                continue;
            };
            p.conn = slot;
            match conns.get_mut(slot) {
                Some(c) if c.phase == Phase::Open => self.send(conns, slot, h, ends),
                Some(c) => c.waiting.push_back(h),
                None => {}
            }
        }
    }

    /// Remembers request `handle` (`p`), given up while its answer may still come, so that
    /// the answer is ignored rather than taken for a forged handle. Bounded: the oldest is
    /// forgotten first (a very late answer to it then closes the connection as a protocol
    /// violation).
    fn abandon(&mut self, handle: u64, p: &InFlight) {
        if p.sent.is_some() {
            remember_abandoned(&mut self.abandoned, handle, p.conn);
        }
    }
}

/// Notes that late answers to `handle` on connection `conn` are to be ignored.
fn remember_abandoned(abandoned: &mut VecDeque<(u64, u32)>, handle: u64, conn: u32) {
    if abandoned.len() == ABANDONED_KEPT {
        abandoned.pop_front();
    }
    abandoned.push_back((handle, conn));
}

/// Queues a push whose tensors are referenced (not copied) while they are written.
fn encode_push(
    enc: &mut crate::proto::Encoder,
    out_tensors: &mut slab::Slab<Arc<Tensor>>,
    handle: u64,
    items: &[(u64, Arc<Tensor>)],
    tokens: &mut Vec<u64>,
    scratch: &mut Vec<PushItem<'static>>,
) -> Result<(), EncodeError> {
    tokens.clear();
    tokens.extend(
        items
            .iter()
            .map(|(_, t)| out_tensors.insert(t.clone()) as u64),
    );
    let mut push: Vec<PushItem<'_>> = recast(std::mem::take(scratch));
    push.extend(
        items
            .iter()
            .zip(tokens.iter())
            .map(|((id, t), &token)| PushItem {
                var_id: *id,
                tensor: out_tensor(t, token),
            }),
    );
    let r = enc.push(handle, &push);
    *scratch = recast(push);
    if r.is_err() {
        for &t in tokens.iter() {
            out_tensors.try_remove(t as usize);
        }
    }
    r
}
