//! How a [`PsTable`](super::PsTable) applies a gradient row to a row, and the optimizer
//! state it keeps in the row's slot.
//!
//! State is f32 whatever the rows are stored as, packed two to a word like an f32 row (see
//! [`elem`](super::elem)): Adagrad keeps one accumulator per element; Adam keeps the row's
//! `beta1^t` and `beta2^t` in its first word (each row counts its own steps, as a sparse
//! row is updated only when it is pushed), then the first moments, then the second. As a
//! list of f32 ([`Optimizer::state_len`]): Adagrad `acc[dim]`; Adam
//! `[beta1^t, beta2^t, m[dim], v[dim]]`.
//!
//! A push computes in f32, eight elements at a time in local arrays (which the compiler
//! vectorizes), between one load and one store of each word.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::elem::{self, Format, CHUNK, F32};

/// How a [`PsTable`](super::PsTable) applies a gradient row `g` to a row `w`, element by
/// element.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Optimizer {
    /// `w -= lr × g`. No state.
    Sgd {
        /// Learning rate.
        lr: f32,
    },
    /// `acc += g²; w -= lr × g / √acc`, `acc` starting at `initial_accumulator` (positive,
    /// as TensorFlow's Adagrad requires). [`MemTable`](super::MemTable)'s Adagrad.
    Adagrad {
        /// Learning rate.
        lr: f32,
        /// Each element's squared-gradient sum when its row is created.
        initial_accumulator: f32,
    },
    /// Adam with a step count per row: `p1 *= beta1; p2 *= beta2;
    /// m = beta1 m + (1 − beta1) g; v = beta2 v + (1 − beta2) g²;
    /// w -= lr × (m / (1 − p1)) / (√(v / (1 − p2)) + epsilon)`, `p1`, `p2` starting at 1
    /// and `m`, `v` at 0.
    Adam {
        /// Learning rate.
        lr: f32,
        /// Decay of the first moment, in `[0, 1)`.
        beta1: f32,
        /// Decay of the second moment, in `[0, 1)`.
        beta2: f32,
        /// Added to the denominator; positive.
        epsilon: f32,
    },
}

