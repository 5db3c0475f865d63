//! The settings of a [`PsTable`](super::PsTable): [`PsTableBuilder`], its choices
//! ([`Create`], [`Consistency`]) and its validation. Fields are private, so a built table's
//! settings are always valid.

use std::fmt;

use super::elem::Float;
use super::init::Init;
use super::optim::Optimizer;
use super::slots::MAX_SLOTS;

/// Which calls create the row of an id the table does not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Create {
    /// A pull or a push creates it (with the initializer's values; a push then applies its
    /// gradient). The default: a worker pulls a new id's row before it pushes.
    OnPullOrPush,
    /// Only a push creates it; a pull of an unknown id answers it missing (zeros).
    OnPush,
    /// Neither: rows come only from [`load_rows`](super::PsTable::load_rows) and
    /// checkpoints (a serving table of fixed vocabulary). Pushes to unknown ids are dropped.
    Never,
}

/// What concurrent calls on the same row may observe.
///
/// Calls for different rows never interfere, whatever the setting; these are the rules for
/// two calls that touch the same row at the same time. No setting lets anything race on
/// plain memory: rows are read and written as 64-bit atomic words (relaxed ordering: plain
/// loads and stores on x86-64), so every outcome below is defined behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consistency {
    /// Hogwild, as asynchronous PS training has long run (TensorFlow's optimizers default
    /// to `use_locking=False`). The default, and the fastest: no lock, no retry.
    ///
    /// - A pull concurrent with a push of the same row may return the row partly updated:
    ///   each 8-byte word (two f32 elements, four bf16/f16) from before or after that push,
    ///   independently. An element is never torn.
    /// - Two pushes to the same row at the same time may lose updates: each reads, computes
    ///   and writes a word's elements and their optimizer state; a word written by one may be
    ///   overwritten by the other, computed from the same old values. Each element then holds
    ///   the result of one push or of both, and an element's value and its optimizer state
    ///   may come from different pushes (e.g. Adagrad's sum from one, the step from the
    ///   other). With Adam, a row's step count may miss a step.
    Hogwild,
    /// One writer per row at a time, and whole rows for readers: a push takes the row's lock
    /// (one of `row_locks` locks, chosen by a hash of the id, spinning while another push
    /// holds it), and a pull reads the row under a sequence count and retries if a push ran
    /// meanwhile. No update is lost; a pull sees the row as some push left it. Costs an atomic
    /// read-modify-write per pushed row, and a wait when two loops push the same row (or two
    /// rows sharing a lock) at once; a push preempted while it holds a lock holds up the
    /// others on that lock until it runs again.
    PerRow,
}

/// The settings of a [`PsTable`](super::PsTable); [`build`](Self::build) validates them.
///
/// | setting | default | meaning |
/// |---|---|---|
/// | `dim` | (required) | elements per row |
/// | [`table_id`](Self::table_id) | 0 | the table's number: in the initializer's stream and the checkpoint's file name |
/// | [`stored_as`](Self::stored_as) | `F32` | element format in memory |
/// | [`served_as`](Self::served_as) | `F32` | element format of pulled rows and pushed gradients: `F32` or the stored format |
/// | [`init`](Self::init) | `Zeros` | values of a new row |
/// | [`optimizer`](Self::optimizer) | SGD, lr 0.01 | how a gradient is applied |
/// | [`create`](Self::create) | `OnPullOrPush` | which calls create rows |
/// | [`admit_after`](Self::admit_after) | 1 | sightings of an id before its row is created |
/// | [`admission_counters`](Self::admission_counters) | 2^20 | size of the sighting sketch (bytes) |
/// | [`evict_untouched`](Self::evict_untouched) | off | ticks after which an untouched row is evicted |
/// | [`max_rows`](Self::max_rows) | 2^32 − 3 | row cap: at it, new rows are refused; over 95 % of it, [`maintain`](super::PsTable::maintain) evicts the least recently touched down to 90 % |
/// | [`capacity`](Self::capacity) | 0 | rows expected: the index is sized for them from the start |
/// | [`consistency`](Self::consistency) | `Hogwild` | what concurrent calls on one row may see |
/// | [`row_locks`](Self::row_locks) | 16,384 | locks of `Consistency::PerRow` |
/// | [`huge_pages`](Self::huge_pages) | true | advise `MADV_HUGEPAGE` on the arenas |
/// | [`hot_sample_every`](Self::hot_sample_every) | 128 | one row in this many is sampled for the hottest ids (0: off) |
/// | [`checkpoint_direct_io`](Self::checkpoint_direct_io) | true | checkpoints written around the page cache where possible |
#[derive(Debug, Clone)]
pub struct PsTableBuilder {
    pub(super) dim: usize,
    pub(super) table_id: u32,
    pub(super) stored: Float,
    pub(super) served: Float,
    pub(super) init: Init,
    pub(super) optimizer: Optimizer,
    pub(super) create: Create,
    pub(super) admit_after: u8,
    pub(super) admission_counters: usize,
    pub(super) evict_untouched: Option<u16>,
    pub(super) max_rows: u64,
    pub(super) capacity: u64,
    pub(super) consistency: Consistency,
    pub(super) row_locks: usize,
    pub(super) huge_pages: bool,
    pub(super) hot_sample_every: u32,
    pub(super) direct_io: bool,
}

