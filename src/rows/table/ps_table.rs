//! [`PsTable`]: the reference table of a PS task, built for memory speed and concurrent
//! loops. See the [module documentation](super::ps) for the design; this file holds the row
//! path (pull, push, row creation) and the table's reports.

use std::fmt;
use std::marker::PhantomData;
use std::path::Path;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Mutex;

use crossbeam_utils::CachePadded;

use super::admit::Sketch;
use super::config::{BuildError, Consistency, Create, PsTableBuilder};
use super::elem::{self, Bf16, Float, Format, CHUNK, F16, F32};
use super::epoch::Epoch;
use super::index::{self, Index, Insert, View};
use super::init::Init;
use super::level::Hit;
use super::metrics::{self, Counters, HotIds};
use super::optim::{self, Optimizer};
use super::slots::{Layout, Slots, VERSION_WORD};
use super::version::version_clock_start;
use crate::service::{SaveError, SaveReport, Table};
use crate::stats::{HotId, TableMetrics};
use crate::sys::arena::{thp_mode, HugePages};
use crate::sys::prefetch;
use crate::wire::{DType, Status};

/// Hottest ids in [`TableMetrics::hot`].
const HOT_IN_METRICS: usize = 16;

/// A table of embedding rows for a PS task: rows and their optimizer state in one slot of
/// a huge-page arena, found through a lock-free open-addressing index that grows in
/// bounded steps; no lock and no allocation on the pull and push path. Build one with
/// [`PsTable::builder`]; serve it with [`Tables`](super::Tables).
///
/// See the [module documentation](super::ps) for the layout, the growth, what concurrent calls
/// observe ([`Consistency`]), eviction and the checkpoint format.
pub struct PsTable {
    pub(super) settings: PsTableBuilder,
    pub(super) layout: Layout,
    dims: [u64; 1],
    /// Bytes of a row as served.
    row_bytes: usize,
    pub(super) slots: Slots,
    pub(super) index: Index,
    pub(super) epoch: Epoch,
    pub(super) sketch: Option<Sketch>,
    /// Sequence locks of `Consistency::PerRow` (empty under `Hogwild`).
    locks: Box<[AtomicU64]>,
    pub(super) counters: CachePadded<Counters>,
    pub(super) hot: Option<HotIds>,
    pub(super) clock: CachePadded<AtomicU64>,
    /// The row versions' clock: the version the next change of a row takes (see
    /// [`version_clock_start`]).
    versions: CachePadded<AtomicU64>,
    /// Whether touches are stamped (eviction is on).
    pub(super) stamps: bool,
    /// Slots of evicted rows with the epoch they left the index in, waiting for the grace
    /// period before they are reused (only `maintain` touches it).
    pub(super) limbo: Mutex<Vec<(u64, u32)>>,
}

/// Which kind of call wants a row created.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    Pull,
    Push,
    /// A bulk load or a checkpoint: no admission, any [`Create`] setting.
    Load,
}

/// What one call did, added to the counters at its end.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) created: u64,
    pub(super) not_admitted: u64,
    pub(super) refused: u64,
    pub(super) missing: u64,
    pub(super) dropped: u64,
    /// Index entries added by the call (any origin).
    pub(super) inserted: u64,
}

/// Index entries a call adds between two housekeeping steps: a call that creates many rows
/// keeps the index growing as it goes.
const INSERTS_PER_STEP: u64 = 256;

/// Housekeeping steps (and tries) for an insert that finds the index level full.
const FULL_TRIES: u32 = 8;

/// How far ahead of the id in use [`PsTable::resolve`] prefetches: the slot lines of the id
/// `AHEAD` on, the home bucket of the id `2 AHEAD` on.
const AHEAD: usize = 16;
/// Ids in the resolver's pipeline (a power of two above `2 AHEAD`).
const RING: usize = 64;

