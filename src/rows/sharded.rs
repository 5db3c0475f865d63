//! The sharded rows client: one table partitioned over the PS tasks of a cluster, pulled
//! and pushed a batch at a time with one request per PS in flight at once.

use std::sync::Arc;
use std::time::Instant;

use arrayvec::ArrayVec;

use super::element::{self, RowElement};
use super::plan::{Partition, Plan, PlanError};
use super::travel::{check_block, check_unique_buffers, checked_scale, remote, widened};
use crate::client::{Client, Mode};
use crate::cluster::Peer;
use crate::error::{Error, ErrorKind};
use crate::session::{Rows, MAX_ROW_RANK};
use crate::tensor::Tensor;
use crate::wire::{DType, LossScale, Status};

/// A table partitioned over PS tasks, seen from a worker: each step's ids are deduplicated,
/// spread over the PS tasks by a [`Partition`], sent as one rows request per PS (all in
/// flight at once), and the answers scattered into the caller's `[batch, row]` buffer with
/// duplicates filled; a push sums the gradients of duplicate ids before sending.
///
/// After the first steps (once its vectors have grown to the largest batch), a step
/// allocates nothing in the client but the blocks the answers land in.
///
/// # Rows in another float format on the wire
///
/// The rows of an f32, bf16 or f16 table may travel as any of the three
/// ([`set_wire_dtype`](Self::set_wire_dtype); by default as the table's dtype): a pull
/// asks the PS for rows in that format (it rounds them to nearest even) and they are
/// widened into the caller's rows; a push's gradients are summed in the table's dtype,
/// then narrowed as they are sent, with the loss scale they were multiplied by
/// ([`set_loss_scale`](Self::set_loss_scale)), which the PS divides out. A PS whose
/// handshake did not announce `row_formats` (an earlier release, or
/// `STARWIRE_WIRE_FEATURES=none`) is sent and answers rows in the table's dtype instead
/// (the loss scale divided out before sending): the step is served all the same, the log
/// says so once per connection, and [`StepReport::fallbacks`] counts such parts of a pull.
///
/// # A PS that cannot be reached
///
/// A step's part for a PS that is down fails alone, in [`StepReport::shards`], with the
/// error naming the PS (`could not connect to ps:1 (10.0.0.2:5555) after 9 attempts over
/// 2.6 s: connection refused`); the other parts' rows are written. The requests of a step
/// are in flight at once, so dead PS tasks cost a step the time of one, not one each —
/// but, with no deadline, that is the whole connect-retry schedule, every step (each
/// step tries the PS again): with the defaults (`STARWIRE_CONNECT_RETRIES` 8,
/// `STARWIRE_CONNECT_BACKOFF_MS` 10) about 2.55 s when nothing listens at the PS's
/// address, 5 s (`STARWIRE_HANDSHAKE_TIMEOUT_MS`) when its host does not answer, and
/// never more than 47.55 s ([`Config::connect_give_up_bound`](crate::Config::connect_give_up_bound)).
/// Give steps a `deadline` to bound them: a part whose PS is still being connected to at
/// the deadline fails with [`ErrorKind::Timeout`] saying so (`deadline exceeded while
/// connecting to ps:1 (...): connection refused (attempt 3)`). See
/// [`Client`](crate::Client#unreachable-peers).
///
/// [`pull`](Self::pull) and [`push`](Self::push) take the rows as bytes (little-endian
/// elements, `row_bytes` per row); [`pull_typed`](Self::pull_typed) and
/// [`push_typed`](Self::push_typed) take them as elements of the table's dtype (`&mut
/// [f32]` for an f32 table):
///
/// ```no_run
/// # use starwire::{rows::Partition, DType, Handle, Peer, Sharded};
/// # fn step(h: &mut Handle, peers: Vec<Peer>) -> Result<(), starwire::Error> {
/// const DIM: usize = 16;
/// let mut table = Sharded::new(peers, Partition::Mod, 7, DType::F32, &[DIM as u64])?;
/// // Rows travel as bfloat16 both ways (half the bytes of f32); `rows` stays f32.
/// table.set_wire_dtype(DType::BF16)?;
/// let ids = [3u64, 9, 3];
/// let mut rows = vec![0f32; ids.len() * DIM];
/// let report = table.pull_typed(h, &ids, &mut rows, None)?;
/// assert!(report.is_ok());
/// let grads = vec![0.5f32; ids.len() * DIM];
/// table.push_typed(h, &ids, &grads, None)?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Sharded {
    plan: Plan,
    peers: Vec<Peer>,
    table: u32,
    dtype: DType,
    row_dims: ArrayVec<u64, MAX_ROW_RANK>,
    row_bytes: usize,
    /// Per PS, in this step: `None` when it has no ids, else the tag of its request in
    /// flight or why the request could not be submitted.
    tags: Vec<Option<Result<u64, Error>>>,
    /// Per PS, the block its merged gradients are sent from, by reference: written again
    /// by the next push once the connection has let go of it (built by the first push).
    blocks: Vec<Arc<Tensor>>,
    /// Per PS, in this push: `None` when its rows are in its block, else where they are in
    /// `merged`.
    placed: Vec<Option<usize>>,
    /// Merged gradients of the PS tasks whose block a connection still holds (the write of
    /// the last push not yet reported to its loop), one after the other: copied when sent.
    /// Room for every PS's is kept, so that this never allocates in steady state.
    merged: Vec<u8>,
    /// The last step's report (kept, so that a step allocates nothing for it).
    report: StepReport,
    /// The bytes of a typed step's rows (grown to the largest batch, then reused).
    typed: Vec<u8>,
    /// The dtype rows travel as, and the loss scale pushes are sent with.
    wire: DType,
    loss_scale: Option<LossScale>,
    /// A block that travelled in another dtype, widened into the table's (reused).
    wide: Vec<u8>,
    /// Per PS, in a unique pull: where its distinct ids start among all (reused).
    starts: Vec<usize>,
}

