//! [`MemTable`], the first reference table of embedding rows: f32 rows in 64 mutex-guarded
//! shards of a hash map and one vector each. Kept as the baseline the benchmarks measure
//! [`PsTable`](super::PsTable) against.
//!
//! A [`Table`] answers a pull of ids with one packed block of rows and applies a push of
//! gradient rows. Rows travel as raw little-endian bytes with no alignment, `row_bytes`
//! each, in the order of the ids: the layout a worker's [`Plan`](crate::rows::Plan)
//! scatters and merges.
//!
//! ```
//! use starwire::rows::{Init, MemTable, Optimizer, Tables};
//! use starwire::Table;
//! use std::sync::Arc;
//!
//! let table = MemTable::new(2, Init::Zeros, Optimizer::Sgd { lr: 0.5 });
//! let grads: Vec<u8> = [1.0f32, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
//! assert!(table.push(&[7], &grads).is_ok());
//! assert_eq!(table.get(7), Some(vec![-0.5, 1.0]));
//!
//! let tables = Tables::new().with(0, Arc::new(table));
//! let embeddings = tables.get(0).unwrap();
//! let (mut out, mut missing) = (vec![0u8; 2 * embeddings.row_bytes()], Vec::new());
//! assert!(embeddings.pull(&[7, 8], &mut out, &mut missing).is_ok());
//! assert!(missing.is_empty()); // `Init::Zeros` creates row 8
//! ```

use core::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::version::version_clock_start;

use crate::error::Error;
use crate::hash::{splitmix64, IdMap};
use crate::service::Table;
use crate::wire::{DType, Status};

/// Whether `len` is exactly `n` rows of `row_bytes`.
fn is_rows_len(len: usize, n: usize, row_bytes: usize) -> bool {
    n.checked_mul(row_bytes) == Some(len)
}

/// The value a [`MemTable`] gives a row it creates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Rows start at zero; a pull of an unknown id creates its row.
    Zeros,
    /// A pull creates no row: unknown ids are reported missing (and read as zeros). A push
    /// to an unknown id creates its row at zero.
    Missing,
    /// Each element uniform in `[-scale, scale]`, a fixed function of (id, element, seed)
    /// (see [`Init::value`]), so every PS task and every run agree; a pull of an unknown id
    /// creates its row.
    Uniform {
        /// Half-width of the range.
        scale: f32,
        /// Selects the values.
        seed: u64,
    },
}

impl Init {
    /// The initial value of element `k` of `id`'s row. For `Uniform`, with
    /// `splitmix64(x)` the output of splitmix64 for state `x` (the finalizer of
    /// `x + 0x9e3779b97f4a7c15`): `h = splitmix64(splitmix64(splitmix64(seed) ^ id) ^ k)`,
    /// `u = (h >> 40) / 2^24` in `[0, 1)`, value `scale * (2u - 1)`, in f32.
    pub fn value(&self, id: u64, k: usize) -> f32 {
        match *self {
            Init::Zeros | Init::Missing => 0.0,
            Init::Uniform { scale, seed } => {
                let h = splitmix64(splitmix64(splitmix64(seed) ^ id) ^ k as u64);
                let u = (h >> 40) as f32 / (1u32 << 24) as f32;
                scale * (2.0 * u - 1.0)
            }
        }
    }
}

/// How a [`MemTable`] applies a gradient row `g` to a row `w`, element by element.
///
/// The learning rate `lr` may be any finite number: 0 leaves the rows as they are (a
/// table only read), and a negative one moves them along the gradient instead of against
/// it (ascent). NaN and infinities are refused ([`MemTable::try_new`]), as is an Adagrad
/// `initial_accumulator` that is not finite and above 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Optimizer {
    /// `w -= lr * g`.
    Sgd {
        /// Learning rate.
        lr: f32,
    },
    /// `acc += g * g; w -= lr * g / sqrt(acc)`, `acc` starting at `initial_accumulator`
    /// (which must be positive, as TensorFlow's Adagrad requires).
    Adagrad {
        /// Learning rate.
        lr: f32,
        /// Each element's squared-gradient sum when its row is created.
        initial_accumulator: f32,
    },
}

