//! The row ids of bench's rows requests: uniform over `0..rows` (splitmix64 of a counter,
//! [`row_id`]), or Zipf-distributed (`--zipf S`): rank `r` (0 the most frequent) drawn with
//! probability proportional to `(r + 1)^-S` by rejection-inversion (Hörmann and Derflinger,
//! as the `rand_distr` crate's `Zipf`), then mapped onto the ids by a fixed permutation of
//! `0..rows`, so that the hot rows are spread over the table rather than packed at its
//! start. Either way the `k`-th id of a run is a fixed function of `k`: every run draws the
//! same sequence.

/// A prime above every row count (2^32 + 15): multiplying by it permutes `0..rows`.
const SPREAD: u128 = 4_294_967_311;

/// splitmix64 of `x`.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The `k`-th row id of a uniform run over `0..range`: splitmix64 of `k`, reduced. The same
/// sequence every run; spread over the range, so ids repeat only by chance.
pub fn row_id(k: u64, range: u64) -> u64 {
    mix(k) % range.max(1)
}

/// A number in `[0, 1)` from 53 bits of `h`.
fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// How row ids are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Ids {
    /// Uniformly over `0..rows`.
    Uniform { rows: u64 },
    /// Zipf-distributed over `0..rows`.
    Zipf(Zipf),
}

impl Ids {
    /// Ids over `0..rows` (at least 1), Zipf-distributed with exponent `s` (more than 0)
    /// when given.
    pub(super) fn new(rows: u64, zipf: Option<f64>) -> Ids {
        match zipf {
            Some(s) => Ids::Zipf(Zipf::new(rows, s)),
            None => Ids::Uniform { rows },
        }
    }

    /// The rows ids are drawn from: `0..rows`.
    pub(super) fn rows(&self) -> u64 {
        match self {
            Ids::Uniform { rows } => *rows,
            Ids::Zipf(z) => z.rows,
        }
    }

    /// The `k`-th id of a run.
    pub(super) fn id(&self, k: u64) -> u64 {
        match self {
            Ids::Uniform { rows } => row_id(k, *rows),
            Ids::Zipf(z) => {
                let rank = z.rank(k);
                ((u128::from(rank) * SPREAD) % u128::from(z.rows)) as u64
            }
        }
    }
}

/// Zipf's law over ranks `0..rows`, exponent `s`: rejection-inversion sampling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Zipf {
    rows: u64,
    s: f64,
    t: f64,
    q: f64,
}

impl Zipf {
    fn new(rows: u64, s: f64) -> Zipf {
        let n = rows.max(1) as f64;
        let q = if s != 1.0 { 1.0 / (1.0 - s) } else { 0.0 };
        let t = if s != 1.0 {
            (n.powf(1.0 - s) - s) * q
        } else {
            1.0 + n.ln()
        };
        Zipf {
            rows: rows.max(1),
            s,
            t,
            q,
        }
    }

    fn inv_cdf(&self, p: f64) -> f64 {
        let pt = p * self.t;
        if pt <= 1.0 {
            pt
        } else if self.s != 1.0 {
            (pt * (1.0 - self.s) + self.s).powf(self.q)
        } else {
            (pt - 1.0).exp()
        }
    }

    /// The rank of draw `k`: its attempts use the uniforms of splitmix64 of `k` and the
    /// attempt's number.
    fn rank(&self, k: u64) -> u64 {
        let base = mix(k);
        for attempt in 0u64.. {
            let inv_b = self.inv_cdf(unit(mix(base ^ (2 * attempt))));
            let x = (inv_b + 1.0).floor();
            let mut ratio = x.powf(-self.s);
            if x > 1.0 {
                ratio *= inv_b.powf(self.s);
            }
            if unit(mix(base ^ (2 * attempt + 1))) < ratio {
                return (x as u64).clamp(1, self.rows) - 1;
            }
        }
        unreachable!("an attempt is accepted with probability above 0")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_ids_cover_the_range() {
        let ids = Ids::new(100, None);
        let mut seen = [0u32; 100];
        for k in 0..100_000 {
            seen[ids.id(k) as usize] += 1;
        }
        // 1,000 expected each.
        assert!(seen.iter().all(|&n| (800..1200).contains(&n)), "{seen:?}");
        assert_eq!(ids.id(7), row_id(7, 100));
    }

    #[test]
    fn zipf_ids_follow_the_law() {
        let z = Zipf::new(1000, 1.2);
        let mut by_rank = vec![0u64; 1000];
        let draws = 400_000;
        for k in 0..draws {
            by_rank[z.rank(k) as usize] += 1;
        }
        // Rank r is drawn in proportion to (r + 1)^-1.2: each count within four standard
        // deviations of its expectation (a count of a draw is about Poisson).
        let norm: f64 = (1..=1000).map(|r| (r as f64).powf(-1.2)).sum();
        let expect = |ranks: std::ops::Range<usize>| -> f64 {
            ranks
                .map(|r| draws as f64 * ((r + 1) as f64).powf(-1.2) / norm)
                .sum()
        };
        for ranks in [0..1, 1..2, 2..3, 9..10, 99..100, 100..200, 500..1000] {
            let want = expect(ranks.clone());
            let got: u64 = by_rank[ranks.clone()].iter().sum();
            let got = got as f64;
            assert!(
                (got - want).abs() < 4.0 * want.sqrt(),
                "ranks {ranks:?}: {got} vs {want}"
            );
        }
        // The exponent 1 takes its own branch.
        let one = Zipf::new(50, 1.0);
        let (mut first, mut second) = (0, 0);
        for k in 0..100_000 {
            match one.rank(k) {
                0 => first += 1,
                1 => second += 1,
                r => assert!(r < 50),
            }
        }
        let ratio = first as f64 / second as f64;
        assert!((ratio - 2.0).abs() < 0.1, "{ratio}");
    }

    #[test]
    fn zipf_ids_are_spread_and_a_bijection_of_the_ranks() {
        let ids = Ids::new(1000, Some(1.1));
        let Ids::Zipf(z) = ids else { panic!("zipf") };
        let spread: std::collections::HashSet<u64> = (0..1000u64)
            .map(|rank| ((u128::from(rank) * SPREAD) % 1000) as u64)
            .collect();
        assert_eq!(spread.len(), 1000);
        // The hottest id is rank 0's, which is 0; rank 1's is far from it.
        assert_eq!(((SPREAD) % 1000) as u64, 311);
        let hot = (0..10_000).filter(|&k| ids.id(k) == 0).count();
        let k_of_rank0 = (0..10_000).filter(|&k| z.rank(k) == 0).count();
        assert_eq!(hot, k_of_rank0);
        assert!(hot > 1000, "{hot}");
        assert!((0..10_000).all(|k| ids.id(k) < 1000));
    }
}
