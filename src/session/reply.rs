//! Tensor requests in flight: the answers a pull or push is assembling on the client, and
//! the pushes a server is receiving. Pure bookkeeping: the loop feeds it frames and
//! payload, it says where payload goes and when a request is complete.
//!
//! Every vector here is handed in by the caller and handed back when the request is done
//! (the client's through its completion, the server's to the loop's scratch), so that a
//! steady stream of requests allocates nothing.

use super::budget::{ConnBudget, Refused, Reservation};
use super::request::RowsSpec;
use crate::tensor::{OwnedMeta, Tensor, TensorAllocator, TensorMemory};
use crate::wire::{PushEntries, ResponseEntries, RowsTables, Status};

/// The answer to a rows pull: per table, in request order, its block of rows or why there
/// is none, and the rows the PS did not have.
#[derive(Debug, PartialEq, Default)]
pub struct PulledRows {
    pub(crate) blocks: Vec<Result<Tensor, Status>>,
    /// Positions of missing rows, all tables'.
    pub(crate) missing: Vec<u32>,
    /// Per table: where its missing rows are in `missing`.
    pub(crate) spans: Vec<(u32, u32)>,
}

impl PulledRows {
    /// Number of tables.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether there are no tables.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Table `t`'s block (`[ids, row...]`, rows in request order), or why there is none.
    pub fn block(&self, t: usize) -> Result<&Tensor, Status> {
        match self.blocks.get(t) {
            Some(Ok(b)) => Ok(b),
            Some(Err(s)) => Err(*s),
            None => Err(Status::InvalidArgument),
        }
    }

    /// Takes table `t`'s block out (the answer keeps `Err(NOT_FOUND)` in its place).
    pub fn take_block(&mut self, t: usize) -> Result<Tensor, Status> {
        match self.blocks.get_mut(t) {
            Some(b) => std::mem::replace(b, Err(Status::NotFound)),
            None => Err(Status::InvalidArgument),
        }
    }

    /// Row `i` of table `t`'s block; `None` when the table failed or `i` is out of range.
    pub fn row(&self, t: usize, i: usize) -> Option<&[u8]> {
        let b = self.block(t).ok()?;
        let n = *b.dims().first()? as usize;
        let row = b.byte_len() / n;
        b.bytes().get(i * row..(i + 1) * row)
    }

    /// Positions (in the request's ids of table `t`) of the rows the PS did not have,
    /// increasing; their bytes in the block are zero.
    pub fn missing(&self, t: usize) -> &[u32] {
        match self.spans.get(t) {
            Some(&(start, len)) => &self.missing[start as usize..(start + len) as usize],
            None => &[],
        }
    }
}

/// A chunked tensor still arriving.
pub(crate) struct Chunked {
    index: u32,
    byte_len: u64,
    /// Its meta until its first chunk arrives: memory is taken only then, so a peer cannot
    /// make us commit memory for contents it has not started to send.
    deferred: Option<Box<OwnedMeta>>,
    /// Its bytes, reserved against the receive budget from its first chunk until it is
    /// whole or dropped.
    reserved: Option<Reservation>,
}

/// The first value of item `index`, announced with `meta`: its tensor, received now; or,
/// for a chunked tensor, a placeholder, with the meta kept in `chunks` until the first
/// chunk arrives.
fn announced(
    index: u32,
    meta: &crate::wire::TensorMeta<'_>,
    alloc: &dyn TensorAllocator,
    chunks: &mut Vec<Chunked>,
    reuse: &mut Vec<Box<dyn TensorMemory>>,
) -> Result<Tensor, Status> {
    if meta.chunked {
        if let Some(m) = OwnedMeta::of(meta) {
            chunks.push(Chunked {
                index,
                byte_len: meta.byte_len,
                deferred: Some(Box::new(m)),
                reserved: None,
            });
            return Err(Status::Protocol);
        }
    }
    Tensor::receive_reusing(meta, alloc, reuse).ok_or(Status::ResourceExhausted)
}

