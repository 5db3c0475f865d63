//! How rows travel between a worker and the PS tasks: as packed rows blocks through the
//! sharded rows client (the default), through the pipelined rows client (`--pipeline`:
//! the next batch's rows requested while this one computes, pushes not waited for), as one
//! tensor per row in a fused request per PS task (`--per-tensor`), or as a request per row
//! (`--unfused`). [`Worker`] pulls a step's rows and pushes its gradients whichever way was
//! chosen, and counts the rows it moved.

use crate::model;
use crate::ps::TABLE;
use crate::Res;
use starwire::rows::{Partition, PipelineSettings};
use starwire::{Completion, DType, Handle, Peer, Pipeline, Runtime, Sharded, Status, Tensor};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a worker's rows travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transfer {
    /// `PULL_ROWS` and `PUSH_ROWS` through the sharded rows client: one frame per PS task
    /// and step each way, the rows in one packed block.
    Rows,
    /// Fused `PULL` and `PUSH`: one request per PS task and step, one tensor per row.
    PerTensor,
    /// One `PULL` and one `PUSH` per row.
    Unfused,
    /// `PULL_ROWS` and `PUSH_ROWS` through the pipelined rows client: the next batch's
    /// rows requested while this one computes, pushes answered in the background, the
    /// rows a step uses missing at most `staleness` of the worker's own latest pushes.
    Pipelined { staleness: u32 },
}

impl Transfer {
    pub fn describe(self) -> &'static str {
        match self {
            Transfer::Rows => {
                "as rows: one PULL_ROWS and one PUSH_ROWS frame per PS task and step, \
                 one packed block of rows each"
            }
            Transfer::PerTensor => {
                "per tensor, fused: one request per PS task and step, a tensor per row"
            }
            Transfer::Unfused => "per tensor, unfused: one request per row",
            Transfer::Pipelined { .. } => {
                "pipelined as rows: the next batch's PULL_ROWS sent while this one computes, \
                 PUSH_ROWS not waited for"
            }
        }
    }

    /// A short name, for the comparison's columns.
    pub fn name(self) -> String {
        match self {
            Transfer::Rows => "synchronous".into(),
            Transfer::PerTensor => "per tensor".into(),
            Transfer::Unfused => "unfused".into(),
            Transfer::Pipelined { staleness } => format!("pipelined s={staleness}"),
        }
    }
}

/// A worker's connection to the PS tasks, and the buffers its steps reuse.
pub struct Worker {
    handle: Handle,
    ps: Vec<SocketAddr>,
    dim: usize,
    transfer: Transfer,
    /// The rows client (`Transfer::Rows`, and the evaluation): the model's table over the
    /// PS tasks.
    sharded: Sharded,
    /// The pipelined rows client (`Transfer::Pipelined`), and whether it has requested
    /// the rows of a batch whose step has not run.
    pipeline: Option<Pipeline>,
    ahead: bool,
    /// A step's rows or gradients as little-endian bytes (`Transfer::Rows`).
    bytes: Vec<u8>,
    /// Per PS task: the ids it owns in this batch, and their positions in `batch.unique`.
    ids: Vec<Vec<u64>>,
    positions: Vec<Vec<u32>>,
    /// Per PS task: the gradient tensors pushed last step, reused once the push is done.
    grads: Vec<Vec<(u64, Arc<Tensor>)>>,
    /// Requests sent since the counts were last taken (not counted here with the
    /// pipeline: see `report.rs`).
    pub pull_rpcs: u64,
    pub push_rpcs: u64,
    /// Rows received and gradient rows sent since the counts were last taken, as they
    /// crossed the wire (distinct ids per PS request).
    pub rows_pulled: u64,
    pub rows_pushed: u64,
    /// With the pipeline: PS parts of pulls whose request a prefetch had sent before the
    /// pull was called, and those requested again because the rows the prefetch had asked
    /// for were too stale when used.
    pub prefetched: u64,
    pub refetched: u64,
    /// With the pipeline's row cache: distinct rows of the steps served from it, not
    /// pulled, since the counts were last taken; and distinct rows it held too old to
    /// serve, named in a versioned pull and answered unchanged by the PS (their bytes did
    /// not travel: not in `rows_pulled`).
    pub cache_hits: u64,
    pub rows_unchanged: u64,
}