impl Optimizer {
    /// Adam with PyTorch's defaults for the betas and epsilon (0.9, 0.999, 1e-8).
    pub fn adam(lr: f32) -> Optimizer {
        Optimizer::Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
        }
    }

    /// f32 values of optimizer state per row of `dim` elements (see the module
    /// documentation for their order): 0, `dim` or `2 + 2 × dim`.
    pub fn state_len(&self, dim: usize) -> usize {
        match self {
            Optimizer::Sgd { .. } => 0,
            Optimizer::Adagrad { .. } => dim,
            Optimizer::Adam { .. } => 2 + 2 * dim,
        }
    }

    /// The optimizer's name.
    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::Sgd { .. } => "sgd",
            Optimizer::Adagrad { .. } => "adagrad",
            Optimizer::Adam { .. } => "adam",
        }
    }

    /// Its code in a checkpoint's header (the state's layout, not the parameters).
    pub(super) fn code(&self) -> u8 {
        match self {
            Optimizer::Sgd { .. } => 0,
            Optimizer::Adagrad { .. } => 1,
            Optimizer::Adam { .. } => 2,
        }
    }

    /// Words of state per row of `dim` elements.
    pub(super) fn state_words(&self, dim: usize) -> usize {
        let half = dim.div_ceil(2);
        match self {
            Optimizer::Sgd { .. } => 0,
            Optimizer::Adagrad { .. } => half,
            Optimizer::Adam { .. } => 1 + 2 * half,
        }
    }

    /// What is wrong with the parameters, if anything.
    pub(super) fn check(&self) -> Result<(), String> {
        let finite = |name: &str, v: f32| {
            if v.is_finite() {
                Ok(())
            } else {
                Err(format!("{} {name} is {v}: not finite", self.name()))
            }
        };
        match *self {
            Optimizer::Sgd { lr } => finite("lr", lr),
            Optimizer::Adagrad {
                lr,
                initial_accumulator,
            } => {
                finite("lr", lr)?;
                if initial_accumulator > 0.0 && initial_accumulator.is_finite() {
                    Ok(())
                } else {
                    Err(format!(
                        "adagrad initial_accumulator is {initial_accumulator}: must be positive"
                    ))
                }
            }
            Optimizer::Adam {
                lr,
                beta1,
                beta2,
                epsilon,
            } => {
                finite("lr", lr)?;
                for (name, b) in [("beta1", beta1), ("beta2", beta2)] {
                    if !(0.0..1.0).contains(&b) {
                        return Err(format!("adam {name} is {b}: must be in [0, 1)"));
                    }
                }
                if epsilon > 0.0 && epsilon.is_finite() {
                    Ok(())
                } else {
                    Err(format!("adam epsilon is {epsilon}: must be positive"))
                }
            }
        }
    }

    /// Writes the state of a new row of `dim` elements into `state`.
    pub(super) fn init_state(&self, dim: usize, state: &[AtomicU64]) {
        match *self {
            Optimizer::Sgd { .. } => {}
            Optimizer::Adagrad {
                initial_accumulator,
                ..
            } => {
                let word =
                    F32::encode(initial_accumulator) | (F32::encode(initial_accumulator) << 32);
                // Every element, also the unused half of a last word: its gradient is always
                // zero, and a positive sum keeps its (unused) value finite.
                for w in &state[..dim.div_ceil(2)] {
                    w.store(word, Relaxed);
                }
            }
            Optimizer::Adam { .. } => {
                state[0].store(F32::encode(1.0) | (F32::encode(1.0) << 32), Relaxed);
                for w in &state[1..1 + 2 * dim.div_ceil(2)] {
                    w.store(0, Relaxed);
                }
            }
        }
    }

    /// The state in `state` as [`state_len`](Self::state_len) f32 values.
    pub(super) fn state_out(&self, dim: usize, state: &[AtomicU64], out: &mut [f32]) {
        match self {
            Optimizer::Sgd { .. } => {}
            Optimizer::Adagrad { .. } => elem::load::<F32>(state, 0, &mut out[..dim]),
            Optimizer::Adam { .. } => {
                let half = dim.div_ceil(2);
                elem::load::<F32>(state, 0, &mut out[..2]);
                elem::load::<F32>(&state[1..], 0, &mut out[2..2 + dim]);
                elem::load::<F32>(&state[1 + half..], 0, &mut out[2 + dim..2 + 2 * dim]);
            }
        }
    }

    /// Sets the state in `state` from [`state_len`](Self::state_len) f32 values.
    pub(super) fn state_in(&self, dim: usize, vals: &[f32], state: &[AtomicU64]) {
        match self {
            Optimizer::Sgd { .. } => {}
            Optimizer::Adagrad { .. } => elem::store::<F32>(state, 0, &vals[..dim]),
            Optimizer::Adam { .. } => {
                let half = dim.div_ceil(2);
                elem::store::<F32>(state, 0, &vals[..2]);
                elem::store::<F32>(&state[1..], 0, &vals[2..2 + dim]);
                elem::store::<F32>(&state[1 + half..], 0, &vals[2 + dim..2 + 2 * dim]);
            }
        }
    }
}

/// Applies the gradient row `grad` (`dim` little-endian elements of format `G`) to the row
/// in `row` (stored as `S`) and its state in `state`.
#[inline]
pub(super) fn apply<S: Format, G: Format>(
    opt: &Optimizer,
    dim: usize,
    row: &[AtomicU64],
    state: &[AtomicU64],
    grad: &[u8],
) {
    match *opt {
        Optimizer::Sgd { lr } => each_chunk::<S, G>(dim, row, grad, |_, _, w, g| {
            for (w, g) in w.iter_mut().zip(g) {
                *w -= lr * g;
            }
        }),
        Optimizer::Adagrad { lr, .. } => each_chunk::<S, G>(dim, row, grad, |first, n, w, g| {
            let mut acc = [0f32; CHUNK];
            elem::load::<F32>(state, first, &mut acc[..n]);
            for ((w, a), g) in w.iter_mut().zip(acc.iter_mut()).zip(g) {
                *a += g * g;
                *w -= lr * g / a.sqrt();
            }
            elem::store::<F32>(state, first, &acc[..n]);
        }),
        Optimizer::Adam {
            lr,
            beta1,
            beta2,
            epsilon,
        } => {
            let half = dim.div_ceil(2);
            let (powers, moments) = state.split_at(1);
            let (m_words, v_words) = moments.split_at(half);
            let mut p = [0f32; 2];
            elem::load::<F32>(powers, 0, &mut p);
            let (p1, p2) = (p[0] * beta1, p[1] * beta2);
            elem::store::<F32>(powers, 0, &[p1, p2]);
            let (c1, c2) = (1.0 - p1, 1.0 - p2);
            each_chunk::<S, G>(dim, row, grad, |first, n, w, g| {
                let mut m = load_chunk::<F32>(m_words, first, n);
                let mut v = load_chunk::<F32>(v_words, first, n);
                for j in 0..CHUNK {
                    m[j] = beta1 * m[j] + (1.0 - beta1) * g[j];
                    v[j] = beta2 * v[j] + (1.0 - beta2) * g[j] * g[j];
                    w[j] -= lr * (m[j] / c1) / ((v[j] / c2).sqrt() + epsilon);
                }
                store_chunk::<F32>(m_words, first, n, &m);
                store_chunk::<F32>(v_words, first, n, &v);
            })
        }
    }
}