/// Most elements per row.
pub const MAX_DIM: usize = 1 << 20;

/// Most ticks for [`PsTableBuilder::evict_untouched`]: stamps are 16 bits, and a row's age
/// is the clock minus its stamp modulo 2^16.
pub const MAX_EVICT_TICKS: u16 = (1 << 15) - 1;

impl PsTableBuilder {
    pub(super) fn new(dim: usize) -> PsTableBuilder {
        PsTableBuilder {
            dim,
            table_id: 0,
            stored: Float::F32,
            served: Float::F32,
            init: Init::Zeros,
            optimizer: Optimizer::Sgd { lr: 0.01 },
            create: Create::OnPullOrPush,
            admit_after: 1,
            admission_counters: 1 << 20,
            evict_untouched: None,
            max_rows: MAX_SLOTS,
            capacity: 0,
            consistency: Consistency::Hogwild,
            row_locks: 1 << 14,
            huge_pages: true,
            hot_sample_every: 128,
            direct_io: true,
        }
    }

    /// The table's number (as served in [`Tables`](super::Tables)): it selects the
    /// initializer's values (two tables with one seed start with different rows) and names
    /// the checkpoint file (`table-<id>.swrows`).
    pub fn table_id(mut self, id: u32) -> Self {
        self.table_id = id;
        self
    }

    /// How elements are stored. bf16 or f16 halves the memory of the rows (optimizer state
    /// stays f32); pushes compute in f32 and round to nearest.
    pub fn stored_as(mut self, format: Float) -> Self {
        self.stored = format;
        self
    }

    /// The format of pulled rows and pushed gradients (the table's dtype on the wire):
    /// `F32`, or the stored format (then a pull is a plain copy).
    pub fn served_as(mut self, format: Float) -> Self {
        self.served = format;
        self
    }

    /// The values of a new row.
    pub fn init(mut self, init: Init) -> Self {
        self.init = init;
        self
    }

    /// How gradients are applied.
    pub fn optimizer(mut self, optimizer: Optimizer) -> Self {
        self.optimizer = optimizer;
        self
    }

    /// Which calls create rows.
    pub fn create(mut self, create: Create) -> Self {
        self.create = create;
        self
    }

    /// Creates a row only at the `n`-th sighting of its id by a call that may create it
    /// (1: at once). Before that a pull answers it missing and a push's gradient is dropped,
    /// both counted. Sightings are counted approximately, in a fixed sketch (see
    /// [`admission_counters`](Self::admission_counters)).
    pub fn admit_after(mut self, n: u8) -> Self {
        self.admit_after = n;
        self
    }

    /// Counters of the admission sketch (one byte each, at least 128). More counters admit
    /// fewer ids early when many ids are being counted.
    pub fn admission_counters(mut self, n: usize) -> Self {
        self.admission_counters = n;
        self
    }

    /// Evicts rows not pulled or pushed for `ticks` ticks of the table's clock (see
    /// [`advance_clock`](super::PsTable::advance_clock)), at most
    /// [`MAX_EVICT_TICKS`]. Eviction happens in [`maintain`](super::PsTable::maintain),
    /// which must run at least every `MAX_EVICT_TICKS` ticks for ages to be exact.
    pub fn evict_untouched(mut self, ticks: u16) -> Self {
        self.evict_untouched = Some(ticks);
        self
    }

    /// Caps the rows: at `n`, new rows are refused (counted); over 95 % of `n`,
    /// [`maintain`](super::PsTable::maintain) evicts the least recently touched down to 90 %.
    /// Also bounds the address space the table reserves.
    pub fn max_rows(mut self, n: u64) -> Self {
        self.max_rows = n;
        self
    }

    /// A row cap from a memory budget: as many rows as `bytes` hold at the table's bytes
    /// per row (slot and index entry; see [`PsTable::bytes_per_row`](super::PsTable::bytes_per_row)).
    pub fn memory_cap(self, bytes: u64) -> Self {
        let per_row = super::slots::Layout::new(self.dim.max(1), self.stored, &self.optimizer)
            .slot_bytes() as u64
            + 10;
        self.max_rows(bytes / per_row)
    }

    /// Rows expected: the index is sized so this many fit without a build. Growth past it
    /// works the same; this only spares the builds on the way (and their memory).
    pub fn capacity(mut self, rows: u64) -> Self {
        self.capacity = rows;
        self
    }

    /// What concurrent calls on one row may observe.
    pub fn consistency(mut self, consistency: Consistency) -> Self {
        self.consistency = consistency;
        self
    }

