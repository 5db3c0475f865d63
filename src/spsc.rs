//! Bounded single-producer/single-consumer rings: the only way bytes, requests and
//! completions cross from one core's event loop to another's.
//!
//! `unsafe` is allowed here because the ring keeps its items in `MaybeUninit` slots
//! whose ownership is handed between two threads by the head/tail protocol, which
//! the type system cannot express. Every `unsafe` block says which half of that
//! protocol makes it sound.
//!
//! # Design
//!
//! [`channel`] allocates the slots once; nothing on the push/pop path allocates.
//! Two free-running indices describe the ring: `tail` (next slot to write, only the
//! [`Producer`] stores it) and `head` (next slot to read, only the [`Consumer`]
//! stores it). They live on separate [`CachePadded`] lines so that the two cores
//! never write the same line. Each end also keeps, in its own struct, its own
//! index and a *cached copy* of the other end's index; it reloads the shared copy
//! only when the cached one says "full" (producer) or "empty" (consumer), so in
//! the common case a push or pop reads no line the other core is writing.
//!
//! Indices grow without bound and wrap at `usize::MAX`; `tail - head` (wrapping)
//! is the number of queued items and `index & mask` the slot. That is why the
//! capacity is a power of two (and at most `2^(usize::BITS - 1)`).
//!
//! Memory ordering is one Release/Acquire pair per direction:
//!
//! - the producer writes a slot, then stores `tail` with `Release`; the consumer
//!   loads `tail` with `Acquire` before reading slots below it, so it sees the
//!   value fully written;
//! - the consumer moves a value out of a slot, then stores `head` with `Release`;
//!   the producer loads `head` with `Acquire` before overwriting slots below it
//!   (plus the capacity), so its write cannot race with the consumer's read.
//!
//! # Waking a parked loop
//!
//! A loop thread that found all its rings empty parks; producers ring its
//! [`ThreadWaker`] doorbell after pushing. The doorbell unparks the thread once per
//! parked period, not once per message.

#![allow(unsafe_code)]

use std::cell::{Cell, UnsafeCell};
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, Thread};
use std::time::Duration;

use crossbeam_utils::CachePadded;

/// Makes the ends `!Sync` (each end belongs to one thread) while keeping them `Send`.
type NotSync = PhantomData<Cell<()>>;

/// The shared part of a channel: slots plus the two published indices.
struct Ring<T> {
    /// Next slot the consumer reads. Stored only by the consumer.
    head: CachePadded<AtomicUsize>,
    /// Next slot the producer writes. Stored only by the producer.
    tail: CachePadded<AtomicUsize>,
    /// Set once, when the producer is dropped.
    producer_closed: CachePadded<AtomicBool>,
    /// Set once, when the consumer is dropped.
    consumer_closed: CachePadded<AtomicBool>,
    /// `capacity - 1`; the capacity is a power of two.
    mask: usize,
    /// Slot `i & mask` holds an initialized value iff `head <= i < tail` (wrapping).
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
}

// SAFETY: the ring is shared by exactly one `Producer` and one `Consumer`, both
// `!Sync`, so at most two threads touch it. Slots in `[head, tail)` are accessed
// only by the consumer, the others only by the producer; the Release/Acquire
// pairs on `head` and `tail` hand a slot from one to the other. Values of `T` move
// between threads, hence `T: Send`; no `&T` is ever shared, so `T: Sync` is not
// needed.
unsafe impl<T: Send> Sync for Ring<T> {}

impl<T> Ring<T> {
    fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Moves `value` into the slot of `index`.
    ///
    /// # Safety
    ///
    /// Only the producer may call this, and the slot must be vacant: the producer
    /// observed (with an `Acquire` load of `head`) that `index - head < capacity`.
    unsafe fn write(&self, index: usize, value: T) {
        let slot = self.slots[index & self.mask].get();
        // SAFETY: the caller guarantees that the consumer is done with this slot
        // (its `Release` store of `head` happened-before our `Acquire` load) and
        // will not read it before our `Release` store of `tail`, so we have
        // exclusive access. The slot is vacant, so nothing is overwritten without
        // being dropped.
        unsafe { (*slot).write(value) };
    }

