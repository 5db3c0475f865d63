//! Admission: a row is created only at the `n`-th sighting of its id (Monolith's and
//! DeepRec's feature filter), so ids seen once or twice — most of a long tail — never take
//! a slot.
//!
//! Sightings are counted in a count-min sketch of two rows of 8-bit counters with
//! conservative update (only the smallest of an id's counters grow), fixed in size and
//! lock-free: an id's count is never under its number of sightings (so an id is not admitted
//! late; two threads counting the same id at the same instant may cost it one sighting
//! more), and over it only when other ids share both its counters (so a crowded sketch
//! admits early). Counts saturate at 255.

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use crate::hash::mix64;

/// Salt of the sketch's hash, unrelated to the index's.
const SALT: u64 = 0x3c6e_f372_fe94_f82b;

/// Sighting counters; see the module documentation.
#[derive(Debug)]
pub(super) struct Sketch {
    counters: Box<[AtomicU8]>,
    /// Counters per row, minus one (a power of two minus one).
    mask: usize,
    /// Sightings that admit.
    threshold: u8,
}

impl Sketch {
    /// A sketch of `2 × counters_per_row` counters (rounded up to a power of two) that
    /// admits at `threshold` sightings.
    pub(super) fn new(counters_per_row: usize, threshold: u8) -> Sketch {
        let per_row = counters_per_row.max(64).next_power_of_two();
        Sketch {
            counters: (0..2 * per_row).map(|_| AtomicU8::new(0)).collect(),
            mask: per_row - 1,
            threshold,
        }
    }

    /// Bytes of counters.
    pub(super) fn bytes(&self) -> usize {
        self.counters.len()
    }

    /// Counts a sighting of `id`; whether it is admitted now.
    pub(super) fn sight(&self, id: u64) -> bool {
        let h = mix64(id ^ SALT);
        let a = &self.counters[h as usize & self.mask];
        let b = &self.counters[self.mask + 1 + ((h >> 32) as usize & self.mask)];
        let (ca, cb) = (a.load(Relaxed), b.load(Relaxed));
        let min = ca.min(cb);
        if min.saturating_add(1) >= self.threshold {
            return true;
        }
        // Conservative update: raise only the counters at the minimum. A lost race
        // leaves a counter one short, which costs one more sighting, never correctness.
        for (c, v) in [(a, ca), (b, cb)] {
            if v == min {
                let _ = c.compare_exchange(v, v + 1, Relaxed, Relaxed);
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_at_the_nth_sighting() {
        let s = Sketch::new(1 << 12, 3);
        assert!(!s.sight(5));
        assert!(!s.sight(5));
        assert!(s.sight(5));
        assert!(s.sight(5));
        // Other ids have their own counts.
        assert!(!s.sight(6));
        // Threshold 1 admits at once.
        assert!(Sketch::new(64, 1).sight(9));
    }

    #[test]
    fn never_admits_late_in_a_crowded_sketch() {
        // 64 counters per row for 10,000 ids: every id must still be admitted by its
        // 4th sighting (early admission is allowed, late is not).
        let s = Sketch::new(64, 4);
        for round in 1..=4 {
            for id in 0..10_000u64 {
                let admitted = s.sight(id);
                if round == 4 {
                    assert!(admitted, "id {id}");
                }
            }
        }
        assert_eq!(s.bytes(), 128);
    }
}