/// The tensor receiving item `index`'s contents, allocated now if it was deferred: its
/// bytes are reserved against `budget` first, and it fails with `RESOURCE_EXHAUSTED`
/// (its chunks read and dropped) when they do not fit.
fn tensor_in<'r>(
    results: &'r mut [Result<Tensor, Status>],
    chunks: &mut [Chunked],
    index: u32,
    alloc: &dyn TensorAllocator,
    budget: &ConnBudget,
    reuse: &mut Vec<Box<dyn TensorMemory>>,
) -> Option<&'r mut Tensor> {
    let slot = results.get_mut(index as usize)?;
    if let Some(c) = chunks.iter_mut().find(|c| c.index == index) {
        if let Some(meta) = c.deferred.take() {
            match budget.reserve(meta.byte_len) {
                Ok(r) => {
                    c.reserved = Some(r);
                    *slot = Tensor::receive_owned_reusing(&meta, alloc, reuse)
                        .ok_or(Status::ResourceExhausted);
                }
                Err(why) => {
                    let which = match why {
                        Refused::Connection => "the connection's (STARWIRE_CONN_RECV_BUDGET)",
                        Refused::Task => "the task's (STARWIRE_RECV_BUDGET)",
                    };
                    log::warn!(
                        "a chunked tensor of {} bytes does not fit {which} receive budget; \
                         it fails with RESOURCE_EXHAUSTED",
                        meta.byte_len
                    );
                    *slot = Err(Status::ResourceExhausted);
                }
            }
        }
    }
    slot.as_mut().ok()
}

/// Notes that chunk bytes of item `index` up to `end_offset` arrived.
fn chunk_done(chunks: &mut Vec<Chunked>, index: u32, end_offset: u64) {
    chunks.retain(|c| !(c.index == index && end_offset == c.byte_len));
}

/// Item states of an answer being assembled.
const OPEN: u8 = 0;
const ANSWERED: u8 = 1;
const TAKEN: u8 = 2;

/// What the client knows of a request's answer so far.
pub(crate) enum ReplyState {
    /// A ping: answered by one `PONG`.
    Ping,
    /// A pull (one tensor per id), a recv (one tensor per key) or a rows pull (one block
    /// per table). Items not answered hold `Err(PROTOCOL)`, which is what they finish as.
    Pull {
        /// A recv: dead tensors are allowed and the reply is `Received`.
        recv: bool,
        /// A rows pull: the block each table expects (empty otherwise).
        rows: Vec<RowsSpec>,
        /// A rows pull: the rows not found, all tables', and per table where its are.
        missing: Vec<u32>,
        spans: Vec<(u32, u32)>,
        results: Vec<Result<Tensor, Status>>,
        /// Per item: `OPEN`, `ANSWERED` or `TAKEN` (handed to a fused member).
        state: Vec<u8>,
        chunks: Vec<Chunked>,
        end: bool,
        /// Memory kept from earlier answers, for this one's blocks (rows pulls only).
        reuse: Vec<Box<dyn TensorMemory>>,
    },
    /// A push: one status per item.
    Push {
        statuses: Vec<Status>,
        state: Vec<u8>,
        end: bool,
    },
}

/// Why an answer is a protocol violation.
pub(crate) type Violation = &'static str;

/// Vectors that travel with a request and come back with its completion, so that a
/// submitter that recycles its completions allocates nothing per request.
#[derive(Default)]
pub(crate) struct Spare {
    /// A pull's ids, back once encoded.
    pub ids: Vec<u64>,
    /// A push's items, back (emptied) once encoded.
    pub items: Vec<(u64, std::sync::Arc<Tensor>)>,
    /// For a pull's or recv's answer.
    pub results: Vec<Result<Tensor, Status>>,
    /// For a push's answer.
    pub statuses: Vec<Status>,
    /// Item states while an answer is assembled.
    pub state: Vec<u8>,
    /// A rows request's tables, back once encoded (and its answer's expected blocks).
    pub tables: Vec<RowsSpec>,
    /// A rows push's gradient bytes, back once encoded.
    pub grads: Vec<u8>,
    /// A rows pull's report of missing rows.
    pub missing: Vec<u32>,
    pub spans: Vec<(u32, u32)>,
    /// A rows pull's expected blocks, while its answer is assembled.
    pub expected: Vec<RowsSpec>,
    /// The memory of blocks of recycled rows answers, for the next ones (at most
    /// [`MEMORY_KEPT`]).
    pub memory: Vec<Box<dyn TensorMemory>>,
    /// The request these vectors served used the runtime's allocator: its blocks' memory
    /// may serve the next requests.
    pub runtime_memory: bool,
}

