//! The inside of a [`Pipeline`]'s calls: what is sent when, what is waited for, and what
//! becomes of each answer.

use std::sync::Arc;
use std::time::Instant;

use arrayvec::ArrayVec;

use super::refresh::Refresh;
use super::report::{failures_error, PipelineReport, PushFailure};
use super::split::{Decision, Source};
use super::{land_unique, place, Landing, Lane, Part, Pipeline};
use crate::client::{Client, Mode};
use crate::cluster::Peer;
use crate::error::{Error, ErrorKind};
use crate::rows::travel::{check_batch_size, widened};
use crate::rows::{Plan, PlanError, MAX_TABLES};
use crate::session::{Completion, PulledRows, Rows, Spare};
use crate::tensor::Tensor;
use crate::wire::{DType, Status};

/// Bytes of an id on the wire.
const ID_BYTES: u64 = 8;

/// Whether `plan` is the plan of the batch `ids` (same ids at the same positions): a pass
/// over the batch, no hashing.
fn is_plan_of(plan: &Plan, ids: &[u64]) -> bool {
    plan.batch_len() == ids.len()
        && ids.iter().enumerate().all(|(pos, &id)| {
            plan.slot(pos)
                .and_then(|(s, row)| plan.ids(s).get(row))
                .is_some_and(|&planned| planned == id)
        })
}

/// Whether `ids` are the distinct ids of `plan`'s batch in its order (by PS, each PS's in
/// the order first seen): what a unique pull gave. A pass over them, no hashing.
fn is_unique_of(plan: &Plan, ids: &[u64]) -> bool {
    if ids.len() != plan.unique_len() {
        return false;
    }
    let mut rest = ids;
    (0..plan.shards()).all(|k| {
        let part = plan.ids(k);
        let (head, tail) = rest.split_at(part.len());
        rest = tail;
        head == part
    })
}

/// Which plan a push's ids are summed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pushed {
    /// The step's batch, as pulled: its plan, by batch position.
    Batch,
    /// The step's distinct ids, as a unique pull gave them: its plan, one row per id.
    Unique,
    /// Other ids, planned anew.
    Other,
}

impl Pushed {
    fn plan(self, lane: &Lane) -> &Plan {
        match self {
            Pushed::Batch | Pushed::Unique => &lane.current,
            Pushed::Other => &lane.other,
        }
    }
}

fn remote(status: Status, peer: Peer) -> Error {
    Error::new(ErrorKind::Remote(status)).with_peer(peer.addr())
}

impl Pipeline {
    /// When a request sent now must be answered by.
    fn deadline(&self) -> Option<Instant> {
        self.settings
            .request_timeout()
            .and_then(|t| Instant::now().checked_add(t))
    }

    fn staleness(&self) -> u64 {
        u64::from(self.settings.staleness_bound())
    }

    /// Pushes that will have been sent when the rows on their way are used: those sent,
    /// and the push of the step in progress if it has not been sent yet.
    fn use_target(&self) -> u64 {
        self.ledger.issued() + u64::from(self.steps > 0 && !self.step_pushed)
    }

    /// Waits for `tag`, the time counted as waited.
    fn wait<M: Mode>(&mut self, client: &mut Client<M>, tag: u64) -> Result<Completion, Error> {
        let t = Instant::now();
        let c = client.wait_tag(tag);
        self.report.waited += t.elapsed();
        c
    }

    /// Takes the answers that have arrived, without waiting: push parts are settled, the
    /// rows of sent pull parts kept.
    fn reap<M: Mode>(&mut self, client: &mut Client<M>) {
        client.gather();
        let peers = self.peers.len();
        for slot in 0..self.ledger.slots() {
            for k in 0..peers {
                if self.ledger.is_pending(slot, k) {
                    if let Some(c) = client.take_tag(self.push_tags[slot * peers + k]) {
                        self.settle_push(slot, k, Ok(c));
                    }
                }
            }
        }
        for k in 0..peers {
            if let Part::Sent { tag, covers } = self.parts[k] {
                if let Some(completion) = client.take_tag(tag) {
                    self.parts[k] = Part::Done { completion, covers };
                }
            }
        }
    }