/// How a worker's rows blocks travel and what it keeps: the wire dtype (`None`: the
/// table's f32) and, with the pipeline, the bytes of its row cache (0: none).
#[derive(Clone, Copy, Debug, Default)]
pub struct RowsOptions {
    pub wire: Option<DType>,
    pub cache: usize,
}

const DEADLINE: Duration = Duration::from_secs(10);
const UNFUSED_WINDOW: usize = 64;

/// The PS requests a rows step sent (one per PS task that owns some of the ids), or the
/// first PS task's part that failed.
fn rows_step(report: &starwire::StepReport, what: &str) -> Res<u64> {
    if let Some((s, e)) = report.first_error() {
        return Err(format!("{what} rows, ps:{s}: {e}"));
    }
    if report.missing > 0 {
        return Err(format!("{what} rows: {} rows missing", report.missing));
    }
    Ok(report
        .shards
        .iter()
        .filter(|r| matches!(r, Ok(n) if *n > 0))
        .count() as u64)
}

impl Worker {
    /// A worker's transport to the PS tasks at `ps` (task 0 first): a handle of `rt` and
    /// the rows client of table [`TABLE`], rows of `dim` f32, travelling and kept as
    /// `options` say.
    pub fn new(
        rt: &Runtime,
        ps: Vec<SocketAddr>,
        dim: usize,
        transfer: Transfer,
        options: RowsOptions,
    ) -> Res<Worker> {
        if ps.len() > 64 {
            return Err("at most 64 PS tasks".into());
        }
        let shards = ps.len();
        let peers: Vec<Peer> = ps.iter().map(|&a| Peer::from(a)).collect();
        let mut sharded = Sharded::new(
            peers.clone(),
            Partition::Hash,
            TABLE,
            DType::F32,
            &[dim as u64],
        )
        .map_err(|e| e.to_string())?;
        if let Some(wire) = options.wire {
            sharded.set_wire_dtype(wire).map_err(|e| e.to_string())?;
        }
        let mut in_flight = UNFUSED_WINDOW.max(shards) * 2;
        let pipeline = match transfer {
            Transfer::Pipelined { staleness } => {
                let settings = pipeline_settings(staleness, options);
                let pushes = settings.pushes_in_flight_bound() as usize;
                // The pipeline's requests: its pushes in flight and a pull, per PS task.
                in_flight = in_flight.max((pushes + 1) * shards);
                let p = Pipeline::new(
                    peers,
                    Partition::Hash,
                    TABLE,
                    DType::F32,
                    &[dim as u64],
                    settings,
                );
                Some(p.map_err(|e| e.to_string())?)
            }
            _ => None,
        };
        Ok(Worker {
            handle: rt.handle(in_flight),
            ps,
            dim,
            transfer,
            sharded,
            pipeline,
            ahead: false,
            bytes: Vec::new(),
            ids: vec![Vec::new(); shards],
            positions: vec![Vec::new(); shards],
            grads: vec![Vec::new(); shards],
            pull_rpcs: 0,
            push_rpcs: 0,
            rows_pulled: 0,
            rows_pushed: 0,
            prefetched: 0,
            refetched: 0,
            cache_hits: 0,
            rows_unchanged: 0,
        })
    }

    /// Whether the steps go through the pipelined client.
    pub fn is_pipelined(&self) -> bool {
        self.pipeline.is_some()
    }

    /// A training step's pull of the rows of `unique` into `rows`: the pipeline takes the
    /// rows its prefetch requested (waiting only for what has not arrived, and for the
    /// pushes the staleness bound says they must reflect); the other ways pull now.
    pub fn step_pull(&mut self, unique: &[u64], rows: &mut [f32]) -> Res<()> {
        let Some(p) = &mut self.pipeline else {
            return self.pull(unique, rows);
        };
        self.ahead = false;
        let r = p
            .pull_typed(&mut self.handle, unique, rows)
            .map_err(|e| format!("pull rows: {e}"))?;
        if r.missing > 0 {
            return Err(format!("pull rows: {} rows missing", r.missing));
        }
        Ok(())
    }

