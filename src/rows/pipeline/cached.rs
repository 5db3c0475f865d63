//! The row cache in a [`Pipeline`]'s step: which rows of a part it serves, and their copy
//! into the step's rows.

use super::split::{Decision, Source, Split};
use super::{Landing, Part, Pipeline};
use crate::error::Error;

impl Pipeline {
    /// Splits PS `k`'s part of the batch on its way (every table's ids at `k`), for rows
    /// used after `target` pushes, between the row caches and one request (`may_ask`: the
    /// staleness bound lets a request go now). A cached row is served when it misses at
    /// most `s` of the pushes: when it was fetched sure to reflect the pushes up to
    /// `target - s`. With `s = 0` the cache serves nothing, but the rows it holds are named
    /// with their versions (a PS with `row_versions` answers those unchanged without their
    /// bytes). Without a cache the part is asked for whole.
    pub(super) fn decide_part(&mut self, k: usize, target: u64, may_ask: bool) -> Decision {
        let s = u64::from(self.settings.staleness_bound());
        let clock = self.ledger.covered(k);
        let fresh_from = target.saturating_sub(s);
        // Held back unless the caches serve every table's rows at `k`: checked before any
        // split counts its hits, so that a part held back counts nothing.
        if !may_ask {
            let served = s > 0
                && self.lanes.iter().all(|l| {
                    let ids = l.ahead.ids(k);
                    ids.is_empty()
                        || l.cache
                            .as_ref()
                            .is_some_and(|c| Split::serves_all(c, ids, fresh_from))
                });
            if !served {
                return Decision::Hold;
            }
        }
        let mut ask = false;
        let mut oldest = u64::MAX;
        for lane in &mut self.lanes {
            let ids = lane.ahead.ids(k);
            let split = &mut lane.splits[k];
            if ids.is_empty() {
                split.whole(clock);
                continue;
            }
            let decision = match &mut lane.cache {
                Some(cache) if s > 0 => split.split(cache, ids, fresh_from, may_ask, clock),
                // No row is fresh enough without asking: every id is asked for, each
                // cached one with the version held (`may_ask` holds here).
                Some(cache) => split.split(cache, ids, u64::MAX, true, clock),
                None => {
                    split.whole(clock);
                    Decision::Ask
                }
            };
            match decision {
                Decision::AllCached { oldest: o } => oldest = oldest.min(o),
                Decision::Ask => ask = true,
                // Not reached: every table's rows were found served above.
                Decision::Hold => return Decision::Hold,
            }
        }
        if ask {
            Decision::Ask
        } else {
            Decision::AllCached { oldest }
        }
    }

    /// Copies the rows each part takes from the caches into `outs` (each table's into its
    /// buffer), and counts them. Done before any answer is taken: taking one inserts its
    /// rows, which may evict these.
    pub(super) fn serve_cached(
        &mut self,
        outs: &mut [&mut [u8]],
        landing: Landing,
    ) -> Result<(), (usize, Error)> {
        for (lane, out) in self.lanes.iter().zip(outs.iter_mut()) {
            let Some(cache) = &lane.cache else {
                continue;
            };
            for (k, split) in lane.splits.iter().enumerate() {
                let serving = matches!(
                    self.parts[k],
                    Part::Sent { .. } | Part::Done { .. } | Part::Cached { .. }
                );
                if !serving || split.hits() == 0 {
                    continue;
                }
                lane.land(k, landing, out, |j| match split.source(j) {
                    Some(Source::Cache(slot)) => Some(cache.row(slot as usize)),
                    _ => None,
                })
                .map_err(|e| (k, Error::invalid(&e.to_string())))?;
                self.report.cache_hits += split.hits();
            }
        }
        Ok(())
    }
}
