//! The index of a [`PsTable`](super::PsTable): id → slot, in levels of open addressing
//! (see [`level`](super::level)), grown without stopping anyone.
//!
//! **Growth.** Levels live in eight reserved regions, used in turn. When the current level
//! is 4/5 full, the next is built in the next region (sized for the rows at 2/5 full): its
//! memory is faulted in 8 MiB per step (so no later step stops for a page fault on every
//! entry it writes), then it becomes current: inserts go there, lookups look there and
//! then in the previous level, and the previous level's entries are copied over 256
//! buckets at a time by whichever call comes next (each step a bounded piece of work, a
//! fraction of a millisecond). When all are copied the previous level is retired; after a grace period
//! (see [`epoch`](super::epoch)) its pages are given back, 8 MiB per step, and its region is
//! free for a level again. Eight regions, because a call that is preempted holds back every
//! release until it ends: levels double, so builds go on through 128-fold growth meanwhile.
//!
//! **No id lands in two levels.** The copy freezes each empty entry of a bucket (a value no
//! row has) before it copies the bucket's rows, and a probe ends at a frozen entry as at an
//! empty one: nothing is added to a bucket once it is copied. An insert while a level is
//! being copied adds to the new level only, after it found the id in the old level or froze
//! the entry where the id's probe ends there; an insert into the old level that meets a
//! frozen entry starts again in the new one. Two inserts of one id, one in each level,
//! race for that same old entry: one lands and the other finds it (after Click's
//! lock-free resizable hash table).
//!
//! **Removal** (eviction) turns an entry into a tombstone; it is done only between copies
//! (never while a level is being copied), and tombstones disappear at the next build. A
//! level with many tombstones is rebuilt at the size its rows need.
//!
//! Housekeeping is claimed in pieces by whichever threads step, and no thread waits for
//! another: a build starts with a compare-and-swap on the level word; faulting in, copying
//! and giving back are claimed a piece at a time, and claims of the first two wrap around
//! (see [`pieces`](super::pieces)): a piece whose thread is preempted is done again by
//! another (both are idempotent). A sweep
//! piece (eviction, 4,096 buckets) sets a flag in the level word that keeps a build from
//! starting during it; inserts go on into the current level meanwhile.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

use super::epoch::Epoch;
pub(super) use super::level::hash;
use super::level::{
    entry, is_row, slot_of, tag, tag_of, Hit, Level, Placed, BUCKET, EMPTY, FROZEN, TOMB,
};
use super::pieces::Pieces;
use crate::sys::arena::{Arena, HugePages};

/// Fewest buckets of a level.
const MIN_BUCKETS: u64 = 512;
/// A build starts when this many fifths of a level's entries are filled.
const GROW_FIFTHS: u64 = 4;
/// A new level is sized so the rows fill this many fifths of it.
const BUILD_FIFTHS: u64 = 2;
/// Inserts are refused beyond this many twentieths filled (probes would get long).
const FULL_TWENTIETHS: u64 = 19;
/// Buckets copied per step.
const COPY_BUCKETS: u64 = 256;
/// Bytes given back per step.
const RELEASE_BYTES: u64 = 8 << 20;
/// Bytes of a new level faulted in per step.
const FAULT_BYTES: u64 = 8 << 20;
/// Bytes of a base page: one write per page faults it in.
const PAGE_BYTES: u64 = 4096;
/// Entries filled (of `buckets` buckets) at which `fifths` fifths are.
fn fifths(buckets: u64, fifths: u64) -> u64 {
    buckets * BUCKET as u64 / 5 * fifths
}

/// The levels one call works with: the current one, and while its entries are being copied,
/// the previous one.
pub(super) struct View<'a> {
    /// The level word it was taken from.
    level: u64,
    cur: Level<'a>,
    prev: Option<Level<'a>>,
}

/// The outcome of [`Index::insert`].
pub(super) enum Insert<'a> {
    /// The entry was added.
    New,
    /// The id has an entry already (another call added it first).
    Found(Hit<'a>),
    /// The current level is too full; a build is due.
    Full,
}

/// What a sweep step did.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Swept {
    /// Buckets up to this one are swept; the level has this many.
    Upto(u64, u64),
    /// Someone else holds the housekeeping flag, or a level is being copied: later.
    Busy,
}

