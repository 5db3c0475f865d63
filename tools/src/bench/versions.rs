//! `--versioned` pulls: the version bench holds of each row, the pulls in flight and which
//! draws their ids came from, and the pushes (`--changed`) that make some rows come back
//! changed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use starwire::rows::PulledRows;
use starwire::{DType, Tensor};

use super::ids::Ids;
use crate::exit::Failure;

/// Most rows `--versioned` holds a version of (8 bytes each).
pub(super) const MAX_VERSIONED_ROWS: u64 = 1 << 24;

/// What a versioned run holds.
pub(super) struct Versions {
    /// The version held of each row id, 0 for none.
    held: Vec<u64>,
    /// Pulls in flight: tag to the index of the first draw of their ids.
    pulls: HashMap<u64, u64>,
    /// The held versions of the pull being submitted, one per id.
    request: Vec<u64>,
    /// Rows of each pull pushed to just before it, and their gradient rows.
    pub changed_rows: usize,
    pub grads: Arc<Tensor>,
    /// Pushes in flight, by tag.
    pushes: HashSet<u64>,
}

/// The share of `k` rows `--changed` asks for, rounded to the nearest row.
pub(super) fn changed_rows(fraction: f64, k: usize) -> usize {
    ((fraction * k as f64).round() as usize).min(k)
}

impl Versions {
    /// For `rows` row ids, pulls of `k` rows of `dim` f32 with `changed` of each pushed to
    /// first, `inflight` in flight.
    pub(super) fn new(
        rows: u64,
        k: usize,
        dim: usize,
        changed: usize,
        inflight: usize,
    ) -> Result<Versions, Failure> {
        // Small gradients, so that rows stay small however long the run.
        let grads: Vec<u8> = (0..changed * dim)
            .flat_map(|i| (1e-3 * ((i % 5) as f32 - 2.0)).to_le_bytes())
            .collect();
        let grads = Tensor::from_bytes(DType::U8, &[grads.len() as u64], grads)
            .map_err(|e| Failure::usage(format!("gradients: {e}")))?;
        Ok(Versions {
            held: vec![0; rows as usize],
            pulls: HashMap::with_capacity(inflight * 2),
            request: Vec::with_capacity(k),
            changed_rows: changed,
            grads: Arc::new(grads),
            pushes: HashSet::with_capacity(inflight * 2),
        })
    }

    /// The versions held of `ids`, for the pull about to go.
    pub(super) fn held_of(&mut self, ids: &[u64]) -> &[u64] {
        self.request.clear();
        let held = &self.held;
        self.request.extend(
            ids.iter()
                .map(|&id| held.get(id as usize).copied().unwrap_or(0)),
        );
        &self.request
    }

    /// Pull `tag`, whose ids are draws `first..`, went out.
    pub(super) fn pulled(&mut self, tag: u64, first: u64) {
        self.pulls.insert(tag, first);
    }

    /// Pull `tag` failed: its versions will not come.
    pub(super) fn forget(&mut self, tag: u64) {
        self.pulls.remove(&tag);
    }

    /// Push `tag` went out.
    pub(super) fn pushed(&mut self, tag: u64) {
        self.pushes.insert(tag);
    }

    /// Whether `tag` is a push of this run (and no longer in flight).
    pub(super) fn push_done(&mut self, tag: u64) -> bool {
        self.pushes.remove(&tag)
    }

    /// Pushes in flight.
    pub(super) fn pushes_in_flight(&self) -> usize {
        self.pushes.len()
    }

    /// Takes the versions of pull `tag`'s answer: each row's version is the one held from
    /// now on. Returns the rows that came unchanged.
    pub(super) fn answered(&mut self, tag: u64, ids: &Ids, rows: &PulledRows) -> u64 {
        let Some(first) = self.pulls.remove(&tag) else {
            return 0;
        };
        self.learn(ids, first, rows);
        rows.unchanged_count(0) as u64
    }

    /// Holds the versions `rows` gives for draws `first..` of `ids`.
    pub(super) fn learn(&mut self, ids: &Ids, first: u64, rows: &PulledRows) {
        for (i, &v) in rows.versions(0).iter().enumerate() {
            if let Some(h) = self.held.get_mut(ids.id(first + i as u64) as usize) {
                *h = v;
            }
        }
    }

    /// Holds the versions `rows` gives for the rows `start..start + n` (the pass that learns
    /// them before the clock starts). Returns how many of them are known (not 0).
    pub(super) fn learn_range(&mut self, start: u64, rows: &PulledRows) -> usize {
        let v = rows.versions(0);
        let at = start as usize;
        let end = (at + v.len()).min(self.held.len());
        self.held[at..end].copy_from_slice(&v[..end - at]);
        v.iter().filter(|&&v| v != 0).count()
    }
}