    /// With the pipeline: requests the rows of the next step's batch `next` now, if the
    /// staleness bound allows (else a later call sends them). Nothing otherwise.
    pub fn step_prefetch(&mut self, next: &[u64]) -> Res<()> {
        if let Some(p) = &mut self.pipeline {
            p.prefetch(&mut self.handle, next)
                .map_err(|e| format!("prefetch rows: {e}"))?;
            self.ahead = true;
        }
        Ok(())
    }

    /// A training step's push of the gradient rows `grads`: the pipeline returns without
    /// waiting for the PS tasks to answer; the other ways wait.
    pub fn step_push(&mut self, unique: &[u64], grads: &[f32]) -> Res<()> {
        let Some(p) = &mut self.pipeline else {
            return self.push(unique, grads);
        };
        let r = p
            .push_typed(&mut self.handle, unique, grads)
            .map_err(|e| format!("push rows: {e}"))?;
        // The step's report: the rows its pull received and its push sent.
        self.rows_pulled += r.rows_received as u64;
        self.rows_pushed += r.rows_sent as u64;
        self.prefetched += r.prefetched as u64;
        self.refetched += r.refetched as u64;
        self.cache_hits += r.cache_hits as u64;
        self.rows_unchanged += r.rows_unchanged as u64;
        Ok(())
    }

    /// The held-out evaluation reads the model as the PS holds it: rows in f32, whatever
    /// the training's wire dtype.
    pub fn evaluate_in_f32(&mut self) -> Res<()> {
        self.sharded
            .set_wire_dtype(DType::F32)
            .map_err(|e| e.to_string())
    }

    /// Ends training. With the pipeline: waits until every push has been answered, and
    /// takes the rows requested for `next`, a step that will not run (they crossed the
    /// wire, so they are counted). Nothing otherwise.
    pub fn finish(&mut self, next: &[u64], rows: &mut Vec<f32>) -> Res<()> {
        let Some(p) = &mut self.pipeline else {
            return Ok(());
        };
        p.flush(&mut self.handle)
            .map_err(|e| format!("flush pushes: {e}"))?;
        if std::mem::take(&mut self.ahead) {
            rows.resize(next.len() * self.dim, 0.0);
            let r = p
                .pull_typed(&mut self.handle, next, &mut rows[..])
                .map_err(|e| format!("pull rows: {e}"))?;
            self.rows_pulled += r.rows_received as u64;
            self.prefetched += r.prefetched as u64;
            self.refetched += r.refetched as u64;
            self.cache_hits += r.cache_hits as u64;
            self.rows_unchanged += r.rows_unchanged as u64;
        }
        Ok(())
    }

    /// Pulls the rows of `unique` into `rows` (`dim` f32 each, in `unique` order), now
    /// and synchronously (the evaluation's pulls, and the steps of every way but the
    /// pipeline's).
    pub fn pull(&mut self, unique: &[u64], rows: &mut [f32]) -> Res<()> {
        self.rows_pulled += unique.len() as u64;
        if matches!(self.transfer, Transfer::Rows | Transfer::Pipelined { .. }) {
            return self.pull_rows(unique, rows);
        }
        for (s, (ids, pos)) in self.ids.iter_mut().zip(&mut self.positions).enumerate() {
            ids.clear();
            pos.clear();
            for (i, &id) in unique.iter().enumerate() {
                if model::shard_of(id, self.ps.len()) == s {
                    ids.push(id);
                    pos.push(i as u32);
                }
            }
        }
        let deadline = Some(Instant::now() + DEADLINE);
        if self.transfer == Transfer::Unfused {
            return self.pull_unfused(unique, rows, deadline);
        }
        let mut tags = [0u64; 64];
        for (s, ids) in self.ids.iter().enumerate() {
            tags[s] = self
                .handle
                .pull_slice(self.ps[s], ids, deadline)
                .map_err(|e| format!("pull: {e}"))?
                .tag();
            self.pull_rpcs += 1;
        }
        for (s, &tag) in tags.iter().enumerate().take(self.ps.len()) {
            let done = self
                .handle
                .wait_tag(tag)
                .map_err(|e| format!("wait: {e}"))?;
            // Borrowed, so the completion's vectors go back to the handle for the next step.
            let tensors = done
                .pulled()
                .map_err(|e| format!("pull from ps:{s}: {e}"))?;
            for (t, &at) in tensors.iter().zip(&self.positions[s]) {
                let t = t.as_ref().map_err(|st| format!("pull: row {st:?}"))?;
                copy_row(t, &mut rows[at as usize * self.dim..][..self.dim])?;
            }
            self.handle.recycle(done);
        }
        Ok(())
    }

