//! What a submitter gets back: the answer to a request ([`Reply`]), the finished request
//! ([`Completion`]), and the vectors that travel with a request and come back with its
//! completion ([`Spare`]), so that a steady stream of requests allocates nothing. Data
//! only.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::tensor::{Tensor, TensorMemory};
use crate::wire::{Status, Versions};

use super::spec::RowsSpec;

/// The answer to a request.
#[derive(Debug, PartialEq)]
#[non_exhaustive]
pub enum Reply {
    /// A pull's answer: per id, its tensor or why there is none.
    Pulled(Vec<Result<Tensor, Status>>),
    /// A push's answer: per item, how the service took it.
    Pushed(Vec<Status>),
    /// A recv's answer: per key, its tensor (possibly dead) or why there is none.
    Received(Vec<Result<Tensor, Status>>),
    /// A rows pull's answer: per table, its block of rows or why there is none.
    Rows(super::reply::PulledRows),
    /// A ping's answer: the round-trip time measured by the loop, from the request being
    /// queued on the connection to the pong being decoded, and the echoed payload size.
    Pong {
        /// Round-trip time.
        rtt: Duration,
        /// Payload bytes echoed.
        payload: u32,
    },
}

/// A finished request.
#[derive(Debug)]
pub struct Completion {
    /// The tag given when the request was submitted.
    pub tag: u64,
    /// The answer, or why there is none.
    pub result: Result<Reply, Error>,
    /// Vectors the request used, for the submitter's next requests.
    pub(crate) spare: Spare,
}

impl Completion {
    pub(crate) fn new(tag: u64, result: Result<Reply, Error>) -> Completion {
        Completion {
            tag,
            result,
            spare: Spare::default(),
        }
    }

    /// Every vector this completion holds, emptied, for reuse by later requests.
    pub(crate) fn into_spare(self) -> Spare {
        let mut spare = self.spare;
        if let Ok(reply) = self.result {
            spare.reclaim(reply);
        }
        spare
    }
}

/// Two completions are equal when their tags and results are (the vectors a completion
/// carries back for reuse are not part of what it says).
impl PartialEq for Completion {
    fn eq(&self, other: &Self) -> bool {
        self.tag == other.tag && self.result == other.result
    }
}

/// Callback run on the loop thread for every completion of a handle.
pub type Callback = Arc<dyn Fn(Completion) + Send + Sync>;

/// The answer to a rows pull: per table, in request order, its block of rows or why there
/// is none, and the rows the PS did not have.
#[derive(Debug, PartialEq, Default)]
pub struct PulledRows {
    pub(crate) blocks: Vec<Result<Tensor, Status>>,
    /// Positions of missing rows, all tables'.
    pub(crate) missing: Vec<u32>,
    /// Per table: where its missing rows are in `missing`.
    pub(crate) spans: Vec<(u32, u32)>,
    /// What the PS said about the tables it refused, if it said anything.
    pub(crate) refusal: Option<Arc<str>>,
    /// The rows' versions, for a pull that held some (see
    /// [`versions`](PulledRows::versions)).
    pub(crate) versions: RowVersions,
}

impl PulledRows {
    /// What the PS said about the tables whose [`block`](Self::block) is an error, when it
    /// said why (a table it does not serve, rows of another type or shape than the table
    /// holds: `"table 7 holds f32 [4] rows; the request asked for f32 [5]"`, one clause per
    /// refused table). A request whose every table was refused fails as a whole instead,
    /// with these words as its error's [`remote_message`](crate::Error::remote_message).
    pub fn refusal(&self) -> Option<&str> {
        self.refusal.as_deref()
    }

    /// Number of tables.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether there are no tables.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Table `t`'s block (`[ids, row...]`, rows in request order; for a
    /// [versioned pull](crate::Client::pull_rows_versioned), `[rows sent, row...]`, the rows
    /// not [`unchanged`](Self::unchanged) in the order of their positions), or why there is
    /// none.
    /// Its dtype is the one the rows travelled as: the request's
    /// [`wire`](crate::rows::Rows::wire) dtype, or the rows' own when the PS did not
    /// announce `row_formats` ([`read_f32`](Self::read_f32) reads either as f32).
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

