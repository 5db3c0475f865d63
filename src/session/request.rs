//! The client side of requests: what a handle submits, the context each request keeps while
//! in flight, fusing the recvs of one drain pass, and encoding requests on a connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use crate::ctx::{CtxKey, Full};
use crate::error::{Error, ErrorKind};
use crate::proto::{PushItem, RowsItem, RowsQuery, COPY_TOKEN};
use crate::stats::{add, RequestKind};
use crate::tensor::{SharedAllocator, Tensor};
use crate::wire::DType;
use arrayvec::ArrayVec;

use super::conn::{mark_dirty, Conn, Phase};
use super::outbox::{Member, Submitter};
use super::reply::{ReplyState, Spare};
use super::serve::recast;
use super::timer::Timer;
use super::Session;

/// Highest rank of one row (the block adds the row count in front).
pub const MAX_ROW_RANK: usize = 7;

/// One table of a rows request: the table, its rows' dtype and shape, and the row ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rows<'a> {
    /// The table, as the PS numbers its tables.
    pub table: u32,
    /// Element type of the rows.
    pub dtype: DType,
    /// Shape of one row, e.g. `[dim]` (at most [`MAX_ROW_RANK`] dimensions).
    pub row_dims: &'a [u64],
    /// The row ids (at least one).
    pub ids: &'a [u64],
}

impl<'a> Rows<'a> {
    /// Rows `ids` of `table`, each of `dtype` and shape `row_dims`.
    pub fn new(table: u32, dtype: DType, row_dims: &'a [u64], ids: &'a [u64]) -> Rows<'a> {
        Rows {
            table,
            dtype,
            row_dims,
            ids,
        }
    }

    /// Bytes of one row; `None` for an unknown dtype or a size that overflows.
    pub fn row_bytes(&self) -> Option<u64> {
        self.row_dims
            .iter()
            .try_fold(self.dtype.size()?, |acc, d| acc.checked_mul(*d))
    }
}

/// What a request keeps of one table: its number and the block it expects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RowsSpec {
    pub table: u32,
    pub dtype: DType,
    /// `[ids, row...]`.
    pub dims: ArrayVec<u64, { MAX_ROW_RANK + 1 }>,
}

impl RowsSpec {
    /// The spec of `rows`, checked: a known dtype, a row rank of at most
    /// [`MAX_ROW_RANK`], at least one id, and at least one byte per row.
    pub(crate) fn of(rows: &Rows<'_>) -> Option<RowsSpec> {
        if rows.ids.is_empty() || rows.row_dims.len() > MAX_ROW_RANK {
            return None;
        }
        let row = rows.row_bytes()?;
        row.checked_mul(rows.ids.len() as u64).filter(|&b| b > 0)?;
        let mut dims = ArrayVec::new();
        dims.push(rows.ids.len() as u64);
        dims.try_extend_from_slice(rows.row_dims).ok()?;
        Some(RowsSpec {
            table: rows.table,
            dtype: rows.dtype,
            dims,
        })
    }

    /// Number of rows.
    pub(crate) fn len(&self) -> usize {
        self.dims[0] as usize
    }

    /// The block's meta.
    pub(crate) fn meta(&self) -> crate::wire::TensorMeta<'_> {
        crate::wire::TensorMeta::new(self.dtype, &self.dims).expect("checked in RowsSpec::of")
    }
}

/// Requests given up by deadline whose late answers are recognised and ignored.
pub(crate) const ABANDONED_KEPT: usize = 4096;

/// What a request asks for.
pub(crate) enum RequestOp {
    /// A ping with this many payload bytes.
    Ping { payload: u32 },
    /// Values of variables; received tensors get memory from `alloc` (or the runtime's).
    Pull {
        ids: Vec<u64>,
        alloc: Option<SharedAllocator>,
    },
    /// Tensors for variables.
    Push { items: Vec<(u64, Arc<Tensor>)> },
    /// Rendezvous keys of a step (one key: `RECV`; more: `FUSED_RECV`).
    Recv { step: u64, keys: Vec<Vec<u8>> },
    /// Rows of tables, all tables' ids in one vector in table order; blocks get memory from
    /// `alloc` (or the runtime's).
    PullRows {
        tables: Vec<RowsSpec>,
        ids: Vec<u64>,
        alloc: Option<SharedAllocator>,
    },
    /// Gradient rows of tables: ids as for a pull; the blocks either one after the other
    /// in `grads` (copied), or, when `shared` is not empty, one shared tensor per table
    /// (`(position of the table, block)`, in table order; `grads` empty), sent from its
    /// own memory.
    PushRows {
        tables: Vec<RowsSpec>,
        ids: Vec<u64>,
        grads: Vec<u8>,
        shared: Vec<(u64, Arc<Tensor>)>,
    },
    /// The peer's counters and latencies: a JSON document (`docs/wire-format.md` 4.11).
    Stats,
}