/// What became of the huge-page advice on a table's arenas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HugePageOutcome {
    /// Not asked for ([`PsTableBuilder::huge_pages`] off).
    NotAsked,
    /// The kernel took `MADV_HUGEPAGE`; whether it has huge pages to give depends on its
    /// mode ([`TableReport::thp_mode`]) and free memory.
    Advised,
    /// The kernel refused the advice (`errno`; `EINVAL`: transparent huge pages are not
    /// available): the table runs on base pages.
    Refused {
        /// The error number.
        errno: i32,
    },
}

/// How a table is laid out and what it got from the kernel: for a PS's start-up report.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TableReport {
    /// The table's number.
    pub table_id: u32,
    /// Elements per row.
    pub dim: usize,
    /// Element format in memory.
    pub stored: Float,
    /// Element format on the wire.
    pub served: Float,
    /// The optimizer's name.
    pub optimizer: &'static str,
    /// Bytes of a slot: id, row and optimizer state.
    pub slot_bytes: usize,
    /// Bytes of a row and its state, without the id and padding.
    pub data_bytes_per_row: usize,
    /// The row cap.
    pub max_rows: u64,
    /// Entries of the current index level (8 bytes each).
    pub index_capacity: u64,
    /// What concurrent calls on one row may see.
    pub consistency: Consistency,
    /// What became of `MADV_HUGEPAGE`.
    pub huge_pages: HugePageOutcome,
    /// The kernel's transparent-huge-page mode (`always`, `madvise`, `never`), if readable.
    pub thp_mode: Option<String>,
}

impl fmt::Display for TableReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "table {}: {} x {:?} (served {:?}), {}; slot {} B ({} B of row and state), index \
             {} entries of 8 B; {:?}; huge pages: ",
            self.table_id,
            self.dim,
            self.stored,
            self.served,
            self.optimizer,
            self.slot_bytes,
            self.data_bytes_per_row,
            self.index_capacity,
            self.consistency,
        )?;
        match self.huge_pages {
            HugePageOutcome::NotAsked => f.write_str("not asked")?,
            HugePageOutcome::Advised => f.write_str("advised")?,
            HugePageOutcome::Refused { errno } => {
                write!(f, "refused ({})", std::io::Error::from_raw_os_error(errno))?
            }
        }
        match &self.thp_mode {
            Some(mode) => write!(f, " (THP mode {mode})"),
            None => Ok(()),
        }
    }
}

impl PsTable {
    /// The settings of a table of rows of `dim` elements, at their defaults.
    pub fn builder(dim: usize) -> PsTableBuilder {
        PsTableBuilder::new(dim)
    }

    /// Elements per row.
    pub fn dim(&self) -> usize {
        self.layout.dim
    }

    /// The table's number.
    pub fn table_id(&self) -> u32 {
        self.settings.table_id
    }

    /// The settings the table was built with (a builder: clone it to build a replacement,
    /// or to [`load`](PsTableBuilder::load) one from a checkpoint).
    pub fn settings(&self) -> &PsTableBuilder {
        &self.settings
    }

    /// How elements are stored.
    pub fn stored_as(&self) -> Float {
        self.layout.stored
    }

    /// How rows and gradients travel.
    pub fn served_as(&self) -> Float {
        self.settings.served
    }

    /// The values of a new row.
    pub fn init(&self) -> Init {
        self.settings.init
    }

    /// How gradients are applied.
    pub fn optimizer(&self) -> Optimizer {
        self.settings.optimizer
    }

    /// What concurrent calls on one row may observe.
    pub fn consistency(&self) -> Consistency {
        self.settings.consistency
    }

    /// The row cap.
    pub fn max_rows(&self) -> u64 {
        self.settings.max_rows
    }

    /// Rows stored.
    pub fn len(&self) -> u64 {
        self.slots.rows()
    }

    /// Whether no row is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the table holds per row: its slot and its share of the index (about 10 bytes at
    /// the load an index level is built for and grows from).
    pub fn bytes_per_row(&self) -> usize {
        self.layout.slot_bytes() + 10
    }