    /// Moves the value out of the slot of `index`, leaving it vacant.
    ///
    /// # Safety
    ///
    /// Only the consumer may call this, and the slot must be occupied: the consumer
    /// observed (with an `Acquire` load of `tail`) that `index < tail`, and `index`
    /// is its own `head`, so the value was not taken yet. The caller must advance
    /// `head` past `index` before the ring could drop the slot again.
    unsafe fn take(&self, index: usize) -> T {
        let slot = self.slots[index & self.mask].get();
        // SAFETY: the producer's write of this slot happened-before our `Acquire`
        // load of `tail`, and it will not touch the slot until our `Release` store
        // of a `head` past `index`, so we have exclusive access to an initialized
        // value, which we read exactly once.
        unsafe { (*slot).assume_init_read() }
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        // Both ends are gone; `Arc`'s drop synchronizes with their last accesses,
        // so plain reads see the final indices. Every published `head` covers every
        // value the consumer moved out (see `Consumer::pop_batch`), so what is
        // left in `[head, tail)` is owned by the ring and dropped here, once. If a
        // destructor panics, the remaining items leak; they are never dropped twice.
        let head = *self.head.get_mut();
        let tail = *self.tail.get_mut();
        let mut index = head;
        while index != tail {
            let slot = self.slots[index & self.mask].get_mut();
            // SAFETY: `head <= index < tail`, so the slot holds an initialized value
            // not yet moved out, and `&mut self` means no end can access it anymore.
            unsafe { slot.assume_init_drop() };
            index = index.wrapping_add(1);
        }
    }
}

/// Creates a bounded SPSC ring and returns its two ends.
///
/// The capacity is rounded up to the next power of two, and to at least 2
/// (`channel(0)` and `channel(1)` hold 2 items, `channel(3)` holds 4, `channel(4)`
/// holds 4); [`Producer::capacity`] reports the result. The slots are allocated
/// here, once.
///
/// # Panics
///
/// If the rounded capacity does not fit in a `usize`.
pub fn channel<T: Send>(capacity: usize) -> (Producer<T>, Consumer<T>) {
    with_start_index(capacity, 0)
}

/// [`channel`] with both indices starting at `start`: lets tests cross the
/// `usize::MAX` wrap of the indices without pushing 2^64 items.
fn with_start_index<T: Send>(capacity: usize, start: usize) -> (Producer<T>, Consumer<T>) {
    let capacity = capacity
        .max(2)
        .checked_next_power_of_two()
        .expect("spsc: capacity overflows usize when rounded up to a power of two");
    let slots = (0..capacity)
        .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
        .collect();
    let ring = Arc::new(Ring {
        head: CachePadded::new(AtomicUsize::new(start)),
        tail: CachePadded::new(AtomicUsize::new(start)),
        producer_closed: CachePadded::new(AtomicBool::new(false)),
        consumer_closed: CachePadded::new(AtomicBool::new(false)),
        mask: capacity - 1,
        slots,
    });
    let producer = Producer {
        ring: Arc::clone(&ring),
        tail: start,
        cached_head: start,
        _not_sync: PhantomData,
    };
    let consumer = Consumer {
        ring,
        head: start,
        cached_tail: start,
        _not_sync: PhantomData,
    };
    (producer, consumer)
}

/// The writing end of a [`channel`]. `Send`, not `Sync`: it belongs to one thread
/// at a time.
pub struct Producer<T> {
    ring: Arc<Ring<T>>,
    /// Our own index; equal to `ring.tail` (we are its only writer).
    tail: usize,
    /// Last `ring.head` we loaded; the real one is never behind it.
    cached_head: usize,
    _not_sync: NotSync,
}

