//! The slots of a [`PsTable`](super::PsTable): one per row, holding the row's id, its
//! elements and its optimizer state, side by side in one arena, so a pull reads one place
//! and a push updates one place.
//!
//! A slot is `2 + row_words + state_words` 64-bit words, without padding: word 0 the id,
//! word 1 the row's version (see [`PsTable`](super::PsTable)'s row versions), then the row
//! (see [`elem`](super::elem)), then the state (see [`optim`](super::optim)). The version
//! sits beside the id, on the line a pull reads anyway.
//! Slots never move: the index maps an id to a slot number for the slot's life. New slots
//! come from the end of the arena (committed as it fills) or from the free list of slots of
//! evicted rows. A bitmap, one bit per slot, says which slots hold a row, so a checkpoint
//! or an export reads the arena in order.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::elem::Float;
use super::optim::Optimizer;
use crate::sys::arena::{Arena, HugePages};

/// Most slots a table has: slot numbers travel in 32 bits of an index entry, as `slot + 1`
/// (0: empty), and `u32::MAX` marks a removed entry.
pub(super) const MAX_SLOTS: u64 = u32::MAX as u64 - 2;

/// Most address space a table's slots reserve.
const MAX_RESERVE: u64 = 16 << 40;

/// Where things are in a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Layout {
    /// Elements per row.
    pub(super) dim: usize,
    /// How elements are stored.
    pub(super) stored: Float,
    /// Words of the row.
    pub(super) row_words: usize,
    /// Words of optimizer state.
    pub(super) state_words: usize,
    /// Words of a slot: the id, the version, the row, the state.
    pub(super) stride: usize,
}

/// Word of a slot holding the row's version.
pub(super) const VERSION_WORD: usize = 1;
/// Word of a slot where the row starts.
pub(super) const ROW_WORD: usize = 2;

impl Layout {
    pub(super) fn new(dim: usize, stored: Float, optimizer: &Optimizer) -> Layout {
        let row_words = super::elem::words(stored, dim);
        let state_words = optimizer.state_words(dim);
        Layout {
            dim,
            stored,
            row_words,
            state_words,
            stride: ROW_WORD + row_words + state_words,
        }
    }

    /// Bytes of a checkpoint record: the slot without its version (see
    /// [`checkpoint`](super::checkpoint)).
    pub(super) fn record_bytes(&self) -> usize {
        (self.stride - 1) * 8
    }

    /// The row's words and the state's words of slot words `s`.
    #[inline]
    pub(super) fn row_and_state<'a>(
        &self,
        s: &'a [AtomicU64],
    ) -> (&'a [AtomicU64], &'a [AtomicU64]) {
        s[ROW_WORD..].split_at(self.row_words)
    }

    /// Bytes of a slot.
    pub(super) fn slot_bytes(&self) -> usize {
        self.stride * 8
    }

    /// Bytes of a row's elements and its state as stored (what a slot holds besides the
    /// id, without the padding of a last word).
    pub(super) fn data_bytes(&self, optimizer: &Optimizer) -> usize {
        self.dim * self.stored.size() + 4 * optimizer.state_len(self.dim)
    }

    /// The whole slot `slot` (id, row, state) in `words`.
    #[inline]
    pub(super) fn slot<'a>(&self, words: &'a [AtomicU64], slot: u32) -> &'a [AtomicU64] {
        let at = slot as usize * self.stride;
        &words[at..at + self.stride]
    }
}

/// The slots' arena, free list and occupancy; see the module documentation.
pub(super) struct Slots {
    layout: Layout,
    arena: Arena,
    /// Bit `s` of word `s / 64`: slot `s` holds a row.
    live: Arena,
    max_slots: u64,
    /// Slots handed out from the end of the arena (may run past `max_slots`).
    next: AtomicU64,
    /// Free list head: `tag << 32 | (slot + 1)`, 0 in the low half when empty; a slot on
    /// the list holds the next one's `slot + 1` in its id word. The tag, raised by every
    /// change, keeps a stale pop from succeeding (ABA).
    free: AtomicU64,
    /// Rows stored.
    rows: AtomicU64,
    /// Whether running out of memory was logged already.
    logged: AtomicBool,
}

