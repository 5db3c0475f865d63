//! One level of a [`PsTable`](super::PsTable)'s index: open addressing in buckets of
//! eight 8-byte entries (one cache line), and how an id is found, placed and frozen in it.
//! [`index`](super::index) holds the levels and grows them.
//!
//! **Entries.** An entry is one `AtomicU64`: `slot + 1` in bits 0–31 (0: the entry is
//! empty), a 16-bit tag from the id's hash in bits 32–47, and a 16-bit stamp (the table's
//! clock when the row was last touched) in bits 48–63; all ones marks a removed entry (a
//! tombstone). The id itself is in the slot, so an entry costs 8 bytes: a lookup compares
//! tags within the bucket and reads the id from the slot only on a tag match — the slot it
//! then reads the row from. Buckets are probed linearly from the id's home bucket
//! (`hash × buckets >> 64`, any bucket count); an entry once filled is never empty again,
//! so a bucket with an empty entry ends a probe.
//!
//! **Insertion** is a compare-and-swap of an empty entry to the new one; the loser of a
//! race for the same id finds the winner's entry as it goes on probing (ids are verified in
//! their slots, which are written before the entry is published with release ordering).
//!
//!
//! **Freezing.** While a level is copied into the next, an empty entry may be frozen: a
//! value no row has, that ends a probe like an empty entry but is never filled. Nothing is
//! added to a level at or past a frozen entry.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::hash::mix64;

/// An empty entry.
pub(super) const EMPTY: u64 = 0;
/// A removed entry.
pub(super) const TOMB: u64 = u64::MAX;
/// An entry of a level being copied that was empty when its bucket was copied (or when an
/// insert of an id whose probe ended there went to the new level): nothing may be added
/// there or past it any more.
pub(super) const FROZEN: u64 = u32::MAX as u64;
/// Entries per bucket: one cache line.
pub(super) const BUCKET: usize = 8;

/// Salt of the index hash, unrelated to `Partition::Hash`'s (a PS holding one residue
/// class of that partition still spreads its ids over every bucket).
const SALT: u64 = 0xbb67_ae85_84ca_a73b;

/// The index hash of `id`.
#[inline]
pub(super) fn hash(id: u64) -> u64 {
    mix64(id ^ SALT)
}

#[inline]
pub(super) fn tag(h: u64) -> u64 {
    h & 0xffff
}

#[inline]
pub(super) fn tag_of(e: u64) -> u64 {
    (e >> 32) & 0xffff
}

#[inline]
pub(super) fn slot_of(e: u64) -> u32 {
    (e as u32).wrapping_sub(1)
}

#[inline]
pub(super) fn is_row(e: u64) -> bool {
    // Not EMPTY, TOMB or FROZEN: a slot field in 1..=u32::MAX - 1.
    (e as u32).wrapping_add(1) > 1
}

/// The entry of `slot` for hash `h`, stamped `stamp`.
#[inline]
pub(super) fn entry(slot: u32, h: u64, stamp: u16) -> u64 {
    (u64::from(slot) + 1) | (tag(h) << 32) | (u64::from(stamp) << 48)
}

/// One level: its entries and bucket count.
#[derive(Clone, Copy)]
pub(super) struct Level<'a> {
    pub(super) entries: &'a [AtomicU64],
    pub(super) buckets: u64,
}

impl<'a> Level<'a> {
    #[inline]
    pub(super) fn home(&self, h: u64) -> u64 {
        ((u128::from(h) * u128::from(self.buckets)) >> 64) as u64
    }

