//! The pipelined sharded rows client over the C ABI as C calls it, two PS tasks on
//! loopback: staleness 0 gives the rows of the synchronous sharded client bit for bit;
//! staleness 2 delivers rows while pushes are unanswered; a push that failed after its call
//! returned (refused, a PS stopped, a PS killed) fails the next call with the PS's task and
//! status, and is reported once.

use starwire_ffi::*;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const F32: u8 = 10;
const DIM: usize = 4;
const ROW_BYTES: usize = DIM * 4;
const TABLE: u32 = 3;

fn text(p: *const c_char) -> String {
    // SAFETY: the `sw_last_error*` strings are NUL-terminated and valid until the next call.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn last_error() -> String {
    text(sw_last_error())
}

fn ok(r: sw_result) {
    assert_eq!(r, sw_result::SW_OK, "{}", last_error());
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// A runtime of `job` task `index`, listening on loopback when `listen`, serving `table` as
/// table [`TABLE`] with handlers on `handler_threads` pool threads (0: on its loop); no
/// connect retries.
fn runtime(
    job: &CStr,
    index: u32,
    listen: bool,
    table: Option<*const sw_table>,
    handler_threads: u32,
) -> *mut sw_runtime {
    let names = [c"STARWIRE_CONNECT_RETRIES".as_ptr()];
    let values = [c"0".as_ptr()];
    let ids = [TABLE];
    let tables = [table.unwrap_or(ptr::null())];
    let o = sw_runtime_options {
        job: job.as_ptr(),
        task_index: index,
        setting_names: names.as_ptr(),
        setting_values: values.as_ptr(),
        settings: 1,
        use_env: true,
        listen: if listen {
            c"127.0.0.1:0".as_ptr()
        } else {
            ptr::null()
        },
        service: ptr::null(),
        allocator: ptr::null(),
        handler_threads,
        table_ids: ids.as_ptr(),
        tables: tables.as_ptr(),
        n_tables: usize::from(table.is_some()),
    };
    let mut rt = ptr::null_mut();
    ok(sw_runtime_new(&o, &mut rt));
    rt
}

/// A PS task: its runtime and the peer text a worker names it by (`ps:i@127.0.0.1:port`).
struct Ps {
    rt: *mut sw_runtime,
    peer: CString,
}

/// PS tasks `ps:0`, `ps:1`, ... serving `tables` (each handle freed: the runtime keeps its
/// own reference).
fn cluster(tables: Vec<*mut sw_table>, handler_threads: u32) -> Vec<Ps> {
    tables
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let rt = runtime(c"ps", i as u32, true, Some(t.cast_const()), handler_threads);
            sw_table_free(t);
            let port = sw_runtime_port(rt);
            let peer = CString::new(format!("ps:{i}@127.0.0.1:{port}")).unwrap();
            Ps { rt, peer }
        })
        .collect()
}

fn free(cluster: Vec<Ps>) {
    for ps in cluster {
        sw_runtime_free(ps.rt);
    }
}

const MOD: sw_partition = sw_partition {
    kind: sw_partition_kind::SW_PARTITION_MOD as u32,
    vocab: 0,
};

fn settings(staleness: u32, max_pushes_in_flight: u32, timeout_ms: u64) -> sw_pipeline_settings {
    sw_pipeline_settings {
        staleness,
        max_pushes_in_flight,
        timeout_ms,
        ..sw_pipeline_settings_default()
    }
}

fn pipeline(c: *mut sw_client, ps: &[Ps], s: sw_pipeline_settings) -> *mut sw_pipeline {
    let peers: Vec<*const c_char> = ps.iter().map(|p| p.peer.as_ptr()).collect();
    let dims = [DIM as u64];
    let mut p = ptr::null_mut();
    ok(sw_pipeline_new(
        c,
        peers.as_ptr(),
        peers.len(),
        MOD,
        TABLE,
        F32,
        dims.as_ptr(),
        1,
        s,
        &mut p,
    ));
    p
}

