//! The versioned rows pull of the C ABI (`sw_client_pull_rows_versioned_wait`) over
//! loopback, a PS serving an in-memory table (which keeps row versions): after a push of
//! `k` of `n` rows, a pull holding all `n` versions gets exactly those `k` rows and leaves
//! the others as the caller holds them, the rows then equal to a plain pull's; a pull
//! holding every current version writes nothing; a missing row comes back at zero with
//! version 0; a large block is received straight from the socket (no copy out of the
//! receive buffer) and a few changed rows of a large pull land at their positions; a
//! refused table fails with the PS's status; a PS that does not announce `row_versions`
//! sends every row; bad arguments, and a client with a callback, are refused, naming
//! them, with nothing written.

mod common;

use common::*;
use starwire_ffi::*;
use std::ffi::{c_void, CStr, CString};
use std::ptr;

const F32: u8 = 10;
const DIM: usize = 4;
const ROW_BYTES: usize = DIM * 4;
const TABLE: u32 = 9;
const TIMEOUT_MS: u64 = 20_000;
/// The shape of a row (a static: `sw_rows` points at it).
static DIMS: [u64; 1] = [DIM as u64];

/// A PS (with `settings`, rows missing until pushed, SGD at rate 1), a worker and its
/// client.
struct Setup {
    ps: *mut sw_runtime,
    worker: *mut sw_runtime,
    client: *mut sw_client,
    peer: CString,
}

/// What a versioned pull answered.
#[derive(Debug)]
struct Answer {
    versions: Vec<u64>,
    unchanged: Vec<bool>,
    changed: usize,
    missing: Vec<u32>,
}

impl Setup {
    fn new(ps_settings: &[(&CStr, &CStr)]) -> Setup {
        let ps = mem_table_runtime(true, TABLE, DIM, INIT_MISSING, 1.0, ps_settings);
        let worker = mem_table_runtime(false, TABLE, DIM, INIT_MISSING, 1.0, &[]);
        let mut client = ptr::null_mut();
        ok(sw_client_new(worker, 16, &mut client));
        let peer = peer_of(ps);
        Setup {
            ps,
            worker,
            client,
            peer,
        }
    }

    /// One table's `sw_rows` over `ids` and `data`.
    fn rows(ids: &[u64], data: &mut [u8]) -> sw_rows {
        sw_rows {
            table: TABLE,
            dtype: F32,
            row_dims: DIMS.as_ptr(),
            rank: 1,
            ids: ids.as_ptr(),
            n: ids.len(),
            data: data.as_mut_ptr().cast(),
            byte_len: data.len() as u64,
        }
    }

    /// Pushes `grads` (one f32 row per id), waiting for the PS's answer.
    fn push(&self, ids: &[u64], grads: &[f32]) {
        let mut bytes = f32_bytes(grads);
        let rows = Setup::rows(ids, &mut bytes);
        let mut tag = 0;
        ok(sw_client_push_rows(
            self.client,
            self.peer.as_ptr(),
            &rows,
            1,
            TIMEOUT_MS,
            &mut tag,
        ));
        let mut reply = ptr::null_mut();
        ok(sw_client_wait(self.client, tag, &mut reply));
        assert_eq!(sw_reply_status(reply, 0), 0);
        sw_reply_free(reply);
    }

    /// A plain pull of `ids`: the rows' bytes.
    fn plain(&self, ids: &[u64]) -> Vec<u8> {
        let mut data = vec![0xeeu8; ids.len() * ROW_BYTES];
        let rows = Setup::rows(ids, &mut data);
        let mut missing = vec![0u32; ids.len()];
        let mut count = 0;
        ok(sw_client_pull_rows_wait(
            self.client,
            self.peer.as_ptr(),
            &rows,
            TIMEOUT_MS,
            missing.as_mut_ptr(),
            &mut count,
        ));
        data
    }

