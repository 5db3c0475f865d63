//! The sans-IO part of a sharded rows client: which PS shard owns which id, the distinct
//! ids to send to each, and the copies between the per-shard blocks and the batch. The
//! user's guide is on [`Plan`].

use core::fmt;

use crate::hash::{mix64, IdMap};
use crate::wire::DType;

/// How ids are spread over the shards of a partitioned table, as TensorFlow's partitioned
/// variables do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partition {
    /// Shard `id % shards` (TensorFlow's `"mod"` strategy).
    Mod,
    /// Contiguous ranges of `0..vocab` (TensorFlow's `"div"` strategy): with
    /// `ids_per = vocab / shards` and `extras = vocab % shards`, the first `extras` shards
    /// hold `ids_per + 1` ids and the others `ids_per`. Ids `>= vocab` go to the last shard.
    Div {
        /// Number of ids of the table (the first dimension of the full variable).
        vocab: u64,
    },
    /// Shard `mix64(id) % shards`, with `mix64` the finalizer of splitmix64: spreads ids
    /// that are not uniform (hashed features with a pattern, sequential ids) evenly.
    Hash,
}

impl Partition {
    /// The shard of `shards` that owns `id`, in `0..shards`. Never panics; `shards == 0` is
    /// taken as 1.
    pub fn shard(&self, id: u64, shards: usize) -> usize {
        let n = shards.max(1) as u64;
        let s = match *self {
            Partition::Mod => id % n,
            Partition::Hash => mix64(id) % n,
            Partition::Div { vocab } => {
                if id >= vocab {
                    n - 1
                } else {
                    let (ids_per, extras) = (vocab / n, vocab % n);
                    // The first `extras` shards hold one id more. This is TensorFlow's
                    // `max(id / (ids_per + 1), (id - extras) / ids_per)` without its
                    // negative intermediate and its division by zero when `vocab < shards`.
                    // `extras > 0` implies `n >= 2`, so `ids_per + 1` cannot overflow, and
                    // `extras * (ids_per + 1) <= vocab`.
                    let big = if extras == 0 {
                        0
                    } else {
                        extras * (ids_per + 1)
                    };
                    if id < big {
                        id / (ids_per + 1)
                    } else {
                        // `id < vocab` with `id >= big` implies `ids_per > 0`.
                        extras + (id - big) / ids_per
                    }
                }
            }
        };
        s as usize
    }
}

/// Why a [`Plan`] refused a call. Nothing is changed when a call fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanError {
    /// A plan needs at least one shard.
    NoShards,
    /// More shards than the plan indexes (`u32::MAX`).
    TooManyShards(usize),
    /// A batch longer than the plan indexes (`u32::MAX` ids).
    BatchTooLong(usize),
    /// No such shard.
    Shard {
        /// The shard asked for.
        shard: usize,
        /// Number of shards of the plan.
        shards: usize,
    },
    /// A buffer of the wrong length.
    Length {
        /// Which buffer: `"block"`, `"out"` or `"grads"`.
        what: &'static str,
        /// The length it must have (`usize::MAX` when that overflows).
        expected: usize,
        /// Its length.
        actual: usize,
    },
    /// `row_bytes` is not a whole number of elements of the dtype.
    RowBytes {
        /// The row length given.
        row_bytes: usize,
        /// The dtype's element size.
        elem: usize,
    },
    /// [`Plan::merge`] sums only `F32` and `F64`.
    DType(DType),
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PlanError::NoShards => f.write_str("a rows plan needs at least one shard"),
            PlanError::TooManyShards(n) => {
                write!(f, "{n} shards: a rows plan indexes at most {}", u32::MAX)
            }
            PlanError::BatchTooLong(n) => {
                write!(
                    f,
                    "batch of {n} ids: a rows plan indexes at most {}",
                    u32::MAX
                )
            }
            PlanError::Shard { shard, shards } => {
                write!(f, "shard {shard} of a plan with {shards} shards")
            }
            PlanError::Length {
                what,
                expected,
                actual,
            } => write!(f, "{what} is {actual} bytes, expected {expected}"),
            PlanError::RowBytes { row_bytes, elem } => {
                write!(
                    f,
                    "row of {row_bytes} bytes is not a whole number of {elem}-byte elements"
                )
            }
            PlanError::DType(d) => write!(f, "cannot sum gradients of dtype {d:?} (F32, F64 only)"),
        }
    }
}

