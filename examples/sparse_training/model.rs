//! The model of the sparse training example, with no dependencies: synthetic click data
//! drawn from a known factorization machine, the model's loss and gradients, and a plain
//! PS shard's rows with their Adagrad state (the example's PS tasks keep theirs in
//! starwire's `PsTable`; `tools/wirebench`'s servers in this `Shard`).
//!
//! Every example has one categorical value per field plus a bias feature. A value is hashed
//! to a feature id; each id owns a row of `dim` f32: one linear weight and `dim - 1` factor
//! components. The click probability is `sigmoid(sum of linear weights + sum over pairs of
//! features of the dot product of their factors)`. The labels are drawn from a model of
//! exactly this form whose parameters are a fixed function of the id (the ground truth), so
//! the best achievable loss on any set of examples is known: the loss of the ground truth
//! itself on them. `examples/sparse_training.rs` runs the model over starwire;
//! `tools/wirebench` includes this file for its training step.

#![allow(dead_code)] // each includer uses a different part

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Sizes of the data and the model, and the optimizer's settings.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    /// Categorical fields per example (the bias feature comes on top).
    pub fields: usize,
    /// Distinct values per field.
    pub vocab: u64,
    /// Zipf exponent of the values' frequencies: a few values are common, most are rare.
    pub zipf: f64,
    /// Feature ids are hashed into `0..2^hash_bits`.
    pub hash_bits: u32,
    /// f32 per row: one linear weight and `dim - 1` factor components.
    pub dim: usize,
    /// Examples per step.
    pub batch: usize,
    /// Adagrad's learning rate.
    pub learning_rate: f32,
    /// Adagrad's initial squared-gradient sum.
    pub initial_accumulator: f32,
    /// Ground truth: bias, and the standard deviations of linear weights and factors.
    pub true_bias: f32,
    pub true_linear_std: f32,
    pub true_factor_std: f32,
    /// Standard deviation of the learned factors' initial values.
    pub init_factor_std: f32,
}

impl Default for ModelConfig {
    fn default() -> ModelConfig {
        ModelConfig {
            fields: 16,
            vocab: 300,
            zipf: 1.1,
            hash_bits: 24,
            dim: 16,
            batch: 512,
            learning_rate: 0.05,
            initial_accumulator: 0.1,
            true_bias: -1.5,
            true_linear_std: 0.4,
            true_factor_std: 0.05,
            init_factor_std: 0.01,
        }
    }
}

impl ModelConfig {
    /// Features per example: the fields and the bias.
    pub fn features(&self) -> usize {
        self.fields + 1
    }

    /// Bytes of one row on the wire.
    pub fn row_bytes(&self) -> usize {
        self.dim * 4
    }
}

/// The bias feature's id: every example has it.
pub const BIAS_ID: u64 = 0;

/// splitmix64: a fast, well-mixed 64-bit hash.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Hashes a `u64` key with [`mix`]: feature ids are already hashes, so one splitmix64
/// round spreads them; a fraction of the cost of the standard library's SipHash, which
/// matters where a PS looks up thousands of rows per request.
#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = mix(self.0 ^ u64::from(b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = mix(self.0 ^ x);
    }
}