/// Shards of a [`MemTable`]; a power of two, so a shard is the top bits of a hash.
const SHARDS: usize = 64;
/// Salt of the shard hash, so it does not correlate with the hash of the maps inside a
/// shard (which would crowd each shard's ids into a fraction of its buckets).
const SHARD_SALT: u64 = 0x6a09_e667_f3bc_c909;

/// The rows of one shard of a [`MemTable`].
#[derive(Default)]
struct ShardRows {
    /// Id -> index of its row.
    index: IdMap<usize>,
    /// Row `i` at `values[i * dim..][..dim]`.
    values: Vec<f32>,
    /// Adagrad's sums, laid out as `values`; empty under SGD.
    accumulators: Vec<f32>,
    /// Row `i`'s version at `versions[i]`.
    versions: Vec<u64>,
}

/// The reference in-memory table: rows of `dim` f32, created on first pull (unless
/// [`Init::Missing`]) or first push, updated by an [`Optimizer`].
///
/// Sharded internally by a hash of the id (64 shards, each a mutex around a map and one
/// contiguous vector of rows), so event-loop threads seldom wait for each other; a lock is
/// held for one row. A pull of existing rows and a push to existing rows allocate nothing.
pub struct MemTable {
    dims: [u64; 1],
    dim: usize,
    init: Init,
    optimizer: Optimizer,
    shards: Box<[Mutex<ShardRows>]>,
    /// The row versions' clock: the version of the next change of a row.
    clock: AtomicU64,
}

impl Optimizer {
    /// Why this optimizer cannot run (see the [type's docs](Optimizer)), if it cannot.
    fn problem(&self) -> Option<String> {
        let (lr, acc) = match *self {
            Optimizer::Sgd { lr } => (lr, None),
            Optimizer::Adagrad {
                lr,
                initial_accumulator,
            } => (lr, Some(initial_accumulator)),
        };
        if !lr.is_finite() {
            return Some(format!("the learning rate {lr} is not a finite number"));
        }
        match acc {
            Some(a) if !(a.is_finite() && a > 0.0) => Some(format!(
                "Adagrad's initial accumulator {a} is not a finite number above 0"
            )),
            _ => None,
        }
    }
}

impl MemTable {
    /// An empty table of rows of `dim` f32.
    ///
    /// # Panics
    ///
    /// Where [`try_new`](Self::try_new) fails: `dim` 0, or an optimizer setting out of
    /// range (see [`Optimizer`]).
    pub fn new(dim: usize, init: Init, optimizer: Optimizer) -> MemTable {
        match MemTable::try_new(dim, init, optimizer) {
            Ok(table) => table,
            Err(e) => panic!("MemTable::new: {e}"),
        }
    }

