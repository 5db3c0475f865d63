//! Several tables partitioned over the same PS tasks, pulled and pushed together: each
//! step sends every PS one rows request carrying all the tables' ids it holds.

use std::time::Instant;

use arrayvec::ArrayVec;

use super::plan::{Partition, Plan, PlanError};
use super::sharded::StepReport;
use super::travel::{
    check_block, check_unique_buffers, check_unique_counts, checked_scale, remote, widened,
};
use crate::client::{Client, Mode};
use crate::cluster::Peer;
use crate::error::Error;
#[cfg(doc)]
use crate::error::ErrorKind;
use crate::session::{Rows, MAX_ROW_RANK};
use crate::wire::{DType, LossScale, Status};

/// Most tables a [`ShardedTables`] holds (the tables of one request to a PS are gathered
/// on the stack).
pub const MAX_TABLES: usize = 64;

/// One table of a [`ShardedTables`]: its id on the PS tasks, its rows' dtype and shape,
/// and how its ids are spread over the PS tasks.
#[derive(Debug, Clone, Copy)]
pub struct TableShape<'a> {
    /// The table, as the PS tasks number their tables.
    pub table: u32,
    /// The rows' element type.
    pub dtype: DType,
    /// The shape of one row.
    pub row_dims: &'a [u64],
    /// How the table's ids are spread over the PS tasks.
    pub partition: Partition,
}

#[derive(Debug)]
struct Table {
    table: u32,
    dtype: DType,
    row_dims: ArrayVec<u64, MAX_ROW_RANK>,
    row_bytes: usize,
    plan: Plan,
    wire: DType,
    loss_scale: Option<LossScale>,
}

/// Several tables partitioned over the same PS tasks, seen from a worker: a step takes a
/// batch of ids per table, deduplicates and partitions each as
/// [`Sharded`](crate::Sharded) does, and sends each PS **one** rows request carrying every
/// table's ids it holds (the wire's several tables per frame), all PS requests in flight
/// at once; the answers are scattered into the caller's buffers, one per table. A push
/// sums each table's duplicate gradients and sends each PS one request likewise. So a step
/// over `T` tables and `P` PS tasks is at most `P` requests each way, not `T × P`.
///
/// Rows may travel in another float format ([`set_wire_dtype`](Self::set_wire_dtype),
/// [`set_loss_scale`](Self::set_loss_scale)), as for [`Sharded`](crate::Sharded#rows-in-another-float-format-on-the-wire).
/// A PS that fails fails its part alone (every table's rows at that PS), as for
/// `Sharded`. After the first steps a step allocates nothing in this client but the
/// blocks the answers land in.
#[derive(Debug)]
pub struct ShardedTables {
    tables: Vec<Table>,
    peers: Vec<Peer>,
    /// Per PS, in this step: `None` when it has no ids, else the tag of its request in
    /// flight or why it could not be submitted.
    tags: Vec<Option<Result<u64, Error>>>,
    /// Per PS, the tables (positions in `tables`) its request carries, in request order.
    sent: Vec<ArrayVec<u16, MAX_TABLES>>,
    /// Per PS and table of its request, where its merged gradients start in `merged`.
    placed: Vec<ArrayVec<usize, MAX_TABLES>>,
    /// The merged gradients of a push, every PS's tables one after the other.
    merged: Vec<u8>,
    report: StepReport,
    /// A block that travelled in another dtype, widened into the table's (reused).
    wide: Vec<u8>,
    /// Per table and PS, in a unique pull: where the PS's distinct ids start among the
    /// table's (reused).
    starts: Vec<usize>,
}

