//! A global allocator that counts allocation calls (`alloc`, `alloc_zeroed`, `realloc`) of
//! the whole process, for the tests that hold a path to zero allocations per request or
//! step. Included with `#[path]` by the tests that use it (a test binary has one global
//! allocator).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

pub struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's allocation calls (const-initialized, no destructor: reading and
    /// bumping it allocates nothing).
    static MINE: Cell<u64> = const { Cell::new(0) };
}

/// Allocation calls so far, over the whole process.
pub fn allocations() -> u64 {
    ALLOCS.load(Ordering::Relaxed)
}

/// Allocation calls so far by the calling thread only: for code that runs on one thread,
/// untouched by what the test harness's own threads allocate meanwhile.
#[allow(dead_code)]
pub fn thread_allocations() -> u64 {
    MINE.with(Cell::get)
}

fn count() {
    ALLOCS.fetch_add(1, Ordering::Relaxed);
    // Not available while the thread is being torn down: then only the total counts.
    let _ = MINE.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every call is forwarded unchanged to the system allocator; counting has no
// effect on the memory returned.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.realloc(p, l, new) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(p, l) }
    }
}
