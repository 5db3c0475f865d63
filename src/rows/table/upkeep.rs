//! A [`PsTable`]'s clock and its upkeep off the row path: [`PsTable::maintain`] finishes
//! index work, reuses the slots of evicted rows once no call can see them, and evicts.
//!
//! Eviction happens only here, never in a pull or a push: a serving PS runs `maintain` from
//! a thread of its own (every second or so, and at least every
//! [`MAX_EVICT_TICKS`](super::ps::MAX_EVICT_TICKS) ticks). It walks the index's entries in
//! pieces of 4,096 buckets and turns the chosen ones into tombstones; the loops go on
//! pulling and pushing meanwhile (a row evicted while a call uses it is used to the end of
//! that call; the next touch creates it again, with its initial values).

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::PoisonError;

use super::index::Swept;
use super::metrics;
use super::ps_table::PsTable;

/// Buckets swept per piece.
const SWEEP_BUCKETS: u64 = 4096;

/// Most housekeeping steps one `maintain` runs (each a bounded piece of work).
const MAX_STEPS: u64 = 1 << 20;

/// Tries of a sweep piece while another thread keeps house, before giving up for this
/// round.
const BUSY_TRIES: u32 = 1000;

/// What one [`PsTable::maintain`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MaintainReport {
    /// Index housekeeping steps run (copying a level, giving memory back, starting a build).
    pub index_steps: u64,
    /// Slots of evicted rows made reusable.
    pub slots_reused: u64,
    /// Slots of evicted rows still waiting for calls that may see them to end.
    pub slots_waiting: u64,
    /// Rows evicted for not being touched for the set number of ticks.
    pub evicted_untouched: u64,
    /// Rows evicted to bring the table under its row cap.
    pub evicted_over_cap: u64,
}

impl PsTable {
    /// The table's clock: a count the PS advances (per training step, per minute — its
    /// choice) so the table knows how long a row has not been touched.
    pub fn clock(&self) -> u64 {
        self.clock.load(Ordering::Relaxed)
    }

    /// Advances the clock by one tick; the new value.
    pub fn advance_clock(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Sets the clock (a checkpoint restores it).
    pub fn set_clock(&self, ticks: u64) {
        self.clock.store(ticks, Ordering::Relaxed);
    }

    /// Upkeep off the row path: finishes index work under way, makes the slots of evicted
    /// rows reusable once no call can still see them, evicts rows untouched for the set
    /// ticks ([`PsTableBuilder::evict_untouched`](super::PsTableBuilder::evict_untouched))
    /// and, over 95 % of the row cap, the least recently touched down to 90 %; halves the
    /// hot-id counts. Run it from a thread of its own; concurrent calls of `maintain` take
    /// turns.
    pub fn maintain(&self) -> MaintainReport {
        let mut limbo = self.limbo.lock().unwrap_or_else(PoisonError::into_inner);
        let mut report = MaintainReport::default();
        let key_of = |s| self.key_of(s);
        while report.index_steps < MAX_STEPS
            && self.index.has_work()
            && self.index.step(&self.epoch, self.slots.rows(), &key_of)
        {
            report.index_steps += 1;
        }
        let before = limbo.len();
        limbo.retain(|&(retired, slot)| {
            let waiting = !self.epoch.is_safe(retired);
            if !waiting {
                self.slots.free(slot);
            }
            waiting
        });
        report.slots_reused = (before - limbo.len()) as u64;

        let now = self.clock() as u16;
        if let Some(ticks) = self.settings.evict_untouched {
            let n = self.evict(&mut limbo, u64::MAX, |age| age > ticks);
            metrics::add(&self.counters.evicted_untouched, n);
            report.evicted_untouched = n;
        }
        let cap = self.settings.max_rows;
        if self.settings.capped() && self.slots.rows() > cap / 20 * 19 {
            let excess = self.slots.rows().saturating_sub(cap / 10 * 9);
            // Ages of all rows, then the age above which the oldest `excess` are.
            let mut ages = vec![0u64; 1 << 16];
            if self.index.stamps(&self.epoch, |stamp| {
                ages[now.wrapping_sub(stamp) as usize] += 1
            }) {
                let mut oldest = 0;
                let mut threshold = 0u16;
                for age in (0..=u16::MAX).rev() {
                    oldest += ages[age as usize];
                    if oldest >= excess {
                        threshold = age;
                        break;
                    }
                }
                let n = self.evict(&mut limbo, excess, |age| age >= threshold);
                metrics::add(&self.counters.evicted_over_cap, n);
                report.evicted_over_cap = n;
            }
        }
        if let Some(hot) = &self.hot {
            hot.decay();
        }
        report.slots_waiting = limbo.len() as u64;
        report
    }

    /// Evicts up to `most` rows whose age (ticks since their last touch) `old` accepts;
    /// their slots wait in `limbo`. How many.
    fn evict(&self, limbo: &mut Vec<(u64, u32)>, most: u64, old: impl Fn(u16) -> bool) -> u64 {
        let now = self.clock() as u16;
        let evicted = Cell::new(0u64);
        let mut from = 0;
        let mut busy = 0;
        loop {
            let swept = self.index.sweep(
                &self.epoch,
                from,
                SWEEP_BUCKETS,
                |stamp, _| evicted.get() < most && old(now.wrapping_sub(stamp)),
                |slot| {
                    self.slots.clear_live(slot);
                    limbo.push((self.epoch.now(), slot));
                    evicted.set(evicted.get() + 1);
                },
            );
            match swept {
                Swept::Upto(to, buckets) if to >= buckets => break,
                Swept::Upto(to, _) => from = to,
                Swept::Busy => {
                    // A loop is at a housekeeping step (or a level is being copied): help,
                    // then try again; a copy ends in a bounded number of steps.
                    self.upkeep_step();
                    busy += 1;
                    if busy > BUSY_TRIES {
                        break;
                    }
                    std::thread::yield_now();
                }
            }
        }
        evicted.get()
    }
}
