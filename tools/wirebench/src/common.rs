//! What every kind of transport serves and measures: the data, the workloads, the samples.

use std::sync::Mutex;
use std::time::Duration;

use starwire::rows::ps::{Create, Optimizer as PsOptimizer};
use starwire::rows::{Init, MemTable, Optimizer, PsTable};
use starwire::Table;

use crate::model::{ModelConfig, Shard};

/// Bench rows: ids `0..ROWS`, `ROW_BYTES` each, every byte the id's low byte.
pub const ROWS: u64 = 1024;
pub const ROW_BYTES: usize = 64;
/// Ids per pull or push of the small-tensor workloads.
pub const IDS: usize = 100;
/// The id of the one large tensor.
pub const BIG_ID: u64 = 1 << 40;
pub const BIG_BYTES: usize = 4 << 20;
/// Ids with this bit are the training step's model rows.
pub const STEP_BIT: u64 = 1 << 62;
/// Ping payload bytes.
pub const PING_BYTES: usize = 64;
/// Default rows of the embedding table of the rows workloads (`--table-rows`): ids
/// `0..rows`, `ROW_BYTES` each. Row `id` starts with `id` as a little-endian u64 and its
/// other bytes are `id`'s low byte, so that a pulled row shows which id it is. (A table of
/// its own, so that the per-element workloads keep the 1,024 rows they always had.)
pub const TABLE_ROWS: u64 = 1 << 16;
/// Fewest and most `--table-rows`: a request's 1,000 distinct ids, and the most a
/// `PsTable` holds (a power of two, as [`rows_ids`] needs).
pub const MIN_TABLE_ROWS: u64 = 1 << 10;
pub const MAX_TABLE_ROWS: u64 = 1 << 31;
/// f32 lanes of a pushed gradient row.
pub const ROW_F32: usize = ROW_BYTES / 4;

/// Push statuses (as the gRPC reply carries them).
pub const OK: i32 = 0;
pub const NOT_FOUND: i32 = 1;
pub const INVALID: i32 = 7;

/// Which table holds the rows workloads' rows (`--table`), on every kind's server alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableKind {
    /// A plain array of rows: a pull copies them, a push adds gradients into accumulators
    /// beside them (under one lock). Isolates what the transport costs.
    Flat,
    /// starwire's `PsTable`: a hash probe and a copy a row pulled, a read-modify-write (SGD
    /// with learning rate 0, which leaves the rows as they were built, so that pulls can
    /// still be checked) a row pushed.
    Ps,
    /// starwire's small `MemTable`, the same way.
    Mem,
}

impl TableKind {
    pub fn name(self) -> &'static str {
        match self {
            TableKind::Flat => "flat",
            TableKind::Ps => "ps",
            TableKind::Mem => "mem",
        }
    }

    pub const ALL: [TableKind; 3] = [TableKind::Flat, TableKind::Ps, TableKind::Mem];

    pub fn parse(s: &str) -> Option<TableKind> {
        TableKind::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// The rows workloads' table: its kind and its rows (a power of two).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableConfig {
    pub kind: TableKind,
    pub rows: u64,
}

impl TableConfig {
    /// Bytes the table holds: a flat table's rows (and as much again for the push
    /// accumulators, not counted), a `PsTable`'s slots and index, a `MemTable`'s values
    /// and hash entries (about).
    pub fn bytes(&self) -> u64 {
        use starwire_tools::table::{TableKind as Kind, TableSpec};
        let spec = |kind| TableSpec {
            kind,
            dim: ROW_F32,
            ..TableSpec::default()
        };
        let per_row = match self.kind {
            TableKind::Flat => ROW_BYTES as u64,
            TableKind::Ps => spec(Kind::Ps).bytes_per_row(),
            TableKind::Mem => spec(Kind::Mem).bytes_per_row(),
        };
        self.rows * per_row
    }
}