    #[inline]
    pub(super) fn bucket(&self, b: u64) -> &'a [AtomicU64] {
        let at = b as usize * BUCKET;
        &self.entries[at..at + BUCKET]
    }

    /// The first words of `h`'s home bucket and of the bucket after it (where the ids that
    /// overflow their home go first); `None` in an empty level.
    #[inline]
    pub(super) fn home_words(&self, h: u64) -> Option<[&'a AtomicU64; 2]> {
        if self.buckets == 0 {
            return None;
        }
        let b = self.home(h);
        let next = if b + 1 == self.buckets { 0 } else { b + 1 };
        Some([&self.bucket(b)[0], &self.bucket(next)[0]])
    }

    /// The first row entry with `h`'s tag in `h`'s home bucket or the bucket after it,
    /// whichever id it is (the caller checks the id in the slot); `None` if neither has one
    /// before an empty or frozen entry (the id may still be further on:
    /// [`find`](Self::find) knows).
    #[inline]
    pub(super) fn candidate(&self, h: u64) -> Option<Hit<'a>> {
        if self.buckets == 0 {
            return None;
        }
        let t = tag(h);
        let mut b = self.home(h);
        for _ in 0..2.min(self.buckets) {
            for word in self.bucket(b) {
                let e = word.load(Ordering::Acquire);
                if e == EMPTY || e == FROZEN {
                    return None;
                }
                if is_row(e) && tag_of(e) == t {
                    return Some(Hit { word, entry: e });
                }
            }
            b = if b + 1 == self.buckets { 0 } else { b + 1 };
        }
        None
    }

    /// The entry of `id` in this level. A probe ends at an empty or frozen entry: an id is
    /// never placed past one.
    #[inline]
    pub(super) fn find(
        &self,
        id: u64,
        h: u64,
        key_of: &impl Fn(u32) -> Option<u64>,
    ) -> Option<Hit<'a>> {
        let t = tag(h);
        let mut b = self.home(h);
        for _ in 0..self.buckets {
            for word in self.bucket(b) {
                let e = word.load(Ordering::Acquire);
                if e == EMPTY || e == FROZEN {
                    return None;
                }
                if e != TOMB && tag_of(e) == t && key_of(slot_of(e)) == Some(id) {
                    return Some(Hit { word, entry: e });
                }
            }
            b += 1;
            if b == self.buckets {
                b = 0;
            }
        }
        None
    }

    /// Puts `new` (the entry of `id`, or `FROZEN`) in the first empty entry of `id`'s probe
    /// sequence, unless `id` has an entry before it or the probe meets a frozen entry.
    pub(super) fn place(
        &self,
        id: u64,
        h: u64,
        new: u64,
        key_of: &impl Fn(u32) -> Option<u64>,
    ) -> Placed<'a> {
        let t = tag(h);
        let mut b = self.home(h);
        for _ in 0..self.buckets {
            for word in self.bucket(b) {
                let mut e = word.load(Ordering::SeqCst);
                if e == EMPTY {
                    match word.compare_exchange(EMPTY, new, Ordering::SeqCst, Ordering::SeqCst) {
                        Ok(_) => return Placed::New,
                        // Taken meanwhile: perhaps by the same id, or frozen.
                        Err(now) => e = now,
                    }
                }
                if e == FROZEN {
                    return Placed::Frozen;
                }
                if e != TOMB && tag_of(e) == t && key_of(slot_of(e)) == Some(id) {
                    return Placed::Found(Hit { word, entry: e });
                }
            }
            b += 1;
            if b == self.buckets {
                b = 0;
            }
        }
        Placed::NoRoom
    }

    /// The entry of `id`, or else freezes the entry where its probe ends, so `id` can
    /// neither be added to this level from now on nor be found in it: a level being copied,
    /// and an insert that goes to the new one. (An insert racing for the same entry either
    /// lands first, and is found, or finds it frozen and goes to the new level too.)
    pub(super) fn freeze(
        &self,
        id: u64,
        h: u64,
        key_of: &impl Fn(u32) -> Option<u64>,
    ) -> Option<Hit<'a>> {
        match self.place(id, h, FROZEN, key_of) {
            Placed::Found(hit) => Some(hit),
            Placed::New | Placed::Frozen | Placed::NoRoom => None,
        }
    }
}

pub(super) enum Placed<'a> {
    /// Placed in an empty entry.
    New,
    /// The id has an entry.
    Found(Hit<'a>),
    /// The probe met a frozen entry: the level is being copied, go to the new one.
    Frozen,
    /// No empty entry in the level.
    NoRoom,
}

/// Where an id's entry was found.
#[derive(Clone, Copy)]
pub(super) struct Hit<'a> {
    word: &'a AtomicU64,
    entry: u64,
}

impl Hit<'_> {
    /// The slot of the row.
    #[inline]
    pub(super) fn slot(&self) -> u32 {
        slot_of(self.entry)
    }

    /// Records that the row was touched at `stamp` (a compare-and-swap, only when the
    /// stamp changes: a row touched again in the same tick costs nothing here).
    #[inline]
    pub(super) fn touch(&self, stamp: u16) {
        if (self.entry >> 48) as u16 != stamp {
            let new = (self.entry & 0xffff_ffff_ffff) | (u64::from(stamp) << 48);
            // Lost to another touch or an eviction: either way nothing to do.
            let _ =
                self.word
                    .compare_exchange(self.entry, new, Ordering::Relaxed, Ordering::Relaxed);
        }
    }
}