impl<T> Producer<T> {
    /// Pushes `value`, or hands it back as `Err(value)` when the ring is full.
    ///
    /// A full ring is backpressure: nothing is allocated, the caller retries later.
    /// A push succeeds while there is room even if the consumer is gone; check
    /// [`is_closed`](Self::is_closed) when the ring stays full (the items are then
    /// dropped with the ring).
    pub fn push(&mut self, value: T) -> Result<(), T> {
        let tail = self.tail;
        if tail.wrapping_sub(self.cached_head) == self.ring.capacity() {
            // Looks full by our stale copy: look at the real head. `Acquire` pairs
            // with the consumer's `Release` store of `head`: its reads of the slots
            // it freed happen-before our writes into them.
            self.cached_head = self.ring.head.load(Ordering::Acquire);
            if tail.wrapping_sub(self.cached_head) == self.ring.capacity() {
                return Err(value);
            }
        }
        // SAFETY: we are the producer, and `tail - head < capacity` by an `Acquire`
        // load of `head` (now or earlier; `head` only grows), so the slot is vacant.
        unsafe { self.ring.write(tail, value) };
        self.tail = tail.wrapping_add(1);
        // `Release`: the slot write above happens-before the consumer's `Acquire`
        // load that sees this tail.
        self.ring.tail.store(self.tail, Ordering::Release);
        Ok(())
    }

    /// Number of items that can be pushed right now without failing. A lower
    /// bound: the consumer may free more at any time.
    pub fn free_slots(&self) -> usize {
        let head = self.ring.head.load(Ordering::Acquire);
        self.ring.capacity() - self.tail.wrapping_sub(head)
    }

    /// The ring's capacity (the requested one, rounded up; see [`channel`]).
    pub fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// True once the consumer has been dropped: nothing pushed will be read.
    pub fn is_closed(&self) -> bool {
        self.ring.consumer_closed.load(Ordering::Acquire)
    }
}

impl<T> Drop for Producer<T> {
    fn drop(&mut self) {
        // `Release`: every push happens-before a consumer that sees the flag, so
        // `is_closed()` followed by popping until `None` drains everything.
        self.ring.producer_closed.store(true, Ordering::Release);
    }
}

/// The reading end of a [`channel`]. `Send`, not `Sync`: it belongs to one thread
/// at a time.
pub struct Consumer<T> {
    ring: Arc<Ring<T>>,
    /// Our own index; `ring.head` equals it outside of `pop_batch`.
    head: usize,
    /// Last `ring.tail` we loaded; the real one is never behind it.
    cached_tail: usize,
    _not_sync: NotSync,
}

impl<T> Consumer<T> {
    /// Pops the oldest item, or `None` if the ring is empty.
    pub fn pop(&mut self) -> Option<T> {
        let head = self.head;
        if head == self.cached_tail {
            // Looks empty by our stale copy: look at the real tail. `Acquire` pairs
            // with the producer's `Release` store of `tail`: its slot writes
            // happen-before our reads.
            self.cached_tail = self.ring.tail.load(Ordering::Acquire);
            if head == self.cached_tail {
                return None;
            }
        }
        // SAFETY: we are the consumer, `head < tail` by an `Acquire` load of `tail`,
        // and `head` is advanced right below.
        let value = unsafe { self.ring.take(head) };
        self.head = head.wrapping_add(1);
        // `Release`: our read of the slot happens-before the producer reuses it.
        self.ring.head.store(self.head, Ordering::Release);
        Some(value)
    }

    /// Pops up to `max` items in FIFO order, passing each to `f`; returns how many.
    ///
    /// The new head is published once for the whole batch (one shared write
    /// instead of one per item), so the producer sees the freed slots only when
    /// the batch ends. If `f` panics, the items already handed out stay popped and
    /// the rest stay in the ring.
    pub fn pop_batch(&mut self, max: usize, mut f: impl FnMut(T)) -> usize {
        let mut available = self.cached_tail.wrapping_sub(self.head);
        if available < max {
            // `Acquire`: as in `pop`.
            self.cached_tail = self.ring.tail.load(Ordering::Acquire);
            available = self.cached_tail.wrapping_sub(self.head);
        }
        let count = available.min(max);
        if count == 0 {
            return 0;
        }
        // Publishes `head` when the batch ends, also if `f` unwinds: the ring's
        // drop must not drop again a value `f` already received.
        let batch = PublishHeadOnDrop { consumer: self };
        for _ in 0..count {
            let consumer = &mut *batch.consumer;
            let head = consumer.head;
            // SAFETY: we are the consumer, `head < tail` by the `Acquire` load of
            // `tail` above (`count <= tail - head`), and `head` is advanced before
            // the value reaches `f`, so an unwinding `f` still publishes past it.
            let value = unsafe { consumer.ring.take(head) };
            consumer.head = head.wrapping_add(1);
            f(value);
        }
        drop(batch);
        count
    }