/// Regions levels live in, used in turn.
const REGIONS: usize = 8;

/// Bits of the level word below the level number.
const COPYING: u64 = 1;
const PREPARING: u64 = 2;
const SWEEPING: u64 = 4;
const FLAGS: u64 = 3;

/// The region of level `k`.
#[inline]
fn region_of(k: u64) -> usize {
    (k % REGIONS as u64) as usize
}

/// `Retired::at` of a level being retired, whose grace period has not started.
const NOT_YET: u64 = u64::MAX;

/// A region's level that is out of use and not given back yet.
#[derive(Default)]
struct Retired {
    /// 0, or `epoch << 1 | 1`: retired in `epoch`, or `NOT_YET`.
    at: AtomicU64,
    /// Bytes to give back; claimed for giving back so far; given back so far.
    bytes: AtomicU64,
    claimed: AtomicU64,
    released: AtomicU64,
}

/// The index; see the module documentation.
pub(super) struct Index {
    regions: [Arena; REGIONS],
    /// Buckets of the level in each region (0: none).
    buckets: [AtomicU64; REGIONS],
    /// Entries filled (rows and tombstones) in each region's level.
    used: [CachePadded<AtomicU64>; REGIONS],
    /// `k << 3 | flags`: level `k` (in region `k % REGIONS`) is current; `COPYING`: the
    /// entries of level `k - 1` are being copied into it; `PREPARING`: a thread is building
    /// level `k + 1`; `SWEEPING`: a sweep piece is under way (no build starts).
    level: CachePadded<AtomicU64>,
    /// Per region: its retired level, if any.
    retired: [Retired; REGIONS],
    /// Regions with a retired level not given back yet.
    pending: AtomicU64,
    /// Faulting in level `k`'s memory (pieces of `FAULT_BYTES`), and copying level `k - 1`
    /// into it (chunks of `COPY_BUCKETS` buckets): the build number is `k`.
    fault: Pieces,
    copy: Pieces,
    /// The size of the next level: `k << 40 | buckets`, proposed for level `k` by the
    /// thread that starts its build (the first proposal stands).
    next_size: AtomicU64,
    /// Levels built after the first.
    builds: AtomicU64,
    /// Fewest buckets of a level (from the expected number of rows), and most.
    min_buckets: u64,
    max_buckets: u64,
    /// Whether a failed build was logged already.
    logged: AtomicBool,
}

impl Index {
    /// An index sized for `expected` rows, able to grow to `max_rows`.
    pub(super) fn new(expected: u64, max_rows: u64, huge: bool) -> io::Result<Index> {
        let max_buckets = buckets_for(max_rows).clamp(MIN_BUCKETS, 1 << 40);
        // Sized so `expected` rows stay under the build threshold.
        let min_buckets = (expected * 5)
            .div_ceil(GROW_FIFTHS * BUCKET as u64)
            .saturating_add(expected / 256)
            .clamp(MIN_BUCKETS, max_buckets);
        let bytes = (max_buckets * (BUCKET * 8) as u64) as usize;
        let regions = [(); REGIONS].map(|()| Arena::reserve(bytes, huge));
        let regions = match regions.iter().position(Result::is_err) {
            Some(_) => return Err(regions.into_iter().find_map(Result::err).expect("an error")),
            None => regions.map(|r| r.expect("checked")),
        };
        regions[0].commit(min_buckets as usize * BUCKET * 8)?;
        let fault = Pieces::new((bytes as u64).div_ceil(FAULT_BYTES))?;
        let copy = Pieces::new(max_buckets.div_ceil(COPY_BUCKETS))?;
        let buckets: [AtomicU64; REGIONS] = Default::default();
        buckets[0].store(min_buckets, Ordering::Relaxed);
        Ok(Index {
            regions,
            buckets,
            used: Default::default(),
            level: CachePadded::new(AtomicU64::new(0)),
            retired: Default::default(),
            pending: AtomicU64::new(0),
            fault,
            copy,
            next_size: AtomicU64::new(0),
            builds: AtomicU64::new(0),
            min_buckets,
            max_buckets,
            logged: AtomicBool::new(false),
        })
    }