/// Runs `update(first, n, w, g)` on each chunk of up to [`CHUNK`] elements of the row: `w`
/// the row's elements `first..first + n` (loaded, stored back after), `g` the gradient's;
/// lanes past `n` are zero and not stored.
#[inline(always)]
fn each_chunk<S: Format, G: Format>(
    dim: usize,
    row: &[AtomicU64],
    grad: &[u8],
    mut update: impl FnMut(usize, usize, &mut [f32; CHUNK], &[f32; CHUNK]),
) {
    let mut first = 0;
    while first < dim {
        let n = CHUNK.min(dim - first);
        let g = if n == CHUNK {
            G::read8(&grad[first * G::BYTES..])
        } else {
            let mut g = [0f32; CHUNK];
            elem::read::<G>(&grad[first * G::BYTES..(first + n) * G::BYTES], &mut g[..n]);
            g
        };
        let mut w = load_chunk::<S>(row, first, n);
        update(first, n, &mut w, &g);
        store_chunk::<S>(row, first, n, &w);
        first += CHUNK;
    }
}

/// Elements `first..first + n` (n at most [`CHUNK`]) of the row in `words`; lanes past `n`
/// zero.
#[inline(always)]
fn load_chunk<F: Format>(words: &[AtomicU64], first: usize, n: usize) -> [f32; CHUNK] {
    if n == CHUNK {
        F::load8(words, first)
    } else {
        let mut v = [0f32; CHUNK];
        elem::load::<F>(words, first, &mut v[..n]);
        v
    }
}