    /// An empty table of rows of `dim` f32, or an
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) error saying what
    /// is wrong: `dim` 0, a learning rate that is not finite, an Adagrad initial
    /// accumulator that is not finite and above 0.
    pub fn try_new(dim: usize, init: Init, optimizer: Optimizer) -> Result<MemTable, Error> {
        if dim == 0 {
            return Err(Error::invalid("MemTable: rows of 0 elements"));
        }
        if let Some(problem) = optimizer.problem() {
            return Err(Error::invalid(&format!("MemTable: {problem}")));
        }
        Ok(MemTable {
            dims: [dim as u64],
            dim,
            init,
            optimizer,
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            clock: AtomicU64::new(version_clock_start()),
        })
    }

    /// Sets the row of `id` to `values` (`dim` of them), creating it if absent: to load
    /// given rows, such as a checkpoint's, before serving. A new row's Adagrad sums start
    /// at the initial accumulator; an existing row keeps its sums. `values` of another
    /// length: [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument), and
    /// nothing changes.
    pub fn insert(&self, id: u64, values: &[f32]) -> Result<(), Error> {
        if values.len() != self.dim {
            return Err(Error::invalid(&format!(
                "MemTable::insert: {} values for a row of {}",
                values.len(),
                self.dim
            )));
        }
        let mut rows = self.rows(id);
        let at = self.row_or_insert(&mut rows, id);
        rows.values[at * self.dim..][..self.dim].copy_from_slice(values);
        rows.versions[at] = self.next_version();
        Ok(())
    }

    /// Elements per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// How rows are created.
    pub fn init(&self) -> Init {
        self.init
    }

    /// How gradients are applied.
    pub fn optimizer(&self) -> Optimizer {
        self.optimizer
    }

    /// The current row of `id`, `None` if it has none yet. Creates nothing.
    pub fn get(&self, id: u64) -> Option<Vec<f32>> {
        let rows = self.rows(id);
        let at = *rows.index.get(&id)?;
        Some(rows.values[at * self.dim..][..self.dim].to_vec())
    }

    /// Rows stored.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).index.len()).sum()
    }

    /// Whether no row is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The locked shard that holds `id`.
    fn rows(&self, id: u64) -> MutexGuard<'_, ShardRows> {
        let shard = (splitmix64(id ^ SHARD_SALT) >> (64 - SHARDS.trailing_zeros())) as usize;
        lock(&self.shards[shard])
    }

    /// A version no row of this table had (see [`Table::pull_versioned`]).
    fn next_version(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// The version of `id`'s row, `None` if it has none yet.
    pub fn version(&self, id: u64) -> Option<u64> {
        let rows = self.rows(id);
        let at = *rows.index.get(&id)?;
        Some(rows.versions[at])
    }

    /// Index of `id`'s row in `rows`, created with the initial values if absent.
    fn row_or_insert(&self, rows: &mut ShardRows, id: u64) -> usize {
        if let Some(&at) = rows.index.get(&id) {
            return at;
        }
        let at = rows.index.len();
        rows.index.insert(id, at);
        rows.versions.push(self.next_version());
        let init = self.init;
        rows.values.extend((0..self.dim).map(|k| init.value(id, k)));
        if let Optimizer::Adagrad {
            initial_accumulator,
            ..
        } = self.optimizer
        {
            let new_len = rows.accumulators.len() + self.dim;
            rows.accumulators.resize(new_len, initial_accumulator);
        }
        at
    }
}

/// Locks a shard; a poisoned lock is taken as is (a row is at worst half-updated, which a
/// later step corrects, rather than a PS task that fails every request).
fn lock(shard: &Mutex<ShardRows>) -> MutexGuard<'_, ShardRows> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Reads little-endian f32 `i` of `bytes`.
fn f32_at(bytes: &[u8], i: usize) -> f32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[4 * i..4 * i + 4]);
    f32::from_le_bytes(b)
}

impl Table for MemTable {
    fn dtype(&self) -> DType {
        DType::F32
    }

    fn row_dims(&self) -> &[u64] {
        &self.dims
    }

    fn row_bytes(&self) -> usize {
        self.dim.saturating_mul(4)
    }