fn sharded(ps: &[Ps]) -> *mut sw_sharded {
    let peers: Vec<*const c_char> = ps.iter().map(|p| p.peer.as_ptr()).collect();
    let dims = [DIM as u64];
    let mut s = ptr::null_mut();
    ok(sw_sharded_new(
        peers.as_ptr(),
        peers.len(),
        MOD,
        TABLE,
        F32,
        dims.as_ptr(),
        1,
        &mut s,
    ));
    s
}

/// The calls of a pipeline through its client, as `Result`s of their reports.
struct Pipe {
    p: *mut sw_pipeline,
    c: *mut sw_client,
}

impl Pipe {
    fn done(r: sw_result, report: sw_pipeline_report) -> Result<sw_pipeline_report, sw_result> {
        if r == sw_result::SW_OK {
            Ok(report)
        } else {
            Err(r)
        }
    }

    fn prefetch(&self, ids: &[u64]) -> Result<sw_pipeline_report, sw_result> {
        let mut report = sw_pipeline_report::default();
        let r = sw_pipeline_prefetch(self.p, self.c, ids.as_ptr(), ids.len(), &mut report);
        Self::done(r, report)
    }

    fn pull(&self, ids: &[u64], out: &mut [u8]) -> Result<sw_pipeline_report, sw_result> {
        let mut report = sw_pipeline_report::default();
        let r = sw_pipeline_pull(
            self.p,
            self.c,
            ids.as_ptr(),
            ids.len(),
            out.as_mut_ptr().cast(),
            out.len() as u64,
            &mut report,
        );
        Self::done(r, report)
    }

    fn push(&self, ids: &[u64], grads: &[u8]) -> Result<sw_pipeline_report, sw_result> {
        let mut report = sw_pipeline_report::default();
        let r = sw_pipeline_push(
            self.p,
            self.c,
            ids.as_ptr(),
            ids.len(),
            grads.as_ptr().cast(),
            grads.len() as u64,
            &mut report,
        );
        Self::done(r, report)
    }

    fn flush(&self) -> Result<sw_pipeline_report, sw_result> {
        let mut report = sw_pipeline_report::default();
        let r = sw_pipeline_flush(self.p, self.c, &mut report);
        Self::done(r, report)
    }

    /// The push failures the last call reported.
    fn failed(&self) -> Vec<sw_push_failure> {
        (0..sw_pipeline_failed_pushes(self.p))
            .map(|i| {
                let mut f = sw_push_failure {
                    step: u64::MAX,
                    shard: usize::MAX,
                    result: sw_result::SW_OK,
                    status: u32::MAX,
                };
                ok(sw_pipeline_failed_push(self.p, i, &mut f));
                f
            })
            .collect()
    }
}

/// `n` batches of `len` ids in `0..universe`, with repeats, from a fixed xorshift.
fn batches(n: usize, len: usize, universe: u64, seed: u64) -> Vec<Vec<u64>> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % universe
                })
                .collect()
        })
        .collect()
}

/// A reference table: rows of DIM f32, uniform in [-0.1, 0.1] from a fixed seed, Adagrad.
fn uniform_adagrad() -> *mut sw_table {
    let init = sw_init {
        kind: sw_init_kind::SW_INIT_UNIFORM as u32,
        scale: 0.1,
        seed: 3,
    };
    let adagrad = sw_optimizer {
        kind: sw_optimizer_kind::SW_OPTIMIZER_ADAGRAD as u32,
        lr: 0.1,
        initial_accumulator: 0.1,
    };
    let mut t = ptr::null_mut();
    ok(sw_mem_table_new(DIM, init, adagrad, &mut t));
    t
}