    /// The rows client's pull: one `PULL_ROWS` per PS task, all in flight at once, each
    /// answered with one block that lands in `bytes` in the order of `unique`.
    fn pull_rows(&mut self, unique: &[u64], rows: &mut [f32]) -> Res<()> {
        self.bytes.resize(rows.len() * 4, 0);
        let deadline = Some(Instant::now() + DEADLINE);
        let report = self
            .sharded
            .pull(&mut self.handle, unique, &mut self.bytes, deadline)
            .map_err(|e| format!("pull rows: {e}"))?;
        self.pull_rpcs += rows_step(report, "pull")?;
        f32s_from_le(&self.bytes, rows);
        Ok(())
    }

    /// The rows client's push: one `PUSH_ROWS` per PS task with its ids' gradient rows.
    fn push_rows(&mut self, unique: &[u64], grads: &[f32]) -> Res<()> {
        self.bytes.resize(grads.len() * 4, 0);
        f32s_to_le(grads, &mut self.bytes);
        let deadline = Some(Instant::now() + DEADLINE);
        let report = self
            .sharded
            .push(&mut self.handle, unique, &self.bytes, deadline)
            .map_err(|e| format!("push rows: {e}"))?;
        self.push_rpcs += rows_step(report, "push")?;
        Ok(())
    }

    fn pull_unfused(
        &mut self,
        unique: &[u64],
        rows: &mut [f32],
        deadline: Option<Instant>,
    ) -> Res<()> {
        let mut next = 0;
        let mut inflight = std::collections::HashMap::new();
        while next < unique.len() || !inflight.is_empty() {
            while next < unique.len() && inflight.len() < UNFUSED_WINDOW {
                let id = unique[next];
                let peer = self.ps[model::shard_of(id, self.ps.len())];
                let ticket = self.handle.pull_slice(peer, &[id], deadline);
                inflight.insert(ticket.map_err(|e| format!("pull: {e}"))?.tag(), next);
                self.pull_rpcs += 1;
                next += 1;
            }
            let done = self.handle.wait_any().map_err(|e| format!("wait: {e}"))?;
            let at = inflight
                .remove(&done.tag)
                .ok_or("completion of an unknown request")?;
            match done.pulled().map_err(|e| format!("pull: {e}"))? {
                [t] => {
                    let t = t.as_ref().map_err(|st| format!("pull: row {st:?}"))?;
                    copy_row(t, &mut rows[at * self.dim..][..self.dim])?;
                }
                other => return Err(format!("pull of one row: {} answers", other.len())),
            }
            self.handle.recycle(done);
        }
        Ok(())
    }