    /// The layout and what the kernel gave: for a start-up report.
    pub fn report(&self) -> TableReport {
        let huge = match (self.slots.huge_pages(), self.index.huge_pages()) {
            (HugePages::NotAsked, other) | (other, _) => other,
        };
        TableReport {
            table_id: self.settings.table_id,
            dim: self.layout.dim,
            stored: self.layout.stored,
            served: self.settings.served,
            optimizer: self.settings.optimizer.name(),
            slot_bytes: self.layout.slot_bytes(),
            data_bytes_per_row: self.layout.data_bytes(&self.settings.optimizer),
            max_rows: self.settings.max_rows,
            index_capacity: self.index.capacity(),
            consistency: self.settings.consistency,
            huge_pages: match huge {
                HugePages::NotAsked => HugePageOutcome::NotAsked,
                HugePages::Advised => HugePageOutcome::Advised,
                HugePages::Refused(e) => HugePageOutcome::Refused { errno: e as i32 },
            },
            thp_mode: thp_mode(),
        }
    }

    /// The counters, sizes and hottest ids now.
    pub fn metrics(&self) -> TableMetrics {
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let rows = self.slots.rows();
        let fixed =
            self.sketch.as_ref().map_or(0, |s| s.bytes() as u64) + 8 * self.locks.len() as u64;
        TableMetrics {
            rows,
            data_bytes: rows * self.layout.data_bytes(&self.settings.optimizer) as u64,
            memory_bytes: self.slots.high_water() * self.layout.slot_bytes() as u64
                + self.slots.high_water().div_ceil(8)
                + self.index.live_bytes()
                + fixed,
            committed_bytes: self.slots.committed_bytes() + self.index.committed_bytes() + fixed,
            index_capacity: self.index.capacity(),
            pulls: load(&c.pulls),
            pushes: load(&c.pushes),
            pulled_rows: load(&c.pulled_rows),
            missing: load(&c.missing),
            unchanged_rows: load(&c.unchanged_rows),
            pushed_rows: load(&c.pushed_rows),
            dropped_pushes: load(&c.dropped_pushes),
            created: load(&c.created),
            loaded: load(&c.loaded),
            not_admitted: load(&c.not_admitted),
            refused: load(&c.refused),
            evicted_untouched: load(&c.evicted_untouched),
            evicted_over_cap: load(&c.evicted_over_cap),
            index_builds: self.index.builds(),
            clock: self.clock.load(Ordering::Relaxed),
            hot: self.hot_ids(HOT_IN_METRICS),
            hot_sample_every: self.hot.as_ref().map_or(0, |h| h.every()),
        }
    }

    /// The `k` hottest ids sampled, hottest first (empty when sampling is off).
    pub fn hot_ids(&self, k: usize) -> Vec<HotId> {
        self.hot.as_ref().map_or_else(Vec::new, |h| h.top(k))
    }

    /// Bytes of the slot arena backed by huge pages now (from `/proc/self/smaps`; `None`
    /// when unreadable). Reads a file the size of the process's mappings: for reports.
    pub fn huge_page_bytes(&self) -> Option<u64> {
        self.slots.huge_resident()
    }

    /// The id in slot `slot`.
    #[inline]
    pub(super) fn key_of(&self, slot: u32) -> Option<u64> {
        self.slots
            .words()
            .get(slot as usize * self.layout.stride)
            .map(|w| w.load(Ordering::Relaxed))
    }

    /// The stamp of a touch now, if touches are stamped.
    #[inline]
    pub(super) fn stamp(&self) -> Option<u16> {
        self.stamps
            .then(|| self.clock.load(Ordering::Relaxed) as u16)
    }