impl Slots {
    /// Slots of `layout`, at most `max_slots` (also bounded by [`MAX_SLOTS`] and the
    /// address space a table may reserve); nothing committed yet.
    pub(super) fn new(layout: Layout, max_slots: u64, huge: bool) -> io::Result<Slots> {
        let max_slots = max_slots
            .min(MAX_SLOTS)
            .min(MAX_RESERVE / layout.slot_bytes() as u64)
            .max(1);
        let arena = Arena::reserve((max_slots * layout.slot_bytes() as u64) as usize, huge)?;
        let live = Arena::reserve(max_slots.div_ceil(64) as usize * 8, false)?;
        Ok(Slots {
            layout,
            arena,
            live,
            max_slots,
            next: AtomicU64::new(0),
            free: AtomicU64::new(0),
            rows: AtomicU64::new(0),
            logged: AtomicBool::new(false),
        })
    }

    /// Most slots this table can have.
    pub(super) fn max_slots(&self) -> u64 {
        self.max_slots
    }

    /// The committed slots' words (longer after later allocations: ask again for a slot
    /// beyond this slice).
    #[inline]
    pub(super) fn words(&self) -> &[AtomicU64] {
        self.arena.words()
    }

    /// The occupancy bitmap's committed words.
    pub(super) fn live_words(&self) -> &[AtomicU64] {
        self.live.words()
    }

    /// A slot for a new row: from the free list, else from the end of the arena. `None`
    /// when the table has `max_slots` slots or memory cannot be committed (logged once).
    pub(super) fn alloc(&self) -> Option<u32> {
        let words = self.words();
        let mut head = self.free.load(Ordering::Acquire);
        while head & 0xffff_ffff != 0 {
            let slot = (head & 0xffff_ffff) as u32 - 1;
            let next = self.layout.slot(words, slot)[0].load(Ordering::Relaxed) & 0xffff_ffff;
            let new = (((head >> 32) + 1) << 32) | next;
            match self
                .free
                .compare_exchange(head, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(slot),
                Err(now) => head = now,
            }
        }
        let slot = self.next.fetch_add(1, Ordering::Relaxed);
        if slot >= self.max_slots {
            return None;
        }
        let end = (slot as usize + 1) * self.layout.slot_bytes();
        if end > self.arena.committed() {
            // Commit ahead by an eighth of what is there: fewer, larger commits.
            let ahead = end.max(self.arena.committed() + self.arena.committed() / 8);
            let ahead = ahead.min(self.arena.reserved());
            let bits = (ahead / self.layout.slot_bytes()).div_ceil(64) * 8;
            // The bitmap first: a thread that sees the slots committed (and so does not
            // commit) must find their bits committed too.
            let committed = self
                .live
                .commit(bits.min(self.live.reserved()))
                .and_then(|()| self.arena.commit(ahead));
            if let Err(e) = committed {
                if !self.logged.swap(true, Ordering::Relaxed) {
                    log::error!(
                        "a table's slot arena could not grow to {ahead} bytes: {e}; new rows \
                         are refused"
                    );
                }
                return None;
            }
        }
        Some(slot as u32)
    }

    /// Puts `slot` on the free list. Only for a slot no call can still reach: never
    /// published, or out of the index for a grace period.
    pub(super) fn free(&self, slot: u32) {
        let id_word = &self.layout.slot(self.words(), slot)[0];
        let mut head = self.free.load(Ordering::Relaxed);
        loop {
            id_word.store(head & 0xffff_ffff, Ordering::Relaxed);
            let new = (((head >> 32) + 1) << 32) | (u64::from(slot) + 1);
            match self
                .free
                .compare_exchange(head, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(now) => head = now,
            }
        }
    }

    /// Marks `slot` as holding a row.
    pub(super) fn set_live(&self, slot: u32) {
        self.live.words()[slot as usize / 64].fetch_or(1 << (slot % 64), Ordering::Release);
        self.rows.fetch_add(1, Ordering::Relaxed);
    }