    /// Row `i` of table `t`'s block (for a versioned pull, the `i`-th row sent: see
    /// [`changed_rows`](Self::changed_rows)); `None` when the table failed or `i` is out of
    /// range.
    pub fn row(&self, t: usize, i: usize) -> Option<&[u8]> {
        let b = self.block(t).ok()?;
        let row = row_bytes_of(b);
        if i >= *b.dims().first()? as usize {
            return None;
        }
        b.bytes().get(i * row..(i + 1) * row)
    }

    /// Table `t`'s rows as f32 values, into `out` (as many elements as the block has),
    /// whatever they travelled as: f32 rows copied, bf16 and f16 rows widened (exactly).
    /// `Err` with the table's status when it failed, [`Status::InvalidArgument`] for rows
    /// of another dtype or an `out` of another length.
    pub fn read_f32(&self, t: usize, out: &mut [f32]) -> Result<(), Status> {
        let b = self.block(t)?;
        crate::float::widen_into(b.dtype(), b.bytes(), out).map_err(|_| Status::InvalidArgument)
    }

    /// Positions (in the request's ids of table `t`) of the rows the PS did not have,
    /// increasing; their bytes in the block are zero.
    pub fn missing(&self, t: usize) -> &[u32] {
        match self.spans.get(t) {
            Some(&(start, len)) => &self.missing[start as usize..(start + len) as usize],
            None => &[],
        }
    }

    /// For a [versioned pull](crate::Client::pull_rows_versioned): the version of each row
    /// of table `t`, in the order of its ids — the one held for the rows that came
    /// [`unchanged`](Self::unchanged), 0 for a missing row and for every row of a table or a
    /// peer that keeps or speaks no versions (unknown: hold such rows as version 0, so the
    /// next pull asks for them again). Empty for a plain pull.
    pub fn versions(&self, t: usize) -> &[u64] {
        match self.versions.spans.get(t) {
            Some(&(start, len)) => &self.versions.versions[start as usize..(start + len) as usize],
            None => &[],
        }
    }

    /// Whether row `i` of table `t` came unchanged: its version is the one the pull held,
    /// and its bytes were not sent (the block leaves it out). Never for a plain pull.
    pub fn unchanged(&self, t: usize, i: usize) -> bool {
        self.versions
            .spans
            .get(t)
            .filter(|&&(_, len)| i < len as usize)
            .is_some_and(|&(start, _)| self.versions.unchanged[start as usize + i])
    }

    /// How many rows of table `t` came unchanged.
    pub fn unchanged_count(&self, t: usize) -> usize {
        match self.versions.spans.get(t) {
            Some(&(start, len)) => self.versions.unchanged[start as usize..(start + len) as usize]
                .iter()
                .filter(|&&u| u)
                .count(),
            None => 0,
        }
    }

    /// The rows of table `t` that were sent, with their positions in the table's ids:
    /// every row for a plain pull, the rows not [`unchanged`](Self::unchanged) for a
    /// versioned one (missing rows included, as zeros); in position order. Empty when the
    /// table failed.
    pub fn changed_rows(&self, t: usize) -> impl Iterator<Item = (usize, &[u8])> + '_ {
        let block = self.block(t).ok();
        let row = block.map_or(0, row_bytes_of);
        let n = match self.versions.spans.get(t) {
            Some(&(_, len)) => len as usize,
            None => block
                .and_then(|b| b.dims().first())
                .map_or(0, |&n| n as usize),
        };
        let bytes = block.map_or(&[][..], |b| b.bytes());
        (0..n)
            .filter(move |&i| !self.unchanged(t, i))
            .zip(bytes.chunks_exact(row.max(1)))
            .filter(move |_| row > 0)
    }

    /// Writes the rows of table `t` that were sent (see [`changed_rows`](Self::changed_rows))
    /// into `dest`, the table's rows in the order of its ids (`ids × row bytes` of the
    /// block's dtype, the same layout as a block), each at its position; the rows that came
    /// unchanged are left as they are, so `dest` can be the caller's copy of the rows
    /// (a cache's). Returns the rows written. `Err` with the table's status when it failed,
    /// [`Status::InvalidArgument`] for a `dest` of another length.
    pub fn write_changed(&self, t: usize, dest: &mut [u8]) -> Result<usize, Status> {
        let block = self.block(t)?;
        let row = row_bytes_of(block);
        let n = match self.versions.spans.get(t) {
            Some(&(_, len)) => len as usize,
            None => block.dims().first().map_or(0, |&n| n as usize),
        };
        if n.checked_mul(row) != Some(dest.len()) {
            return Err(Status::InvalidArgument);
        }
        let mut written = 0;
        for (i, bytes) in self.changed_rows(t) {
            dest[i * row..(i + 1) * row].copy_from_slice(bytes);
            written += 1;
        }
        Ok(written)
    }
}

