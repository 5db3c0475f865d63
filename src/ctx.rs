//! Request contexts: a pre-sized slab whose handle travels in frame headers.
//!
//! Every request that leaves a core (a frame sent to a peer, an entry pushed on a
//! ring) carries a `u64` that comes back with its completion: the peer echoes it
//! in the response header, the kernel in `user_data`. Parameter-server transports
//! traditionally put a raw pointer to the request context there. That is as cheap
//! as it gets, but a forged, duplicated or late response then dereferences memory
//! that is gone or reused.
//!
//! A [`CtxKey`] costs the same 8 bytes and the same O(1) lookup (an array index),
//! but it is a slot index plus a *generation*. Removing a context from the slot
//! bumps the slot's generation, so a handle stays valid exactly as long as the
//! context it named: a forged index is rejected as [`CtxError::OutOfRange`], a
//! response to a request already completed (or whose slot now holds another
//! request) as [`CtxError::Stale`] or [`CtxError::Vacant`], and nothing is ever
//! looked up on the strength of an unchecked number.
//!
//! [`CtxSlab`] allocates all its slots up front. On the hot path it never
//! allocates: when every slot is in use, [`CtxSlab::insert`] refuses and hands the
//! value back ([`Full`]), which the caller turns into backpressure. Free slots are
//! kept on an intrusive LIFO list, so the most recently freed (cache-warm) slot is
//! reused first and every operation is O(1), except the whole-slab walks
//! [`CtxSlab::iter`] and [`CtxSlab::drain`].
//!
//! # CtxKey layout
//!
//! | bits   | meaning                                  |
//! |--------|------------------------------------------|
//! | 0..32  | slot index                               |
//! | 32..64 | generation of the slot's current context |
//!
//! The generation of a live context is never 0, so:
//!
//! - the raw handle `0` ([`CtxKey::NONE`]) never names a live context and is free
//!   to mean "no request" on the wire;
//! - every handle with generation 0 is *reserved for internal operations*
//!   (timeouts, cancellations, wake-ups that have no context of their own; see
//!   [`CtxKey::internal`]). [`CtxSlab::get`], [`CtxSlab::get_mut`] and
//!   [`CtxSlab::remove`] always reject them with [`CtxError::Reserved`].
//!
//! # Generation wrap
//!
//! Generations are 32 bits, wrapping and skipping 0. A stale handle is therefore
//! rejected until its slot has been reused `2^32 - 1` times; after exactly that many
//! reuses it would name the slot's context of that moment again. At a million
//! reuses of one slot per second that is more than an hour and ten minutes for
//! one response to be late, far beyond any request timeout.

use std::error::Error;
use std::fmt;
use std::iter::{Enumerate, FusedIterator};
use std::slice;

/// A generation-checked reference to a context in a [`CtxSlab`].
///
/// Low 32 bits: slot index; high 32 bits: generation. See the
/// [module docs](self) for the layout and the reserved generation 0.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CtxKey(u64);

impl CtxKey {
    /// The raw handle `0`: "no request". It has generation 0, so it never names a
    /// live context.
    pub const NONE: CtxKey = CtxKey(0);

    /// Rebuild a handle from the `u64` found in a frame header or a completion.
    ///
    /// Any value is accepted; validity is checked by the slab on lookup.
    #[inline]
    pub const fn from_raw(raw: u64) -> CtxKey {
        CtxKey(raw)
    }

    /// The `u64` to put in a frame header or a ring entry.
    #[inline]
    pub const fn to_raw(self) -> u64 {
        self.0
    }

    /// A handle reserved for an internal operation, identified by `tag`.
    ///
    /// Its generation is 0, so it can never be confused with a request context:
    /// a slab rejects it with [`CtxError::Reserved`]. `CtxKey::internal(0)` is
    /// [`CtxKey::NONE`].
    #[inline]
    pub const fn internal(tag: u32) -> CtxKey {
        CtxKey::new(tag, 0)
    }

    /// Whether this handle has generation 0, i.e. is reserved for internal
    /// operations (this includes [`CtxKey::NONE`]).
    #[inline]
    pub const fn is_internal(self) -> bool {
        self.generation() == 0
    }

    /// The slot index (low 32 bits); for an internal handle, its tag.
    #[inline]
    pub const fn index(self) -> u32 {
        self.0 as u32
    }