    /// Records the answer to the part at PS `k` of the push in `slot`.
    fn settle_push(&mut self, slot: usize, k: usize, answer: Result<Completion, Error>) {
        let peer = self.peers[k];
        let at = slot * self.peers.len() + k;
        let outcome = answer.and_then(|c| {
            // One status per table of the request.
            let r = match c.pushed() {
                Ok([]) => Err(Error::new(ErrorKind::Protocol).with_peer(peer.addr())),
                Ok(statuses) => match statuses.iter().position(|&s| s != Status::Ok) {
                    None => Ok(()),
                    // With several tables, the one refused is named.
                    Some(i) => Err(match self.push_tables[at].get(i) {
                        Some(table) if self.lanes.len() > 1 => remote(statuses[i], peer)
                            .with_message(format!(
                                "table {table} refused the push ({:?})",
                                statuses[i]
                            )),
                        _ => remote(statuses[i], peer),
                    }),
                },
                Err(e) => Err(e),
            };
            // Its vectors serve the next push of this slot to this PS.
            self.push_spares[at] = c.into_spare();
            r
        });
        self.ledger.complete(slot, k);
        if let Err(error) = outcome {
            self.failures.push(PushFailure {
                step: self.ledger.step_of(slot),
                shard: k,
                peer,
                error,
            });
        }
    }

    /// Waits for the answer to the part at PS `k` of the push in `slot`.
    fn wait_push<M: Mode>(&mut self, client: &mut Client<M>, slot: usize, k: usize) {
        let tag = self.push_tags[slot * self.peers.len() + k];
        let answer = self.wait(client, tag);
        self.settle_push(slot, k, answer);
    }

    /// Waits for every part of the push in `slot`.
    fn wait_push_all<M: Mode>(&mut self, client: &mut Client<M>, slot: usize) {
        for k in 0..self.peers.len() {
            if self.ledger.is_pending(slot, k) {
                self.wait_push(client, slot, k);
            }
        }
    }

    /// Returns the push failures found as one error, and keeps them for
    /// [`failed_pushes`](Pipeline::failed_pushes).
    pub(super) fn report_failures(&mut self) -> Result<(), Error> {
        if self.failures.is_empty() {
            return Ok(());
        }
        self.reported.clear();
        std::mem::swap(&mut self.failures, &mut self.reported);
        Err(failures_error(&self.reported))
    }

    /// Plans `ids` (a batch per table) as the batch on its way, every part not sent yet.
    fn plan_ahead(&mut self, ids: &[&[u64]]) -> Result<(), Error> {
        for (lane, ids) in self.lanes.iter_mut().zip(ids) {
            if let Err(e) = lane.ahead.build(ids) {
                // Nothing of a batch half planned may go out.
                self.parts.iter_mut().for_each(|p| *p = Part::Empty);
                return Err(Error::invalid(&e.to_string()));
            }
        }
        for k in 0..self.peers.len() {
            self.parts[k] = if self.lanes.iter().all(|l| l.ahead.ids(k).is_empty()) {
                Part::Empty
            } else {
                Part::Deferred
            };
        }
        self.ahead_planned = true;
        Ok(())
    }

    /// Makes `ids` the batch on its way, unless it is already; the one before is dropped.
    fn ensure_ahead<M: Mode>(
        &mut self,
        client: &mut Client<M>,
        ids: &[&[u64]],
    ) -> Result<(), Error> {
        let planned = |lanes: &[Lane]| {
            lanes
                .iter()
                .zip(ids)
                .all(|(l, ids)| is_plan_of(&l.ahead, ids))
        };
        if self.ahead_planned && planned(&self.lanes) {
            return Ok(());
        }
        for k in 0..self.peers.len() {
            self.drop_part(client, k);
        }
        self.ahead_planned = false;
        self.plan_ahead(ids)
    }

    /// Forgets PS `k`'s part of the batch on its way (waiting for it if it is in flight,
    /// so that its answer does not stay in the client); it is to be sent again.
    fn drop_part<M: Mode>(&mut self, client: &mut Client<M>, k: usize) {
        match std::mem::replace(&mut self.parts[k], Part::Deferred) {
            Part::Sent { tag, .. } => {
                if let Ok(c) = self.wait(client, tag) {
                    self.pull_spares[k] = c.into_spare();
                }
            }
            Part::Done { completion, .. } => self.pull_spares[k] = completion.into_spare(),
            Part::Empty => self.parts[k] = Part::Empty,
            Part::Deferred | Part::Cached { .. } | Part::Failed(_) => {}
        }
    }