    /// Marks `slot` as holding no row.
    pub(super) fn clear_live(&self, slot: u32) {
        self.live.words()[slot as usize / 64].fetch_and(!(1 << (slot % 64)), Ordering::Release);
        self.rows.fetch_sub(1, Ordering::Relaxed);
    }

    /// Slots handed out so far from the end of the arena: every slot that holds a row is
    /// below this.
    pub(super) fn high_water(&self) -> u64 {
        self.next.load(Ordering::Acquire).min(self.max_slots)
    }

    /// Rows stored.
    pub(super) fn rows(&self) -> u64 {
        self.rows.load(Ordering::Relaxed)
    }

    /// Bytes committed for slots and their bitmap.
    pub(super) fn committed_bytes(&self) -> u64 {
        (self.arena.committed() + self.live.committed()) as u64
    }

    /// Bytes of the slot arena backed by huge pages, if readable.
    pub(super) fn huge_resident(&self) -> Option<u64> {
        self.arena.huge_resident()
    }

    /// What became of the huge-page advice on the slots.
    pub(super) fn huge_pages(&self) -> HugePages {
        self.arena.huge_pages()
    }
}

/// Whether bit `slot` is set in the occupancy bitmap `bits`.
#[inline]
pub(super) fn is_live(bits: &[AtomicU64], slot: u64) -> bool {
    bits.get(slot as usize / 64)
        .is_some_and(|w| w.load(Ordering::Acquire) & (1 << (slot % 64)) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_of_a_slot() {
        let adagrad = Optimizer::Adagrad {
            lr: 1.0,
            initial_accumulator: 0.1,
        };
        let l = Layout::new(16, Float::F32, &adagrad);
        assert_eq!((l.row_words, l.state_words, l.stride), (8, 8, 18));
        assert_eq!(l.slot_bytes(), 144);
        assert_eq!(l.record_bytes(), 136);
        assert_eq!(l.data_bytes(&adagrad), 128);
        let l = Layout::new(5, Float::Bf16, &Optimizer::adam(1.0));
        assert_eq!((l.row_words, l.state_words, l.stride), (2, 7, 11));
    }

    #[test]
    fn alloc_free_and_occupancy() {
        let l = Layout::new(4, Float::F32, &Optimizer::Sgd { lr: 1.0 });
        let slots = Slots::new(l, 100_000, false).unwrap();
        let a: Vec<u32> = (0..70_000).map(|_| slots.alloc().unwrap()).collect();
        assert_eq!(a[..3], [0, 1, 2]);
        assert_eq!(slots.high_water(), 70_000);
        // Every slot handed out is committed, with its bit.
        assert!(slots.words().len() >= 70_000 * l.stride);
        assert!(slots.live_words().len() * 64 >= 70_000);
        slots.set_live(69_999);
        assert!(is_live(slots.live_words(), 69_999));
        assert!(!is_live(slots.live_words(), 69_998));
        assert_eq!(slots.rows(), 1);
        slots.clear_live(69_999);
        assert!(!is_live(slots.live_words(), 69_999));
        // Freed slots come back last in, first out, before the arena grows.
        slots.free(5);
        slots.free(9);
        assert_eq!(slots.alloc(), Some(9));
        assert_eq!(slots.alloc(), Some(5));
        assert_eq!(slots.alloc(), Some(70_000));
        // At the cap: refused.
        let capped = Slots::new(l, 2, false).unwrap();
        assert_eq!(
            (capped.alloc(), capped.alloc(), capped.alloc()),
            (Some(0), Some(1), None)
        );
        capped.free(0);
        assert_eq!(capped.alloc(), Some(0));
    }

    #[test]
    fn free_list_under_contention() {
        let l = Layout::new(2, Float::F32, &Optimizer::Sgd { lr: 1.0 });
        let slots = Slots::new(l, 1 << 20, false).unwrap();
        let got: Vec<Vec<u32>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let mut mine = Vec::new();
                        for i in 0..20_000 {
                            let slot = slots.alloc().unwrap();
                            if i % 2 == 0 {
                                slots.free(slot);
                            } else {
                                mine.push(slot);
                            }
                        }
                        mine
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        // No slot is held twice.
        let mut all: Vec<u32> = got.into_iter().flatten().collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n);
    }
}