/// What a sharded step did, per PS.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StepReport {
    /// Per PS (in the order given): `Ok` with its rows count, or why its part failed.
    pub shards: Vec<Result<usize, Error>>,
    /// Distinct ids the step sent.
    pub unique: usize,
    /// Rows of the batch that the PS tasks did not have (left zero in the output).
    pub missing: usize,
    /// PS parts of a pull whose rows travelled in the table's dtype although another wire
    /// dtype was set: the PS did not announce `row_formats`.
    pub fallbacks: usize,
}

impl StepReport {
    /// The first failed PS part, if any: its position in the PS list and its error.
    pub fn first_error(&self) -> Option<(usize, &Error)> {
        self.shards
            .iter()
            .enumerate()
            .find_map(|(i, r)| r.as_ref().err().map(|e| (i, e)))
    }

    /// Whether every PS part succeeded.
    pub fn is_ok(&self) -> bool {
        self.shards.iter().all(Result::is_ok)
    }
}

impl Sharded {
    /// Table `table` (rows of `dtype` and shape `row_dims`) partitioned over `peers` (PS
    /// task `i` holds the ids `partition` maps to `i`).
    pub fn new(
        peers: Vec<Peer>,
        partition: Partition,
        table: u32,
        dtype: DType,
        row_dims: &[u64],
    ) -> Result<Sharded, Error> {
        let plan = Plan::new(peers.len(), partition).map_err(|e| Error::invalid(&e.to_string()))?;
        let mut dims = ArrayVec::new();
        dims.try_extend_from_slice(row_dims)
            .map_err(|_| Error::invalid("rows: too many row dimensions"))?;
        let row_bytes = Rows::new(table, dtype, row_dims, &[])
            .row_bytes()
            .filter(|&b| b > 0 && b <= usize::MAX as u64)
            .ok_or_else(|| Error::invalid("rows: unknown dtype or empty row"))?;
        Ok(Sharded {
            tags: vec![None; peers.len()],
            plan,
            peers,
            table,
            dtype,
            row_dims: dims,
            row_bytes: row_bytes as usize,
            blocks: Vec::new(),
            placed: Vec::new(),
            merged: Vec::new(),
            report: StepReport::default(),
            typed: Vec::new(),
            wire: dtype,
            loss_scale: None,
            wide: Vec::new(),
            starts: Vec::new(),
        })
    }