impl RequestOp {
    pub(crate) fn kind(&self) -> RequestKind {
        match self {
            RequestOp::Ping { .. } => RequestKind::Ping,
            RequestOp::Pull { .. } => RequestKind::Pull,
            RequestOp::Push { .. } => RequestKind::Push,
            RequestOp::Recv { keys, .. } if keys.len() == 1 => RequestKind::Recv,
            RequestOp::Recv { .. } => RequestKind::FusedRecv,
            RequestOp::PullRows { .. } => RequestKind::PullRows,
            RequestOp::PushRows { .. } => RequestKind::PushRows,
            RequestOp::Stats => RequestKind::Stats,
        }
    }

    /// The state its answer is assembled in, in `spare`'s vectors.
    fn reply_state(&self, spare: &mut Spare) -> ReplyState {
        match self {
            RequestOp::Ping { .. } => ReplyState::Ping,
            RequestOp::Pull { ids, .. } => ReplyState::pull(ids.len(), false, spare),
            RequestOp::Push { items } => ReplyState::push(items.len(), spare),
            RequestOp::Recv { keys, .. } => ReplyState::pull(keys.len(), true, spare),
            // Memory kept from earlier answers serves only requests that use the runtime's
            // allocator: one that brings its own gets its blocks from it.
            RequestOp::PullRows { tables, alloc, .. } => {
                ReplyState::rows(tables, spare, alloc.is_none())
            }
            RequestOp::PushRows { tables, .. } => ReplyState::push(tables.len(), spare),
            RequestOp::Stats => ReplyState::pull(1, false, spare),
        }
    }
}

/// A request travelling from a handle to the loop that owns the peer's connection.
pub(crate) struct Request {
    pub op: RequestOp,
    pub peer: SocketAddr,
    /// Which of the peer's connections (0..connections_per_peer) carries it.
    pub lane: u32,
    pub deadline: Option<Instant>,
    /// The submitter's name for the request, echoed in its completion.
    pub tag: u64,
    /// Vectors for the answer, returned with the completion.
    pub spare: Spare,
    /// Its submit time and sharded step, for the trace.
    pub trace: super::Stamp,
}

/// An in-flight request.
pub(crate) struct Pending {
    pub tag: u64,
    pub origin: Submitter,
    pub kind: RequestKind,
    /// What to send; taken when the request is encoded.
    pub op: Option<RequestOp>,
    /// The answer so far.
    pub state: ReplyState,
    /// Memory for received tensors, when the request brings its own.
    pub alloc: Option<SharedAllocator>,
    pub conn: u32,
    /// When the request was queued on the connection.
    pub sent: Option<Instant>,
    /// For recvs fused by the session: the original requests, one per key, in key order.
    pub fused: Vec<Member>,
    /// The deadline sent with the request (`timeout_ms`): its own, or for a fused group
    /// the latest of its members' (none when one of them has none).
    pub wire_deadline: Option<Instant>,
    /// Its deadline passed and a `CANCEL` was sent: the responder's verdict is awaited.
    pub cancel_sent: bool,
    /// The submitter's vectors, returned with the completion.
    pub spare: Spare,
    /// Its times for the trace.
    pub trace: super::trace::Marks,
}

/// Vectors for encoding a push, reused from push to push.
#[derive(Default)]
pub(crate) struct PushEncodeScratch {
    tokens: Vec<u64>,
    items: Vec<PushItem<'static>>,
    queries: Vec<RowsQuery<'static>>,
    rows: Vec<RowsItem<'static>>,
}

impl Session {
    /// Submits a request from this drain pass, or, with tensor fusion on, holds a
    /// single-key recv back to be fused with the others of the pass.
    pub(super) fn take_request(&mut self, req: Request, origin: Submitter, now: Instant) {
        let single_recv = matches!(&req.op, RequestOp::Recv { keys, .. } if keys.len() == 1);
        if self.cfg.tensor_fuse && single_recv && !self.stopping {
            self.fuse_buf.push((req, origin));
        } else {
            self.submit(req, origin, now);
        }
    }

