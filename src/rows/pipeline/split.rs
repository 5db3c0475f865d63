//! How one PS's part of a pull is split between the row cache and the wire: which rows
//! the cache serves (fresh enough for the step that uses them) and which ids are asked
//! for. Sans-IO: a cache, ids and clocks in, the split out.

use crate::rows::RowCache;

/// Where the row of one id of a PS's part comes from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Source {
    /// The cache, from this slot.
    Cache(u32),
    /// The answer, at this index of the ids asked for.
    Wire(u32),
}

/// What [`Split::split`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Every row is served by the cache: nothing to ask; the oldest row's clock.
    AllCached { oldest: u64 },
    /// Some rows are to be asked for ([`Split::asked`]); the others come from the cache.
    Ask,
    /// Nothing may be asked yet, and the cache does not serve every row: decided later.
    Hold,
}

/// One PS's part of the batch on its way, split between cache and wire. Its vectors grow
/// to the largest part and are then reused: a split allocates nothing after that.
#[derive(Debug, Default)]
pub(crate) struct Split {
    /// Per id of the part (in the plan's order): where its row comes from. Empty when no
    /// row comes from the cache (then the part is asked for whole, as planned).
    sources: Vec<Source>,
    /// The ids asked for, in the part's order, and each one's index in the part.
    asked: Vec<u64>,
    at: Vec<u32>,
    /// Per id asked for: the version of the row the cache holds for it (too old to serve),
    /// 0 when it holds none; `versioned` says the split was made by the cache (a pull
    /// then names these, so that its answer brings the versions of the rows cached).
    held: Vec<u64>,
    versioned: bool,
    hits: usize,
    oldest_hit: u64,
    /// The clock of the rows asked for: the pushes the answer is sure to reflect.
    clock: u64,
    /// Indices in the part of the rows the PS did not have (mapped from the answer).
    missing: Vec<u32>,
}

impl Split {
    /// Splits `ids` (a PS's part) for rows used when the pushes they must reflect are
    /// those numbered up to `fresh_from` (a cached row of clock `fresh_from` or more is
    /// served): `may_ask` says whether a request may go now; `clock` is what a request
    /// sent now would reflect. Hits and misses are counted in the cache only when the
    /// split is final (not [`Decision::Hold`]).
    pub(crate) fn split(
        &mut self,
        cache: &mut RowCache,
        ids: &[u64],
        fresh_from: u64,
        may_ask: bool,
        clock: u64,
    ) -> Decision {
        self.reset(clock);
        self.versioned = true;
        if !may_ask && !Split::serves_all(cache, ids, fresh_from) {
            return Decision::Hold;
        }
        let mut oldest = u64::MAX;
        for (j, &id) in ids.iter().enumerate() {
            match cache.lookup(id, fresh_from) {
                Some(slot) => {
                    if self.sources.is_empty() {
                        // The ids before were all asked for.
                        self.sources.extend((0..j as u32).map(Source::Wire));
                    }
                    self.sources.push(Source::Cache(slot as u32));
                    oldest = oldest.min(cache.entry(slot).map_or(0, |(_, at, _)| at));
                    self.hits += 1;
                }
                None => {
                    if !self.sources.is_empty() {
                        self.sources.push(Source::Wire(self.asked.len() as u32));
                    }
                    let held = cache
                        .find(id)
                        .and_then(|slot| cache.entry(slot))
                        .map_or(0, |(_, _, version)| version);
                    self.asked.push(id);
                    self.at.push(j as u32);
                    self.held.push(held);
                }
            }
        }
        self.oldest_hit = oldest;
        if self.asked.is_empty() && !ids.is_empty() {
            Decision::AllCached { oldest }
        } else {
            Decision::Ask
        }
    }