    /// The generation (high 32 bits); 0 for internal handles.
    #[inline]
    pub const fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }

    #[inline]
    const fn new(index: u32, generation: u32) -> CtxKey {
        CtxKey(((generation as u64) << 32) | index as u64)
    }
}

impl fmt::Debug for CtxKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CtxKey")
            .field("index", &self.index())
            .field("generation", &self.generation())
            .finish()
    }
}

/// Why a [`CtxKey`] did not resolve to a live context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CtxError {
    /// The index is not below the slab's capacity: the handle was forged or
    /// belongs to another slab.
    OutOfRange,
    /// The slot is free and no context was ever issued with this handle's
    /// generation for it.
    Vacant,
    /// The generation does not match the slot's: the context was already removed
    /// (completed twice, or a late response) and the slot may since have been
    /// reused.
    Stale,
    /// Generation 0: the handle is reserved for internal operations and never
    /// names a context.
    Reserved,
}

impl fmt::Display for CtxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CtxError::OutOfRange => "context handle index out of range",
            CtxError::Vacant => "context handle names a vacant slot",
            CtxError::Stale => "stale context handle (already completed or slot reused)",
            CtxError::Reserved => "context handle reserved for internal operations",
        })
    }
}

impl Error for CtxError {}

/// [`CtxSlab::insert`] refused because every slot is in use; the value is handed
/// back so the caller can retry after a completion (backpressure).
///
/// `Debug` does not print the value, so `Full<T>` is an [`Error`] for any `T`.
#[derive(Clone, PartialEq, Eq)]
pub struct Full<T>(pub T);

impl<T> Full<T> {
    /// The value that was not inserted.
    #[inline]
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> fmt::Debug for Full<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Full(..)")
    }
}

impl<T> fmt::Display for Full<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("context slab is full")
    }
}

impl<T> Error for Full<T> {}

/// The requested capacity exceeds [`CtxSlab::MAX_CAPACITY`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacityError {
    /// The capacity that was asked for.
    pub requested: usize,
}

impl fmt::Display for CapacityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "context slab capacity {} exceeds the maximum {}",
            self.requested,
            CtxSlab::<()>::MAX_CAPACITY
        )
    }
}

impl Error for CapacityError {}

/// End of the free list. Never a valid index, since capacity ≤ `u32::MAX - 1`.
const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
enum Entry<T> {
    Occupied(T),
    Vacant { next_free: u32 },
}

#[derive(Debug, Clone)]
struct Slot<T> {
    /// Occupied: the generation of the live context's handle. Vacant: the
    /// generation the next context in this slot will get. Never 0.
    generation: u32,
    entry: Entry<T>,
}

/// The generation after `g`: wrapping, skipping the reserved 0.
#[inline]
fn next_generation(g: u32) -> u32 {
    match g.wrapping_add(1) {
        0 => 1,
        n => n,
    }
}

/// A pre-sized slab of request contexts addressed by generation-checked
/// [`CtxKey`]s.
///
/// All slots are allocated by the constructor; nothing allocates afterwards.
/// Lookups never panic, whatever the handle.
#[derive(Debug, Clone)]
pub struct CtxSlab<T> {
    slots: Box<[Slot<T>]>,
    /// Head of the intrusive LIFO free list; `NIL` exactly when full.
    free_head: u32,
    len: u32,
}

impl<T> CtxSlab<T> {
    /// The largest capacity a slab can have: indices must fit the low 32 bits of
    /// a handle, and `u32::MAX` is kept as the free-list terminator.
    pub const MAX_CAPACITY: usize = (u32::MAX - 1) as usize;

    /// A slab with `capacity` slots, all allocated now.
    ///
    /// # Panics
    ///
    /// If `capacity > MAX_CAPACITY` (a configuration error); use
    /// [`CtxSlab::try_with_capacity`] to get an error instead.
    pub fn with_capacity(capacity: usize) -> CtxSlab<T> {
        match CtxSlab::try_with_capacity(capacity) {
            Ok(slab) => slab,
            Err(e) => panic!("{e}"),
        }
    }