    /// Sends the recvs held back in this drain pass: one `FUSED_RECV` per peer, lane and
    /// step. Nothing waits for a timer: what arrived in the same pass goes out together.
    pub(super) fn submit_fused(&mut self, now: Instant) {
        if self.fuse_buf.is_empty() {
            return;
        }
        let mut buf = std::mem::take(&mut self.fuse_buf);
        let step_of = |r: &Request| match &r.op {
            RequestOp::Recv { step, .. } => *step,
            _ => 0,
        };
        buf.sort_by_key(|(r, _)| (r.peer, r.lane, step_of(r)));
        let mut rest = buf.drain(..).peekable();
        while let Some((first, origin)) = rest.next() {
            let key = (first.peer, first.lane, step_of(&first));
            let mut group = Vec::new();
            while let Some((r, _)) = rest.peek() {
                if (r.peer, r.lane, step_of(r)) != key {
                    break;
                }
                group.push(rest.next().expect("peeked"));
            }
            if group.is_empty() {
                self.submit(first, origin, now);
                continue;
            }
            let member = |origin, r: &Request| Member {
                origin,
                tag: r.tag,
                deadline: r.deadline,
                done: false,
                cancel_sent: false,
            };
            let mut members = vec![member(origin, &first)];
            let RequestOp::Recv { step, mut keys } = first.op else {
                continue;
            };
            for (r, o) in group {
                members.push(member(o, &r));
                if let RequestOp::Recv { keys: k, .. } = r.op {
                    keys.extend(k);
                }
            }
            // No deadline for the group: each member keeps its own.
            let fused = Request {
                op: RequestOp::Recv { step, keys },
                peer: key.0,
                lane: key.1,
                deadline: None,
                tag: 0,
                spare: Spare::default(),
                trace: first.trace,
            };
            self.submit_group(fused, Submitter::Local, members, now);
        }
        drop(rest);
        self.fuse_buf = buf;
    }

    /// Starts a request (from a ring, or from the embedding thread).
    pub(super) fn submit(&mut self, req: Request, origin: Submitter, now: Instant) {
        self.submit_group(req, origin, Vec::new(), now);
    }