/// Blocks' memories a [`Spare`] or a push's vectors keep for reuse.
pub(crate) const MEMORY_KEPT: usize = 2;

/// Largest block whose memory is kept: larger ones are rare and cost their allocation
/// little next to their transfer.
pub(crate) const MEMORY_KEPT_BYTES: usize = 1 << 20;

/// Keeps the memory of the blocks in `blocks` (emptied) in `memory`, up to
/// [`MEMORY_KEPT`] blocks of at most [`MEMORY_KEPT_BYTES`].
pub(crate) fn keep_memory(
    blocks: &mut Vec<Result<Tensor, Status>>,
    memory: &mut Vec<Box<dyn TensorMemory>>,
) {
    for b in blocks.drain(..) {
        if memory.len() == MEMORY_KEPT {
            continue;
        }
        let m = b.ok().and_then(Tensor::into_memory);
        if let Some(m) = m.filter(|m| m.bytes().len() <= MEMORY_KEPT_BYTES) {
            if memory.capacity() == 0 {
                memory.reserve_exact(MEMORY_KEPT);
            }
            memory.push(m);
        }
    }
}

impl Spare {
    /// The ids vector, holding a copy of `ids`.
    pub(crate) fn take_ids(&mut self, ids: &[u64]) -> Vec<u64> {
        let mut v = std::mem::take(&mut self.ids);
        v.clear();
        v.extend_from_slice(ids);
        v
    }

    /// The items vector, holding a copy of `items` (new references to the same tensors).
    pub(crate) fn take_items(
        &mut self,
        items: &[(u64, std::sync::Arc<Tensor>)],
    ) -> Vec<(u64, std::sync::Arc<Tensor>)> {
        let mut v = std::mem::take(&mut self.items);
        v.clear();
        v.extend_from_slice(items);
        v
    }

    /// Takes back what a finished reply carries.
    pub(crate) fn reclaim(&mut self, reply: crate::session::Reply) {
        match reply {
            crate::session::Reply::Pulled(mut v) | crate::session::Reply::Received(mut v) => {
                v.clear();
                self.results = v;
            }
            crate::session::Reply::Pushed(mut v) => {
                v.clear();
                self.statuses = v;
            }
            crate::session::Reply::Rows(rows) => {
                let PulledRows {
                    mut blocks,
                    mut missing,
                    mut spans,
                } = rows;
                if self.runtime_memory {
                    keep_memory(&mut blocks, &mut self.memory);
                }
                blocks.clear();
                missing.clear();
                spans.clear();
                (self.results, self.missing, self.spans) = (blocks, missing, spans);
            }
            crate::session::Reply::Pong { .. } => {}
        }
    }
}

impl std::fmt::Debug for Spare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Spare")
    }
}

/// Spare vectors carry no meaning: two completions are equal whatever they hold.
impl PartialEq for Spare {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// `v`, emptied, with room for `n` items set to `fill`.
fn filled<T: Clone>(mut v: Vec<T>, n: usize, fill: T) -> Vec<T> {
    v.clear();
    v.resize(n, fill);
    v
}

impl ReplyState {
    /// The state of a pull (or recv, with `recv`) of `n` items, in `spare`'s vectors.
    pub(crate) fn pull(n: usize, recv: bool, spare: &mut Spare) -> ReplyState {
        let mut results = std::mem::take(&mut spare.results);
        results.clear();
        results.resize_with(n, || Err(Status::Protocol));
        ReplyState::Pull {
            recv,
            rows: Vec::new(),
            missing: Vec::new(),
            spans: Vec::new(),
            results,
            state: filled(std::mem::take(&mut spare.state), n, OPEN),
            chunks: Vec::new(),
            end: false,
            reuse: Vec::new(),
        }
    }

