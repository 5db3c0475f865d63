//! What a loop thread does on a turn that found nothing to do: spin, yield its CPU, or
//! park in the kernel. Sans-IO: the loop passes the turn's clock reading in.
//!
//! - **Spin-then-park** (polling off): for the spin budget every idle turn yields the CPU
//!   (free when nothing else wants it; a [`Handle`](crate::Handle)'s thread on the same
//!   CPU runs at once), then the loop parks.
//! - **Polling**: the loop never parks. It spins, and yields the CPU on its first idle turn
//!   after work and then every [`POLL_YIELD_EVERY`] of idleness. A loop with a CPU of its
//!   own pays one `sched_yield` per burst of work and one per interval (it returns at once
//!   when nothing else is runnable); a thread sharing its CPU, such as a `Handle`'s caller
//!   waiting for what the last turn completed, runs right after that turn instead of after
//!   the scheduler's time slice. Measured (docs/performance.md, runs I11 and I12): a
//!   polling loop that never yielded, sharing a CPU with its caller, took about 8 ms per
//!   round trip; 11.5–15.6 µs once it yields.

use std::time::{Duration, Instant};

/// How often a polling loop yields its CPU while it stays idle.
pub(crate) const POLL_YIELD_EVERY: Duration = Duration::from_micros(20);

/// What an idle turn does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdleStep {
    /// Check again at once (`spin_loop` hint).
    Spin,
    /// Give the CPU to whatever else is runnable on it, then check again.
    Yield,
    /// Sleep in the kernel until I/O, a timer or the doorbell.
    Park,
}

/// The idle state of one loop thread.
#[derive(Debug, Default)]
pub(crate) struct IdlePacer {
    /// The first idle turn since the loop last made progress or parked.
    idle_since: Option<Instant>,
    /// When a polling loop last yielded.
    last_yield: Option<Instant>,
}

impl IdlePacer {
    /// The last turn made progress.
    pub(crate) fn progress(&mut self) {
        self.idle_since = None;
    }

    /// The loop woke from a park.
    pub(crate) fn woke(&mut self) {
        self.idle_since = None;
    }

    /// A turn at `now` found nothing to do: what next, for a loop `polling` or spinning
    /// `spin` before it parks.
    pub(crate) fn idle(&mut self, now: Instant, polling: bool, spin: Duration) -> IdleStep {
        let first = self.idle_since.is_none();
        let since = *self.idle_since.get_or_insert(now);
        if polling {
            let due = self.last_yield.map_or(true, |at| {
                now.saturating_duration_since(at) >= POLL_YIELD_EVERY
            });
            if first || due {
                self.last_yield = Some(now);
                return IdleStep::Yield;
            }
            return IdleStep::Spin;
        }
        if now.saturating_duration_since(since) < spin {
            IdleStep::Yield
        } else {
            IdleStep::Park
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPIN: Duration = Duration::from_micros(50);

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn spin_then_park_yields_for_the_budget_then_parks() {
        let t0 = Instant::now();
        let mut p = IdlePacer::default();
        assert_eq!(p.idle(t0, false, SPIN), IdleStep::Yield);
        assert_eq!(p.idle(t0 + us(49), false, SPIN), IdleStep::Yield);
        assert_eq!(p.idle(t0 + us(50), false, SPIN), IdleStep::Park);
        // After the park the budget starts again.
        p.woke();
        assert_eq!(p.idle(t0 + us(1_000), false, SPIN), IdleStep::Yield);
        assert_eq!(p.idle(t0 + us(1_060), false, SPIN), IdleStep::Park);
        // Progress starts it again as well.
        p.progress();
        assert_eq!(p.idle(t0 + us(1_070), false, SPIN), IdleStep::Yield);
    }

    #[test]
    fn a_spin_of_zero_parks_at_once() {
        let t0 = Instant::now();
        let mut p = IdlePacer::default();
        assert_eq!(p.idle(t0, false, Duration::ZERO), IdleStep::Park);
    }

    #[test]
    fn polling_yields_after_work_and_then_at_intervals_and_never_parks() {
        let t0 = Instant::now();
        let mut p = IdlePacer::default();
        let mut steps = Vec::new();
        // Idle from t0 for 100 µs, a turn every microsecond.
        for i in 0..=100 {
            steps.push(p.idle(t0 + us(i), true, SPIN));
        }
        assert!(!steps.contains(&IdleStep::Park));
        let yields: Vec<usize> = (0..steps.len())
            .filter(|&i| steps[i] == IdleStep::Yield)
            .collect();
        assert_eq!(yields, [0, 20, 40, 60, 80, 100]);
        // Work, then the first idle turn yields at once, though the interval has not
        // passed: a caller sharing the CPU takes what that work completed.
        p.progress();
        assert_eq!(p.idle(t0 + us(101), true, SPIN), IdleStep::Yield);
        assert_eq!(p.idle(t0 + us(102), true, SPIN), IdleStep::Spin);
        // Back-to-back work yields once per burst.
        p.progress();
        p.progress();
        assert_eq!(p.idle(t0 + us(103), true, SPIN), IdleStep::Yield);
        assert_eq!(p.idle(t0 + us(104), true, SPIN), IdleStep::Spin);
        // The interval counts from that yield, not from the one before.
        assert_eq!(p.idle(t0 + us(122), true, SPIN), IdleStep::Spin);
        assert_eq!(p.idle(t0 + us(123), true, SPIN), IdleStep::Yield);
    }

    #[test]
    fn polling_never_parks_however_long_it_is_idle() {
        let t0 = Instant::now();
        let mut p = IdlePacer::default();
        for i in 0..1_000u64 {
            assert_ne!(
                p.idle(t0 + Duration::from_millis(i), true, Duration::ZERO),
                IdleStep::Park
            );
        }
    }
}
