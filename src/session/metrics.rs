//! Where the session records per-peer metrics (`stats::PeerBlock`): the loop's table of
//! peer blocks, the outcome of a finished request, and the answer to a `STATS` request.
//!
//! Blocks are found by the peer index each connection keeps (`Conn::metrics`), assigned
//! when a connection to a new address is opened or a handshake names a new task; the
//! request path only follows that index.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::ctx::{CtxKey, CtxSlab};
use crate::error::{Error, ErrorKind};
use crate::proto::{Encoder, Frame};
use crate::stats::{add, Counters, Metrics, Outcome, PeerBlock, RequestKind, Side, Stats};
use crate::tensor::Tensor;
use crate::wire::{Body, DType, FrameKind, Status, HEADER_LEN};

use super::dispatch::Dispatch;
use super::outbox::Reply;
use super::request::{Pending, RequestOp};
use super::serve::answer_pull;

/// A connection whose peer has no block (yet).
pub(crate) const NO_PEER: u32 = u32::MAX;

/// The loop's peer blocks, by the index connections keep.
#[derive(Default)]
pub(crate) struct PeerTable {
    blocks: Vec<Arc<PeerBlock>>,
    by_addr: HashMap<SocketAddr, u32>,
    by_task: HashMap<(String, u32), u32>,
}

impl PeerTable {
    /// The block of peer `index`.
    #[inline]
    pub(crate) fn get(&self, index: u32) -> Option<&PeerBlock> {
        self.blocks.get(index as usize).map(|b| &**b)
    }

    fn insert(&mut self, counters: &Counters, block: PeerBlock) -> u32 {
        let block = Arc::new(block);
        counters.peers.register(block.clone());
        self.blocks.push(block);
        (self.blocks.len() - 1) as u32
    }

    /// The index of the block of requests sent to `addr`, made when it is first seen.
    pub(crate) fn client(&mut self, counters: &Counters, addr: SocketAddr) -> u32 {
        if let Some(&i) = self.by_addr.get(&addr) {
            return i;
        }
        let i = self.insert(counters, PeerBlock::new(Side::Client, Some(addr)));
        self.by_addr.insert(addr, i);
        i
    }

    /// The index of the block of requests sent to `addr` ([`NO_PEER`] if none).
    pub(crate) fn index_of(&self, addr: SocketAddr) -> u32 {
        self.by_addr.get(&addr).copied().unwrap_or(NO_PEER)
    }

    /// The block of requests sent to `addr`, if this loop has one.
    pub(crate) fn of_addr(&self, addr: Option<SocketAddr>) -> Option<&PeerBlock> {
        self.by_addr.get(&addr?).and_then(|&i| self.get(i))
    }

    /// The index of the block of requests served to task `job:index`.
    pub(crate) fn server(&mut self, counters: &Counters, job: &str, index: u32) -> u32 {
        let key = (job.to_string(), index);
        if let Some(&i) = self.by_task.get(&key) {
            return i;
        }
        let block = PeerBlock::new(Side::Server, None);
        block.task.set(key.clone()).ok();
        let i = self.insert(counters, block);
        self.by_task.insert(key, i);
        i
    }
}

/// How a request that ended with `result` counts.
pub(crate) fn outcome_of(result: &Result<Reply, Error>) -> Outcome {
    match result {
        Ok(_) => Outcome::Ok,
        Err(e) => match e.kind() {
            ErrorKind::Remote(_) => Outcome::Error,
            ErrorKind::Timeout => Outcome::Timeout,
            ErrorKind::Backpressure | ErrorKind::InvalidArgument => Outcome::Refused,
            _ => Outcome::Unavailable,
        },
    }
}

/// The metrics a completion is recorded in: its peer's block, and its latency when the
/// peer answered.
#[derive(Clone, Copy, Default)]
pub(crate) struct Meter<'a> {
    pub block: Option<&'a PeerBlock>,
    pub latency: Option<Duration>,
}