    /// Pushes the gradient rows `grads` (`dim` f32 each, in `unique` order), waiting for
    /// the answers.
    pub fn push(&mut self, unique: &[u64], grads: &[f32]) -> Res<()> {
        self.rows_pushed += unique.len() as u64;
        if matches!(self.transfer, Transfer::Rows | Transfer::Pipelined { .. }) {
            return self.push_rows(unique, grads);
        }
        let deadline = Some(Instant::now() + DEADLINE);
        let dim = self.dim;
        // Fill the gradient tensors, reusing last step's where the runtime let go of them.
        for (s, pos) in self.positions.iter().enumerate() {
            let items = &mut self.grads[s];
            items.truncate(pos.len());
            for (n, &at) in pos.iter().enumerate() {
                let values = &grads[at as usize * dim..][..dim];
                let id = unique[at as usize];
                if n == items.len() {
                    items.push((
                        id,
                        Arc::new(Tensor::zeros(DType::F32, &[dim as u64]).unwrap()),
                    ));
                }
                let item = &mut items[n];
                item.0 = id;
                if Arc::get_mut(&mut item.1).is_none() {
                    item.1 = Arc::new(Tensor::zeros(DType::F32, &[dim as u64]).unwrap());
                }
                let bytes = Arc::get_mut(&mut item.1).unwrap().bytes_mut();
                for (b, v) in bytes.chunks_exact_mut(4).zip(values) {
                    b.copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        if self.transfer == Transfer::Unfused {
            return self.push_unfused(deadline);
        }
        let mut tags = [0u64; 64];
        for (s, tag) in tags.iter_mut().enumerate().take(self.ps.len()) {
            *tag = self
                .handle
                .push_slice(self.ps[s], &self.grads[s], deadline)
                .map_err(|e| format!("push: {e}"))?
                .tag();
            self.push_rpcs += 1;
        }
        for (s, &tag) in tags.iter().enumerate().take(self.ps.len()) {
            let done = self
                .handle
                .wait_tag(tag)
                .map_err(|e| format!("wait: {e}"))?;
            check_pushed(&done, s)?;
            self.handle.recycle(done);
        }
        Ok(())
    }

    fn push_unfused(&mut self, deadline: Option<Instant>) -> Res<()> {
        let mut inflight = 0;
        for s in 0..self.ps.len() {
            for n in 0..self.grads[s].len() {
                if inflight == UNFUSED_WINDOW {
                    let done = self.handle.wait_any().map_err(|e| format!("wait: {e}"))?;
                    check_pushed(&done, s)?;
                    self.handle.recycle(done);
                    inflight -= 1;
                }
                let item = std::slice::from_ref(&self.grads[s][n]);
                // Its completion is taken by `wait_any`, in whatever order they finish.
                let queued = self.handle.push_slice(self.ps[s], item, deadline);
                let _ticket = queued.map_err(|e| format!("push: {e}"))?;
                self.push_rpcs += 1;
                inflight += 1;
            }
        }
        for _ in 0..inflight {
            let done = self.handle.wait_any().map_err(|e| format!("wait: {e}"))?;
            check_pushed(&done, 0)?;
            self.handle.recycle(done);
        }
        Ok(())
    }
}

/// The pipeline's settings for staleness `staleness`: as many pushes in flight as the
/// bound lets the rows miss (at least 2, so that a push rarely waits at staleness 0 and 1),
/// each request given [`DEADLINE`], rows travelling and cached as `options` say.
pub fn pipeline_settings(staleness: u32, options: RowsOptions) -> PipelineSettings {
    let max = starwire::rows::MAX_PUSHES_IN_FLIGHT;
    PipelineSettings::default()
        .staleness(staleness)
        .max_pushes_in_flight(staleness.clamp(2, max))
        .timeout(Some(DEADLINE))
        .wire_dtype(options.wire)
        .cache_bytes(options.cache)
}

fn copy_row(t: &Tensor, out: &mut [f32]) -> Res<()> {
    if t.dtype() != DType::F32 || t.byte_len() != out.len() * 4 {
        return Err(format!(
            "pull: a row of {} bytes, {:?}",
            t.byte_len(),
            t.dtype()
        ));
    }
    for (v, b) in out.iter_mut().zip(t.bytes().chunks_exact(4)) {
        *v = f32::from_le_bytes(b.try_into().unwrap());
    }
    Ok(())
}

fn check_pushed(done: &Completion, s: usize) -> Res<()> {
    match done.pushed() {
        Ok(st) if st.iter().all(|s| *s == Status::Ok) => Ok(()),
        Ok(st) => Err(format!("push to ps:{s}: {st:?}")),
        Err(e) => Err(format!("push to ps:{s}: {e}")),
    }
}

/// Reads little-endian f32s from `bytes` into `out`.
pub fn f32s_from_le(bytes: &[u8], out: &mut [f32]) {
    for (v, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// Writes `values` into `bytes` as little-endian f32s.
pub fn f32s_to_le(values: &[f32], bytes: &mut [u8]) {
    for (b, v) in bytes.chunks_exact_mut(4).zip(values) {
        b.copy_from_slice(&v.to_le_bytes());
    }
}
