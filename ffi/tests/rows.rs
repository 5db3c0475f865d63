//! Rows over the C ABI, called as C would: a PS serving reference in-memory tables, and a
//! worker pulling rows into its own buffers and pushing gradient rows.

use starwire::rows::Init;
use starwire_ffi::*;
use std::ffi::{c_void, CStr, CString};
use std::ptr;

const U8: u8 = 2;
const F32: u8 = 10;
const F64: u8 = 13;

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

/// Options of a PS listening on a free loopback port, serving `handles[i]` as `ids[i]`.
fn options(ids: &[u32], handles: &[*const sw_table]) -> sw_runtime_options {
    sw_runtime_options {
        job: c"ps".as_ptr(),
        task_index: 0,
        setting_names: ptr::null(),
        setting_values: ptr::null(),
        settings: 0,
        use_env: true,
        listen: c"127.0.0.1:0".as_ptr(),
        service: ptr::null(),
        allocator: ptr::null(),
        handler_threads: 0,
        table_ids: ids.as_ptr(),
        tables: handles.as_ptr(),
        n_tables: ids.len(),
    }
}

fn mem_table(dim: usize, init: sw_init, optimizer: sw_optimizer) -> *mut sw_table {
    let mut t = ptr::null_mut();
    let r = sw_mem_table_new(dim, init, optimizer, &mut t);
    assert_eq!(r, sw_result::SW_OK, "{}", last_error());
    t
}

fn init(kind: sw_init_kind) -> sw_init {
    sw_init {
        kind: kind as u32,
        scale: 0.0,
        seed: 0,
    }
}

fn sgd(lr: f32) -> sw_optimizer {
    sw_optimizer {
        kind: sw_optimizer_kind::SW_OPTIMIZER_SGD as u32,
        lr,
        initial_accumulator: 0.0,
    }
}

/// A PS serving `tables` (the handles are freed once it runs), a worker runtime and a
/// client of it.
struct Cluster {
    ps: *mut sw_runtime,
    worker: *mut sw_runtime,
    client: *mut sw_client,
    peer: CString,
    /// Whether `client` is an embedded one.
    embedded: bool,
}

impl Cluster {
    fn new(tables: &[(u32, *mut sw_table)]) -> Cluster {
        let ids: Vec<u32> = tables.iter().map(|t| t.0).collect();
        let handles: Vec<*const sw_table> = tables.iter().map(|t| t.1.cast_const()).collect();
        let opts = options(&ids, &handles);
        let mut worker_opts = options(&[], &[]);
        worker_opts.job = c"worker".as_ptr();
        worker_opts.listen = ptr::null();
        let mut ps = ptr::null_mut();
        assert_eq!(
            sw_runtime_new(&opts, &mut ps),
            sw_result::SW_OK,
            "{}",
            last_error()
        );
        for &(_, t) in tables {
            sw_table_free(t);
        }
        let mut worker = ptr::null_mut();
        assert_eq!(sw_runtime_new(&worker_opts, &mut worker), sw_result::SW_OK);
        let mut client = ptr::null_mut();
        assert_eq!(sw_client_new(worker, 16, &mut client), sw_result::SW_OK);
        let peer = CString::new(format!("127.0.0.1:{}", sw_runtime_port(ps))).unwrap();
        Cluster {
            ps,
            worker,
            client,
            peer,
            embedded: false,
        }
    }

    /// The same, with an embedded client (`sw_client_new_embedded`) instead: its own loop,
    /// run by this thread.
    fn embedded(tables: &[(u32, *mut sw_table)]) -> Cluster {
        let mut cluster = Cluster::new(tables);
        sw_client_free(cluster.client);
        cluster.client = ptr::null_mut();
        let r = sw_client_new_embedded(
            cluster.worker,
            ptr::null(),
            ptr::null(),
            0,
            &mut cluster.client,
        );
        assert_eq!(r, sw_result::SW_OK, "{}", last_error());
        cluster.embedded = true;
        cluster
    }

    /// The counters of the loops that carry the client's requests: the runtime's, or an
    /// embedded client's own.
    fn stats(&self) -> sw_stats {
        let mut s = sw_stats::default();
        let (own, runtime) = (
            sw_client_loop_stats(self.client, &mut s),
            sw_runtime_stats(self.worker, &mut sw_stats::default()),
        );
        assert_eq!(runtime, sw_result::SW_OK);
        if self.embedded {
            assert_eq!(own, sw_result::SW_OK, "{}", last_error());
        } else {
            assert_eq!(own, sw_result::SW_ERR_INVALID_ARGUMENT);
            assert_eq!(sw_runtime_stats(self.worker, &mut s), sw_result::SW_OK);
        }
        s
    }

    /// Submits a rows pull and waits for it: the reply (freed by the caller).
    fn pull_rows(&self, tables: &[sw_rows]) -> Result<*mut sw_reply, sw_result> {
        let mut tag = 0;
        let r = sw_client_pull_rows(
            self.client,
            self.peer.as_ptr(),
            tables.as_ptr(),
            tables.len(),
            5000,
            &mut tag,
        );
        if r != sw_result::SW_OK {
            return Err(r);
        }
        self.wait(tag)
    }

    /// Submits a rows push and waits for it: the statuses.
    fn push_rows(&self, tables: &[sw_rows]) -> Result<Vec<u32>, sw_result> {
        let mut tag = 0;
        let r = sw_client_push_rows(
            self.client,
            self.peer.as_ptr(),
            tables.as_ptr(),
            tables.len(),
            5000,
            &mut tag,
        );
        if r != sw_result::SW_OK {
            return Err(r);
        }
        let reply = self.wait(tag)?;
        let statuses = (0..sw_reply_count(reply))
            .map(|i| sw_reply_status(reply, i))
            .collect();
        sw_reply_free(reply);
        Ok(statuses)
    }