#[test]
fn staleness_0_steps_give_the_rows_of_the_synchronous_sharded_client() {
    let a = cluster(vec![uniform_adagrad(), uniform_adagrad()], 0);
    let b = cluster(vec![uniform_adagrad(), uniform_adagrad()], 0);
    let worker = runtime(c"worker", 0, false, None, 0);
    let mut c = ptr::null_mut();
    ok(sw_client_new(worker, 64, &mut c));
    let sync = sharded(&a);
    let pipe = Pipe {
        p: pipeline(c, &b, settings(0, 2, 20_000)),
        c,
    };
    let steps = batches(15, 24, 30, 11);
    // A gradient that depends on the rows pulled: any difference in them shows.
    let grad = |rows: &[f32]| -> Vec<u8> {
        let g: Vec<f32> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| r * 0.5 + (i % 7) as f32 * 0.01 - 0.02)
            .collect();
        f32_bytes(&g)
    };
    let mut report = sw_step_report::default();
    pipe.prefetch(&steps[0]).unwrap();
    for (t, ids) in steps.iter().enumerate() {
        let mut want = vec![0u8; ids.len() * ROW_BYTES];
        ok(sw_sharded_pull(
            sync,
            c,
            ids.as_ptr(),
            ids.len(),
            want.as_mut_ptr().cast(),
            want.len() as u64,
            20_000,
            &mut report,
        ));
        let mut got = vec![0xaau8; ids.len() * ROW_BYTES];
        let r = pipe.pull(ids, &mut got).unwrap();
        assert_eq!((r.step, r.may_miss, r.unique), (t as u64, 0, report.unique));
        assert_eq!(got, want, "step {t}: rows differ");
        if let Some(next) = steps.get(t + 1) {
            pipe.prefetch(next).unwrap();
        }
        let g = grad(&to_f32(&got));
        ok(sw_sharded_push(
            sync,
            c,
            ids.as_ptr(),
            ids.len(),
            g.as_ptr().cast(),
            g.len() as u64,
            20_000,
            &mut report,
        ));
        let r = pipe.push(ids, &g).unwrap();
        assert_eq!(r.rows_sent, r.unique);
        assert_eq!(r.pushes_in_flight, 1, "the push just sent is unanswered");
    }
    pipe.flush().unwrap();
    assert_eq!(sw_pipeline_pushes_in_flight(pipe.p), 0);
    assert_eq!(
        (sw_pipeline_steps(pipe.p), sw_pipeline_pushes(pipe.p)),
        (15, 15)
    );
    // The tables of both clusters end equal, bit for bit.
    let all: Vec<u64> = (0..30).collect();
    let other = sharded(&b);
    let (mut x, mut y) = (vec![0u8; 30 * ROW_BYTES], vec![1u8; 30 * ROW_BYTES]);
    for (s, out) in [(sync, &mut x), (other, &mut y)] {
        ok(sw_sharded_pull(
            s,
            c,
            all.as_ptr(),
            all.len(),
            out.as_mut_ptr().cast(),
            out.len() as u64,
            20_000,
            &mut report,
        ));
    }
    assert_eq!(x, y);
    sw_sharded_free(other);
    sw_sharded_free(sync);
    sw_pipeline_free(pipe.p);
    sw_client_free(c);
    sw_runtime_free(worker);
    free(a);
    free(b);
}

/// A PS table on the C side: rows of DIM f32, zero until pushed, SGD with rate 1. It counts
/// the pushes it receives and applies, holds pushes while `hold` is set (at most 20 s), and
/// refuses (`INVALID_ARGUMENT`) a push whose first gradient element is at least 500.
#[derive(Default)]
struct Held {
    rows: Mutex<HashMap<u64, [f32; DIM]>>,
    hold: AtomicBool,
    received: AtomicU64,
    applied: AtomicU64,
}

impl Held {
    fn row(&self, id: u64) -> [f32; DIM] {
        let rows = self.rows.lock().unwrap();
        rows.get(&id).copied().unwrap_or([0.0; DIM])
    }

    /// A table handle serving this (which must outlive every runtime serving it).
    fn table(&'static self) -> *mut sw_table {
        let callbacks = sw_table_callbacks {
            user_data: (self as *const Held).cast_mut().cast(),
            pull: Some(held_pull),
            push: Some(held_push),
        };
        let dims = [DIM as u64];
        let mut t = ptr::null_mut();
        ok(sw_table_new(F32, dims.as_ptr(), 1, &callbacks, &mut t));
        t
    }