    /// Rows travel as `wire` from now on: the table's dtype, or for an f32, bf16 or f16
    /// table any of the three (see [Rows in another float format on the
    /// wire](Self#rows-in-another-float-format-on-the-wire)). The caller's rows stay in
    /// the table's dtype. [`ErrorKind::InvalidArgument`] for another dtype.
    pub fn set_wire_dtype(&mut self, wire: DType) -> Result<(), Error> {
        if wire != self.dtype && !crate::float::convertible(self.dtype, wire) {
            return Err(Error::invalid(&format!(
                "rows: table {} holds {} rows, which travel as they are or, for f32, bf16 \
                 and f16 rows, as one of those; not as {}",
                self.table,
                self.dtype.name(),
                wire.name()
            )));
        }
        self.wire = wire;
        Ok(())
    }

    /// The dtype rows travel as.
    pub fn wire_dtype(&self) -> DType {
        self.wire
    }

    /// Pushes from now on say their gradients were multiplied by `scale` (a loss scale,
    /// [`LossScale::MIN`] to [`LossScale::MAX`]), which the PS divides out (multiplying
    /// by the f32 nearest `1 / scale`, exact for powers of two) before applying them;
    /// `None`: no scale. For f32, bf16 and f16 tables; [`ErrorKind::InvalidArgument`]
    /// otherwise or for a scale out of range.
    pub fn set_loss_scale(&mut self, scale: Option<f32>) -> Result<(), Error> {
        self.loss_scale = checked_scale(self.table, self.dtype, scale)?;
        Ok(())
    }

    /// The loss scale pushes are sent with.
    pub fn loss_scale(&self) -> Option<f32> {
        self.loss_scale.map(LossScale::get)
    }

    /// Points the client at a new list of PS tasks (after
    /// [`Runtime::update_cluster`](crate::Runtime::update_cluster): a task moved, or tasks
    /// were added or removed), keeping its table, row shape and partition strategy. With
    /// as many PS as before, every id stays on its shard; with another number the ids are
    /// partitioned over the new list, and moving the rows to their new shards is the
    /// service's business. Fails, changing nothing, on an empty list or one the partition
    /// cannot spread ids over.
    pub fn set_peers(&mut self, peers: Vec<Peer>) -> Result<(), Error> {
        let plan = Plan::new(peers.len(), self.plan.partition())
            .map_err(|e| Error::invalid(&e.to_string()))?;
        self.tags.clear();
        self.tags.resize(peers.len(), None);
        self.plan = plan;
        self.peers = peers;
        Ok(())
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// The PS tasks, in shard order.
    pub fn peers(&self) -> &[Peer] {
        &self.peers
    }

    /// The plan of the last step: which ids went to which PS.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    fn check(&mut self, ids: &[u64], buf: &[u8], what: &str) -> Result<(), Error> {
        if buf.len() != ids.len() * self.row_bytes {
            return Err(Error::invalid(what));
        }
        self.plan
            .build(ids)
            .map_err(|e| Error::invalid(&e.to_string()))
    }

    /// Pulls the rows of `ids` (duplicates allowed) into `out`, `ids.len() × row_bytes`
    /// bytes, row `i` for `ids[i]`. Rows a PS does not have are left zero and counted in
    /// the report. A PS that fails fails its part alone: the rows of the others are written
    /// and the report says which failed. `Err` only for invalid arguments.
    pub fn pull<M: Mode>(
        &mut self,
        client: &mut Client<M>,
        ids: &[u64],
        out: &mut [u8],
        deadline: Option<Instant>,
    ) -> Result<&StepReport, Error> {
        self.check(ids, out, "rows: out is not ids.len() x row_bytes bytes")?;
        self.pull_planned(client, deadline, |plan, s, rows, rb| {
            plan.scatter(s, rows, rb, &mut *out)
        })
    }

