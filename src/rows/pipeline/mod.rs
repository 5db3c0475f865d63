//! The pipelined sharded rows client: a worker's step that does not wait for the network
//! when it need not. The user's guide is on [`Pipeline`].

mod cached;
mod ledger;
mod refresh;
mod report;
mod settings;
mod split;
mod step;

pub use report::{PipelineReport, PushFailure};
pub use settings::{PipelineSettings, MAX_PUSHES_IN_FLIGHT};

use std::sync::Arc;
use std::time::Instant;

use arrayvec::ArrayVec;

use super::cache::RowCache;
use super::element::{self, RowElement};
use super::multi::{TableShape, MAX_TABLES};
use super::plan::{Partition, Plan, PlanError};
use super::travel::{check_batch_size, check_unique_buffers, check_unique_counts, checked_scale};
use crate::client::{Client, Mode};
use crate::cluster::Peer;
use crate::error::Error;
use crate::session::{Completion, Rows, Spare, MAX_ROW_RANK};
use crate::tensor::Tensor;
use crate::wire::{DType, LossScale};
use ledger::Ledger;
use refresh::Refresh;
use split::Split;

/// A table partitioned over PS tasks, seen from a worker whose steps overlap their
/// communication with their computation: the rows of the next batch are requested while
/// this one computes ([`prefetch`](Self::prefetch)), and a [`push`](Self::push) of
/// gradients returns without waiting for the PS tasks to answer. A staleness bound `s`
/// keeps it honest; `s = 0` is [`Sharded`](crate::Sharded)'s synchronous step, row for
/// row.
///
/// Each batch is planned as `Sharded` plans it (duplicate ids removed, the distinct ones
/// spread over the PS tasks by a [`Partition`], one rows request per PS, the answers
/// scattered into the caller's `[batch, row]` buffer with duplicates filled, the gradients
/// of duplicates summed before they are sent).
///
/// ```no_run
/// # use starwire::rows::{Partition, Pipeline, PipelineSettings};
/// # use starwire::{DType, Handle, Peer};
/// # fn compute(_: &[f32], _: &mut [f32]) {}
/// # fn train(h: &mut Handle, peers: Vec<Peer>, batches: &[Vec<u64>]) -> Result<(), starwire::Error> {
/// const DIM: usize = 16;
/// let settings = PipelineSettings::default().staleness(1);
/// let mut table = Pipeline::new(peers, Partition::Hash, 7, DType::F32, &[DIM as u64], settings)?;
/// let (mut rows, mut grads) = (Vec::new(), Vec::new());
/// table.prefetch(h, &batches[0])?;
/// for (t, ids) in batches.iter().enumerate() {
///     rows.resize(ids.len() * DIM, 0f32);
///     grads.resize(ids.len() * DIM, 0f32);
///     table.pull_typed(h, ids, &mut rows)?; // step t's rows, requested ahead
///     if let Some(next) = batches.get(t + 1) {
///         table.prefetch(h, next)?; // step t + 1's, sent now if the bound allows
///     }
///     compute(&rows, &mut grads);
///     let report = table.push_typed(h, ids, &grads)?; // returns without waiting
///     eprintln!("step {t}: {:?} communication", report.visible);
/// }
/// table.flush(h)?; // every push answered
/// # Ok(())
/// # }
/// ```
///
/// # What a pulled row reflects
///
/// Number this worker's pushes 1, 2, 3, … in the order of the [`push`](Self::push) calls
/// that sent them, and let `P` be the number sent when [`pull`](Self::pull) returns the
/// rows of a step. The request for a PS's part of those rows was sent only after that PS
/// had answered its part of each of pushes `1..=P - s` (a push with no id at that PS does
/// not hold it back); a PS answers a push once its table has applied it. So:
///
/// - every row **reflects** each of this worker's pushes numbered up to `P - s` (none is
///   required while `P ≤ s`);
/// - it **may or may not reflect** each of the `s` most recent pushes, `P - s + 1 ..= P`:
///   not at all, fully, or, with a table that applies a push row by row and element by
///   element without a lock (a Hogwild [`PsTable`](crate::rows::PsTable)), partly;
/// - it may reflect any push of **other workers**, from any time: the bound is on this
///   worker's own pushes only, which other workers' are not ordered against;
/// - a push part that **failed** (refused, timed out, or lost with its connection) is not
///   applied; it is not retried either: the next call reports it (see *Errors*).
///
/// With `s = 0` each pull waits for every earlier push to be answered, and its rows are
/// those [`Sharded::pull`](crate::Sharded::pull) would give after
/// [`Sharded::push`](crate::Sharded::push) returned. The prefetched request of a step
/// anticipates the step's own push (a prefetch between a step's pull and its push knows one
/// more push comes before the rows are used); if more pushes are sent before the
/// [`pull`](Self::pull) than the bound allows the prefetched rows to miss, the pull asks
/// for those rows again ([`PipelineReport::refetched`]). The bound is checked when the rows
/// are used, whatever the order of the calls.
///
/// # The row cache
///
/// With [`PipelineSettings::cache_bytes`] the pipeline keeps a [`RowCache`] of the rows it
/// pulled (in the table's dtype, whatever the wire dtype), each with its clock: the
/// number of this worker's pushes the row is sure to reflect (those its request waited
/// for, as above). When a step's part for a PS is sent, every id whose cached row would
/// miss at most `s` of this worker's pushes when the rows are used (clock `≥ P - s`, `P`
/// counting the step's own push) is served from the cache, as HET's bounded-staleness
/// read does; only the others are asked for, and inserted into the cache when they
/// arrive. A part the cache serves whole sends nothing and waits for no push. So:
///
/// - the guarantee above holds for cached rows too: a row from the cache reflects each of
///   this worker's pushes up to `P - s` ([`PipelineReport::may_miss`] counts them);
/// - this worker's **own pushes do not patch** the cached rows: a cached row stays as the
///   PS sent it until it is too old and pulled again. The bound is what keeps it honest;
/// - the rows asked for that the cache holds too old are **named with their versions**
///   (a versioned pull, when the rows travel in the table's dtype): a PS that announced
///   `row_versions` answers those nobody pushed since as unchanged, without their bytes,
///   and the cache's copy is used (its clock renewed). With `s = 0` the cache serves
///   nothing without asking, but every row it holds is named this way: the rows are
///   exactly those of a plain pull, and only the changed ones travel
///   ([`PipelineReport::rows_unchanged`] counts the others). A PS without the feature, or
///   a table that keeps no versions, sends every row. The versions cost 8 bytes per id
///   asked for and 8 per row sent: a worker that pushes every row it pulls finds its
///   cached rows changed by its own pushes, and gains nothing. So the pulls are judged
///   over windows of 4,096 rows named: after a window in which the rows answered
///   unchanged saved fewer bytes than the versions cost, 64 steps of plain pulls follow
///   (the rows are the same; only the bytes differ), then versions are tried again
///   ([`versioned_pauses`](Self::versioned_pauses) counts the pauses);
/// - when the cache is full a row is evicted (CLOCK: rows used again since the hand last
///   passed stay); a row evicted is pulled again when next needed. Rows no PS has are not
///   cached.
///
/// [`PipelineReport::cache_hits`] and [`cache_misses`](PipelineReport::cache_misses) count
/// the step's rows served and asked for (those answered unchanged included); [`rows_received`](PipelineReport::rows_received)
/// and the bytes count what travelled. [`cache`](Self::cache) gives the cache's counts
/// over all steps.
///
/// # When requests go out
///
/// [`prefetch`](Self::prefetch) never waits: it sends each PS's request at once if the
/// bound allows, and leaves the others to the next call that finds the answers they wait
/// for (the [`push`](Self::push), or at the latest the [`pull`](Self::pull), which waits
/// for them). In the usual order (pull `t`, prefetch `t + 1`, compute, push `t`), the
/// prefetch of step `t + 1` needs the pushes up to step `t - s` answered: with `s ≥ 2`
/// that is the push of two steps ago and the request goes out during the computation;
/// with `s = 1` it is the last step's push, just sent, and the request usually goes out
/// with the push after the computation (call [`flush`](Self::flush) before the prefetch
/// to wait for that push instead). A [`push`](Self::push) waits only while the push sent
/// `max_pushes_in_flight` pushes before it is unanswered: so at most that many are in
/// flight.
///
/// # Errors
///
/// A call returns `Err` for invalid arguments (before anything is done), when a part of
/// the step's pull failed (naming the step and the PS; the other PS tasks' rows may have
/// been written), and for **push failures**: a push part that failed after its call had
/// returned is reported by the next call of this pipeline that finds it (any of
/// [`pull`](Self::pull), [`prefetch`](Self::prefetch), [`push`](Self::push),
/// [`flush`](Self::flush)), whose error names each failed step and PS (the kind and peer
/// are the first one's); [`failed_pushes`](Self::failed_pushes) lists them until the next
/// call. A call that reports push failures delivers no rows and sends no gradients: call
/// it again to do so. Nothing is retried and nothing is dropped silently.
///
/// # Several tables
///
/// A model with several tables partitioned over the same PS tasks pipelines them together
/// ([`new_tables`](Self::new_tables)): a step hands every table's batch at once
/// ([`pull_tables`](Self::pull_tables), [`prefetch_tables`](Self::prefetch_tables),
/// [`push_tables`](Self::push_tables)), and each PS gets **one** request for the rows of
/// all its tables and one with all their gradients, as
/// [`ShardedTables`](crate::rows::ShardedTables) sends them: `P` requests each way per
/// step over `P` PS tasks, not `T × P`. Each table is planned, cached and scattered on its
/// own; the pushes, the staleness bound and the report are the pipeline's: one push per
/// step covers every table, and the report sums the tables' counts. What a pulled row
/// reflects is as above, for the rows of every table.
///
/// # Use
///
/// Use one [`Client`] with a pipeline, and do not take its completions with
/// [`Client::wait_any`] or [`Client::poll`] while the pipeline has requests in flight
/// (their results would be lost to it, and its waits fail with
/// [`ErrorKind::NotOutstanding`](crate::ErrorKind::NotOutstanding)). The client must allow
/// `(max_pushes_in_flight + 1) × PS tasks` requests in flight (a [`Handle`](crate::Handle)'s
/// capacity). Call [`flush`](Self::flush) before dropping the pipeline: requests it leaves
/// in flight keep their completions in the client.
///
/// After the first steps (once its buffers have grown to the largest batch and as many
/// pushes as may be in flight have been sent), a step allocates nothing.
#[derive(Debug)]
pub struct Pipeline {
    peers: Vec<Peer>,
    settings: PipelineSettings,
    /// The tables, each with its plans, blocks and cache.
    lanes: Vec<Lane>,
    /// The pushes in flight and what each PS has answered.
    ledger: Ledger,
    /// Per push slot and PS (`slot * peers + k`): the tag of that part while pending, and
    /// the tables its request carries, in request order (to name one its answer refuses).
    push_tags: Vec<u64>,
    push_tables: Vec<ArrayVec<u32, MAX_TABLES>>,
    /// Per push slot and PS, and per PS for pulls: the vectors of the request, which go
    /// out with it and come back with its answer. Each serves one kind of request of one
    /// size class, so once every slot has been used, no request allocates.
    push_spares: Vec<Spare>,
    pull_spares: Vec<Spare>,
    /// Per PS, in this push: its tables' summed gradients were copied into the lanes'
    /// `merged` (a connection still held one of its blocks) rather than written into the
    /// blocks.
    copied: Vec<bool>,
    /// The batch on its way is planned (by `prefetch`, or by `pull` when none was), and
    /// each PS's part of its pull (every table's rows at that PS: one request).
    ahead_planned: bool,
    parts: Vec<Part>,
    /// The lanes' `current` plans are the batch of the step in progress, by which `push`
    /// sums gradients.
    current_planned: bool,
    /// Steps whose rows were delivered.
    steps: u64,
    /// The step in progress has sent its push.
    step_pushed: bool,
    /// Push failures found and not reported yet, and those the last error reported.
    failures: Vec<PushFailure>,
    reported: Vec<PushFailure>,
    report: PipelineReport,
    /// The bytes of a typed call's rows (grown to the largest batch, then reused).
    typed: Vec<u8>,
    /// The versions a versioned pull names, every table's of a PS one after the other
    /// (grown to the largest part, then reused).
    held: Vec<u64>,
    /// Whether the versioned pulls pay for their versions.
    refresh: Refresh,
}

