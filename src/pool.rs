//! A pool of threads for heavy service handlers.
//!
//! Inline handlers run on the loop that received the request: no hop, but a slow handler
//! stalls every other connection of that loop. With a pool, the loop hands the request to a
//! pool thread and goes on; the answer comes back through the loop's delivery queue and the
//! loop sends it. Use the pool when a handler does real work (an optimizer step over large
//! tensors, a lookup that may block); keep handlers inline when they take microseconds.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::service::Table;
use crate::service::{Service, SharedService};
use crate::tensor::Tensor;
use crate::wire::{DType, LossScale, Status};

/// Jobs waiting for a handler thread, at most.
const QUEUE: usize = 4096;

/// Where an answer goes: loop, connection (slot and generation), request handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplyTo {
    pub loop_index: usize,
    pub conn: u32,
    pub generation: u32,
    pub handle: u64,
}

/// Work for a pool thread.
pub(crate) enum Job {
    Pull {
        to: ReplyTo,
        ids: Vec<u64>,
    },
    /// Received items (variable ids, and per item its tensor or the status of its failure
    /// to arrive).
    Push {
        to: ReplyTo,
        ids: Vec<u64>,
        results: Vec<Result<Tensor, Status>>,
    },
    /// The tables of a `PULL_ROWS`.
    PullRows {
        to: ReplyTo,
        tables: Vec<RowsPull>,
    },
    /// A received `PUSH_ROWS`: per table its id, its gradient block (or the status of its
    /// failure to arrive), its row ids, `ids[ends[i - 1]..ends[i]]`, and its loss scale;
    /// `convert`: the connection negotiated `ROW_FORMATS`.
    PushRows {
        to: ReplyTo,
        tables: Vec<u64>,
        blocks: Vec<Result<Tensor, Status>>,
        ids: Vec<u64>,
        ends: Vec<usize>,
        scales: Vec<Option<LossScale>>,
        convert: bool,
    },
}

/// One table of a `PULL_ROWS` for a handler thread: the table, the block the requester
/// expects (`[n, row...]` of `dtype`), the `n` ids, and whether the rows may be converted
/// into `dtype` (the connection negotiated `ROW_FORMATS`).
pub(crate) struct RowsPull {
    pub table: u32,
    pub dtype: DType,
    pub dims: Vec<u64>,
    pub ids: Vec<u64>,
    pub convert: bool,
}

/// One table's answer from a handler thread: its status, its block when `OK`, and the
/// positions of the rows not found.
pub(crate) struct RowsPulled {
    pub status: Status,
    pub block: Option<Arc<Tensor>>,
    pub missing: Vec<u32>,
}

/// A handler's answer, on its way back to the loop.
pub(crate) enum Answer {
    Pull {
        to: ReplyTo,
        results: Vec<Result<Arc<Tensor>, Status>>,
    },
    Push {
        to: ReplyTo,
        statuses: Vec<Status>,
    },
    PullRows {
        to: ReplyTo,
        tables: Vec<RowsPulled>,
    },
    /// A checkpoint's manifest, or why it failed (from the upkeep thread).
    Checkpoint {
        to: ReplyTo,
        result: Result<Vec<u8>, (Status, String)>,
    },
}

impl Answer {
    /// Where it goes.
    pub(crate) fn to(&self) -> ReplyTo {
        match self {
            Answer::Pull { to, .. }
            | Answer::Push { to, .. }
            | Answer::PullRows { to, .. }
            | Answer::Checkpoint { to, .. } => *to,
        }
    }
}

/// Where handler threads hand answers back: the loop that serves the connection.
pub(crate) trait AnswerSink: Send + Sync {
    /// Hands `answer` to the loop and wakes it.
    fn post_answer(&self, answer: Answer);
}

/// The handler threads.
pub(crate) struct HandlerPool {
    jobs: Option<SyncSender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl HandlerPool {
    /// `n` threads running `service`, answering through `loops`.
    pub(crate) fn start<S: AnswerSink + 'static>(
        n: usize,
        service: SharedService,
        loops: Vec<Arc<S>>,
    ) -> std::io::Result<HandlerPool> {
        let loops: Vec<Arc<dyn AnswerSink>> = loops
            .into_iter()
            .map(|l| l as Arc<dyn AnswerSink>)
            .collect();
        // Bounded: when handlers fall behind, requests are refused (RESOURCE_EXHAUSTED)
        // instead of queueing without limit.
        let (tx, rx) = sync_channel::<Job>(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let rx = rx.clone();
            let service = service.clone();
            let loops = loops.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("starwire-handler-{i}"))
                    .spawn(move || work(&rx, &*service, &loops))?,
            );
        }
        Ok(HandlerPool {
            jobs: Some(tx),
            threads,
        })
    }

    /// A sender for the loops.
    pub(crate) fn sender(&self) -> Option<SyncSender<Job>> {
        self.jobs.clone()
    }

    /// Stops the threads once the queued jobs are done.
    pub(crate) fn stop(&mut self) {
        self.jobs = None;
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                log::error!("a starwire handler thread panicked");
            }
        }
    }
}