impl std::error::Error for PlanError {}

/// Where a batch position's id lives: its shard and its index in that shard's ids.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    shard: u32,
    row: u32,
}

/// A batch position and the row (index in its shard's ids) of its id.
#[derive(Debug, Clone, Copy, Default)]
struct Member {
    pos: u32,
    row: u32,
}

/// The distinct ids of a batch split by shard, and the inverse index back to the batch:
/// everything a sharded rows client does around the wire, reused step after step.
///
/// A worker's step pulls the rows of a batch of ids (with repeats) from several PS shards:
/// [`Plan::build`] removes the repeats and splits the distinct ids by shard; each shard is
/// sent [`Plan::ids`] and answers one block of rows in that order; [`Plan::scatter`] copies
/// each block's rows to every batch position that asked for them. The push goes the other
/// way: [`Plan::merge`] sums the batch's gradient rows of each distinct id into one block per
/// shard, in the order of [`Plan::ids`].
///
/// The ids sent to a shard are the **global** ids of the batch, not offsets within the
/// shard: a PS serves rows by the id the worker knows.
///
/// Once warmed up by a batch at least as long, a step allocates nothing: every buffer of
/// the plan is sized by the batch length, not by how the ids spread over the shards.
///
/// ```
/// use starwire::rows::{Partition, Plan};
/// use starwire::DType;
///
/// // f32 rows of one element, as bytes.
/// fn bytes(v: &[f32]) -> Vec<u8> {
///     v.iter().flat_map(|x| x.to_le_bytes()).collect()
/// }
/// let row_bytes = 4;
///
/// let mut plan = Plan::new(2, Partition::Mod)?;
/// plan.build(&[4, 7, 4, 2])?;
/// assert_eq!(plan.ids(0), [4, 2]);
/// assert_eq!(plan.ids(1), [7]);
///
/// // Each shard's answer, in the order of its ids, to the batch's positions.
/// let mut rows = vec![0u8; plan.batch_len() * row_bytes];
/// plan.scatter(0, &bytes(&[40.0, 20.0]), row_bytes, &mut rows)?;
/// plan.scatter(1, &bytes(&[70.0]), row_bytes, &mut rows)?;
/// assert_eq!(rows, bytes(&[40.0, 70.0, 40.0, 20.0]));
///
/// // The batch's gradients to shard 0's block: id 4's two rows summed.
/// let grads = bytes(&[1.0, 2.0, 3.0, 4.0]);
/// let mut block = vec![0u8; plan.ids(0).len() * row_bytes];
/// plan.merge(0, DType::F32, &grads, row_bytes, &mut block)?;
/// assert_eq!(block, bytes(&[4.0, 4.0]));
/// # Ok::<(), starwire::rows::PlanError>(())
/// ```
#[derive(Debug)]
pub struct Plan {
    shards: usize,
    partition: Partition,
    /// Id -> its index in first-seen order over the whole batch (`uniques`).
    index: IdMap<u32>,
    /// Distinct ids in first-seen order, and the shard and row of each.
    uniques: Vec<u64>,
    unique_shard: Vec<u32>,
    unique_row: Vec<u32>,
    /// Distinct ids grouped by shard, first-seen order within a shard: shard `s` owns
    /// `ids[id_start[s]..id_start[s + 1]]`.
    ids: Vec<u64>,
    id_start: Vec<u32>,
    /// Batch positions grouped by shard, increasing within a shard: shard `s` owns
    /// `members[member_start[s]..member_start[s + 1]]`.
    members: Vec<Member>,
    member_start: Vec<u32>,
    /// Per batch position, where its id lives.
    slots: Vec<Slot>,
    /// Per shard, a write cursor while grouping.
    cursor: Vec<u32>,
}