    /// Number of items queued right now. A lower bound: the producer may push
    /// more at any time.
    pub fn len(&self) -> usize {
        self.ring
            .tail
            .load(Ordering::Acquire)
            .wrapping_sub(self.head)
    }

    /// True if no item is queued right now. Reads the producer's published tail
    /// (not the cached copy), so it is the re-check to do after
    /// [`ThreadWaker::prepare_park`].
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ring's capacity (the requested one, rounded up; see [`channel`]).
    pub fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// True once the producer has been dropped. Items it pushed before may still
    /// be queued: after seeing `true`, pop until `None` to drain them all.
    pub fn is_closed(&self) -> bool {
        self.ring.producer_closed.load(Ordering::Acquire)
    }
}

impl<T> Drop for Consumer<T> {
    fn drop(&mut self) {
        // Items still queued are dropped by the ring, with the last end.
        self.ring.consumer_closed.store(true, Ordering::Release);
    }
}

/// Publishes the consumer's local head when a batch ends (normally or unwinding).
struct PublishHeadOnDrop<'a, T> {
    consumer: &'a mut Consumer<T>,
}

impl<T> Drop for PublishHeadOnDrop<'_, T> {
    fn drop(&mut self) {
        // `Release`: as in `Consumer::pop`, for every slot of the batch.
        self.consumer
            .ring
            .head
            .store(self.consumer.head, Ordering::Release);
    }
}

/// Doorbell for one thread that parks while waiting on one or more [`Consumer`]s.
///
/// The waiting thread does:
///
/// ```text
/// waker.prepare_park();
/// if all rings are still empty { waker.park(timeout); }
/// waker.clear_park();
/// ```
///
/// and each producer calls [`wake`](Self::wake) after pushing (once per batch of
/// pushes is enough). `wake` unparks the thread at most once per parked period.
///
/// # Why no wake-up is lost
///
/// The race is: a producer pushes and finds the flag clear (so it does not
/// unpark), while the waiter finds the rings empty (so it parks) — both reading
/// the other's state before it changed. Each side stores then loads, with a
/// `SeqCst` fence in between: the waiter stores `parked = true`, fences, re-checks
/// `tail`; the producer stores `tail`, fences (in `wake`), loads `parked`. The two
/// fences are totally ordered: if the waiter's comes first, the producer's load
/// sees `parked == true` and unparks; if the producer's comes first, the waiter's
/// re-check sees the new `tail` and does not park. Without the fences (Release
/// and Acquire alone) both loads could read the old values.
///
/// An unpark that arrives after the waiter already woke (timeout, or another
/// producer) leaves std's park token set, so the next `park` returns at once: a
/// harmless spurious wake-up, which the loop handles like any other.
#[derive(Debug)]
pub struct ThreadWaker {
    thread: Thread,
    parked: AtomicBool,
}

impl ThreadWaker {
    /// A doorbell for the calling thread.
    pub fn current() -> Arc<Self> {
        Self::for_thread(thread::current())
    }

    /// A doorbell for `thread`, which must be the one calling [`park`](Self::park).
    pub fn for_thread(thread: Thread) -> Arc<Self> {
        Arc::new(Self {
            thread,
            parked: AtomicBool::new(false),
        })
    }

    /// Announces that the thread is about to park. Re-check every ring after this
    /// and before [`park`](Self::park).
    pub fn prepare_park(&self) {
        self.parked.store(true, Ordering::SeqCst);
        // Orders the flag store before the re-check's loads of `tail`, which are
        // only `Acquire`; pairs with the fence in `wake`.
        fence(Ordering::SeqCst);
    }