    /// Whether `cache` holds a row of each of `ids` fresh enough for rows used when the
    /// pushes they must reflect are those numbered up to `fresh_from`. Counts nothing.
    pub(crate) fn serves_all(cache: &RowCache, ids: &[u64], fresh_from: u64) -> bool {
        ids.iter().all(|&id| {
            cache
                .find(id)
                .and_then(|slot| cache.entry(slot))
                .is_some_and(|(_, at, _)| at >= fresh_from)
        })
    }

    /// Every id asked for, none from the cache (what a part is without a cache, and with
    /// staleness 0).
    pub(crate) fn whole(&mut self, clock: u64) {
        self.reset(clock);
    }

    fn reset(&mut self, clock: u64) {
        self.sources.clear();
        self.asked.clear();
        self.at.clear();
        self.held.clear();
        self.versioned = false;
        self.hits = 0;
        self.oldest_hit = u64::MAX;
        self.clock = clock;
    }

    /// Rows served by the cache.
    pub(crate) fn hits(&self) -> usize {
        self.hits
    }

    /// The oldest clock of the rows served by the cache (`u64::MAX` for none).
    pub(crate) fn oldest_hit(&self) -> u64 {
        self.oldest_hit
    }

    /// The clock of the rows asked for.
    #[cfg(test)]
    pub(crate) fn clock(&self) -> u64 {
        self.clock
    }

    /// Per id asked for (in the order of [`asked`](Self::asked), or of the part when it is
    /// asked for whole): the version of the row the cache holds, too old to serve (0:
    /// none). `None` when the split was not the cache's (no cache): a plain pull.
    pub(crate) fn held(&self) -> Option<&[u64]> {
        self.versioned.then_some(&self.held[..])
    }

    /// The ids to ask for when some rows come from the cache; `None`: the whole part.
    pub(crate) fn asked(&self) -> Option<&[u64]> {
        (!self.sources.is_empty()).then_some(&self.asked[..])
    }

    /// Where the row of the part's `j`-th id comes from (`None` when the part is asked
    /// for whole: the answer's `j`-th row).
    pub(crate) fn source(&self, j: usize) -> Option<Source> {
        self.sources.get(j).copied()
    }

    /// The index in the part of the `i`-th row asked for.
    pub(crate) fn part_index(&self, i: usize) -> usize {
        if self.sources.is_empty() {
            i
        } else {
            self.at[i] as usize
        }
    }

    /// Inserts into `cache` the rows asked for, from `bytes` (the answer in the table's
    /// dtype, `row_bytes` per row), `ids` being the whole part's: each at the clock of the
    /// request, with its version from `versions` (one per row asked for; 0, unknown, when
    /// empty), except those the PS did not have (as last given to
    /// [`missing_in_part`](Self::missing_in_part)).
    pub(crate) fn keep(
        &self,
        cache: &mut RowCache,
        ids: &[u64],
        bytes: &[u8],
        row_bytes: usize,
        versions: &[u64],
    ) {
        let mut missing = self.missing.iter().peekable();
        for (i, row) in bytes.chunks_exact(row_bytes).enumerate() {
            let j = self.part_index(i);
            while missing.next_if(|&&m| (m as usize) < j).is_some() {}
            if missing.next_if(|&&m| m as usize == j).is_some() {
                continue;
            }
            if let Some(&id) = ids.get(j) {
                let version = versions.get(i).copied().unwrap_or(0);
                cache.insert(id, row, self.clock, version);
            }
        }
    }