/// One table of a [`Pipeline`]: its shape, how its rows travel, the plans of its batches,
/// the blocks its gradients are sent from and its row cache.
#[derive(Debug)]
struct Lane {
    table: u32,
    dtype: DType,
    row_dims: ArrayVec<u64, MAX_ROW_RANK>,
    row_bytes: usize,
    /// The dtype rows travel as, and the loss scale pushes are sent with.
    wire: DType,
    loss_scale: Option<LossScale>,
    /// The batch on its way, the step's in progress, and a push of other ids.
    ahead: Plan,
    current: Plan,
    other: Plan,
    /// Per push slot and PS: the block its summed gradients are sent from, by reference
    /// (written again once the connection has let go of it).
    blocks: Vec<Arc<Tensor>>,
    /// Per PS, in a push whose gradients were copied: where this table's rows are in
    /// `merged`.
    placed: Vec<usize>,
    /// Summed gradients copied when sent (room for every PS's is kept).
    merged: Vec<u8>,
    /// A block that travelled in another dtype, widened into the table's (reused).
    wide: Vec<u8>,
    /// The row cache, when the settings give it bytes; per PS, how its part of the batch
    /// on its way is split between the cache and the request.
    cache: Option<RowCache>,
    splits: Vec<Split>,
    /// Per PS, for a versioned pull of its part: the cache's rows of the ids it names, in
    /// the order asked, copied when it was sent (the rows answered unchanged are taken from
    /// here; the others are written over). Grown to the largest part, then reused.
    held_rows: Vec<Vec<u8>>,
    /// Per PS, in a unique pull: where its distinct ids start among the batch's.
    starts: Vec<usize>,
}

