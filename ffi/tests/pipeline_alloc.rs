//! No heap allocation per step of the pipelined sharded rows client through the C ABI in
//! steady state (pull, prefetch of the next batch, push not waited for, two PS tasks),
//! counted by this test binary's global allocator across the whole process: the C calls
//! add nothing to what the Rust pipeline allocates, which is nothing. The rows are checked
//! on every step, so the allocation-free path is also the correct one.

use starwire_ffi::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::{c_char, CStr, CString};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counts allocation calls (`alloc`, `alloc_zeroed`, `realloc`) of the whole process.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; counting has no
// effect on the memory returned.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
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

const F32: u8 = 10;
const DIM: usize = 16;
const ROW_BYTES: usize = DIM * 4;
const UNIVERSE: u64 = 1000;
const TABLE: u32 = 1;

fn ok(r: sw_result) {
    // SAFETY: `sw_last_error` returns a NUL-terminated string valid until the next call.
    let msg = unsafe { CStr::from_ptr(sw_last_error()) };
    assert_eq!(r, sw_result::SW_OK, "{msg:?}");
}

fn runtime(listen: bool, table: *const sw_table) -> *mut sw_runtime {
    let ids = [TABLE];
    let tables = [table];
    let o = sw_runtime_options {
        job: if listen { c"ps" } else { c"worker" }.as_ptr(),
        task_index: 0,
        setting_names: ptr::null(),
        setting_values: ptr::null(),
        settings: 0,
        use_env: true,
        listen: if listen {
            c"127.0.0.1:0".as_ptr()
        } else {
            ptr::null()
        },
        service: ptr::null(),
        allocator: ptr::null(),
        handler_threads: 0,
        table_ids: ids.as_ptr(),
        tables: tables.as_ptr(),
        n_tables: usize::from(listen),
    };
    let mut rt = ptr::null_mut();
    ok(sw_runtime_new(&o, &mut rt));
    rt
}

/// Step `t`'s batch: 100 distinct ids (50 on each PS under `mod`), each twice.
fn batch(t: u64, out: &mut [u64; 200]) {
    for i in 0..100u64 {
        let id = (t * 37 + i * 7) % UNIVERSE;
        out[i as usize] = id;
        out[199 - i as usize] = id;
    }
}

/// Allocations over 500 steps at staleness `s` (after 200 to warm up).
fn steps(s: u32) -> u64 {
    // Two PS tasks whose tables hold every id at zero; SGD with rate 0, so every row stays
    // zero and each pull can be checked.
    let zeros = sw_init {
        kind: sw_init_kind::SW_INIT_ZEROS as u32,
        scale: 0.0,
        seed: 0,
    };
    let frozen = sw_optimizer {
        kind: sw_optimizer_kind::SW_OPTIMIZER_SGD as u32,
        lr: 0.0,
        initial_accumulator: 0.0,
    };
    let ps: Vec<*mut sw_runtime> = (0..2)
        .map(|_| {
            let mut t = ptr::null_mut();
            ok(sw_mem_table_new(DIM, zeros, frozen, &mut t));
            let rt = runtime(true, t);
            sw_table_free(t);
            rt
        })
        .collect();
    let addrs: Vec<CString> = ps
        .iter()
        .map(|&rt| CString::new(format!("127.0.0.1:{}", sw_runtime_port(rt))).unwrap())
        .collect();
    let peers: Vec<*const c_char> = addrs.iter().map(|a| a.as_ptr()).collect();
    let worker = runtime(false, ptr::null());
    let mut c = ptr::null_mut();
    ok(sw_client_new(worker, 64, &mut c));
    let settings = sw_pipeline_settings {
        staleness: s,
        max_pushes_in_flight: 2,
        timeout_ms: 20_000,
        ..sw_pipeline_settings_default()
    };
    let part = sw_partition {
        kind: sw_partition_kind::SW_PARTITION_MOD as u32,
        vocab: 0,
    };
    let dims = [DIM as u64];
    let mut p = ptr::null_mut();
    ok(sw_pipeline_new(
        c,
        peers.as_ptr(),
        2,
        part,
        TABLE,
        F32,
        dims.as_ptr(),
        1,
        settings,
        &mut p,
    ));
    let mut report = sw_pipeline_report::default();
    // Every row created (a pull of an id the table does not have creates its row).
    let all: Vec<u64> = (0..UNIVERSE).collect();
    let mut rows = vec![1u8; all.len() * ROW_BYTES];
    ok(sw_pipeline_pull(
        p,
        c,
        all.as_ptr(),
        all.len(),
        rows.as_mut_ptr().cast(),
        rows.len() as u64,
        &mut report,
    ));
    let mut rows = vec![1u8; 200 * ROW_BYTES];
    let grads: Vec<u8> = [0.25f32; 200 * DIM]
        .iter()
        .flat_map(|g| g.to_le_bytes())
        .collect();
    let (mut ids, mut next) = ([0u64; 200], [0u64; 200]);
    let mut most_in_flight = 0;
    let mut run = |from: u64, n: u64| {
        batch(from, &mut ids);
        ok(sw_pipeline_prefetch(p, c, ids.as_ptr(), 200, &mut report));
        for t in from..from + n {
            rows.fill(1);
            ok(sw_pipeline_pull(
                p,
                c,
                ids.as_ptr(),
                200,
                rows.as_mut_ptr().cast(),
                rows.len() as u64,
                &mut report,
            ));
            assert_eq!((report.unique, report.missing), (100, 0));
            assert!(rows.iter().all(|&b| b == 0));
            batch(t + 1, &mut next);
            ok(sw_pipeline_prefetch(p, c, next.as_ptr(), 200, &mut report));
            ok(sw_pipeline_push(
                p,
                c,
                ids.as_ptr(),
                200,
                grads.as_ptr().cast(),
                grads.len() as u64,
                &mut report,
            ));
            assert_eq!(report.rows_sent, 100);
            most_in_flight = most_in_flight.max(report.pushes_in_flight);
            ids = next;
        }
    };
    run(0, 200);
    let before = ALLOCS.load(Ordering::Relaxed);
    run(200, 500);
    let n = ALLOCS.load(Ordering::Relaxed) - before;
    ok(sw_pipeline_flush(p, c, &mut report));
    assert!(most_in_flight >= 1);
    sw_pipeline_free(p);
    sw_client_free(c);
    sw_runtime_free(worker);
    for rt in ps {
        sw_runtime_free(rt);
    }
    n
}

#[test]
fn c_steps_allocate_nothing_in_steady_state() {
    for s in [0, 1, 2] {
        assert_eq!(steps(s), 0, "allocations over 500 steps at staleness {s}");
    }
}