    /// The levels to work with now. Take it under an epoch guard, and keep it no longer.
    #[inline]
    pub(super) fn view(&self) -> View<'_> {
        self.view_of(self.level.load(Ordering::Acquire))
    }

    fn view_of(&self, level: u64) -> View<'_> {
        let k = level >> 3;
        View {
            level,
            cur: self.level_in(region_of(k)),
            prev: (level & COPYING != 0).then(|| self.level_in(region_of(k + REGIONS as u64 - 1))),
        }
    }

    fn level_in(&self, region: usize) -> Level<'_> {
        let words = self.regions[region].words();
        // Committed before the level was published; the bound only keeps a broken
        // invariant from reading past the slice.
        let buckets = self.buckets[region]
            .load(Ordering::Acquire)
            .min((words.len() / BUCKET) as u64);
        Level {
            entries: &words[..buckets as usize * BUCKET],
            buckets,
        }
    }

    /// The entry of `id` (hash `h`), in the current level or the previous one. `key_of`
    /// reads the id in a slot.
    #[inline]
    pub(super) fn find<'a>(
        &self,
        view: &View<'a>,
        id: u64,
        h: u64,
        key_of: &impl Fn(u32) -> Option<u64>,
    ) -> Option<Hit<'a>> {
        if let Some(hit) = view.cur.find(id, h, key_of) {
            return Some(hit);
        }
        view.prev.and_then(|p| p.find(id, h, key_of))
    }

    /// The first words of `h`'s home bucket and the next one in the current level (to
    /// prefetch them); `None` while the level is empty.
    #[inline]
    pub(super) fn home_words<'a>(&self, view: &View<'a>, h: u64) -> Option<[&'a AtomicU64; 2]> {
        view.cur.home_words(h)
    }

    /// The first entry in `h`'s home bucket of the current level with `h`'s tag, if any: the
    /// entry of the id in the common case, to be confirmed by the id in its slot (else
    /// [`find`](Self::find)).
    #[inline]
    pub(super) fn candidate<'a>(&self, view: &View<'a>, h: u64) -> Option<Hit<'a>> {
        view.cur.candidate(h)
    }

    /// Adds the entry of `id` (hash `h`) for `slot`, stamped `stamp`, unless the id has one
    /// (then the existing entry: the caller's slot was not published). Refreshes `view`
    /// if the levels changed.
    pub(super) fn insert<'a>(
        &'a self,
        view: &mut View<'a>,
        id: u64,
        h: u64,
        slot: u32,
        stamp: u16,
        key_of: &impl Fn(u32) -> Option<u64>,
    ) -> Insert<'a> {
        let new = entry(slot, h, stamp);
        loop {
            let level = self.level.load(Ordering::SeqCst);
            if level & !(PREPARING | SWEEPING) != view.level & !(PREPARING | SWEEPING) {
                *view = self.view_of(level);
            }
            // While a level is being copied, an id is added to the new level only: found in
            // the old one, or its place there frozen first.
            if let Some(hit) = view.prev.and_then(|p| p.freeze(id, h, key_of)) {
                return Insert::Found(hit);
            }
            let region = region_of(level >> 3);
            if self.used[region].load(Ordering::Relaxed)
                >= view.cur.buckets * BUCKET as u64 / 20 * FULL_TWENTIETHS
            {
                return Insert::Full;
            }
            match view.cur.place(id, h, new, key_of) {
                Placed::New => {
                    self.used[region].fetch_add(1, Ordering::Relaxed);
                    return Insert::New;
                }
                Placed::Found(hit) => return Insert::Found(hit),
                Placed::NoRoom => return Insert::Full,
                // A copy of this level started (the level word says which): again, in the
                // new level.
                Placed::Frozen => view.level = u64::MAX,
            }
        }
    }

    /// Whether housekeeping is due: a copy or a release under way, or a build.
    #[inline]
    pub(super) fn has_work(&self) -> bool {
        let level = self.level.load(Ordering::Relaxed);
        if level & COPYING != 0 || self.pending.load(Ordering::Relaxed) != 0 {
            return true;
        }
        let region = region_of(level >> 3);
        self.used[region].load(Ordering::Relaxed)
            >= fifths(self.buckets[region].load(Ordering::Relaxed), GROW_FIFTHS)
    }

    /// One bounded step of housekeeping: copy 256 buckets into the new level, or fault in 8
    /// MiB of a level being built, or start a build (sized for `rows`), or give back 8 MiB
    /// of a retired level whose grace period is over. Whether it did something. Any number of threads may step at once; none waits for another.
    /// Run it outside an epoch guard where possible: a guard held here holds back the
    /// grace period of what it retires.
    pub(super) fn step(
        &self,
        epoch: &Epoch,
        rows: u64,
        key_of: &impl Fn(u32) -> Option<u64>,
    ) -> bool {
        self.copy_step(epoch, key_of)
            || self.fault_step()
            || self.build(rows)
            || self.release_step(epoch)
    }

    /// Gives back the next piece of the oldest retired level whose grace period is over.
    fn release_step(&self, epoch: &Epoch) -> bool {
        if self.pending.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let oldest = (0..REGIONS)
            .filter_map(|r| {
                let at = self.retired[r].at.load(Ordering::Acquire);
                (at != 0).then_some((at >> 1, r))
            })
            .min();
        let Some((retired_in, region)) = oldest else {
            return false;
        };
        if retired_in == NOT_YET >> 1 || !epoch.is_safe(retired_in) {
            return false;
        }
        let r = &self.retired[region];
        let end = r.bytes.load(Ordering::Acquire);
        let mut at = r.claimed.load(Ordering::Relaxed);
        let to = loop {
            if at >= end {
                return false;
            }
            let to = (at + RELEASE_BYTES).min(end);
            match r
                .claimed
                .compare_exchange(at, to, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => break to,
                Err(now) => at = now,
            }
        };
        if let Err(e) = self.regions[region].release(at as usize, (to - at) as usize) {
            // The pages stay; but they must read as zero before the region is used again.
            log::warn!("giving back a retired index level: {e}; clearing it instead");
            let words = self.regions[region].words();
            let (a, b) = ((at / 8) as usize, ((to / 8) as usize).min(words.len()));
            for w in &words[a..b] {
                w.store(EMPTY, Ordering::Relaxed);
            }
        }
        if r.released.fetch_add(to - at, Ordering::AcqRel) + (to - at) == end {
            self.buckets[region].store(0, Ordering::Relaxed);
            self.used[region].store(0, Ordering::Relaxed);
            r.at.store(0, Ordering::Release);
            self.pending.fetch_sub(1, Ordering::Relaxed);
        }
        true
    }

    /// Copies a chunk of the previous level not copied yet; the thread that completes the
    /// last chunk retires the level. Copying is idempotent (an entry already in the new
    /// level is left), so two threads may copy one chunk; only the first to mark it counts.
    fn copy_step(&self, epoch: &Epoch, key_of: &impl Fn(u32) -> Option<u64>) -> bool {
        let _guard = epoch.enter();
        let level = self.level.load(Ordering::SeqCst);
        if level & COPYING == 0 {
            return false;
        }
        let k = level >> 3;
        let view = self.view_of(level);
        let Some(prev) = view.prev else {
            return false;
        };
        let chunks = prev.buckets.div_ceil(COPY_BUCKETS);
        let Some(chunk) = self.copy.claim(k, chunks) else {
            return false;
        };
        let from = chunk * COPY_BUCKETS;
        let to = (from + COPY_BUCKETS).min(prev.buckets);
        let mut copied = 0;
        for b in from..to {
            for word in prev.bucket(b) {
                // Freeze an empty entry first: nothing lands in a bucket after its copy.
                let e = match word.compare_exchange(
                    EMPTY,
                    FROZEN,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                ) {
                    Ok(_) => continue,
                    Err(e) => e,
                };
                if !is_row(e) {
                    continue;
                }
                let Some(id) = key_of(slot_of(e)) else {
                    continue;
                };
                let h = hash(id);
                if tag(h) != tag_of(e) {
                    continue;
                }
                match view.cur.place(id, h, e, key_of) {
                    Placed::New => copied += 1,
                    Placed::Found(_) => {}
                    Placed::Frozen | Placed::NoRoom => {
                        // Cannot happen: the level is built with room for every row, and
                        // is not copied before this copy ends.
                        log::error!("an index level refused an entry while it was being built");
                    }
                }
            }
        }
        self.used[region_of(k)].fetch_add(copied, Ordering::Relaxed);
        if self.copy.finish(k, chunk, chunks) {
            // The old region is taken (not free for a build) before the level word lets a
            // build start, and its grace period counts from after the level word changed:
            // calls that may still look at the old level started before that.
            let old = &self.retired[region_of(k + REGIONS as u64 - 1)];
            let bytes = (prev.buckets * (BUCKET * 8) as u64).next_multiple_of(PAGE_BYTES);
            old.bytes.store(bytes, Ordering::Relaxed);
            old.claimed.store(0, Ordering::Relaxed);
            old.released.store(0, Ordering::Relaxed);
            old.at.store(NOT_YET, Ordering::Release);
            self.pending.fetch_add(1, Ordering::Relaxed);
            self.level.fetch_and(!COPYING, Ordering::SeqCst);
            old.at.store((epoch.now() << 1) | 1, Ordering::Release);
        }
        true
    }

    /// Starts a build when the current level is full enough and the next region is free:
    /// proposes its size, sets `PREPARING` and prepares it (see [`prepare`](Self::prepare)).
    fn build(&self, rows: u64) -> bool {
        let level = self.level.load(Ordering::SeqCst);
        if level & (FLAGS | SWEEPING) != 0 {
            return false;
        }
        let k = level >> 3;
        let (region, next) = (region_of(k), region_of(k + 1));
        let buckets = self.buckets[region].load(Ordering::Relaxed);
        if self.used[region].load(Ordering::Relaxed) < fifths(buckets, GROW_FIFTHS)
            || self.retired[next].at.load(Ordering::Acquire) != 0
        {
            return false;
        }
        let want = buckets_for(rows).clamp(self.min_buckets, self.max_buckets);
        if fifths(want, GROW_FIFTHS) <= rows {
            self.log_once(format_args!(
                "the index is at its largest ({} entries) for {rows} rows",
                want * BUCKET as u64
            ));
            return false;
        }
        let _ = self
            .next_size
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |size| {
                (size >> 40 <= k).then_some(((k + 1) << 40) | want)
            });
        if self
            .level
            .compare_exchange(
                level,
                level | PREPARING,
                Ordering::SeqCst,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return false;
        }
        self.prepare(k + 1)
    }

    /// Makes level `k` (being built: `PREPARING`) ready to be faulted in: its memory
    /// committed (address space, no pages yet), its size set, the fault-in and the copy
    /// started. Every part is idempotent, so any thread that steps does it (a thread
    /// preempted while it prepares holds up no one). False if it cannot be built (then the
    /// build is called off, logged).
    fn prepare(&self, k: u64) -> bool {
        let size = self.next_size.load(Ordering::SeqCst);
        if size >> 40 != k {
            return false;
        }
        let (want, next) = (size & ((1 << 40) - 1), region_of(k));
        let bytes = want * (BUCKET * 8) as u64;
        let chunks = self.buckets[region_of(k + REGIONS as u64 - 1)]
            .load(Ordering::Relaxed)
            .div_ceil(COPY_BUCKETS);
        let prepared = self.regions[next]
            .commit(bytes as usize)
            .and_then(|()| {
                self.buckets[next].store(want, Ordering::Release);
                self.copy.start(k, chunks)
            })
            .and_then(|()| self.fault.start(k, bytes.div_ceil(FAULT_BYTES)));
        if let Err(e) = prepared {
            self.log_once(format_args!("an index level of {want} buckets: {e}"));
            let _ = self.level.compare_exchange(
                ((k - 1) << 3) | PREPARING,
                (k - 1) << 3,
                Ordering::SeqCst,
                Ordering::Relaxed,
            );
            return false;
        }
        true
    }

    /// Faults in the next piece of the level being built (a write to each page that leaves
    /// its value as it is), so the copy does not stop a call for every page it touches
    /// first; the thread that finishes the last piece makes the level current.
    fn fault_step(&self) -> bool {
        let level = self.level.load(Ordering::SeqCst);
        if level & PREPARING == 0 {
            return false;
        }
        let k = (level >> 3) + 1;
        if !self.prepare(k) {
            return false;
        }
        let words = self.regions[region_of(k)].words();
        let bytes = (self.buckets[region_of(k)].load(Ordering::Acquire) * (BUCKET * 8) as u64)
            .min(words.len() as u64 * 8);
        let pieces = bytes.div_ceil(FAULT_BYTES);
        let Some(piece) = self.fault.claim(k, pieces) else {
            return false;
        };
        let (from, to) = (piece * FAULT_BYTES, ((piece + 1) * FAULT_BYTES).min(bytes));
        for w in words[(from / 8) as usize..(to / 8) as usize]
            .iter()
            .step_by((PAGE_BYTES / 8) as usize)
        {
            w.fetch_or(0, Ordering::Relaxed);
        }
        if self.fault.finish(k, piece, pieces) {
            self.builds.fetch_add(1, Ordering::Relaxed);
            self.level.store((k << 3) | COPYING, Ordering::SeqCst);
        }
        true
    }

    /// Turns the entries of the current level for which `evict(stamp, slot)` says so into
    /// tombstones, in buckets `from..from + count`; `evicted(slot)` for each (under an epoch
    /// guard: retire the slot in the epoch after its removal). No build starts meanwhile;
    /// refused while a level is being copied or built.
    pub(super) fn sweep(
        &self,
        epoch: &Epoch,
        from: u64,
        count: u64,
        mut evict: impl FnMut(u16, u32) -> bool,
        mut evicted: impl FnMut(u32),
    ) -> Swept {
        let level = self.level.load(Ordering::SeqCst);
        if level & (FLAGS | SWEEPING) != 0
            || self
                .level
                .compare_exchange(level, level | SWEEPING, Ordering::SeqCst, Ordering::Relaxed)
                .is_err()
        {
            return Swept::Busy;
        }
        let _guard = epoch.enter();
        let cur = self.view_of(level).cur;
        let to = from.saturating_add(count).min(cur.buckets);
        for b in from.min(to)..to {
            for word in cur.bucket(b) {
                let e = word.load(Ordering::SeqCst);
                if is_row(e)
                    && evict((e >> 48) as u16, slot_of(e))
                    && word
                        .compare_exchange(e, TOMB, Ordering::SeqCst, Ordering::Relaxed)
                        .is_ok()
                {
                    evicted(slot_of(e));
                }
            }
        }
        self.level.fetch_and(!SWEEPING, Ordering::SeqCst);
        Swept::Upto(to, cur.buckets)
    }

    /// Calls `f(stamp)` for each row's entry in the current level (none while a level is
    /// being copied: `false`).
    pub(super) fn stamps(&self, epoch: &Epoch, mut f: impl FnMut(u16)) -> bool {
        let _guard = epoch.enter();
        let view = self.view();
        if view.prev.is_some() {
            return false;
        }
        for word in view.cur.entries {
            let e = word.load(Ordering::Relaxed);
            if is_row(e) {
                f((e >> 48) as u16);
            }
        }
        true
    }

    /// Entries of the current level.
    pub(super) fn capacity(&self) -> u64 {
        self.view().cur.buckets * BUCKET as u64
    }

    /// Levels built after the first.
    pub(super) fn builds(&self) -> u64 {
        self.builds.load(Ordering::Relaxed)
    }

    /// Whether a level is being copied.
    #[cfg(test)]
    pub(super) fn copying(&self) -> bool {
        self.level.load(Ordering::Relaxed) & COPYING != 0
    }

    /// Bytes of index committed (all regions).
    pub(super) fn committed_bytes(&self) -> u64 {
        self.regions
            .iter()
            .map(|r| r.committed() as u64)
            .sum::<u64>()
            + (self.copy.committed() + self.fault.committed()) as u64
    }

    /// Bytes of the index in use: the current level and, while copying or releasing, the
    /// previous ones.
    pub(super) fn live_bytes(&self) -> u64 {
        let view = self.view();
        let prev = view.prev.map_or(0, |p| p.buckets * 64);
        let retired: u64 = self
            .retired
            .iter()
            .filter(|r| r.at.load(Ordering::Relaxed) != 0)
            .map(|r| {
                r.bytes
                    .load(Ordering::Relaxed)
                    .saturating_sub(r.released.load(Ordering::Relaxed))
            })
            .sum();
        view.cur.buckets * 64 + prev + retired
    }

    /// What became of the huge-page advice.
    pub(super) fn huge_pages(&self) -> HugePages {
        self.regions[0].huge_pages()
    }

    fn log_once(&self, what: std::fmt::Arguments<'_>) {
        if !self.logged.swap(true, Ordering::Relaxed) {
            log::warn!("{what}; new rows are refused when the index is full");
        }
    }
}