impl Drop for HandlerPool {
    fn drop(&mut self) {
        self.stop();
    }
}

fn work(
    rx: &Mutex<Receiver<Job>>,
    service: &dyn crate::service::Service,
    loops: &[Arc<dyn AnswerSink>],
) {
    loop {
        let job = {
            let rx = rx.lock().unwrap_or_else(|p| p.into_inner());
            rx.recv()
        };
        let Ok(job) = job else {
            return; // every sender is gone: the runtime stopped
        };
        let answer = run(job, service);
        let to = answer.to();
        match loops.get(to.loop_index) {
            Some(l) => l.post_answer(answer),
            None => log::error!("handler pool: no loop {}", to.loop_index),
        }
    }
}

/// Runs one job against the service.
pub(crate) fn run(job: Job, service: &dyn crate::service::Service) -> Answer {
    match job {
        Job::Pull { to, ids } => {
            let mut results = Vec::with_capacity(ids.len());
            crate::service::pull(service, &ids, &mut results);
            Answer::Pull { to, results }
        }
        Job::Push {
            to,
            ids,
            mut results,
        } => {
            let mut statuses = Vec::new();
            let scratch = &mut PushScratch::default();
            apply_push(service, &ids, &mut results, &mut statuses, scratch);
            Answer::Push { to, statuses }
        }
        Job::PullRows { to, tables } => Answer::PullRows {
            to,
            tables: tables.iter().map(|t| pull_rows(service, t)).collect(),
        },
        Job::PushRows {
            to,
            tables,
            blocks,
            ids,
            ends,
            scales,
            convert,
        } => {
            let mut wide = Vec::new();
            let statuses = tables
                .iter()
                .zip(&blocks)
                .enumerate()
                .map(|(i, (&table, block))| {
                    let start = if i == 0 { 0 } else { ends[i - 1] };
                    let scale = scales.get(i).copied().flatten();
                    match (block, ids.get(start..ends[i])) {
                        (Ok(b), Some(ids)) => {
                            let grads = Grads {
                                block: b,
                                scale,
                                convert,
                            };
                            apply_rows(service, table as u32, ids, grads, &mut wide)
                        }
                        (Ok(_), None) => Status::Internal,
                        (Err(s), _) => *s,
                    }
                })
                .collect();
            Answer::Push { to, statuses }
        }
    }
}

/// Pulls one table's rows into a block of their own.
fn pull_rows(service: &dyn Service, t: &RowsPull) -> RowsPulled {
    let failed = |status| RowsPulled {
        status,
        block: None,
        missing: Vec::new(),
    };
    let dims = t.dims.iter().copied();
    let table = match table_for(service, t.table, t.dtype, dims, t.convert) {
        Ok(table) => table,
        Err(status) => return failed(status),
    };
    let Ok(mut block) = Tensor::zeros(t.dtype, &t.dims) else {
        return failed(Status::ResourceExhausted);
    };
    let mut missing = Vec::new();
    let status = pull_as(
        table,
        &t.ids,
        t.dtype,
        block.bytes_mut(),
        &mut missing,
        &mut Vec::new(),
    );
    if !status.is_ok() {
        return failed(status);
    }
    if !missing_is_ordered(&missing, t.ids.len()) {
        log::warn!(
            "table {} reported missing rows out of order or range",
            t.table
        );
        return failed(Status::Internal);
    }
    RowsPulled {
        status,
        block: Some(Arc::new(block)),
        missing,
    }
}

/// Whether a table's report of missing rows is increasing and within its `n` rows.
pub(crate) fn missing_is_ordered(missing: &[u32], n: usize) -> bool {
    missing.windows(2).all(|w| w[0] < w[1]) && missing.iter().all(|&p| (p as usize) < n)
}

/// Whether a table of `held` rows serves a block of `asked` rows: the same dtype, or, on a
/// connection that negotiated `ROW_FORMATS` (`convert`), two of f32, bf16 and f16
/// (`docs/wire-format.md` 4.9).
pub(crate) fn serves_as(held: DType, asked: DType, convert: bool) -> bool {
    held == asked || (convert && crate::float::convertible(held, asked))
}

/// The table `table` names, checked against the block the request expects of it: `dtype`
/// rows (or, with `convert`, rows that convert into `dtype`) shaped like `dims` after its
/// first (the row count).
pub(crate) fn table_for(
    service: &dyn Service,
    table: u32,
    dtype: DType,
    mut dims: impl Iterator<Item = u64>,
    convert: bool,
) -> Result<&dyn Table, Status> {
    let t = service.table(table).ok_or(Status::NotFound)?;
    let rows = dims.next();
    let dims_match = rows.is_some() && t.row_dims().iter().copied().eq(dims);
    if !serves_as(t.dtype(), dtype, convert) || !dims_match {
        return Err(Status::InvalidArgument);
    }
    Ok(t)
}