    /// Sends every part held back that the bound now allows, for rows used after `target`
    /// pushes; a part the row cache serves whole needs no request.
    fn send_allowed<M: Mode>(&mut self, client: &mut Client<M>, target: u64) {
        let s = self.staleness();
        let mut deadline = None;
        for k in 0..self.peers.len() {
            if !matches!(self.parts[k], Part::Deferred) {
                continue;
            }
            let may = self.ledger.may_send(k, target, s);
            match self.decide_part(k, target, may) {
                Decision::Hold => continue,
                Decision::AllCached { oldest } => {
                    self.parts[k] = Part::Cached { covers: oldest };
                    continue;
                }
                Decision::Ask => {}
            }
            let deadline = *deadline.get_or_insert_with(|| self.deadline());
            self.parts[k] = self.send_part(client, k, deadline);
        }
    }

    /// Asks PS `k`, in one request, for the rows of every table's part that the cache
    /// does not serve (all of them without a cache), as
    /// [`decide_part`](Pipeline::decide_part) split them; a table whose part the cache
    /// serves whole, or that has no ids at `k`, is not in the request. It is a versioned
    /// pull (naming the version of each cached row too old to serve, answered without the
    /// bytes of those unchanged) when every table in it travels in its own dtype and the
    /// versions have been paying for themselves.
    fn send_part<M: Mode>(
        &mut self,
        client: &mut Client<M>,
        k: usize,
        deadline: Option<Instant>,
    ) -> Part {
        // The rows served from the cache may be older than those asked for.
        let oldest_hit = self.lanes.iter().map(|l| l.splits[k].oldest_hit()).min();
        let covers = self.ledger.covered(k).min(oldest_hit.unwrap_or(u64::MAX));
        let versioned = self.refresh.names_versions(self.steps)
            && self.lanes.iter().all(|l| {
                l.asked(k).is_empty() || (l.wire == l.dtype && l.splits[k].held().is_some())
            });
        let mut held = std::mem::take(&mut self.held);
        held.clear();
        if versioned {
            for lane in &mut self.lanes {
                lane.stage_held(k, &mut held);
            }
        }
        let mut rows: ArrayVec<Rows<'_>, MAX_TABLES> = ArrayVec::new();
        let mut asked = 0;
        for lane in &self.lanes {
            let ids = lane.asked(k);
            if !ids.is_empty() {
                asked += ids.len() as u64;
                rows.push(
                    Rows::new(lane.table, lane.dtype, &lane.row_dims, ids).travel_as(lane.wire),
                );
            }
        }
        self.report.bytes_sent += ID_BYTES * asked * (1 + u64::from(versioned));
        let spare = std::mem::take(&mut self.pull_spares[k]);
        let peer = self.peers[k];
        let sent = if versioned {
            client.pull_rows_versioned_with(peer, &rows, &held, deadline, spare)
        } else {
            client.pull_rows_with(peer, &rows, deadline, spare)
        };
        self.held = held;
        match sent {
            Ok(t) => Part::Sent {
                tag: t.tag(),
                covers,
            },
            Err(e) => Part::Failed(e.with_peer(peer.addr())),
        }
    }

    pub(super) fn prefetch_step<M: Mode>(
        &mut self,
        client: &mut Client<M>,
        ids: &[&[u64]],
    ) -> Result<(), Error> {
        for ids in ids {
            check_batch_size(ids.len())?;
        }
        self.reap(client);
        self.report_failures()?;
        self.ensure_ahead(client, ids)?;
        self.send_allowed(client, self.use_target());
        // Gets the requests out (an embedded loop runs only when called).
        client.gather();
        Ok(())
    }