/// The rows of the rows workloads, in the table `--table` names.
enum Rows {
    /// `rows` x `ROW_BYTES`, row after row, and one accumulator row of `ROW_F32` f32 per
    /// table row, which pushed gradient rows are added into (pulls read the table, which
    /// stays as it was built, so that they can be checked).
    Flat {
        table: Vec<u8>,
        grads: Mutex<Vec<f32>>,
    },
    Ps(Box<PsTable>),
    Mem(MemTable),
}

/// The server side's data, the same for every kind.
pub struct Store {
    pub rows: Vec<Vec<u8>>,
    pub big: Vec<u8>,
    pub model: ModelConfig,
    pub shard: Mutex<Shard>,
    /// The rows workloads' table.
    table: Rows,
    table_rows: u64,
}

/// Row `id`'s bytes as `ROW_F32` f32 (the same bits).
fn row_values(id: u64, out: &mut Vec<f32>) {
    let bytes: Vec<u8> = table_row_bytes(id).collect();
    out.extend(
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap())),
    );
}

impl Store {
    pub fn new(table: TableConfig) -> Result<Store, String> {
        let model = ModelConfig::default();
        let n = table.rows;
        let rows = match table.kind {
            TableKind::Flat => Rows::Flat {
                table: (0..n).flat_map(table_row_bytes).collect(),
                grads: Mutex::new(vec![0.0; n as usize * ROW_F32]),
            },
            TableKind::Ps => {
                let t = PsTable::builder(ROW_F32)
                    .table_id(1)
                    .create(Create::Never)
                    .optimizer(PsOptimizer::Sgd { lr: 0.0 })
                    .capacity(n)
                    .max_rows(n)
                    .build()
                    .map_err(|e| e.to_string())?;
                let (mut ids, mut values) = (Vec::new(), Vec::new());
                for first in (0..n).step_by(4096) {
                    ids.clear();
                    values.clear();
                    ids.extend(first..(first + 4096).min(n));
                    for &id in &ids {
                        row_values(id, &mut values);
                    }
                    t.load_rows(&ids, &values, None)
                        .map_err(|e| e.to_string())?;
                }
                Rows::Ps(Box::new(t))
            }
            TableKind::Mem => {
                let t = MemTable::new(ROW_F32, Init::Missing, Optimizer::Sgd { lr: 0.0 });
                let mut values = Vec::new();
                for id in 0..n {
                    values.clear();
                    row_values(id, &mut values);
                    t.insert(id, &values).map_err(|e| e.to_string())?;
                }
                Rows::Mem(t)
            }
        };
        Ok(Store {
            rows: (0..ROWS).map(|i| vec![i as u8; ROW_BYTES]).collect(),
            big: (0..BIG_BYTES).map(|i| (i % 251) as u8).collect(),
            shard: Mutex::new(Shard::new(&model)),
            model,
            table: rows,
            table_rows: n,
        })
    }

    /// The rows of `ids` into `out` (`ROW_BYTES` each); the positions of the ids the
    /// table has no row for are appended to `missing` (their rows are zeros).
    pub fn pull_rows(&self, ids: &[u64], out: &mut [u8], missing: &mut Vec<u32>) {
        match &self.table {
            Rows::Flat { table, .. } => {
                for (i, (&id, row)) in ids.iter().zip(out.chunks_exact_mut(ROW_BYTES)).enumerate() {
                    if id < self.table_rows {
                        let at = id as usize * ROW_BYTES;
                        row.copy_from_slice(&table[at..at + ROW_BYTES]);
                    } else {
                        row.fill(0);
                        missing.push(i as u32);
                    }
                }
            }
            Rows::Ps(t) => {
                let _ = Table::pull(&**t, ids, out, missing);
            }
            Rows::Mem(t) => {
                let _ = Table::pull(t, ids, out, missing);
            }
        }
    }

