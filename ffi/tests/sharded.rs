//! The sharded rows client, tables served through C callbacks, and task names, over the C
//! ABI as C calls them: two PS tasks on loopback and a worker.

use starwire_ffi::*;
use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};

const F32: u8 = 10;

fn last_error() -> String {
    // SAFETY: `sw_last_error` returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(sw_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn ok(r: sw_result) {
    assert_eq!(r, sw_result::SW_OK, "{}", last_error());
}

/// A runtime of `job`, listening on loopback when `listen`, serving `tables` as `ids`.
fn runtime(job: &CStr, listen: bool, ids: &[u32], tables: &[*const sw_table]) -> *mut sw_runtime {
    let names = [c"STARWIRE_CONNECT_RETRIES".as_ptr()];
    let values = [c"0".as_ptr()];
    let o = sw_runtime_options {
        job: job.as_ptr(),
        task_index: 0,
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
        handler_threads: 0,
        table_ids: ids.as_ptr(),
        tables: tables.as_ptr(),
        n_tables: ids.len(),
    };
    let mut rt = ptr::null_mut();
    ok(sw_runtime_new(&o, &mut rt));
    rt
}

/// A reference table of rows of 2 f32, missing until pushed, SGD with rate 1.
fn missing_table() -> *mut sw_table {
    let init = sw_init {
        kind: sw_init_kind::SW_INIT_MISSING as u32,
        scale: 0.0,
        seed: 0,
    };
    let sgd = sw_optimizer {
        kind: sw_optimizer_kind::SW_OPTIMIZER_SGD as u32,
        lr: 1.0,
        initial_accumulator: 0.0,
    };
    let mut t = ptr::null_mut();
    ok(sw_mem_table_new(2, init, sgd, &mut t));
    t
}

fn address(rt: *const sw_runtime) -> CString {
    let port = sw_runtime_port(rt);
    CString::new(format!("127.0.0.1:{port}")).unwrap()
}

