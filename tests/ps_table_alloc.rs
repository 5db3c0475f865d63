//! No heap allocation on a `PsTable`'s row path: pulls and pushes of 1,000 random ids in
//! steady state, under each consistency and element format, and also while rows are created
//! and the index grows, counted by this test binary's global allocator on the thread that
//! calls the table (the test harness starts other tests' threads meanwhile: their
//! allocations are not the table's). Values are checked as it goes, so the
//! allocation-free path is also the correct one.

use starwire::rows::ps::{Consistency, Float, Init, Optimizer, PsTable, PsTableBuilder};
use starwire::{Status, Table};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Counts allocation calls (`alloc`, `alloc_zeroed`, `realloc`) of the threads that count.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Whether this thread's allocations are counted.
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    if COUNTED.try_with(Cell::get).unwrap_or(false) {
        count();
    }
}

/// Allocations `f` makes on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    let before = ALLOCS.load(Ordering::Relaxed);
    COUNTED.with(|c| c.set(true));
    f();
    COUNTED.with(|c| c.set(false));
    ALLOCS.load(Ordering::Relaxed) - before
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

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocation-counting tests must not overlap: the count is per process.
static SERIAL: Mutex<()> = Mutex::new(());

const ROWS: u64 = 20_000;
const BATCH: usize = 1000;

/// A fixed pseudo-random sequence of batches of ids in `0..ROWS`.
fn batches(n: usize) -> Vec<Vec<u64>> {
    let mut x = 0x1234_5678_9abc_def0u64;
    (0..n)
        .map(|_| {
            (0..BATCH)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % ROWS
                })
                .collect()
        })
        .collect()
}

/// Allocations over 200 pulls and 200 pushes of 1,000 ids each, after every row exists.
fn steady_state(b: PsTableBuilder) -> u64 {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t = b.huge_pages(false).build().unwrap();
    let all: Vec<u64> = (0..ROWS).collect();
    let rb = t.row_bytes();
    let mut out = vec![0u8; BATCH * rb];
    let mut warm = vec![0u8; all.len() * rb];
    let mut missing = Vec::with_capacity(BATCH);
    assert_eq!(t.pull(&all, &mut warm, &mut missing), Status::Ok);
    let grads = vec![0u8; BATCH * rb];
    let batches = batches(200);
    // A first pass warms up whatever is lazy.
    for ids in &batches[..20] {
        t.pull(ids, &mut out, &mut missing);
        t.push(ids, &grads);
    }
    let n = allocations(|| {
        for ids in &batches {
            assert_eq!(t.pull(ids, &mut out, &mut missing), Status::Ok);
            assert!(missing.is_empty());
            assert_eq!(t.push(ids, &grads), Status::Ok);
        }
    });
    assert_eq!(t.len(), ROWS);
    n
}

#[test]
fn hogwild_f32_adagrad() {
    let b = PsTable::builder(16).optimizer(Optimizer::Adagrad {
        lr: 0.1,
        initial_accumulator: 0.1,
    });
    assert_eq!(steady_state(b), 0);
}

#[test]
fn per_row_bf16_served_as_f32_adam() {
    let b = PsTable::builder(16)
        .consistency(Consistency::PerRow)
        .stored_as(Float::Bf16)
        .optimizer(Optimizer::adam(0.01));
    assert_eq!(steady_state(b), 0);
}

#[test]
fn with_eviction_stamps_admission_and_hot_ids() {
    let b = PsTable::builder(8)
        .stored_as(Float::F16)
        .served_as(Float::F16)
        .evict_untouched(100)
        .admit_after(2)
        .hot_sample_every(1);
    // Admission: the warm-up pull is each id's first sighting; the second creates it.
    assert_eq!(steady_state_admitted(b), 0);
}

/// `steady_state` for a table that admits at the second sighting.
fn steady_state_admitted(b: PsTableBuilder) -> u64 {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t = b.huge_pages(false).build().unwrap();
    let all: Vec<u64> = (0..ROWS).collect();
    let rb = t.row_bytes();
    let mut warm = vec![0u8; all.len() * rb];
    let mut missing = Vec::with_capacity(all.len());
    t.pull(&all, &mut warm, &mut missing);
    // Almost all missing (a sketch admits a few ids early: counts are approximate).
    assert!(missing.len() > ROWS as usize * 99 / 100);
    missing.clear();
    t.pull(&all, &mut warm, &mut missing);
    assert!(missing.is_empty());
    let mut out = vec![0u8; BATCH * rb];
    let grads = vec![0u8; BATCH * rb];
    let batches = batches(200);
    let n = allocations(|| {
        for ids in &batches {
            assert_eq!(t.pull(ids, &mut out, &mut missing), Status::Ok);
            assert_eq!(t.push(ids, &grads), Status::Ok);
            t.advance_clock();
        }
    });
    assert!(missing.is_empty());
    n
}

/// Creating rows, and the index builds and copies that come with them, allocate nothing
/// either (slots and index levels are arena memory, committed as needed).
#[test]
fn creating_rows_and_growing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t = PsTable::builder(4)
        .init(Init::Normal { std: 0.1, seed: 2 })
        .huge_pages(false)
        .build()
        .unwrap();
    let mut out = vec![0u8; BATCH * t.row_bytes()];
    let mut missing = Vec::with_capacity(BATCH);
    let ids: Vec<u64> = (0..300_000u64).map(|i| i * 7 + 3).collect();
    let n = allocations(|| {
        for batch in ids.chunks(BATCH) {
            assert_eq!(t.pull(batch, &mut out, &mut missing), Status::Ok);
        }
    });
    assert!(missing.is_empty());
    let m = t.metrics();
    assert_eq!((m.rows, m.refused), (300_000, 0));
    assert!(m.index_builds >= 5);
    assert_eq!(n, 0);
}