/// Bytes of one row of a rows block (`[rows, row...]`), whatever its row count (0 too).
fn row_bytes_of(block: &Tensor) -> usize {
    let elem = block.dtype().size().unwrap_or(0) as usize;
    block
        .dims()
        .iter()
        .skip(1)
        .fold(elem, |acc, &d| acc.saturating_mul(d as usize))
}

/// The row versions of a rows pull's answer, all tables' in the order of the ids, reused
/// from answer to answer.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct RowVersions {
    /// The versions the request held, then each id's version.
    pub(crate) held: Vec<u64>,
    pub(crate) versions: Vec<u64>,
    /// Whether each id came unchanged (its bytes not sent).
    pub(crate) unchanged: Vec<bool>,
    /// Per table: where its ids are in the vectors, and how many (0: no versions).
    pub(crate) spans: Vec<(u32, u32)>,
}

impl RowVersions {
    /// The vectors, emptied, for `tables`: with `held` (as many as their ids), one entry
    /// per id, every version 0 and none unchanged until the answer says otherwise.
    pub(crate) fn reset(&mut self, tables: &[RowsSpec], held: &[u64]) {
        self.held.clear();
        self.versions.clear();
        self.unchanged.clear();
        self.spans.clear();
        if held.is_empty() {
            return;
        }
        self.held.extend_from_slice(held);
        self.versions.resize(held.len(), 0);
        self.unchanged.resize(held.len(), false);
        let mut at = 0u32;
        for t in tables {
            self.spans.push((at, t.len() as u32));
            at += t.len() as u32;
        }
    }

    /// Takes table `index`'s report: the versions sent, and the held ones of the rows
    /// that came unchanged.
    pub(crate) fn take(&mut self, index: usize, report: &Versions<'_>) {
        let Some(&(start, len)) = self.spans.get(index) else {
            return;
        };
        let mut k = 0;
        for i in 0..len as usize {
            let at = start as usize + i;
            if report.is_unchanged(i) {
                self.versions[at] = self.held[at];
                self.unchanged[at] = true;
            } else {
                self.versions[at] = report.sent_version(k).unwrap_or(0);
                k += 1;
            }
        }
    }
}

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
    pub item_states: Vec<Item>,
    /// A rows request's tables, back once encoded (and its answer's expected blocks).
    pub tables: Vec<RowsSpec>,
    /// A rows push's gradient bytes, back once encoded.
    pub grads: Vec<u8>,
    /// A rows pull's report of missing rows.
    pub missing: Vec<u32>,
    pub spans: Vec<(u32, u32)>,
    /// A rows pull's expected blocks, while its answer is assembled.
    pub expected: Vec<RowsSpec>,
    /// A versioned rows pull's held versions, back once encoded.
    pub held: Vec<u64>,
    /// A versioned rows pull's answer's versions.
    pub versions: RowVersions,
    /// The memory of blocks of recycled rows answers, for the next ones (at most
    /// [`MEMORY_KEPT`]).
    pub memory: Vec<Box<dyn TensorMemory>>,
    /// The request these vectors served used the runtime's allocator: its blocks' memory
    /// may serve the next requests.
    pub runtime_memory: bool,
}