    /// Pulls the rows of the distinct ids of `ids` (duplicates allowed) once each, for a
    /// caller that builds its batch from them itself (an embedding lookup over `[unique,
    /// row]`): writes the distinct ids into `unique` and their rows into `out` (row `j`
    /// for `unique[j]`), and for each position `i` of the batch the index of its id in
    /// `unique` into `inverse[i]`. `unique` and `out` have room for `ids.len()` ids and
    /// rows (as many as there may be distinct ones); the report's
    /// [`unique`](StepReport::unique) says how many were written. The distinct ids are in
    /// the order of their PS tasks, each PS's in the order first seen in `ids`. Rows a PS
    /// does not have are left zero and counted in the report (by batch position, as
    /// [`pull`](Self::pull) counts them); a failed PS fails its part alone, as in `pull`,
    /// its ids in `unique` and `inverse` all the same and its rows in `out` zero.
    ///
    /// The deduplication is the one every step does (a hash of the batch's ids), so this
    /// costs no more than `pull`, and copies each distinct row once (one copy per PS).
    /// `Err` only for invalid arguments (nothing sent).
    pub fn pull_unique<M: Mode>(
        &mut self,
        client: &mut Client<M>,
        ids: &[u64],
        inverse: &mut [i64],
        unique: &mut [u64],
        out: &mut [u8],
        deadline: Option<Instant>,
    ) -> Result<&StepReport, Error> {
        let rb = self.row_bytes;
        let lens = (inverse.len(), unique.len(), out.len());
        check_unique_buffers(self.table, ids.len(), rb, lens)?;
        self.plan
            .build(ids)
            .map_err(|e| Error::invalid(&e.to_string()))?;
        // Where each PS's distinct ids start among all of them.
        let mut starts = std::mem::take(&mut self.starts);
        starts.clear();
        let mut at = 0;
        for s in 0..self.peers.len() {
            let part = self.plan.ids(s);
            unique[at..at + part.len()].copy_from_slice(part);
            starts.push(at);
            at += part.len();
        }
        for (pos, inv) in inverse.iter_mut().enumerate() {
            let (s, row) = self.plan.slot(pos).unwrap_or((0, 0));
            *inv = (starts[s] + row) as i64;
        }
        let done = self
            .pull_planned(client, deadline, |_, s, rows, rb| {
                let start = starts[s] * rb;
                out[start..start + rows.len()].copy_from_slice(rows);
                Ok(())
            })
            .map(|_| ());
        // A failed PS's rows are zeroed: the buffer's old bytes would be rows of other ids
        // (the distinct ids' places change every step).
        for (s, part) in self.report.shards.iter().enumerate() {
            if part.is_err() {
                let (a, n) = (starts[s] * rb, self.plan.ids(s).len() * rb);
                out[a..a + n].fill(0);
            }
        }
        self.starts = starts;
        done?;
        Ok(&self.report)
    }