    /// A versioned pull of `ids` holding `held`, into `data` (the caller's rows).
    fn versioned(&self, ids: &[u64], held: &[u64], data: &mut [u8]) -> Result<Answer, sw_result> {
        let rows = Setup::rows(ids, data);
        let mut a = Answer {
            versions: vec![u64::MAX; ids.len()],
            unchanged: vec![false; ids.len()],
            changed: usize::MAX,
            missing: vec![u32::MAX; ids.len()],
        };
        let mut count = usize::MAX;
        let r = sw_client_pull_rows_versioned_wait(
            self.client,
            self.peer.as_ptr(),
            &rows,
            held.as_ptr(),
            TIMEOUT_MS,
            a.versions.as_mut_ptr(),
            a.unchanged.as_mut_ptr(),
            &mut a.changed,
            a.missing.as_mut_ptr(),
            &mut count,
        );
        if r != sw_result::SW_OK {
            return Err(r);
        }
        a.missing.truncate(count);
        Ok(a)
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        sw_client_free(self.client);
        sw_runtime_free(self.worker);
        sw_runtime_free(self.ps);
    }
}

/// Gradients of `n` rows: row `i` all `i + 1`.
fn grads(n: usize) -> Vec<f32> {
    (0..n).flat_map(|i| [(i + 1) as f32; DIM]).collect()
}

#[test]
fn after_a_push_of_k_rows_a_pull_holding_all_versions_gets_exactly_those_k() {
    let t = Setup::new(&[]);
    let ids: Vec<u64> = (0..12).map(|i| i * 3).collect();
    let n = ids.len();
    t.push(&ids, &grads(n));

    // Nothing held: every row travels, each with its version.
    let mut cache = vec![0xabu8; n * ROW_BYTES];
    let first = t.versioned(&ids, &vec![0; n], &mut cache).unwrap();
    assert_eq!(first.changed, n);
    assert!(first.unchanged.iter().all(|&u| !u));
    assert!(first.missing.is_empty());
    assert!(
        first.versions.iter().all(|&v| v != 0),
        "{:?}",
        first.versions
    );
    assert_eq!(cache, t.plain(&ids));

    // A push of 5 of the 12 rows: a pull holding every version gets exactly those 5.
    let pushed = [ids[1], ids[4], ids[5], ids[9], ids[11]];
    t.push(&pushed, &grads(pushed.len()));
    let second = t.versioned(&ids, &first.versions, &mut cache).unwrap();
    assert_eq!(second.changed, pushed.len());
    for (i, id) in ids.iter().enumerate() {
        let was_pushed = pushed.contains(id);
        assert_eq!(second.unchanged[i], !was_pushed, "id {id}");
        if was_pushed {
            assert_ne!(second.versions[i], first.versions[i], "id {id}");
            assert_ne!(second.versions[i], 0, "id {id}");
        } else {
            assert_eq!(second.versions[i], first.versions[i], "id {id}");
        }
    }
    assert_eq!(
        second.unchanged.iter().filter(|&&u| u).count(),
        n - pushed.len()
    );
    // The cache's copy with the changed rows written in is the PS's rows.
    assert_eq!(cache, t.plain(&ids));

    // Holding every current version: no row travels, and the caller's bytes are left as
    // they are (here not the PS's, to see that nothing is written).
    let mut untouched = vec![0x5au8; n * ROW_BYTES];
    let third = t.versioned(&ids, &second.versions, &mut untouched).unwrap();
    assert_eq!(third.changed, 0);
    assert!(third.unchanged.iter().all(|&u| u));
    assert_eq!(third.versions, second.versions);
    assert!(untouched.iter().all(|&b| b == 0x5a));
}

#[test]
fn a_missing_row_comes_back_at_zero_with_version_0_and_a_stale_version_is_sent() {
    let t = Setup::new(&[]);
    t.push(&[1, 2], &grads(2));
    let ids = [1u64, 1000, 2];
    let mut cache = vec![0xabu8; ids.len() * ROW_BYTES];
    let a = t.versioned(&ids, &[0, 0, 0], &mut cache).unwrap();
    assert_eq!(a.missing, [1]);
    assert_eq!(a.versions[1], 0);
    assert_eq!((a.changed, a.unchanged.clone()), (3, vec![false; 3]));
    assert!(cache[ROW_BYTES..2 * ROW_BYTES].iter().all(|&b| b == 0));
    // A version the PS never gave (here one past the current) is not the row's: sent.
    let held = [a.versions[0] + 1, 0, a.versions[2]];
    let mut again = vec![0xabu8; ids.len() * ROW_BYTES];
    let b = t.versioned(&ids, &held, &mut again).unwrap();
    assert_eq!(b.unchanged, [false, false, true]);
    assert_eq!(b.changed, 2);
    assert_eq!(b.versions, a.versions);
    assert_eq!(&again[..ROW_BYTES], &cache[..ROW_BYTES]);
    assert!(again[2 * ROW_BYTES..].iter().all(|&b| b == 0xab));
}

