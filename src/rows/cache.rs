//! [`RowCache`]: a worker's cache of embedding rows, capped in bytes, all its memory taken
//! when it is made.

use crate::error::Error;
use crate::hash::mix64;

/// An empty index cell.
const EMPTY: u32 = u32::MAX;

/// Bytes each entry costs besides its row: its id, clock and version (8 each), its
/// reference bit (1), and the two index cells it is given (4 each: the index has twice as
/// many cells as entries, rounded up to a power of two, so at most four cells per entry
/// are counted by [`RowCache::footprint`]).
const ENTRY_META: usize = 8 + 8 + 8 + 1;

/// A worker's cache of embedding rows: per entry an id, the row's bytes (in the table's
/// dtype), the clock it was fetched at, and the row's version; capped in bytes.
///
/// Everything it will ever hold is allocated by [`new`](Self::new): an open-addressing
/// index (linear probing, ids hashed by the splitmix64 finalizer, at most half full,
/// deletion by backward shift, so no tombstones) and an arena of `capacity` slots. Nothing
/// allocates afterwards: looking up, inserting and evicting only move bytes within it.
///
/// **Eviction is CLOCK (second chance).** Each slot has a reference bit, set by every hit
/// and by a refresh of the row, clear when a row is first inserted. When the arena is
/// full, a hand sweeps the slots in order: a slot whose bit is set has it cleared and is
/// passed over, the first slot whose bit is clear is evicted. So a row used again since the
/// hand last passed stays for another round, and a row fetched once and never used again
/// goes first: the hot rows of a heavy-tailed batch stay.
///
/// **Clocks.** The cache does not read time. The caller gives each row the clock it was
/// fetched at (a [`Pipeline`](super::Pipeline) gives the number of its own pushes the row
/// is sure to reflect) and asks for rows fetched at `min_clock` or later: an older row is a
/// miss, as is an absent one (it stays, to be refreshed by the next insert of its id).
///
/// **Versions.** Each entry keeps the version the PS gave its row, 0 when unknown: a pull
/// that names the version it holds can then be answered "unchanged" without the row's
/// bytes.
///
/// ```
/// use starwire::rows::RowCache;
///
/// // Rows of 8 bytes, room for a few of them.
/// let mut cache = RowCache::new(1024, 8)?;
/// cache.insert(7, &[1; 8], 10, 0);
/// assert_eq!(cache.get(7, 9), Some(&[1u8; 8][..])); // fetched at 10: fresh enough
/// assert_eq!(cache.get(7, 11), None); // too old for a reader that needs clock 11
/// assert_eq!((cache.hits(), cache.misses()), (1, 1));
/// # Ok::<(), starwire::Error>(())
/// ```
#[derive(Debug)]
pub struct RowCache {
    row_bytes: usize,
    /// Index cells: a slot number, or [`EMPTY`]. A power of two, at least twice the slots.
    index: Vec<u32>,
    mask: usize,
    /// Per slot.
    ids: Vec<u64>,
    clocks: Vec<u64>,
    versions: Vec<u64>,
    referenced: Vec<bool>,
    /// `capacity × row_bytes`: slot `i`'s row at `i * row_bytes`.
    rows: Vec<u8>,
    /// Slots in use: `0..len` (a slot, once used, stays in use; eviction reuses it).
    len: usize,
    /// The CLOCK hand: the next slot it looks at.
    hand: usize,
    hits: u64,
    misses: u64,
    insertions: u64,
    refreshes: u64,
    evictions: u64,
}