    /// Calls `each` with the row of every id, in order (`None` for an id the table has no
    /// row for): a flat table's rows where they are, another table's pulled into a block
    /// first. For the transports that carry a row per message field.
    pub fn each_row(&self, ids: &[u64], mut each: impl FnMut(Option<&[u8]>)) {
        if let Rows::Flat { table, .. } = &self.table {
            for &id in ids {
                let at = id as usize * ROW_BYTES;
                each((id < self.table_rows).then(|| &table[at..at + ROW_BYTES]));
            }
            return;
        }
        let mut block = vec![0u8; ids.len() * ROW_BYTES];
        let mut missing = Vec::new();
        self.pull_rows(ids, &mut block, &mut missing);
        let mut missing = missing.iter().peekable();
        for (i, row) in block.chunks_exact(ROW_BYTES).enumerate() {
            let gone = missing.next_if(|&&m| m as usize == i).is_some();
            each((!gone).then_some(row));
        }
    }

    /// [`push_rows`](Self::push_rows) of rows given one by one (a flat table adds them
    /// where they are; another table gets them as one block).
    pub fn push_row_slices(&self, ids: &[u64], rows: &[Vec<u8>], missing: &mut Vec<u32>) {
        match &self.table {
            Rows::Flat { grads, .. } => {
                let rows = ids.iter().copied().zip(rows.iter().map(Vec::as_slice));
                self.add_rows(grads, rows, missing)
            }
            _ => self.push_rows(ids, &rows.concat(), missing),
        }
    }

    /// Applies pushed gradient rows (`ROW_F32` little-endian f32 each, `block` one per
    /// id): added into the accumulators of a flat table, or pushed into the table. The
    /// positions of the rows not applied (an id outside a flat table; a block of the wrong
    /// length: all) are appended to `missing`.
    pub fn push_rows(&self, ids: &[u64], block: &[u8], missing: &mut Vec<u32>) {
        if block.len() != ids.len() * ROW_BYTES {
            missing.extend(0..ids.len() as u32);
            return;
        }
        match &self.table {
            Rows::Flat { grads, .. } => {
                let rows = ids.iter().copied().zip(block.chunks_exact(ROW_BYTES));
                self.add_rows(grads, rows, missing)
            }
            Rows::Ps(t) => {
                let _ = Table::push(&**t, ids, block);
            }
            Rows::Mem(t) => {
                let _ = Table::push(t, ids, block);
            }
        }
    }

    /// Adds gradient rows into a flat table's accumulators, under one lock; the positions
    /// of the rows not applied (an id outside the table, or a row of the wrong size) are
    /// appended to `missing`.
    fn add_rows<'a>(
        &self,
        grads: &Mutex<Vec<f32>>,
        rows: impl IntoIterator<Item = (u64, &'a [u8])>,
        missing: &mut Vec<u32>,
    ) {
        let mut acc = grads.lock().unwrap();
        for (i, (id, bytes)) in rows.into_iter().enumerate() {
            if id >= self.table_rows || bytes.len() != ROW_BYTES {
                missing.push(i as u32);
                continue;
            }
            let at = id as usize * ROW_F32;
            for (a, b) in acc[at..at + ROW_F32].iter_mut().zip(bytes.chunks_exact(4)) {
                *a += f32::from_le_bytes(b.try_into().unwrap());
            }
        }
    }

    /// A bench row or the large tensor.
    pub fn fixed(&self, id: u64) -> Option<&[u8]> {
        match id {
            BIG_ID => Some(&self.big),
            i if i < ROWS => Some(&self.rows[i as usize]),
            _ => None,
        }
    }