    /// The slot of `id`'s row and whether it was created now: created if `origin` may
    /// create it, its row and state written by `fill` (given the slot's row and state words)
    /// before it is published; `None` (counted in `tally`) if there is none.
    #[inline]
    pub(super) fn find_or_create<'a>(
        &'a self,
        view: &mut View<'a>,
        id: u64,
        origin: Origin,
        tally: &mut Tally,
        fill: impl FnOnce(&[AtomicU64], &[AtomicU64]),
    ) -> Option<(u32, bool)> {
        let h = index::hash(id);
        let key_of = |s| self.key_of(s);
        if let Some(hit) = self.index.find(view, id, h, &key_of) {
            if let Some(stamp) = self.stamp() {
                hit.touch(stamp);
            }
            return Some((hit.slot(), false));
        }
        match (self.settings.create, origin) {
            (_, Origin::Load) | (Create::OnPullOrPush, _) | (Create::OnPush, Origin::Push) => {}
            _ => return None,
        }
        if origin != Origin::Load {
            if let Some(sketch) = &self.sketch {
                if !sketch.sight(id) {
                    tally.not_admitted += 1;
                    return None;
                }
            }
        }
        if self.slots.rows() >= self.settings.max_rows {
            tally.refused += 1;
            return None;
        }
        let Some(slot) = self.slots.alloc() else {
            tally.refused += 1;
            return None;
        };
        let words = self.layout.slot(self.slots.words(), slot);
        words[0].store(id, Ordering::Relaxed);
        words[VERSION_WORD].store(self.next_versions(1), Ordering::Relaxed);
        let (row, state) = self.layout.row_and_state(words);
        fill(row, state);
        let stamp = self.clock.load(Ordering::Relaxed) as u16;
        for _ in 0..FULL_TRIES {
            match self.index.insert(view, id, h, slot, stamp, &key_of) {
                Insert::New => {
                    self.slots.set_live(slot);
                    if origin != Origin::Load {
                        tally.created += 1;
                    }
                    tally.inserted += 1;
                    if tally.inserted % INSERTS_PER_STEP == 0 {
                        self.upkeep_step();
                    }
                    return Some((slot, true));
                }
                Insert::Found(hit) => {
                    // Another call created it first; this slot was never published.
                    self.slots.free(slot);
                    return Some((hit.slot(), false));
                }
                // A build is due, or the level being built is filling faster than it is
                // copied: a few bounded steps, then give up on this row (counted).
                Insert::Full => {
                    self.index.step(&self.epoch, self.slots.rows(), &key_of);
                }
            }
        }
        self.slots.free(slot);
        tally.refused += 1;
        None
    }

    /// The first of `n` versions no row of this table had (the next `n` values of its
    /// version clock).
    #[inline]
    pub(super) fn next_versions(&self, n: u64) -> u64 {
        self.versions.fetch_add(n, Ordering::Relaxed)
    }

    /// Gives the row in slot words `s` a new version, after its contents changed outside a
    /// push (a load over it).
    pub(super) fn renew_version(&self, s: &[AtomicU64]) {
        s[VERSION_WORD].store(self.next_versions(1), Ordering::Release);
    }

    /// Writes a new row's initial values and optimizer state.
    pub(super) fn init_row(&self, id: u64, row: &[AtomicU64], state: &[AtomicU64]) {
        match self.layout.stored {
            Float::F32 => self.init_values::<F32>(row, id),
            Float::Bf16 => self.init_values::<Bf16>(row, id),
            Float::F16 => self.init_values::<F16>(row, id),
        }
        self.settings.optimizer.init_state(self.layout.dim, state);
    }

    fn init_values<S: Format>(&self, row: &[AtomicU64], id: u64) {
        let dim = self.layout.dim;
        let mut first = 0;
        while first < dim {
            let n = CHUNK.min(dim - first);
            let mut vals = [0f32; CHUNK];
            self.settings
                .init
                .fill(self.settings.table_id, id, first, &mut vals[..n]);
            elem::store::<S>(row, first, &vals[..n]);
            first += CHUNK;
        }
    }

    /// Runs `read` until it ran with no push of the row's lock in between
    /// (`Consistency::PerRow`), or once (`Hogwild`).
    #[inline]
    pub(super) fn read_row(&self, id: u64, mut read: impl FnMut()) {
        let Some(lock) = self.lock_of(id) else {
            return read();
        };
        loop {
            let before = lock.load(Ordering::Acquire);
            if before & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            read();
            fence(Ordering::Acquire);
            if lock.load(Ordering::Relaxed) == before {
                return;
            }
        }
    }

    /// Runs `write` holding the row's lock (`Consistency::PerRow`), or at once (`Hogwild`).
    #[inline]
    pub(super) fn write_row(&self, id: u64, write: impl FnOnce()) {
        let Some(lock) = self.lock_of(id) else {
            return write();
        };
        loop {
            let seq = lock.load(Ordering::Relaxed);
            if seq & 1 == 0
                && lock
                    .compare_exchange_weak(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                // Readers that see any of the writes below see the odd count after them.
                fence(Ordering::Release);
                write();
                lock.store(seq + 2, Ordering::Release);
                return;
            }
            std::hint::spin_loop();
        }
    }

    #[inline]
    fn lock_of(&self, id: u64) -> Option<&AtomicU64> {
        if self.locks.is_empty() {
            return None;
        }
        // Bits of the hash the index's bucket and tag do not use much.
        let h = index::hash(id);
        Some(&self.locks[(h >> 24) as usize & (self.locks.len() - 1)])
    }

    /// Adds a call's tally to the counters.
    pub(super) fn count(&self, t: &Tally) {
        let c = &self.counters;
        metrics::add(&c.created, t.created);
        metrics::add(&c.not_admitted, t.not_admitted);
        metrics::add(&c.refused, t.refused);
        metrics::add(&c.missing, t.missing);
        metrics::add(&c.dropped_pushes, t.dropped);
    }

    /// A step of index housekeeping, if any is due.
    #[inline]
    pub(super) fn upkeep_step(&self) {
        if self.index.has_work() {
            self.index
                .step(&self.epoch, self.slots.rows(), &|s| self.key_of(s));
        }
    }

    /// Resolves `ids` in order and hands each to `each` with its slot when the common case
    /// finds it (the entry in the home bucket of the current level, the id confirmed in its
    /// slot; stamped), `None` for the others, which take
    /// [`find_or_create`](Self::find_or_create). A pipeline of prefetches: the home bucket
    /// of id `i + 2 AHEAD` and the slot lines (up to word `tail`, the last `each` will use)
    /// of id `i + AHEAD` are asked for while id `i` is used (for writing when `writes`), so
    /// the misses of about 2 AHEAD rows are in flight at once and none is waited for alone.
    #[inline]
    fn resolve<'a>(
        &'a self,
        view: &mut View<'a>,
        ids: &[u64],
        tail: usize,
        writes: bool,
        mut each: impl FnMut(&mut View<'a>, usize, u64, Option<u32>),
    ) {
        let n = ids.len();
        let words = self.slots.words();
        let stride = self.layout.stride;
        let stamp = self.stamp();
        let mut hashes = [0u64; RING];
        let mut hits: [Option<Hit<'a>>; RING] = [None; RING];
        let start = |i: usize, view: &View<'a>, hashes: &mut [u64; RING]| {
            let h = index::hash(ids[i]);
            hashes[i % RING] = h;
            for w in self.index.home_words(view, h).into_iter().flatten() {
                prefetch::read(w.as_ptr());
            }
        };
        let candidate = |k: usize, view: &View<'a>, hashes: &[u64; RING]| {
            let hit = self.index.candidate(view, hashes[k % RING])?;
            let at = hit.slot() as usize * stride;
            let slot = words.get(at..=at + tail)?;
            // Slots are not aligned to lines: a word of every line up to `tail`.
            for w in slot.iter().step_by(8).chain(&slot[tail..]) {
                if writes {
                    prefetch::write(w.as_ptr());
                } else {
                    prefetch::read(w.as_ptr());
                }
            }
            Some(hit)
        };
        for i in 0..n.min(2 * AHEAD) {
            start(i, view, &mut hashes);
        }
        for k in 0..n.min(AHEAD) {
            hits[k % RING] = candidate(k, view, &hashes);
        }
        for k in 0..n {
            if k + 2 * AHEAD < n {
                start(k + 2 * AHEAD, view, &mut hashes);
            }
            if k + AHEAD < n {
                hits[(k + AHEAD) % RING] = candidate(k + AHEAD, view, &hashes);
            }
            let id = ids[k];
            let found = hits[k % RING].filter(|hit| {
                let at = hit.slot() as usize * stride;
                words.get(at).map(|w| w.load(Ordering::Relaxed)) == Some(id)
            });
            if let (Some(hit), Some(stamp)) = (found, stamp) {
                hit.touch(stamp);
            }
            each(view, k, id, found.map(|hit| hit.slot()));
        }
    }

    /// Pulls `ids` into `out`. With `V`, also their versions into `versions`, and a row
    /// whose version is the one in `held` is not copied (counted unchanged).
    fn pull_rows<R: ReadRow, const V: bool>(
        &self,
        ids: &[u64],
        held: &[u64],
        versions: &mut [u64],
        out: &mut [u8],
        missing: &mut Vec<u32>,
    ) {
        let rb = self.row_bytes;
        let (dim, row_words) = (self.layout.dim, self.layout.row_words);
        let mut tally = Tally::default();
        let mut unchanged = 0u64;
        {
            let _guard = self.epoch.enter();
            let mut view = self.index.view();
            // The version word is read too: the slot up to the row's last word.
            let tail = VERSION_WORD + row_words;
            self.resolve(&mut view, ids, tail, false, |view, k, id, found| {
                let dst = &mut out[k * rb..(k + 1) * rb];
                let slot = match found {
                    Some(slot) => slot,
                    None => {
                        let init = |row: &_, state: &_| self.init_row(id, row, state);
                        match self.find_or_create(view, id, Origin::Pull, &mut tally, init) {
                            Some((slot, _)) => slot,
                            None => {
                                dst.fill(0);
                                missing.push(k as u32);
                                tally.missing += 1;
                                if V {
                                    versions[k] = 0;
                                }
                                return;
                            }
                        }
                    }
                };
                let s = self.layout.slot(self.slots.words(), slot);
                let (row, _) = self.layout.row_and_state(s);
                if !V {
                    return self.read_row(id, || R::read(row, dim, dst));
                }
                // The version before the row (a push writes it after), so the row read is
                // at least as new as the version: a row changed meanwhile reads newer, and
                // its next pull sees the newer version.
                let (held, mut version) = (held[k], 0);
                self.read_row(id, || {
                    version = s[VERSION_WORD].load(Ordering::Acquire);
                    if version != held {
                        R::read(row, dim, dst);
                    }
                });
                versions[k] = version;
                unchanged += u64::from(version == held);
            });
        }
        let call = self.counters.pulls.fetch_add(1, Ordering::Relaxed);
        metrics::add(&self.counters.pulled_rows, ids.len() as u64);
        if V {
            metrics::add(&self.counters.unchanged_rows, unchanged);
        }
        self.count(&tally);
        if let Some(hot) = &self.hot {
            hot.sample(ids, call);
        }
        self.upkeep_step();
    }

    fn push_rows<S: Format, G: Format>(&self, ids: &[u64], grads: &[u8]) {
        let rb = self.row_bytes;
        let dim = self.layout.dim;
        let optimizer = &self.settings.optimizer;
        let mut tally = Tally::default();
        // One version per position: a row pushed twice in the call ends with the later.
        let first = self.next_versions(ids.len() as u64);
        {
            let _guard = self.epoch.enter();
            let mut view = self.index.view();
            let tail = self.layout.stride - 1;
            self.resolve(&mut view, ids, tail, true, |view, k, id, found| {
                let g = &grads[k * rb..(k + 1) * rb];
                let slot = match found {
                    Some(slot) => slot,
                    None => {
                        let init = |row: &_, state: &_| self.init_row(id, row, state);
                        match self.find_or_create(view, id, Origin::Push, &mut tally, init) {
                            Some((slot, _)) => slot,
                            None => {
                                tally.dropped += 1;
                                return;
                            }
                        }
                    }
                };
                let s = self.layout.slot(self.slots.words(), slot);
                let (row, state) = self.layout.row_and_state(s);
                self.write_row(id, || {
                    optim::apply::<S, G>(optimizer, dim, row, state, g);
                    // After the row: a pull that reads this version reads the row with
                    // this push applied.
                    s[VERSION_WORD].store(first + k as u64, Ordering::Release);
                });
            });
        }
        let call = self.counters.pushes.fetch_add(1, Ordering::Relaxed);
        metrics::add(&self.counters.pushed_rows, ids.len() as u64);
        self.count(&tally);
        if let Some(hot) = &self.hot {
            hot.sample(ids, call);
        }
        self.upkeep_step();
    }
}