impl Plan {
    /// A plan over `shards` shards (at least one, at most `u32::MAX`), ids spread by
    /// `partition`.
    pub fn new(shards: usize, partition: Partition) -> Result<Plan, PlanError> {
        if shards == 0 {
            return Err(PlanError::NoShards);
        }
        if u32::try_from(shards).is_err() {
            return Err(PlanError::TooManyShards(shards));
        }
        Ok(Plan {
            shards,
            partition,
            index: IdMap::default(),
            uniques: Vec::new(),
            unique_shard: Vec::new(),
            unique_row: Vec::new(),
            ids: Vec::new(),
            id_start: vec![0; shards + 1],
            members: Vec::new(),
            member_start: vec![0; shards + 1],
            slots: Vec::new(),
            cursor: vec![0; shards],
        })
    }

    /// Plans the batch `ids` (with repeats), replacing the previous plan. Allocates only when
    /// `ids` is longer than every batch before it.
    pub fn build(&mut self, ids: &[u64]) -> Result<(), PlanError> {
        let n = ids.len();
        if u32::try_from(n).is_err() {
            return Err(PlanError::BatchTooLong(n));
        }
        self.index.clear();
        self.uniques.clear();
        self.unique_shard.clear();
        self.unique_row.clear();
        self.ids.clear();
        self.members.clear();
        self.slots.clear();
        // Sized by the batch, not by how many distinct ids it has nor how they spread: so
        // any batch no longer than an earlier one fits without a reallocation.
        self.index.reserve(n);
        self.uniques.reserve(n);
        self.unique_shard.reserve(n);
        self.unique_row.reserve(n);
        self.ids.reserve(n);
        self.members.reserve(n);
        self.slots.reserve(n);
        self.id_start.fill(0);
        self.member_start.fill(0);

        // Pass 1: distinct ids in first-seen order, their shards, the count of distinct ids
        // and of positions per shard (at `s + 1`, for the prefix sums).
        for &id in ids {
            let next = self.uniques.len() as u32;
            let u = *self.index.entry(id).or_insert(next);
            let shard = if u == next {
                let shard = self.partition.shard(id, self.shards);
                self.uniques.push(id);
                self.unique_shard.push(shard as u32);
                self.id_start[shard + 1] += 1;
                shard
            } else {
                self.unique_shard[u as usize] as usize
            };
            self.member_start[shard + 1] += 1;
            // The row is known after grouping; hold the unique index meanwhile.
            self.slots.push(Slot {
                shard: shard as u32,
                row: u,
            });
        }
        for s in 0..self.shards {
            self.id_start[s + 1] += self.id_start[s];
            self.member_start[s + 1] += self.member_start[s];
        }

        // Pass 2: distinct ids grouped by shard, keeping first-seen order (a stable
        // counting sort).
        self.ids.resize(self.uniques.len(), 0);
        self.cursor.copy_from_slice(&self.id_start[..self.shards]);
        for (&id, &shard) in self.uniques.iter().zip(&self.unique_shard) {
            let at = self.cursor[shard as usize];
            self.cursor[shard as usize] = at + 1;
            self.ids[at as usize] = id;
            self.unique_row.push(at - self.id_start[shard as usize]);
        }

        // Pass 3: positions grouped by shard, increasing within a shard.
        self.members.resize(n, Member::default());
        self.cursor
            .copy_from_slice(&self.member_start[..self.shards]);
        for (pos, slot) in self.slots.iter_mut().enumerate() {
            slot.row = self.unique_row[slot.row as usize];
            let at = self.cursor[slot.shard as usize];
            self.cursor[slot.shard as usize] = at + 1;
            self.members[at as usize] = Member {
                pos: pos as u32,
                row: slot.row,
            };
        }
        Ok(())
    }

    /// Number of shards.
    pub fn shards(&self) -> usize {
        self.shards
    }

    /// How ids are spread over the shards.
    pub fn partition(&self) -> Partition {
        self.partition
    }

    /// Batch positions whose ids are among `missing` (sorted positions in shard `s`'s
    /// ids): the positions a pull left without a row.
    pub(crate) fn missing_positions(&self, s: usize, missing: &[u32]) -> usize {
        if missing.is_empty() {
            return 0;
        }
        (0..self.batch_len())
            .filter(|&p| {
                self.slot(p).is_some_and(|(shard, j)| {
                    shard == s && missing.binary_search(&(j as u32)).is_ok()
                })
            })
            .count()
    }

