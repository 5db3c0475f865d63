//! The values a [`PsTable`](super::PsTable) gives a row it creates: a fixed function of
//! (table, id, element, seed), so every PS task, every run and every re-creation of a row
//! (after an eviction, on a new PS) agree.
//!
//! The random bits of element `k` of row `id` come from splitmix64 (`splitmix64(x)` is the
//! splitmix64 finalizer of `x + 0x9e3779b97f4a7c15`):
//! `base = splitmix64(seed) ^ (table × 0x9e3779b97f4a7c15)`,
//! `h = splitmix64(splitmix64(base ^ id) ^ k)`. Table 0 gives the values of
//! [`MemTable`](super::MemTable)'s `Init::Uniform`. Normal values use Marsaglia's polar
//! method with a logarithm computed here from additions, multiplications and divisions
//! only, so they are bit for bit the same on every platform.

use crate::hash::splitmix64;

/// The golden-ratio multiplier that spreads table numbers.
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The value a [`PsTable`](super::PsTable) gives each element of a row it creates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Zero.
    Zeros,
    /// Uniform in `[-scale, scale]`: with `h` as in the module documentation,
    /// `u = (h >> 40) / 2^24`, value `scale × (2u − 1)` in f32.
    Uniform {
        /// Half-width of the range.
        scale: f32,
        /// Selects the values.
        seed: u64,
    },
    /// Normal with mean 0 and standard deviation `std`.
    Normal {
        /// Standard deviation.
        std: f32,
        /// Selects the values.
        seed: u64,
    },
    /// Normal with mean 0 and standard deviation `std`, values beyond two standard
    /// deviations drawn again (TensorFlow's `truncated_normal`).
    TruncatedNormal {
        /// Standard deviation before truncation.
        std: f32,
        /// Selects the values.
        seed: u64,
    },
}

impl Init {
    /// The initial value of element `k` of row `id` of table `table`.
    pub fn value(&self, table: u32, id: u64, k: usize) -> f32 {
        match self.row_seed(table, id) {
            Some(row) => self.element(row, k),
            None => 0.0,
        }
    }

    /// Writes the initial values of elements `first..first + out.len()` of row `id` into
    /// `out`.
    pub(super) fn fill(&self, table: u32, id: u64, first: usize, out: &mut [f32]) {
        match self.row_seed(table, id) {
            None => out.fill(0.0),
            Some(row) => {
                for (k, v) in out.iter_mut().enumerate() {
                    *v = self.element(row, first + k);
                }
            }
        }
    }

    /// What the element values of row `id` derive from; `None` for zeros.
    fn row_seed(&self, table: u32, id: u64) -> Option<u64> {
        let seed = match *self {
            Init::Zeros => return None,
            Init::Uniform { seed, .. }
            | Init::Normal { seed, .. }
            | Init::TruncatedNormal { seed, .. } => seed,
        };
        let base = splitmix64(seed) ^ u64::from(table).wrapping_mul(GOLDEN);
        Some(splitmix64(base ^ id))
    }

    /// Element `k` of the row whose seed is `row`.
    fn element(&self, row: u64, k: usize) -> f32 {
        let h = splitmix64(row ^ k as u64);
        match *self {
            Init::Zeros => 0.0,
            Init::Uniform { scale, .. } => {
                let u = (h >> 40) as f32 / (1u32 << 24) as f32;
                scale * (2.0 * u - 1.0)
            }
            Init::Normal { std, .. } => (f64::from(std) * normal(h, f64::INFINITY)) as f32,
            Init::TruncatedNormal { std, .. } => (f64::from(std) * normal(h, 2.0)) as f32,
        }
    }
}