#[test]
fn a_ps_without_row_versions_sends_every_row_with_version_0() {
    let t = Setup::new(&[(c"STARWIRE_WIRE_FEATURES", c"none")]);
    let ids: Vec<u64> = (0..8).collect();
    t.push(&ids, &grads(ids.len()));
    let mut cache = vec![0xabu8; ids.len() * ROW_BYTES];
    let first = t.versioned(&ids, &[0; 8], &mut cache).unwrap();
    assert_eq!(first.changed, 8);
    assert_eq!(first.versions, [0; 8]);
    assert_eq!(cache, t.plain(&ids));
    // Whatever is held, every row travels.
    t.push(&ids[..2], &grads(2));
    let mut again = vec![0xabu8; ids.len() * ROW_BYTES];
    let held: Vec<u64> = (1..=8).collect();
    let second = t.versioned(&ids, &held, &mut again).unwrap();
    assert_eq!(second.changed, 8);
    assert_eq!(second.unchanged, [false; 8]);
    assert_eq!(second.versions, [0; 8]);
    assert_eq!(again, t.plain(&ids));
}

#[test]
fn bad_arguments_are_refused_naming_them_and_nothing_is_written() {
    let t = Setup::new(&[]);
    let ids = [1u64, 2];
    let held = [0u64; 2];
    let mut data = vec![0xabu8; 2 * ROW_BYTES];
    let rows = Setup::rows(&ids, &mut data);
    let mut versions = [7u64; 2];
    let mut unchanged = [true; 2];
    let (mut changed, mut count) = (7usize, 7usize);
    let mut missing = [7u32; 2];
    let call = |rows: &sw_rows,
                held: *const u64,
                versions: *mut u64,
                unchanged: *mut bool,
                changed: *mut usize,
                count: *mut usize,
                missing: *mut u32| {
        let r = sw_client_pull_rows_versioned_wait(
            t.client,
            t.peer.as_ptr(),
            rows,
            held,
            TIMEOUT_MS,
            versions,
            unchanged,
            changed,
            missing,
            count,
        );
        (r, last_error())
    };
    let (v, u, c, m, n) = (
        versions.as_mut_ptr(),
        unchanged.as_mut_ptr(),
        &mut changed as *mut usize,
        missing.as_mut_ptr(),
        &mut count as *mut usize,
    );
    let null = sw_result::SW_ERR_NULL;
    for (got, names) in [
        (call(&rows, ptr::null(), v, u, c, n, m), "held"),
        (
            call(&rows, held.as_ptr(), ptr::null_mut(), u, c, n, m),
            "versions",
        ),
        (
            call(&rows, held.as_ptr(), v, ptr::null_mut(), c, n, m),
            "unchanged",
        ),
        (
            call(&rows, held.as_ptr(), v, u, ptr::null_mut(), n, m),
            "changed",
        ),
        (
            call(&rows, held.as_ptr(), v, u, c, ptr::null_mut(), m),
            "missing_count",
        ),
    ] {
        assert_eq!(got.0, null, "{names}");
        assert!(got.1.contains(names), "{names}: {}", got.1);
    }
    let invalid = sw_result::SW_ERR_INVALID_ARGUMENT;
    let short = sw_rows {
        byte_len: ROW_BYTES as u64,
        ..rows
    };
    let no_ids = sw_rows { n: 0, ..rows };
    let no_data = sw_rows {
        data: ptr::null_mut(),
        ..rows
    };
    for (r, code, says) in [
        (short, invalid, "byte_len"),
        (no_ids, invalid, "no ids"),
        (no_data, null, "data"),
    ] {
        let got = call(&r, held.as_ptr(), v, u, c, n, m);
        assert_eq!(got.0, code, "{says}");
        assert!(got.1.contains(says), "{says}: {}", got.1);
    }
    // Nothing was written, nothing was sent.
    assert_eq!(
        (versions, unchanged, changed, count),
        ([7; 2], [true; 2], 7, 7)
    );
    assert_eq!(missing, [7; 2]);
    assert!(data.iter().all(|&b| b == 0xab));
}

