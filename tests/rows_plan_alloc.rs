//! No heap allocation per step in steady state: once a `Plan` has planned a batch, planning
//! another batch of the same length (other ids, spread otherwise over the shards) and
//! scattering and merging every shard's rows allocates nothing; neither do a `MemTable`'s
//! pull and push of rows it already has. Counted by this binary's global allocator, on the
//! test's own thread only (the harness's threads allocate at any time).

use starwire::rows::{Init, MemTable, Optimizer};
use starwire::rows::{Partition, Plan};
use starwire::DType;
use starwire::Table;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counts allocation calls (`alloc`, `alloc_zeroed`, `realloc`) of threads that enabled
/// counting.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNT_HERE: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    // `try_with`: a thread being torn down still allocates, after its locals are gone.
    if COUNT_HERE.try_with(Cell::get).unwrap_or(false) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
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

/// Allocations made by `f` on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    let before = ALLOCS.load(Ordering::Relaxed);
    COUNT_HERE.with(|c| c.set(true));
    f();
    COUNT_HERE.with(|c| c.set(false));
    ALLOCS.load(Ordering::Relaxed) - before
}

const SHARDS: usize = 8;
const BATCH: usize = 4096;
const DIM: usize = 16;
const ROW_BYTES: usize = DIM * 4;
/// Where the step's ids start: past the warm-up's, on shard 0 of `Partition::Mod`.
const FAR: u64 = 1 << 20;

#[test]
fn steady_state_step_allocates_nothing() {
    // Warm-up: many repeats, spread over every shard.
    let warm: Vec<u64> = (0..BATCH as u64).map(|i| i % 300).collect();
    // The step: the same length, all distinct, all on shard 3: every per-shard part is
    // larger than in the warm-up. None is in the warm-up.
    let step: Vec<u64> = (0..BATCH as u64)
        .map(|i| FAR + i * SHARDS as u64 + 3)
        .collect();

    let mut plan = Plan::new(SHARDS, Partition::Mod).unwrap();
    let init = Init::Uniform {
        scale: 1.0,
        seed: 5,
    };
    let table = MemTable::new(DIM, init, Optimizer::Sgd { lr: 1.0 });
    let mut rows = vec![0u8; BATCH * ROW_BYTES];
    let grads: Vec<u8> = (0..BATCH * DIM)
        .flat_map(|_| 1.0f32.to_le_bytes())
        .collect();
    let mut block = vec![0u8; BATCH * ROW_BYTES];
    let mut missing = Vec::new();

    let mut step_once = |plan: &mut Plan, ids: &[u64]| {
        plan.build(ids).unwrap();
        for s in 0..SHARDS {
            let n = plan.ids(s).len() * ROW_BYTES;
            assert!(table
                .pull(plan.ids(s), &mut block[..n], &mut missing)
                .is_ok());
            plan.scatter(s, &block[..n], ROW_BYTES, &mut rows).unwrap();
            plan.merge(s, DType::F32, &grads, ROW_BYTES, &mut block[..n])
                .unwrap();
            assert!(table.push(plan.ids(s), &block[..n]).is_ok());
        }
    };
    // The plan's one warm-up: another batch of the same length.
    step_once(&mut plan, &warm);
    // The table creates the step's rows beforehand, without the plan.
    let zeros = vec![0u8; BATCH * ROW_BYTES];
    assert!(table.push(&step, &zeros).is_ok());

    let n = allocations(|| step_once(&mut plan, &step));
    assert_eq!(n, 0, "allocations in a steady-state step");

    // The counted step was the real thing: every position got its id's row, and each row
    // one push of ones.
    assert_eq!(plan.ids(3).len(), BATCH);
    assert!(missing.is_empty());
    for (pos, &id) in step.iter().enumerate() {
        let row = &rows[pos * ROW_BYTES..][..ROW_BYTES];
        for (k, v) in row.chunks(4).enumerate() {
            assert_eq!(f32::from_le_bytes(v.try_into().unwrap()), init.value(id, k));
        }
        if pos % 512 == 0 {
            let want: Vec<f32> = (0..DIM).map(|k| init.value(id, k) - 1.0).collect();
            assert_eq!(table.get(id), Some(want));
        }
    }
    // And counting works: a fresh vector is seen.
    assert_eq!(allocations(|| drop(std::hint::black_box(vec![1u8; 10]))), 1);
}