/// A map keyed by feature id, hashed by [`IdHasher`].
pub type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// A uniform value in (0, 1) from a hash.
fn unit(h: u64) -> f64 {
    ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

/// A standard normal value from a hash (Box-Muller).
fn normal(h: u64) -> f32 {
    let (u, v) = (unit(h), unit(mix(h ^ 0x5bd1_e995)));
    ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
}

/// The id of value `value` of field `field`: never `BIAS_ID`.
pub fn feature_id(cfg: &ModelConfig, field: usize, value: u64) -> u64 {
    let mask = (1u64 << cfg.hash_bits) - 1;
    let id = mix(mix(field as u64 + 1) ^ value) & mask;
    if id == BIAS_ID {
        1
    } else {
        id
    }
}

/// Component `k` of the ground truth's row for `id` (`k == 0`: the linear weight).
pub fn true_param(cfg: &ModelConfig, id: u64, k: usize) -> f32 {
    match (id, k) {
        (BIAS_ID, 0) => cfg.true_bias,
        (BIAS_ID, _) => 0.0,
        (_, 0) => cfg.true_linear_std * normal(mix(id ^ 0x1111)),
        _ => cfg.true_factor_std * normal(mix(id.wrapping_mul(131) + k as u64)),
    }
}

/// Which of `shards` PS tasks owns `id`.
pub fn shard_of(id: u64, shards: usize) -> usize {
    (mix(id ^ 0x77) % shards as u64) as usize
}

/// One step's examples and the distinct ids they use.
#[derive(Default, Debug)]
pub struct Batch {
    /// `examples x features` ids, example by example.
    pub ids: Vec<u64>,
    /// 0 or 1 per example.
    pub labels: Vec<f32>,
    /// The ground truth's logit per example (for the best achievable loss).
    pub true_logits: Vec<f32>,
    /// The distinct ids, in first-seen order: the rows to pull and to push.
    pub unique: Vec<u64>,
    /// For each entry of `ids`, its index in `unique`.
    pub slot: Vec<u32>,
    index: IdMap<u32>,
}

impl Batch {
    /// Examples in the batch.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the batch has no examples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

/// Draws examples from the ground truth.
pub struct Generator {
    cfg: ModelConfig,
    state: u64,
    /// Cumulative Zipf weights of the values, normalized to 1.
    cdf: Vec<f64>,
    scratch: Vec<f32>,
    /// With [`Generator::with_truth_cache`]: the ground truth's row of each id met so far
    /// (index into `truth_rows`, `dim` f32 each).
    truth: Option<IdMap<u32>>,
    truth_rows: Vec<f32>,
}

impl Generator {
    pub fn new(cfg: &ModelConfig, seed: u64) -> Generator {
        let mut cdf = Vec::with_capacity(cfg.vocab as usize);
        let mut sum = 0.0;
        for k in 0..cfg.vocab {
            sum += 1.0 / ((k + 1) as f64).powf(cfg.zipf);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        Generator {
            cfg: cfg.clone(),
            state: mix(seed ^ 0xdead_beef),
            cdf,
            scratch: Vec::new(),
            truth: None,
            truth_rows: Vec::new(),
        }
    }

    /// Like [`new`](Self::new), and keeps the ground truth's row of every id it meets, so
    /// that drawing a batch computes each id's parameters once rather than once per
    /// example: the same batches, a fraction of the CPU time (ids are few, examples many).
    pub fn with_truth_cache(cfg: &ModelConfig, seed: u64) -> Generator {
        Generator {
            truth: Some(IdMap::default()),
            ..Generator::new(cfg, seed)
        }
    }

    /// The ground truth's row of `id` into `out` (`dim` f32).
    fn true_row(&mut self, id: u64, out: &mut [f32]) {
        let cfg = &self.cfg;
        let Some(truth) = &mut self.truth else {
            for (k, v) in out.iter_mut().enumerate() {
                *v = true_param(cfg, id, k);
            }
            return;
        };
        let dim = cfg.dim;
        let at = *truth.entry(id).or_insert_with(|| {
            let at = self.truth_rows.len() / dim;
            self.truth_rows
                .extend((0..dim).map(|k| true_param(cfg, id, k)));
            at as u32
        }) as usize;
        out.copy_from_slice(&self.truth_rows[at * dim..][..dim]);
    }

    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(1);
        mix(self.state)
    }

    /// Fills `batch` with `cfg.batch` new examples.
    pub fn next_batch(&mut self, batch: &mut Batch) {
        let cfg = self.cfg.clone();
        let features = cfg.features();
        batch.ids.clear();
        batch.labels.clear();
        batch.true_logits.clear();
        batch.unique.clear();
        batch.slot.clear();
        batch.index.clear();
        let mut rows = std::mem::take(&mut self.scratch);
        rows.resize(features * cfg.dim, 0.0);
        for _ in 0..cfg.batch {
            let start = batch.ids.len();
            batch.ids.push(BIAS_ID);
            for field in 0..cfg.fields {
                let u = unit(self.next());
                let value = self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1);
                batch.ids.push(feature_id(&cfg, field, value as u64));
            }
            for (i, &id) in batch.ids[start..].iter().enumerate() {
                self.true_row(id, &mut rows[i * cfg.dim..(i + 1) * cfg.dim]);
            }
            let logit = logit_of(cfg.dim, &rows, features, &mut []);
            let label = if unit(self.next()) < sigmoid(logit) as f64 {
                1.0
            } else {
                0.0
            };
            batch.labels.push(label);
            batch.true_logits.push(logit);
        }
        self.scratch = rows;
        for &id in &batch.ids {
            let next = batch.unique.len() as u32;
            let slot = *batch.index.entry(id).or_insert(next);
            if slot == next {
                batch.unique.push(id);
            }
            batch.slot.push(slot);
        }
    }
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Log loss of a logit against a 0/1 label, computed stably.
pub fn log_loss(logit: f32, label: f32) -> f64 {
    let x = logit as f64;
    x.max(0.0) - x * label as f64 + (-x.abs()).exp().ln_1p()
}

/// The logit of one example from its `n` rows (`rows[i * dim..]`); fills `sums` (the
/// per-component sums of the factors, `dim - 1` of them) when it is not empty.
fn logit_of(dim: usize, rows: &[f32], n: usize, sums: &mut [f32]) -> f32 {
    let mut linear = 0.0;
    let mut pairs = 0.0;
    for k in 1..dim {
        let (mut s, mut q) = (0.0f32, 0.0f32);
        for i in 0..n {
            let v = rows[i * dim + k];
            s += v;
            q += v * v;
        }
        pairs += 0.5 * (s * s - q);
        if !sums.is_empty() {
            sums[k - 1] = s;
        }
    }
    for i in 0..n {
        linear += rows[i * dim];
    }
    linear + pairs
}

/// Scratch space of [`forward_backward`], kept between steps.
#[derive(Default)]
pub struct Scratch {
    rows: Vec<f32>,
    sums: Vec<f32>,
}

/// The model on one batch: `rows` holds the current row of each id of `batch.unique`, in
/// that order (`dim` f32 each). Writes the summed gradient of each unique id's row into
/// `grads` (same shape) and each example's predicted probability into `predictions`;
/// returns the summed log loss.
pub fn forward_backward(
    cfg: &ModelConfig,
    batch: &Batch,
    rows: &[f32],
    grads: &mut [f32],
    predictions: &mut Vec<f32>,
    scratch: &mut Scratch,
) -> f64 {
    let (dim, features) = (cfg.dim, cfg.features());
    assert_eq!(rows.len(), batch.unique.len() * dim);
    assert_eq!(grads.len(), rows.len());
    grads.fill(0.0);
    predictions.clear();
    scratch.rows.resize(features * dim, 0.0);
    scratch.sums.resize(dim.saturating_sub(1), 0.0);
    let mut loss = 0.0;
    for (e, &label) in batch.labels.iter().enumerate() {
        let slots = &batch.slot[e * features..(e + 1) * features];
        for (i, &slot) in slots.iter().enumerate() {
            let row = &rows[slot as usize * dim..(slot as usize + 1) * dim];
            scratch.rows[i * dim..(i + 1) * dim].copy_from_slice(row);
        }
        let logit = logit_of(dim, &scratch.rows, features, &mut scratch.sums);
        let p = sigmoid(logit);
        predictions.push(p);
        loss += log_loss(logit, label);
        let g = p - label;
        for (i, &slot) in slots.iter().enumerate() {
            let grad = &mut grads[slot as usize * dim..(slot as usize + 1) * dim];
            grad[0] += g;
            let own = &scratch.rows[i * dim + 1..(i + 1) * dim];
            for ((gk, &sum), &v) in grad[1..].iter_mut().zip(&scratch.sums).zip(own) {
                *gk += g * (sum - v);
            }
        }
    }
    loss
}

/// The ground truth's summed log loss on a batch: the best any model can expect there.
pub fn optimal_loss(batch: &Batch) -> f64 {
    let pairs = batch.true_logits.iter().zip(&batch.labels);
    pairs.map(|(&logit, &label)| log_loss(logit, label)).sum()
}

/// Area under the ROC curve of `scores` against 0/1 `labels` (ties count half).
pub fn auc(scores: &[f32], labels: &[f32]) -> f64 {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let (mut rank_sum, mut positives) = (0.0f64, 0.0f64);
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j < order.len() && scores[order[j]] == scores[order[i]] {
            j += 1;
        }
        // Ranks i+1 ..= j share their mean.
        let rank = (i + 1 + j) as f64 / 2.0;
        for &o in &order[i..j] {
            if labels[o] > 0.5 {
                rank_sum += rank;
                positives += 1.0;
            }
        }
        i = j;
    }
    let negatives = scores.len() as f64 - positives;
    if positives == 0.0 || negatives == 0.0 {
        return 0.5;
    }
    (rank_sum - positives * (positives + 1.0) / 2.0) / (positives * negatives)
}

/// A PS task's share of the rows, with their Adagrad state. Rows are created on first
/// update; a row never updated reads as its initial value.
pub struct Shard {
    cfg: ModelConfig,
    index: IdMap<u32>,
    /// Rows and then squared-gradient sums, `2 * dim` f32 per id.
    state: Vec<f32>,
}

impl Shard {
    pub fn new(cfg: &ModelConfig) -> Shard {
        Shard {
            cfg: cfg.clone(),
            index: IdMap::default(),
            state: Vec::new(),
        }
    }

    /// Rows stored (updated at least once).
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    fn initial(&self, id: u64, out: &mut [f32]) {
        out[0] = 0.0;
        for (k, v) in out.iter_mut().enumerate().skip(1) {
            *v = self.cfg.init_factor_std * normal(mix(id ^ 0xabcd_0000 ^ k as u64));
        }
    }

    /// The current row of `id` into `out` (`dim` f32).
    pub fn read(&self, id: u64, out: &mut [f32]) {
        let dim = self.cfg.dim;
        match self.index.get(&id) {
            Some(&at) => out.copy_from_slice(&self.state[at as usize * 2 * dim..][..dim]),
            None => self.initial(id, out),
        }
    }

    /// One Adagrad step of `id`'s row along `grad` (`dim` f32).
    pub fn apply(&mut self, id: u64, grad: &[f32]) {
        let dim = self.cfg.dim;
        let at = match self.index.get(&id) {
            Some(&at) => at as usize,
            None => {
                let at = self.index.len();
                self.index.insert(id, at as u32);
                self.state
                    .resize((at + 1) * 2 * dim, self.cfg.initial_accumulator);
                let mut row = vec![0.0; dim];
                self.initial(id, &mut row);
                self.state[at * 2 * dim..][..dim].copy_from_slice(&row);
                at
            }
        };
        let (row, accum) = self.state[at * 2 * dim..(at + 1) * 2 * dim].split_at_mut(dim);
        for k in 0..dim {
            let g = grad[k];
            accum[k] += g * g;
            row[k] -= self.cfg.learning_rate * g / accum[k].sqrt();
        }
    }
}