    /// Locks of [`Consistency::PerRow`] (rounded up to a power of two; 8 bytes each): two
    /// rows share a lock with probability one in this many.
    pub fn row_locks(mut self, n: usize) -> Self {
        self.row_locks = n;
        self
    }

    /// Whether to advise `MADV_HUGEPAGE` on the arenas (the outcome is in
    /// [`PsTable::report`](super::PsTable::report)). A random row read costs about 29 ns
    /// with transparent huge pages and 72 ns without on the machines measured.
    pub fn huge_pages(mut self, on: bool) -> Self {
        self.huge_pages = on;
        self
    }

    /// Samples one pulled or pushed row in `n` for the hottest ids (0: off).
    pub fn hot_sample_every(mut self, n: u32) -> Self {
        self.hot_sample_every = n;
        self
    }

    /// Whether [`save`](super::PsTable::save) writes around the page cache (`O_DIRECT`)
    /// where the file system allows it: the disk's speed, and no cache filled with the
    /// checkpoint. Off: through the cache (a reload soon after may read it from memory).
    pub fn checkpoint_direct_io(mut self, on: bool) -> Self {
        self.direct_io = on;
        self
    }

    /// Elements per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// What is wrong with the settings, if anything.
    pub(super) fn check(&self) -> Result<(), BuildError> {
        let bad = |what: String| Err(BuildError { what });
        if self.dim == 0 || self.dim > MAX_DIM {
            return bad(format!("dim {} is not in 1..={MAX_DIM}", self.dim));
        }
        if self.served != Float::F32 && self.served != self.stored {
            return bad(format!(
                "rows stored as {:?} can be served as F32 or {:?}, not {:?}",
                self.stored, self.stored, self.served
            ));
        }
        if let Err(what) = self.optimizer.check() {
            return bad(what);
        }
        let finite = |v: f32| v.is_finite() && v >= 0.0;
        let init_ok = match self.init {
            Init::Zeros => true,
            Init::Uniform { scale, .. } => finite(scale),
            Init::Normal { std, .. } | Init::TruncatedNormal { std, .. } => finite(std),
        };
        if !init_ok {
            return bad(format!(
                "initializer {:?}: its scale must be finite and not negative",
                self.init
            ));
        }
        if self.admit_after == 0 {
            return bad("admit_after is 0: at least 1 (1 creates rows at once)".into());
        }
        if self
            .evict_untouched
            .is_some_and(|t| t == 0 || t > MAX_EVICT_TICKS)
        {
            return bad(format!(
                "evict_untouched is {:?} ticks: must be in 1..={MAX_EVICT_TICKS}",
                self.evict_untouched
            ));
        }
        if self.max_rows == 0 || self.max_rows > MAX_SLOTS {
            return bad(format!(
                "max_rows {} is not in 1..={MAX_SLOTS}",
                self.max_rows
            ));
        }
        if self.consistency == Consistency::PerRow && self.row_locks == 0 {
            return bad("row_locks is 0 with Consistency::PerRow".into());
        }
        Ok(())
    }
}

/// Why a [`PsTable`](super::PsTable) was not built: a setting out of range, or its memory
/// could not be reserved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildError {
    pub(super) what: String,
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PS table: {}", self.what)
    }
}

impl std::error::Error for BuildError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_are_named() {
        let err = |b: PsTableBuilder| b.check().unwrap_err().to_string();
        assert!(err(PsTableBuilder::new(0)).contains("dim 0"));
        assert!(err(PsTableBuilder::new(4)
            .stored_as(Float::Bf16)
            .served_as(Float::F16))
        .contains("served as F32 or Bf16"));
        assert!(
            err(PsTableBuilder::new(4).optimizer(Optimizer::Sgd { lr: f32::INFINITY }))
                .contains("lr")
        );
        assert!(
            err(PsTableBuilder::new(4).init(Init::Normal { std: -1.0, seed: 0 }))
                .contains("initializer")
        );
        assert!(err(PsTableBuilder::new(4).admit_after(0)).contains("admit_after"));
        assert!(err(PsTableBuilder::new(4).evict_untouched(40_000)).contains("evict_untouched"));
        assert!(err(PsTableBuilder::new(4).max_rows(0)).contains("max_rows"));
        assert!(err(PsTableBuilder::new(4)
            .consistency(Consistency::PerRow)
            .row_locks(0))
        .contains("row_locks"));
        assert!(PsTableBuilder::new(4)
            .stored_as(Float::F16)
            .served_as(Float::F16)
            .check()
            .is_ok());
        // 16 f32 with Adagrad: a 144-byte slot and about 10 bytes of index per row.
        let capped = PsTableBuilder::new(16)
            .optimizer(Optimizer::Adagrad {
                lr: 0.1,
                initial_accumulator: 0.1,
            })
            .memory_cap(154_000);
        assert_eq!(capped.max_rows, 1000);
    }
}