impl PsTableBuilder {
    /// The table, empty; an error names the setting out of range, or the memory that could
    /// not be reserved.
    pub fn build(self) -> Result<PsTable, BuildError> {
        self.check()?;
        let layout = Layout::new(self.dim, self.stored, &self.optimizer);
        // Address space only (nothing is committed), but sized for `max_rows`: a process
        // under an address-space limit (`ulimit -v`, valgrind) may refuse it.
        let reserve = |what: &str, e: std::io::Error| BuildError {
            what: format!(
                "reserving the {what}: {e} (address space for up to {} rows of {} B is \
                 reserved at build; set max_rows to the rows the table may hold to reserve less)",
                self.max_rows,
                layout.slot_bytes()
            ),
        };
        let slots =
            Slots::new(layout, self.max_rows, self.huge_pages).map_err(|e| reserve("slots", e))?;
        let expected = self.capacity.min(self.max_rows);
        let index = Index::new(expected, slots.max_slots(), self.huge_pages)
            .map_err(|e| reserve("index", e))?;
        let locks = match self.consistency {
            Consistency::Hogwild => Box::default(),
            Consistency::PerRow => (0..self.row_locks.next_power_of_two())
                .map(|_| AtomicU64::new(0))
                .collect(),
        };
        Ok(PsTable {
            dims: [self.dim as u64],
            row_bytes: self.dim * self.served.size(),
            layout,
            slots,
            index,
            epoch: Epoch::default(),
            sketch: (self.admit_after > 1)
                .then(|| Sketch::new(self.admission_counters / 2, self.admit_after)),
            locks,
            counters: CachePadded::default(),
            hot: (self.hot_sample_every > 0).then(|| HotIds::new(self.hot_sample_every)),
            clock: CachePadded::default(),
            versions: CachePadded::new(AtomicU64::new(version_clock_start())),
            stamps: self.evict_untouched.is_some() || self.capped(),
            limbo: Mutex::default(),
            settings: self,
        })
    }