    /// A model row as little-endian f32 bytes, appended to `out`.
    pub fn read_model(&self, shard: &Shard, id: u64, out: &mut Vec<u8>) {
        let mut row = [0f32; 64];
        let row = &mut row[..self.model.dim];
        shard.read(id & !STEP_BIT, row);
        for v in row.iter() {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// Applies one pushed tensor: a gradient for a model row, or a bench row (checked and
    /// dropped).
    pub fn push_one<'a>(
        &'a self,
        shard: &mut Option<std::sync::MutexGuard<'a, Shard>>,
        id: u64,
        bytes: &[u8],
    ) -> i32 {
        if id & STEP_BIT != 0 {
            let dim = self.model.dim;
            if bytes.len() != dim * 4 {
                return INVALID;
            }
            let mut grad = [0f32; 64];
            for (g, b) in grad.iter_mut().zip(bytes.chunks_exact(4)) {
                *g = f32::from_le_bytes(b.try_into().unwrap());
            }
            let shard = shard.get_or_insert_with(|| self.shard.lock().unwrap());
            shard.apply(id & !STEP_BIT, &grad[..dim]);
            OK
        } else if id < ROWS {
            if bytes.len() == ROW_BYTES {
                OK
            } else {
                INVALID
            }
        } else {
            NOT_FOUND
        }
    }
}

/// The transports compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Starwire,
    /// gRPC; in the rows workloads one `bytes` per row.
    Grpc,
    /// gRPC with the rows workloads' ids packed and their rows in one `bytes` block (runs
    /// the rows workloads only).
    GrpcPacked,
    Raw,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Starwire => "starwire",
            Kind::Grpc => "grpc",
            Kind::GrpcPacked => "grpc-packed",
            Kind::Raw => "raw",
        }
    }

    pub const ALL: [Kind; 4] = [Kind::Starwire, Kind::Grpc, Kind::GrpcPacked, Kind::Raw];

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// One measured workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Pings of `PING_BYTES`.
    Ping,
    /// Pulls of `IDS` bench rows.
    Pull,
    /// Pushes of `IDS` bench rows.
    Push,
    /// Pulls of the 4 MiB tensor.
    PullBig,
    /// Training steps: draw a batch, pull its rows, compute, push its gradients.
    Step,
    /// Pulls of `Workload::rows` table rows, ids from [`rows_ids`].
    RowsPull,
    /// Pushes of `Workload::rows` gradient rows into the table's accumulators, ids from
    /// [`rows_ids`], rows from [`grad_block`].
    RowsPush,
}

#[derive(Clone, Debug)]
pub struct Workload {
    pub name: String,
    pub op: Op,
    /// Requests in flight (for `Step`: concurrent workers).
    pub inflight: usize,
    /// Connections the load is spread over.
    pub connections: usize,
    /// Rows (ids) per request, for a rows/s rate; 0 where that means nothing.
    pub rows: usize,
    /// Rows of the rows workloads' table, which their ids are drawn from.
    pub table_rows: u64,
}

/// Latencies in nanoseconds: hdrhistogram, 3 significant digits, 1 ns to a day.
#[derive(Clone)]
pub struct Latency(hdrhistogram::Histogram<u64>);

impl Default for Latency {
    fn default() -> Self {
        let h = hdrhistogram::Histogram::new_with_bounds(1, 86_400_000_000_000, 3);
        Latency(h.expect("valid histogram bounds"))
    }
}

impl Latency {
    pub fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.0.saturating_record(ns.max(1));
    }

    pub fn merge(&mut self, other: &Latency) {
        // Same bounds on both sides: adding cannot fail.
        let _ = self.0.add(&other.0);
    }

    pub fn quantile(&self, q: f64) -> Duration {
        Duration::from_nanos(self.0.value_at_quantile(q))
    }
}

/// What one run of one workload over one kind measured.
#[derive(Default, Clone)]
pub struct Sample {
    /// Operations completed (requests, or steps).
    pub ops: u64,
    pub failed: u64,
    pub elapsed: Duration,
    pub latency: Latency,
}

