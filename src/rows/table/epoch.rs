//! Grace periods: when memory a [`PsTable`](super::PsTable) took out of use (an index level
//! after growth, the slot of an evicted row) may be given back or reused, because no call
//! that could still see it is running.
//!
//! Every pull, push or scan holds a [`Guard`] of the epoch it started in; the epoch advances
//! only when no guard of the epoch before the current one is left. So once the epoch has
//! advanced twice past the one something was retired in, every call that started before
//! the retirement has ended. Two counters, one per epoch parity, on lines of their own:
//! entering and leaving cost two atomic read-modify-writes per call (not per row), and no
//! thread ever waits for another here: the retiring side only asks, and tries later.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use crossbeam_utils::CachePadded;

/// The epoch and the calls running in each parity of it.
#[derive(Debug, Default)]
pub(super) struct Epoch {
    now: CachePadded<AtomicU64>,
    active: [CachePadded<AtomicU64>; 2],
}

/// A running call, counted in its epoch until dropped.
#[derive(Debug)]
pub(super) struct Guard<'a> {
    epoch: &'a Epoch,
    parity: usize,
}

impl Epoch {
    /// Counts a call in the current epoch until the guard is dropped.
    pub(super) fn enter(&self) -> Guard<'_> {
        loop {
            let e = self.now.load(SeqCst);
            let parity = (e & 1) as usize;
            self.active[parity].fetch_add(1, SeqCst);
            // Counted under the epoch it read, unless the epoch moved meanwhile (then the
            // count might be under a parity the advancing side already checked).
            if self.now.load(SeqCst) == e {
                return Guard {
                    epoch: self,
                    parity,
                };
            }
            self.active[parity].fetch_sub(1, SeqCst);
        }
    }

    /// The current epoch.
    pub(super) fn now(&self) -> u64 {
        self.now.load(SeqCst)
    }

    /// Advances the epoch if no call of the one before the current one is running; the
    /// epoch after.
    pub(super) fn try_advance(&self) -> u64 {
        let e = self.now.load(SeqCst);
        if self.active[((e + 1) & 1) as usize].load(SeqCst) == 0 {
            let _ = self.now.compare_exchange(e, e + 1, SeqCst, SeqCst);
        }
        self.now.load(SeqCst)
    }

    /// Whether everything retired in epoch `retired` is out of every call's sight,
    /// advancing the epoch if that helps.
    pub(super) fn is_safe(&self, retired: u64) -> bool {
        if self.now() >= retired + 2 {
            return true;
        }
        self.try_advance();
        self.try_advance() >= retired + 2
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.epoch.active[self.parity].fetch_sub(1, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_call_holds_back_the_grace_period() {
        let epoch = Epoch::default();
        let retired = epoch.now();
        let old = epoch.enter();
        // The epoch may advance once (the call is in the current epoch), not twice.
        assert!(!epoch.is_safe(retired));
        assert!(!epoch.is_safe(retired));
        assert_eq!(epoch.now(), retired + 1);
        // A call that starts now does not hold back what was retired before it.
        let new = epoch.enter();
        drop(old);
        assert!(epoch.is_safe(retired));
        // ... but it holds back what is retired while it runs.
        let later = epoch.now();
        assert!(!epoch.is_safe(later));
        drop(new);
        assert!(epoch.is_safe(later));
    }

    #[test]
    fn threads_entering_and_leaving() {
        let epoch = Epoch::default();
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..20_000 {
                        let _g = epoch.enter();
                    }
                });
            }
            s.spawn(|| {
                for _ in 0..2000 {
                    epoch.try_advance();
                }
            });
        });
        assert_eq!(epoch.active[0].load(SeqCst), 0);
        assert_eq!(epoch.active[1].load(SeqCst), 0);
        let e = epoch.now();
        assert!(epoch.is_safe(e));
    }
}