#[test]
fn a_large_pull_is_received_directly_and_a_few_changed_rows_are_put_in_place() {
    let t = Setup::new(&[]);
    let ids: Vec<u64> = (0..40_000).collect();
    let n = ids.len();
    t.push(&ids, &vec![0.5; n * DIM]);
    let direct = || {
        let mut s = sw_stats::default();
        ok(sw_runtime_stats(t.worker, &mut s));
        s.payload_direct
    };
    let before = direct();
    let mut cache = vec![0xabu8; n * ROW_BYTES];
    let first = t.versioned(&ids, &vec![0; n], &mut cache).unwrap();
    assert_eq!(first.changed, n);
    // Every row sent: the block is the caller's rows, received from the socket.
    assert!(direct() - before >= cache.len() as u64 / 2);
    assert!(to_f32(&cache).iter().all(|&x| x == -0.5));
    // Three rows changed: they arrive elsewhere and are copied into place.
    t.push(&[7, 70, 7_000], &[1.0; 3 * DIM]);
    let second = t.versioned(&ids, &first.versions, &mut cache).unwrap();
    assert_eq!(second.changed, 3);
    let rows = to_f32(&cache);
    for (i, x) in rows.chunks(DIM).enumerate() {
        let want = if [7, 70, 7_000].contains(&i) {
            -1.5
        } else {
            -0.5
        };
        assert!(x.iter().all(|&v| v == want), "row {i}: {x:?}");
    }
}

#[test]
fn a_table_the_ps_refuses_fails_with_its_status_and_leaves_the_rows_alone() {
    let t = Setup::new(&[]);
    let ids = [1u64, 2];
    let mut data = vec![0xabu8; 2 * ROW_BYTES];
    let rows = sw_rows {
        table: 77,
        ..Setup::rows(&ids, &mut data)
    };
    let (mut versions, mut unchanged, mut changed) = ([7u64; 2], [true; 2], 7usize);
    let (mut missing, mut count) = ([7u32; 2], 7usize);
    let r = sw_client_pull_rows_versioned_wait(
        t.client,
        t.peer.as_ptr(),
        &rows,
        [0u64, 0].as_ptr(),
        TIMEOUT_MS,
        versions.as_mut_ptr(),
        unchanged.as_mut_ptr(),
        &mut changed,
        missing.as_mut_ptr(),
        &mut count,
    );
    assert_eq!(r, sw_result::SW_ERR_REMOTE);
    assert_eq!(sw_last_error_status(), 1, "NOT_FOUND");
    assert!(last_error().contains("77"), "{}", last_error());
    assert_eq!(
        (versions, unchanged, changed, count),
        ([7; 2], [true; 2], 7, 7)
    );
    assert!(data.iter().all(|&b| b == 0xab));
}

unsafe extern "C" fn ignore(_: *mut c_void, _: u64, _: sw_result, reply: *mut sw_reply) {
    sw_reply_free(reply);
}

#[test]
fn a_client_with_a_callback_is_refused() {
    let t = Setup::new(&[]);
    let mut c = ptr::null_mut();
    ok(sw_client_new_with_callback(
        t.worker,
        4,
        Some(ignore),
        ptr::null_mut(),
        &mut c,
    ));
    let ids = [1u64];
    let mut data = vec![0xabu8; ROW_BYTES];
    let rows = Setup::rows(&ids, &mut data);
    let (mut versions, mut unchanged, mut changed) = ([7u64], [true], 7usize);
    let (mut missing, mut count) = ([7u32], 7usize);
    let r = sw_client_pull_rows_versioned_wait(
        c,
        t.peer.as_ptr(),
        &rows,
        [0u64].as_ptr(),
        TIMEOUT_MS,
        versions.as_mut_ptr(),
        unchanged.as_mut_ptr(),
        &mut changed,
        missing.as_mut_ptr(),
        &mut count,
    );
    assert_eq!(r, sw_result::SW_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("callback"), "{}", last_error());
    assert_eq!((versions, unchanged, changed, count), ([7], [true], 7, 7));
    sw_client_free(c);
}