    pub(super) fn pull_step<M: Mode>(
        &mut self,
        client: &mut Client<M>,
        ids: &[&[u64]],
        outs: &mut [&mut [u8]],
        landing: Landing,
    ) -> Result<(), Error> {
        self.reap(client);
        self.report_failures()?;
        self.ensure_ahead(client, ids)?;
        if landing == Landing::Unique {
            for lane in &mut self.lanes {
                lane.place_unique();
            }
        }
        // The rows are used now: at most `s` of the pushes sent may be missing.
        let target = self.ledger.issued();
        let s = self.staleness();
        for k in 0..self.peers.len() {
            let covers = match &self.parts[k] {
                Part::Sent { covers, .. } | Part::Done { covers, .. } | Part::Cached { covers } => {
                    *covers
                }
                _ => continue,
            };
            if covers.saturating_add(s) < target {
                self.drop_part(client, k);
                self.report.refetched += 1;
            } else {
                self.report.prefetched += 1;
            }
        }
        // Send what may go; wait for the answers of the pushes that hold the rest back.
        loop {
            self.send_allowed(client, target);
            let Some(k) = (0..self.peers.len()).find(|&k| matches!(self.parts[k], Part::Deferred))
            else {
                break;
            };
            match self.ledger.oldest_at(k) {
                Some(slot) => self.wait_push(client, slot, k),
                // Unreachable: a part is held back only by a push pending at its PS.
                None => return Err(Error::invalid("pipeline: a pull part held back by nothing")),
            }
        }
        self.report_failures()?;
        let step = self.steps;
        let mut failed: Option<(usize, Error)> = None;
        let mut may_miss = 0;
        // The cached rows first: taking the answers inserts rows, which may evict them.
        if let Err(e) = self.serve_cached(outs, landing) {
            failed = Some(e);
        }
        for k in 0..self.peers.len() {
            let (answer, covers) = match std::mem::replace(&mut self.parts[k], Part::Empty) {
                Part::Empty | Part::Deferred => continue,
                Part::Cached { covers } => {
                    may_miss = may_miss.max(target.saturating_sub(covers));
                    continue;
                }
                Part::Sent { tag, covers } => (self.wait(client, tag), covers),
                Part::Done { completion, covers } => (Ok(completion), covers),
                Part::Failed(e) => (Err(e), target),
            };
            may_miss = may_miss.max(target.saturating_sub(covers));
            if let Err(e) = self.take_rows(k, answer, outs, landing) {
                if landing == Landing::Unique {
                    // The distinct ids' places change every step: the buffer's old bytes
                    // there would be rows of other ids.
                    for (lane, out) in self.lanes.iter().zip(outs.iter_mut()) {
                        lane.zero_unique(k, out);
                    }
                }
                failed.get_or_insert((k, e));
            }
        }
        self.ahead_planned = false;
        if let Some((k, e)) = failed {
            let peer = self.peers[k].addr();
            return Err(Error::new(e.kind()).with_peer(peer).with_message(format!(
                "pull of step {step} from PS {k} ({peer}) failed: {e}"
            )));
        }
        let mut unique = 0;
        for lane in &mut self.lanes {
            std::mem::swap(&mut lane.current, &mut lane.ahead);
            unique += lane.current.unique_len();
        }
        self.current_planned = true;
        self.report.unique = unique;
        self.report.may_miss = may_miss;
        self.steps += 1;
        self.step_pushed = false;
        Ok(())
    }

    /// Scatters PS `k`'s answer into `outs`, each table's block into its buffer.
    fn take_rows(
        &mut self,
        k: usize,
        answer: Result<Completion, Error>,
        outs: &mut [&mut [u8]],
        landing: Landing,
    ) -> Result<(), Error> {
        let c = answer?;
        let peer = self.peers[k];
        let r = c.rows().and_then(|rows| {
            let mut at = 0;
            let mut first = Ok(());
            for (lane, out) in self.lanes.iter_mut().zip(outs.iter_mut()) {
                if lane.asked(k).is_empty() {
                    continue;
                }
                let step = self.steps;
                let (report, refresh) = (&mut self.report, &mut self.refresh);
                let taken = lane.take(k, rows, at, (out, landing), report, refresh, step);
                if let Err(e) = taken {
                    let e = if e.peer().is_none() {
                        e.with_peer(peer.addr())
                    } else {
                        e
                    };
                    first = first.and(Err(e));
                }
                at += 1;
            }
            first
        });
        // Its vectors, and the memory of its blocks, serve this PS's next pull.
        self.pull_spares[k] = c.into_spare();
        r
    }