impl Meter<'_> {
    /// Records a request of `kind` that ended with `result`.
    #[inline]
    pub(crate) fn ended(&self, kind: RequestKind, result: &Result<Reply, Error>) {
        if let Some(b) = self.block {
            let outcome = outcome_of(result);
            let answered = matches!(outcome, Outcome::Ok | Outcome::Error);
            b.ended(kind, outcome, self.latency.filter(|_| answered));
        }
    }
}

/// Tensors (or keys, or ids) and rows a request carries.
#[inline]
pub(crate) fn items_of(op: &RequestOp) -> (u64, u64) {
    match op {
        RequestOp::Ping { .. } | RequestOp::Stats => (0, 0),
        RequestOp::Pull { ids, .. } => (ids.len() as u64, 0),
        RequestOp::Push { items } => (items.len() as u64, 0),
        RequestOp::Recv { keys, .. } => (keys.len() as u64, 0),
        RequestOp::PullRows { tables, .. } | RequestOp::PushRows { tables, .. } => (
            tables.len() as u64,
            tables.iter().map(|t| t.len() as u64).sum(),
        ),
    }
}

/// Bytes of tensors of `op` too large for one frame, which travel in `CHUNK` frames
/// queued later (the request's own frame is measured as it is queued).
#[inline]
pub(crate) fn chunked_bytes(op: &RequestOp, chunk_limit: u64) -> u64 {
    let big = |n: u64| if n > chunk_limit { n } else { 0 };
    match op {
        RequestOp::Push { items } => items.iter().map(|(_, t)| big(t.byte_len() as u64)).sum(),
        RequestOp::PushRows { tables, .. } => tables.iter().map(|t| big(t.meta().byte_len)).sum(),
        _ => 0,
    }
}

/// The request kind served metrics count a frame of `kind` under: recvs, fused or not,
/// as one operation (a fused recv's items are answered as single recvs are).
pub(crate) fn served_kind(kind: crate::wire::FrameKind) -> Option<RequestKind> {
    use crate::wire::FrameKind;
    Some(match kind {
        FrameKind::Recv | FrameKind::FusedRecv => RequestKind::Recv,
        FrameKind::Pull => RequestKind::Pull,
        FrameKind::Push => RequestKind::Push,
        FrameKind::PullRows => RequestKind::PullRows,
        FrameKind::PushRows => RequestKind::PushRows,
        FrameKind::Stats => RequestKind::Stats,
        _ => return None,
    })
}

/// Counts a served request of `kind` that ended with `outcome`.
#[inline]
pub(crate) fn served_end(block: Option<&PeerBlock>, kind: RequestKind, outcome: Outcome) {
    if let Some(b) = block {
        b.ended(kind, outcome, None);
    }
}

/// Bytes queued on `enc` so far: measured before and after a frame is encoded.
#[inline]
pub(crate) fn queued(enc: &Encoder) -> u64 {
    enc.ready_bytes()
}

/// The stats document of a runtime whose loops are `loops`, for task `task`.
pub(crate) fn stats_document(loops: &[&Counters], task: &str) -> String {
    let mut totals = Stats::default();
    for l in loops {
        totals.add_loop(l);
    }
    Metrics::of(loops).to_json(task, &totals)
}

impl super::Session {
    /// Connection `slot` completed its handshake: the peer's task names its block (a
    /// served peer's block is found by it).
    pub(super) fn note_opened(&mut self, slot: u32) {
        let conn = &mut self.conns[slot as usize];
        let Some(peer) = conn.proto.peer() else {
            return;
        };
        let (job, index) = (peer.job_str().into_owned(), peer.task_index);
        if conn.outgoing.is_none() {
            conn.metrics = self.peer_table.server(&self.counters, &job, index);
        }
        if let Some(b) = self.peer_table.get(conn.metrics) {
            b.task.set((job, index)).ok();
            add(&b.connections, 1);
        }
    }