impl ShardedTables {
    /// The tables `tables` (at least one, at most [`MAX_TABLES`], no table twice),
    /// partitioned over `peers`. [`ErrorKind::InvalidArgument`] for no peers, no tables or
    /// too many, a table named twice, rows of no bytes or an unknown dtype, or too many row
    /// dimensions.
    pub fn new(peers: Vec<Peer>, tables: &[TableShape<'_>]) -> Result<ShardedTables, Error> {
        if tables.is_empty() || tables.len() > MAX_TABLES {
            return Err(Error::invalid(&format!(
                "rows: {} tables; a ShardedTables holds 1 to {MAX_TABLES}",
                tables.len()
            )));
        }
        let mut built = Vec::with_capacity(tables.len());
        for (i, t) in tables.iter().enumerate() {
            if tables[..i].iter().any(|o| o.table == t.table) {
                return Err(Error::invalid(&format!(
                    "rows: table {} is named twice",
                    t.table
                )));
            }
            let plan =
                Plan::new(peers.len(), t.partition).map_err(|e| Error::invalid(&e.to_string()))?;
            let mut row_dims = ArrayVec::new();
            row_dims
                .try_extend_from_slice(t.row_dims)
                .map_err(|_| Error::invalid("rows: too many row dimensions"))?;
            let row_bytes = Rows::new(t.table, t.dtype, t.row_dims, &[])
                .row_bytes()
                .filter(|&b| b > 0 && b <= usize::MAX as u64)
                .ok_or_else(|| {
                    Error::invalid(&format!(
                        "rows: table {}: unknown dtype or empty row",
                        t.table
                    ))
                })?;
            built.push(Table {
                table: t.table,
                dtype: t.dtype,
                row_dims,
                row_bytes: row_bytes as usize,
                plan,
                wire: t.dtype,
                loss_scale: None,
            });
        }
        let n = peers.len();
        Ok(ShardedTables {
            tables: built,
            peers,
            tags: vec![None; n],
            sent: vec![ArrayVec::new(); n],
            placed: vec![ArrayVec::new(); n],
            merged: Vec::new(),
            report: StepReport::default(),
            wide: Vec::new(),
            starts: Vec::new(),
        })
    }

    /// Every table's rows travel as `wire` from now on (see
    /// [`Sharded::set_wire_dtype`](crate::Sharded::set_wire_dtype)); a table whose rows
    /// are `wire` already travels as it is. [`ErrorKind::InvalidArgument`], changing
    /// nothing, when a table's rows do not convert into `wire`.
    pub fn set_wire_dtype(&mut self, wire: DType) -> Result<(), Error> {
        if let Some(t) = self
            .tables
            .iter()
            .find(|t| t.dtype != wire && !crate::float::convertible(t.dtype, wire))
        {
            return Err(Error::invalid(&format!(
                "rows: table {} holds {} rows, which travel as they are or, for f32, bf16 \
                 and f16 rows, as one of those; not as {}",
                t.table,
                t.dtype.name(),
                wire.name()
            )));
        }
        for t in &mut self.tables {
            t.wire = wire;
        }
        Ok(())
    }

    /// The dtype table `i` (in the order given) travels as.
    pub fn wire_dtype(&self, i: usize) -> Option<DType> {
        self.tables.get(i).map(|t| t.wire)
    }

    /// Pushes of every table from now on are sent with loss scale `scale` (see
    /// [`Sharded::set_loss_scale`](crate::Sharded::set_loss_scale)); `None`: none.
    /// [`ErrorKind::InvalidArgument`], changing nothing, for a scale out of range or a
    /// table of rows other than f32, bf16 and f16.
    pub fn set_loss_scale(&mut self, scale: Option<f32>) -> Result<(), Error> {
        let mut checked = None;
        for t in &self.tables {
            checked = checked_scale(t.table, t.dtype, scale)?;
        }
        for t in &mut self.tables {
            t.loss_scale = checked;
        }
        Ok(())
    }

    /// Number of tables.
    pub fn len(&self) -> usize {
        self.tables.len()
    }

    /// Whether it holds no table (never: [`new`](Self::new) refuses that).
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// Bytes of one row of table `i` (in the order given).
    pub fn row_bytes(&self, i: usize) -> Option<usize> {
        self.tables.get(i).map(|t| t.row_bytes)
    }

    /// The PS tasks, in shard order.
    pub fn peers(&self) -> &[Peer] {
        &self.peers
    }

    /// Plans each table's batch, after checking there is one batch and one buffer of
    /// `ids.len() × row_bytes` bytes per table.
    fn plan(&mut self, ids: &[&[u64]], lens: impl Iterator<Item = usize>) -> Result<(), Error> {
        if ids.len() != self.tables.len() {
            return Err(Error::invalid(&format!(
                "rows: {} batches of ids for {} tables",
                ids.len(),
                self.tables.len()
            )));
        }
        let mut given = 0;
        for (i, (t, len)) in self.tables.iter().zip(lens).enumerate() {
            given += 1;
            if len != ids[i].len() * t.row_bytes {
                return Err(Error::invalid(&format!(
                    "rows: table {}: {len} bytes of rows for {} ids of {} bytes",
                    t.table,
                    ids[i].len(),
                    t.row_bytes
                )));
            }
        }
        if given != self.tables.len() {
            return Err(Error::invalid(&format!(
                "rows: {given} buffers for {} tables",
                self.tables.len()
            )));
        }
        for (t, ids) in self.tables.iter_mut().zip(ids) {
            t.plan
                .build(ids)
                .map_err(|e| Error::invalid(&e.to_string()))?;
        }
        Ok(())
    }

    /// Starts the report of a step.
    fn begin_report(&mut self) -> StepReport {
        let mut report = std::mem::take(&mut self.report);
        report.shards.clear();
        report.unique = self.tables.iter().map(|t| t.plan.unique_len()).sum();
        report.missing = 0;
        report.fallbacks = 0;
        report
    }

    /// Pulls the rows of `ids[i]` (duplicates allowed) of each table `i` into `out[i]`
    /// (`ids[i].len() × row_bytes` bytes, row `j` for `ids[i][j]`), with one request per
    /// PS that holds any of the ids. Rows a PS does not have are left zero and counted in
    /// the report (`missing`, over all tables); `fallbacks` counts the tables' blocks that
    /// came back in the table's dtype although another wire dtype was set. A PS that fails
    /// fails its part alone. `Err` only for invalid arguments.
    pub fn pull<M: Mode>(
        &mut self,
        client: &mut Client<M>,
        ids: &[&[u64]],
        out: &mut [&mut [u8]],
        deadline: Option<Instant>,
    ) -> Result<&StepReport, Error> {
        self.plan(ids, out.iter().map(|o| o.len()))?;
        self.pull_planned(client, deadline, |i, t, s, bytes| {
            t.plan.scatter(s, bytes, t.row_bytes, &mut *out[i])
        })
    }

    /// Pulls each distinct id of each table's batch once, as
    /// [`Sharded::pull_unique`](crate::Sharded::pull_unique) does for one table: for table
    /// `i`, its distinct ids into `unique[i]` (grouped by PS, each PS's in the order first
    /// seen), their rows into `out[i]` (row `j` for `unique[i][j]`) and the index in
    /// `unique[i]` of the id at each position of `ids[i]` into `inverse[i]`. `unique[i]`
    /// and `out[i]` have room for `ids[i].len()` ids and rows; the number of distinct ids
    /// of table `i` is [`unique_len(i)`](Self::unique_len) afterwards (the report's
    /// `unique` is the sum). One request per PS for all the tables, as [`pull`](Self::pull);
    /// a failed PS fails its part alone, its rows in `out` zero. `Err` only for invalid
    /// arguments (nothing sent).
    pub fn pull_unique<M: Mode>(
        &mut self,
        client: &mut Client<M>,
        ids: &[&[u64]],
        inverse: &mut [&mut [i64]],
        unique: &mut [&mut [u64]],
        out: &mut [&mut [u8]],
        deadline: Option<Instant>,
    ) -> Result<&StepReport, Error> {
        let lens = [ids.len(), inverse.len(), unique.len(), out.len()];
        check_unique_counts(self.tables.len(), lens, "")?;
        for (i, t) in self.tables.iter().enumerate() {
            let lens = (inverse[i].len(), unique[i].len(), out[i].len());
            check_unique_buffers(t.table, ids[i].len(), t.row_bytes, lens)?;
        }
        for (t, ids) in self.tables.iter_mut().zip(ids) {
            t.plan
                .build(ids)
                .map_err(|e| Error::invalid(&e.to_string()))?;
        }
        // Per table and PS, where the PS's distinct ids start among the table's.
        let peers = self.peers.len();
        let mut starts = std::mem::take(&mut self.starts);
        starts.clear();
        for (i, t) in self.tables.iter().enumerate() {
            let mut at = 0;
            for s in 0..peers {
                let part = t.plan.ids(s);
                unique[i][at..at + part.len()].copy_from_slice(part);
                starts.push(at);
                at += part.len();
            }
            for (pos, inv) in inverse[i].iter_mut().enumerate() {
                let (s, row) = t.plan.slot(pos).unwrap_or((0, 0));
                *inv = (starts[i * peers + s] + row) as i64;
            }
        }
        let done = self
            .pull_planned(client, deadline, |i, t, s, bytes| {
                let start = starts[i * peers + s] * t.row_bytes;
                out[i][start..start + bytes.len()].copy_from_slice(bytes);
                Ok(())
            })
            .map(|_| ());
        // A failed PS's rows are zeroed: the buffers' old bytes would be rows of other ids.
        for (s, part) in self.report.shards.iter().enumerate() {
            if part.is_err() {
                for (i, t) in self.tables.iter().enumerate() {
                    let rb = t.row_bytes;
                    let (a, n) = (starts[i * peers + s] * rb, t.plan.ids(s).len() * rb);
                    out[i][a..a + n].fill(0);
                }
            }
        }
        self.starts = starts;
        done?;
        Ok(&self.report)
    }

    /// Distinct ids of table `i`'s batch in the last step (0 for a table out of range).
    pub fn unique_len(&self, i: usize) -> usize {
        self.tables.get(i).map_or(0, |t| t.plan.unique_len())
    }

    /// Sends the planned batches' requests, one per PS, and lands each table's rows from
    /// each PS (its block in the order of its ids, in the table's dtype, checked to be
    /// those rows) with `land(i, table, ps, bytes)`.
    fn pull_planned<M: Mode>(
        &mut self,
        client: &mut Client<M>,
        deadline: Option<Instant>,
        mut land: impl FnMut(usize, &Table, usize, &[u8]) -> Result<(), PlanError>,
    ) -> Result<&StepReport, Error> {
        client.begin_step();
        for s in 0..self.peers.len() {
            self.tags[s] = None;
            self.sent[s].clear();
            let mut request = ArrayVec::<Rows<'_>, MAX_TABLES>::new();
            for (i, t) in self.tables.iter().enumerate() {
                let ids = t.plan.ids(s);
                if ids.is_empty() {
                    continue;
                }
                request.push(Rows::new(t.table, t.dtype, &t.row_dims, ids).travel_as(t.wire));
                self.sent[s].push(i as u16);
            }
            if request.is_empty() {
                continue;
            }
            self.tags[s] = Some(
                client
                    .pull_rows(self.peers[s], &request, deadline)
                    .map(|t| t.tag()),
            );
        }
        client.end_step();
        let mut report = self.begin_report();
        for s in 0..self.peers.len() {
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
            let (tables, wide, peer) = (&self.tables, &mut self.wide, self.peers[s]);
            let sent = &self.sent[s];
            let part = client.wait_tag(tag).and_then(|c| {
                let r = c.rows().and_then(|rows| {
                    let mut n = 0;
                    for (k, &i) in sent.iter().enumerate() {
                        let t = &tables[i as usize];
                        let block = rows.block(k).map_err(|status| remote(status, peer))?;
                        report.missing += t.plan.missing_positions(s, rows.missing(k));
                        if t.wire != t.dtype && block.dtype() == t.dtype {
                            report.fallbacks += 1;
                        }
                        let bytes = widened(t.dtype, block, wide)?;
                        let rows_here = t.plan.ids(s).len();
                        check_block(bytes, rows_here, t.row_bytes)
                            .map_err(|e| e.with_peer(peer.addr()))?;
                        land(i as usize, t, s, bytes)
                            .map_err(|e| Error::invalid(&e.to_string()))?;
                        n += rows_here;
                    }
                    Ok(n)
                });
                client.recycle(c);
                r
            });
            report.shards.push(part);
        }
        self.report = report;
        Ok(&self.report)
    }

    /// Pushes the gradient rows `grads[i]` of `ids[i]` of each table `i`
    /// (`ids[i].len() × row_bytes` bytes): each table's duplicate gradients summed (f32 and
    /// f64 rows), then each PS gets one request with every table's distinct ids it holds
    /// and their summed rows, all PS requests in flight at once. A PS that fails fails its
    /// part alone, as in [`pull`](Self::pull).
    pub fn push<M: Mode>(
        &mut self,
        client: &mut Client<M>,
        ids: &[&[u64]],
        grads: &[&[u8]],
        deadline: Option<Instant>,
    ) -> Result<&StepReport, Error> {
        if grads.len() != self.tables.len() {
            return Err(Error::invalid(&format!(
                "rows: {} gradient blocks for {} tables",
                grads.len(),
                self.tables.len()
            )));
        }
        self.plan(ids, grads.iter().map(|g| g.len()))?;
        let total: usize = self
            .tables
            .iter()
            .map(|t| t.plan.unique_len() * t.row_bytes)
            .sum();
        self.merged.clear();
        self.merged.resize(total, 0);
        let mut at = 0;
        for s in 0..self.peers.len() {
            self.sent[s].clear();
            self.placed[s].clear();
            for (i, t) in self.tables.iter().enumerate() {
                let len = t.plan.ids(s).len() * t.row_bytes;
                if len == 0 {
                    continue;
                }
                t.plan
                    .merge(
                        s,
                        t.dtype,
                        grads[i],
                        t.row_bytes,
                        &mut self.merged[at..at + len],
                    )
                    .map_err(|e| Error::invalid(&format!("rows: table {}: {e}", t.table)))?;
                self.sent[s].push(i as u16);
                self.placed[s].push(at);
                at += len;
            }
        }
        client.begin_step();
        for s in 0..self.peers.len() {
            self.tags[s] = None;
            if self.sent[s].is_empty() {
                continue;
            }
            let mut request = ArrayVec::<(Rows<'_>, &[u8]), MAX_TABLES>::new();
            for (&i, &at) in self.sent[s].iter().zip(&self.placed[s]) {
                let t = &self.tables[i as usize];
                let ids = t.plan.ids(s);
                let rows = Rows::new(t.table, t.dtype, &t.row_dims, ids)
                    .travel_as(t.wire)
                    .scaled_by(t.loss_scale);
                request.push((rows, &self.merged[at..at + ids.len() * t.row_bytes]));
            }
            self.tags[s] = Some(
                client
                    .push_rows(self.peers[s], &request, deadline)
                    .map(|t| t.tag()),
            );
        }
        client.end_step();
        let mut report = self.begin_report();
        for s in 0..self.peers.len() {
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
            let n: usize = self.sent[s]
                .iter()
                .map(|&i| self.tables[i as usize].plan.ids(s).len())
                .sum();
            let peer = self.peers[s];
            let part = client.wait_tag(tag).and_then(|c| {
                let r = match c.pushed() {
                    Ok(statuses) => match statuses.iter().find(|&&st| st != Status::Ok) {
                        None => Ok(n),
                        Some(&status) => Err(remote(status, peer)),
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
}