    /// A slab with `capacity` slots, all allocated now, or an error if
    /// `capacity > MAX_CAPACITY`.
    pub fn try_with_capacity(capacity: usize) -> Result<CtxSlab<T>, CapacityError> {
        if capacity > Self::MAX_CAPACITY {
            return Err(CapacityError {
                requested: capacity,
            });
        }
        // capacity ≤ u32::MAX - 1, so every index and `i + 1` fit in a u32.
        let cap = capacity as u32;
        let slots = (0..cap)
            .map(|i| Slot {
                generation: 1,
                entry: Entry::Vacant {
                    next_free: if i + 1 < cap { i + 1 } else { NIL },
                },
            })
            .collect();
        Ok(CtxSlab {
            slots,
            free_head: if cap > 0 { 0 } else { NIL },
            len: 0,
        })
    }

    /// Number of slots; fixed for the slab's life.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Number of live contexts.
    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether no context is live.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether every slot is in use, i.e. the next [`insert`](Self::insert) will
    /// be refused.
    #[inline]
    pub fn is_full(&self) -> bool {
        self.free_head == NIL
    }

    /// Store `value` in a free slot and return its handle; if every slot is in
    /// use, refuse and hand `value` back. Never allocates.
    pub fn insert(&mut self, value: T) -> Result<CtxKey, Full<T>> {
        let index = self.free_head;
        let Some(slot) = self.slots.get_mut(index as usize) else {
            // `NIL` is never a valid index: the slab is full.
            return Err(Full(value));
        };
        let Entry::Vacant { next_free } = slot.entry else {
            unreachable!("free list points at an occupied slot");
        };
        slot.entry = Entry::Occupied(value);
        self.free_head = next_free;
        self.len += 1;
        Ok(CtxKey::new(index, slot.generation))
    }

    /// The context named by `handle`.
    pub fn get(&self, handle: CtxKey) -> Result<&T, CtxError> {
        match &self.slot(handle)?.entry {
            Entry::Occupied(value) => Ok(value),
            Entry::Vacant { .. } => Err(CtxError::Vacant),
        }
    }

    /// The context named by `handle`, mutably.
    pub fn get_mut(&mut self, handle: CtxKey) -> Result<&mut T, CtxError> {
        match &mut self.slot_mut(handle)?.entry {
            Entry::Occupied(value) => Ok(value),
            Entry::Vacant { .. } => Err(CtxError::Vacant),
        }
    }

    /// Whether `handle` names a live context.
    #[inline]
    pub fn contains(&self, handle: CtxKey) -> bool {
        self.get(handle).is_ok()
    }

    /// Complete the context named by `handle`: take it out of the slab.
    ///
    /// The slot's generation is bumped, so `handle` (and every copy of it) is
    /// stale from now on; removing it again gives [`CtxError::Stale`].
    pub fn remove(&mut self, handle: CtxKey) -> Result<T, CtxError> {
        let free_head = self.free_head;
        let slot = self.slot_mut(handle)?;
        let vacant = Entry::Vacant {
            next_free: free_head,
        };
        let value = match std::mem::replace(&mut slot.entry, vacant) {
            Entry::Occupied(value) => value,
            free @ Entry::Vacant { .. } => {
                // Put the free-list link back untouched.
                slot.entry = free;
                return Err(CtxError::Vacant);
            }
        };
        slot.generation = next_generation(slot.generation);
        self.free_head = handle.index();
        self.len -= 1;
        Ok(value)
    }

    /// The live contexts with their handles, in slot order.
    pub fn iter(&self) -> Iter<'_, T> {
        Iter {
            slots: self.slots.iter().enumerate(),
            remaining: self.len(),
        }
    }

    /// Remove every live context, yielding each with its handle, in slot order
    /// (used to fail every in-flight request when a connection is lost).
    ///
    /// Each context is removed as it is yielded, exactly as by
    /// [`remove`](Self::remove), so its handle is stale afterwards. Dropping the
    /// iterator removes (and drops) the rest. Does not allocate. If the iterator
    /// is leaked instead of dropped, the contexts not yet yielded stay live and the
    /// slab stays consistent.
    pub fn drain(&mut self) -> Drain<'_, T> {
        Drain {
            slab: self,
            next_index: 0,
        }
    }

    /// Resolve `handle` to its slot, checking the reserved generation, the range
    /// and the generation, in that order.
    #[inline]
    fn slot(&self, handle: CtxKey) -> Result<&Slot<T>, CtxError> {
        if handle.is_internal() {
            return Err(CtxError::Reserved);
        }
        let slot = self
            .slots
            .get(handle.index() as usize)
            .ok_or(CtxError::OutOfRange)?;
        if slot.generation != handle.generation() {
            return Err(CtxError::Stale);
        }
        Ok(slot)
    }

    /// Mutable twin of [`slot`](Self::slot).
    #[inline]
    fn slot_mut(&mut self, handle: CtxKey) -> Result<&mut Slot<T>, CtxError> {
        if handle.is_internal() {
            return Err(CtxError::Reserved);
        }
        let slot = self
            .slots
            .get_mut(handle.index() as usize)
            .ok_or(CtxError::OutOfRange)?;
        if slot.generation != handle.generation() {
            return Err(CtxError::Stale);
        }
        Ok(slot)
    }

    /// Force the generation of slot `index` (for wrap tests).
    #[cfg(test)]
    fn set_generation(&mut self, index: u32, generation: u32) {
        assert_ne!(generation, 0, "generation 0 is reserved");
        self.slots[index as usize].generation = generation;
    }
}