#[test]
fn sharded_steps_dedup_partition_scatter_and_merge() {
    let tables = [missing_table(), missing_table()];
    let ps: Vec<*mut sw_runtime> = tables
        .iter()
        .map(|&t| runtime(c"ps", true, &[5], &[t.cast_const()]))
        .collect();
    for t in tables {
        sw_table_free(t);
    }
    let worker = runtime(c"worker", false, &[], &[]);
    let mut client = ptr::null_mut();
    ok(sw_client_new(worker, 16, &mut client));
    let addrs: Vec<CString> = ps.iter().map(|&p| address(p)).collect();
    let peers: Vec<*const c_char> = addrs.iter().map(|a| a.as_ptr()).collect();
    let part = sw_partition {
        kind: sw_partition_kind::SW_PARTITION_MOD as u32,
        vocab: 0,
    };
    let dims = [2u64];
    let mut s = ptr::null_mut();
    ok(sw_sharded_new(
        peers.as_ptr(),
        2,
        part,
        5,
        F32,
        dims.as_ptr(),
        1,
        &mut s,
    ));

    // Ids 4 (three times), 5 (twice), 6: gradients summed per id before sending.
    let ids = [4u64, 5, 4, 6, 5, 4];
    let grads = f32_bytes(&[1., 1., 2., 2., 3., 3., 4., 4., 5., 5., 6., 6.]);
    let mut report = sw_step_report::default();
    ok(sw_sharded_push(
        s,
        client,
        ids.as_ptr(),
        ids.len(),
        grads.as_ptr().cast(),
        grads.len() as u64,
        0,
        &mut report,
    ));
    assert_eq!(
        (report.unique, report.failed, report.first_failed),
        (3, 0, usize::MAX)
    );
    let mut out = vec![0xffu8; ids.len() * 8];
    ok(sw_sharded_pull(
        s,
        client,
        ids.as_ptr(),
        ids.len(),
        out.as_mut_ptr().cast(),
        out.len() as u64,
        0,
        &mut report,
    ));
    assert_eq!((report.unique, report.missing), (3, 0));
    let (w4, w5, w6) = (-(1. + 3. + 6.), -(2. + 5.), -4.);
    assert_eq!(
        to_f32(&out),
        [w4, w4, w5, w5, w4, w4, w6, w6, w5, w5, w4, w4]
    );
    assert_eq!(sw_sharded_part(s, 0), sw_result::SW_OK);
    assert_eq!(sw_sharded_part(s, 2), sw_result::SW_ERR_INVALID_ARGUMENT);

    // Each distinct id once: ids by PS (id mod 2: 4 and 6 at PS 0, then 5), in the order
    // first seen, and each position's index among them.
    let mut inverse = vec![-1i64; ids.len()];
    let mut unique = vec![0u64; ids.len()];
    let mut rows = vec![0xffu8; ids.len() * 8];
    ok(sw_sharded_pull_unique(
        s,
        client,
        ids.as_ptr(),
        ids.len(),
        inverse.as_mut_ptr(),
        unique.as_mut_ptr(),
        rows.as_mut_ptr().cast(),
        rows.len() as u64,
        0,
        &mut report,
    ));
    assert_eq!((report.unique, report.missing, report.failed), (3, 0, 0));
    assert_eq!(&unique[..3], &[4, 6, 5]);
    assert_eq!(inverse, [0, 2, 0, 1, 2, 0]);
    assert_eq!(to_f32(&rows[..3 * 8]), [w4, w4, w6, w6, w5, w5]);
    assert!(rows[3 * 8..].iter().all(|&b| b == 0xff));
    // Too little room for the rows, or no inverse: refused, nothing written.
    let r = sw_sharded_pull_unique(
        s,
        client,
        ids.as_ptr(),
        ids.len(),
        inverse.as_mut_ptr(),
        unique.as_mut_ptr(),
        rows.as_mut_ptr().cast(),
        ids.len() as u64 * 8 - 1,
        0,
        &mut report,
    );
    assert_eq!(r, sw_result::SW_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("at least 48"), "{}", last_error());
    let r = sw_sharded_pull_unique(
        s,
        client,
        ids.as_ptr(),
        ids.len(),
        ptr::null_mut(),
        unique.as_mut_ptr(),
        rows.as_mut_ptr().cast(),
        rows.len() as u64,
        0,
        &mut report,
    );
    assert_eq!(r, sw_result::SW_ERR_NULL);
    assert!(last_error().contains("inverse"), "{}", last_error());

    // A wrong length fails at once, nothing sent, the report untouched.
    let mut report2 = sw_step_report {
        unique: 77,
        ..Default::default()
    };
    let r = sw_sharded_pull(
        s,
        client,
        ids.as_ptr(),
        ids.len(),
        out.as_mut_ptr().cast(),
        out.len() as u64 - 1,
        0,
        &mut report2,
    );
    assert_eq!(r, sw_result::SW_ERR_INVALID_ARGUMENT);
    assert_eq!(report2.unique, 77);

    // PS 1 gone: its part fails alone, PS 0's rows are written.
    sw_runtime_free(ps[1]);
    let mut out = vec![0xffu8; 2 * 8];
    let r = sw_sharded_pull(
        s,
        client,
        [4u64, 5].as_ptr(),
        2,
        out.as_mut_ptr().cast(),
        out.len() as u64,
        10_000,
        &mut report,
    );
    assert!(
        matches!(
            r,
            sw_result::SW_ERR_CONNECTION_LOST | sw_result::SW_ERR_CONNECT_FAILED
        ),
        "{r:?}: {}",
        last_error()
    );
    assert!(
        last_error().contains(addrs[1].to_str().unwrap()),
        "{}",
        last_error()
    );
    assert_eq!((report.failed, report.first_failed), (1, 1));
    assert_eq!(to_f32(&out[..8]), [w4, w4]);
    assert_eq!(sw_sharded_part(s, 0), sw_result::SW_OK);
    assert_eq!(sw_sharded_part(s, 1), r);

    sw_sharded_free(s);
    sw_client_free(client);
    sw_runtime_free(worker);
    sw_runtime_free(ps[0]);
}