    /// Parks the calling thread until [`wake`](Self::wake), the timeout, or a
    /// spurious wake-up.
    pub fn park(&self, timeout: Option<Duration>) {
        debug_assert_eq!(
            thread::current().id(),
            self.thread.id(),
            "ThreadWaker::park called from a thread it does not wake"
        );
        match timeout {
            Some(timeout) => thread::park_timeout(timeout),
            None => thread::park(),
        }
    }

    /// Announces that the thread is awake again, so producers stop unparking it.
    pub fn clear_park(&self) {
        // Relaxed is enough: a `wake` that still sees `true` only costs a spurious
        // wake-up, and the thread re-checks its rings before parking again anyway.
        self.parked.store(false, Ordering::Relaxed);
    }

    /// Unparks the thread if it announced it is parking; call after pushing.
    /// Returns whether this call unparked it (at most one call per parked period
    /// does).
    pub fn wake(&self) -> bool {
        // Orders the caller's `tail` store before the flag load; pairs with the
        // fence in `prepare_park` (see the type's docs).
        fence(Ordering::SeqCst);
        // The plain load keeps the common case (not parked) free of a write to the
        // waiter's line; the swap makes exactly one waker win a parked period.
        if self.parked.load(Ordering::Relaxed) && self.parked.swap(false, Ordering::SeqCst) {
            self.thread.unpark();
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hint::spin_loop;
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::time::Instant;

    /// Miri is slow: shrink the stress loops there.
    // Debug builds (the CI test run) use fewer items; `cargo test --release` runs the full count.
    const STRESS_ITEMS: u64 = if cfg!(miri) {
        2_000
    } else if cfg!(debug_assertions) {
        500_000
    } else {
        5_000_000
    };

    #[test]
    fn capacity_rounds_up_to_a_power_of_two_of_at_least_two() {
        for (asked, got) in [(0, 2), (1, 2), (2, 2), (3, 4), (4, 4), (5, 8), (1000, 1024)] {
            let (p, c) = channel::<u8>(asked);
            assert_eq!((p.capacity(), c.capacity()), (got, got), "asked {asked}");
            assert_eq!(p.free_slots(), got);
        }
    }

    #[test]
    #[should_panic(expected = "capacity overflows")]
    fn capacity_that_cannot_round_up_panics() {
        let _ = channel::<()>(usize::MAX);
    }

    #[test]
    fn push_until_full_hands_the_value_back() {
        let (mut p, mut c) = channel(5);
        for i in 0..8 {
            assert_eq!(p.free_slots(), 8 - i);
            p.push(format!("v{i}")).unwrap();
        }
        assert_eq!(p.free_slots(), 0);
        assert_eq!(p.push("extra".to_string()), Err("extra".to_string()));
        assert_eq!(c.len(), 8);
        assert_eq!(c.pop().as_deref(), Some("v0"));
        assert_eq!(p.free_slots(), 1);
        p.push("v8".to_string()).unwrap();
        assert_eq!(p.push("extra".to_string()), Err("extra".to_string()));
        let rest: Vec<_> = std::iter::from_fn(|| c.pop()).collect();
        assert_eq!(rest, (1..9).map(|i| format!("v{i}")).collect::<Vec<_>>());
    }

    #[test]
    fn fifo_len_and_is_empty() {
        let (mut p, mut c) = channel(4);
        assert!(c.is_empty());
        assert_eq!(c.len(), 0);
        assert_eq!(c.pop(), None);
        p.push(1).unwrap();
        p.push(2).unwrap();
        assert!(!c.is_empty());
        assert_eq!(c.len(), 2);
        assert_eq!(c.pop(), Some(1));
        p.push(3).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c.pop(), Some(2));
        assert_eq!(c.pop(), Some(3));
        assert_eq!(c.pop(), None);
        assert!(c.is_empty());
    }

    /// Pushes and pops `rounds` times with varying fill levels, checking order.
    fn wrap_many_times(mut p: Producer<u64>, mut c: Consumer<u64>, rounds: u64) {
        let cap = p.capacity() as u64;
        let (mut next_in, mut next_out) = (0u64, 0u64);
        for round in 0..rounds {
            let fill = (round % (cap + 1)).min(p.free_slots() as u64);
            for _ in 0..fill {
                p.push(next_in).unwrap();
                next_in += 1;
            }
            if next_in - next_out == cap {
                assert_eq!(p.push(u64::MAX), Err(u64::MAX));
            }
            assert_eq!(c.len() as u64, next_in - next_out);
            let take = if round % 2 == 0 {
                next_in - next_out
            } else {
                fill / 2 + 1
            };
            for _ in 0..take {
                match c.pop() {
                    Some(v) => {
                        assert_eq!(v, next_out);
                        next_out += 1;
                    }
                    None => assert_eq!(next_out, next_in),
                }
            }
        }
        while let Some(v) = c.pop() {
            assert_eq!(v, next_out);
            next_out += 1;
        }
        assert_eq!(next_out, next_in);
        assert!(
            next_in > 10 * cap,
            "the ring should have wrapped many times"
        );
    }

    #[test]
    fn wraps_around_the_slots_many_times() {
        let (p, c) = channel(8);
        wrap_many_times(p, c, 1_000);
    }

    #[test]
    fn wraps_around_usize_max_of_the_indices() {
        let (p, c) = with_start_index(8, usize::MAX - 20);
        wrap_many_times(p, c, 100);
        let (mut p, mut c) = with_start_index(4, usize::MAX - 1);
        for i in 0..4 {
            p.push(i).unwrap();
        }
        assert_eq!(p.push(9), Err(9));
        assert_eq!(c.len(), 4);
        assert_eq!(p.free_slots(), 0);
        let mut got = Vec::new();
        assert_eq!(c.pop_batch(10, |v| got.push(v)), 4);
        assert_eq!(got, [0, 1, 2, 3]);
        assert!(c.is_empty());
    }

    #[test]
    fn pop_batch_takes_at_most_max_in_order() {
        let (mut p, mut c) = channel(8);
        let mut got = Vec::new();
        assert_eq!(c.pop_batch(4, |v| got.push(v)), 0);
        for i in 0..6 {
            p.push(i).unwrap();
        }
        assert_eq!(c.pop_batch(4, |v| got.push(v)), 4);
        assert_eq!(got, [0, 1, 2, 3]);
        assert_eq!(p.free_slots(), 6, "the batch published its head");
        assert_eq!(c.pop_batch(0, |v| got.push(v)), 0);
        assert_eq!(c.pop_batch(4, |v| got.push(v)), 2);
        assert_eq!(got, [0, 1, 2, 3, 4, 5]);
    }

    fn stress(capacity: usize, batch: Option<usize>) {
        let (mut p, mut c) = channel::<u64>(capacity);
        let producer = thread::spawn(move || {
            for i in 0..STRESS_ITEMS {
                let mut value = i;
                while let Err(back) = p.push(value) {
                    value = back;
                    spin_loop();
                }
            }
        });
        let mut expected = 0u64;
        while expected < STRESS_ITEMS {
            match batch {
                None => match c.pop() {
                    Some(v) => {
                        assert_eq!(v, expected);
                        expected += 1;
                    }
                    None => spin_loop(),
                },
                Some(max) => {
                    let n = c.pop_batch(max, |v| {
                        assert_eq!(v, expected);
                        expected += 1;
                    });
                    if n == 0 {
                        spin_loop();
                    }
                }
            }
        }
        producer.join().unwrap();
        assert_eq!(c.pop(), None);
        assert!(c.is_closed());
    }

    #[test]
    fn cross_thread_stress_pop() {
        stress(1024, None);
    }

    #[test]
    fn cross_thread_stress_pop_batch() {
        stress(1024, Some(64));
    }

    #[test]
    fn cross_thread_stress_tiny_ring() {
        stress(2, Some(3));
    }

    /// Counts its drops in a shared counter.
    struct Counted(Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn drop_accounting(consumer_first: bool, start: usize) {
        let drops = Arc::new(AtomicUsize::new(0));
        let (mut p, mut c) = with_start_index(4, start);
        // Wrap the slots once so the leftovers straddle the end of the slice.
        for _ in 0..3 {
            p.push(Counted(drops.clone())).ok().unwrap();
            drop(c.pop().unwrap());
        }
        assert_eq!(drops.load(Ordering::Relaxed), 3);
        for _ in 0..4 {
            p.push(Counted(drops.clone())).ok().unwrap();
        }
        let rejected = p.push(Counted(drops.clone())).err().unwrap();
        drop(rejected);
        assert_eq!(drops.load(Ordering::Relaxed), 4);
        let popped = c.pop().unwrap();
        assert_eq!(c.pop_batch(1, drop), 1);
        assert_eq!(drops.load(Ordering::Relaxed), 5);
        // Two left in the ring, one held outside it.
        if consumer_first {
            drop(c);
            assert_eq!(drops.load(Ordering::Relaxed), 5);
            drop(p);
        } else {
            drop(p);
            assert_eq!(drops.load(Ordering::Relaxed), 5);
            drop(c);
        }
        assert_eq!(drops.load(Ordering::Relaxed), 7);
        drop(popped);
        assert_eq!(drops.load(Ordering::Relaxed), 8);
    }

    #[test]
    fn leftovers_dropped_once_consumer_dropped_first() {
        drop_accounting(true, 0);
        drop_accounting(true, usize::MAX - 2);
    }

    #[test]
    fn leftovers_dropped_once_producer_dropped_first() {
        drop_accounting(false, 0);
        drop_accounting(false, usize::MAX - 2);
    }

    #[test]
    fn leftovers_dropped_once_across_threads() {
        let drops = Arc::new(AtomicUsize::new(0));
        let (mut p, c) = channel(16);
        for _ in 0..10 {
            p.push(Counted(drops.clone())).ok().unwrap();
        }
        let consumer = thread::spawn(move || {
            let mut c = c;
            for _ in 0..4 {
                drop(c.pop().unwrap());
            }
            c
        });
        let c = consumer.join().unwrap();
        thread::spawn(move || drop(c)).join().unwrap();
        assert_eq!(drops.load(Ordering::Relaxed), 4);
        drop(p);
        assert_eq!(drops.load(Ordering::Relaxed), 10);
    }

    #[test]
    fn panic_inside_pop_batch_does_not_double_drop() {
        let drops = Arc::new(AtomicUsize::new(0));
        let (mut p, mut c) = channel(8);
        for _ in 0..6 {
            p.push(Counted(drops.clone())).ok().unwrap();
        }
        let mut seen = 0;
        let result = catch_unwind(AssertUnwindSafe(|| {
            c.pop_batch(5, |item| {
                seen += 1;
                drop(item);
                if seen == 3 {
                    panic!("boom");
                }
            })
        }));
        assert!(result.is_err());
        assert_eq!(drops.load(Ordering::Relaxed), 3);
        assert_eq!(c.len(), 3);
        assert_eq!(p.free_slots(), 5, "the head was published while unwinding");
        drop((p, c));
        assert_eq!(drops.load(Ordering::Relaxed), 6);
    }

    #[test]
    fn zero_sized_items() {
        let (mut p, mut c) = channel::<()>(2);
        p.push(()).unwrap();
        p.push(()).unwrap();
        assert_eq!(p.push(()), Err(()));
        assert_eq!(c.pop_batch(8, |()| {}), 2);
        assert_eq!(c.pop(), None);
    }

    #[test]
    fn producer_sees_consumer_closed() {
        let (mut p, c) = channel(2);
        assert!(!p.is_closed());
        drop(c);
        assert!(p.is_closed());
        // Pushing into a closed ring is allowed while there is room; the ring
        // drops the items.
        p.push(1).unwrap();
    }

    #[test]
    fn consumer_sees_producer_closed_and_drains() {
        let (mut p, mut c) = channel(4);
        p.push(1).unwrap();
        p.push(2).unwrap();
        assert!(!c.is_closed());
        thread::spawn(move || drop(p)).join().unwrap();
        assert!(c.is_closed());
        assert_eq!(c.pop(), Some(1));
        assert_eq!(c.pop(), Some(2));
        assert_eq!(c.pop(), None);
    }

    #[test]
    fn ends_are_send_but_not_sync() {
        fn assert_send<T: Send>() {}
        assert_send::<Producer<Vec<u8>>>();
        assert_send::<Consumer<Vec<u8>>>();
        assert_send::<Arc<ThreadWaker>>();

        // `<X as NotSyncProbe<_>>` is ambiguous, and fails to compile, exactly
        // when `X: Sync` (the trick behind static_assertions' `assert_not_impl_any`).
        trait NotSyncProbe<A> {
            fn probe() {}
        }
        impl<X: ?Sized> NotSyncProbe<()> for X {}
        struct IfSync;
        impl<X: ?Sized + Sync> NotSyncProbe<IfSync> for X {}
        <Producer<u8> as NotSyncProbe<_>>::probe();
        <Consumer<u8> as NotSyncProbe<_>>::probe();
    }

    #[test]
    fn wake_when_not_parked_does_nothing() {
        let waker = ThreadWaker::current();
        assert!(!waker.wake());
        waker.prepare_park();
        assert!(waker.wake(), "first wake of a parked period unparks");
        assert!(!waker.wake(), "later wakes of the same period do not");
        waker.clear_park();
        assert!(!waker.wake());
        // Consume the token left by the one unpark, so it cannot leak into other
        // code on this thread.
        waker.park(Some(Duration::from_millis(1)));
    }

    #[test]
    fn parked_consumer_is_woken_promptly_every_time() {
        const ROUNDS: u64 = if cfg!(miri) { 20 } else { 1_000 };
        const PARK_TIMEOUT: Duration = Duration::from_secs(10);
        // Far below the timeout: exceeding it means a wake-up was lost.
        const PROMPT: Duration = Duration::from_secs(2);

        let (mut p, mut c) = channel::<u64>(4);
        let (ack_p, mut ack_c) = channel::<u64>(4);
        let (waker_tx, waker_rx) = std::sync::mpsc::channel();

        let consumer = thread::spawn(move || {
            let mut ack_p = ack_p;
            let waker = ThreadWaker::current();
            waker_tx.send(Arc::clone(&waker)).unwrap();
            let (mut parks, mut rechecks_caught) = (0u64, 0u64);
            let mut slowest = Duration::ZERO;
            let mut expected = 0;
            while expected < ROUNDS {
                if let Some(v) = c.pop() {
                    assert_eq!(v, expected);
                    expected += 1;
                    ack_p.push(v).unwrap();
                    continue;
                }
                // Jitter on this side too, so the producer's push also lands
                // between the empty pop, `prepare_park`, the re-check and `park`.
                (0..(expected % 53) * 4).for_each(|_| spin_loop());
                waker.prepare_park();
                if !c.is_empty() {
                    rechecks_caught += 1;
                } else {
                    let start = Instant::now();
                    waker.park(Some(PARK_TIMEOUT));
                    let slept = start.elapsed();
                    assert!(slept < PROMPT, "round {expected}: parked {slept:?}");
                    parks += 1;
                    slowest = slowest.max(slept);
                }
                waker.clear_park();
            }
            (parks, rechecks_caught, slowest)
        });

        let waker = waker_rx.recv().unwrap();
        let mut wakes = 0u64;
        for i in 0..ROUNDS {
            // Vary the timing so the push lands before, during and after the
            // consumer's prepare/re-check/park sequence.
            match i % 4 {
                0 => {}
                1 | 2 => (0..(i % 61) * 4).for_each(|_| spin_loop()),
                _ => thread::sleep(Duration::from_micros(50)),
            }
            p.push(i).unwrap();
            wakes += u64::from(waker.wake());
            // Wait for the consumer to take it before the next round.
            loop {
                match ack_c.pop() {
                    Some(v) => {
                        assert_eq!(v, i);
                        break;
                    }
                    None => spin_loop(),
                }
            }
        }
        let (parks, rechecks_caught, slowest) = consumer.join().unwrap();
        assert!(wakes <= ROUNDS);
        // Not an invariant, but the test is pointless if the consumer never parked.
        assert!(parks > 0, "the consumer never parked");
        eprintln!(
            "waker: {ROUNDS} rounds, {parks} parks, {wakes} unparks, \
             {rechecks_caught} caught by the re-check, slowest park {slowest:?}"
        );
    }
}
