//! The row cache in a [`Pipeline`]'s step: which rows of a part it serves, and their copy
//! into the step's rows.

use super::split::{Decision, Source};
use super::{Part, Pipeline};
use crate::error::Error;

impl Pipeline {
    /// Splits PS `k`'s part of the batch on its way, for rows used after `target` pushes,
    /// between the row cache and a request (`may_ask`: the staleness bound lets a request
    /// go now). A cached row is served when it misses at most `s` of the pushes: when it
    /// was fetched sure to reflect the pushes up to `target - s`. With `s = 0` the cache
    /// serves nothing, but the rows it holds are named with their versions (a PS with
    /// `row_versions` answers those unchanged without their bytes). Without a cache the
    /// part is asked for whole.
    pub(super) fn decide_part(&mut self, k: usize, target: u64, may_ask: bool) -> Decision {
        let s = u64::from(self.settings.staleness_bound());
        let clock = self.ledger.covered(k);
        let split = &mut self.splits[k];
        match &mut self.cache {
            Some(cache) if s > 0 => split.split(
                cache,
                self.ahead.ids(k),
                target.saturating_sub(s),
                may_ask,
                clock,
            ),
            // No row is fresh enough without asking: every id is asked for, each cached
            // one with the version held.
            Some(cache) if may_ask => split.split(cache, self.ahead.ids(k), u64::MAX, true, clock),
            _ if may_ask => {
                split.whole(clock);
                Decision::Ask
            }
            _ => Decision::Hold,
        }
    }

    /// Copies the rows each part takes from the cache into `out`, and counts them. Done
    /// before any answer is taken: taking one inserts its rows, which may evict these.
    pub(super) fn serve_cached(&mut self, out: &mut [u8]) -> Result<(), (usize, Error)> {
        let Some(cache) = &self.cache else {
            return Ok(());
        };
        let rb = self.row_bytes;
        for (k, split) in self.splits.iter().enumerate() {
            let serving = matches!(
                self.parts[k],
                Part::Sent { .. } | Part::Done { .. } | Part::Cached { .. }
            );
            if !serving || split.hits() == 0 {
                continue;
            }
            self.ahead
                .scatter_each(k, rb, out, |j| match split.source(j) {
                    Some(Source::Cache(slot)) => Some(cache.row(slot as usize)),
                    _ => None,
                })
                .map_err(|e| (k, Error::invalid(&e.to_string())))?;
            self.report.cache_hits += split.hits();
        }
        Ok(())
    }
}