#[test]
fn sharded_arguments_are_checked() {
    let addr = [c"127.0.0.1:1".as_ptr()];
    let bad = [c"nowhere".as_ptr()];
    let part = |kind| sw_partition { kind, vocab: 0 };
    let dims = [4u64];
    let mut s = ptr::null_mut();
    let new = |peers: *const *const c_char, n, p, dtype, s: &mut *mut sw_sharded| {
        sw_sharded_new(peers, n, p, 0, dtype, dims.as_ptr(), 1, s)
    };
    assert_eq!(
        new(addr.as_ptr(), 0, part(0), F32, &mut s),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        new(bad.as_ptr(), 1, part(0), F32, &mut s),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    assert!(last_error().contains("peers[0]"), "{}", last_error());
    assert_eq!(
        new(addr.as_ptr(), 1, part(9), F32, &mut s),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        new(addr.as_ptr(), 1, part(0), 99, &mut s),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    assert!(s.is_null(), "no partial success");
    ok(new(addr.as_ptr(), 1, part(2), F32, &mut s));
    sw_sharded_free(s);
}

/// A C-side table: rows of 2 f32 equal to `[id, id]`; odd ids are missing; a push counts
/// the rows it got.
unsafe extern "C" fn table_pull(
    _user: *mut c_void,
    ids: *const u64,
    n: usize,
    out: *mut c_void,
    _byte_len: u64,
    missing: *mut u32,
    n_missing: *mut usize,
) -> u32 {
    // SAFETY: the arrays starwire passes, of the lengths it says.
    unsafe {
        let ids = std::slice::from_raw_parts(ids, n);
        let out = std::slice::from_raw_parts_mut(out.cast::<u8>(), n * 8);
        let missing = std::slice::from_raw_parts_mut(missing, n);
        let mut m = 0;
        for (i, &id) in ids.iter().enumerate() {
            // Missing rows are written with garbage: starwire zeroes them.
            let v = if id % 2 == 1 { 9.0f32 } else { id as f32 };
            out[i * 8..][..8].copy_from_slice(&f32_bytes(&[v, v]));
            if id % 2 == 1 {
                missing[m] = i as u32;
                m += 1;
            }
        }
        *n_missing = m;
    }
    0
}

unsafe extern "C" fn table_push(
    user: *mut c_void,
    _ids: *const u64,
    n: usize,
    _grads: *const c_void,
    _byte_len: u64,
) -> u32 {
    // SAFETY: `user` is the test's counter, alive for the runtime's life.
    unsafe { &*user.cast::<AtomicUsize>() }.fetch_add(n, Ordering::SeqCst);
    0
}

#[test]
fn a_table_of_c_callbacks_serves_rows() {
    let pushed = AtomicUsize::new(0);
    let callbacks = sw_table_callbacks {
        user_data: (&pushed as *const AtomicUsize).cast_mut().cast(),
        pull: Some(table_pull),
        push: Some(table_push),
    };
    let dims = [2u64];
    let mut t = ptr::null_mut();
    ok(sw_table_new(F32, dims.as_ptr(), 1, &callbacks, &mut t));
    let ps = runtime(c"ps", true, &[1], &[t.cast_const()]);
    sw_table_free(t);
    let worker = runtime(c"worker", false, &[], &[]);
    let mut client = ptr::null_mut();
    ok(sw_client_new(worker, 16, &mut client));
    let peer = address(ps);
    let ids = [2u64, 3, 4];
    let mut out = vec![0xffu8; 3 * 8];
    let rows = sw_rows {
        table: 1,
        dtype: F32,
        row_dims: dims.as_ptr(),
        rank: 1,
        ids: ids.as_ptr(),
        n: 3,
        data: out.as_mut_ptr().cast(),
        byte_len: out.len() as u64,
    };
    let mut tag = 0;
    ok(sw_client_pull_rows(
        client,
        peer.as_ptr(),
        &rows,
        1,
        0,
        &mut tag,
    ));
    let mut reply = ptr::null_mut();
    ok(sw_client_wait(client, tag, &mut reply));
    assert_eq!(sw_reply_status(reply, 0), 0);
    let (mut positions, mut count) = ([0u32; 3], 0);
    ok(sw_reply_missing(
        reply,
        0,
        positions.as_mut_ptr(),
        3,
        &mut count,
    ));
    assert_eq!(&positions[..count], [1]);
    sw_reply_free(reply);
    assert_eq!(to_f32(&out), [2., 2., 0., 0., 4., 4.]);

    let grads = f32_bytes(&[0.5; 6]);
    let push = sw_rows {
        data: grads.as_ptr().cast_mut().cast(),
        ..rows
    };
    ok(sw_client_push_rows(
        client,
        peer.as_ptr(),
        &push,
        1,
        0,
        &mut tag,
    ));
    ok(sw_client_wait(client, tag, &mut reply));
    assert_eq!(sw_reply_status(reply, 0), 0);
    sw_reply_free(reply);
    assert_eq!(pushed.load(Ordering::SeqCst), 3);

    sw_client_free(client);
    sw_runtime_free(worker);
    sw_runtime_free(ps);

    // Rows of no bytes, an unknown dtype, no callbacks: refused.
    let mut t = ptr::null_mut();
    let zero = [0u64];
    assert_eq!(
        sw_table_new(F32, zero.as_ptr(), 1, &callbacks, &mut t),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        sw_table_new(99, dims.as_ptr(), 1, &callbacks, &mut t),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        sw_table_new(F32, dims.as_ptr(), 1, ptr::null(), &mut t),
        sw_result::SW_ERR_NULL
    );
    assert!(t.is_null());
}

fn resolve(r: *const sw_resolver, target: &CStr) -> Result<String, (sw_result, String)> {
    let mut out = [0 as c_char; 64];
    let code = sw_resolver_resolve(r, target.as_ptr(), out.as_mut_ptr(), out.len());
    if code != sw_result::SW_OK {
        return Err((code, last_error()));
    }
    // SAFETY: written NUL-terminated on success.
    Ok(unsafe { CStr::from_ptr(out.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

#[test]
fn task_names_resolve_through_the_spec_and_the_map() {
    let spec =
        cr#"{"cluster": {"ps": ["10.0.0.1:2222", "10.0.0.2:2222"], "worker": ["10.0.0.3:2222"]}}"#;
    let map = c"10.0.0.1:2222=127.0.0.1:5555\n10.0.0.2:2222=127.0.0.1:5556\n";
    let mut r = ptr::null_mut();
    ok(sw_resolver_new(spec.as_ptr(), map.as_ptr(), &mut r));
    assert_eq!(resolve(r, c"ps:1").unwrap(), "127.0.0.1:5556");
    assert_eq!(resolve(r, c"/job:ps/task:0").unwrap(), "127.0.0.1:5555");
    assert_eq!(resolve(r, c"127.0.0.1:7").unwrap(), "127.0.0.1:7");
    let (code, msg) = resolve(r, c"ps:2").unwrap_err();
    assert_eq!(code, sw_result::SW_ERR_INVALID_ARGUMENT);
    assert!(msg.contains("ps:2"), "{msg}");
    // worker:0 has no entry in the map.
    assert!(resolve(r, c"worker:0").unwrap_err().1.contains("worker:0"));
    let mut n = 0;
    ok(sw_resolver_tasks(r, c"ps".as_ptr(), &mut n));
    assert_eq!(n, 2);
    assert_eq!(
        sw_resolver_tasks(r, c"chief".as_ptr(), &mut n),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    // Too little room: refused, not cut.
    let mut small = [0 as c_char; 8];
    assert_eq!(
        sw_resolver_resolve(r, c"ps:0".as_ptr(), small.as_mut_ptr(), small.len()),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    sw_resolver_free(r);

    // A spec with a problem is named.
    let mut r2 = ptr::null_mut();
    let bad = cr#"{"cluster": {"ps": ["no port"]}}"#;
    assert_eq!(
        sw_resolver_new(bad.as_ptr(), map.as_ptr(), &mut r2),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    assert!(last_error().contains("tf_config"), "{}", last_error());
    assert!(r2.is_null());
}
