//! What a server holds for one connection's requests while it serves them: the pushes
//! being received (tensors by variable id, or `PUSH_ROWS` gradient blocks by table) and the
//! recvs that still owe items. Pure bookkeeping: the vectors of a finished push are handed
//! back for the next one, so a steady stream of pushes allocates nothing.

use std::time::Instant;

use super::arriving::Arriving;
use super::budget::{ConnBudget, Reservation};
use crate::stats::RequestKind;
use crate::tensor::{Tensor, TensorAllocator, TensorMemory};
use crate::wire::{LossScale, PushEntries, RowsTables, Status};

/// The peer's requests a connection is serving.
#[derive(Default)]
pub(crate) struct Served {
    /// Pushes being received.
    pub pushes: Vec<IncomingPush>,
    /// Recvs waiting for keys to be published.
    pub recvs: Vec<ServedRecv>,
    /// Rows pulls whose blocks the handler pool is making, and what they were charged.
    pub producing: Vec<(u64, Reservation)>,
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
        self.recv_at(handle).is_some()
    }

    /// Where recv `handle` is in `recvs`.
    pub(crate) fn recv_at(&self, handle: u64) -> Option<usize> {
        self.recvs.iter().position(|r| r.handle == handle)
    }
}

/// A recv of the peer waiting for keys to be published: which items it still owes, and
/// its keys, kept to take its waiters out of the rendezvous key by key (a cancel, its
/// deadline, its connection closing) without a scan of the whole table. What it holds is
/// charged to the connection's part of the receive budget while it waits.
pub(crate) struct ServedRecv {
    pub handle: u64,
    /// `RECV` or `FUSED_RECV`, as its metrics count it.
    pub kind: RequestKind,
    /// Items still owed.
    pub owed: u32,
    /// The keys, one after the other; key `i` ends at `ends[i]`.
    keys: Vec<u8>,
    ends: Vec<u32>,
    _charged: Reservation,
}

/// What a waiting recv of `keys` keys of `key_bytes` bytes in all costs a task: its keys
/// twice (the rendezvous' entries and this copy) and a waiter per key.
pub(crate) fn recv_cost(keys: usize, key_bytes: usize) -> u64 {
    (2 * key_bytes + 64 * keys + 64) as u64
}

impl ServedRecv {
    /// Recv `handle` of `keys`, owing `owed` items, holding `charged`.
    pub(crate) fn new<'k>(
        handle: u64,
        kind: RequestKind,
        owed: u32,
        keys: impl Iterator<Item = &'k [u8]>,
        charged: Reservation,
    ) -> ServedRecv {
        let (mut bytes, mut ends) = (Vec::new(), Vec::new());
        for k in keys {
            bytes.extend_from_slice(k);
            ends.push(bytes.len() as u32);
        }
        ServedRecv {
            handle,
            kind,
            owed,
            keys: bytes,
            ends,
            _charged: charged,
        }
    }

    /// Key `i`.
    pub(crate) fn key(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.keys[start..self.ends.get(i).map_or(start, |&e| e as usize)]
    }

    /// Number of keys.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
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
/// `ids[ends[i - 1]..ends[i]]`, its loss scale `scales[i]`. Empty for a tensor push.
#[derive(Default)]
pub(crate) struct RowIds {
    pub ids: Vec<u64>,
    pub ends: Vec<usize>,
    pub scales: Vec<Option<LossScale>>,
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
        rows.scales.clear();
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
            push.rows.scales.push(t.loss_scale);
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