/// Iterator over the live contexts of a [`CtxSlab`]; see [`CtxSlab::iter`].
#[derive(Debug, Clone)]
pub struct Iter<'a, T> {
    slots: Enumerate<slice::Iter<'a, Slot<T>>>,
    /// Live contexts not yet yielded; lets the walk stop at the last one.
    remaining: usize,
}

impl<'a, T> Iterator for Iter<'a, T> {
    type Item = (CtxKey, &'a T);

    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining == 0 {
            return None;
        }
        for (index, slot) in self.slots.by_ref() {
            if let Entry::Occupied(value) = &slot.entry {
                self.remaining -= 1;
                // index < capacity ≤ u32::MAX - 1
                return Some((CtxKey::new(index as u32, slot.generation), value));
            }
        }
        None
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl<T> ExactSizeIterator for Iter<'_, T> {}
impl<T> FusedIterator for Iter<'_, T> {}

impl<'a, T> IntoIterator for &'a CtxSlab<T> {
    type Item = (CtxKey, &'a T);
    type IntoIter = Iter<'a, T>;

    fn into_iter(self) -> Iter<'a, T> {
        self.iter()
    }
}

/// Draining iterator of a [`CtxSlab`]; see [`CtxSlab::drain`].
#[derive(Debug)]
pub struct Drain<'a, T> {
    slab: &'a mut CtxSlab<T>,
    /// Slots below this index are known vacant.
    next_index: u32,
}

impl<T> Iterator for Drain<'_, T> {
    type Item = (CtxKey, T);

    fn next(&mut self) -> Option<Self::Item> {
        while !self.slab.is_empty() {
            let index = self.next_index;
            let slot = self.slab.slots.get(index as usize)?;
            self.next_index += 1;
            if let Entry::Occupied(_) = slot.entry {
                let handle = CtxKey::new(index, slot.generation);
                // Cannot fail: the slot is occupied and the handle is its own.
                return self.slab.remove(handle).ok().map(|value| (handle, value));
            }
        }
        None
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.slab.len(), Some(self.slab.len()))
    }
}

impl<T> ExactSizeIterator for Drain<'_, T> {}
impl<T> FusedIterator for Drain<'_, T> {}

