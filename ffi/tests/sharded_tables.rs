//! Several tables over the same PS tasks through the C ABI (`sw_sharded_tables_*`): two PS
//! tasks on loopback serving two tables each, a worker whose step is one rows request per
//! PS for both tables, and the same rows as the per-table `sw_sharded` gives.

mod common;

use common::*;
use starwire_ffi::*;
use std::ffi::{c_char, CString};
use std::ptr;

const F32: u8 = 10;
const BF16: u8 = 7;
/// Table id and row size of the two tables.
const TABLES: [(u32, usize); 2] = [(5, 2), (6, 3)];

const MOD: sw_partition = sw_partition {
    kind: sw_partition_kind::SW_PARTITION_MOD as u32,
    vocab: 0,
};

/// A PS serving `TABLES` (rows missing until pushed, SGD with rate 1), or a worker.
fn runtime(ps: bool) -> *mut sw_runtime {
    let names = [c"STARWIRE_CONNECT_RETRIES".as_ptr()];
    let values = [c"0".as_ptr()];
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
    let tables: Vec<*mut sw_table> = TABLES
        .iter()
        .map(|&(_, dim)| {
            let mut t = ptr::null_mut();
            ok(sw_mem_table_new(dim, init, sgd, &mut t));
            t
        })
        .collect();
    let consts: Vec<*const sw_table> = tables.iter().map(|&t| t.cast_const()).collect();
    let ids: Vec<u32> = TABLES.iter().map(|&(id, _)| id).collect();
    let o = sw_runtime_options {
        job: if ps { c"ps" } else { c"worker" }.as_ptr(),
        task_index: 0,
        setting_names: names.as_ptr(),
        setting_values: values.as_ptr(),
        settings: 1,
        use_env: true,
        listen: if ps {
            c"127.0.0.1:0".as_ptr()
        } else {
            ptr::null()
        },
        service: ptr::null(),
        allocator: ptr::null(),
        handler_threads: 0,
        table_ids: ids.as_ptr(),
        tables: consts.as_ptr(),
        n_tables: if ps { ids.len() } else { 0 },
    };
    let mut rt = ptr::null_mut();
    ok(sw_runtime_new(&o, &mut rt));
    for t in tables {
        sw_table_free(t);
    }
    rt
}

fn frames_in(rt: *mut sw_runtime) -> u64 {
    let mut s = sw_stats::default();
    ok(sw_runtime_stats(rt, &mut s));
    s.frames_in
}

fn batch(ids: &[u64], data: &mut [u8]) -> sw_table_batch {
    sw_table_batch {
        ids: ids.as_ptr(),
        n: ids.len(),
        data: data.as_mut_ptr().cast(),
        byte_len: data.len() as u64,
    }
}

/// Two PS tasks serving `TABLES`, a worker with a client, and the tables' shapes (over
/// `dims`, which the setup keeps).
struct Setup {
    ps: [*mut sw_runtime; 2],
    worker: *mut sw_runtime,
    c: *mut sw_client,
    addrs: Vec<CString>,
    dims: Vec<[u64; 1]>,
}

impl Setup {
    fn new() -> Setup {
        let ps = [runtime(true), runtime(true)];
        let worker = runtime(false);
        let mut c = ptr::null_mut();
        ok(sw_client_new(worker, 16, &mut c));
        let addrs = ps
            .iter()
            .map(|&p| CString::new(format!("127.0.0.1:{}", sw_runtime_port(p))).unwrap())
            .collect();
        let dims = TABLES.iter().map(|&(_, d)| [d as u64]).collect();
        Setup {
            ps,
            worker,
            c,
            addrs,
            dims,
        }
    }

    /// The PS tasks' addresses, for `peers` arguments.
    fn peers(&self) -> Vec<*const c_char> {
        self.addrs.iter().map(|a| a.as_ptr()).collect()
    }

    fn shapes(&self) -> Vec<sw_table_shape> {
        TABLES
            .iter()
            .zip(&self.dims)
            .map(|(&(table, _), d)| sw_table_shape {
                table,
                dtype: F32,
                row_dims: d.as_ptr(),
                rank: 1,
                partition: MOD,
            })
            .collect()
    }
}

/// The arrays of a unique pull of two tables' batches: inverse, unique ids and rows.
struct UniqueBuffers {
    inverse: Vec<Vec<i64>>,
    unique: Vec<Vec<u64>>,
    rows: Vec<Vec<u8>>,
}

