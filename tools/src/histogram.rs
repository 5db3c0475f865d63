//! A fixed-size log-linear latency histogram: about 1.6% resolution from 1 ns to the
//! largest `u64`, 30 KiB, no allocation per sample.

use std::time::Duration;

/// Sub-buckets per power of two, as bits.
const SUB_BITS: u32 = 6;
const SUB: u64 = 1 << SUB_BITS;
/// Values below `2 * SUB` get a bucket each; above, `SUB` buckets per power of two.
const BUCKETS: usize = ((64 - SUB_BITS) as usize + 1) * SUB as usize;

/// Counts of durations, in nanoseconds.
#[derive(Clone)]
pub struct Histogram {
    counts: Box<[u64; BUCKETS]>,
    total: u64,
    sum_ns: u128,
    min_ns: u64,
    max_ns: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: Box::new([0; BUCKETS]),
            total: 0,
            sum_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
        }
    }
}

fn bucket(v: u64) -> usize {
    if v < 2 * SUB {
        return v as usize;
    }
    let shift = 63 - v.leading_zeros() - SUB_BITS;
    (shift as usize) * SUB as usize + (v >> shift) as usize
}

/// The middle of a bucket's range.
fn value(b: usize) -> u64 {
    if b < 2 * SUB as usize {
        return b as u64;
    }
    let shift = (b / SUB as usize - 1) as u32;
    let low = ((b as u64) - (shift as u64) * SUB) << shift;
    low + ((1u64 << shift) >> 1)
}

impl Histogram {
    /// Adds one sample.
    pub fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.counts[bucket(ns)] += 1;
        self.total += 1;
        self.sum_ns += u128::from(ns);
        self.min_ns = self.min_ns.min(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    /// Number of samples.
    pub fn len(&self) -> u64 {
        self.total
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Smallest sample (exact).
    pub fn min(&self) -> Duration {
        Duration::from_nanos(if self.total == 0 { 0 } else { self.min_ns })
    }

    /// Largest sample (exact).
    pub fn max(&self) -> Duration {
        Duration::from_nanos(self.max_ns)
    }

    /// Mean (exact).
    pub fn mean(&self) -> Duration {
        if self.total == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos((self.sum_ns / u128::from(self.total)) as u64)
    }

    /// The `q` quantile (0.0 to 1.0): the smallest sample with at least `q` of the samples
    /// at or below it, to the bucket's resolution and clamped to the exact min and max.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.total == 0 {
            return Duration::ZERO;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let v = value(b).clamp(self.min_ns, self.max_ns);
                return Duration::from_nanos(v);
            }
        }
        self.max()
    }

    /// Adds another histogram's samples.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.total += other.total;
        self.sum_ns += other.sum_ns;
        self.min_ns = self.min_ns.min(other.min_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_cover_u64() {
        let mut last = 0;
        for v in (0..100_000u64).chain([u64::MAX / 2, u64::MAX - 1, u64::MAX]) {
            let b = bucket(v);
            assert!(b >= last && b < BUCKETS, "{v}");
            last = b;
            let mid = value(b);
            let err = mid.abs_diff(v) as f64 / (v.max(1) as f64);
            assert!(err <= 1.0 / SUB as f64, "{v} -> {mid}");
        }
    }

    #[test]
    fn quantiles() {
        let mut h = Histogram::default();
        assert_eq!(h.quantile(0.5), Duration::ZERO);
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        assert_eq!(h.len(), 1000);
        assert_eq!(h.min(), Duration::from_micros(1));
        assert_eq!(h.max(), Duration::from_micros(1000));
        let near = |d: Duration, us: f64| {
            let got = d.as_secs_f64() * 1e6;
            (got - us).abs() / us < 0.02
        };
        assert!(near(h.quantile(0.5), 500.0), "{:?}", h.quantile(0.5));
        assert!(near(h.quantile(0.99), 990.0), "{:?}", h.quantile(0.99));
        assert!(near(h.quantile(0.999), 999.0));
        assert_eq!(h.quantile(1.0), Duration::from_micros(1000));
        assert!(near(h.mean(), 500.5));
        let mut g = Histogram::default();
        g.record(Duration::from_secs(1));
        g.merge(&h);
        assert_eq!(g.len(), 1001);
        assert_eq!(g.max(), Duration::from_secs(1));
    }
}