    /// The state of a pull of the rows of `tables`, in `spare`'s vectors; with `reuse`,
    /// its blocks land in the memory `spare` kept from earlier answers when it fits.
    pub(crate) fn rows(tables: &[RowsSpec], spare: &mut Spare, reuse: bool) -> ReplyState {
        let mut state = ReplyState::pull(tables.len(), false, spare);
        if let ReplyState::Pull {
            rows,
            missing,
            spans,
            reuse: kept,
            ..
        } = &mut state
        {
            spare.runtime_memory = reuse;
            if reuse {
                *kept = std::mem::take(&mut spare.memory);
            }
            *rows = std::mem::take(&mut spare.expected);
            rows.clear();
            rows.extend_from_slice(tables);
            *missing = std::mem::take(&mut spare.missing);
            missing.clear();
            *spans = filled(std::mem::take(&mut spare.spans), tables.len(), (0, 0));
        }
        state
    }

    /// The state of a push of `n` items, in `spare`'s vectors.
    pub(crate) fn push(n: usize, spare: &mut Spare) -> ReplyState {
        ReplyState::Push {
            statuses: filled(std::mem::take(&mut spare.statuses), n, Status::Protocol),
            state: filled(std::mem::take(&mut spare.state), n, OPEN),
            end: false,
        }
    }

    /// Takes the entries of a `RESPONSE`. Tensors get memory from `alloc`.
    pub(crate) fn accept(
        &mut self,
        entries: ResponseEntries<'_>,
        end: bool,
        alloc: &dyn TensorAllocator,
    ) -> Result<(), Violation> {
        match self {
            ReplyState::Ping => return Err("response to a ping"),
            ReplyState::Pull {
                results,
                state,
                chunks,
                end: e,
                rows,
                missing,
                spans,
                reuse,
                ..
            } => {
                for entry in entries {
                    let i = entry.index;
                    let st = state
                        .get_mut(i as usize)
                        .ok_or("response item out of range")?;
                    if *st != OPEN {
                        return Err("response item answered twice");
                    }
                    *st = ANSWERED;
                    if let Some(spec) = rows.get(i as usize) {
                        if let Some(meta) = &entry.tensor {
                            let expected = spec.meta();
                            if meta.dtype != expected.dtype || meta.dims != expected.dims {
                                return Err("rows block of another shape than asked for");
                            }
                        }
                        spans[i as usize] = (missing.len() as u32, entry.missing.len() as u32);
                        missing.extend(entry.missing.iter());
                    } else if !entry.missing.is_empty() {
                        return Err("missing rows reported for a request without rows");
                    }
                    match entry.tensor {
                        None if entry.status.is_ok() => return Err("pull answer without a tensor"),
                        None => results[i as usize] = Err(entry.status),
                        Some(meta) => {
                            results[i as usize] = announced(i, &meta, alloc, chunks, reuse)
                        }
                    }
                }
                *e |= end;
            }
            ReplyState::Push {
                statuses,
                state,
                end: e,
            } => {
                for entry in entries {
                    if entry.tensor.is_some() || !entry.missing.is_empty() {
                        return Err("push answer with a tensor");
                    }
                    let i = entry.index as usize;
                    let st = state.get_mut(i).ok_or("response item out of range")?;
                    if *st != OPEN {
                        return Err("response item answered twice");
                    }
                    *st = ANSWERED;
                    statuses[i] = entry.status;
                }
                *e |= end;
            }
        }
        Ok(())
    }

    /// Fails every item not answered yet with `status` (an `ERROR` for the request). Returns
    /// whether any item had been answered: then the request completes with the items it got.
    pub(crate) fn fail_open(&mut self, status: Status) -> bool {
        match self {
            ReplyState::Ping => false,
            ReplyState::Pull {
                results,
                state,
                chunks,
                end,
                ..
            } => {
                let mut any = false;
                for (r, st) in results.iter_mut().zip(state.iter_mut()) {
                    if *st == OPEN {
                        *st = ANSWERED;
                        *r = Err(status);
                    } else {
                        any = true;
                    }
                }
                // A chunked tensor cut short fails too.
                for c in chunks.iter() {
                    if let Some(r) = results.get_mut(c.index as usize) {
                        *r = Err(status);
                    }
                }
                chunks.clear();
                *end = true;
                any
            }
            ReplyState::Push {
                statuses,
                state,
                end,
            } => {
                let mut any = false;
                for (s, st) in statuses.iter_mut().zip(state.iter_mut()) {
                    if *st == OPEN {
                        *st = ANSWERED;
                        *s = status;
                    } else {
                        any = true;
                    }
                }
                *end = true;
                any
            }
        }
    }