impl RowCache {
    /// A cache of rows of `row_bytes` bytes whose whole memory (rows, ids, clocks,
    /// versions, reference bits and index) is at most `capacity_bytes`; all of it is
    /// allocated now. [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) for
    /// rows of no bytes, a capacity that does not hold one row, or memory that cannot be
    /// had (the error says how much was asked).
    pub fn new(capacity_bytes: usize, row_bytes: usize) -> Result<RowCache, Error> {
        if row_bytes == 0 {
            return Err(Error::invalid("row cache: rows of 0 bytes"));
        }
        let slots = slots_for(capacity_bytes, row_bytes);
        if slots == 0 {
            return Err(Error::invalid(&format!(
                "row cache: {capacity_bytes} bytes do not hold one row of {row_bytes} bytes \
                 (each row costs {} with its id, clock, version and index cells)",
                footprint(1, row_bytes)
            )));
        }
        let cells = index_cells(slots);
        let too_much = |what: &str, n: usize| {
            Error::invalid(&format!(
                "row cache: cannot allocate the {what} ({n} elements) of a cache of \
                 {capacity_bytes} bytes"
            ))
        };
        let mut rows = Vec::new();
        rows.try_reserve_exact(slots * row_bytes)
            .map_err(|_| too_much("rows", slots * row_bytes))?;
        rows.resize(slots * row_bytes, 0);
        let mut index = Vec::new();
        index
            .try_reserve_exact(cells)
            .map_err(|_| too_much("index", cells))?;
        index.resize(cells, EMPTY);
        let zeros = |n: usize| -> Result<Vec<u64>, Error> {
            let mut v = Vec::new();
            v.try_reserve_exact(n).map_err(|_| too_much("entries", n))?;
            v.resize(n, 0);
            Ok(v)
        };
        Ok(RowCache {
            row_bytes,
            index,
            mask: cells - 1,
            ids: zeros(slots)?,
            clocks: zeros(slots)?,
            versions: zeros(slots)?,
            referenced: vec![false; slots],
            rows,
            len: 0,
            hand: 0,
            hits: 0,
            misses: 0,
            insertions: 0,
            refreshes: 0,
            evictions: 0,
        })
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Rows it can hold.
    pub fn capacity(&self) -> usize {
        self.ids.len()
    }

    /// Rows it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no row.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of the rows it holds (`len() × row_bytes()`).
    pub fn bytes_held(&self) -> u64 {
        (self.len * self.row_bytes) as u64
    }

    /// Bytes of all it allocated: rows, ids, clocks, versions, reference bits and index.
    /// Never more than the capacity it was made with.
    pub fn footprint(&self) -> usize {
        footprint(self.capacity(), self.row_bytes)
    }

    /// Lookups that found a row fresh enough.
    pub fn hits(&self) -> u64 {
        self.hits
    }

    /// Lookups that found no row, or one too old.
    pub fn misses(&self) -> u64 {
        self.misses
    }

    /// Rows inserted under an id it did not hold.
    pub fn insertions(&self) -> u64 {
        self.insertions
    }

    /// Rows inserted under an id it held: the row, clock and version replaced.
    pub fn refreshes(&self) -> u64 {
        self.refreshes
    }

    /// Rows evicted to make room.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// The slot holding `id`, if any: no count changes, no reference bit is set.
    pub fn find(&self, id: u64) -> Option<usize> {
        let mut cell = self.home(id);
        loop {
            let slot = self.index[cell];
            if slot == EMPTY {
                return None;
            }
            if self.ids[slot as usize] == id {
                return Some(slot as usize);
            }
            cell = (cell + 1) & self.mask;
        }
    }

    /// The slot of `id` when its row was fetched at `min_clock` or later: a hit (counted,
    /// its reference bit set); else a miss (counted), `None`.
    pub fn lookup(&mut self, id: u64, min_clock: u64) -> Option<usize> {
        match self.find(id) {
            Some(slot) if self.clocks[slot] >= min_clock => {
                self.hits += 1;
                self.referenced[slot] = true;
                Some(slot)
            }
            _ => {
                self.misses += 1;
                None
            }
        }
    }

    /// [`lookup`](Self::lookup), giving the row.
    pub fn get(&mut self, id: u64, min_clock: u64) -> Option<&[u8]> {
        let slot = self.lookup(id, min_clock)?;
        Some(self.row(slot))
    }

    /// The row in `slot` (a slot [`find`](Self::find) or [`lookup`](Self::lookup) gave,
    /// valid until the next insert). Empty for a slot out of range.
    pub fn row(&self, slot: usize) -> &[u8] {
        if slot >= self.len {
            return &[];
        }
        &self.rows[slot * self.row_bytes..][..self.row_bytes]
    }

    /// The id, the clock it was fetched at and the version of the row in `slot`; `None`
    /// for a slot not in use.
    pub fn entry(&self, slot: usize) -> Option<(u64, u64, u64)> {
        (slot < self.len).then(|| (self.ids[slot], self.clocks[slot], self.versions[slot]))
    }

    /// Keeps `row` (exactly `row_bytes()` bytes, else nothing is done and `None` returned)
    /// as the row of `id`, fetched at `clock`, of version `version` (0: unknown). An id it
    /// holds has its row, clock and version replaced and its reference bit set; a new id
    /// takes a free slot, or evicts one (CLOCK): the evicted id is returned.
    pub fn insert(&mut self, id: u64, row: &[u8], clock: u64, version: u64) -> Option<u64> {
        if row.len() != self.row_bytes {
            return None;
        }
        if let Some(slot) = self.find(id) {
            self.write(slot, row, clock, version);
            self.referenced[slot] = true;
            self.refreshes += 1;
            return None;
        }
        let (slot, evicted) = if self.len < self.capacity() {
            self.len += 1;
            (self.len - 1, None)
        } else {
            let slot = self.victim();
            let old = self.ids[slot];
            self.unindex(old);
            self.evictions += 1;
            (slot, Some(old))
        };
        self.ids[slot] = id;
        self.write(slot, row, clock, version);
        self.referenced[slot] = false;
        self.index_slot(id, slot);
        self.insertions += 1;
        evicted
    }

    /// Forgets every row (the counts stay).
    pub fn clear(&mut self) {
        self.index.fill(EMPTY);
        self.referenced.fill(false);
        self.len = 0;
        self.hand = 0;
    }

    fn write(&mut self, slot: usize, row: &[u8], clock: u64, version: u64) {
        self.rows[slot * self.row_bytes..][..self.row_bytes].copy_from_slice(row);
        self.clocks[slot] = clock;
        self.versions[slot] = version;
    }

    /// The slot CLOCK evicts: the first from the hand whose reference bit is clear,
    /// clearing the bits it passes (at most one turn and one slot).
    fn victim(&mut self) -> usize {
        let n = self.capacity();
        loop {
            let slot = self.hand;
            self.hand = (self.hand + 1) % n;
            if self.referenced[slot] {
                self.referenced[slot] = false;
            } else {
                return slot;
            }
        }
    }

    fn home(&self, id: u64) -> usize {
        (mix64(id) as usize) & self.mask
    }

    fn index_slot(&mut self, id: u64, slot: usize) {
        let mut cell = self.home(id);
        while self.index[cell] != EMPTY {
            cell = (cell + 1) & self.mask;
        }
        self.index[cell] = slot as u32;
    }

    /// Removes `id`'s cell, shifting back the cells after it that probed past it.
    fn unindex(&mut self, id: u64) {
        let mut hole = self.home(id);
        loop {
            let slot = self.index[hole];
            if slot == EMPTY {
                return;
            }
            if self.ids[slot as usize] == id {
                break;
            }
            hole = (hole + 1) & self.mask;
        }
        let mut cell = hole;
        loop {
            cell = (cell + 1) & self.mask;
            let slot = self.index[cell];
            if slot == EMPTY {
                break;
            }
            let home = self.home(self.ids[slot as usize]);
            // The entry may move into the hole when its home is not cyclically in
            // (hole, cell]: its probe passed the hole.
            let stays = if hole <= cell {
                hole < home && home <= cell
            } else {
                hole < home || home <= cell
            };
            if !stays {
                self.index[hole] = slot;
                hole = cell;
            }
        }
        self.index[hole] = EMPTY;
    }
}

/// Index cells for `slots` entries: a power of two, at least twice as many.
fn index_cells(slots: usize) -> usize {
    (slots.saturating_mul(2)).next_power_of_two().max(2)
}

/// Bytes a cache of `slots` rows of `row_bytes` allocates.
fn footprint(slots: usize, row_bytes: usize) -> usize {
    slots
        .saturating_mul(row_bytes.saturating_add(ENTRY_META))
        .saturating_add(index_cells(slots).saturating_mul(4))
}

/// The most slots whose footprint fits in `capacity` bytes (fewer than `u32::MAX`).
fn slots_for(capacity: usize, row_bytes: usize) -> usize {
    let most = u32::MAX as usize - 1;
    // Each entry costs two to four index cells: `lo` slots fit, `hi + 1` do not.
    let mut lo = (capacity / row_bytes.saturating_add(ENTRY_META + 16)).min(most);
    let mut hi = (capacity / row_bytes.saturating_add(ENTRY_META + 8)).min(most);
    // The footprint grows with the count: the largest count that fits, by bisection.
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if footprint(mid, row_bytes) <= capacity {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(v: u8) -> [u8; 8] {
        [v; 8]
    }

    #[test]
    fn the_footprint_never_exceeds_the_capacity() {
        for cap in [58, 59, 100, 1000, 4096, 65_536, 1 << 20, 8 << 20] {
            for rb in [1, 4, 8, 64, 256, 1000] {
                let Ok(c) = RowCache::new(cap, rb) else {
                    assert!(footprint(1, rb) > cap, "cap {cap}, rows {rb}");
                    continue;
                };
                assert!(c.footprint() <= cap, "cap {cap}, rows {rb}");
                // One slot more would not fit: the capacity is used.
                assert!(
                    footprint(c.capacity() + 1, rb) > cap,
                    "cap {cap}, rows {rb}"
                );
                let allocated = c.rows.capacity()
                    + c.index.capacity() * 4
                    + (c.ids.capacity() + c.clocks.capacity() + c.versions.capacity()) * 8
                    + c.referenced.capacity();
                assert_eq!(allocated, c.footprint(), "cap {cap}, rows {rb}");
            }
        }
    }

    #[test]
    fn a_capacity_below_one_row_is_refused() {
        let e = RowCache::new(10, 8).unwrap_err();
        assert!(e.remote_message().unwrap().contains("10 bytes"), "{e}");
        assert!(RowCache::new(100, 0).is_err());
        assert!(RowCache::new(footprint(1, 8), 8).is_ok());
    }

    #[test]
    fn lookups_hit_only_rows_fresh_enough() {
        let mut c = RowCache::new(4096, 8).unwrap();
        assert_eq!(c.get(1, 0), None);
        assert!(c.insert(1, &row(1), 5, 77).is_none());
        assert_eq!(c.get(1, 5), Some(&row(1)[..]));
        assert_eq!(c.get(1, 6), None);
        let slot = c.find(1).unwrap();
        assert_eq!(c.entry(slot), Some((1, 5, 77)));
        // A refresh replaces row, clock and version in place.
        c.insert(1, &row(2), 9, 78);
        assert_eq!(c.find(1), Some(slot));
        assert_eq!(c.get(1, 6), Some(&row(2)[..]));
        assert_eq!(c.entry(slot), Some((1, 9, 78)));
        assert_eq!((c.hits(), c.misses()), (2, 2));
        assert_eq!((c.insertions(), c.refreshes(), c.len()), (1, 1, 1));
        assert_eq!(c.bytes_held(), 8);
        // A row of the wrong length is refused.
        assert_eq!(c.insert(2, &[0; 7], 0, 0), None);
        assert_eq!(c.find(2), None);
    }

    #[test]
    fn the_bytes_held_never_exceed_the_capacity() {
        let cap = 2000;
        let mut c = RowCache::new(cap, 64).unwrap();
        let n = c.capacity();
        assert!(n >= 2);
        for id in 0..(5 * n as u64) {
            c.insert(id, &[id as u8; 64], id, 0);
            assert!(c.bytes_held() as usize <= cap);
            assert_eq!(c.len(), n.min(id as usize + 1));
        }
        assert_eq!(c.evictions(), 4 * n as u64);
        assert_eq!(c.bytes_held(), (n * 64) as u64);
    }

    #[test]
    fn clock_evicts_unreferenced_rows_first_in_hand_order() {
        let mut c = RowCache::new(footprint(4, 8), 8).unwrap();
        assert_eq!(c.capacity(), 4);
        for id in 0..4 {
            c.insert(id, &row(id as u8), 0, 0);
        }
        // 1 and 3 are used again: they get a second chance.
        assert!(c.lookup(1, 0).is_some());
        assert!(c.lookup(3, 0).is_some());
        assert_eq!(c.insert(10, &row(10), 0, 0), Some(0));
        assert_eq!(c.insert(11, &row(11), 0, 0), Some(2));
        // The hand cleared 1's bit on its way to 2. Next it clears 3's and evicts 10
        // (never used), then 1, whose second chance is spent.
        assert_eq!(c.insert(12, &row(12), 0, 0), Some(10));
        assert_eq!(c.insert(13, &row(13), 0, 0), Some(1));
        assert!(c.find(3).is_some());
        // A row used on every round stays for good.
        for id in 20..40u64 {
            assert!(c.lookup(3, 0).is_some());
            let evicted = c.insert(id, &row(id as u8), 0, 0);
            assert_ne!(evicted, Some(3));
        }
        assert_eq!(c.get(3, 0), Some(&row(3)[..]));
    }

    #[test]
    fn every_held_id_stays_findable_through_evictions() {
        // Few index cells, many collisions: the backward shift keeps every probe chain
        // whole.
        let mut c = RowCache::new(footprint(16, 4), 4).unwrap();
        let mut x = 12345u64;
        let mut held = std::collections::BTreeMap::new();
        for _ in 0..5000 {
            x = mix64(x);
            let id = x % 64;
            let bytes = (id as u32).to_le_bytes();
            if let Some(old) = c.insert(id, &bytes, 0, 0) {
                held.remove(&old);
            }
            held.insert(id, ());
            if x % 3 == 0 {
                c.lookup(x % 64, 0);
            }
            assert_eq!(held.len(), c.len());
            for &id in held.keys() {
                let slot = c.find(id).expect("held id found");
                assert_eq!(c.row(slot), &(id as u32).to_le_bytes());
            }
        }
        let used = c.index.iter().filter(|&&s| s != EMPTY).count();
        assert_eq!(used, c.len());
    }

    #[test]
    fn clear_forgets_every_row() {
        let mut c = RowCache::new(4096, 8).unwrap();
        c.insert(1, &row(1), 0, 0);
        c.clear();
        assert!(c.is_empty());
        assert_eq!(c.find(1), None);
        assert_eq!(c.row(0), &[] as &[u8]);
        c.insert(2, &row(2), 0, 0);
        assert_eq!(c.get(2, 0), Some(&row(2)[..]));
    }
}