    pub(super) fn push_step<M: Mode>(
        &mut self,
        client: &mut Client<M>,
        ids: &[&[u64]],
        grads: &[&[u8]],
    ) -> Result<(), Error> {
        self.reap(client);
        self.report_failures()?;
        let of_current = |test: fn(&Plan, &[u64]) -> bool| {
            self.current_planned
                && self
                    .lanes
                    .iter()
                    .zip(ids)
                    .all(|(l, ids)| test(&l.current, ids))
        };
        let pushed = if of_current(is_plan_of) {
            Pushed::Batch
        } else if of_current(is_unique_of) {
            for lane in &mut self.lanes {
                place(&mut lane.starts, &lane.current);
            }
            Pushed::Unique
        } else {
            for (lane, ids) in self.lanes.iter_mut().zip(ids) {
                lane.other
                    .build(ids)
                    .map_err(|e| Error::invalid(&e.to_string()))?;
            }
            Pushed::Other
        };
        // Rows on their way are used after this push: parts that may go, go first.
        self.send_allowed(client, self.ledger.issued() + 1);
        // The push `max_pushes_in_flight` before this one must have been answered.
        let slot = self.ledger.next_slot();
        if self.ledger.is_busy(slot) {
            self.wait_push_all(client, slot);
        }
        self.report_failures()?;
        self.sum_gradients(pushed, slot, grads)?;
        let step = self.steps.saturating_sub(1);
        self.ledger.issue(step);
        let deadline = self.deadline();
        let peers = self.peers.len();
        for k in 0..peers {
            let mut ids_sent = 0;
            let mut bytes = 0;
            let mut shared: ArrayVec<(Rows<'_>, Arc<Tensor>), MAX_TABLES> = ArrayVec::new();
            let mut copies: ArrayVec<(Rows<'_>, &[u8]), MAX_TABLES> = ArrayVec::new();
            let in_request = &mut self.push_tables[slot * peers + k];
            in_request.clear();
            for lane in &self.lanes {
                let plan = pushed.plan(lane);
                let ids = plan.ids(k);
                if ids.is_empty() {
                    continue;
                }
                in_request.push(lane.table);
                let rows = Rows::new(lane.table, lane.dtype, &lane.row_dims, ids)
                    .travel_as(lane.wire)
                    .scaled_by(lane.loss_scale);
                let elem = |d: DType| d.size().unwrap_or(1) as usize;
                let wire_rb = lane.row_bytes / elem(lane.dtype) * elem(lane.wire);
                ids_sent += ids.len();
                bytes += (ID_BYTES + wire_rb as u64) * ids.len() as u64;
                if self.copied[k] {
                    let at = lane.placed[k];
                    copies.push((rows, &lane.merged[at..at + ids.len() * lane.row_bytes]));
                } else {
                    shared.push((rows, lane.blocks[slot * peers + k].clone()));
                }
            }
            if ids_sent == 0 {
                continue;
            }
            let peer = self.peers[k];
            let spare: Spare = std::mem::take(&mut self.push_spares[slot * peers + k]);
            let sent = if self.copied[k] {
                client.push_rows_with(peer, &copies, deadline, spare)
            } else {
                client.push_rows_shared_with(peer, &shared, deadline, spare)
            };
            match sent {
                Ok(t) => {
                    self.push_tags[slot * peers + k] = t.tag();
                    self.ledger.add_part(slot, k);
                }
                Err(e) => self.failures.push(PushFailure {
                    step,
                    shard: k,
                    peer,
                    error: e.with_peer(peer.addr()),
                }),
            }
            self.report.rows_sent += ids_sent;
            self.report.bytes_sent += bytes;
        }
        self.step_pushed = true;
        self.send_allowed(client, self.use_target());
        client.gather();
        Ok(())
    }

    /// Sums the gradients of each table's distinct ids at each PS into that table's block
    /// of push slot `slot`, or, for a PS one of whose blocks a connection still holds,
    /// into the tables' `merged` (to be copied when sent: one request carries either).
    fn sum_gradients(&mut self, pushed: Pushed, slot: usize, grads: &[&[u8]]) -> Result<(), Error> {
        let peers = self.peers.len();
        for lane in &mut self.lanes {
            let room = pushed.plan(lane).unique_len() * lane.row_bytes;
            lane.merged.clear();
            lane.merged.reserve(room);
        }
        for k in 0..peers {
            let at = slot * peers + k;
            self.copied[k] = self
                .lanes
                .iter_mut()
                .any(|l| Arc::get_mut(&mut l.blocks[at]).is_none());
            for (lane, grads) in self.lanes.iter_mut().zip(grads) {
                let Lane {
                    current,
                    other,
                    blocks,
                    merged,
                    placed,
                    row_bytes,
                    dtype,
                    starts,
                    ..
                } = lane;
                let plan = match pushed {
                    Pushed::Batch | Pushed::Unique => &*current,
                    Pushed::Other => &*other,
                };
                let len = plan.ids(k).len() * *row_bytes;
                if len == 0 {
                    continue;
                }
                let out = if self.copied[k] {
                    placed[k] = merged.len();
                    merged.resize(placed[k] + len, 0);
                    &mut merged[placed[k]..]
                } else {
                    // Free: checked above.
                    let Some(block) = Arc::get_mut(&mut blocks[at]) else {
                        return Err(Error::invalid("pipeline: a push block still held"));
                    };
                    if !block.reuse_as_bytes(len) {
                        // Room to grow: batches vary in distinct ids from step to step.
                        *block = Tensor::zeros(DType::U8, &[len.next_power_of_two() as u64])
                            .map_err(|e| Error::invalid(&e.to_string()))?;
                        block.reuse_as_bytes(len);
                    }
                    block.bytes_mut()
                };
                if pushed == Pushed::Unique {
                    // One row per distinct id, in the plan's order: nothing to sum.
                    let from = starts[k] * *row_bytes;
                    out[..len].copy_from_slice(&grads[from..from + len]);
                } else {
                    plan.merge(k, *dtype, grads, *row_bytes, out)
                        .map_err(|e| Error::invalid(&e.to_string()))?;
                }
            }
        }
        Ok(())
    }

    /// Waits for every push part in flight, and for the answers of the pull parts sent.
    pub(super) fn flush_all<M: Mode>(&mut self, client: &mut Client<M>) {
        self.reap(client);
        while let Some(slot) = self.ledger.oldest() {
            self.wait_push_all(client, slot);
        }
        for k in 0..self.peers.len() {
            if let Part::Sent { tag, covers } = self.parts[k] {
                self.parts[k] = match self.wait(client, tag) {
                    Ok(completion) => Part::Done { completion, covers },
                    Err(e) => Part::Failed(e),
                };
            }
        }
    }
}

impl Lane {
    /// For a versioned pull of this table's part at PS `k`: appends the versions it names
    /// to `held`, and copies the cache's rows of the ids named into its stage (the rows
    /// answered unchanged are taken from there). Nothing for a table not in the request.
    fn stage_held(&mut self, k: usize, held: &mut Vec<u64>) {
        let Lane {
            ahead,
            splits,
            cache,
            held_rows,
            row_bytes,
            ..
        } = self;
        let split = &splits[k];
        let ids = split.asked().unwrap_or(ahead.ids(k));
        let (Some(versions), Some(cache)) = (split.held(), cache.as_ref()) else {
            return;
        };
        if ids.is_empty() {
            return;
        }
        held.extend_from_slice(versions);
        let rb = *row_bytes;
        let stage = &mut held_rows[k];
        stage.clear();
        stage.resize(ids.len() * rb, 0);
        for ((&id, &version), row) in ids.iter().zip(versions).zip(stage.chunks_exact_mut(rb)) {
            if version != 0 {
                if let Some(slot) = cache.find(id) {
                    row.copy_from_slice(cache.row(slot));
                }
            }
        }
    }

    /// Scatters this table's block, the `at`-th of PS `k`'s answer `rows`, into `out`,
    /// keeps the rows in the cache and counts them in `report` (and, for a versioned
    /// answer, in `refresh`).
    #[allow(clippy::too_many_arguments)]
    fn take(
        &mut self,
        k: usize,
        rows: &PulledRows,
        at: usize,
        (out, landing): (&mut [u8], Landing),
        report: &mut PipelineReport,
        refresh: &mut Refresh,
        step: u64,
    ) -> Result<(), Error> {
        let rb = self.row_bytes;
        let block = match rows.block(at) {
            Ok(block) => block,
            Err(status) => return Err(Error::new(ErrorKind::Remote(status))),
        };
        let Lane {
            ahead,
            splits,
            cache,
            held_rows,
            wide,
            dtype,
            wire,
            starts,
            ..
        } = self;
        let split = &mut splits[k];
        let n = split.asked().map_or(ahead.ids(k).len(), <[u64]>::len);
        let missing = split.missing_in_part(rows.missing(at));
        report.missing += ahead.missing_positions(k, missing);
        let versions = rows.versions(at);
        let unchanged = rows.unchanged_count(at);
        if !versions.is_empty() {
            let named = split
                .held()
                .map_or(0, |h| h.iter().filter(|&&v| v != 0).count());
            refresh.record(step, n, named, n - unchanged, unchanged, rb);
        }
        report.rows_received += n - unchanged;
        report.rows_unchanged += unchanged;
        report.bytes_received += block.byte_len() as u64;
        if *wire != *dtype && block.dtype() == *dtype {
            report.fallbacks += 1;
        }
        let split = &splits[k];
        let stage = &mut held_rows[k];
        // A versioned answer's block holds the rows sent: they go over the cache's copies
        // of the rows named, and the rows answered unchanged keep those.
        let bytes = if versions.is_empty() {
            widened(*dtype, block, wide)?
        } else {
            rows.write_changed(at, stage)
                .map_err(|status| Error::new(ErrorKind::Remote(status)))?;
            &stage[..]
        };
        // Each row asked for, and no more, is in the block.
        if bytes.len() != n * rb {
            return Err(Error::invalid(
                &PlanError::Length {
                    what: "block",
                    expected: n * rb,
                    actual: bytes.len(),
                }
                .to_string(),
            ));
        }
        let row = |i: usize| bytes.get(i * rb..)?.get(..rb);
        let landed = match (landing, split.asked()) {
            (Landing::Batch, None) => ahead.scatter(k, bytes, rb, out),
            (Landing::Batch, Some(_)) => {
                ahead.scatter_each(k, rb, out, |j| match split.source(j) {
                    Some(Source::Wire(i)) => row(i as usize),
                    _ => None,
                })
            }
            (Landing::Unique, None) => land_unique(ahead, starts, k, rb, out, row),
            (Landing::Unique, Some(_)) => {
                land_unique(ahead, starts, k, rb, out, |j| match split.source(j) {
                    Some(Source::Wire(i)) => row(i as usize),
                    _ => None,
                })
            }
        };
        landed.map_err(|e| Error::invalid(&e.to_string()))?;
        if let Some(cache) = cache {
            let before = cache.evictions();
            split.keep(cache, ahead.ids(k), bytes, rb, versions);
            report.cache_evictions += cache.evictions() - before;
            report.cache_misses += n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::Partition;

    #[test]
    fn a_push_by_the_distinct_ids_is_recognized_only_in_the_plans_order() {
        let mut plan = Plan::new(2, Partition::Mod).unwrap();
        plan.build(&[5, 2, 5, 3, 4, 2]).unwrap();
        // By PS (even ids at PS 0), each PS's in the order first seen.
        assert!(is_unique_of(&plan, &[2, 4, 5, 3]));
        assert!(!is_unique_of(&plan, &[2, 3, 4, 5]), "sorted");
        assert!(!is_unique_of(&plan, &[4, 2, 5, 3]), "another order");
        assert!(!is_unique_of(&plan, &[2, 4, 5]), "fewer");
        assert!(!is_unique_of(&plan, &[2, 4, 5, 3, 3]), "more");
        assert!(!is_plan_of(&plan, &[2, 4, 5, 3]), "not the batch");
        let mut starts = [9, 9];
        place(&mut starts, &plan);
        assert_eq!(starts, [0, 2]);
    }
}