/// Where a pull's rows land in the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Landing {
    /// Row `i` for the batch's `i`-th id, duplicates filled.
    Batch,
    /// Each distinct id's row once, in the order of the plan (by PS, each PS's ids in the
    /// order first seen).
    Unique,
}

/// Where each PS's distinct ids of `plan` start among all of them.
fn place(starts: &mut [usize], plan: &Plan) {
    let mut at = 0;
    for (k, start) in starts.iter_mut().enumerate() {
        *start = at;
        at += plan.ids(k).len();
    }
}

/// Copies the row `row(j)` gives for each of PS `k`'s distinct ids (`j` its index among
/// them; `None`: left as it is) to its place among the batch's distinct ids in `out`,
/// that PS's starting at `starts[k]`.
fn land_unique<'a>(
    plan: &Plan,
    starts: &[usize],
    k: usize,
    row_bytes: usize,
    out: &mut [u8],
    mut row: impl FnMut(usize) -> Option<&'a [u8]>,
) -> Result<(), PlanError> {
    let n = plan.ids(k).len();
    let at = starts.get(k).copied().unwrap_or(0) * row_bytes;
    let Some(part) = out.get_mut(at..at + n * row_bytes) else {
        return Err(PlanError::Length {
            what: "out",
            expected: at + n * row_bytes,
            actual: out.len(),
        });
    };
    for (j, dest) in part.chunks_exact_mut(row_bytes).enumerate() {
        if let Some(src) = row(j) {
            if src.len() != row_bytes {
                return Err(PlanError::Length {
                    what: "block",
                    expected: row_bytes,
                    actual: src.len(),
                });
            }
            dest.copy_from_slice(src);
        }
    }
    Ok(())
}