    /// Ids of the planned batch, repeats included.
    pub fn batch_len(&self) -> usize {
        self.slots.len()
    }

    /// Distinct ids of the planned batch.
    pub fn unique_len(&self) -> usize {
        self.uniques.len()
    }

    /// The distinct ids of the batch that `shard` owns, in the order they were first seen:
    /// what to send it, and the order of the rows it answers. Global ids, not offsets
    /// within the shard. Empty for a shard out of range.
    pub fn ids(&self, shard: usize) -> &[u64] {
        match self.range(&self.id_start, shard) {
            Some((a, b)) => &self.ids[a..b],
            None => &[],
        }
    }

    /// Where the id at batch position `pos` lives: its shard and its index in
    /// [`ids(shard)`](Self::ids). `None` past the batch.
    pub fn slot(&self, pos: usize) -> Option<(usize, usize)> {
        let s = self.slots.get(pos)?;
        Some((s.shard as usize, s.row as usize))
    }

    /// Copies each row of `block`, the answer of `shard` (`ids(shard).len()` rows of
    /// `row_bytes`, in the order of [`ids`](Self::ids)), to every batch position of its id
    /// in `out` (`batch_len()` rows). Positions of other shards are left as they are.
    pub fn scatter(
        &self,
        shard: usize,
        block: &[u8],
        row_bytes: usize,
        out: &mut [u8],
    ) -> Result<(), PlanError> {
        let members = self.members(shard)?;
        let rows = self.ids(shard).len();
        check_len("block", block, rows, row_bytes)?;
        check_len("out", out, self.batch_len(), row_bytes)?;
        for m in members {
            let (pos, row) = (m.pos as usize, m.row as usize);
            out[pos * row_bytes..][..row_bytes]
                .copy_from_slice(&block[row * row_bytes..][..row_bytes]);
        }
        Ok(())
    }

    /// Copies to every batch position of each of `shard`'s ids, in `out` (`batch_len()`
    /// rows of `row_bytes`), the row `row(j)` gives for it (`j` its index in
    /// [`ids(shard)`](Self::ids)); positions whose `row(j)` is `None`, and those of other
    /// shards, are left as they are. A row of another length than `row_bytes` is refused
    /// (the rows before it were copied).
    pub(crate) fn scatter_each<'a>(
        &self,
        shard: usize,
        row_bytes: usize,
        out: &mut [u8],
        mut row: impl FnMut(usize) -> Option<&'a [u8]>,
    ) -> Result<(), PlanError> {
        let members = self.members(shard)?;
        check_len("out", out, self.batch_len(), row_bytes)?;
        for m in members {
            if let Some(src) = row(m.row as usize) {
                if src.len() != row_bytes {
                    return Err(PlanError::Length {
                        what: "block",
                        expected: row_bytes,
                        actual: src.len(),
                    });
                }
                out[m.pos as usize * row_bytes..][..row_bytes].copy_from_slice(src);
            }
        }
        Ok(())
    }

    /// Writes into `out` (`ids(shard).len()` rows of `row_bytes`, in the order of
    /// [`ids`](Self::ids)) the sum of the gradient rows of each of `shard`'s ids, from
    /// `grads`: the batch's rows (`batch_len()` rows of `row_bytes`), elements little-endian
    /// `dtype` (`F32` or `F64`), no alignment needed. Rows are added in batch order; an id
    /// seen once is copied as is.
    pub fn merge(
        &self,
        shard: usize,
        dtype: DType,
        grads: &[u8],
        row_bytes: usize,
        out: &mut [u8],
    ) -> Result<(), PlanError> {
        let add: fn(&mut [u8], &[u8]) = match dtype {
            DType::F32 => add_f32,
            DType::F64 => add_f64,
            other => return Err(PlanError::DType(other)),
        };
        let elem = dtype.size().unwrap_or(1) as usize;
        if row_bytes % elem != 0 {
            return Err(PlanError::RowBytes { row_bytes, elem });
        }
        let members = self.members(shard)?;
        let rows = self.ids(shard).len();
        check_len("grads", grads, self.batch_len(), row_bytes)?;
        check_len("out", out, rows, row_bytes)?;
        // Rows are numbered in first-seen order and members are in batch order, so the
        // first position of row `r` comes when `r` rows have been seen: it sets the row,
        // later ones add to it.
        let mut seen = 0;
        for m in members {
            let (pos, row) = (m.pos as usize, m.row as usize);
            let src = &grads[pos * row_bytes..][..row_bytes];
            let dst = &mut out[row * row_bytes..][..row_bytes];
            if row == seen {
                dst.copy_from_slice(src);
                seen += 1;
            } else {
                add(dst, src);
            }
        }
        Ok(())
    }

    fn range(&self, starts: &[u32], shard: usize) -> Option<(usize, usize)> {
        if shard >= self.shards {
            return None;
        }
        Some((starts[shard] as usize, starts[shard + 1] as usize))
    }

    fn members(&self, shard: usize) -> Result<&[Member], PlanError> {
        let (a, b) = self
            .range(&self.member_start, shard)
            .ok_or(PlanError::Shard {
                shard,
                shards: self.shards,
            })?;
        Ok(&self.members[a..b])
    }
}