    /// Whether a row cap below the most rows a table can have was set.
    pub(super) fn capped(&self) -> bool {
        self.max_rows < super::slots::MAX_SLOTS
    }
}

/// How a pull turns a stored row into the bytes it serves.
trait ReadRow {
    fn read(row: &[AtomicU64], dim: usize, dst: &mut [u8]);
}

/// Served as stored: a copy of the words' bytes.
struct Same;

impl ReadRow for Same {
    #[inline]
    fn read(row: &[AtomicU64], _dim: usize, dst: &mut [u8]) {
        elem::copy_out(row, dst);
    }
}

/// Stored as `S`, served as f32.
struct Widen<S>(PhantomData<S>);

impl<S: Format> ReadRow for Widen<S> {
    #[inline]
    fn read(row: &[AtomicU64], dim: usize, dst: &mut [u8]) {
        let mut first = 0;
        while first < dim {
            let n = CHUNK.min(dim - first);
            if n == CHUNK {
                F32::write8(&S::load8(row, first), &mut dst[first * 4..]);
            } else {
                let mut vals = [0f32; CHUNK];
                elem::load::<S>(row, first, &mut vals[..n]);
                elem::write::<F32>(&vals[..n], &mut dst[first * 4..(first + n) * 4]);
            }
            first += CHUNK;
        }
    }
}