impl UniqueBuffers {
    fn new(ids: &[&[u64]; 2]) -> UniqueBuffers {
        UniqueBuffers {
            inverse: (0..2).map(|t| vec![-1; ids[t].len()]).collect(),
            unique: (0..2).map(|t| vec![0; ids[t].len()]).collect(),
            rows: (0..2)
                .map(|t| vec![0xff; ids[t].len() * TABLES[t].1 * 4])
                .collect(),
        }
    }

    /// The batches of a unique pull of `ids` into these arrays (`unique_len` 99 until
    /// written).
    fn batches(&mut self, ids: &[&[u64]; 2]) -> Vec<sw_unique_batch> {
        (0..2)
            .map(|t| sw_unique_batch {
                ids: ids[t].as_ptr(),
                n: ids[t].len(),
                inverse: self.inverse[t].as_mut_ptr(),
                unique: self.unique[t].as_mut_ptr(),
                data: self.rows[t].as_mut_ptr().cast(),
                byte_len: self.rows[t].len() as u64,
                unique_len: 99,
            })
            .collect()
    }
}

#[test]
fn a_step_of_two_tables_is_one_request_per_ps_with_the_per_table_rows() {
    let setup = Setup::new();
    let (ps, worker, c) = (setup.ps, setup.worker, setup.c);
    let (peers, dims, shapes) = (setup.peers(), &setup.dims, setup.shapes());
    let mut s = ptr::null_mut();
    ok(sw_sharded_tables_new(
        peers.as_ptr(),
        2,
        shapes.as_ptr(),
        2,
        &mut s,
    ));
    assert_eq!(sw_sharded_tables_len(s), 2);
    let singles: Vec<*mut sw_sharded> = TABLES
        .iter()
        .zip(dims)
        .map(|(&(table, _), d)| {
            let mut one = ptr::null_mut();
            ok(sw_sharded_new(
                peers.as_ptr(),
                2,
                MOD,
                table,
                F32,
                d.as_ptr(),
                1,
                &mut one,
            ));
            one
        })
        .collect();

    let ids: [&[u64]; 2] = [&[1, 2, 1, 4], &[3, 8, 8]];
    // Position j's gradient: j + 1 + 0.001 in every element (so that bf16 rounds it).
    let mut grads: Vec<Vec<u8>> = (0..2)
        .map(|t| {
            let g: Vec<f32> = (0..ids[t].len())
                .flat_map(|j| vec![j as f32 + 1.001; TABLES[t].1])
                .collect();
            f32_bytes(&g)
        })
        .collect();
    let mut report = sw_step_report::default();
    let step = |way: &str, batches: &[sw_table_batch], report: &mut sw_step_report| {
        let before = ps.map(frames_in);
        let r = if way == "pull" {
            sw_sharded_tables_pull(s, c, batches.as_ptr(), batches.len(), 10_000, report)
        } else {
            sw_sharded_tables_push(s, c, batches.as_ptr(), batches.len(), 10_000, report)
        };
        ok(r);
        let after = ps.map(frames_in);
        (after[0] - before[0], after[1] - before[1])
    };
    let pushes: Vec<sw_table_batch> = (0..2).map(|t| batch(ids[t], &mut grads[t])).collect();
    // The first step also connects (a handshake frame of its own).
    step("push", &pushes, &mut report);
    assert_eq!((report.unique, report.failed), (5, 0));
    assert_eq!(step("push", &pushes, &mut report), (1, 1));

    let mut outs: Vec<Vec<u8>> = (0..2)
        .map(|t| vec![0xff; ids[t].len() * TABLES[t].1 * 4])
        .collect();
    let pulls: Vec<sw_table_batch> = outs
        .iter_mut()
        .enumerate()
        .map(|(t, o)| batch(ids[t], o))
        .collect();
    assert_eq!(step("pull", &pulls, &mut report), (1, 1));
    assert_eq!((report.unique, report.missing, report.fallbacks), (5, 0, 0));
    assert_eq!(sw_sharded_tables_part(s, 1), sw_result::SW_OK);
    // Two pushes of the summed gradients: id 1 of table 5 at positions 0 and 2.
    assert_eq!(to_f32(&outs[0])[..2], [-2.0 * (1.001 + 3.001); 2]);
    for (t, &one) in singles.iter().enumerate() {
        let mut want = vec![0u8; outs[t].len()];
        ok(sw_sharded_pull(
            one,
            c,
            ids[t].as_ptr(),
            ids[t].len(),
            want.as_mut_ptr().cast(),
            want.len() as u64,
            10_000,
            &mut report,
        ));
        assert_eq!(to_f32(&outs[t]), to_f32(&want), "table {}", TABLES[t].0);
    }

    // Each distinct id once, both tables in one request per PS: ids by PS (even ids at
    // PS 0), each PS's in the order first seen; rows[inverse] is the plain pull.
    let mut bufs = UniqueBuffers::new(&ids);
    let mut uniques = bufs.batches(&ids);
    let (inverse, unique, rows) = (&bufs.inverse, &bufs.unique, &bufs.rows);
    let before = ps.map(frames_in);
    ok(sw_sharded_tables_pull_unique(
        s,
        c,
        uniques.as_mut_ptr(),
        2,
        10_000,
        &mut report,
    ));
    let after = ps.map(frames_in);
    assert_eq!((after[0] - before[0], after[1] - before[1]), (1, 1));
    assert_eq!((uniques[0].unique_len, uniques[1].unique_len), (3, 2));
    assert_eq!((report.unique, report.missing), (5, 0));
    assert_eq!(&unique[0][..3], &[2, 4, 1]);
    assert_eq!(inverse[0], [2, 0, 2, 1]);
    assert_eq!(&unique[1][..2], &[8, 3]);
    assert_eq!(inverse[1], [1, 0, 0]);
    for t in 0..2 {
        let (dim, plain, got) = (TABLES[t].1, to_f32(&outs[t]), to_f32(&rows[t]));
        for (pos, &j) in inverse[t].iter().enumerate() {
            let j = j as usize;
            assert_eq!(
                got[j * dim..(j + 1) * dim],
                plain[pos * dim..(pos + 1) * dim]
            );
        }
    }
    // A table's inverse missing: refused, naming it; nothing sent or written.
    uniques[1].inverse = ptr::null_mut();
    uniques[0].unique_len = 77;
    let before = ps.map(frames_in);
    let r = sw_sharded_tables_pull_unique(s, c, uniques.as_mut_ptr(), 2, 10_000, &mut report);
    assert_eq!(r, sw_result::SW_ERR_NULL);
    assert!(
        last_error().contains("batches[1].inverse"),
        "{}",
        last_error()
    );
    assert_eq!(ps.map(frames_in), before);
    assert_eq!(uniques[0].unique_len, 77);

    // In bf16 on the wire: the same rows rounded.
    ok(sw_sharded_tables_set_wire_dtype(s, BF16));
    let exact: Vec<Vec<f32>> = outs.iter().map(|o| to_f32(o)).collect();
    let pulls: Vec<sw_table_batch> = outs
        .iter_mut()
        .enumerate()
        .map(|(t, o)| batch(ids[t], o))
        .collect();
    assert_eq!(step("pull", &pulls, &mut report), (1, 1));
    for t in 0..2 {
        let want: Vec<f32> = exact[t].iter().map(|&x| bf16(x)).collect();
        assert_eq!(to_f32(&outs[t]), want);
        assert_ne!(want, exact[t]);
    }

    // Refusals, naming what is wrong; nothing sent.
    let before = ps.map(frames_in);
    let r = sw_sharded_tables_pull(s, c, pulls.as_ptr(), 1, 10_000, &mut report);
    assert_eq!(r, sw_result::SW_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("1 batches for 2 tables"),
        "{}",
        last_error()
    );
    let mut short = pulls.clone();
    short[1].byte_len -= 1;
    let r = sw_sharded_tables_pull(s, c, short.as_ptr(), 2, 10_000, &mut report);
    assert_eq!(r, sw_result::SW_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("table 6"), "{}", last_error());
    assert_eq!(ps.map(frames_in), before);
    assert_eq!(
        sw_sharded_tables_set_wire_dtype(s, 2),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        sw_sharded_tables_set_loss_scale(s, -1.0),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        sw_sharded_tables_part(s, 2),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    let twice = [shapes[0], shapes[0]];
    let mut bad = ptr::null_mut();
    let r = sw_sharded_tables_new(peers.as_ptr(), 2, twice.as_ptr(), 2, &mut bad);
    assert_eq!(r, sw_result::SW_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("named twice"), "{}", last_error());

    for one in singles {
        sw_sharded_free(one);
    }
    sw_sharded_tables_free(s);
    sw_client_free(c);
    sw_runtime_free(worker);
    for p in ps {
        sw_runtime_free(p);
    }
}

#[test]
fn a_pipeline_of_two_tables_is_one_request_per_ps_each_way() {
    let setup = Setup::new();
    let (ps, worker, c) = (setup.ps, setup.worker, setup.c);
    let (peers, dims, shapes) = (setup.peers(), &setup.dims, setup.shapes());
    let mut plain = ptr::null_mut();
    ok(sw_sharded_tables_new(
        peers.as_ptr(),
        2,
        shapes.as_ptr(),
        2,
        &mut plain,
    ));
    let settings = sw_pipeline_settings {
        staleness: 0,
        ..sw_pipeline_settings_default()
    };
    let mut p = ptr::null_mut();
    ok(sw_pipeline_new_tables(
        c,
        peers.as_ptr(),
        2,
        shapes.as_ptr(),
        2,
        settings,
        &mut p,
    ));
    assert_eq!(sw_pipeline_tables(p), 2);
    assert_eq!(sw_pipeline_tables(ptr::null()), 0);

    let ids: [&[u64]; 2] = [&[1, 2, 1, 4], &[3, 8, 8]];
    let mut grads: Vec<Vec<u8>> = (0..2)
        .map(|t| {
            let g: Vec<f32> = (0..ids[t].len())
                .flat_map(|j| vec![j as f32 + 1.0; TABLES[t].1])
                .collect();
            f32_bytes(&g)
        })
        .collect();
    let pushes: Vec<sw_table_batch> = (0..2).map(|t| batch(ids[t], &mut grads[t])).collect();
    let mut report = sw_pipeline_report::default();
    // The first push also connects (a handshake frame of its own); the rows are made by
    // it (missing until pushed).
    ok(sw_pipeline_push_tables(
        p,
        c,
        pushes.as_ptr(),
        2,
        &mut report,
    ));
    assert_eq!(report.rows_sent, 5);
    ok(sw_pipeline_flush(p, c, &mut report));
    let frames = || {
        let f = ps.map(frames_in);
        (f[0], f[1])
    };
    let mut outs: Vec<Vec<u8>> = (0..2)
        .map(|t| vec![0xff; ids[t].len() * TABLES[t].1 * 4])
        .collect();
    let mut wants = outs.clone();
    for step in 0..3 {
        let before = frames();
        let pulls: Vec<sw_table_batch> = outs
            .iter_mut()
            .enumerate()
            .map(|(t, o)| batch(ids[t], o))
            .collect();
        ok(sw_pipeline_prefetch_tables(
            p,
            c,
            pulls.as_ptr(),
            2,
            &mut report,
        ));
        ok(sw_pipeline_pull_tables(
            p,
            c,
            pulls.as_ptr(),
            2,
            &mut report,
        ));
        assert_eq!(
            (
                report.step,
                report.unique,
                report.prefetched,
                report.missing
            ),
            (step, 5, 2, 0)
        );
        ok(sw_pipeline_push_tables(
            p,
            c,
            pushes.as_ptr(),
            2,
            &mut report,
        ));
        ok(sw_pipeline_flush(p, c, &mut report));
        let after = frames();
        // Both tables' rows in one request per PS, and their gradients in one.
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (2, 2),
            "step {step}"
        );
        // The rows are those of the synchronous client, before this step's push.
        let mut plain_report = sw_step_report::default();
        let wanted: Vec<sw_table_batch> = wants
            .iter_mut()
            .enumerate()
            .map(|(t, o)| batch(ids[t], o))
            .collect();
        ok(sw_sharded_tables_pull(
            plain,
            c,
            wanted.as_ptr(),
            2,
            10_000,
            &mut plain_report,
        ));
        // One more push since: id 1 of table 5 (positions 0 and 2) moved by 1 + 3.
        let (got, now) = (to_f32(&outs[0]), to_f32(&wants[0]));
        assert_eq!(now[0], got[0] - 4.0, "step {step}");
        assert_eq!(got[..2], [-4.0 * (step as f32 + 1.0); 2], "step {step}");
        assert_eq!(to_f32(&outs[1])[3..6], [-5.0 * (step as f32 + 1.0); 3]);
    }

    // Each distinct id once, both tables in one request per PS, as the synchronous unique
    // pull gives them: by PS (even ids at PS 0), each PS's in the order first seen.
    let mut bufs = UniqueBuffers::new(&ids);
    let mut uniques = bufs.batches(&ids);
    let (inverse, unique, rows) = (&bufs.inverse, &bufs.unique, &bufs.rows);
    let before = frames();
    ok(sw_pipeline_pull_tables_unique(
        p,
        c,
        uniques.as_mut_ptr(),
        2,
        &mut report,
    ));
    let after = frames();
    assert_eq!((after.0 - before.0, after.1 - before.1), (1, 1));
    assert_eq!((uniques[0].unique_len, uniques[1].unique_len), (3, 2));
    assert_eq!((report.unique, report.missing), (5, 0));
    assert_eq!(
        (&unique[0][..3], &inverse[0][..]),
        (&[2, 4, 1][..], &[2, 0, 2, 1][..])
    );
    assert_eq!(
        (&unique[1][..2], &inverse[1][..]),
        (&[8, 3][..], &[1, 0, 0][..])
    );
    // The rows now: the synchronous client's pull after the last push.
    for t in 0..2 {
        let (dim, plain, got) = (TABLES[t].1, to_f32(&wants[t]), to_f32(&rows[t]));
        for (pos, &j) in inverse[t].iter().enumerate() {
            let j = j as usize;
            assert_eq!(
                got[j * dim..(j + 1) * dim],
                plain[pos * dim..(pos + 1) * dim]
            );
        }
    }
    // The same through a pipeline of one table.
    let mut one = ptr::null_mut();
    ok(sw_pipeline_new(
        c,
        peers.as_ptr(),
        2,
        MOD,
        TABLES[0].0,
        F32,
        dims[0].as_ptr(),
        1,
        settings,
        &mut one,
    ));
    let (mut inv, mut uni, mut out) = ([0i64; 4], [0u64; 4], vec![0u8; 4 * 8]);
    let mut n_unique = 0;
    ok(sw_pipeline_pull_unique(
        one,
        c,
        ids[0].as_ptr(),
        4,
        inv.as_mut_ptr(),
        uni.as_mut_ptr(),
        out.as_mut_ptr().cast(),
        out.len() as u64,
        &mut n_unique,
        &mut report,
    ));
    assert_eq!(
        (n_unique, &uni[..3], inv),
        (3, &[2, 4, 1][..], [2, 0, 2, 1])
    );
    assert_eq!(out[..3 * 8], rows[0][..3 * 8]);
    // Too short a buffer: refused, naming it; nothing sent.
    let before = frames();
    let r = sw_pipeline_pull_unique(
        one,
        c,
        ids[0].as_ptr(),
        4,
        inv.as_mut_ptr(),
        uni.as_mut_ptr(),
        out.as_mut_ptr().cast(),
        31,
        &mut n_unique,
        &mut report,
    );
    assert_eq!(r, sw_result::SW_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("32 bytes of rows (is 31)"),
        "{}",
        last_error()
    );
    assert_eq!(frames(), before);
    ok(sw_pipeline_flush(one, c, &mut report));
    sw_pipeline_free(one);

    // Refusals, naming what is wrong; nothing sent.
    let before = frames();
    let pulls: Vec<sw_table_batch> = outs
        .iter_mut()
        .enumerate()
        .map(|(t, o)| batch(ids[t], o))
        .collect();
    let r = sw_pipeline_pull_tables(p, c, pulls.as_ptr(), 1, &mut report);
    assert_eq!(r, sw_result::SW_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("1 batches for 2 tables"),
        "{}",
        last_error()
    );
    let r = sw_pipeline_pull(
        p,
        c,
        ids[0].as_ptr(),
        ids[0].len(),
        outs[0].as_mut_ptr().cast(),
        outs[0].len() as u64,
        &mut report,
    );
    assert_eq!(r, sw_result::SW_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("pull_tables"), "{}", last_error());
    let mut short = pulls.clone();
    short[1].byte_len -= 1;
    let r = sw_pipeline_push_tables(p, c, short.as_ptr(), 2, &mut report);
    assert_eq!(r, sw_result::SW_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("table 6"), "{}", last_error());
    assert_eq!(frames(), before);
    let twice = [shapes[0], shapes[0]];
    let mut bad = ptr::null_mut();
    let r = sw_pipeline_new_tables(c, peers.as_ptr(), 2, twice.as_ptr(), 2, settings, &mut bad);
    assert_eq!(r, sw_result::SW_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("named twice"), "{}", last_error());
    assert!(bad.is_null());

    sw_pipeline_free(p);
    sw_sharded_tables_free(plain);
    sw_client_free(c);
    for rt in ps.into_iter().chain([worker]) {
        sw_runtime_free(rt);
    }
}