    /// Waits until the table has received at least `n` pushes (at most 20 s).
    fn wait_received(&self, n: u64) {
        let give_up = Instant::now() + Duration::from_secs(20);
        while self.received.load(Ordering::SeqCst) < n && Instant::now() < give_up {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(self.received.load(Ordering::SeqCst) >= n);
    }
}

/// Two tables for two PS tasks, alive for the rest of the process (a runtime's threads may
/// still call them if a test fails before freeing it).
fn held() -> [&'static Held; 2] {
    [Box::leak(Box::default()), Box::leak(Box::default())]
}

unsafe extern "C" fn held_pull(
    user: *mut c_void,
    ids: *const u64,
    n: usize,
    out: *mut c_void,
    _byte_len: u64,
    _missing: *mut u32,
    n_missing: *mut usize,
) -> u32 {
    // SAFETY: `user` is the test's `Held`, alive while a runtime serves it; the arrays are
    // starwire's, of the lengths it gives (rows of ROW_BYTES).
    let (held, ids, out) = unsafe {
        *n_missing = 0;
        (
            &*user.cast::<Held>(),
            std::slice::from_raw_parts(ids, n),
            std::slice::from_raw_parts_mut(out.cast::<u8>(), n * ROW_BYTES),
        )
    };
    for (i, &id) in ids.iter().enumerate() {
        out[i * ROW_BYTES..][..ROW_BYTES].copy_from_slice(&f32_bytes(&held.row(id)));
    }
    0
}

unsafe extern "C" fn held_push(
    user: *mut c_void,
    ids: *const u64,
    n: usize,
    grads: *const c_void,
    _byte_len: u64,
) -> u32 {
    // SAFETY: as in `held_pull`.
    let (held, ids, grads) = unsafe {
        (
            &*user.cast::<Held>(),
            std::slice::from_raw_parts(ids, n),
            std::slice::from_raw_parts(grads.cast::<u8>(), n * ROW_BYTES),
        )
    };
    held.received.fetch_add(1, Ordering::SeqCst);
    let give_up = Instant::now() + Duration::from_secs(20);
    while held.hold.load(Ordering::SeqCst) && Instant::now() < give_up {
        std::thread::sleep(Duration::from_micros(200));
    }
    let g = to_f32(grads);
    if g[0] >= 500.0 {
        return 7;
    }
    let mut rows = held.rows.lock().unwrap();
    for (i, id) in ids.iter().enumerate() {
        let row = rows.entry(*id).or_insert([0.0; DIM]);
        for (k, v) in row.iter_mut().enumerate() {
            *v -= g[i * DIM + k];
        }
    }
    held.applied.fetch_add(1, Ordering::SeqCst);
    0
}

#[test]
fn staleness_2_delivers_rows_while_pushes_are_unanswered() {
    let held = held();
    // Four handler threads: three held pushes leave one to serve the pulls.
    let ps = cluster(held.iter().map(|h| h.table()).collect(), 4);
    let worker = runtime(c"worker", 0, false, None, 0);
    let mut c = ptr::null_mut();
    ok(sw_client_new(worker, 64, &mut c));
    let pipe = Pipe {
        p: pipeline(c, &ps, settings(2, 3, 20_000)),
        c,
    };
    // Id 0 twice: its gradients are summed.
    let ids = [0u64, 1, 2, 3, 4, 5, 0];
    let ones = f32_bytes(&[1.0; 7 * DIM]);
    let mut rows = vec![0xffu8; ids.len() * ROW_BYTES];
    for h in &held {
        h.hold.store(true, Ordering::SeqCst);
    }
    pipe.prefetch(&ids).unwrap();
    for t in 0..3u64 {
        let r = pipe.pull(&ids, &mut rows).unwrap();
        // Sent before any push was answered: the rows miss every push sent so far, and no
        // more than the bound.
        assert_eq!((r.step, r.may_miss, r.refetched), (t, t, 0), "{r:?}");
        assert!(to_f32(&rows).iter().all(|&v| v == 0.0), "step {t}");
        if t < 2 {
            pipe.prefetch(&ids).unwrap();
        }
        let r = pipe.push(&ids, &ones).unwrap();
        assert_eq!(r.pushes_in_flight as u64, t + 1, "{r:?}");
    }
    assert_eq!(sw_pipeline_pushes_in_flight(pipe.p), 3);
    for h in &held {
        h.wait_received(1);
        assert_eq!(h.applied.load(Ordering::SeqCst), 0);
        h.hold.store(false, Ordering::SeqCst);
    }
    let r = pipe.flush().unwrap();
    assert_eq!(r.pushes_in_flight, 0);
    for h in &held {
        assert_eq!(h.applied.load(Ordering::SeqCst), 3);
    }
    // Every push applied once: id 0 got 2 per push, the others 1.
    let r = pipe.pull(&ids, &mut rows).unwrap();
    assert_eq!(r.may_miss, 0);
    let got = to_f32(&rows);
    for (pos, id) in ids.iter().enumerate() {
        let want = if *id == 0 { -6.0 } else { -3.0 };
        assert_eq!(got[pos * DIM..][..DIM], [want; DIM], "id {id}");
        assert_eq!(held[(*id % 2) as usize].row(*id), [want; DIM]);
    }
    sw_pipeline_free(pipe.p);
    sw_client_free(c);
    sw_runtime_free(worker);
    free(ps);
}

#[test]
fn a_refused_push_fails_the_next_call_with_the_ps_task_and_status_once() {
    let held = held();
    let ps = cluster(held.iter().map(|h| h.table()).collect(), 0);
    let worker = runtime(c"worker", 0, false, None, 0);
    let mut c = ptr::null_mut();
    ok(sw_client_new(worker, 64, &mut c));
    let pipe = Pipe {
        p: pipeline(c, &ps, settings(1, 2, 20_000)),
        c,
    };
    let ids: Vec<u64> = (0..6).collect();
    let mut rows = vec![0u8; ids.len() * ROW_BYTES];
    pipe.prefetch(&ids).unwrap();
    for t in 0..2 {
        pipe.pull(&ids, &mut rows).unwrap();
        pipe.prefetch(&ids).unwrap();
        // Step 1's gradients are refused by both PS tasks; the push returns at once.
        let g = if t == 1 { 1000.0 } else { 1.0 };
        pipe.push(&ids, &f32_bytes(&vec![g; ids.len() * DIM]))
            .unwrap();
    }
    assert_eq!(pipe.flush().unwrap_err(), sw_result::SW_ERR_REMOTE);
    let msg = last_error();
    let failed = pipe.failed();
    assert_eq!(failed.len(), 2, "{msg}");
    let first = failed[0].shard;
    assert_eq!(sw_last_error_status(), 7, "{msg}");
    assert_eq!(text(sw_last_error_task()), format!("ps:{first}"), "{msg}");
    let mut shards: Vec<usize> = failed.iter().map(|f| f.shard).collect();
    shards.sort_unstable();
    assert_eq!(shards, [0, 1]);
    for (f, ps) in failed.iter().zip([&ps[first], &ps[1 - first]]) {
        assert_eq!(
            (f.step, f.result, f.status),
            (1, sw_result::SW_ERR_REMOTE, 7)
        );
        let addr = ps.peer.to_str().unwrap().split_once('@').unwrap().1;
        let named = format!("step 1 to PS {} ({addr})", f.shard);
        assert!(msg.contains(&named), "{msg}");
    }
    // Each failure on its own, as a result.
    assert_eq!(
        sw_pipeline_failed_push_error(pipe.p, 1),
        sw_result::SW_ERR_REMOTE
    );
    assert_eq!(text(sw_last_error_task()), format!("ps:{}", 1 - first));
    assert_eq!(
        sw_pipeline_failed_push_error(pipe.p, 2),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    // Reported once: the next calls go on, and the refused push was not applied.
    pipe.flush().unwrap();
    assert_eq!(sw_pipeline_failed_pushes(pipe.p), 0);
    pipe.pull(&ids, &mut rows).unwrap();
    assert!(
        to_f32(&rows).iter().all(|&v| v == -1.0),
        "{:?}",
        to_f32(&rows)
    );
    for h in &held {
        assert_eq!(
            (
                h.received.load(Ordering::SeqCst),
                h.applied.load(Ordering::SeqCst)
            ),
            (2, 1)
        );
    }
    sw_pipeline_free(pipe.p);
    sw_client_free(c);
    sw_runtime_free(worker);
    free(ps);
}

#[test]
fn a_stopped_ps_s_push_times_out_and_fails_the_next_call() {
    let held = held();
    let ps = cluster(held.iter().map(|h| h.table()).collect(), 0);
    let worker = runtime(c"worker", 0, false, None, 0);
    let mut c = ptr::null_mut();
    ok(sw_client_new(worker, 64, &mut c));
    // Requests given 300 ms; PS 1 stops answering (holds the push) until the test has seen
    // the failure, so the push cannot be answered in time however slow the machine.
    let pipe = Pipe {
        p: pipeline(c, &ps, settings(0, 2, 300)),
        c,
    };
    let ids: Vec<u64> = (0..6).collect();
    let grads = f32_bytes(&vec![1.0; ids.len() * DIM]);
    let mut rows = vec![0u8; ids.len() * ROW_BYTES];
    pipe.prefetch(&ids).unwrap();
    pipe.pull(&ids, &mut rows).unwrap();
    pipe.prefetch(&ids).unwrap();
    held[1].hold.store(true, Ordering::SeqCst);
    let r = pipe.push(&ids, &grads).unwrap();
    assert_eq!(r.pushes_in_flight, 1);
    // Staleness 0: the next pull waits for that push, which fails.
    assert_eq!(
        pipe.pull(&ids, &mut rows).unwrap_err(),
        sw_result::SW_ERR_TIMEOUT
    );
    let msg = last_error();
    held[1].hold.store(false, Ordering::SeqCst);
    assert!(msg.contains("step 0 to PS 1"), "{msg}");
    assert_eq!(text(sw_last_error_task()), "ps:1", "{msg}");
    let failed = pipe.failed();
    assert_eq!(failed.len(), 1, "{msg}");
    assert_eq!(
        (failed[0].step, failed[0].shard, failed[0].result),
        (0, 1, sw_result::SW_ERR_TIMEOUT)
    );
    assert_eq!(
        sw_pipeline_steps(pipe.p),
        1,
        "the failed call delivered nothing"
    );
    // (Whatever is still in flight ends, answered or timed out.)
    let _ = pipe.flush();
    assert_eq!(sw_pipeline_pushes_in_flight(pipe.p), 0);
    sw_pipeline_free(pipe.p);
    sw_client_free(c);
    sw_runtime_free(worker);
    free(ps);
}

#[test]
fn a_killed_ps_s_push_fails_the_next_call() {
    let held = held();
    let mut ps = cluster(held.iter().map(|h| h.table()).collect(), 0);
    let worker = runtime(c"worker", 0, false, None, 0);
    let mut c = ptr::null_mut();
    ok(sw_client_new(worker, 64, &mut c));
    let pipe = Pipe {
        p: pipeline(c, &ps, settings(0, 2, 20_000)),
        c,
    };
    let ids: Vec<u64> = (0..6).collect();
    let grads = f32_bytes(&vec![1.0; ids.len() * DIM]);
    let mut rows = vec![0u8; ids.len() * ROW_BYTES];
    pipe.prefetch(&ids).unwrap();
    for _ in 0..2 {
        pipe.pull(&ids, &mut rows).unwrap();
        pipe.prefetch(&ids).unwrap();
        if sw_pipeline_steps(pipe.p) == 1 {
            pipe.push(&ids, &grads).unwrap();
        }
    }
    pipe.flush().unwrap();
    // PS 1 goes away between step 1's pull and its push.
    let dead = ps.pop().unwrap();
    sw_runtime_free(dead.rt);
    // The push returns without waiting; its part at PS 1 fails after, and the next call
    // (a pull at staleness 0, which waits for the push) fails with it.
    pipe.push(&ids, &grads).unwrap();
    let e = pipe.pull(&ids, &mut rows).unwrap_err();
    let msg = last_error();
    // Refused with SHUTDOWN when the PS's closing words arrive with the push in flight.
    let shutdown = e == sw_result::SW_ERR_REFUSED && sw_last_error_status() == 5;
    assert!(
        matches!(
            e,
            sw_result::SW_ERR_CONNECT_FAILED | sw_result::SW_ERR_CONNECTION_LOST
        ) || shutdown,
        "{e:?}: {msg}"
    );
    assert!(msg.contains("step 1 to PS 1"), "{msg}");
    assert_eq!(text(sw_last_error_task()), "ps:1", "{msg}");
    let failed = pipe.failed();
    assert_eq!(failed.len(), 1, "{msg}");
    assert_eq!(
        (failed[0].step, failed[0].shard, failed[0].result),
        (1, 1, e)
    );
    // Reported once; PS 0 has applied both pushes once every push is answered.
    ok(sw_pipeline_flush(
        pipe.p,
        c,
        &mut sw_pipeline_report::default(),
    ));
    assert_eq!(sw_pipeline_pushes_in_flight(pipe.p), 0);
    assert_eq!(held[0].applied.load(Ordering::SeqCst), 2);
    sw_pipeline_free(pipe.p);
    sw_client_free(c);
    sw_runtime_free(worker);
    free(ps);
}

#[test]
fn pipeline_arguments_are_checked() {
    let d = sw_pipeline_settings_default();
    assert_eq!(d, settings(1, 2, 60_000));
    let worker = runtime(c"worker", 0, false, None, 0);
    let (mut c, mut other) = (ptr::null_mut(), ptr::null_mut());
    ok(sw_client_new(worker, 16, &mut c));
    ok(sw_client_new(worker, 16, &mut other));
    let addr = [c"ps:0@127.0.0.1:1".as_ptr()];
    let dims = [DIM as u64];
    let new = |c, s, dtype, p: &mut *mut sw_pipeline| {
        sw_pipeline_new(
            c,
            addr.as_ptr(),
            1,
            MOD,
            TABLE,
            dtype,
            dims.as_ptr(),
            1,
            s,
            p,
        )
    };
    let mut p = ptr::null_mut();
    assert_eq!(
        new(c, settings(1, 0, 0), F32, &mut p),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    assert!(
        last_error().contains("max_pushes_in_flight"),
        "{}",
        last_error()
    );
    assert_eq!(new(c, d, 99, &mut p), sw_result::SW_ERR_INVALID_ARGUMENT);
    assert_eq!(new(ptr::null_mut(), d, F32, &mut p), sw_result::SW_ERR_NULL);
    assert!(p.is_null(), "no partial success");
    ok(new(c, d, F32, &mut p));

    // Nothing is sent for bad arguments, and the report is not written.
    let ids = [1u64, 2];
    let mut out = [0u8; 2 * ROW_BYTES];
    let mut report = sw_pipeline_report {
        step: 77,
        ..Default::default()
    };
    let mut pull = |c, len| {
        let mut report = report;
        let r = sw_pipeline_pull(
            p,
            c,
            ids.as_ptr(),
            2,
            out.as_mut_ptr().cast(),
            len,
            &mut report,
        );
        (r, report.step)
    };
    assert_eq!(
        pull(c, 2 * ROW_BYTES as u64 - 1),
        (sw_result::SW_ERR_INVALID_ARGUMENT, 77)
    );
    assert!(last_error().contains("out is 31 bytes"), "{}", last_error());
    assert_eq!(
        pull(other, 2 * ROW_BYTES as u64),
        (sw_result::SW_ERR_INVALID_ARGUMENT, 77)
    );
    assert!(last_error().contains("another client"), "{}", last_error());
    assert_eq!(
        sw_pipeline_flush(ptr::null_mut(), c, &mut report),
        sw_result::SW_ERR_NULL
    );
    assert_eq!(
        sw_pipeline_flush(p, c, ptr::null_mut()),
        sw_result::SW_ERR_NULL
    );
    assert_eq!(report.step, 77);
    ok(sw_pipeline_current_report(p, &mut report));
    assert_eq!(report, sw_pipeline_report::default());
    // No push failure to look at.
    assert_eq!(sw_pipeline_failed_pushes(p), 0);
    let mut f = std::mem::MaybeUninit::<sw_push_failure>::uninit();
    assert_eq!(
        sw_pipeline_failed_push(p, 0, f.as_mut_ptr()),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    // Getters and free accept NULL.
    assert_eq!(sw_pipeline_pushes_in_flight(ptr::null()), 0);
    assert_eq!(sw_pipeline_failed_pushes(ptr::null()), 0);
    sw_pipeline_free(ptr::null_mut());
    sw_pipeline_free(p);
    sw_client_free(other);
    sw_client_free(c);
    sw_runtime_free(worker);
}