    /// Maps `missing` (sorted indices in the ids asked for) to sorted indices in the part.
    pub(crate) fn missing_in_part(&mut self, missing: &[u32]) -> &[u32] {
        self.missing.clear();
        for &i in missing {
            let j = if self.sources.is_empty() {
                i
            } else {
                self.at.get(i as usize).copied().unwrap_or(u32::MAX)
            };
            self.missing.push(j);
        }
        &self.missing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache_with(rows: &[(u64, u64)]) -> RowCache {
        let mut c = RowCache::new(1 << 16, 4).unwrap();
        for &(id, clock) in rows {
            c.insert(id, &(id as u32).to_le_bytes(), clock, 0);
        }
        c
    }

    #[test]
    fn fresh_rows_come_from_the_cache_the_others_are_asked_for() {
        let mut c = cache_with(&[(1, 5), (2, 3), (4, 6)]);
        let mut s = Split::default();
        // Rows of clock 4 or more are fresh: 1 and 4; 2 is too old, 3 absent.
        let d = s.split(&mut c, &[1, 2, 3, 4], 4, true, 7);
        assert_eq!(d, Decision::Ask);
        assert_eq!(s.asked(), Some(&[2u64, 3][..]));
        assert_eq!((s.hits(), s.oldest_hit(), s.clock()), (2, 5, 7));
        assert!(matches!(s.source(0), Some(Source::Cache(_))));
        assert!(matches!(s.source(1), Some(Source::Wire(0))));
        assert!(matches!(s.source(2), Some(Source::Wire(1))));
        assert_eq!((s.part_index(0), s.part_index(1)), (1, 2));
        assert_eq!(s.missing_in_part(&[1]), &[2]);
        assert_eq!((c.hits(), c.misses()), (2, 2));
    }

    #[test]
    fn rows_held_too_old_are_named_with_their_versions() {
        let mut c = RowCache::new(1 << 16, 4).unwrap();
        c.insert(1, &[1; 4], 5, 11);
        c.insert(2, &[2; 4], 3, 77);
        let mut s = Split::default();
        // 1 is fresh (served), 2 is too old (asked, named with version 77), 3 absent.
        assert_eq!(s.split(&mut c, &[1, 2, 3], 4, true, 7), Decision::Ask);
        assert_eq!(s.asked(), Some(&[2u64, 3][..]));
        assert_eq!(s.held(), Some(&[77u64, 0][..]));
        // Nothing served (staleness 0): every id asked for, the cached ones named.
        assert_eq!(
            s.split(&mut c, &[3, 1, 2], u64::MAX, true, 7),
            Decision::Ask
        );
        assert_eq!((s.asked(), s.hits()), (None, 0));
        assert_eq!(s.held(), Some(&[0u64, 11, 77][..]));
        // Kept with the versions of the answer: 3 now cached with its version.
        s.keep(&mut c, &[3, 1, 2], &[9; 12], 4, &[40, 11, 78]);
        let slot = c.find(3).unwrap();
        assert_eq!(c.entry(slot), Some((3, 7, 40)));
        // Without a cache's split, nothing is named.
        s.whole(8);
        assert_eq!(s.held(), None);
    }

    #[test]
    fn a_part_the_cache_serves_whole_asks_nothing_even_when_held() {
        let mut c = cache_with(&[(1, 5), (2, 6)]);
        let mut s = Split::default();
        assert_eq!(
            s.split(&mut c, &[2, 1], 5, false, 0),
            Decision::AllCached { oldest: 5 }
        );
        assert_eq!(s.asked(), Some(&[][..]));
        // One row too old, and nothing may be asked yet: held, nothing counted.
        let (hits, misses) = (c.hits(), c.misses());
        assert_eq!(s.split(&mut c, &[2, 1], 6, false, 0), Decision::Hold);
        assert_eq!((c.hits(), c.misses()), (hits, misses));
    }

    #[test]
    fn with_no_hit_the_part_is_asked_for_whole() {
        let mut c = cache_with(&[]);
        let mut s = Split::default();
        assert_eq!(s.split(&mut c, &[8, 9], 0, true, 3), Decision::Ask);
        assert_eq!(s.asked(), None);
        assert!(s.source(0).is_none());
        assert_eq!((s.part_index(1), s.hits()), (1, 0));
        assert_eq!(s.missing_in_part(&[0, 1]), &[0, 1]);
        s.whole(9);
        assert_eq!((s.asked(), s.clock()), (None, 9));
    }
}