impl Table for PsTable {
    fn dtype(&self) -> DType {
        self.settings.served.dtype()
    }

    fn row_dims(&self) -> &[u64] {
        &self.dims
    }

    fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    fn pull(&self, ids: &[u64], out: &mut [u8], missing: &mut Vec<u32>) -> Status {
        if ids.len().checked_mul(self.row_bytes) != Some(out.len())
            || u32::try_from(ids.len()).is_err()
        {
            return Status::InvalidArgument;
        }
        if ids.is_empty() {
            return Status::Ok;
        }
        match (self.layout.stored, self.settings.served) {
            (Float::Bf16, Float::F32) => {
                self.pull_rows::<Widen<Bf16>, false>(ids, &[], &mut [], out, missing)
            }
            (Float::F16, Float::F32) => {
                self.pull_rows::<Widen<F16>, false>(ids, &[], &mut [], out, missing)
            }
            _ => self.pull_rows::<Same, false>(ids, &[], &mut [], out, missing),
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
        if ids.len().checked_mul(self.row_bytes) != Some(out.len())
            || held.len() != ids.len()
            || versions.len() != ids.len()
            || u32::try_from(ids.len()).is_err()
        {
            return Status::InvalidArgument;
        }
        if ids.is_empty() {
            return Status::Ok;
        }
        let (h, v) = (held, versions);
        match (self.layout.stored, self.settings.served) {
            (Float::Bf16, Float::F32) => {
                self.pull_rows::<Widen<Bf16>, true>(ids, h, v, out, missing)
            }
            (Float::F16, Float::F32) => self.pull_rows::<Widen<F16>, true>(ids, h, v, out, missing),
            _ => self.pull_rows::<Same, true>(ids, h, v, out, missing),
        }
        Status::Ok
    }

    fn push(&self, ids: &[u64], grads: &[u8]) -> Status {
        if ids.len().checked_mul(self.row_bytes) != Some(grads.len()) {
            return Status::InvalidArgument;
        }
        if ids.is_empty() {
            return Status::Ok;
        }
        match (self.layout.stored, self.settings.served) {
            (Float::F32, _) => self.push_rows::<F32, F32>(ids, grads),
            (Float::Bf16, Float::Bf16) => self.push_rows::<Bf16, Bf16>(ids, grads),
            (Float::Bf16, _) => self.push_rows::<Bf16, F32>(ids, grads),
            (Float::F16, Float::F16) => self.push_rows::<F16, F16>(ids, grads),
            (Float::F16, _) => self.push_rows::<F16, F32>(ids, grads),
        }
        Status::Ok
    }

    fn metrics(&self) -> Option<TableMetrics> {
        Some(PsTable::metrics(self))
    }

    fn save(&self, dir: &Path) -> Result<SaveReport, SaveError> {
        PsTable::save(self, dir).map_err(|e| SaveError::Failed(Box::new(e)))
    }

    fn maintain(&self) {
        let done = PsTable::maintain(self);
        log::debug!("table {}: {done:?}", self.settings.table_id);
    }

    fn report(&self) -> Option<String> {
        Some(PsTable::report(self).to_string())
    }
}

impl fmt::Debug for PsTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PsTable")
            .field("table_id", &self.settings.table_id)
            .field("dim", &self.layout.dim)
            .field("rows", &self.len())
            .finish_non_exhaustive()
    }
}