    /// Sends the planned batch's requests and lands each PS's rows (its block, in the
    /// order of its ids, in the table's dtype) with `land`.
    fn pull_planned<M: Mode>(
        &mut self,
        client: &mut Client<M>,
        deadline: Option<Instant>,
        mut land: impl FnMut(&Plan, usize, &[u8], usize) -> Result<(), PlanError>,
    ) -> Result<&StepReport, Error> {
        client.begin_step();
        for s in 0..self.peers.len() {
            let ids = self.plan.ids(s);
            self.tags[s] = None;
            if ids.is_empty() {
                continue;
            }
            let rows = Rows::new(self.table, self.dtype, &self.row_dims, ids).travel_as(self.wire);
            self.tags[s] = Some(
                client
                    .pull_rows(self.peers[s], &[rows], deadline)
                    .map(|t| t.tag()),
            );
        }
        client.end_step();
        let mut report = std::mem::take(&mut self.report);
        report.shards.clear();
        report.unique = self.plan.unique_len();
        report.missing = 0;
        report.fallbacks = 0;
        for s in 0..self.peers.len() {
            let n = self.plan.ids(s).len();
            let tag = match self.tags[s].take() {
                None => {
                    report.shards.push(Ok(0));
                    continue;
                }
                Some(Err(e)) => {
                    report.shards.push(Err(e));
                    continue;
                }
                Some(Ok(tag)) => tag,
            };
            let part = client.wait_tag(tag).and_then(|c| {
                let r = match c.rows() {
                    Ok(rows) => match rows.block(0) {
                        Ok(block) => {
                            report.missing += self.plan.missing_positions(s, rows.missing(0));
                            if self.wire != self.dtype && block.dtype() == self.dtype {
                                report.fallbacks += 1;
                            }
                            let (plan, rb) = (&self.plan, self.row_bytes);
                            widened(self.dtype, block, &mut self.wide).and_then(|bytes| {
                                check_block(bytes, n, rb)?;
                                land(plan, s, bytes, rb)
                                    .map(|()| n)
                                    .map_err(|e| Error::invalid(&e.to_string()))
                            })
                        }
                        Err(status) => Err(remote(status, self.peers[s])),
                    },
                    Err(e) => Err(e),
                };
                client.recycle(c);
                r
            });
            report.shards.push(part);
        }
        self.report = report;
        Ok(&self.report)
    }

    /// Pushes the gradient rows `grads` of `ids` (`ids.len() × row_bytes` bytes, row `i` for
    /// `ids[i]`): the gradients of duplicate ids are summed (f32 and f64 rows), then each PS
    /// gets its distinct ids and their summed rows, all PS requests in flight at once. A PS
    /// that fails fails its part alone, as in [`pull`](Self::pull).
    ///
    /// The summed rows are written into a block per PS that is sent from its own memory
    /// ([`Client::push_rows_shared`]): they are not copied again on the way out. The blocks
    /// are written again by the next push; one the connection still holds then (its write
    /// not yet reported to the loop when the answer came) is left alone, and that PS's rows
    /// are summed into memory kept for that and copied when sent, so a step allocates
    /// nothing either way once the blocks have grown to the largest batch.
    pub fn push<M: Mode>(
        &mut self,
        client: &mut Client<M>,
        ids: &[u64],
        grads: &[u8],
        deadline: Option<Instant>,
    ) -> Result<&StepReport, Error> {
        self.check(ids, grads, "rows: grads is not ids.len() x row_bytes bytes")?;
        let rb = self.row_bytes;
        let peers = self.peers.len();
        if self.blocks.len() != peers {
            self.blocks = (0..peers)
                .map(|_| Arc::new(Tensor::dead(DType::U8)))
                .collect();
            self.placed = vec![None; peers];
        }
        self.merged.clear();
        self.merged.reserve(self.plan.unique_len() * rb);
        for s in 0..peers {
            let len = self.plan.ids(s).len() * rb;
            self.placed[s] = None;
            if len == 0 {
                continue;
            }
            let out = match Arc::get_mut(&mut self.blocks[s]) {
                Some(block) => {
                    if !block.reuse_as_bytes(len) {
                        // Room to grow: batches vary in distinct ids from step to step.
                        *block = Tensor::zeros(DType::U8, &[len.next_power_of_two() as u64])
                            .map_err(|e| Error::invalid(&e.to_string()))?;
                        block.reuse_as_bytes(len);
                    }
                    block.bytes_mut()
                }
                None => {
                    let at = self.merged.len();
                    self.placed[s] = Some(at);
                    self.merged.resize(at + len, 0);
                    &mut self.merged[at..]
                }
            };
            self.plan
                .merge(s, self.dtype, grads, rb, out)
                .map_err(|e| Error::invalid(&e.to_string()))?;
        }
        let mut report = std::mem::take(&mut self.report);
        report.shards.clear();
        report.unique = self.plan.unique_len();
        report.missing = 0;
        client.begin_step();
        for s in 0..peers {
            let ids = self.plan.ids(s);
            self.tags[s] = None;
            if ids.is_empty() {
                continue;
            }
            let rows = Rows::new(self.table, self.dtype, &self.row_dims, ids)
                .travel_as(self.wire)
                .scaled_by(self.loss_scale);
            let submitted = match self.placed[s] {
                None => {
                    let block = self.blocks[s].clone();
                    client.push_rows_shared(self.peers[s], &[(rows, block)], deadline)
                }
                Some(at) => {
                    let block = &self.merged[at..at + ids.len() * rb];
                    client.push_rows(self.peers[s], &[(rows, block)], deadline)
                }
            };
            self.tags[s] = Some(submitted.map(|t| t.tag()));
        }
        client.end_step();
        for s in 0..self.peers.len() {
            let n = self.plan.ids(s).len();
            let tag = match self.tags[s].take() {
                None => {
                    report.shards.push(Ok(0));
                    continue;
                }
                Some(Err(e)) => {
                    report.shards.push(Err(e));
                    continue;
                }
                Some(Ok(tag)) => tag,
            };
            let part = client.wait_tag(tag).and_then(|c| {
                let r = match c.pushed() {
                    Ok([Status::Ok]) => Ok(n),
                    Ok([status]) => Err(remote(*status, self.peers[s])),
                    Ok(_) => Err(Error::new(ErrorKind::Protocol)),
                    Err(e) => Err(e),
                };
                client.recycle(c);
                r
            });
            report.shards.push(part);
        }
        self.report = report;
        Ok(&self.report)
    }

