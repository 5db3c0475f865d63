//! What a [`PsTable`](super::PsTable) counts, and its sample of the hottest ids.
//!
//! Counters are added to once per call (not per row). The hottest ids come from a sample
//! of the rows pulled and pushed (one in `sample_every`, at an offset that changes from
//! call to call), counted in 1,024 cells chosen by a hash of the id: a cell keeps one id
//! and a count that a sighting of that id raises and a sighting of another id lowers (the
//! other id takes the cell when the count is 0), so an id sampled more often than all the
//! others of its cell together holds it. Approximate by design — racing threads may lose a
//! count — and enough to point at the ids that make a PS shard hot.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::hash::mix64;
use crate::stats::HotId;

/// Salt of the cell hash, unrelated to the index's and the sketch's.
const SALT: u64 = 0xa54f_f53a_5f1d_36f1;

/// Cells of the hot-id sample.
const CELLS: usize = 1024;

/// Counts of what happened to a table, added to by each call.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) pulls: AtomicU64,
    pub(super) pushes: AtomicU64,
    pub(super) pulled_rows: AtomicU64,
    pub(super) pushed_rows: AtomicU64,
    pub(super) missing: AtomicU64,
    pub(super) unchanged_rows: AtomicU64,
    pub(super) created: AtomicU64,
    pub(super) loaded: AtomicU64,
    pub(super) not_admitted: AtomicU64,
    pub(super) refused: AtomicU64,
    pub(super) dropped_pushes: AtomicU64,
    pub(super) evicted_untouched: AtomicU64,
    pub(super) evicted_over_cap: AtomicU64,
}

/// Adds `n` to `counter` unless it is 0 (a shared line left alone when nothing happened).
pub(super) fn add(counter: &AtomicU64, n: u64) {
    if n != 0 {
        counter.fetch_add(n, Relaxed);
    }
}

/// The sampled counts of the hottest ids; see the module documentation.
#[derive(Debug)]
pub(super) struct HotIds {
    /// Per cell: the id, and its count (0: empty).
    cells: Box<[[AtomicU64; 2]]>,
    every: u32,
}

impl HotIds {
    /// Samples one row in `every` (at least 1).
    pub(super) fn new(every: u32) -> HotIds {
        HotIds {
            cells: (0..CELLS)
                .map(|_| [AtomicU64::new(0), AtomicU64::new(0)])
                .collect(),
            every: every.max(1),
        }
    }

    /// One row in how many is sampled.
    pub(super) fn every(&self) -> u32 {
        self.every
    }

    /// Samples the ids of a call: one in `every`, from a position chosen by `call` (a
    /// number that differs from call to call).
    pub(super) fn sample(&self, ids: &[u64], call: u64) {
        let every = self.every as usize;
        let start = (mix64(call) % every as u64) as usize;
        for &id in ids.iter().skip(start).step_by(every) {
            self.record(id);
        }
    }

    /// Counts one sighting of `id`.
    fn record(&self, id: u64) {
        let cell = &self.cells[mix64(id ^ SALT) as usize % CELLS];
        let count = cell[1].load(Relaxed);
        if count == 0 {
            cell[0].store(id, Relaxed);
            cell[1].store(1, Relaxed);
        } else if cell[0].load(Relaxed) == id {
            cell[1].fetch_add(1, Relaxed);
        } else {
            let _ = cell[1].compare_exchange(count, count - 1, Relaxed, Relaxed);
        }
    }

    /// The `k` ids with the highest counts, highest first (ties: smaller id first).
    pub(super) fn top(&self, k: usize) -> Vec<HotId> {
        let mut hot: Vec<HotId> = self
            .cells
            .iter()
            .filter_map(|c| {
                let sampled = c[1].load(Relaxed);
                (sampled > 0).then(|| HotId {
                    id: c[0].load(Relaxed),
                    sampled,
                })
            })
            .collect();
        hot.sort_unstable_by(|a, b| b.sampled.cmp(&a.sampled).then(a.id.cmp(&b.id)));
        hot.truncate(k);
        hot
    }

    /// Halves every count, so the sample follows the recent past.
    pub(super) fn decay(&self) {
        for c in self.cells.iter() {
            let v = c[1].load(Relaxed);
            let _ = c[1].compare_exchange(v, v / 2, Relaxed, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_ids_found_among_a_uniform_crowd() {
        let hot = HotIds::new(4);
        // Ids 1, 2 and 3 are 5 %, 3 % and 2 % of 20,000 rows; the others are all distinct.
        let ids: Vec<u64> = (0..20_000u64)
            .map(|i| match crate::hash::splitmix64(i) % 100 {
                0..=4 => 1,
                5..=7 => 2,
                8..=9 => 3,
                _ => 1000 + i,
            })
            .collect();
        for (call, batch) in ids.chunks(1000).enumerate() {
            hot.sample(batch, call as u64);
        }
        let top = hot.top(3);
        assert_eq!(
            top.iter().map(|h| h.id).collect::<Vec<_>>(),
            [1, 2, 3],
            "{top:?}"
        );
        // Sampled about 1 in 4 of its 1,000 sightings (less what the others took).
        assert!(top[0].sampled > 150, "{top:?}");
        hot.decay();
        assert!(hot.top(1)[0].sampled <= top[0].sampled / 2 + 1);
        assert!(hot.top(0).is_empty());
        assert_eq!(hot.every(), 4);
    }
}