impl Lane {
    fn new(
        peers: usize,
        shape: &TableShape<'_>,
        settings: &PipelineSettings,
    ) -> Result<Lane, Error> {
        let (table, dtype) = (shape.table, shape.dtype);
        let plan = || Plan::new(peers, shape.partition).map_err(|e| Error::invalid(&e.to_string()));
        let (ahead, current, other) = (plan()?, plan()?, plan()?);
        let mut row_dims = ArrayVec::new();
        row_dims
            .try_extend_from_slice(shape.row_dims)
            .map_err(|_| {
                Error::invalid(&format!("rows: table {table}: too many row dimensions"))
            })?;
        let row_bytes = Rows::new(table, dtype, shape.row_dims, &[])
            .row_bytes()
            .filter(|&b| b > 0 && b <= usize::MAX as u64)
            .ok_or_else(|| {
                Error::invalid(&format!("rows: table {table}: unknown dtype or empty row"))
            })?;
        let wire = settings.wire().unwrap_or(dtype);
        if wire != dtype && !crate::float::convertible(dtype, wire) {
            return Err(Error::invalid(&format!(
                "pipeline: wire_dtype is {}; table {table}'s {} rows travel as they are or, \
                 for f32, bf16 and f16 rows, as one of those",
                wire.name(),
                dtype.name()
            )));
        }
        let loss_scale = checked_scale(table, dtype, settings.scale())?;
        let cache = match settings.cache_capacity() {
            0 => None,
            bytes => Some(RowCache::new(bytes, row_bytes as usize).map_err(|e| {
                Error::invalid(&format!(
                    "pipeline: cache_bytes is {bytes}: table {table}: {}",
                    e.remote_message().unwrap_or("refused")
                ))
            })?),
        };
        let slots = settings.pushes_in_flight_bound() as usize;
        Ok(Lane {
            table,
            dtype,
            row_dims,
            row_bytes: row_bytes as usize,
            wire,
            loss_scale,
            ahead,
            current,
            other,
            blocks: (0..slots * peers)
                .map(|_| Arc::new(Tensor::dead(DType::U8)))
                .collect(),
            placed: vec![0; peers],
            merged: Vec::new(),
            wide: Vec::new(),
            cache,
            splits: (0..peers).map(|_| Split::default()).collect(),
            held_rows: (0..peers).map(|_| Vec::new()).collect(),
            starts: vec![0; peers],
        })
    }

    /// For a unique pull of the batch on its way: where each PS's distinct ids start
    /// among all of them.
    fn place_unique(&mut self) {
        place(&mut self.starts, &self.ahead);
    }

    /// Lands the rows `row(j)` gives for PS `k`'s distinct ids in `out` as `landing` says.
    fn land<'a>(
        &self,
        k: usize,
        landing: Landing,
        out: &mut [u8],
        row: impl FnMut(usize) -> Option<&'a [u8]>,
    ) -> Result<(), PlanError> {
        match landing {
            Landing::Batch => self.ahead.scatter_each(k, self.row_bytes, out, row),
            Landing::Unique => land_unique(&self.ahead, &self.starts, k, self.row_bytes, out, row),
        }
    }

    /// In a unique pull whose part at PS `k` failed: that part's rows zeroed.
    fn zero_unique(&self, k: usize, out: &mut [u8]) {
        let (at, n) = (
            self.starts[k] * self.row_bytes,
            self.ahead.ids(k).len() * self.row_bytes,
        );
        if let Some(part) = out.get_mut(at..at + n) {
            part.fill(0);
        }
    }

    /// After a unique pull: the step's distinct ids into `unique` and each position's
    /// index among them into `inverse` (checked long enough).
    fn write_unique_of_current(&self, unique: &mut [u64], inverse: &mut [i64]) {
        for (k, &start) in self.starts.iter().enumerate() {
            let part = self.current.ids(k);
            unique[start..start + part.len()].copy_from_slice(part);
        }
        for (pos, inv) in inverse.iter_mut().enumerate() {
            let (k, row) = self.current.slot(pos).unwrap_or((0, 0));
            *inv = (self.starts[k] + row) as i64;
        }
    }

    /// The ids of this table's part at PS `k` that its request asks for: those the cache
    /// does not serve (all of them without a cache). Empty: this table is not in the
    /// request.
    fn asked(&self, k: usize) -> &[u64] {
        self.splits[k].asked().unwrap_or(self.ahead.ids(k))
    }
}