    /// Memory for item `index`'s contents, if it has any (allocated from `alloc` now for
    /// a chunked tensor whose first chunk is arriving).
    pub(crate) fn tensor_mut(
        &mut self,
        index: u32,
        alloc: &dyn TensorAllocator,
        budget: &ConnBudget,
    ) -> Option<&mut Tensor> {
        match self {
            ReplyState::Pull {
                results,
                chunks,
                reuse,
                ..
            } => tensor_in(results, chunks, index, alloc, budget, reuse),
            _ => None,
        }
    }

    /// Takes item `index` out if it is completely received (for fused recvs, whose members
    /// complete one by one).
    pub(crate) fn take_ready(&mut self, index: u32) -> Option<Result<Tensor, Status>> {
        let ReplyState::Pull {
            results,
            state,
            chunks,
            ..
        } = self
        else {
            return None;
        };
        if chunks.iter().any(|c| c.index == index) {
            return None;
        }
        let st = state.get_mut(index as usize)?;
        if *st != ANSWERED {
            return None;
        }
        *st = TAKEN;
        Some(std::mem::replace(
            &mut results[index as usize],
            Err(Status::Protocol),
        ))
    }

    /// Notes that chunk bytes of item `index` up to `end_offset` arrived.
    pub(crate) fn chunk_progress(&mut self, index: u32, end_offset: u64) {
        if let ReplyState::Pull { chunks, .. } = self {
            chunk_done(chunks, index, end_offset);
        }
    }

    /// Whether everything the answer announced has arrived.
    pub(crate) fn is_complete(&self) -> bool {
        match self {
            ReplyState::Ping => false,
            ReplyState::Pull { chunks, end, .. } => *end && chunks.is_empty(),
            ReplyState::Push { end, .. } => *end,
        }
    }

    /// The finished answer (items the responder never answered fail with `PROTOCOL`); the
    /// vectors it does not hand out go back to `spare`.
    pub(crate) fn finish(self, spare: &mut Spare) -> crate::session::Reply {
        match self {
            ReplyState::Pull {
                results,
                recv,
                state,
                rows,
                missing,
                spans,
                reuse,
                ..
            } => {
                spare.state = state;
                if spare.memory.is_empty() {
                    spare.memory = reuse;
                }
                if !rows.is_empty() {
                    spare.expected = rows;
                    return crate::session::Reply::Rows(PulledRows {
                        blocks: results,
                        missing,
                        spans,
                    });
                }
                if recv {
                    crate::session::Reply::Received(results)
                } else {
                    crate::session::Reply::Pulled(results)
                }
            }
            ReplyState::Push {
                statuses, state, ..
            } => {
                spare.state = state;
                crate::session::Reply::Pushed(statuses)
            }
            ReplyState::Ping => crate::session::Reply::Pushed(Vec::new()),
        }
    }
}

/// A push a server is receiving: tensors by variable id, or (`PUSH_ROWS`) gradient
/// blocks by table.
pub(crate) struct IncomingPush {
    pub handle: u64,
    ids: Vec<u64>,
    results: Vec<Result<Tensor, Status>>,
    rows: RowIds,
    chunks: Vec<Chunked>,
    /// Memory kept from earlier pushes' blocks, for this one's (rows pushes only).
    memory: Vec<Box<dyn TensorMemory>>,
    frame_done: bool,
    /// When the requester stops waiting for the answer (its `timeout_ms`).
    pub deadline: Option<std::time::Instant>,
    /// The requester cancelled it: it is received to its end and dropped, unanswered.
    pub cancelled: bool,
    /// When its first frame arrived (for its served latency).
    pub arrived: Option<std::time::Instant>,
}

/// The row ids of a `PUSH_ROWS`, all tables' in one vector: table `i`'s are
/// `ids[ends[i - 1]..ends[i]]`. Empty for a tensor push.
#[derive(Default)]
pub(crate) struct RowIds {
    pub ids: Vec<u64>,
    pub ends: Vec<usize>,
}

impl RowIds {
    /// Table `i`'s ids.
    pub(crate) fn of(&self, i: usize) -> &[u64] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.ids[start..self.ends[i]]
    }