/// Checks `buf` holds exactly `rows` rows of `row_bytes`.
fn check_len(
    what: &'static str,
    buf: &[u8],
    rows: usize,
    row_bytes: usize,
) -> Result<(), PlanError> {
    let expected = rows.saturating_mul(row_bytes);
    if buf.len() != expected {
        return Err(PlanError::Length {
            what,
            expected,
            actual: buf.len(),
        });
    }
    Ok(())
}

/// `dst += src`, element-wise, both little-endian f32 of the same length.
fn add_f32(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
        let (mut a, mut b) = ([0u8; 4], [0u8; 4]);
        a.copy_from_slice(d);
        b.copy_from_slice(s);
        d.copy_from_slice(&(f32::from_le_bytes(a) + f32::from_le_bytes(b)).to_le_bytes());
    }
}

/// `dst += src`, element-wise, both little-endian f64 of the same length.
fn add_f64(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.chunks_exact_mut(8).zip(src.chunks_exact(8)) {
        let (mut a, mut b) = ([0u8; 8], [0u8; 8]);
        a.copy_from_slice(d);
        b.copy_from_slice(s);
        d.copy_from_slice(&(f64::from_le_bytes(a) + f64::from_le_bytes(b)).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::splitmix64;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn f64_bytes(v: &[f64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn to_f32(b: &[u8]) -> Vec<f32> {
        b.chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn to_f64(b: &[u8]) -> Vec<f64> {
        b.chunks(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// TensorFlow's div formula as written there, in signed floor division; `ids_per > 0`.
    fn tf_div(id: u64, vocab: u64, shards: u64) -> u64 {
        let (ids_per, extras) = ((vocab / shards) as i64, (vocab % shards) as i64);
        let id = id as i64;
        let a = id.div_euclid(ids_per + 1);
        let b = (id - extras).div_euclid(ids_per);
        a.max(b) as u64
    }

    #[test]
    fn partition_mod() {
        let got: Vec<usize> = (0..7).map(|id| Partition::Mod.shard(id, 3)).collect();
        assert_eq!(got, [0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(Partition::Mod.shard(u64::MAX, 3), (u64::MAX % 3) as usize);
        assert_eq!(Partition::Mod.shard(5, 1), 0);
        assert_eq!(Partition::Mod.shard(5, 0), 0);
    }

    #[test]
    fn partition_div_with_extras() {
        // vocab 10 over 3 shards: ids_per 3, extras 1 -> [0..4), [4..7), [7..10).
        let p = Partition::Div { vocab: 10 };
        let got: Vec<usize> = (0..10).map(|id| p.shard(id, 3)).collect();
        assert_eq!(got, [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]);
        // vocab 11 over 4 shards: ids_per 2, extras 3 -> sizes 3, 3, 3, 2.
        let p = Partition::Div { vocab: 11 };
        let got: Vec<usize> = (0..11).map(|id| p.shard(id, 4)).collect();
        assert_eq!(got, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3]);
        // No extras: equal ranges.
        let p = Partition::Div { vocab: 8 };
        let got: Vec<usize> = (0..8).map(|id| p.shard(id, 4)).collect();
        assert_eq!(got, [0, 0, 1, 1, 2, 2, 3, 3]);
    }

    #[test]
    fn partition_div_matches_tensorflow() {
        for shards in 1..9u64 {
            for vocab in shards..60 {
                let p = Partition::Div { vocab };
                for id in 0..vocab {
                    assert_eq!(
                        p.shard(id, shards as usize) as u64,
                        tf_div(id, vocab, shards),
                        "id {id} vocab {vocab} shards {shards}"
                    );
                }
            }
        }
    }

    #[test]
    fn partition_div_edges() {
        // vocab < shards: ids_per 0, one id per shard for the first `vocab` shards.
        let p = Partition::Div { vocab: 3 };
        let got: Vec<usize> = (0..3).map(|id| p.shard(id, 5)).collect();
        assert_eq!(got, [0, 1, 2]);
        // Ids beyond the vocabulary: the last shard.
        assert_eq!(p.shard(3, 5), 4);
        assert_eq!(p.shard(u64::MAX, 5), 4);
        let p = Partition::Div { vocab: 10 };
        assert_eq!(p.shard(10, 3), 2);
        assert_eq!(p.shard(u64::MAX, 3), 2);
        // Empty vocabulary, huge vocabulary, one shard: no overflow, no panic.
        assert_eq!(Partition::Div { vocab: 0 }.shard(0, 4), 3);
        let p = Partition::Div { vocab: u64::MAX };
        assert_eq!(p.shard(u64::MAX - 1, 1), 0);
        assert_eq!(p.shard(u64::MAX - 1, 2), 1);
        assert_eq!(p.shard(0, 2), 0);
        // u64::MAX = 2 * ids_per + 1: shard 0 holds ids_per + 1 ids.
        assert_eq!(p.shard(u64::MAX / 2, 2), 0);
        assert_eq!(p.shard(u64::MAX / 2 + 1, 2), 1);
        assert_eq!(p.shard(7, 0), 0);
    }

    #[test]
    fn partition_hash() {
        // The splitmix64 finalizer's known values.
        assert_eq!(mix64(0), 0);
        assert_eq!(mix64(1), 0x5692_161d_100b_05e5);
        assert_eq!(
            Partition::Hash.shard(1, 7),
            (0x5692_161d_100b_05e5u64 % 7) as usize
        );
        // Sequential ids spread evenly.
        let mut counts = [0u32; 8];
        for id in 0..8000 {
            counts[Partition::Hash.shard(id, 8)] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn new_refuses_no_shards() {
        assert_eq!(
            Plan::new(0, Partition::Mod).unwrap_err(),
            PlanError::NoShards
        );
        assert!(Plan::new(1, Partition::Hash).is_ok());
    }

    #[test]
    fn build_dedups_within_and_across_shards() {
        let mut plan = Plan::new(3, Partition::Mod).unwrap();
        let batch = [5, 3, 5, 9, 4, 3, 7, 5, 10, 4];
        plan.build(&batch).unwrap();
        assert_eq!(plan.batch_len(), 10);
        assert_eq!(plan.unique_len(), 6);
        assert_eq!(plan.ids(0), [3, 9]);
        assert_eq!(plan.ids(1), [4, 7, 10]);
        assert_eq!(plan.ids(2), [5]);
        assert_eq!(plan.ids(3), [] as [u64; 0]);
        for (pos, &id) in batch.iter().enumerate() {
            let (s, r) = plan.slot(pos).unwrap();
            assert_eq!(plan.ids(s)[r], id, "position {pos}");
        }
        assert_eq!(plan.slot(10), None);

        // A second batch replaces the first.
        plan.build(&[1, 1]).unwrap();
        assert_eq!((plan.batch_len(), plan.unique_len()), (2, 1));
        assert_eq!(plan.ids(0), [] as [u64; 0]);
        assert_eq!(plan.ids(1), [1]);
        plan.build(&[]).unwrap();
        assert_eq!((plan.batch_len(), plan.unique_len()), (0, 0));
        assert!((0..3).all(|s| plan.ids(s).is_empty()));
    }

    #[test]
    fn scatter_fills_duplicates() {
        let mut plan = Plan::new(2, Partition::Div { vocab: 10 }).unwrap();
        let batch = [7, 1, 7, 2, 1, 9];
        plan.build(&batch).unwrap();
        assert_eq!(plan.ids(0), [1, 2]);
        assert_eq!(plan.ids(1), [7, 9]);
        // Two f32 per row: (id, -id).
        let row_bytes = 8;
        let mut out = vec![0xffu8; batch.len() * row_bytes];
        for s in 0..2 {
            let rows: Vec<f32> = plan
                .ids(s)
                .iter()
                .flat_map(|&i| [i as f32, -(i as f32)])
                .collect();
            plan.scatter(s, &f32_bytes(&rows), row_bytes, &mut out)
                .unwrap();
        }
        let want: Vec<f32> = batch
            .iter()
            .flat_map(|&i| [i as f32, -(i as f32)])
            .collect();
        assert_eq!(to_f32(&out), want);
    }

    #[test]
    fn scatter_missing_row_stays_zero() {
        let mut plan = Plan::new(1, Partition::Mod).unwrap();
        plan.build(&[3, 8, 3, 8, 3]).unwrap();
        // The shard had no row for 8: its row of the block is zeros.
        let block = f32_bytes(&[1.5, 0.0]);
        let mut out = vec![0xaau8; 5 * 4];
        plan.scatter(0, &block, 4, &mut out).unwrap();
        assert_eq!(to_f32(&out), [1.5, 0.0, 1.5, 0.0, 1.5]);
        assert_eq!(&out[4..8], [0, 0, 0, 0]);
        assert_eq!(&out[12..16], [0, 0, 0, 0]);
    }

    #[test]
    fn merge_sums_duplicates_f32() {
        let mut plan = Plan::new(2, Partition::Mod).unwrap();
        let batch = [4, 1, 4, 3, 4, 6];
        plan.build(&batch).unwrap();
        assert_eq!(plan.ids(0), [4, 6]);
        assert_eq!(plan.ids(1), [1, 3]);
        // Two f32 per row; position p's gradient is (p, 10 p).
        let grads: Vec<f32> = (0..6).flat_map(|p| [p as f32, 10.0 * p as f32]).collect();
        let grads = f32_bytes(&grads);
        let mut out = vec![0xffu8; 2 * 8];
        plan.merge(0, DType::F32, &grads, 8, &mut out).unwrap();
        // id 4 at 0, 2, 4; id 6 at 5.
        assert_eq!(to_f32(&out), [6.0, 60.0, 5.0, 50.0]);
        plan.merge(1, DType::F32, &grads, 8, &mut out).unwrap();
        assert_eq!(to_f32(&out), [1.0, 10.0, 3.0, 30.0]);
    }

    #[test]
    fn merge_sums_duplicates_f64_unaligned() {
        let mut plan = Plan::new(1, Partition::Hash).unwrap();
        plan.build(&[2, 2, 5, 2]).unwrap();
        assert_eq!(plan.ids(0), [2, 5]);
        // Unaligned buffers: one byte in.
        let mut grads = [0u8; 1 + 4 * 8];
        grads[1..].copy_from_slice(&f64_bytes(&[0.25, 0.5, 8.0, 1.0]));
        let mut out = [0u8; 1 + 2 * 8];
        plan.merge(0, DType::F64, &grads[1..], 8, &mut out[1..])
            .unwrap();
        assert_eq!(to_f64(&out[1..]), [1.75, 8.0]);
    }

    #[test]
    fn merge_refuses_other_dtypes() {
        let mut plan = Plan::new(1, Partition::Mod).unwrap();
        plan.build(&[1]).unwrap();
        let mut out = [0u8; 4];
        let r = plan.merge(0, DType::I32, &[0; 4], 4, &mut out);
        assert_eq!(r, Err(PlanError::DType(DType::I32)));
        let r = plan.merge(0, DType::Unknown(200), &[0; 4], 4, &mut out);
        assert_eq!(r, Err(PlanError::DType(DType::Unknown(200))));
        let r = plan.merge(0, DType::F64, &[0; 4], 4, &mut out);
        assert_eq!(
            r,
            Err(PlanError::RowBytes {
                row_bytes: 4,
                elem: 8
            })
        );
    }

    #[test]
    fn length_errors() {
        let mut plan = Plan::new(2, Partition::Mod).unwrap();
        plan.build(&[0, 2, 1]).unwrap();
        let mut out = vec![0u8; 3 * 4];
        let err = plan.scatter(0, &[0; 4], 4, &mut out).unwrap_err();
        assert_eq!(
            err,
            PlanError::Length {
                what: "block",
                expected: 8,
                actual: 4
            }
        );
        let err = plan.scatter(0, &[0; 8], 4, &mut out[..8]).unwrap_err();
        assert_eq!(
            err,
            PlanError::Length {
                what: "out",
                expected: 12,
                actual: 8
            }
        );
        let err = plan.scatter(2, &[], 4, &mut out).unwrap_err();
        assert_eq!(
            err,
            PlanError::Shard {
                shard: 2,
                shards: 2
            }
        );
        let mut block = vec![0u8; 8];
        let err = plan
            .merge(0, DType::F32, &[0; 8], 4, &mut block)
            .unwrap_err();
        assert_eq!(
            err,
            PlanError::Length {
                what: "grads",
                expected: 12,
                actual: 8
            }
        );
        let err = plan
            .merge(0, DType::F32, &[0; 12], 4, &mut block[..4])
            .unwrap_err();
        assert_eq!(
            err,
            PlanError::Length {
                what: "out",
                expected: 8,
                actual: 4
            }
        );
        // An overflowing row length is a length error, not a panic.
        let err = plan.scatter(0, &[], usize::MAX, &mut out).unwrap_err();
        assert!(matches!(
            err,
            PlanError::Length {
                expected: usize::MAX,
                ..
            }
        ));
        // Nothing written on error.
        assert!(out.iter().all(|&b| b == 0));
        assert!(!err.to_string().is_empty());
    }

    #[test]
    fn zero_row_bytes() {
        let mut plan = Plan::new(2, Partition::Mod).unwrap();
        plan.build(&[1, 1, 2]).unwrap();
        plan.scatter(1, &[], 0, &mut []).unwrap();
        plan.merge(1, DType::F32, &[], 0, &mut []).unwrap();
    }

    #[test]
    fn round_trip_many_shards() {
        // Every id scattered back to its positions, every gradient summed once, for each
        // partition.
        let batch: Vec<u64> = (0..500u64)
            .map(|i| splitmix64(i) % 97 * 1000 + i % 3)
            .collect();
        for partition in [
            Partition::Mod,
            Partition::Div { vocab: 97_000 },
            Partition::Hash,
        ] {
            let mut plan = Plan::new(7, partition).unwrap();
            plan.build(&batch).unwrap();
            let total: usize = (0..7).map(|s| plan.ids(s).len()).sum();
            assert_eq!(total, plan.unique_len());
            let mut out = vec![0u8; batch.len() * 8];
            let grads = f64_bytes(&vec![1.0; batch.len()]);
            let mut counts = 0.0;
            for s in 0..7 {
                assert!(plan.ids(s).iter().all(|&id| partition.shard(id, 7) == s));
                let block = f64_bytes(&plan.ids(s).iter().map(|&i| i as f64).collect::<Vec<_>>());
                plan.scatter(s, &block, 8, &mut out).unwrap();
                let mut sums = vec![0u8; plan.ids(s).len() * 8];
                plan.merge(s, DType::F64, &grads, 8, &mut sums).unwrap();
                for (&id, n) in plan.ids(s).iter().zip(to_f64(&sums)) {
                    assert_eq!(n, batch.iter().filter(|&&b| b == id).count() as f64);
                    counts += n;
                }
            }
            assert_eq!(counts, batch.len() as f64);
            let want: Vec<f64> = batch.iter().map(|&i| i as f64).collect();
            assert_eq!(to_f64(&out), want);
        }
    }
}