/// Buckets of a level built for `rows` rows (2/5 full).
fn buckets_for(rows: u64) -> u64 {
    (rows.saturating_mul(5) / BUILD_FIFTHS).div_ceil(BUCKET as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids stored as `slot = id`, so a key lookup is the identity.
    fn key(slot: u32) -> Option<u64> {
        Some(u64::from(slot))
    }

    fn add(index: &Index, epoch: &Epoch, id: u32) -> bool {
        let _g = epoch.enter();
        let mut view = index.view();
        matches!(
            index.insert(&mut view, u64::from(id), hash(u64::from(id)), id, 0, &key),
            Insert::New
        )
    }

    fn get(index: &Index, epoch: &Epoch, id: u32) -> Option<u32> {
        let _g = epoch.enter();
        let view = index.view();
        index
            .find(&view, u64::from(id), hash(u64::from(id)), &key)
            .map(|h| h.slot())
    }

    #[test]
    fn insert_find_and_duplicates() {
        let (index, epoch) = (Index::new(100, 1 << 20, false).unwrap(), Epoch::default());
        assert_eq!(index.capacity(), MIN_BUCKETS * 8);
        for id in 0..300 {
            assert!(add(&index, &epoch, id));
        }
        // A second insert of an id finds the first.
        assert!(!add(&index, &epoch, 7));
        for id in 0..300 {
            assert_eq!(get(&index, &epoch, id), Some(id));
        }
        assert_eq!(get(&index, &epoch, 300), None);
        assert!(!index.has_work());
    }

    #[test]
    fn growth_in_steps_keeps_every_entry_findable() {
        let (index, epoch) = (Index::new(0, 1 << 24, false).unwrap(), Epoch::default());
        let mut n = 0u32;
        let mut steps = 0;
        while index.builds() < 4 {
            for _ in 0..20 {
                assert!(add(&index, &epoch, n));
                n += 1;
            }
            // Between steps, everything added so far is found.
            for id in (0..n).step_by(7) {
                assert_eq!(get(&index, &epoch, id), Some(id), "id {id} of {n}");
            }
            while index.has_work() && index.step(&epoch, u64::from(n), &key) {
                steps += 1;
                for id in (0..n).step_by(13) {
                    assert_eq!(get(&index, &epoch, id), Some(id));
                }
            }
        }
        assert!(steps > 4);
        assert!(!index.copying());
        // Filled to at most 4/5 + one batch; the level holds every id.
        assert!(index.capacity() >= u64::from(n));
        for id in 0..n {
            assert_eq!(get(&index, &epoch, id), Some(id));
        }
    }

    #[test]
    fn full_level_refuses_until_built() {
        let (index, epoch) = (Index::new(0, 1 << 20, false).unwrap(), Epoch::default());
        let cap = index.capacity() as u32;
        let full_at = cap / 20 * 19;
        for id in 0..full_at {
            assert!(add(&index, &epoch, id));
        }
        let _g = epoch.enter();
        let mut view = index.view();
        assert!(matches!(
            index.insert(&mut view, 1 << 30, hash(1 << 30), 5, 0, &key),
            Insert::Full
        ));
        drop(_g);
        while !index.copying() {
            assert!(index.step(&epoch, u64::from(full_at), &key));
        }
        assert!(add(&index, &epoch, full_at));
    }

    #[test]
    fn sweep_removes_and_rebuild_clears_tombstones() {
        let (index, epoch) = (Index::new(1000, 1 << 20, false).unwrap(), Epoch::default());
        for id in 0..1000 {
            assert!(add(&index, &epoch, id));
        }
        let mut gone = Vec::new();
        let swept = index.sweep(
            &epoch,
            0,
            u64::MAX,
            |_, slot| slot % 2 == 0,
            |s| gone.push(s),
        );
        assert_eq!(
            swept,
            Swept::Upto(index.capacity() / 8, index.capacity() / 8)
        );
        assert_eq!(gone.len(), 500);
        assert_eq!(get(&index, &epoch, 2), None);
        assert_eq!(get(&index, &epoch, 3), Some(3));
        // Stamps of the rows left.
        let mut n = 0;
        assert!(index.stamps(&epoch, |_| n += 1));
        assert_eq!(n, 500);
        // Fill with new ids until a build is due: sized for the live rows, not the
        // tombstones.
        let mut id = 10_000;
        while !index.has_work() {
            assert!(add(&index, &epoch, id));
            id += 1;
        }
        let live = 500 + (id - 10_000);
        while index.has_work() {
            index.step(&epoch, u64::from(live), &key);
        }
        assert_eq!(index.builds(), 1);
        assert_eq!(get(&index, &epoch, 4), None);
        assert_eq!(get(&index, &epoch, 5), Some(5));
        assert_eq!(get(&index, &epoch, id - 1), Some(id - 1));
    }

    #[test]
    fn touch_sets_the_stamp_once() {
        let (index, epoch) = (Index::new(10, 1 << 20, false).unwrap(), Epoch::default());
        assert!(add(&index, &epoch, 3));
        let _g = epoch.enter();
        let view = index.view();
        let hit = index.find(&view, 3, hash(3), &key).unwrap();
        hit.touch(9);
        let mut stamps = Vec::new();
        index.stamps(&epoch, |s| stamps.push(s));
        assert_eq!(stamps, [9]);
        // A stale hit (stamp 0) cannot overwrite: its compare-and-swap fails.
        hit.touch(12);
        let hit = index.find(&view, 3, hash(3), &key).unwrap();
        assert_eq!(hit.slot(), 3);
        hit.touch(12);
        stamps.clear();
        index.stamps(&epoch, |s| stamps.push(s));
        assert_eq!(stamps, [12]);
    }

    #[test]
    fn concurrent_inserts_while_growing() {
        let (index, epoch) = (Index::new(0, 1 << 24, false).unwrap(), Epoch::default());
        let rows = AtomicU64::new(0);
        const THREADS: u32 = 4;
        const PER: u32 = 30_000;
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (index, epoch, rows) = (&index, &epoch, &rows);
                s.spawn(move || {
                    // Each thread adds its own ids and, racing with the others, id 0..1000;
                    // on `Full`, a housekeeping step and another try; after each insert, a
                    // step outside its guard, as a table does.
                    for i in 0..PER {
                        let id = if i % 30 == 0 {
                            i / 30
                        } else {
                            1000 + t * PER + i
                        };
                        let mut added = false;
                        for _ in 0..1000 {
                            let _g = epoch.enter();
                            let mut view = index.view();
                            let h = hash(u64::from(id));
                            match index.insert(&mut view, u64::from(id), h, id, 0, &key) {
                                Insert::New => {
                                    rows.fetch_add(1, Ordering::Relaxed);
                                    added = true;
                                    break;
                                }
                                Insert::Found(_) => break,
                                Insert::Full => {
                                    // The table refuses the row here (counted); this test
                                    // checks that the index gets out of it.
                                    drop(_g);
                                    index.step(epoch, rows.load(Ordering::Relaxed), &key);
                                    std::thread::yield_now();
                                }
                            }
                        }
                        assert!(added || id < 1000, "id {id} refused");
                        if index.has_work() {
                            index.step(epoch, rows.load(Ordering::Relaxed), &key);
                        }
                    }
                });
            }
        });
        while index.has_work() {
            index.step(&epoch, rows.load(Ordering::Relaxed), &key);
        }
        assert!(index.builds() >= 4, "{}", index.builds());
        for t in 0..THREADS {
            for i in (0..PER).filter(|i| i % 30 != 0) {
                let id = 1000 + t * PER + i;
                assert_eq!(get(&index, &epoch, id), Some(id));
            }
        }
        // Raced ids: present, and once (a second insert finds the first; the level holds
        // one entry per id).
        for id in 0..1000 {
            assert!(!add(&index, &epoch, id), "id {id} missing");
        }
        let mut entries = 0;
        assert!(index.stamps(&epoch, |_| entries += 1));
        assert_eq!(entries, 1000 + THREADS * (PER - PER / 30));
        assert_eq!(rows.load(Ordering::Relaxed), u64::from(entries));
    }
}