impl Sample {
    pub fn rate(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn merge(&mut self, other: &Sample) {
        self.ops += other.ops;
        self.failed += other.failed;
        self.elapsed = self.elapsed.max(other.elapsed);
        self.latency.merge(&other.latency);
    }
}

/// Checks a pulled bench row or large tensor.
pub fn check_fixed(id: u64, bytes: &[u8]) -> bool {
    match id {
        BIG_ID => bytes.len() == BIG_BYTES && bytes[BIG_BYTES - 1] == ((BIG_BYTES - 1) % 251) as u8,
        i => bytes.len() == ROW_BYTES && bytes[0] == i as u8 && bytes[ROW_BYTES - 1] == i as u8,
    }
}

/// The ids of request number `n` of a small-tensor workload.
pub fn ids_for(n: u64, out: &mut Vec<u64>) {
    out.clear();
    let base = (n * IDS as u64) % ROWS;
    out.extend((0..IDS as u64).map(|i| (base + i) % ROWS));
}

/// The bytes of table row `id` (see [`TABLE_ROWS`]).
pub fn table_row_bytes(id: u64) -> impl Iterator<Item = u8> {
    let head = id.to_le_bytes();
    (0..ROW_BYTES).map(move |i| if i < 8 { head[i] } else { id as u8 })
}

/// Checks a pulled table row.
pub fn check_row(id: u64, bytes: &[u8]) -> bool {
    bytes.len() == ROW_BYTES && bytes[..8] == id.to_le_bytes() && bytes[ROW_BYTES - 1] == id as u8
}

/// The ids of request number `n` of a rows workload: `count` distinct ids of a table of
/// `rows` rows (a power of two, at least 4), a deterministic pseudo-random sample. They are
/// `count` consecutive numbers (from a start drawn from `n`) through a permutation of
/// `0..rows` drawn from `n` (multiplications by odd numbers, xor-shifts and an addition,
/// modulo the table size: each a bijection, so the ids are distinct).
pub fn rows_ids(n: u64, count: usize, rows: u64, out: &mut Vec<u64>) {
    assert!(rows.is_power_of_two() && (4..=1 << 32).contains(&rows));
    assert!(count as u64 <= rows);
    let mask = rows - 1;
    let bits = rows.trailing_zeros();
    // splitmix64 of n, and of that: four draws of up to 32 bits.
    let mix = |x: u64| {
        let mut k = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        k = (k ^ (k >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        k = (k ^ (k >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        k ^ (k >> 31)
    };
    let (k1, k2) = (mix(n), mix(mix(n)));
    let (m1, m2) = ((k1 & mask) | 1, ((k1 >> 32) & mask) | 1);
    let (add, start) = (k2 & mask, (k2 >> 32) & mask);
    out.clear();
    out.extend((0..count as u64).map(|i| {
        let mut x = (start + i) & mask;
        x = x.wrapping_mul(m1) & mask;
        x ^= x >> (bits / 2);
        x = x.wrapping_mul(m2) & mask;
        x ^= x >> (bits / 2 + 1);
        (x + add) & mask
    }));
}

/// The gradient rows a rows-push client sends: `rows` x `ROW_F32` little-endian f32.
pub fn grad_block(rows: usize) -> Vec<u8> {
    (0..rows * ROW_F32)
        .flat_map(|i| (((i % 7) as f32 - 3.0) * 1e-3).to_le_bytes())
        .collect()
}

/// Runs this thread (and the threads it starts later) on CPU `cpu`, when it exists.
pub fn pin(cpu: usize) {
    use nix::sched::{sched_setaffinity, CpuSet};
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut set = CpuSet::new();
    if set.set(cpu % cpus.max(1)).is_ok() {
        let _ = sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
}

/// A training-step worker's state: its data and the buffers its steps reuse. A step is
/// [`next_batch`](Self::next_batch), a pull of [`ids`](Self::ids) into
/// [`rows`](Self::rows), [`compute`](Self::compute), and a push of
/// [`grads`](Self::grads) for the same ids.
pub struct StepWorker {
    pub cfg: ModelConfig,
    gen: crate::model::Generator,
    batch: crate::model::Batch,
    /// The batch's distinct ids, with `STEP_BIT` set: what is pulled and pushed.
    pub ids: Vec<u64>,
    /// `dim` f32 per id, in `ids` order.
    pub rows: Vec<f32>,
    pub grads: Vec<f32>,
    predictions: Vec<f32>,
    scratch: crate::model::Scratch,
    /// Summed loss and examples, to check that training happens.
    pub loss: f64,
    pub examples: u64,
}

impl StepWorker {
    pub fn new(seed: u64) -> StepWorker {
        let cfg = ModelConfig::default();
        StepWorker {
            gen: crate::model::Generator::new(&cfg, seed),
            cfg,
            batch: Default::default(),
            ids: Vec::new(),
            rows: Vec::new(),
            grads: Vec::new(),
            predictions: Vec::new(),
            scratch: Default::default(),
            loss: 0.0,
            examples: 0,
        }
    }

    pub fn next_batch(&mut self) {
        self.gen.next_batch(&mut self.batch);
        self.ids.clear();
        self.ids
            .extend(self.batch.unique.iter().map(|&id| id | STEP_BIT));
        self.rows.resize(self.ids.len() * self.cfg.dim, 0.0);
        self.grads.resize(self.ids.len() * self.cfg.dim, 0.0);
    }

    /// Writes row `i` from little-endian f32 bytes; false if the size is wrong.
    pub fn set_row(&mut self, i: usize, bytes: &[u8]) -> bool {
        let dim = self.cfg.dim;
        if bytes.len() != dim * 4 {
            return false;
        }
        for (v, b) in self.rows[i * dim..(i + 1) * dim]
            .iter_mut()
            .zip(bytes.chunks_exact(4))
        {
            *v = f32::from_le_bytes(b.try_into().unwrap());
        }
        true
    }

    pub fn compute(&mut self) {
        self.loss += crate::model::forward_backward(
            &self.cfg,
            &self.batch,
            &self.rows,
            &mut self.grads,
            &mut self.predictions,
            &mut self.scratch,
        );
        self.examples += self.batch.len() as u64;
    }

    /// Gradient row `i` as little-endian f32 bytes into `out`.
    pub fn grad_bytes(&self, i: usize, out: &mut [u8]) {
        let dim = self.cfg.dim;
        for (b, v) in out
            .chunks_exact_mut(4)
            .zip(&self.grads[i * dim..(i + 1) * dim])
        {
            b.copy_from_slice(&v.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_ids_are_distinct_ids_of_the_table() {
        let mut ids = Vec::new();
        for rows in [1u64 << 10, 1 << 16, 1 << 20] {
            for n in 0..20 {
                rows_ids(n, 1000, rows, &mut ids);
                let distinct: std::collections::HashSet<_> = ids.iter().collect();
                assert_eq!(distinct.len(), 1000, "{rows} rows, request {n}");
                assert!(ids.iter().all(|&id| id < rows));
            }
        }
    }

    #[test]
    fn every_table_kind_holds_the_same_rows_and_keeps_them_through_pushes() {
        for kind in TableKind::ALL {
            let store = Store::new(TableConfig { kind, rows: 1024 }).unwrap();
            let ids = [0u64, 7, 255, 1023, 5000];
            let grads = grad_block(ids.len());
            let mut missing = Vec::new();
            store.push_rows(&ids[..4], &grads[..4 * ROW_BYTES], &mut missing);
            assert!(missing.is_empty(), "{kind:?}");
            let mut out = vec![0xaau8; ids.len() * ROW_BYTES];
            store.pull_rows(&ids, &mut out, &mut missing);
            assert_eq!(missing, [4], "{kind:?}");
            for (i, (&id, row)) in ids.iter().zip(out.chunks_exact(ROW_BYTES)).enumerate() {
                if i < 4 {
                    assert!(check_row(id, row), "{kind:?}: row {id}");
                } else {
                    assert!(row.iter().all(|&b| b == 0), "{kind:?}");
                }
            }
            let mut each = Vec::new();
            store.each_row(&ids, |row| each.push(row.map(<[u8]>::to_vec)));
            assert_eq!(each[1].as_deref(), Some(&out[ROW_BYTES..2 * ROW_BYTES]));
            assert!(each[4].is_none());
        }
    }
}
