//! Whether naming the versions of the cached rows pays. A versioned pull carries 8 bytes
//! per id asked for (the version held, 0 for none) and its answer 8 bytes per row sent (its
//! version); each row answered unchanged saves its bytes. A worker that pushes every row it
//! pulls, as a trainer does, finds its cached rows changed by its own pushes: every row
//! comes back, 16 bytes dearer. So the pipeline judges the versioned pulls by what they
//! saved over a window of rows named, and sends plain pulls for a while after a window that
//! did not pay; then it tries again. Sans-IO: counts in, a yes or no out.

/// Rows named with a version (a held version other than 0) that make a window.
pub(crate) const WINDOW_ROWS: u64 = 4096;

/// Steps of plain pulls after a window whose versions cost more than they saved.
pub(crate) const PAUSE_STEPS: u64 = 64;

/// Bytes a versioned pull adds per id asked for and per row sent: the version each way.
const VERSION_BYTES: u64 = 8;

/// The judgement of the versioned pulls of one pipeline.
#[derive(Debug, Default)]
pub(crate) struct Refresh {
    /// In the current window: rows named with a version, rows answered unchanged, and the
    /// bytes the versions cost.
    named: u64,
    unchanged: u64,
    cost: u64,
    /// Plain pulls until this step.
    paused_until: u64,
    /// Windows that did not pay (for the report).
    pauses: u64,
}

impl Refresh {
    /// Whether a pull sent in `step` names the versions of the rows the cache holds.
    pub(crate) fn names_versions(&self, step: u64) -> bool {
        step >= self.paused_until
    }

    /// Counts a versioned pull's part sent in `step`: `asked` ids, `named` of them with a
    /// version held, and its answer: `sent` rows sent and `unchanged` rows answered
    /// unchanged, of `row_bytes` each. At the end of a window whose versions cost more
    /// than the unchanged rows saved, plain pulls follow for [`PAUSE_STEPS`] steps.
    pub(crate) fn record(
        &mut self,
        step: u64,
        asked: usize,
        named: usize,
        sent: usize,
        unchanged: usize,
        row_bytes: usize,
    ) {
        // A pull that named nothing (the cache's rows came without versions: at the start,
        // or by plain pulls during a pause) is what getting versions costs; it is not
        // charged to the next window.
        if named == 0 {
            return;
        }
        self.named += named as u64;
        self.unchanged += unchanged as u64;
        self.cost += VERSION_BYTES * (asked + sent) as u64;
        if self.named < WINDOW_ROWS {
            return;
        }
        if self.unchanged * row_bytes as u64 <= self.cost {
            self.paused_until = step + 1 + PAUSE_STEPS;
            self.pauses += 1;
        }
        (self.named, self.unchanged, self.cost) = (0, 0, 0);
    }

    /// Windows whose versions did not pay, each followed by a pause.
    pub(crate) fn pauses(&self) -> u64 {
        self.pauses
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_that_save_nothing_pause_after_a_window_then_are_tried_again() {
        let mut r = Refresh::default();
        // 64-byte rows, 1,000 asked per step, all named, every one sent again (changed).
        let mut step = 0;
        while r.names_versions(step) {
            r.record(step, 1000, 1000, 1000, 0, 64);
            step += 1;
        }
        // The window closed at the 5th step (4,000 named, then 5,000).
        assert_eq!((step, r.pauses()), (5, 1));
        assert!((step..step + PAUSE_STEPS).all(|s| !r.names_versions(s)));
        assert!(r.names_versions(step + PAUSE_STEPS));
    }

    #[test]
    fn versions_that_save_more_than_they_cost_go_on() {
        let mut r = Refresh::default();
        // Half the rows unchanged: 500 × 64 B saved against 8 B × 1,000 asked and 8 B ×
        // 500 sent (12,000 B): it pays.
        for step in 0..100 {
            assert!(r.names_versions(step), "step {step}");
            r.record(step, 1000, 1000, 500, 500, 64);
        }
        assert_eq!(r.pauses(), 0);
        // 200 unchanged (12,800 B saved) against 8 B × (1,000 + 800) (14,400 B): it pauses.
        let mut r = Refresh::default();
        for step in 0..5 {
            r.record(step, 1000, 1000, 800, 200, 64);
        }
        assert_eq!(r.pauses(), 1);
    }

    #[test]
    fn rows_not_named_do_not_close_a_window() {
        // After a pause the cached rows have no versions (they came by plain pulls): the
        // pulls that fetch them again name nothing and do not count as a window.
        let mut r = Refresh::default();
        for step in 0..100 {
            r.record(step, 1000, 0, 1000, 0, 64);
        }
        assert_eq!(r.pauses(), 0);
        assert!(r.names_versions(100));
        // Nor is their cost charged to the window that follows: one that pays goes on.
        for step in 100..110 {
            r.record(step, 1000, 1000, 500, 500, 64);
        }
        assert_eq!(r.pauses(), 0);
    }
}