    /// Starts a request; `fused` lists the original recvs when the session fused several.
    fn submit_group(&mut self, req: Request, origin: Submitter, fused: Vec<Member>, now: Instant) {
        let kind = req.op.kind();
        let mut spare = req.spare;
        if self.stopping {
            let e = Err(Error::new(ErrorKind::Shutdown));
            let peer = Some(req.peer);
            return self.notify(peer, origin, req.tag, kind, &fused, e, spare, None);
        }
        if let Some(e) = self.retired_error(req.peer) {
            let peer = Some(req.peer);
            return self.notify(peer, origin, req.tag, kind, &fused, Err(e), spare, None);
        }
        let slot = self.peer_conn(req.peer, req.lane, now);
        if let Some(b) = self.peer_table.get(self.conns[slot as usize].metrics) {
            if fused.is_empty() {
                let (tensors, rows) = super::metrics::items_of(&req.op);
                b.started(kind, tensors, rows);
            } else {
                // Recvs the session fused count one by one, as they complete.
                for _ in &fused {
                    b.started(RequestKind::Recv, 1, 0);
                }
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
        let pending = Pending {
            tag: req.tag,
            origin,
            kind,
            state: req.op.reply_state(&mut spare),
            op: Some(req.op),
            alloc,
            conn: slot,
            sent: None,
            fused,
            wire_deadline,
            cancel_sent: false,
            spare,
            trace: super::trace::Marks::taken(req.trace, now),
        };
        let handle = match self.ctxs.insert(pending) {
            Ok(h) => h.to_raw(),
            Err(Full(p)) => {
                let e = Err(Error::new(ErrorKind::Backpressure));
                let t = Some((p.trace, None));
                return self.notify(Some(req.peer), origin, p.tag, kind, &p.fused, e, p.spare, t);
            }
        };
        if let Some(deadline) = req.deadline {
            self.push_deadline(deadline, handle);
        }
        if let Ok(p) = self.ctxs.get(CtxKey::from_raw(handle)) {
            for (i, m) in p.fused.iter().enumerate() {
                if let Some(at) = m.deadline {
                    let index = i as u32;
                    self.timers.push(at, Timer::Member { handle, index });
                }
            }
        }
        let open = self.conns[slot as usize].phase == Phase::Open;
        if open {
            self.send_request(slot, handle, now);
        } else {
            self.conns[slot as usize].waiting.push_back(handle);
        }
    }

    /// Adds a request deadline. Entries of requests answered earlier stay in the heap until
    /// they come up; when they outnumber the live requests, they are swept out, so the heap
    /// stays within a small multiple of the in-flight requests (amortized O(1) per request).
    fn push_deadline(&mut self, deadline: Instant, handle: u64) {
        self.sweep_timers();
        self.timers.push(deadline, Timer::Deadline(handle));
    }

    /// Encodes request `handle` on connection `slot`.
    pub(super) fn send_request(&mut self, slot: u32, handle: u64, now: Instant) {
        let Ok(p) = self.ctxs.get_mut(CtxKey::from_raw(handle)) else {
            return;
        };
        p.sent = Some(now);
        let Some(op) = p.op.take() else {
            return;
        };
        let conn = &mut self.conns[slot as usize];
        let over = conn
            .proto
            .peer()
            .and_then(|peer| over_limits(&op, &peer.limits));
        if let Some(why) = over {
            log::debug!("request over the peer's limits: {why}");
            if let Ok(p) = self.ctxs.remove(CtxKey::from_raw(handle)) {
                let e = Error::new(ErrorKind::InvalidArgument).with_message(why);
                let peer = self.peer_of(p.conn);
                let t = Some((p.trace, p.sent));
                self.notify(peer, p.origin, p.tag, p.kind, &p.fused, Err(e), p.spare, t);
            }
            return;
        }
        // The time the answer is still waited for, rounded up to whole milliseconds.
        let timeout_ms = p.wire_deadline.map_or(0, |d| {
            let left = d.saturating_duration_since(now);
            let ms = left.as_nanos().div_ceil(1_000_000);
            u32::try_from(ms).unwrap_or(u32::MAX).max(1)
        });
        conn.proto.encoder().set_request_timeout(timeout_ms);
        let queued_before = super::metrics::queued(conn.proto.encoder());
        let result = match &op {
            RequestOp::Ping { payload } => {
                let n = *payload as usize;
                if self.zeros.len() < n {
                    self.zeros.resize(n, 0);
                }
                conn.proto.encoder().ping(handle, &self.zeros[..n])
            }
            RequestOp::Pull { ids, .. } => conn.proto.encoder().pull(handle, ids),
            RequestOp::Push { items } => encode_push(conn, handle, items, &mut self.push_scratch),
            RequestOp::Recv { step, keys } => {
                let fused = keys.len() != 1;
                conn.proto.encoder().recv(handle, *step, keys, fused)
            }
            RequestOp::PullRows { tables, ids, .. } => {
                encode_pull_rows(conn, handle, tables, ids, &mut self.push_scratch)
            }
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
                encode_push_rows(conn, handle, tables, ids, blocks, &mut self.push_scratch)
            }
            RequestOp::Stats => conn.proto.encoder().stats(handle),
        };
        if let (Ok(()), Some(b)) = (&result, self.peer_table.get(conn.metrics)) {
            let enc = conn.proto.encoder();
            let n = super::metrics::queued(enc) - queued_before
                + super::metrics::chunked_bytes(&op, enc.chunk_limit());
            let kind = if p.fused.is_empty() {
                p.kind
            } else {
                RequestKind::Recv
            };
            add(&b.op(kind).bytes_out, n);
            p.trace.bytes = n;
        }
        // The request's vectors go back to its submitter with the completion.
        match op {
            RequestOp::Pull { mut ids, .. } => {
                ids.clear();
                p.spare.ids = ids;
            }
            RequestOp::Push { mut items } => {
                items.clear();
                p.spare.items = items;
            }
            RequestOp::PullRows {
                mut tables,
                mut ids,
                ..
            } => {
                tables.clear();
                ids.clear();
                (p.spare.tables, p.spare.ids) = (tables, ids);
            }
            RequestOp::PushRows {
                mut tables,
                mut ids,
                mut grads,
                mut shared,
            } => {
                tables.clear();
                ids.clear();
                grads.clear();
                // The connection holds the blocks it still sends.
                shared.clear();
                (p.spare.tables, p.spare.ids, p.spare.grads) = (tables, ids, grads);
                p.spare.items = shared;
            }
            _ => {}
        }
        match result {
            Ok(()) => {
                add(&self.counters.frames_out, 1);
                mark_dirty(&mut self.dirty, conn, slot);
            }
            Err(e) => {
                log::debug!("request not encodable: {e}");
                if let Ok(p) = self.ctxs.remove(CtxKey::from_raw(handle)) {
                    let e = Err(Error::new(ErrorKind::InvalidArgument));
                    let peer = self.peer_of(p.conn);
                    let t = Some((p.trace, p.sent));
                    self.notify(peer, p.origin, p.tag, p.kind, &p.fused, e, p.spare, t);
                }
            }
        }
    }

    /// Remembers a request given up while its answer may still come, so that the answer is
    /// ignored rather than taken for a forged handle. Bounded: the oldest is forgotten
    /// first (a very late answer to it then closes the connection as a protocol violation).
    pub(super) fn abandon(&mut self, handle: u64, p: &Pending) {
        if p.sent.is_none() {
            return;
        }
        remember_abandoned(&mut self.abandoned, handle, p.conn);
    }
}

/// Notes that late answers to `handle` on connection `conn` are to be ignored.
pub(super) fn remember_abandoned(
    abandoned: &mut std::collections::VecDeque<(u64, u32)>,
    handle: u64,
    conn: u32,
) {
    if abandoned.len() == ABANDONED_KEPT {
        abandoned.pop_front();
    }
    abandoned.push_back((handle, conn));
}

/// Queues a push whose tensors are referenced (not copied) while they are written.
fn encode_push(
    conn: &mut Conn,
    handle: u64,
    items: &[(u64, Arc<Tensor>)],
    scratch: &mut PushEncodeScratch,
) -> Result<(), crate::proto::EncodeError> {
    let tokens = &mut scratch.tokens;
    tokens.clear();
    tokens.extend(
        items
            .iter()
            .map(|(_, t)| conn.out_tensors.insert(t.clone()) as u64),
    );
    let mut push: Vec<PushItem<'_>> = recast(std::mem::take(&mut scratch.items));
    push.extend(
        items
            .iter()
            .zip(tokens.iter())
            .map(|((id, t), &token)| PushItem {
                var_id: *id,
                tensor: super::out_tensor(t, token),
            }),
    );
    let r = conn.proto.encoder().push(handle, &push);
    scratch.items = recast(push);
    if r.is_err() {
        for &t in tokens.iter() {
            conn.out_tensors.try_remove(t as usize);
        }
    }
    r
}

/// Queues a `PULL_ROWS`.
fn encode_pull_rows(
    conn: &mut Conn,
    handle: u64,
    tables: &[RowsSpec],
    ids: &[u64],
    scratch: &mut PushEncodeScratch,
) -> Result<(), crate::proto::EncodeError> {
    let mut queries: Vec<RowsQuery<'_>> = recast(std::mem::take(&mut scratch.queries));
    let mut at = 0;
    for t in tables {
        queries.push(RowsQuery {
            table: t.table,
            block: t.meta(),
            ids: &ids[at..at + t.len()],
        });
        at += t.len();
    }
    let r = conn.proto.encoder().pull_rows(handle, &queries);
    scratch.queries = recast(queries);
    r
}

/// A rows push's gradient blocks.
enum Grads<'a> {
    /// One after the other, in table order: copied.
    Packed(&'a [u8]),
    /// One shared tensor per table, in table order: sent from their own memory.
    Shared(&'a [(u64, Arc<Tensor>)]),
}

/// Queues a `PUSH_ROWS`. Packed blocks that fit one frame are copied into it; larger ones
/// are moved into tensors of their own and sent in chunks. Shared blocks are never copied
/// but by the encoder (up to its `inline_threshold`, 256 bytes by default, where a copy
/// into the frame is cheaper than one more `iovec`): the connection holds them until
/// written, and the frame references them, or they travel in chunks.
fn encode_push_rows(
    conn: &mut Conn,
    handle: u64,
    tables: &[RowsSpec],
    ids: &[u64],
    grads: Grads<'_>,
    scratch: &mut PushEncodeScratch,
) -> Result<(), crate::proto::EncodeError> {
    let tokens = &mut scratch.tokens;
    tokens.clear();
    match grads {
        Grads::Packed(grads) => {
            // The meta section (ids and block metas) must fit beside the blocks.
            let meta = 8 * ids.len() as u64 + 96 * tables.len() as u64;
            let in_frame = grads.len() as u64 + meta <= conn.proto.encoder().chunk_limit();
            let mut at = 0;
            for t in tables {
                let len = t.meta().byte_len as usize;
                let token = if in_frame {
                    COPY_TOKEN
                } else {
                    let bytes = grads.get(at..at + len).unwrap_or_default();
                    match Tensor::from_slice(t.dtype, &t.dims, bytes) {
                        Ok(block) => conn.out_tensors.insert(Arc::new(block)) as u64,
                        Err(_) => COPY_TOKEN,
                    }
                };
                tokens.push(token);
                at += len;
            }
        }
        Grads::Shared(blocks) => tokens.extend(
            blocks
                .iter()
                .map(|(_, b)| conn.out_tensors.insert(b.clone()) as u64),
        ),
    }
    let mut rows: Vec<RowsItem<'_>> = recast(std::mem::take(&mut scratch.rows));
    let (mut id_at, mut byte_at) = (0, 0);
    for (t, &token) in tables.iter().zip(tokens.iter()) {
        let len = t.meta().byte_len as usize;
        let bytes = match (token, &grads) {
            (COPY_TOKEN, Grads::Packed(g)) => g.get(byte_at..byte_at + len).unwrap_or_default(),
            (COPY_TOKEN, Grads::Shared(_)) => &[][..],
            (token, _) => conn
                .out_tensors
                .get(token as usize)
                .map_or(&[][..], |b| b.bytes()),
        };
        rows.push(RowsItem {
            table: t.table,
            ids: &ids[id_at..id_at + t.len()],
            block: crate::proto::OutTensor {
                meta: t.meta(),
                bytes,
                token,
            },
        });
        (id_at, byte_at) = (id_at + t.len(), byte_at + len);
    }
    let r = if tokens.len() == tables.len() {
        conn.proto.encoder().push_rows(handle, &rows)
    } else {
        Err(crate::proto::EncodeError::BadCount)
    };
    scratch.rows = recast(rows);
    if r.is_err() {
        for &t in tokens.iter().filter(|&&t| t != COPY_TOKEN) {
            conn.out_tensors.try_remove(t as usize);
        }
    }
    r
}

/// Why `op` would exceed a limit the peer announced (and so close the connection, failing
/// every other request on it), or `None` when it fits.
fn over_limits(op: &RequestOp, l: &crate::wire::Limits) -> Option<String> {
    let over = |what: &str, n: u64, max: u64| {
        (n > max).then(|| format!("{what} {n} over the peer's limit {max}"))
    };
    let tensor = |t: &Tensor| {
        over("tensor rank", t.dims().len() as u64, l.max_rank as u64)
            .or_else(|| over("tensor bytes", t.byte_len() as u64, l.max_tensor_bytes))
    };
    match op {
        RequestOp::Ping { .. } | RequestOp::Stats => None,
        RequestOp::Pull { ids, .. } => over("ids", ids.len() as u64, l.max_tensors as u64),
        RequestOp::Push { items } => over("tensors", items.len() as u64, l.max_tensors as u64)
            .or_else(|| items.iter().find_map(|(_, t)| tensor(t))),
        RequestOp::Recv { keys, .. } => over("keys", keys.len() as u64, l.max_tensors as u64)
            .or_else(|| {
                let longest = keys.iter().map(Vec::len).max().unwrap_or(0);
                over("key bytes", longest as u64, l.max_key as u64)
            }),
        RequestOp::PullRows { tables, .. } | RequestOp::PushRows { tables, .. } => {
            let rows: u64 = tables.iter().map(|t| t.len() as u64).sum();
            over("tables", tables.len() as u64, l.max_tables as u64)
                .or_else(|| over("rows", rows, l.max_rows as u64))
                .or_else(|| {
                    tables.iter().find_map(|t| {
                        let meta = t.meta();
                        over("block rank", t.dims.len() as u64, l.max_rank as u64)
                            .or_else(|| {
                                over(
                                    "row bytes",
                                    meta.byte_len / t.len() as u64,
                                    l.max_row_bytes as u64,
                                )
                            })
                            .or_else(|| over("block bytes", meta.byte_len, l.max_tensor_bytes))
                    })
                })
        }
    }
}