    /// [`pull`](Self::pull) into rows of elements: `out` holds `ids.len()` rows of the
    /// table's dtype (`T` must be it: `f32` for an `F32` table), row `i` for `ids[i]`.
    /// The rows arrive as bytes into a buffer this client keeps and are converted into
    /// `out`, so like `pull` a step allocates nothing once that buffer has grown to the
    /// largest batch. Unlike `pull`, the rows of a PS that failed are left zero too. Another `T`, or an `out` that is not whole rows for `ids`:
    /// [`ErrorKind::InvalidArgument`] before anything is sent.
    pub fn pull_typed<T: RowElement, M: Mode>(
        &mut self,
        client: &mut Client<M>,
        ids: &[u64],
        out: &mut [T],
        deadline: Option<Instant>,
    ) -> Result<&StepReport, Error> {
        let bytes = element::typed_len::<T>(
            self.table,
            self.dtype,
            self.row_bytes,
            ids,
            out.len(),
            "out",
        )?;
        let mut buf = std::mem::take(&mut self.typed);
        buf.clear();
        buf.resize(bytes, 0);
        let pulled = self.pull(client, ids, &mut buf, deadline).map(|_| ());
        if pulled.is_ok() {
            element::decode(&buf, out);
        }
        self.typed = buf;
        pulled.map(|()| &self.report)
    }

    /// [`push`](Self::push) of gradient rows of elements: `grads` holds `ids.len()` rows
    /// of the table's dtype (`T` must be it), row `i` for `ids[i]`; duplicates summed as
    /// by `push` (f32 and f64 rows). Converted into bytes in a buffer this client keeps:
    /// no allocation in steady state. Another `T`, or `grads` that are not whole rows for
    /// `ids`: [`ErrorKind::InvalidArgument`] before anything is sent.
    pub fn push_typed<T: RowElement, M: Mode>(
        &mut self,
        client: &mut Client<M>,
        ids: &[u64],
        grads: &[T],
        deadline: Option<Instant>,
    ) -> Result<&StepReport, Error> {
        let bytes = element::typed_len::<T>(
            self.table,
            self.dtype,
            self.row_bytes,
            ids,
            grads.len(),
            "grads",
        )?;
        let mut buf = std::mem::take(&mut self.typed);
        buf.clear();
        buf.resize(bytes, 0);
        element::encode(grads, &mut buf);
        let pushed = self.push(client, ids, &buf, deadline).map(|_| ());
        self.typed = buf;
        pushed.map(|()| &self.report)
    }
}
