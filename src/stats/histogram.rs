//! Latency histograms: log-linear buckets over nanoseconds (each power of two split in
//! [`SUB_BUCKETS`] equal parts, as HdrHistogram lays them out), written by one loop with
//! relaxed loads and stores, merged in snapshots.

use core::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use super::single_writer::add;

/// Bits of the value below its leading bit that choose a sub-bucket.
const SUB_BITS: u32 = 3;
/// Sub-buckets per power of two: a bucket is at most 1/8 of its value wide.
pub const SUB_BUCKETS: usize = 1 << SUB_BITS;
/// Largest value told apart, in nanoseconds (about 68.7 s); longer latencies fall in the
/// last bucket (the exact maximum is kept beside the buckets).
pub const MAX_TRACKED_NS: u64 = (1 << 36) - 1;
/// Number of buckets.
pub const BUCKETS: usize = bucket_of(MAX_TRACKED_NS) + 1;

/// The bucket of `ns`.
pub const fn bucket_of(ns: u64) -> usize {
    let v = if ns > MAX_TRACKED_NS {
        MAX_TRACKED_NS
    } else {
        ns
    };
    if v < SUB_BUCKETS as u64 {
        return v as usize;
    }
    let e = 63 - v.leading_zeros();
    let sub = (v >> (e - SUB_BITS)) as usize & (SUB_BUCKETS - 1);
    (((e - SUB_BITS + 1) as usize) << SUB_BITS) | sub
}

/// The smallest value of bucket `i`, in nanoseconds.
pub const fn bucket_low(i: usize) -> u64 {
    if i < SUB_BUCKETS {
        return i as u64;
    }
    let e = (i >> SUB_BITS) as u32 + SUB_BITS - 1;
    let sub = (i & (SUB_BUCKETS - 1)) as u64;
    (1 << e) | (sub << (e - SUB_BITS))
}

/// The largest value of bucket `i`, in nanoseconds.
pub const fn bucket_high(i: usize) -> u64 {
    if i + 1 >= BUCKETS {
        MAX_TRACKED_NS
    } else {
        bucket_low(i + 1) - 1
    }
}

/// One loop's histogram. Its loop is the only writer.
pub(crate) struct AtomicHistogram {
    buckets: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
    max_ns: AtomicU64,
}

impl Default for AtomicHistogram {
    fn default() -> Self {
        AtomicHistogram {
            buckets: [(); BUCKETS].map(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
        }
    }
}

impl AtomicHistogram {
    /// Records one value (no lock, no allocation, no locked instruction).
    #[inline]
    pub(crate) fn record(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        add(&self.buckets[bucket_of(ns)], 1);
        add(&self.sum_ns, ns);
        if ns > self.max_ns.load(Relaxed) {
            self.max_ns.store(ns, Relaxed);
        }
    }

    /// Adds this histogram's values to `h`.
    pub(crate) fn merge_into(&self, h: &mut Histogram) {
        for (dst, src) in h.buckets.iter_mut().zip(&self.buckets) {
            *dst += src.load(Relaxed);
        }
        h.sum_ns = h.sum_ns.wrapping_add(self.sum_ns.load(Relaxed));
        h.max_ns = h.max_ns.max(self.max_ns.load(Relaxed));
    }
}

/// A latency histogram: counts per bucket (bucket `i` holds values from
/// [`bucket_low`]`(i)` to [`bucket_high`]`(i)` nanoseconds), their sum and the maximum.
#[derive(Clone, PartialEq, Eq)]
pub struct Histogram {
    buckets: Box<[u64; BUCKETS]>,
    sum_ns: u64,
    max_ns: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: Box::new([0; BUCKETS]),
            sum_ns: 0,
            max_ns: 0,
        }
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count())
            .field("p50", &self.quantile(0.5))
            .field("p99", &self.quantile(0.99))
            .field("max", &self.max())
            .finish()
    }
}

impl Histogram {
    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Sum of the values recorded.
    pub fn sum(&self) -> Duration {
        Duration::from_nanos(self.sum_ns)
    }

    /// The largest value recorded (exact).
    pub fn max(&self) -> Duration {
        Duration::from_nanos(self.max_ns)
    }

    /// Mean of the values recorded (zero when there is none).
    pub fn mean(&self) -> Duration {
        match self.count() {
            0 => Duration::ZERO,
            n => Duration::from_nanos(self.sum_ns / n),
        }
    }

    /// The value at quantile `q` (0 to 1): the upper end of the bucket holding it, never
    /// above the maximum; so at most 1/8 above the true value. Zero when empty.
    pub fn quantile(&self, q: f64) -> Duration {
        let n = self.count();
        if n == 0 {
            return Duration::ZERO;
        }
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.buckets.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Duration::from_nanos(bucket_high(i).min(self.max_ns));
            }
        }
        self.max()
    }

    /// The buckets holding values: (upper end in nanoseconds, count), in increasing order.
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &c)| (bucket_high(i), c))
    }

    /// Adds `other`'s values to this one.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *a += b;
        }
        self.sum_ns = self.sum_ns.wrapping_add(other.sum_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_tile_the_range_without_gaps() {
        assert_eq!(bucket_low(0), 0);
        for i in 1..BUCKETS {
            assert_eq!(bucket_low(i), bucket_high(i - 1) + 1, "bucket {i}");
            assert_eq!(bucket_of(bucket_low(i)), i);
            assert_eq!(bucket_of(bucket_high(i)), i);
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        // Each bucket is at most 1/8 of its values wide.
        for i in SUB_BUCKETS..BUCKETS {
            let (lo, hi) = (bucket_low(i), bucket_high(i));
            assert!(
                (hi - lo + 1) * SUB_BUCKETS as u64 <= lo,
                "bucket {i}: {lo}..={hi}"
            );
        }
    }

    #[test]
    fn quantiles_are_ordered_and_within_a_bucket_of_the_truth() {
        let a = AtomicHistogram::default();
        for us in 1..=1000u64 {
            a.record(Duration::from_micros(us));
        }
        let mut h = Histogram::default();
        a.merge_into(&mut h);
        assert_eq!(h.count(), 1000);
        assert_eq!(h.max(), Duration::from_micros(1000));
        let (p50, p90, p99) = (h.quantile(0.5), h.quantile(0.9), h.quantile(0.99));
        assert!(p50 <= p90 && p90 <= p99 && p99 <= h.max());
        for (q, truth) in [(p50, 500u64), (p90, 900), (p99, 990)] {
            let truth = Duration::from_micros(truth);
            assert!(q >= truth && q <= truth + truth / 8, "{q:?} vs {truth:?}");
        }
        assert_eq!(h.buckets().map(|(_, c)| c).sum::<u64>(), 1000);
        let mut twice = h.clone();
        twice.merge(&h);
        assert_eq!(twice.count(), 2000);
        assert_eq!(twice.quantile(0.5), p50);
    }

    #[test]
    fn empty_and_huge_values() {
        let h = Histogram::default();
        assert_eq!(
            (h.count(), h.quantile(0.99), h.mean()),
            (0, Duration::ZERO, Duration::ZERO)
        );
        let a = AtomicHistogram::default();
        a.record(Duration::from_secs(3600));
        let mut h = Histogram::default();
        a.merge_into(&mut h);
        assert_eq!(h.max(), Duration::from_secs(3600));
        assert_eq!(h.quantile(1.0), Duration::from_nanos(MAX_TRACKED_NS));
    }
}