/// Pulls the rows of `ids` from `table` into `out`, rows of `wire` elements: straight when
/// that is the table's dtype, else into `wide` (the table's rows, grown as needed and
/// kept) and converted, rounded to nearest even. A panic of the table: `INTERNAL`.
pub(crate) fn pull_as(
    table: &dyn Table,
    ids: &[u64],
    wire: DType,
    out: &mut [u8],
    missing: &mut Vec<u32>,
    wide: &mut Vec<u8>,
) -> Status {
    let held = table.dtype();
    let pull = |out: &mut [u8], missing: &mut Vec<u32>| {
        crate::panic::guarded("Table::pull", || table.pull(ids, out, missing))
            .unwrap_or(Status::Internal)
    };
    if held == wire {
        return pull(out, missing);
    }
    let Some(n) = ids.len().checked_mul(table.row_bytes()) else {
        return Status::InvalidArgument;
    };
    if wide.len() < n {
        wide.resize(n, 0);
    }
    let status = pull(&mut wide[..n], missing);
    if !status.is_ok() {
        return status;
    }
    match crate::float::convert(held, &wide[..n], wire, out, None) {
        Ok(()) => Status::Ok,
        Err(_) => Status::InvalidArgument,
    }
}

/// One table's gradient block of a `PUSH_ROWS` as it arrived: its loss scale, and whether
/// the connection negotiated `ROW_FORMATS` (`convert`).
pub(crate) struct Grads<'a> {
    pub block: &'a Tensor,
    pub scale: Option<LossScale>,
    pub convert: bool,
}

/// Applies one table's gradient block of a `PUSH_ROWS`: straight when it is of the table's
/// dtype and has no loss scale, else converted into `wide` (the table's dtype, grown as
/// needed and kept), each element multiplied by the f32 nearest `1 / loss_scale`.
pub(crate) fn apply_rows(
    service: &dyn Service,
    table: u32,
    ids: &[u64],
    grads: Grads<'_>,
    wide: &mut Vec<u8>,
) -> Status {
    let meta = grads.block.meta();
    let table = match table_for(service, table, meta.dtype, meta.dims.iter(), grads.convert) {
        Ok(t) => t,
        Err(status) => return status,
    };
    let held = table.dtype();
    let bytes = grads.block.bytes();
    let push = |g: &[u8]| {
        crate::panic::guarded("Table::push", || table.push(ids, g)).unwrap_or(Status::Internal)
    };
    if held == meta.dtype && grads.scale.is_none() {
        return push(bytes);
    }
    let Some(n) = ids.len().checked_mul(table.row_bytes()) else {
        return Status::InvalidArgument;
    };
    if wide.len() < n {
        wide.resize(n, 0);
    }
    let mul = grads.scale.map(LossScale::reciprocal);
    match crate::float::convert(meta.dtype, bytes, held, &mut wide[..n], mul) {
        Ok(()) => push(&wide[..n]),
        Err(_) => Status::InvalidArgument,
    }
}

/// Vectors a push is applied with, kept between pushes so that applying one allocates
/// nothing.
#[derive(Default)]
pub(crate) struct PushScratch {
    ok: Vec<(u64, Tensor)>,
    positions: Vec<usize>,
    got: Vec<Status>,
}

/// Hands the items that arrived (variable `ids[i]`, `results[i]`) to the service; items
/// that failed keep their status. One status per item goes into `statuses` (emptied
/// first); `results` is left empty.
pub(crate) fn apply_push(
    service: &dyn crate::service::Service,
    ids: &[u64],
    results: &mut Vec<Result<Tensor, Status>>,
    statuses: &mut Vec<Status>,
    scratch: &mut PushScratch,
) {
    let PushScratch { ok, positions, got } = scratch;
    statuses.clear();
    statuses.resize(results.len(), Status::Ok);
    ok.clear();
    positions.clear();
    got.clear();
    for (pos, (&id, item)) in ids.iter().zip(results.drain(..)).enumerate() {
        match item {
            Ok(t) => {
                ok.push((id, t));
                positions.push(pos);
            }
            Err(s) => statuses[pos] = s,
        }
    }
    if !ok.is_empty() {
        if crate::panic::guarded("Service::push", || service.push(ok, got)).is_none() {
            got.clear();
        }
        for (k, &pos) in positions.iter().enumerate() {
            statuses[pos] = got.get(k).copied().unwrap_or(Status::Internal);
        }
    }
    ok.clear();
}