/// A standard normal value of magnitude at most `bound`, from the stream of draws that
/// starts at `h` (each draw the next splitmix64 of the last): Marsaglia's polar method,
/// each draw's two 32-bit halves a point of the square `(-1, 1)²`.
fn normal(mut h: u64, bound: f64) -> f64 {
    loop {
        let u = ((h >> 32) as f64 + 0.5) / 2_147_483_648.0 - 1.0;
        let v = ((h & 0xffff_ffff) as f64 + 0.5) / 2_147_483_648.0 - 1.0;
        h = splitmix64(h);
        let s = u * u + v * v;
        if s >= 1.0 || s == 0.0 {
            continue;
        }
        let z = u * (-2.0 * ln(s) / s).sqrt();
        if z.abs() <= bound {
            return z;
        }
    }
}

/// The natural logarithm of a positive, finite, normal `x`, from basic arithmetic only
/// (so the same on every platform, unlike a libm's): `x = m × 2^e` with `m` in
/// `[√½, √2)`, `ln m = 2 artanh((m − 1)/(m + 1))` by its series (|t| ≤ 0.172, 13 terms:
/// below f64 rounding).
fn ln(x: f64) -> f64 {
    const LN_2: f64 = std::f64::consts::LN_2;
    let bits = x.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mut m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | (1023u64 << 52));
    if m > std::f64::consts::SQRT_2 {
        m /= 2.0;
        e += 1;
    }
    let t = (m - 1.0) / (m + 1.0);
    let t2 = t * t;
    // artanh(t) / t = 1 + t²/3 + t⁴/5 + ..., by Horner from the last term.
    let mut sum = 0.0;
    for n in (0..13).rev() {
        sum = sum * t2 + 1.0 / f64::from(2 * n + 1);
    }
    e as f64 * LN_2 + 2.0 * t * sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ln_matches_the_library_closely() {
        for &x in &[1e-20, 1e-5, 0.1, 0.5, 0.70, 0.71, 1.0, 1.5, 2.0, 3.0, 1e10] {
            let (a, b) = (ln(x), x.ln());
            assert!(
                (a - b).abs() <= 4.0 * f64::EPSILON * b.abs().max(1.0),
                "{x}: {a} {b}"
            );
        }
        assert_eq!(ln(1.0), 0.0);
    }

    #[test]
    fn uniform_matches_memtable_for_table_zero() {
        let init = Init::Uniform {
            scale: 0.05,
            seed: 42,
        };
        let old = crate::rows::Init::Uniform {
            scale: 0.05,
            seed: 42,
        };
        for id in [0u64, 7, 1 << 40, u64::MAX] {
            for k in 0..5 {
                assert_eq!(init.value(0, id, k), old.value(id, k));
            }
        }
        // Another table, other values.
        assert_ne!(init.value(1, 7, 0), init.value(0, 7, 0));
        let mut row = [0f32; 5];
        init.fill(3, 9, 2, &mut row);
        for (k, &v) in row.iter().enumerate() {
            assert_eq!(v, init.value(3, 9, 2 + k));
        }
    }

    #[test]
    fn normal_moments_and_truncation() {
        let n = 40_000;
        let normal = Init::Normal { std: 2.0, seed: 5 };
        let vals: Vec<f64> = (0..n)
            .map(|i| f64::from(normal.value(0, i / 8, (i % 8) as usize)))
            .collect();
        let mean = vals.iter().sum::<f64>() / n as f64;
        let var = vals.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.05, "{mean}");
        assert!((var.sqrt() - 2.0).abs() < 0.05, "{}", var.sqrt());
        // About 4.6 % beyond two standard deviations.
        let beyond = vals.iter().filter(|v| v.abs() > 4.0).count() as f64 / n as f64;
        assert!((0.035..0.06).contains(&beyond), "{beyond}");
        let truncated = Init::TruncatedNormal { std: 2.0, seed: 5 };
        let within = (0..n).all(|i| truncated.value(0, i, 1).abs() <= 4.0);
        assert!(within);
        // Same parameters, same values; the first draw inside the bound is shared.
        assert_eq!(normal.value(0, 3, 2), normal.value(0, 3, 2));
        assert_eq!(Init::Zeros.value(0, 3, 2), 0.0);
    }
}