    /// Pings the PS for `time`, one ping after another, each waited for (at least one).
    fn ping_for(&self, time: std::time::Duration) {
        let end = std::time::Instant::now() + time;
        loop {
            let mut tag = 0;
            let r = sw_client_ping(self.client, self.peer.as_ptr(), 16, 5000, &mut tag);
            assert_eq!(r, sw_result::SW_OK);
            let reply = self.wait(tag).expect("a ping");
            sw_reply_free(reply);
            if std::time::Instant::now() >= end {
                return;
            }
        }
    }

    fn wait(&self, tag: u64) -> Result<*mut sw_reply, sw_result> {
        let mut reply = ptr::null_mut();
        match sw_client_wait(self.client, tag, &mut reply) {
            sw_result::SW_OK => Ok(reply),
            r => Err(r),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        sw_client_free(self.client);
        sw_runtime_free(self.worker);
        sw_runtime_free(self.ps);
    }
}

/// Table `table`'s rows `ids` of `row_dims` `dtype` elements in `data`.
fn rows(table: u32, dtype: u8, row_dims: &[u64], ids: &[u64], data: &mut [u8]) -> sw_rows {
    sw_rows {
        table,
        dtype,
        row_dims: row_dims.as_ptr(),
        rank: row_dims.len() as u32,
        ids: ids.as_ptr(),
        n: ids.len(),
        data: data.as_mut_ptr().cast::<c_void>(),
        byte_len: data.len() as u64,
    }
}

/// Statuses and missing positions of a rows pull's reply, which is freed.
fn statuses_and_missing(reply: *mut sw_reply) -> Vec<(u32, Vec<u32>)> {
    let out = (0..sw_reply_count(reply))
        .map(|t| {
            assert!(
                sw_reply_tensor(reply, t).is_null(),
                "rows are in the buffers"
            );
            let mut positions = vec![0u32; 64];
            let mut count = 0;
            let r = sw_reply_missing(reply, t, positions.as_mut_ptr(), 64, &mut count);
            assert_eq!(r, sw_result::SW_OK);
            positions.truncate(count);
            (sw_reply_status(reply, t), positions)
        })
        .collect();
    sw_reply_free(reply);
    out
}

#[test]
fn rows_round_trip_through_the_callers_buffers() {
    rows_round_trip_through_the_callers_buffers_with(Cluster::new);
}

#[test]
fn rows_round_trip_through_the_callers_buffers_embedded() {
    rows_round_trip_through_the_callers_buffers_with(Cluster::embedded);
}

fn rows_round_trip_through_the_callers_buffers_with(make: fn(&[(u32, *mut sw_table)]) -> Cluster) {
    let uniform = sw_init {
        kind: sw_init_kind::SW_INIT_UNIFORM as u32,
        scale: 0.5,
        seed: 7,
    };
    // Two tables of one shape in one request, and a large one.
    let cluster = make(&[
        (3, mem_table(4, uniform, sgd(1.0))),
        (9, mem_table(4, init(sw_init_kind::SW_INIT_ZEROS), sgd(0.5))),
        (
            5,
            mem_table(64, init(sw_init_kind::SW_INIT_ZEROS), sgd(1.0)),
        ),
    ]);
    let dims = [4u64];
    let ids3 = [11u64, 12, 11];
    let ids9 = [1u64, 2];
    let mut g3 = f32_bytes(&(0..12).map(|i| i as f32 * 0.25).collect::<Vec<_>>());
    let mut g9 = f32_bytes(&[1.0; 8]);
    let push = [
        rows(3, F32, &dims, &ids3, &mut g3),
        rows(9, F32, &dims, &ids9, &mut g9),
    ];
    assert_eq!(cluster.push_rows(&push), Ok(vec![0, 0]));

    let mut out3 = vec![0xffu8; 3 * 16];
    let mut out9 = vec![0xffu8; 2 * 16];
    let pull = [
        rows(9, F32, &dims, &ids9, &mut out9),
        rows(3, F32, &dims, &ids3, &mut out3),
    ];
    let reply = cluster.pull_rows(&pull).expect("pull");
    assert_eq!(statuses_and_missing(reply), [(0, vec![]), (0, vec![])]);
    assert_eq!(to_f32(&out9), [-0.5; 8]);
    let init = Init::Uniform {
        scale: 0.5,
        seed: 7,
    };
    let got = to_f32(&out3);
    for k in 0..4 {
        // Id 11 got two gradient rows (positions 0 and 2), id 12 one.
        let g = |i: usize| i as f32 * 0.25;
        let want11 = init.value(11, k) - g(k) - g(8 + k);
        assert_eq!(got[k], want11);
        assert_eq!(got[8 + k], want11);
        assert_eq!(got[4 + k], init.value(12, k) - g(4 + k));
    }

    // A 10 MB block lands in the caller's buffer straight from the socket.
    let big_ids: Vec<u64> = (0..40_000).collect();
    let mut big = vec![0xffu8; big_ids.len() * 64 * 4];
    let before = cluster.stats().payload_direct;
    let reply = cluster
        .pull_rows(&[rows(5, F32, &[64], &big_ids, &mut big)])
        .expect("pull");
    assert_eq!(statuses_and_missing(reply), [(0, vec![])]);
    assert!(big.iter().all(|&b| b == 0));
    assert!(cluster.stats().payload_direct - before >= big.len() as u64 / 2);
}

#[test]
fn missing_rows_are_reported_with_zero_bytes() {
    let cluster = Cluster::new(&[(
        0,
        mem_table(2, init(sw_init_kind::SW_INIT_MISSING), sgd(1.0)),
    )]);
    let dims = [2u64];
    let mut g = f32_bytes(&[-1.0, -2.0, -3.0, -4.0]);
    assert_eq!(
        cluster.push_rows(&[rows(0, F32, &dims, &[10, 30], &mut g)]),
        Ok(vec![0])
    );
    let ids = [10u64, 20, 30, 40, 10];
    let mut out = vec![0xffu8; ids.len() * 8];
    let reply = cluster
        .pull_rows(&[rows(0, F32, &dims, &ids, &mut out)])
        .expect("pull");
    let mut positions = [9u32; 2];
    let mut count = 77;
    assert_eq!(
        sw_reply_missing(reply, 0, positions.as_mut_ptr(), 1, &mut count),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    assert_eq!((count, positions), (77, [9, 9]));
    assert_eq!(
        sw_reply_missing(reply, 1, positions.as_mut_ptr(), 2, &mut count),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        sw_reply_missing(reply, 0, positions.as_mut_ptr(), 2, &mut count),
        sw_result::SW_OK
    );
    assert_eq!((count, positions), (2, [1, 3]));
    sw_reply_free(reply);
    assert_eq!(
        to_f32(&out),
        [1.0, 2.0, 0.0, 0.0, 3.0, 4.0, 0.0, 0.0, 1.0, 2.0]
    );
}

#[test]
fn wrong_sizes_and_shapes_fail_at_once() {
    let cluster = Cluster::new(&[(0, mem_table(2, init(sw_init_kind::SW_INIT_ZEROS), sgd(1.0)))]);
    let dims = [2u64];
    let ids = [1u64, 2];
    let mut buf = vec![0u8; 16];
    let good = rows(0, F32, &dims, &ids, &mut buf);
    let cases: Vec<(sw_rows, sw_result, &str)> = vec![
        (
            sw_rows {
                byte_len: 15,
                ..good
            },
            sw_result::SW_ERR_INVALID_ARGUMENT,
            "byte_len",
        ),
        (
            sw_rows {
                byte_len: 17,
                ..good
            },
            sw_result::SW_ERR_INVALID_ARGUMENT,
            "byte_len",
        ),
        (
            sw_rows { dtype: F64, ..good },
            sw_result::SW_ERR_INVALID_ARGUMENT,
            "byte_len",
        ),
        (
            sw_rows {
                data: ptr::null_mut(),
                ..good
            },
            sw_result::SW_ERR_NULL,
            "data",
        ),
        (
            sw_rows { n: 0, ..good },
            sw_result::SW_ERR_INVALID_ARGUMENT,
            "no ids",
        ),
        (
            sw_rows {
                ids: ptr::null(),
                ..good
            },
            sw_result::SW_ERR_NULL,
            "ids",
        ),
        (
            sw_rows { rank: 8, ..good },
            sw_result::SW_ERR_INVALID_ARGUMENT,
            "rank",
        ),
        (
            sw_rows { dtype: 99, ..good },
            sw_result::SW_ERR_INVALID_ARGUMENT,
            "dtype",
        ),
    ];
    for (bad, code, what) in cases {
        let mut tag = 777;
        let tables = [good, bad];
        let r = sw_client_pull_rows(
            cluster.client,
            cluster.peer.as_ptr(),
            tables.as_ptr(),
            2,
            0,
            &mut tag,
        );
        assert_eq!(r, code, "{what}");
        assert!(last_error().contains(what), "{what}: {}", last_error());
        let r = sw_client_push_rows(
            cluster.client,
            cluster.peer.as_ptr(),
            tables.as_ptr(),
            2,
            0,
            &mut tag,
        );
        assert_eq!(r, code, "{what}");
        assert!(last_error().contains(what), "{what}: {}", last_error());
        assert_eq!(tag, 777, "no tag written on failure");
    }
    let mut tag = 777;
    let r = sw_client_pull_rows(
        cluster.client,
        cluster.peer.as_ptr(),
        [good].as_ptr(),
        0,
        0,
        &mut tag,
    );
    assert_eq!(r, sw_result::SW_ERR_INVALID_ARGUMENT);
    let r = sw_client_push_rows(
        cluster.client,
        cluster.peer.as_ptr(),
        ptr::null(),
        1,
        0,
        &mut tag,
    );
    assert_eq!(r, sw_result::SW_ERR_NULL);
    let r = sw_client_pull_rows(
        cluster.client,
        cluster.peer.as_ptr(),
        [good].as_ptr(),
        1,
        0,
        ptr::null_mut(),
    );
    assert_eq!(r, sw_result::SW_ERR_NULL);
    assert_eq!(tag, 777);
    // The client is still usable.
    let reply = cluster.pull_rows(&[good]).expect("pull");
    assert_eq!(statuses_and_missing(reply), [(0, vec![])]);

    // Tables: bad parameters.
    let adagrad = |acc| sw_optimizer {
        kind: sw_optimizer_kind::SW_OPTIMIZER_ADAGRAD as u32,
        lr: 0.1,
        initial_accumulator: acc,
    };
    let zeros = init(sw_init_kind::SW_INIT_ZEROS);
    let bad_tables = [
        (0, zeros, sgd(0.1), "dim"),
        (4, sw_init { kind: 3, ..zeros }, sgd(0.1), "init.kind"),
        (
            4,
            sw_init {
                kind: sw_init_kind::SW_INIT_UNIFORM as u32,
                scale: f32::NAN,
                seed: 0,
            },
            sgd(0.1),
            "init.scale",
        ),
        (4, zeros, sgd(f32::INFINITY), "optimizer.lr"),
        (
            4,
            zeros,
            sw_optimizer {
                kind: 2,
                ..sgd(0.1)
            },
            "optimizer.kind",
        ),
        (4, zeros, adagrad(0.0), "initial_accumulator"),
    ];
    for (dim, i, o, what) in bad_tables {
        let mut t = 0x1 as *mut sw_table;
        let r = sw_mem_table_new(dim, i, o, &mut t);
        assert_eq!(r, sw_result::SW_ERR_INVALID_ARGUMENT, "{what}");
        assert!(last_error().contains(what), "{what}: {}", last_error());
        assert_eq!(t as usize, 0x1);
    }
    sw_table_free(mem_table(4, zeros, adagrad(0.1)));

    // A table id given twice.
    let (a, b) = (mem_table(2, zeros, sgd(1.0)), mem_table(2, zeros, sgd(1.0)));
    let opts = options(&[4, 4], &[a.cast_const(), b.cast_const()]);
    let mut rt = ptr::null_mut();
    assert_eq!(
        sw_runtime_new(&opts, &mut rt),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    assert!(last_error().contains("twice"), "{}", last_error());
    assert!(rt.is_null());
    sw_table_free(a);
    sw_table_free(b);
}

#[test]
fn unknown_tables_and_other_shapes_fail_per_table() {
    let cluster = Cluster::new(&[(3, mem_table(2, init(sw_init_kind::SW_INIT_ZEROS), sgd(1.0)))]);
    let ids = [1u64, 2];
    let mut g = f32_bytes(&[1.0, 2.0, 3.0, 4.0]);
    let mut g_other = g.clone();
    let mut g64 = vec![0u8; 32];
    let push = [
        rows(3, F32, &[2], &ids, &mut g),
        rows(77, F32, &[2], &ids, &mut g_other),
        rows(3, F64, &[2], &ids, &mut g64),
    ];
    // 1 NOT_FOUND for the table not served, 7 INVALID_ARGUMENT for another dtype.
    assert_eq!(cluster.push_rows(&push), Ok(vec![0, 1, 7]));

    let (mut a, mut b, mut c, mut d) = (vec![0u8; 16], vec![0u8; 16], vec![0u8; 32], vec![0u8; 24]);
    let pull = [
        rows(77, F32, &[2], &ids, &mut b),
        rows(3, F32, &[2], &ids, &mut a),
        rows(3, F64, &[2], &ids, &mut c),
        rows(3, F32, &[3], &ids, &mut d),
    ];
    let reply = cluster.pull_rows(&pull).expect("pull");
    assert_eq!(
        statuses_and_missing(reply),
        [(1, vec![]), (0, vec![]), (7, vec![]), (7, vec![])]
    );
    assert_eq!(to_f32(&a), [-1.0, -2.0, -3.0, -4.0]);

    // A task serving no tables (and no service) refuses rows requests as a whole.
    let bare = Cluster::new(&[]);
    let mut buf = vec![0u8; 16];
    let r = bare.pull_rows(&[rows(3, F32, &[2], &ids, &mut buf)]);
    assert_eq!(r.err(), Some(sw_result::SW_ERR_REMOTE));
}

#[test]
fn tables_serve_beside_a_c_service() {
    // With tables and no service, plain pulls are answered UNIMPLEMENTED per id.
    let cluster = Cluster::new(&[(0, mem_table(2, init(sw_init_kind::SW_INIT_ZEROS), sgd(1.0)))]);
    let mut tag = 0;
    let ids = [1u64, 2];
    let r = sw_client_pull(
        cluster.client,
        cluster.peer.as_ptr(),
        ids.as_ptr(),
        2,
        5000,
        &mut tag,
    );
    assert_eq!(r, sw_result::SW_OK);
    let reply = cluster.wait(tag).expect("pull");
    assert_eq!(
        (sw_reply_status(reply, 0), sw_reply_status(reply, 1)),
        (9, 9)
    );
    // Not a rows reply: no missing rows.
    let mut count = 5;
    assert_eq!(
        sw_reply_missing(reply, 1, ptr::null_mut(), 0, &mut count),
        sw_result::SW_OK
    );
    assert_eq!(count, 0);
    sw_reply_free(reply);
}

unsafe extern "C" fn ignore(_: *mut c_void, _: u64, _: sw_result, reply: *mut sw_reply) {
    sw_reply_free(reply);
}

/// What a callback saw of a rows pull: its tag, result, the table's status and missing
/// rows, and whether it was called.
#[derive(Default)]
struct RowsSeen {
    got: std::sync::Mutex<Option<Seen>>,
}

/// The tag, result, status of table 0 and its missing rows.
type Seen = (u64, sw_result, u32, Vec<u32>);

unsafe extern "C" fn on_rows(user: *mut c_void, tag: u64, code: sw_result, reply: *mut sw_reply) {
    // SAFETY: `user` is the test's `RowsSeen`, alive until the client is freed; the reply
    // is ours to read and free.
    unsafe {
        let seen = &*(user as *const RowsSeen);
        let status = if reply.is_null() {
            u32::MAX
        } else {
            sw_reply_status(reply, 0)
        };
        let mut missing = vec![0u32; 8];
        let mut count = 0;
        if !reply.is_null() {
            sw_reply_missing(reply, 0, missing.as_mut_ptr(), missing.len(), &mut count);
        }
        missing.truncate(count);
        *seen.got.lock().unwrap() = Some((tag, code, status, missing));
        sw_reply_free(reply);
    }
}

#[test]
fn a_client_with_a_callback_pulls_rows_into_the_callers_buffer() {
    let cluster = Cluster::new(&[(
        0,
        mem_table(2, init(sw_init_kind::SW_INIT_MISSING), sgd(1.0)),
    )]);
    let seen = RowsSeen::default();
    // Rows 1 and 2 exist after a push; row 9 is missing.
    let pushed = [1u64, 2];
    let mut grads: Vec<u8> = [-1.0f32, -2.0, -3.0, -4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let ids = [1u64, 9, 2];
    let mut buf = vec![0xEEu8; ids.len() * 8];
    let table = rows(0, F32, &[2], &ids, &mut buf);
    let mut tag = 0;
    let push = rows(0, F32, &[2], &pushed, &mut grads);
    let r = sw_client_push_rows(
        cluster.client,
        cluster.peer.as_ptr(),
        &push,
        1,
        5000,
        &mut tag,
    );
    assert_eq!(r, sw_result::SW_OK);
    let reply = cluster.wait(tag).expect("push");
    assert_eq!(sw_reply_status(reply, 0), 0);
    sw_reply_free(reply);
    let mut c = ptr::null_mut();
    let user = &seen as *const RowsSeen as *mut c_void;
    assert_eq!(
        sw_client_new_with_callback(cluster.worker, 4, Some(on_rows), user, &mut c),
        sw_result::SW_OK
    );
    let r = sw_client_pull_rows(c, cluster.peer.as_ptr(), &table, 1, 5000, &mut tag);
    assert_eq!(r, sw_result::SW_OK, "{}", last_error());
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while seen.got.lock().unwrap().is_none() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    sw_client_free(c);
    let got = seen
        .got
        .lock()
        .unwrap()
        .take()
        .expect("the callback was called");
    assert_eq!(got, (got.0, sw_result::SW_OK, 0, vec![1]));
    let values: Vec<f32> = buf
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    // SGD with lr 1 from a new row of zeros: the negated gradients; the missing row zero.
    assert_eq!(values, [1.0, 2.0, 0.0, 0.0, 3.0, 4.0]);
}

#[test]
fn freeing_a_client_waits_for_its_rows_pulls() {
    for embedded in [false, true] {
        for reported in [false, true] {
            freeing_waits(embedded, reported);
        }
    }
}

/// A client freed with a rows pull in flight, of the runtime's loops or embedded; when
/// `reported`, the pull's completion was reported by `sw_client_poll` and not waited for.
fn freeing_waits(embedded: bool, reported: bool) {
    let cluster = Cluster::new(&[(
        0,
        mem_table(
            3,
            sw_init {
                kind: sw_init_kind::SW_INIT_UNIFORM as u32,
                scale: 1.0,
                seed: 1,
            },
            sgd(1.0),
        ),
    )]);
    let ids: Vec<u64> = (0..1000).collect();
    let mut buf = vec![0u8; ids.len() * 12];
    let table = rows(0, F32, &[3], &ids, &mut buf);
    let mut c = ptr::null_mut();
    let r = if embedded {
        sw_client_new_embedded(cluster.worker, ptr::null(), ptr::null(), 0, &mut c)
    } else {
        sw_client_new(cluster.worker, 4, &mut c)
    };
    assert_eq!(r, sw_result::SW_OK);
    let mut tag = 0;
    let r = sw_client_pull_rows(c, cluster.peer.as_ptr(), &table, 1, 5000, &mut tag);
    assert_eq!(r, sw_result::SW_OK);
    if reported {
        let (mut done, mut ready) = (0u64, false);
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !ready {
            assert!(std::time::Instant::now() < give_up, "never completed");
            assert_eq!(sw_client_poll(c, &mut done, &mut ready), sw_result::SW_OK);
        }
        assert_eq!(done, tag);
    }
    sw_client_free(c);
    let init = Init::Uniform {
        scale: 1.0,
        seed: 1,
    };
    let got = to_f32(&buf);
    for (i, &id) in ids.iter().enumerate() {
        assert_eq!(got[i * 3 + 2], init.value(id, 2), "embedded {embedded}");
    }
}

#[test]
fn an_embedded_client_sends_what_it_submits_before_any_wait() {
    let cluster =
        Cluster::embedded(&[(0, mem_table(2, init(sw_init_kind::SW_INIT_ZEROS), sgd(1.0)))]);
    // The connection is up (a request to a peer not yet connected goes out once its
    // connection is, which takes the loop's next calls).
    cluster.ping_for(std::time::Duration::ZERO);
    let ids = [7u64];
    let mut grads = f32_bytes(&[1.0, 2.0]);
    let push = [rows(0, F32, &[2], &ids, &mut grads)];
    let mut tag = 0;
    let r = sw_client_push_rows(
        cluster.client,
        cluster.peer.as_ptr(),
        push.as_ptr(),
        1,
        5000,
        &mut tag,
    );
    assert_eq!(r, sw_result::SW_OK);
    // Not waited for: a client of the runtime's loops sees the update all the same.
    let mut other = ptr::null_mut();
    assert_eq!(
        sw_client_new(cluster.worker, 4, &mut other),
        sw_result::SW_OK
    );
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let mut out = vec![0u8; 8];
        let table = rows(0, F32, &[2], &ids, &mut out);
        let (mut missing, mut count) = ([0u32; 1], 0usize);
        let r = sw_client_pull_rows_wait(
            other,
            cluster.peer.as_ptr(),
            &table,
            5000,
            missing.as_mut_ptr(),
            &mut count,
        );
        assert_eq!(r, sw_result::SW_OK, "{}", last_error());
        if to_f32(&out) == [-1.0, -2.0] {
            break;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "the push never went out"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    sw_client_free(other);
    let reply = cluster.wait(tag).expect("the push's reply");
    assert_eq!(sw_reply_status(reply, 0), 0);
    sw_reply_free(reply);
}

#[test]
fn a_rows_pull_that_fails_gives_its_buffers_back() {
    // Nobody listens at the peer: the pull fails, and the wait returns.
    let cluster = Cluster::new(&[]);
    let ids = [1u64];
    let mut buf = vec![0xabu8; 8];
    let table = rows(0, F32, &[2], &ids, &mut buf);
    let mut tag = 0;
    let r = sw_client_pull_rows(
        cluster.client,
        c"127.0.0.1:1".as_ptr(),
        &table,
        1,
        300,
        &mut tag,
    );
    assert_eq!(r, sw_result::SW_OK);
    let r = cluster.wait(tag);
    assert!(
        matches!(
            r,
            Err(sw_result::SW_ERR_CONNECT_FAILED
                | sw_result::SW_ERR_CONNECTION_LOST
                | sw_result::SW_ERR_TIMEOUT)
        ),
        "{r:?}"
    );
    assert_eq!(buf, [0xab; 8]);
}

#[test]
fn a_rows_pull_given_up_mid_transfer_leaves_the_buffer_alone_after_its_wait() {
    a_rows_pull_given_up_mid_transfer_leaves_the_buffer_alone_after_its_wait_with(Cluster::new);
}

#[test]
fn a_rows_pull_given_up_mid_transfer_leaves_the_buffer_alone_after_its_wait_embedded() {
    a_rows_pull_given_up_mid_transfer_leaves_the_buffer_alone_after_its_wait_with(
        Cluster::embedded,
    );
}

fn a_rows_pull_given_up_mid_transfer_leaves_the_buffer_alone_after_its_wait_with(
    make: fn(&[(u32, *mut sw_table)]) -> Cluster,
) {
    let cluster = make(&[(
        0,
        mem_table(
            64,
            sw_init {
                kind: sw_init_kind::SW_INIT_UNIFORM as u32,
                scale: 1.0,
                seed: 2,
            },
            sgd(1.0),
        ),
    )]);
    let ids: Vec<u64> = (0..40_000).collect();
    let mut buf = vec![0u8; ids.len() * 64 * 4];
    // Create the rows first, so that the deadlines below fall inside the transfer.
    let reply = cluster
        .pull_rows(&[rows(0, F32, &[64], &ids, &mut buf)])
        .expect("pull");
    assert_eq!(statuses_and_missing(reply), [(0, vec![])]);
    for timeout_ms in [1u64, 2, 3, 5, 8] {
        buf.fill(0xff);
        let table = rows(0, F32, &[64], &ids, &mut buf);
        let mut tag = 0;
        let r = sw_client_pull_rows(
            cluster.client,
            cluster.peer.as_ptr(),
            &table,
            1,
            timeout_ms,
            &mut tag,
        );
        assert_eq!(r, sw_result::SW_OK);
        match cluster.wait(tag) {
            Ok(reply) => {
                assert_eq!(statuses_and_missing(reply), [(0, vec![])]);
            }
            Err(r) => assert_eq!(r, sw_result::SW_ERR_TIMEOUT),
        }
        // Once the wait returned, nothing writes into the buffer any more, while the
        // client's loop runs on (an embedded one only in its calls: pings).
        let snapshot = buf.clone();
        cluster.ping_for(std::time::Duration::from_millis(20));
        assert!(buf == snapshot, "written after the wait ({timeout_ms} ms)");
    }
    // The connection still serves.
    let reply = cluster
        .pull_rows(&[rows(0, F32, &[64], &ids[..10], &mut buf[..10 * 256])])
        .expect("pull");
    assert_eq!(statuses_and_missing(reply), [(0, vec![])]);
}

/// `sw_client_pull_rows_wait`: the outcome, and the missing positions (`count` set to 77
/// first, so that a failure shows it unwritten).
fn pull_rows_wait(
    cluster: &Cluster,
    peer: &CStr,
    table: &sw_rows,
    timeout_ms: u64,
) -> (sw_result, Vec<u32>) {
    let mut missing = vec![9u32; table.n];
    let mut count = 77usize;
    let r = sw_client_pull_rows_wait(
        cluster.client,
        peer.as_ptr(),
        table,
        timeout_ms,
        missing.as_mut_ptr(),
        &mut count,
    );
    if r == sw_result::SW_OK {
        missing.truncate(count);
    } else {
        assert_eq!(count, 77, "nothing written on failure");
        assert!(missing.iter().all(|&m| m == 9));
        missing.clear();
    }
    (r, missing)
}

#[test]
fn a_rows_pull_in_one_call_fills_the_buffer_and_reports_the_missing_rows() {
    let cluster = Cluster::new(&[
        (
            0,
            mem_table(2, init(sw_init_kind::SW_INIT_MISSING), sgd(1.0)),
        ),
        (
            1,
            mem_table(64, init(sw_init_kind::SW_INIT_ZEROS), sgd(1.0)),
        ),
    ]);
    let dims = [2u64];
    let mut g = f32_bytes(&[-1.0, -2.0, -3.0, -4.0]);
    assert_eq!(
        cluster.push_rows(&[rows(0, F32, &dims, &[10, 30], &mut g)]),
        Ok(vec![0])
    );
    let ids = [10u64, 20, 30, 40, 10];
    let mut out = vec![0xffu8; ids.len() * 8];
    let table = rows(0, F32, &dims, &ids, &mut out);
    let (r, missing) = pull_rows_wait(&cluster, &cluster.peer, &table, 5000);
    assert_eq!(r, sw_result::SW_OK, "{}", last_error());
    assert_eq!(missing, [1, 3]);
    assert_eq!(
        to_f32(&out),
        [1.0, 2.0, 0.0, 0.0, 3.0, 4.0, 0.0, 0.0, 1.0, 2.0]
    );

    // Repeated calls reuse the client's request vectors; each lands in its own buffer. A
    // large block goes from the socket straight into the buffer.
    let big_ids: Vec<u64> = (0..40_000).collect();
    for round in 0..3u8 {
        let mut big = vec![round + 1; big_ids.len() * 64 * 4];
        let before = cluster.stats().payload_direct;
        let table = rows(1, F32, &[64], &big_ids, &mut big);
        let (r, missing) = pull_rows_wait(&cluster, &cluster.peer, &table, 5000);
        assert_eq!((r, missing), (sw_result::SW_OK, vec![]), "{}", last_error());
        assert!(big.iter().all(|&b| b == 0));
        assert!(cluster.stats().payload_direct - before >= big.len() as u64 / 2);
    }

    // A table the peer does not serve, or of another shape: SW_ERR_REMOTE with the table's
    // wire status and the peer's words, and the buffer untouched.
    for (table_id, row_dims, status, name) in [
        (7u32, [2u64], 1u32, "no table 7 on this task"),
        (
            0,
            [3],
            7,
            "table 0 holds f32 [2] rows; the request asked for f32 [3]",
        ),
    ] {
        let mut buf = vec![0xabu8; 2 * 4 * row_dims[0] as usize];
        let table = rows(table_id, F32, &row_dims, &ids[..2], &mut buf);
        let (r, _) = pull_rows_wait(&cluster, &cluster.peer, &table, 5000);
        assert_eq!(r, sw_result::SW_ERR_REMOTE);
        assert_eq!(sw_last_error_status(), status);
        assert!(last_error().contains(name), "{}", last_error());
        assert!(buf.iter().all(|&b| b == 0xab));
    }

    // Invalid arguments fail before anything is sent; nobody listening fails at the wait.
    let mut short = vec![0u8; 7];
    let bad = rows(0, F32, &dims, &ids[..1], &mut short);
    let (r, _) = pull_rows_wait(&cluster, &cluster.peer, &bad, 5000);
    assert_eq!(r, sw_result::SW_ERR_INVALID_ARGUMENT);
    let mut buf = vec![0xabu8; 8];
    let table = rows(0, F32, &dims, &ids[..1], &mut buf);
    let (r, _) = pull_rows_wait(&cluster, c"127.0.0.1:1", &table, 300);
    assert!(
        matches!(
            r,
            sw_result::SW_ERR_CONNECT_FAILED
                | sw_result::SW_ERR_CONNECTION_LOST
                | sw_result::SW_ERR_TIMEOUT
        ),
        "{r:?}"
    );
    assert_eq!(buf, [0xab; 8]);
    let r = sw_client_pull_rows_wait(
        cluster.client,
        cluster.peer.as_ptr(),
        &table,
        5000,
        ptr::null_mut(),
        ptr::null_mut(),
    );
    assert_eq!(r, sw_result::SW_ERR_NULL);
}

#[test]
fn a_rows_pull_in_one_call_needs_a_client_that_waits() {
    let cluster = Cluster::new(&[(0, mem_table(2, init(sw_init_kind::SW_INIT_ZEROS), sgd(1.0)))]);
    let ids = [1u64];
    let mut buf = vec![0u8; 8];
    let table = rows(0, F32, &[2], &ids, &mut buf);
    let mut missing = [0u32; 1];
    let mut count = 0;
    let mut c = ptr::null_mut();
    assert_eq!(
        sw_client_new_with_callback(cluster.worker, 4, Some(ignore), ptr::null_mut(), &mut c),
        sw_result::SW_OK
    );
    let r = sw_client_pull_rows_wait(
        c,
        cluster.peer.as_ptr(),
        &table,
        5000,
        missing.as_mut_ptr(),
        &mut count,
    );
    assert_eq!(r, sw_result::SW_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("callback"), "{}", last_error());
    sw_client_free(c);
}

#[test]
fn a_rows_pull_in_one_call_given_up_mid_transfer_leaves_the_buffer_alone_once_it_returns() {
    a_rows_pull_in_one_call_given_up_mid_transfer_leaves_the_buffer_alone_once_it_returns_with(
        Cluster::new,
    );
}

#[test]
fn a_rows_pull_in_one_call_given_up_mid_transfer_leaves_the_buffer_alone_once_it_returns_embedded()
{
    a_rows_pull_in_one_call_given_up_mid_transfer_leaves_the_buffer_alone_once_it_returns_with(
        Cluster::embedded,
    );
}

fn a_rows_pull_in_one_call_given_up_mid_transfer_leaves_the_buffer_alone_once_it_returns_with(
    make: fn(&[(u32, *mut sw_table)]) -> Cluster,
) {
    let cluster = make(&[(
        0,
        mem_table(
            64,
            sw_init {
                kind: sw_init_kind::SW_INIT_UNIFORM as u32,
                scale: 1.0,
                seed: 2,
            },
            sgd(1.0),
        ),
    )]);
    let ids: Vec<u64> = (0..40_000).collect();
    let mut buf = vec![0u8; ids.len() * 64 * 4];
    // Create the rows first, so that the deadlines below fall inside the transfer.
    let table = rows(0, F32, &[64], &ids, &mut buf);
    assert_eq!(
        pull_rows_wait(&cluster, &cluster.peer, &table, 5000),
        (sw_result::SW_OK, vec![])
    );
    for timeout_ms in [1u64, 2, 3, 5, 8] {
        buf.fill(0xff);
        let table = rows(0, F32, &[64], &ids, &mut buf);
        let (r, missing) = pull_rows_wait(&cluster, &cluster.peer, &table, timeout_ms);
        match r {
            sw_result::SW_OK => assert_eq!(missing, Vec::<u32>::new()),
            r => assert_eq!(r, sw_result::SW_ERR_TIMEOUT),
        }
        // Once the call returned, nothing writes into the buffer any more, while the
        // client's loop runs on (an embedded one only in its calls: pings).
        let snapshot = buf.clone();
        cluster.ping_for(std::time::Duration::from_millis(20));
        assert!(buf == snapshot, "written after the call ({timeout_ms} ms)");
    }
    // The connection still serves.
    let table = rows(0, F32, &[64], &ids[..10], &mut buf[..10 * 256]);
    assert_eq!(
        pull_rows_wait(&cluster, &cluster.peer, &table, 5000),
        (sw_result::SW_OK, vec![])
    );
}

/// Counts `release` calls of wrapped buffers (`user_data`: an `AtomicUsize`).
unsafe extern "C" fn count_release(user_data: *mut c_void) {
    // SAFETY: the test passes a pointer to an `AtomicUsize` that outlives the tensors.
    let n = unsafe { &*user_data.cast::<std::sync::atomic::AtomicUsize>() };
    n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

#[test]
fn rows_pushed_from_tensors_are_sent_from_the_callers_buffers() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let cluster = Cluster::new(&[
        (3, mem_table(4, init(sw_init_kind::SW_INIT_ZEROS), sgd(1.0))),
        (
            5,
            mem_table(64, init(sw_init_kind::SW_INIT_ZEROS), sgd(1.0)),
        ),
    ]);
    // A tiny block (copied into the frame) and a 256 KB one (sent from the buffer).
    let ids3 = [1u64, 2];
    let ids5: Vec<u64> = (0..1000).collect();
    let g3 = f32_bytes(&[0.5; 8]);
    let g5 = f32_bytes(&vec![0.25; 1000 * 64]);
    let released = AtomicUsize::new(0);
    let user = (&released as *const AtomicUsize)
        .cast_mut()
        .cast::<c_void>();
    let wrap = |g: &[u8]| {
        let mut t = ptr::null_mut();
        let dims = [g.len() as u64];
        let r = sw_tensor_wrap(
            U8,
            dims.as_ptr(),
            1,
            g.as_ptr().cast(),
            g.len() as u64,
            Some(count_release),
            user,
            &mut t,
        );
        assert_eq!(r, sw_result::SW_OK, "{}", last_error());
        t
    };
    let (t3, t5) = (wrap(&g3), wrap(&g5));
    let mut tables = [
        rows(3, F32, &[4], &ids3, &mut []),
        rows(5, F32, &[64], &ids5, &mut []),
    ];
    // The rows' bytes are the tensors': `data` is not read.
    tables[0].data = ptr::null_mut();
    tables[0].byte_len = g3.len() as u64;
    tables[1].data = ptr::null_mut();
    tables[1].byte_len = g5.len() as u64;
    let grads = [t3.cast_const(), t5.cast_const()];
    let mut tag = 0;
    let push = |grads: &[*const sw_tensor; 2], tag: &mut u64| {
        sw_client_push_rows_tensors(
            cluster.client,
            cluster.peer.as_ptr(),
            tables.as_ptr(),
            grads.as_ptr(),
            2,
            5000,
            tag,
        )
    };
    let r = push(&grads, &mut tag);
    assert_eq!(r, sw_result::SW_OK, "{}", last_error());
    let reply = cluster.wait(tag).expect("push");
    assert_eq!(sw_reply_count(reply), 2);
    assert_eq!(
        (sw_reply_status(reply, 0), sw_reply_status(reply, 1)),
        (0, 0)
    );
    sw_reply_free(reply);
    sw_tensor_free(t3);
    sw_tensor_free(t5);
    // Released once the connection has written them (reported just after the answer at
    // most): the buffers are the caller's again.
    while released.load(Ordering::SeqCst) < 2 {
        std::thread::yield_now();
    }
    let mut out3 = vec![0xffu8; g3.len()];
    let mut out5 = vec![0xffu8; g5.len()];
    let reply = cluster
        .pull_rows(&[
            rows(3, F32, &[4], &ids3, &mut out3),
            rows(5, F32, &[64], &ids5, &mut out5),
        ])
        .expect("pull");
    assert_eq!(statuses_and_missing(reply), [(0, vec![]), (0, vec![])]);
    assert_eq!(to_f32(&out3), [-0.5; 8]);
    assert!(to_f32(&out5).iter().all(|&v| v == -0.25));

    // A tensor of another length than its table's rows: refused at once.
    let t = wrap(&g3);
    let grads = [t.cast_const(), t.cast_const()];
    let r = push(&grads, &mut tag);
    assert_eq!(r, sw_result::SW_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("grads[1]"), "{}", last_error());
    sw_tensor_free(t);
    assert_eq!(released.load(Ordering::SeqCst), 3);
}
