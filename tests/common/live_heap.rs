//! A global allocator that counts the heap bytes alive in the process, for tests that
//! check memory does not grow: unlike RSS, the count does not move with the allocator's
//! caching, fragmentation or first touches of reserved capacity, and it works the same
//! under AddressSanitizer. Included with `#[path]` by the tests that use it (a test binary
//! has one global allocator).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

pub struct LiveHeap;

static LIVE: AtomicU64 = AtomicU64::new(0);

/// Heap bytes allocated and not yet freed, over the whole process.
pub fn live_bytes() -> u64 {
    LIVE.load(Ordering::Relaxed)
}

// SAFETY: every call is forwarded unchanged to the system allocator; counting has no effect
// on the memory returned.
unsafe impl GlobalAlloc for LiveHeap {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as u64, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as u64, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as u64, Ordering::Relaxed);
        LIVE.fetch_sub(l.size() as u64, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.realloc(p, l, new) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as u64, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(p, l) }
    }
}
