//! How long an [`Embedded`](crate::Embedded) client's wait spins before it sleeps in the
//! kernel: the spin setting, raised to cover the waits this client has been seeing.
//!
//! A wait that sleeps pays for it twice: the wake-up, and (measured, docs/performance.md,
//! run P9) the code after it running cold. The spin setting is sized for a ping; a request
//! whose peer works longer (a pull of 1,000 rows: about 100 µs here) outlasts it, and every
//! such wait sleeps. So a client keeps a running average of how long its waits took, and
//! a wait spins for twice that, within [`ADAPTIVE_SPIN_MAX`], when it is more than the
//! setting, until it first parks; after a park, and in a loop that serves rather than
//! waits, the setting applies. A setting of 0 (park at once, for CPU-bound tasks) is kept
//! as it is; polling spins anyway.

use std::time::Duration;

/// The most an embedded client's wait spins when its recent waits ask for more than the
/// spin setting: a wait longer than this sleeps after it, as with a fixed spin.
pub const ADAPTIVE_SPIN_MAX: Duration = Duration::from_micros(250);

/// A running average of a client's waits, and the spin it asks for.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WaitSpin {
    /// Average of the waits seen, in nanoseconds (each new wait weighs 1/8).
    average_ns: u64,
}

impl WaitSpin {
    /// A wait of the client took `waited`, from its first idle step to its completion
    /// (waits that never had to idle are not counted).
    pub fn observe(&mut self, waited: Duration) {
        let w = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.average_ns = self.average_ns - self.average_ns / 8 + w / 8;
    }

    /// How long a wait spins before it sleeps, for a spin setting of `setting`: the
    /// setting, or twice the average wait when that is more, at most
    /// [`ADAPTIVE_SPIN_MAX`] (or the setting, if larger); 0 stays 0.
    pub fn budget(&self, setting: Duration) -> Duration {
        if setting.is_zero() {
            return setting;
        }
        let wanted = Duration::from_nanos(self.average_ns.saturating_mul(2));
        setting.max(wanted.min(ADAPTIVE_SPIN_MAX))
    }

    /// The average wait.
    #[cfg(test)]
    fn average(&self) -> Duration {
        Duration::from_nanos(self.average_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTING: Duration = Duration::from_micros(50);

    fn after(waits: &[u64]) -> WaitSpin {
        let mut s = WaitSpin::default();
        for &w in waits {
            s.observe(Duration::from_micros(w));
        }
        s
    }

    #[test]
    fn short_waits_keep_the_setting() {
        // Pings: 12 µs waits ask for 24 µs, less than the setting.
        assert_eq!(after(&[12; 100]).budget(SETTING), SETTING);
        assert_eq!(WaitSpin::default().budget(SETTING), SETTING);
    }

    #[test]
    fn longer_waits_raise_the_spin_to_twice_their_average() {
        let s = after(&[100; 200]);
        let avg = s.average().as_micros();
        assert!((99..=100).contains(&avg), "{avg}");
        let b = s.budget(SETTING).as_micros();
        assert!((198..=200).contains(&b), "{b}");
    }

    #[test]
    fn the_raise_is_capped_and_a_larger_setting_wins() {
        let s = after(&[5_000; 200]);
        assert_eq!(s.budget(SETTING), ADAPTIVE_SPIN_MAX);
        let big = Duration::from_millis(1);
        assert_eq!(s.budget(big), big);
    }

    #[test]
    fn a_setting_of_zero_is_kept() {
        assert_eq!(after(&[100; 200]).budget(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn the_average_follows_a_change_within_tens_of_waits() {
        let mut s = after(&[100; 200]);
        for _ in 0..40 {
            s.observe(Duration::from_micros(10));
        }
        // 100 µs weighs (7/8)^40 ≈ 0.5 % after 40 waits of 10 µs.
        assert!(s.average() < Duration::from_micros(11), "{:?}", s.average());
        assert_eq!(s.budget(SETTING), SETTING);
    }

    #[test]
    fn one_long_wait_moves_the_average_by_an_eighth() {
        let mut s = after(&[20; 200]);
        s.observe(Duration::from_millis(10));
        // 20 µs · 7/8 + 10 ms / 8 ≈ 1.27 ms: the next waits spin the cap, then come back.
        assert_eq!(s.budget(SETTING), ADAPTIVE_SPIN_MAX);
        for _ in 0..60 {
            s.observe(Duration::from_micros(20));
        }
        assert_eq!(s.budget(SETTING), SETTING);
    }

    #[test]
    fn absurd_waits_do_not_overflow() {
        let mut s = WaitSpin::default();
        for _ in 0..100 {
            s.observe(Duration::MAX);
        }
        assert_eq!(s.budget(SETTING), ADAPTIVE_SPIN_MAX);
    }
}