    /// Connection `slot` is released: the peer's requests it was still serving (recvs
    /// waiting, pushes arriving) end unanswered.
    pub(super) fn note_unanswered(&self, slot: u32) {
        let conn = &self.conns[slot as usize];
        let Some(b) = self.peer_table.get(conn.metrics) else {
            return;
        };
        for _ in &conn.recvs {
            b.ended(RequestKind::Recv, Outcome::Unavailable, None);
        }
        for p in &conn.incoming {
            let kind = if p.is_rows() {
                RequestKind::PushRows
            } else {
                RequestKind::Push
            };
            b.ended(kind, Outcome::Unavailable, None);
        }
    }
}

impl Dispatch<'_> {
    /// Counts the bytes queued on `enc` since `before` as the answer to a served request
    /// of frame kind `kind`.
    #[inline]
    pub(super) fn count_answer(&self, kind: FrameKind, before: u64, enc: &Encoder) {
        if let (Some(b), Some(kind)) = (self.metrics, served_kind(kind)) {
            add(&b.op(kind).bytes_out, queued(enc).saturating_sub(before));
        }
    }

    /// Counts a decoded frame: the bytes of an answer to one of our requests, or a request
    /// of the peer (its items and bytes).
    pub(super) fn count_frame(&mut self, f: &Frame<'_>) {
        let Some(b) = self.metrics else {
            return;
        };
        let h = &f.header;
        let len = HEADER_LEN as u64 + u64::from(h.meta_len) + u64::from(h.payload_len);
        let ours = |ctxs: &CtxSlab<Pending>| {
            ctxs.get(CtxKey::from_raw(h.handle)).ok().map(|p| {
                if p.fused.is_empty() {
                    p.kind
                } else {
                    RequestKind::Recv
                }
            })
        };
        let kind = match h.kind {
            FrameKind::Pong | FrameKind::Error | FrameKind::Response => ours(self.ctxs),
            FrameKind::Chunk => match self.chunk_owners.front() {
                Some(&(true, _)) => self
                    .incoming
                    .iter()
                    .find(|p| p.handle == h.handle)
                    .map(|p| match p.is_rows() {
                        true => RequestKind::PushRows,
                        false => RequestKind::Push,
                    }),
                _ => ours(self.ctxs),
            },
            k => {
                let Some(kind) = served_kind(k) else {
                    return;
                };
                let (tensors, rows) = match f.body {
                    Body::PullRows(t) | Body::PushRows(t) => {
                        (t.len() as u64, t.map(|t| t.len() as u64).sum())
                    }
                    _ => (u64::from(h.count), 0),
                };
                if kind != RequestKind::Stats {
                    b.started(kind, tensors, rows);
                }
                Some(kind)
            }
        };
        if let Some(kind) = kind {
            add(&b.op(kind).bytes_in, len);
        }
    }

    /// Answers a `STATS` request: one `RESPONSE` entry whose tensor (dtype `U8`, rank 1)
    /// holds the JSON document; `UNIMPLEMENTED` when the endpoint is off.
    pub(super) fn serve_stats(&mut self, handle: u64, enc: &mut Encoder) {
        // Counted once answered, so that the document does not show itself in flight.
        let started = |b: Option<&PeerBlock>| {
            if let Some(b) = b {
                b.started(RequestKind::Stats, 0, 0);
            }
        };
        let Some(task) = self.stats_task else {
            started(self.metrics);
            let _ = enc.error(handle, Status::Unimplemented, "stats endpoint disabled");
            served_end(self.metrics, RequestKind::Stats, Outcome::Error);
            return;
        };
        let doc = self
            .counters
            .peers
            .with_loops(self.counters, |loops| stats_document(loops, task));
        started(self.metrics);
        let bytes = doc.into_bytes();
        let result = Tensor::from_bytes(DType::U8, &[bytes.len() as u64], bytes)
            .map(Arc::new)
            .map_err(|_| Status::Internal);
        let s = &mut *self.serve;
        answer_pull(
            enc,
            self.out_tensors,
            handle,
            &[result],
            &mut s.tokens,
            &mut s.items,
        );
        served_end(self.metrics, RequestKind::Stats, Outcome::Ok);
    }
}