impl<T> Drop for Drain<'_, T> {
    fn drop(&mut self) {
        self.for_each(drop);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_layout() {
        let h = CtxKey::new(7, 3);
        assert_eq!(h.to_raw(), (3 << 32) | 7);
        assert_eq!(h.index(), 7);
        assert_eq!(h.generation(), 3);
        assert_eq!(CtxKey::from_raw(h.to_raw()), h);
        assert!(!h.is_internal());
        assert_eq!(CtxKey::internal(0), CtxKey::NONE);
        assert_eq!(CtxKey::NONE.to_raw(), 0);
        let t = CtxKey::internal(42);
        assert_eq!((t.index(), t.generation()), (42, 0));
        assert!(t.is_internal());
    }

    #[test]
    fn insert_get_remove() {
        let mut slab = CtxSlab::with_capacity(4);
        assert!(slab.is_empty());
        let a = slab.insert("a").unwrap();
        let b = slab.insert("b").unwrap();
        assert_ne!(a, b);
        assert_ne!(a.generation(), 0);
        assert_eq!(slab.len(), 2);
        assert_eq!(slab.get(a), Ok(&"a"));
        assert_eq!(slab.get(b), Ok(&"b"));
        *slab.get_mut(b).unwrap() = "B";
        assert!(slab.contains(b));
        assert_eq!(slab.remove(b), Ok("B"));
        assert!(!slab.contains(b));
        assert_eq!(slab.len(), 1);
        assert_eq!(slab.remove(a), Ok("a"));
        assert!(slab.is_empty());
    }

    #[test]
    fn full_refuses_and_returns_value() {
        let mut slab = CtxSlab::with_capacity(2);
        let a = slab.insert(String::from("a")).unwrap();
        slab.insert(String::from("b")).unwrap();
        assert!(slab.is_full());
        let err = slab.insert(String::from("c")).unwrap_err();
        assert_eq!(err.into_inner(), "c");
        assert_eq!(slab.len(), 2);
        // A completion makes room again.
        slab.remove(a).unwrap();
        assert!(!slab.is_full());
        assert!(slab.insert(String::from("c")).is_ok());
    }

    #[test]
    fn zero_capacity_is_always_full() {
        let mut slab = CtxSlab::with_capacity(0);
        assert!(slab.is_full());
        assert_eq!(slab.insert(1u8), Err(Full(1)));
        assert_eq!(slab.get(CtxKey::new(0, 1)), Err(CtxError::OutOfRange));
        assert_eq!(slab.drain().count(), 0);
    }

    #[test]
    fn capacity_limit() {
        assert!(CtxSlab::<u8>::try_with_capacity(CtxSlab::<u8>::MAX_CAPACITY + 1).is_err());
        assert_eq!(
            CtxSlab::<u8>::try_with_capacity(usize::MAX).unwrap_err(),
            CapacityError {
                requested: usize::MAX
            }
        );
    }

    #[test]
    #[should_panic(expected = "exceeds the maximum")]
    fn with_capacity_panics_past_limit() {
        let _ = CtxSlab::<u8>::with_capacity(usize::MAX);
    }

    #[test]
    fn stale_after_remove() {
        let mut slab = CtxSlab::with_capacity(1);
        let a = slab.insert(1).unwrap();
        slab.remove(a).unwrap();
        assert_eq!(slab.get(a), Err(CtxError::Stale));
        assert_eq!(slab.get_mut(a), Err(CtxError::Stale));
        assert!(!slab.contains(a));
    }

    #[test]
    fn stale_after_reuse() {
        let mut slab = CtxSlab::with_capacity(1);
        let a = slab.insert(1).unwrap();
        slab.remove(a).unwrap();
        let b = slab.insert(2).unwrap();
        // Same slot, new generation.
        assert_eq!(a.index(), b.index());
        assert_ne!(a, b);
        assert_eq!(slab.get(a), Err(CtxError::Stale));
        assert_eq!(slab.remove(a), Err(CtxError::Stale));
        // The late completion did not disturb the new context.
        assert_eq!(slab.get(b), Ok(&2));
    }

    #[test]
    fn double_remove() {
        let mut slab = CtxSlab::with_capacity(2);
        let a = slab.insert(1).unwrap();
        assert_eq!(slab.remove(a), Ok(1));
        assert_eq!(slab.remove(a), Err(CtxError::Stale));
        assert_eq!(slab.len(), 0);
        // The free list is intact: both slots are usable exactly once each.
        slab.insert(2).unwrap();
        slab.insert(3).unwrap();
        assert!(slab.insert(4).is_err());
    }

    #[test]
    fn free_list_is_lifo() {
        let mut slab = CtxSlab::with_capacity(4);
        let hs: Vec<_> = (0..4).map(|i| slab.insert(i).unwrap()).collect();
        slab.remove(hs[1]).unwrap();
        slab.remove(hs[3]).unwrap();
        assert_eq!(slab.insert(10).unwrap().index(), 3);
        assert_eq!(slab.insert(11).unwrap().index(), 1);
    }

    #[test]
    fn forged_index() {
        let mut slab = CtxSlab::with_capacity(4);
        let a = slab.insert(1).unwrap();
        for index in [4, 5, u32::MAX - 1, u32::MAX] {
            let forged = CtxKey::new(index, a.generation());
            assert_eq!(slab.get(forged), Err(CtxError::OutOfRange));
            assert_eq!(slab.get_mut(forged), Err(CtxError::OutOfRange));
            assert_eq!(slab.remove(forged), Err(CtxError::OutOfRange));
        }
        // In range but never issued: vacant slot, or wrong generation.
        assert_eq!(slab.get(CtxKey::new(2, 1)), Err(CtxError::Vacant));
        assert_eq!(slab.remove(CtxKey::new(2, 1)), Err(CtxError::Vacant));
        assert_eq!(slab.get(CtxKey::new(2, 9)), Err(CtxError::Stale));
        let forged = CtxKey::new(a.index(), a.generation() + 1);
        assert_eq!(slab.remove(forged), Err(CtxError::Stale));
        assert_eq!(slab.len(), 1);
        assert_eq!(slab.get(a), Ok(&1));
    }

    #[test]
    fn generation_zero_is_reserved() {
        let mut slab = CtxSlab::with_capacity(4);
        let a = slab.insert(1).unwrap();
        for h in [
            CtxKey::NONE,
            CtxKey::internal(a.index()),
            CtxKey::internal(u32::MAX),
        ] {
            assert_eq!(slab.get(h), Err(CtxError::Reserved));
            assert_eq!(slab.get_mut(h), Err(CtxError::Reserved));
            assert_eq!(slab.remove(h), Err(CtxError::Reserved));
            assert!(!slab.contains(h));
        }
        assert_eq!(slab.get(a), Ok(&1));
    }

    #[test]
    fn generation_wrap_skips_zero() {
        let mut slab = CtxSlab::with_capacity(1);
        slab.set_generation(0, u32::MAX);
        let a = slab.insert(1).unwrap();
        assert_eq!(a.generation(), u32::MAX);
        slab.remove(a).unwrap();
        let b = slab.insert(2).unwrap();
        assert_eq!(b.generation(), 1);
        assert_eq!(slab.get(a), Err(CtxError::Stale));
        assert_eq!(slab.get(b), Ok(&2));
        assert_eq!(next_generation(u32::MAX - 1), u32::MAX);
        assert_eq!(next_generation(u32::MAX), 1);
    }

    #[test]
    fn iter_yields_live_contexts() {
        let mut slab = CtxSlab::with_capacity(4);
        let hs: Vec<_> = (0..4).map(|i| slab.insert(i * 10).unwrap()).collect();
        slab.remove(hs[0]).unwrap();
        slab.remove(hs[2]).unwrap();
        let it = slab.iter();
        assert_eq!(it.len(), 2);
        let live: Vec<_> = it.collect();
        assert_eq!(live, vec![(hs[1], &10), (hs[3], &30)]);
        assert_eq!((&slab).into_iter().count(), 2);
    }

    #[test]
    fn drain_empties_and_leaves_handles_stale() {
        let mut slab = CtxSlab::with_capacity(4);
        let hs: Vec<_> = (0..3).map(|i| slab.insert(i).unwrap()).collect();
        let drained: Vec<_> = slab.drain().collect();
        assert_eq!(drained, vec![(hs[0], 0), (hs[1], 1), (hs[2], 2)]);
        assert!(slab.is_empty());
        for h in hs {
            assert_eq!(slab.get(h), Err(CtxError::Stale));
            assert_eq!(slab.remove(h), Err(CtxError::Stale));
        }
        // Every slot is usable again.
        for i in 0..4 {
            slab.insert(i).unwrap();
        }
        assert!(slab.is_full());
    }

    #[test]
    fn dropped_drain_removes_the_rest() {
        let mut slab = CtxSlab::with_capacity(4);
        let hs: Vec<_> = (0..4).map(|i| slab.insert(i).unwrap()).collect();
        let mut drain = slab.drain();
        assert_eq!(drain.next(), Some((hs[0], 0)));
        drop(drain);
        assert!(slab.is_empty());
        assert!(hs.iter().all(|&h| !slab.contains(h)));
    }

    #[test]
    fn capacity_never_grows() {
        let mut slab = CtxSlab::with_capacity(3);
        for round in 0..100 {
            while slab.insert(round).is_ok() {}
            assert_eq!(slab.len(), 3);
            assert_eq!(slab.capacity(), 3);
            let h = slab.iter().next().unwrap().0;
            slab.remove(h).unwrap();
            if round % 10 == 0 {
                slab.drain().for_each(drop);
            }
        }
        assert_eq!(slab.capacity(), 3);
    }

    #[test]
    fn errors_display() {
        for e in [
            CtxError::OutOfRange,
            CtxError::Vacant,
            CtxError::Stale,
            CtxError::Reserved,
        ] {
            assert!(!e.to_string().is_empty());
        }
        let e: Box<dyn Error> = Box::new(Full(()));
        assert_eq!(e.to_string(), "context slab is full");
    }
}