/// Stores lanes `..n` of `vals` as elements `first..first + n` of the row in `words`.
#[inline(always)]
fn store_chunk<F: Format>(words: &[AtomicU64], first: usize, n: usize, vals: &[f32; CHUNK]) {
    if n == CHUNK {
        F::store8(words, first, vals);
    } else {
        elem::store::<F>(words, first, &vals[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::table::elem::Bf16;

    fn words(n: usize) -> Vec<AtomicU64> {
        (0..n).map(|_| AtomicU64::new(0)).collect()
    }

    fn bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn row(w: &[AtomicU64], dim: usize) -> Vec<f32> {
        let mut out = vec![0f32; dim];
        elem::load::<F32>(w, 0, &mut out);
        out
    }

    #[test]
    fn sgd_and_adagrad_by_hand() {
        let dim = 3;
        let w = words(elem::words(elem::Float::F32, dim));
        elem::store::<F32>(&w, 0, &[1.0, 2.0, 3.0]);
        let sgd = Optimizer::Sgd { lr: 0.5 };
        apply::<F32, F32>(&sgd, dim, &w, &[], &bytes(&[2.0, -2.0, 0.0]));
        assert_eq!(row(&w, dim), [0.0, 3.0, 3.0]);

        let opt = Optimizer::Adagrad {
            lr: 0.5,
            initial_accumulator: 1.0,
        };
        let w = words(2);
        let s = words(opt.state_words(dim));
        opt.init_state(dim, &s);
        apply::<F32, F32>(&opt, dim, &w, &s, &bytes(&[3.0, 0.0, -1.0]));
        // acc = 1 + g²; w = -0.5 g / √acc.
        let want = [-0.5f32 * 3.0 / 10f32.sqrt(), 0.0, 0.5 / 2f32.sqrt()];
        assert_eq!(row(&w, dim), want);
        let mut st = vec![0f32; opt.state_len(dim)];
        opt.state_out(dim, &s, &mut st);
        assert_eq!(st, [10.0, 1.0, 2.0]);
        // The unused half of the last word stays zero in the row.
        assert_eq!(w[1].load(Relaxed) >> 32, 0);
    }

    #[test]
    fn adam_by_hand_over_two_steps() {
        let dim = 9; // two chunks, the second of one element
        let opt = Optimizer::Adam {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.99,
            epsilon: 1e-8,
        };
        let w = words(elem::words(elem::Float::F32, dim));
        let s = words(opt.state_words(dim));
        opt.init_state(dim, &s);
        let g1: Vec<f32> = (0..dim).map(|k| k as f32 - 4.0).collect();
        let g2: Vec<f32> = (0..dim).map(|k| 0.5 * k as f32).collect();
        apply::<F32, F32>(&opt, dim, &w, &s, &bytes(&g1));
        apply::<F32, F32>(&opt, dim, &w, &s, &bytes(&g2));
        let (p1, p2) = (0.9f32 * 0.9, 0.99f32 * 0.99);
        let mut st = vec![0f32; opt.state_len(dim)];
        opt.state_out(dim, &s, &mut st);
        assert_eq!(st[..2], [p1, p2]);
        let got = row(&w, dim);
        for k in 0..dim {
            let (mut m, mut v, mut x) = (0f32, 0f32, 0f32);
            for (t, g) in [(1, g1[k]), (2, g2[k])] {
                let c1 = 1.0 - if t == 1 { 0.9f32 } else { p1 };
                let c2 = 1.0 - if t == 1 { 0.99f32 } else { p2 };
                m = 0.9 * m + (1.0 - 0.9) * g;
                v = 0.99 * v + (1.0 - 0.99) * g * g;
                x -= 0.1 * (m / c1) / ((v / c2).sqrt() + 1e-8);
            }
            assert_eq!(got[k], x, "element {k}");
            assert_eq!((st[2 + k], st[2 + dim + k]), (m, v), "moments {k}");
        }
        // State in and out are inverses.
        let s2 = words(opt.state_words(dim));
        opt.state_in(dim, &st, &s2);
        let mut back = vec![0f32; st.len()];
        opt.state_out(dim, &s2, &mut back);
        assert_eq!(back, st);
    }

    #[test]
    fn bf16_rows_computed_in_f32_and_rounded() {
        let dim = 4;
        let opt = Optimizer::Sgd { lr: 1.0 };
        let w = words(elem::words(elem::Float::Bf16, dim));
        elem::store::<Bf16>(&w, 0, &[1.0, 1.0, 1.0, 1.0]);
        // A bf16 gradient on the wire.
        let g: Vec<u8> = [0.5f32, 0.25, 2.0, -1.0]
            .iter()
            .flat_map(|&x| crate::float::f32_to_bf16(x).to_le_bytes())
            .collect();
        apply::<Bf16, Bf16>(&opt, dim, &w, &[], &g);
        let mut out = [0f32; 4];
        elem::load::<Bf16>(&w, 0, &mut out);
        assert_eq!(out, [0.5, 0.75, -1.0, 2.0]);
    }

    #[test]
    fn parameters_checked() {
        assert!(Optimizer::Sgd { lr: f32::NAN }.check().is_err());
        let bad_acc = Optimizer::Adagrad {
            lr: 1.0,
            initial_accumulator: 0.0,
        };
        assert!(bad_acc.check().unwrap_err().contains("initial_accumulator"));
        let mut adam = Optimizer::adam(0.01);
        assert!(adam.check().is_ok());
        if let Optimizer::Adam { beta2, .. } = &mut adam {
            *beta2 = 1.0;
        }
        assert!(adam.check().unwrap_err().contains("beta2"));
        assert_eq!(Optimizer::adam(1.0).state_len(4), 10);
        assert_eq!(Optimizer::adam(1.0).state_words(3), 5);
    }
}
