//! What a server holds for one connection's requests while it serves them: the pushes
//! being received (tensors by variable id, or `PUSH_ROWS` gradient blocks by table) and the
//! recvs that still owe items. Pure bookkeeping: the vectors of a finished push are handed
//! back for the next one, so a steady stream of pushes allocates nothing.

use std::time::Instant;

use super::arriving::Arriving;
use super::budget::ConnBudget;
use crate::stats::RequestKind;
use crate::tensor::{Tensor, TensorAllocator, TensorMemory};
use crate::wire::{PushEntries, RowsTables, Status};

/// The peer's requests a connection is serving.
#[derive(Default)]
pub(crate) struct Served {
    /// Pushes being received.
    pub pushes: Vec<IncomingPush>,
    /// Recvs being answered: handle and items still owed.
    pub recvs: Vec<(u64, u32)>,
}

impl Served {
    /// Requests the peer has waiting on this connection.
    pub(crate) fn len(&self) -> usize {
        self.pushes.len() + self.recvs.len()
    }

    /// The push `handle`, being received.
    pub(crate) fn push(&self, handle: u64) -> Option<&IncomingPush> {
        self.pushes.iter().find(|p| p.handle == handle)
    }

    /// The push `handle`, being received.
    pub(crate) fn push_mut(&mut self, handle: u64) -> Option<&mut IncomingPush> {
        self.pushes.iter_mut().find(|p| p.handle == handle)
    }

    /// Whether recv `handle` still owes items.
    pub(crate) fn owes_recv(&self, handle: u64) -> bool {
        self.recvs.iter().any(|&(h, _)| h == handle)
    }
}

/// A push a server is receiving: tensors by variable id, or (`PUSH_ROWS`) gradient
/// blocks by table.
pub(crate) struct IncomingPush {
    pub handle: u64,
    ids: Vec<u64>,
    results: Vec<Result<Tensor, Status>>,
    rows: RowIds,
    arriving: Arriving,
    /// Memory kept from earlier pushes' blocks, for this one's (rows pushes only).
    memory: Vec<Box<dyn TensorMemory>>,
    frame_done: bool,
    /// When the requester stops waiting for the answer (its `timeout_ms`).
    pub deadline: Option<Instant>,
    /// The requester cancelled it: it is received to its end and dropped, unanswered.
    pub cancelled: bool,
    /// When its first frame arrived (for its served latency).
    pub arrived: Instant,
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
    /// [`MEMORY_KEPT`](super::reply::MEMORY_KEPT)).
    pub memory: Vec<Box<dyn TensorMemory>>,
}

impl IncomingPush {
    /// A push of `entries` that arrived at `now`, in the vectors of `spare` (emptied first).
    pub(crate) fn new(
        handle: u64,
        entries: PushEntries<'_>,
        alloc: &dyn TensorAllocator,
        spare: PushVecs,
        now: Instant,
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
        let mut arriving = Arriving::default();
        for (i, e) in entries.enumerate() {
            ids.push(e.var_id);
            results.push(arriving.announce(i as u32, &e.meta, alloc, &mut Vec::new()));
        }
        IncomingPush {
            handle,
            ids,
            results,
            rows,
            arriving,
            memory,
            frame_done: false,
            deadline: None,
            cancelled: false,
            arrived: now,
        }
    }

    /// A rows push of `tables` that arrived at `now`, in the vectors of `spare` (emptied
    /// first).
    pub(crate) fn rows(
        handle: u64,
        tables: RowsTables<'_>,
        alloc: &dyn TensorAllocator,
        spare: PushVecs,
        now: Instant,
    ) -> Self {
        let mut push = IncomingPush::new(handle, PushEntries::empty(), alloc, spare, now);
        for (i, t) in tables.enumerate() {
            push.ids.push(t.table as u64);
            push.rows.ids.extend(t.ids());
            push.rows.ends.push(push.rows.ids.len());
            let block = push
                .arriving
                .announce(i as u32, &t.block, alloc, &mut push.memory);
            push.results.push(block);
        }
        push
    }

    /// The tensor receiving item `index`'s contents.
    pub(crate) fn tensor_mut(
        &mut self,
        index: u32,
        alloc: &dyn TensorAllocator,
        budget: &ConnBudget,
    ) -> Option<&mut Tensor> {
        self.arriving
            .tensor_mut(&mut self.results, index, alloc, budget, &mut self.memory)
    }

    /// Whether this is a rows push.
    pub(crate) fn is_rows(&self) -> bool {
        self.rows.is_rows()
    }

    /// The kind of request it is.
    pub(crate) fn kind(&self) -> RequestKind {
        match self.is_rows() {
            true => RequestKind::PushRows,
            false => RequestKind::Push,
        }
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

    /// Chunk bytes of item `index` up to `end_offset` arrived.
    pub(crate) fn chunk_progress(&mut self, index: u32, end_offset: u64) {
        self.arriving.progress(index, end_offset);
    }

    /// Its frame (and its inline payload) is in.
    pub(crate) fn frame_done(&mut self) {
        self.frame_done = true;
    }

    /// Whether all of it has arrived.
    pub(crate) fn is_complete(&self) -> bool {
        self.frame_done && self.arriving.is_empty()
    }
}