/// One PS's part of the pull of the batch on its way.
// A completion is large (it carries its request's vectors); boxing it would allocate on
// every step, and the parts live in a vector sized once.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Part {
    /// The batch has no id at this PS.
    Empty,
    /// Not sent yet: the staleness bound holds it back until pushes are answered.
    Deferred,
    /// Sent once every push numbered `covers` or less had been answered by the PS (or
    /// less: the clock of the oldest row the cache serves of the part).
    Sent { tag: u64, covers: u64 },
    /// Every row served by the cache, the oldest sure to reflect the pushes up to
    /// `covers`: nothing sent.
    Cached { covers: u64 },
    /// Its answer, kept until the pull takes it.
    Done { completion: Completion, covers: u64 },
    /// It could not be sent: reported by the pull.
    Failed(Error),
}

impl Pipeline {
    /// Table `table` (rows of `dtype` and shape `row_dims`) partitioned over `peers` (PS
    /// task `i` holds the ids `partition` maps to `i`), pipelined as `settings` say.
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) for no peers, rows
    /// of no bytes or an unknown dtype, too many row dimensions, or settings out of range
    /// (a wire dtype the table's rows do not convert into, a loss scale out of range or
    /// for rows that are not f32, bf16 or f16).
    pub fn new(
        peers: Vec<Peer>,
        partition: Partition,
        table: u32,
        dtype: DType,
        row_dims: &[u64],
        settings: PipelineSettings,
    ) -> Result<Pipeline, Error> {
        let shape = TableShape {
            table,
            dtype,
            row_dims,
            partition,
        };
        Pipeline::new_tables(peers, &[shape], settings)
    }

    /// Several tables partitioned over the same `peers`, pipelined together as `settings`
    /// say (each table gets its own row cache of `cache_bytes`; the wire dtype and loss
    /// scale apply to every table): a step's pull sends each PS **one** request for every
    /// table's rows it holds, and its push one request with every table's gradients (see
    /// [several tables](Self#several-tables)). The calls are [`pull_tables`](Self::pull_tables),
    /// [`prefetch_tables`](Self::prefetch_tables) and [`push_tables`](Self::push_tables).
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) as for
    /// [`new`](Self::new), naming the table, and for no tables, more than
    /// [`MAX_TABLES`], or a table named twice.
    pub fn new_tables(
        peers: Vec<Peer>,
        tables: &[TableShape<'_>],
        settings: PipelineSettings,
    ) -> Result<Pipeline, Error> {
        settings.check()?;
        if tables.is_empty() || tables.len() > MAX_TABLES {
            return Err(Error::invalid(&format!(
                "pipeline: {} tables; a pipeline holds 1 to {MAX_TABLES}",
                tables.len()
            )));
        }
        let n = peers.len();
        let mut lanes = Vec::with_capacity(tables.len());
        for (i, shape) in tables.iter().enumerate() {
            if tables[..i].iter().any(|o| o.table == shape.table) {
                return Err(Error::invalid(&format!(
                    "pipeline: table {} is named twice",
                    shape.table
                )));
            }
            lanes.push(Lane::new(n, shape, &settings)?);
        }
        let slots = settings.pushes_in_flight_bound() as usize;
        Ok(Pipeline {
            ledger: Ledger::new(n, slots),
            push_tags: vec![0; slots * n],
            push_tables: vec![ArrayVec::new(); slots * n],
            push_spares: (0..slots * n).map(|_| Spare::default()).collect(),
            pull_spares: (0..n).map(|_| Spare::default()).collect(),
            copied: vec![false; n],
            ahead_planned: false,
            parts: (0..n).map(|_| Part::Empty).collect(),
            current_planned: false,
            steps: 0,
            step_pushed: false,
            failures: Vec::new(),
            reported: Vec::new(),
            report: PipelineReport::default(),
            typed: Vec::new(),
            held: Vec::new(),
            refresh: Refresh::default(),
            lanes,
            peers,
            settings,
        })
    }

    /// Bytes of one row (of the first table, with several).
    pub fn row_bytes(&self) -> usize {
        self.lanes[0].row_bytes
    }

    /// The number of tables.
    pub fn tables(&self) -> usize {
        self.lanes.len()
    }

    /// Bytes of one row of the `i`-th table (in the order given to
    /// [`new_tables`](Self::new_tables)); `None` past the last.
    pub fn table_row_bytes(&self, i: usize) -> Option<usize> {
        self.lanes.get(i).map(|l| l.row_bytes)
    }

    /// The PS tasks, in shard order.
    pub fn peers(&self) -> &[Peer] {
        &self.peers
    }

    /// The settings in force.
    pub fn settings(&self) -> &PipelineSettings {
        &self.settings
    }

    /// Steps whose rows were delivered so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Pushes sent so far.
    pub fn pushes(&self) -> u64 {
        self.ledger.issued()
    }

    /// Pushes in flight: sent, and not yet answered by every PS they went to (as far as
    /// this pipeline's last call saw).
    pub fn pushes_in_flight(&self) -> usize {
        self.ledger.in_flight()
    }

    /// The report of the step in progress (what the last call returned).
    pub fn report(&self) -> &PipelineReport {
        &self.report
    }

    /// Times the versioned pulls were paused because their versions cost more bytes than
    /// the rows answered unchanged saved (see [the row cache](Self#the-row-cache)).
    pub fn versioned_pauses(&self) -> u64 {
        self.refresh.pauses()
    }

    /// The row cache (of the first table, with several), when the settings give it
    /// bytes: its counts cover every step so far.
    pub fn cache(&self) -> Option<&RowCache> {
        self.table_cache(0)
    }

    /// The row cache of the `i`-th table, when the settings give it bytes.
    pub fn table_cache(&self, i: usize) -> Option<&RowCache> {
        self.lanes.get(i).and_then(|l| l.cache.as_ref())
    }

    /// The push failures the last call's error reported, in the order found; empty when
    /// it reported none.
    pub fn failed_pushes(&self) -> &[PushFailure] {
        &self.reported
    }

    /// Pulls the rows of step `ids` (duplicates allowed) into `out`, `ids.len() ×
    /// row_bytes` bytes, row `i` for `ids[i]`: the rows the last [`prefetch`](Self::prefetch)
    /// requested when `ids` is its batch (waiting only for what has not arrived), else
    /// requested now. Starts a new step: its report is returned. Rows no PS has are left
    /// zero and counted in [`PipelineReport::missing`]. What the rows reflect: see
    /// [the type's docs](Self#what-a-pulled-row-reflects).
    ///
    /// `Err` for an `out` of the wrong length, or a pipeline of several tables (nothing
    /// done), for push failures found (nothing delivered), and when a PS's part failed:
    /// then the error names the step and the PS, the other parts' rows may have been
    /// written, and the step does not count.
    pub fn pull<M: Mode>(
        &mut self,
        client: &mut Client<M>,
        ids: &[u64],
        out: &mut [u8],
    ) -> Result<&PipelineReport, Error> {
        self.pull_tables(client, &[ids], &mut [out])
    }

    /// [`pull`](Self::pull) of every table's batch at once: `ids[i]` and `outs[i]` are the
    /// `i`-th table's (in the order given to [`new_tables`](Self::new_tables); a table
    /// with no ids this step has an empty batch). Each PS gets one request for all its
    /// tables' rows. `Err` as for `pull`, and for a number of batches or buffers other
    /// than the number of tables.
    pub fn pull_tables<M: Mode>(
        &mut self,
        client: &mut Client<M>,
        ids: &[&[u64]],
        outs: &mut [&mut [u8]],
    ) -> Result<&PipelineReport, Error> {
        self.check_batches(ids.len(), outs.len())?;
        for ((lane, ids), out) in self.lanes.iter().zip(ids).zip(outs.iter()) {
            lane.check_len(ids, out.len(), "out")?;
        }
        let start = Instant::now();
        self.reported.clear();
        self.report.begin(self.steps);
        let done = self.pull_step(client, ids, outs, Landing::Batch);
        self.finish(start);
        done.map(|()| &self.report)
    }

    /// [`pull`](Self::pull) of each distinct id of `ids` once, for a caller that builds
    /// its batch from the distinct rows: the distinct ids go into `unique` (at least
    /// `ids.len()` long; by PS task, each PS's in the order first seen), their rows into
    /// `out` (at least `ids.len() × row_bytes` bytes; row `j` for `unique[j]`) and each
    /// position's index among them into `inverse` (`ids.len()` long). [`unique_len`](Self::unique_len)
    /// (and the report's `unique`) says how many were written; what is past them is left
    /// as it was. The batch and its prefetch are as for `pull` (a [`prefetch`](Self::prefetch)
    /// of the same `ids` is taken), and so is a [`push`](Self::push) of the step's
    /// gradients (by the distinct ids, or the batch's). The deduplication is the one every
    /// step does: no more costly than `pull`, and each distinct row is copied once.
    ///
    /// `Err` as for `pull`, and for buffers too short (nothing done); when a PS's part
    /// failed, its rows in `out` are zero (the others may be written) and `unique` and
    /// `inverse` are left as they were.
    pub fn pull_unique<M: Mode>(
        &mut self,
        client: &mut Client<M>,
        ids: &[u64],
        inverse: &mut [i64],
        unique: &mut [u64],
        out: &mut [u8],
    ) -> Result<&PipelineReport, Error> {
        self.pull_tables_unique(client, &[ids], &mut [inverse], &mut [unique], &mut [out])
    }

    /// [`pull_unique`](Self::pull_unique) of every table's batch at once (as
    /// [`pull_tables`](Self::pull_tables)): `inverse[i]`, `unique[i]` and `outs[i]` are
    /// the `i`-th table's; [`unique_len(i)`](Self::unique_len) its number of distinct ids.
    pub fn pull_tables_unique<M: Mode>(
        &mut self,
        client: &mut Client<M>,
        ids: &[&[u64]],
        inverse: &mut [&mut [i64]],
        unique: &mut [&mut [u64]],
        outs: &mut [&mut [u8]],
    ) -> Result<&PipelineReport, Error> {
        let n = self.lanes.len();
        let lens = [ids.len(), inverse.len(), unique.len(), outs.len()];
        let hint = if n > 1 && ids.len() == 1 {
            ": call pull_tables_unique"
        } else {
            ""
        };
        check_unique_counts(n, lens, hint)?;
        for (i, lane) in self.lanes.iter().enumerate() {
            let lens = (inverse[i].len(), unique[i].len(), outs[i].len());
            check_unique_buffers(lane.table, ids[i].len(), lane.row_bytes, lens)?;
            check_batch_size(ids[i].len())?;
        }
        let start = Instant::now();
        self.reported.clear();
        self.report.begin(self.steps);
        let done = self.pull_step(client, ids, outs, Landing::Unique);
        if done.is_ok() {
            // The step's batch is the one just pulled.
            for ((lane, unique), inverse) in self.lanes.iter().zip(unique).zip(inverse) {
                lane.write_unique_of_current(unique, inverse);
            }
        }
        self.finish(start);
        done.map(|()| &self.report)
    }

    /// The distinct ids of the `i`-th table's batch of the step in progress (the last
    /// pull's); 0 past the last table.
    pub fn unique_len(&self, i: usize) -> usize {
        self.lanes.get(i).map_or(0, |l| l.current.unique_len())
    }

    /// Hands the next step's batch `ids` early: each PS's part of its pull is planned and
    /// sent at once if the staleness bound allows, else by the next call that finds the
    /// answers it waits for. Never waits. The rows are taken by the next
    /// [`pull`](Self::pull) of the same ids; a prefetch of another batch before it replaces
    /// this one (waiting for its requests in flight, and dropping their rows).
    pub fn prefetch<M: Mode>(
        &mut self,
        client: &mut Client<M>,
        ids: &[u64],
    ) -> Result<&PipelineReport, Error> {
        self.prefetch_tables(client, &[ids])
    }

    /// [`prefetch`](Self::prefetch) of every table's next batch, `ids[i]` the `i`-th
    /// table's: taken by the next [`pull_tables`](Self::pull_tables) of the same batches.
    pub fn prefetch_tables<M: Mode>(
        &mut self,
        client: &mut Client<M>,
        ids: &[&[u64]],
    ) -> Result<&PipelineReport, Error> {
        self.check_batches(ids.len(), ids.len())?;
        let start = Instant::now();
        self.reported.clear();
        let done = self.prefetch_step(client, ids);
        self.finish(start);
        done.map(|()| &self.report)
    }

    /// Sends the gradient rows `grads` of `ids` (`ids.len() × row_bytes` bytes, row `i` for
    /// `ids[i]`; f32 and f64 rows): duplicates summed, one request per PS, and returns
    /// without waiting for the answers, unless the push `max_pushes_in_flight` before it
    /// is unanswered (then it waits for that one, so that at most `max_pushes_in_flight`
    /// are in flight). The answers are checked by later calls; a failed part is reported
    /// by the first call that finds it.
    ///
    /// Usually `ids` is the step's batch (as pulled), whose plan is reused; any other ids
    /// are planned anew. `Err` for `grads` of the wrong length, rows of another dtype or a
    /// pipeline of several tables (nothing sent), and for push failures found (this push
    /// not sent).
    pub fn push<M: Mode>(
        &mut self,
        client: &mut Client<M>,
        ids: &[u64],
        grads: &[u8],
    ) -> Result<&PipelineReport, Error> {
        self.push_tables(client, &[ids], &[grads])
    }

    /// [`push`](Self::push) of every table's gradients at once: `grads[i]` holds the rows
    /// of `ids[i]`, the `i`-th table's (a table with no ids this step has an empty
    /// batch). Each PS gets one request with all its tables' gradients; the push counts
    /// as one against `max_pushes_in_flight` and the staleness bound. `Err` as for `push`,
    /// and for a number of batches other than the number of tables.
    pub fn push_tables<M: Mode>(
        &mut self,
        client: &mut Client<M>,
        ids: &[&[u64]],
        grads: &[&[u8]],
    ) -> Result<&PipelineReport, Error> {
        self.check_batches(ids.len(), grads.len())?;
        for ((lane, ids), g) in self.lanes.iter().zip(ids).zip(grads) {
            lane.check_len(ids, g.len(), "grads")?;
            // A table that takes no part (rows only read) may be of any dtype.
            if !ids.is_empty() && !matches!(lane.dtype, DType::F32 | DType::F64) {
                return Err(Error::invalid(&format!(
                    "rows: cannot sum gradients of table {}'s {:?} rows (f32 and f64 only)",
                    lane.table, lane.dtype
                )));
            }
        }
        let start = Instant::now();
        self.reported.clear();
        let done = self.push_step(client, ids, grads);
        self.finish(start);
        done.map(|()| &self.report)
    }

    /// Waits until every push sent has been answered by every PS, and every prefetched
    /// request has its answer (kept for the [`pull`](Self::pull) of its batch). Then
    /// nothing of this pipeline is in flight. `Err` for the push failures found.
    pub fn flush<M: Mode>(&mut self, client: &mut Client<M>) -> Result<&PipelineReport, Error> {
        let start = Instant::now();
        self.reported.clear();
        self.flush_all(client);
        self.finish(start);
        self.report_failures().map(|()| &self.report)
    }

    /// [`pull`](Self::pull) into rows of elements: `out` holds `ids.len()` rows of the
    /// table's dtype (`T` must be it: `f32` for an `F32` table), row `i` for `ids[i]`,
    /// converted from the bytes through a buffer this pipeline keeps. On `Err`, `out` is
    /// left as it was. Another `T`, or an `out` that is not whole rows for `ids`:
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) before anything is
    /// done.
    pub fn pull_typed<T: RowElement, M: Mode>(
        &mut self,
        client: &mut Client<M>,
        ids: &[u64],
        out: &mut [T],
    ) -> Result<&PipelineReport, Error> {
        let bytes = self.typed_len::<T>(ids, out.len(), "out")?;
        let mut buf = std::mem::take(&mut self.typed);
        buf.clear();
        buf.resize(bytes, 0);
        let pulled = self.pull(client, ids, &mut buf).map(|_| ());
        if pulled.is_ok() {
            element::decode(&buf, out);
        }
        self.typed = buf;
        pulled.map(|()| &self.report)
    }

    /// [`push`](Self::push) of gradient rows of elements: `grads` holds `ids.len()` rows
    /// of the table's dtype (`T` must be it), row `i` for `ids[i]`, converted into bytes in
    /// a buffer this pipeline keeps (the rows are summed and sent from blocks of its own:
    /// `grads` may change as soon as the call returns). Another `T`, or `grads` that are
    /// not whole rows for `ids`: [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)
    /// before anything is sent.
    pub fn push_typed<T: RowElement, M: Mode>(
        &mut self,
        client: &mut Client<M>,
        ids: &[u64],
        grads: &[T],
    ) -> Result<&PipelineReport, Error> {
        let bytes = self.typed_len::<T>(ids, grads.len(), "grads")?;
        let mut buf = std::mem::take(&mut self.typed);
        buf.clear();
        buf.resize(bytes, 0);
        element::encode(grads, &mut buf);
        let pushed = self.push(client, ids, &buf).map(|_| ());
        self.typed = buf;
        pushed.map(|()| &self.report)
    }

    /// The bytes of a typed call's rows of the (one) table.
    fn typed_len<T: RowElement>(
        &self,
        ids: &[u64],
        len: usize,
        what: &str,
    ) -> Result<usize, Error> {
        self.check_batches(1, 1)?;
        let lane = &self.lanes[0];
        element::typed_len::<T>(lane.table, lane.dtype, lane.row_bytes, ids, len, what)
    }

    /// Checks that a call gives one batch (`batches`) and one buffer (`buffers`) per table.
    fn check_batches(&self, batches: usize, buffers: usize) -> Result<(), Error> {
        let n = self.lanes.len();
        if batches != n || buffers != n {
            let hint = if batches == 1 && buffers == 1 {
                ": call pull_tables, prefetch_tables and push_tables"
            } else {
                ""
            };
            return Err(Error::invalid(&format!(
                "pipeline: {batches} batches and {buffers} buffers for {n} tables (one of \
                 each per table){hint}"
            )));
        }
        Ok(())
    }

    /// Ends a call that began at `start`: its time and the pushes left in flight go into
    /// the step's report.
    fn finish(&mut self, start: Instant) {
        self.report.visible += start.elapsed();
        self.report.pushes_in_flight = self.ledger.in_flight();
        self.report.cache_bytes = self
            .lanes
            .iter()
            .filter_map(|l| l.cache.as_ref())
            .map(RowCache::bytes_held)
            .sum();
    }
}

impl Lane {
    /// Checks that `len` bytes are whole rows of this table for `ids`.
    fn check_len(&self, ids: &[u64], len: usize, what: &str) -> Result<(), Error> {
        if ids.len().checked_mul(self.row_bytes) != Some(len) {
            return Err(Error::invalid(&format!(
                "rows: table {}: {what} is {len} bytes; {} ids need {} ({} per row)",
                self.table,
                ids.len(),
                ids.len().saturating_mul(self.row_bytes),
                self.row_bytes
            )));
        }
        check_batch_size(ids.len())
    }
}