    fn pull(&self, ids: &[u64], out: &mut [u8], missing: &mut Vec<u32>) -> Status {
        let (dim, row_bytes) = (self.dim, self.row_bytes());
        if !is_rows_len(out.len(), ids.len(), row_bytes) || u32::try_from(ids.len()).is_err() {
            return Status::InvalidArgument;
        }
        for (i, &id) in ids.iter().enumerate() {
            let dst = &mut out[i * row_bytes..][..row_bytes];
            let mut rows = self.rows(id);
            let at = match (rows.index.get(&id), self.init) {
                (Some(&at), _) => at,
                (None, Init::Missing) => {
                    // Not under the lock: the push may allocate.
                    drop(rows);
                    dst.fill(0);
                    missing.push(i as u32);
                    continue;
                }
                (None, _) => self.row_or_insert(&mut rows, id),
            };
            let row = &rows.values[at * dim..][..dim];
            for (d, v) in dst.chunks_exact_mut(4).zip(row) {
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
        Status::Ok
    }

    fn pull_versioned(
        &self,
        ids: &[u64],
        held: &[u64],
        out: &mut [u8],
        versions: &mut [u64],
        missing: &mut Vec<u32>,
    ) -> Status {
        let (dim, row_bytes) = (self.dim, self.row_bytes());
        if !is_rows_len(out.len(), ids.len(), row_bytes)
            || held.len() != ids.len()
            || versions.len() != ids.len()
            || u32::try_from(ids.len()).is_err()
        {
            return Status::InvalidArgument;
        }
        for (i, &id) in ids.iter().enumerate() {
            let dst = &mut out[i * row_bytes..][..row_bytes];
            let mut rows = self.rows(id);
            let at = match (rows.index.get(&id), self.init) {
                (Some(&at), _) => at,
                (None, Init::Missing) => {
                    drop(rows);
                    dst.fill(0);
                    missing.push(i as u32);
                    versions[i] = 0;
                    continue;
                }
                (None, _) => self.row_or_insert(&mut rows, id),
            };
            versions[i] = rows.versions[at];
            if versions[i] == held[i] {
                continue; // unchanged: the requester has these bytes
            }
            let row = &rows.values[at * dim..][..dim];
            for (d, v) in dst.chunks_exact_mut(4).zip(row) {
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
        Status::Ok
    }

    fn push(&self, ids: &[u64], grads: &[u8]) -> Status {
        let (dim, row_bytes) = (self.dim, self.row_bytes());
        if !is_rows_len(grads.len(), ids.len(), row_bytes) {
            return Status::InvalidArgument;
        }
        for (i, &id) in ids.iter().enumerate() {
            let g = &grads[i * row_bytes..][..row_bytes];
            let mut guard = self.rows(id);
            let at = self.row_or_insert(&mut guard, id);
            let rows = &mut *guard;
            rows.versions[at] = self.next_version();
            let w = &mut rows.values[at * dim..][..dim];
            match self.optimizer {
                Optimizer::Sgd { lr } => {
                    for (k, w) in w.iter_mut().enumerate() {
                        *w -= lr * f32_at(g, k);
                    }
                }
                Optimizer::Adagrad { lr, .. } => {
                    let acc = &mut rows.accumulators[at * dim..][..dim];
                    for (k, (w, acc)) in w.iter_mut().zip(acc).enumerate() {
                        let g = f32_at(g, k);
                        *acc += g * g;
                        *w -= lr * g / acc.sqrt();
                    }
                }
            }
        }
        Status::Ok
    }
}

impl fmt::Debug for MemTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemTable")
            .field("dim", &self.dim)
            .field("init", &self.init)
            .field("optimizer", &self.optimizer)
            .field("len", &self.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::row_bytes;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn to_f32(b: &[u8]) -> Vec<f32> {
        b.chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn pull(t: &dyn Table, ids: &[u64]) -> (Status, Vec<f32>, Vec<u32>) {
        let mut out = vec![0xffu8; ids.len() * t.row_bytes()];
        let mut missing = Vec::new();
        let s = t.pull(ids, &mut out, &mut missing);
        (s, to_f32(&out), missing)
    }

    #[test]
    fn given_rows_are_loaded_and_served() {
        let t = MemTable::new(2, Init::Missing, Optimizer::Sgd { lr: 0.5 });
        t.insert(7, &[1.0, -1.0]).unwrap();
        assert_eq!(
            pull(&t, &[7, 8]),
            (Status::Ok, vec![1.0, -1.0, 0.0, 0.0], vec![1])
        );
        // Overwritten as given, then updated by pushes as any row.
        t.insert(7, &[4.0, 4.0]).unwrap();
        assert_eq!(t.push(&[7], &f32_bytes(&[2.0, -2.0])), Status::Ok);
        assert_eq!(t.get(7), Some(vec![3.0, 5.0]));
        let e = t.insert(9, &[1.0]).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
        assert_eq!(t.get(9), None);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn learning_rates_any_finite_number() {
        // 0 freezes the rows; a negative rate ascends the gradient.
        let t = MemTable::new(1, Init::Zeros, Optimizer::Sgd { lr: -1.0 });
        assert_eq!(t.push(&[1], &f32_bytes(&[2.0])), Status::Ok);
        assert_eq!(t.get(1), Some(vec![2.0]));
        assert!(MemTable::try_new(1, Init::Zeros, Optimizer::Sgd { lr: 0.0 }).is_ok());
        let refused = [
            (1, Optimizer::Sgd { lr: f32::NAN }, "learning rate NaN"),
            (1, Optimizer::Sgd { lr: f32::INFINITY }, "learning rate inf"),
            (
                1,
                Optimizer::Adagrad {
                    lr: 0.1,
                    initial_accumulator: 0.0,
                },
                "initial accumulator 0",
            ),
            (0, Optimizer::Sgd { lr: 0.1 }, "rows of 0 elements"),
        ];
        for (dim, optimizer, why) in refused {
            let e = MemTable::try_new(dim, Init::Zeros, optimizer).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
            let message = e.remote_message().unwrap_or_default();
            assert!(message.contains(why), "{message}");
        }
    }

    #[test]
    fn row_bytes_of_shapes() {
        assert_eq!(row_bytes(DType::F32, &[8]), 32);
        assert_eq!(row_bytes(DType::F64, &[2, 3]), 48);
        assert_eq!(row_bytes(DType::U8, &[]), 1);
        assert_eq!(row_bytes(DType::Unknown(99), &[4]), usize::MAX);
        assert_eq!(row_bytes(DType::F64, &[u64::MAX, 2]), usize::MAX);
        let t = MemTable::new(3, Init::Zeros, Optimizer::Sgd { lr: 1.0 });
        assert_eq!(
            (t.dtype(), t.row_dims(), t.row_bytes()),
            (DType::F32, &[3u64][..], 12)
        );
        assert_eq!(row_bytes(t.dtype(), t.row_dims()), t.row_bytes());
    }

    #[test]
    fn init_missing_reports_positions() {
        let t = MemTable::new(2, Init::Missing, Optimizer::Sgd { lr: 1.0 });
        t.push(&[5], &f32_bytes(&[-1.0, -2.0]));
        let (s, rows, missing) = pull(&t, &[3, 5, 4, 5, 3]);
        assert_eq!(s, Status::Ok);
        assert_eq!(missing, [0, 2, 4]);
        assert_eq!(rows, [0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0]);
        // The pull created nothing; the push created its row at zero.
        assert_eq!(t.len(), 1);
        assert_eq!(t.get(3), None);
        // `missing` is appended to.
        let mut missing = vec![9];
        let mut out = [0xffu8; 8];
        assert_eq!(t.pull(&[6], &mut out, &mut missing), Status::Ok);
        assert_eq!((missing, out), (vec![9, 0], [0u8; 8]));
    }

    #[test]
    fn init_zeros_creates_rows() {
        let t = MemTable::new(3, Init::Zeros, Optimizer::Sgd { lr: 1.0 });
        let (s, rows, missing) = pull(&t, &[1, 2, 1]);
        assert_eq!((s, missing.len()), (Status::Ok, 0));
        assert_eq!(rows, [0.0; 9]);
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(2), Some(vec![0.0; 3]));
        assert!(!t.is_empty());
    }

    #[test]
    fn init_uniform_deterministic_within_scale() {
        let init = Init::Uniform {
            scale: 0.05,
            seed: 42,
        };
        let a = MemTable::new(16, init, Optimizer::Sgd { lr: 1.0 });
        let b = MemTable::new(16, init, Optimizer::Sgd { lr: 1.0 });
        let ids: Vec<u64> = (0..200).map(|i| i * 7919).collect();
        let (_, ra, _) = pull(&a, &ids);
        // Another table, other order: the same values.
        let rev: Vec<u64> = ids.iter().rev().copied().collect();
        let (_, rb, _) = pull(&b, &rev);
        for (i, &id) in ids.iter().enumerate() {
            let j = ids.len() - 1 - i;
            assert_eq!(ra[i * 16..][..16], rb[j * 16..][..16]);
            assert_eq!(a.get(id).unwrap(), &ra[i * 16..][..16]);
            assert_eq!(ra[i * 16 + 3], init.value(id, 3));
        }
        assert!(ra.iter().all(|v| v.abs() <= 0.05));
        // Spread over the range, both signs, distinct.
        let (lo, hi) = ra
            .iter()
            .fold((0.0f32, 0.0f32), |(l, h), &v| (l.min(v), h.max(v)));
        assert!(lo < -0.045 && hi > 0.045, "{lo} {hi}");
        let mean = ra.iter().sum::<f32>() / ra.len() as f32;
        assert!(mean.abs() < 0.005, "{mean}");
        // Another seed, other values; a second pull, the same ones.
        let c = MemTable::new(
            16,
            Init::Uniform {
                scale: 0.05,
                seed: 43,
            },
            Optimizer::Sgd { lr: 1.0 },
        );
        assert_ne!(pull(&c, &ids).1, ra);
        assert_eq!(pull(&a, &ids).1, ra);
        // Known values pin the formula.
        let h = splitmix64(splitmix64(splitmix64(42) ^ 7) ^ 2);
        let u = (h >> 40) as f32 / 16_777_216.0;
        assert_eq!(init.value(7, 2), 0.05 * (2.0 * u - 1.0));
        assert_eq!(Init::Zeros.value(7, 2), 0.0);
    }

    #[test]
    fn sgd_hand_computed() {
        let t = MemTable::new(2, Init::Zeros, Optimizer::Sgd { lr: 0.1 });
        assert_eq!(
            t.push(&[1, 1], &f32_bytes(&[1.0, -2.0, 3.0, 0.5])),
            Status::Ok
        );
        // 0 - 0.1 * 1 - 0.1 * 3, 0 + 0.1 * 2 - 0.1 * 0.5, in f32.
        let want0 = -0.1f32 * 1.0 - 0.1 * 3.0;
        let want1 = 0.1f32 * 2.0 - 0.1 * 0.5;
        assert_eq!(t.get(1), Some(vec![want0, want1]));
    }

    #[test]
    fn adagrad_hand_computed() {
        let opt = Optimizer::Adagrad {
            lr: 0.5,
            initial_accumulator: 1.0,
        };
        let t = MemTable::new(2, Init::Zeros, opt);
        t.push(&[9], &f32_bytes(&[3.0, 0.0]));
        // acc = 1 + 9 = 10; w = -0.5 * 3 / sqrt(10). Element 1: acc 1, w unchanged.
        let w0 = -0.5f32 * 3.0 / 10f32.sqrt();
        assert_eq!(t.get(9), Some(vec![w0, 0.0]));
        t.push(&[9], &f32_bytes(&[-4.0, 2.0]));
        // acc = 10 + 16 = 26: w += 0.5 * 4 / sqrt(26); element 1: acc 5, w = -0.5 * 2 / sqrt(5).
        let w0 = w0 - 0.5 * -4.0 / 26f32.sqrt();
        let w1 = -0.5f32 * 2.0 / 5f32.sqrt();
        assert_eq!(t.get(9), Some(vec![w0, w1]));
        // A pull-created row starts its sums at the initial accumulator too.
        pull(&t, &[4]);
        t.push(&[4], &f32_bytes(&[1.0, 1.0]));
        let w = -0.5f32 / 2f32.sqrt();
        assert_eq!(t.get(4), Some(vec![w, w]));
    }

    #[test]
    fn push_then_pull_round_trip() {
        let init = Init::Uniform {
            scale: 1.0,
            seed: 3,
        };
        let t = MemTable::new(4, init, Optimizer::Sgd { lr: 1.0 });
        let ids = [11u64, 12, 13];
        let grads: Vec<f32> = (0..12).map(|i| i as f32 * 0.25).collect();
        assert_eq!(t.push(&ids, &f32_bytes(&grads)), Status::Ok);
        // Unaligned output, one byte in.
        let mut out = [0u8; 1 + 3 * 16];
        let mut missing = Vec::new();
        assert_eq!(t.pull(&ids, &mut out[1..], &mut missing), Status::Ok);
        assert!(missing.is_empty());
        let got = to_f32(&out[1..]);
        for (i, &id) in ids.iter().enumerate() {
            for k in 0..4 {
                assert_eq!(got[i * 4 + k], init.value(id, k) - grads[i * 4 + k]);
            }
        }
    }

    #[test]
    fn concurrent_pulls_and_pushes() {
        const THREADS: usize = 4;
        const IDS: u64 = 2000;
        const ROUNDS: usize = 10;
        let t = MemTable::new(3, Init::Zeros, Optimizer::Sgd { lr: 0.5 });
        std::thread::scope(|scope| {
            for th in 0..THREADS {
                let t = &t;
                scope.spawn(move || {
                    // Each thread walks the ids in its own order, in batches of 50.
                    let mut ids: Vec<u64> = (0..IDS).collect();
                    ids.rotate_left(th * 500);
                    let grads = f32_bytes(&[1.0, 2.0, -1.0].repeat(50));
                    let mut out = vec![0u8; 50 * 12];
                    let mut missing = Vec::new();
                    for _ in 0..ROUNDS {
                        for batch in ids.chunks(50) {
                            assert_eq!(t.push(batch, &grads), Status::Ok);
                            assert_eq!(t.pull(batch, &mut out, &mut missing), Status::Ok);
                            // Always a whole number of steps of every thread: small integers.
                            assert!(to_f32(&out)
                                .iter()
                                .all(|v| v.fract() == 0.0 || v.fract().abs() == 0.5));
                        }
                    }
                    assert!(missing.is_empty());
                });
            }
        });
        assert_eq!(t.len(), IDS as usize);
        let steps = (THREADS * ROUNDS) as f32;
        for id in 0..IDS {
            assert_eq!(
                t.get(id),
                Some(vec![-0.5 * steps, -steps, 0.5 * steps]),
                "id {id}"
            );
        }
    }

    #[test]
    fn wrong_lengths_are_invalid_argument() {
        for init in [Init::Zeros, Init::Missing] {
            let t = MemTable::new(2, init, Optimizer::Sgd { lr: 1.0 });
            let mut missing = Vec::new();
            assert_eq!(
                t.pull(&[1, 2], &mut [0u8; 15], &mut missing),
                Status::InvalidArgument
            );
            assert_eq!(
                t.pull(&[1, 2], &mut [0u8; 17], &mut missing),
                Status::InvalidArgument
            );
            assert_eq!(
                t.pull(&[], &mut [0u8; 8], &mut missing),
                Status::InvalidArgument
            );
            assert_eq!(t.push(&[1, 2], &[0u8; 8]), Status::InvalidArgument);
            assert_eq!(t.push(&[1], &[0u8; 9]), Status::InvalidArgument);
            // Nothing was created or reported.
            assert!(missing.is_empty());
            assert!(t.is_empty());
            // Empty requests are fine.
            assert_eq!(t.pull(&[], &mut [], &mut missing), Status::Ok);
            assert_eq!(t.push(&[], &[]), Status::Ok);
        }
    }
}