    /// Whether this is a rows push.
    pub(crate) fn is_rows(&self) -> bool {
        !self.ends.is_empty()
    }
}

/// The vectors of a finished push, for the next one. For a rows push `ids` are the table
/// ids and `results` the gradient blocks.
#[derive(Default)]
pub(crate) struct PushVecs {
    pub ids: Vec<u64>,
    pub results: Vec<Result<Tensor, Status>>,
    pub rows: RowIds,
    /// The memory of applied gradient blocks, for the next rows push's (at most
    /// [`MEMORY_KEPT`]).
    pub memory: Vec<Box<dyn TensorMemory>>,
}

impl IncomingPush {
    /// A push of `entries`, in the vectors of `spare` (emptied first).
    pub(crate) fn new(
        handle: u64,
        entries: PushEntries<'_>,
        alloc: &dyn TensorAllocator,
        spare: PushVecs,
    ) -> Self {
        let PushVecs {
            mut ids,
            mut results,
            mut rows,
            memory,
        } = spare;
        ids.clear();
        results.clear();
        rows.ids.clear();
        rows.ends.clear();
        let mut chunks = Vec::new();
        for (i, e) in entries.enumerate() {
            ids.push(e.var_id);
            results.push(announced(
                i as u32,
                &e.meta,
                alloc,
                &mut chunks,
                &mut Vec::new(),
            ));
        }
        IncomingPush {
            handle,
            ids,
            results,
            rows,
            chunks,
            memory,
            frame_done: false,
            deadline: None,
            cancelled: false,
            arrived: None,
        }
    }

    /// A rows push of `tables`, in the vectors of `spare` (emptied first).
    pub(crate) fn rows(
        handle: u64,
        tables: RowsTables<'_>,
        alloc: &dyn TensorAllocator,
        spare: PushVecs,
    ) -> Self {
        let mut push = IncomingPush::new(handle, PushEntries::empty(), alloc, spare);
        for (i, t) in tables.enumerate() {
            push.ids.push(t.table as u64);
            push.rows.ids.extend(t.ids());
            push.rows.ends.push(push.rows.ids.len());
            let block = announced(
                i as u32,
                &t.block,
                alloc,
                &mut push.chunks,
                &mut push.memory,
            );
            push.results.push(block);
        }
        push
    }

    pub(crate) fn tensor_mut(
        &mut self,
        index: u32,
        alloc: &dyn TensorAllocator,
        budget: &ConnBudget,
    ) -> Option<&mut Tensor> {
        tensor_in(
            &mut self.results,
            &mut self.chunks,
            index,
            alloc,
            budget,
            &mut self.memory,
        )
    }

    /// Whether this is a rows push.
    pub(crate) fn is_rows(&self) -> bool {
        self.rows.is_rows()
    }

    /// The received items: variable ids, and per item its tensor or why it failed to arrive.
    pub(crate) fn into_parts(self) -> PushVecs {
        PushVecs {
            ids: self.ids,
            results: self.results,
            rows: self.rows,
            memory: self.memory,
        }
    }

    /// Number of items.
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    pub(crate) fn chunk_progress(&mut self, index: u32, end_offset: u64) {
        chunk_done(&mut self.chunks, index, end_offset);
    }

    pub(crate) fn frame_done(&mut self) {
        self.frame_done = true;
    }

    pub(crate) fn is_complete(&self) -> bool {
        self.frame_done && self.chunks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_fails_only_the_items_not_answered() {
        let mut spare = Spare::default();
        let mut s = ReplyState::push(3, &mut spare);
        if let ReplyState::Push {
            statuses, state, ..
        } = &mut s
        {
            statuses[1] = Status::Ok;
            state[1] = ANSWERED;
        }
        assert!(s.fail_open(Status::Aborted), "one item was answered");
        assert!(s.is_complete());
        match s.finish(&mut spare) {
            crate::session::Reply::Pushed(v) => {
                assert_eq!(v, [Status::Aborted, Status::Ok, Status::Aborted])
            }
            other => panic!("{other:?}"),
        }
        let mut none = ReplyState::pull(2, true, &mut spare);
        assert!(
            !none.fail_open(Status::Aborted),
            "nothing answered: the request fails"
        );
    }
}