/// Blocks' memories a [`Spare`] or a push's vectors keep for reuse: one per table of a
/// rows request (at most 64 tables), of at most [`MEMORY_KEPT_BYTES`] each and, in all,
/// as many of those as the request had tables (two at least): what the same tables' own
/// requests would keep.
pub(crate) const MEMORY_KEPT: usize = 64;

/// Largest block whose memory is kept: larger ones are rare and cost their allocation
/// little next to their transfer.
pub(crate) const MEMORY_KEPT_BYTES: usize = 1 << 20;

/// Keeps the memory of the blocks in `blocks` (emptied) in `memory`, up to
/// [`MEMORY_KEPT`] blocks of at most [`MEMORY_KEPT_BYTES`], and `MEMORY_KEPT_BYTES` per
/// block of `blocks` (two at least) in all.
pub(crate) fn keep_memory(
    blocks: &mut Vec<Result<Tensor, Status>>,
    memory: &mut Vec<Box<dyn TensorMemory>>,
) {
    let cap = blocks.len().max(2) * MEMORY_KEPT_BYTES;
    let mut total: usize = memory.iter().map(|m| m.bytes().len()).sum();
    for b in blocks.drain(..) {
        if memory.len() == MEMORY_KEPT {
            continue;
        }
        let m = b.ok().and_then(Tensor::into_memory);
        if let Some(m) = m.filter(|m| {
            let len = m.bytes().len();
            len <= MEMORY_KEPT_BYTES && total + len <= cap
        }) {
            if memory.capacity() == 0 {
                // Room for a few tables' blocks at once; a request of more grows it once.
                memory.reserve_exact(4);
            }
            total += m.bytes().len();
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
    pub(crate) fn reclaim(&mut self, reply: Reply) {
        match reply {
            Reply::Pulled(mut v) | Reply::Received(mut v) => {
                v.clear();
                self.results = v;
            }
            Reply::Pushed(mut v) => {
                v.clear();
                self.statuses = v;
            }
            Reply::Rows(rows) => {
                let PulledRows {
                    mut blocks,
                    mut missing,
                    mut spans,
                    refusal: _,
                    versions,
                } = rows;
                self.versions = versions;
                if self.runtime_memory {
                    keep_memory(&mut blocks, &mut self.memory);
                }
                blocks.clear();
                missing.clear();
                spans.clear();
                (self.results, self.missing, self.spans) = (blocks, missing, spans);
            }
            Reply::Pong { .. } => {}
        }
    }
}

impl std::fmt::Debug for Spare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Spare")
    }
}

/// Where an item of an answer being assembled stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Item {
    /// Not answered yet.
    Open,
    /// Answered: its value is in place.
    Answered,
    /// Answered and handed out already (to a recv the session fused).
    Taken,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::DType;

    fn block(len: usize) -> Result<Tensor, Status> {
        Ok(Tensor::from_bytes(DType::U8, &[len as u64], vec![0; len]).unwrap())
    }

    #[test]
    fn an_answer_keeps_a_memory_per_table_up_to_a_mebibyte_each() {
        // Three tables' blocks of 900 KiB: all kept (2.6 MiB, within 3 x 1 MiB).
        let mut memory = Vec::new();
        let mut blocks = vec![block(900 << 10), block(900 << 10), block(900 << 10)];
        keep_memory(&mut blocks, &mut memory);
        assert!(blocks.is_empty());
        assert_eq!(memory.len(), 3);
        // A block over 1 MiB is not kept; nor is one past the answer's total.
        let mut memory = Vec::new();
        let mut blocks = vec![
            block(2 << 20),
            block(1 << 20),
            block(1 << 20),
            block(1 << 10),
        ];
        keep_memory(&mut blocks, &mut memory);
        let kept: Vec<usize> = memory.iter().map(|m| m.bytes().len()).collect();
        assert_eq!(kept, [1 << 20, 1 << 20, 1 << 10]);
        // One table: two memories at most, as before.
        let mut memory = Vec::new();
        for _ in 0..3 {
            keep_memory(&mut vec![block(1 << 20)], &mut memory);
        }
        assert_eq!(memory.len(), 2);
    }
}
