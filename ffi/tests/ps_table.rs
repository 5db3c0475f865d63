//! The PS table over the C ABI, called as C would: made from a plain config, served over
//! loopback through its `sw_table` view, saved and loaded again, every checkpoint error
//! with its own code, bulk rows by id, metrics with the hottest ids, upkeep.

use starwire::rows::ps::Init;
use starwire_ffi::*;
use std::ffi::{c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr;

const F32: u8 = 10;
const BF16: u8 = 7;

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

/// A scratch folder, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("sw-ffi-ps-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Scratch(dir)
    }

    fn c(&self) -> CString {
        CString::new(self.0.to_str().unwrap()).unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Table 5: rows of 4 f32, uniform in [-0.5, 0.5] (seed 7), Adagrad (lr 0.1, from 0.1), every
/// row sampled for the hottest ids.
fn config() -> sw_ps_table_config {
    let mut c = sw_ps_table_config_default(4);
    c.table_id = 5;
    c.init = sw_ps_init {
        kind: sw_ps_init_kind::SW_PS_INIT_UNIFORM as u32,
        scale: 0.5,
        seed: 7,
    };
    c.optimizer.kind = sw_ps_optimizer_kind::SW_PS_OPTIMIZER_ADAGRAD as u32;
    c.optimizer.lr = 0.1;
    c.hot_sample_every = 1;
    c
}

const UNIFORM: Init = Init::Uniform {
    scale: 0.5,
    seed: 7,
};

fn new_table(c: &sw_ps_table_config) -> *mut sw_ps_table {
    let mut t = ptr::null_mut();
    assert_eq!(
        sw_ps_table_new(c, &mut t),
        sw_result::SW_OK,
        "{}",
        last_error()
    );
    t
}

fn load(c: &sw_ps_table_config, dir: &CString) -> Result<*mut sw_ps_table, (sw_result, String)> {
    let mut t = ptr::null_mut();
    match sw_ps_table_load(c, dir.as_ptr(), &mut t) {
        sw_result::SW_OK => Ok(t),
        r => {
            assert!(t.is_null(), "no output on failure");
            Err((r, last_error()))
        }
    }
}

/// Values and state of `ids`, and the positions of those without a row.
fn export(t: *const sw_ps_table, ids: &[u64]) -> (Vec<f32>, Vec<f32>, Vec<u32>) {
    let dim = sw_ps_table_dim(t);
    let state_len = sw_ps_table_state_len(t);
    let mut values = vec![7.0f32; ids.len() * dim];
    let mut state = vec![7.0f32; ids.len() * state_len];
    let mut missing = vec![0u32; ids.len()];
    let mut n_missing = 99;
    let r = sw_ps_table_export_rows(
        t,
        ids.as_ptr(),
        ids.len(),
        values.as_mut_ptr(),
        values.len(),
        state.as_mut_ptr(),
        state.len(),
        missing.as_mut_ptr(),
        &mut n_missing,
    );
    assert_eq!(r, sw_result::SW_OK, "{}", last_error());
    missing.truncate(n_missing);
    (values, state, missing)
}

fn save(t: *const sw_ps_table, dir: &CString) -> sw_save_report {
    let mut report = sw_save_report::default();
    let r = sw_ps_table_save(t, dir.as_ptr(), &mut report);
    assert_eq!(r, sw_result::SW_OK, "{}", last_error());
    report
}

/// A PS runtime serving `tables`, a worker runtime and a client.
struct Cluster {
    ps: *mut sw_runtime,
    worker: *mut sw_runtime,
    client: *mut sw_client,
    peer: CString,
}

impl Cluster {
    fn new(ids: &[u32], tables: &[*const sw_table]) -> Cluster {
        let mut opts = sw_runtime_options {
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
            tables: tables.as_ptr(),
            n_tables: ids.len(),
        };
        let mut ps = ptr::null_mut();
        assert_eq!(
            sw_runtime_new(&opts, &mut ps),
            sw_result::SW_OK,
            "{}",
            last_error()
        );
        opts.job = c"worker".as_ptr();
        opts.listen = ptr::null();
        opts.n_tables = 0;
        let mut worker = ptr::null_mut();
        assert_eq!(sw_runtime_new(&opts, &mut worker), sw_result::SW_OK);
        let mut client = ptr::null_mut();
        assert_eq!(sw_client_new(worker, 16, &mut client), sw_result::SW_OK);
        let peer = CString::new(format!("127.0.0.1:{}", sw_runtime_port(ps))).unwrap();
        Cluster {
            ps,
            worker,
            client,
            peer,
        }
    }

    /// Table `table`'s rows `ids` of `dim` `dtype` elements pulled into `data`: the missing
    /// positions.
    fn pull(&self, table: u32, dtype: u8, dim: u64, ids: &[u64], data: &mut [u8]) -> Vec<u32> {
        let dims = [dim];
        let rows = sw_rows {
            table,
            dtype,
            row_dims: dims.as_ptr(),
            rank: 1,
            ids: ids.as_ptr(),
            n: ids.len(),
            data: data.as_mut_ptr().cast::<c_void>(),
            byte_len: data.len() as u64,
        };
        let mut missing = vec![0u32; ids.len()];
        let mut n = 0;
        let r = sw_client_pull_rows_wait(
            self.client,
            self.peer.as_ptr(),
            &rows,
            5000,
            missing.as_mut_ptr(),
            &mut n,
        );
        assert_eq!(r, sw_result::SW_OK, "{}", last_error());
        missing.truncate(n);
        missing
    }

    fn push(&self, table: u32, dim: u64, ids: &[u64], grads: &[u8]) {
        let dims = [dim];
        let rows = sw_rows {
            table,
            dtype: F32,
            row_dims: dims.as_ptr(),
            rank: 1,
            ids: ids.as_ptr(),
            n: ids.len(),
            data: grads.as_ptr().cast_mut().cast::<c_void>(),
            byte_len: grads.len() as u64,
        };
        let mut tag = 0;
        let r = sw_client_push_rows(self.client, self.peer.as_ptr(), &rows, 1, 5000, &mut tag);
        assert_eq!(r, sw_result::SW_OK, "{}", last_error());
        let mut reply = ptr::null_mut();
        assert_eq!(
            sw_client_wait(self.client, tag, &mut reply),
            sw_result::SW_OK
        );
        assert_eq!(sw_reply_status(reply, 0), 0);
        sw_reply_free(reply);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        sw_client_free(self.client);
        sw_runtime_free(self.worker);
        sw_runtime_free(self.ps);
    }
}

#[test]
fn a_ps_table_serves_rows_then_is_saved_and_loaded() {
    let t = new_table(&config());
    // A second table, of bf16 rows served as bf16.
    let mut half = sw_ps_table_config_default(8);
    half.table_id = 6;
    (half.stored, half.served) = (BF16, BF16);
    let h = new_table(&half);
    let cluster = Cluster::new(&[5, 6], &[sw_ps_table_as_table(t), sw_ps_table_as_table(h)]);
    // The runtime keeps its own reference: the second handle can go.
    sw_ps_table_free(h);

    // A pull creates the rows with the initializer's values.
    let ids = [1u64, 2, 3];
    let mut rows = vec![0u8; 3 * 16];
    assert!(cluster.pull(5, F32, 4, &ids, &mut rows).is_empty());
    let want: Vec<f32> = ids
        .iter()
        .flat_map(|&id| (0..4).map(move |k| UNIFORM.value(5, id, k)))
        .collect();
    assert_eq!(to_f32(&rows), want);
    // A push applies Adagrad: acc = 0.1 + g^2, w -= 0.1 g / sqrt(acc).
    let grads = f32_bytes(&[1.0; 12]);
    cluster.push(5, 4, &ids, &grads);
    assert!(cluster.pull(5, F32, 4, &ids, &mut rows).is_empty());
    let step = 0.1 / 1.1f32.sqrt();
    for (got, w) in to_f32(&rows).iter().zip(&want) {
        assert!((got - (w - step)).abs() < 1e-6, "{got} {w}");
    }
    // bf16 rows travel as 2 bytes an element; zeros to start with.
    let mut half_rows = vec![0xffu8; 2 * 8 * 2];
    assert!(cluster
        .pull(6, BF16, 8, &[9, 10], &mut half_rows)
        .is_empty());
    assert!(half_rows.iter().all(|&b| b == 0));

    // Metrics: what the calls did, and the hottest ids (every row sampled).
    let mut m = sw_table_metrics::default();
    let mut hot = [sw_hot_id::default(); 8];
    let mut n_hot = 99;
    let r = sw_ps_table_metrics(t, &mut m, hot.as_mut_ptr(), hot.len(), &mut n_hot);
    assert_eq!(r, sw_result::SW_OK, "{}", last_error());
    assert_eq!((m.rows, m.pulls, m.pushes), (3, 2, 1));
    assert_eq!((m.pulled_rows, m.pushed_rows, m.created), (6, 3, 3));
    assert_eq!((m.missing, m.hot_sample_every), (0, 1));
    assert!(m.memory_bytes >= m.data_bytes && m.data_bytes > 0, "{m:?}");
    assert_eq!(n_hot, 3);
    let mut hot_ids: Vec<u64> = hot[..3].iter().map(|h| h.id).collect();
    hot_ids.sort_unstable();
    assert_eq!(hot_ids, ids);
    // Without a buffer: the counters alone.
    assert_eq!(
        sw_ps_table_metrics(t, &mut m, ptr::null_mut(), 0, &mut n_hot),
        sw_result::SW_OK
    );
    assert_eq!(n_hot, 0);

    // The report line names the table and its layout.
    let mut line = ptr::null_mut();
    assert_eq!(sw_ps_table_report(t, &mut line), sw_result::SW_OK);
    // SAFETY: a NUL-terminated string starwire returned, freed below.
    let text = unsafe { CStr::from_ptr(line) }
        .to_string_lossy()
        .into_owned();
    metrics::sw_string_free(line);
    assert!(
        text.starts_with("table 5: 4 x F32 (served F32), adagrad"),
        "{text}"
    );
    assert!(text.contains("huge pages: "), "{text}");

    // Saved while served; loaded into a table of its own, which holds the same rows,
    // optimizer state and clock.
    let dir = Scratch::new("roundtrip");
    assert_eq!(sw_ps_table_advance_clock(t), 1);
    let report = save(t, &dir.c());
    let mut name = [0 as std::ffi::c_char; 32];
    assert_eq!(
        sw_checkpoint_file(5, name.as_mut_ptr(), name.len()),
        sw_result::SW_OK
    );
    // SAFETY: `sw_checkpoint_file` wrote a NUL-terminated string into `name`.
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_str().unwrap();
    assert_eq!(name, "table-5.swrows");
    let file = dir.0.join(name);
    assert_eq!(report.rows, 3);
    assert_eq!(report.bytes, std::fs::metadata(&file).unwrap().len());
    assert!(report.seconds >= report.writing_seconds);
    let again = load(&config(), &dir.c()).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(sw_ps_table_len(again), 3);
    assert_eq!(sw_ps_table_clock(again), 1);
    let all = [1u64, 2, 3, 4];
    let (values, state, missing) = export(t, &all);
    assert_eq!(
        export(again, &all),
        (values.clone(), state.clone(), missing)
    );
    assert_eq!(to_f32(&rows), values[..12]);
    assert!(
        state[..12].iter().all(|&a| (a - 1.1).abs() < 1e-6),
        "{state:?}"
    );
    assert_eq!(export(again, &all).2, [3]);
    sw_ps_table_free(again);
    drop(cluster);
    sw_ps_table_free(t);
}

/// Overwrites `len` bytes at `at` of `file`.
fn patch(file: &Path, at: usize, bytes: &[u8]) {
    let mut b = std::fs::read(file).unwrap();
    b[at..at + bytes.len()].copy_from_slice(bytes);
    std::fs::write(file, b).unwrap();
}

#[test]
fn every_kind_of_checkpoint_error_has_its_code() {
    let dir = Scratch::new("errors");
    let c = config();
    // Nothing there yet.
    let (code, msg) = load(&c, &dir.c()).unwrap_err();
    assert_eq!(code, sw_result::SW_ERR_CHECKPOINT_IO, "{msg}");
    assert!(
        msg.contains("table-5.swrows") && msg.contains("opening"),
        "{msg}"
    );

    let t = new_table(&c);
    let ids: Vec<u64> = (0..100).collect();
    let values: Vec<f32> = (0..400).map(|i| i as f32).collect();
    let mut loaded = sw_load_report::default();
    let r = sw_ps_table_load_rows(
        t,
        ids.as_ptr(),
        ids.len(),
        values.as_ptr(),
        values.len(),
        ptr::null(),
        0,
        &mut loaded,
    );
    assert_eq!(r, sw_result::SW_OK, "{}", last_error());
    save(t, &dir.c());
    sw_ps_table_free(t);
    let file = dir.0.join("table-5.swrows");
    let good = std::fs::read(&file).unwrap();

    // Another shape: the table's settings say 8 elements per row.
    let mut wide = c;
    wide.dim = 8;
    let (code, msg) = load(&wide, &dir.c()).unwrap_err();
    assert_eq!(code, sw_result::SW_ERR_CHECKPOINT_SHAPE, "{msg}");
    assert!(msg.contains("dim 4 in the file, 8 in the table"), "{msg}");
    // A row cap below the file's rows.
    let mut capped = c;
    capped.max_rows = 10;
    let (code, msg) = load(&capped, &dir.c()).unwrap_err();
    assert_eq!(code, sw_result::SW_ERR_CHECKPOINT_TABLE, "{msg}");
    assert!(msg.contains("max_rows 10"), "{msg}");
    // A setting out of range is an argument error, before the file is read.
    let mut bad = c;
    bad.admit_after = 0;
    assert_eq!(
        load(&bad, &dir.c()).unwrap_err().0,
        sw_result::SW_ERR_INVALID_ARGUMENT
    );

    // A version this build does not read (bytes 8..12).
    patch(&file, 8, &99u32.to_le_bytes());
    let (code, msg) = load(&c, &dir.c()).unwrap_err();
    assert_eq!(code, sw_result::SW_ERR_CHECKPOINT_VERSION, "{msg}");
    // A damaged byte in the rows.
    std::fs::write(&file, &good).unwrap();
    patch(&file, good.len() / 2, &[good[good.len() / 2] ^ 0x40]);
    let (code, msg) = load(&c, &dir.c()).unwrap_err();
    assert_eq!(code, sw_result::SW_ERR_CHECKPOINT_CORRUPTED, "{msg}");
    assert!(msg.contains("checksum"), "{msg}");
    // Cut short.
    std::fs::write(&file, &good[..good.len() - 100]).unwrap();
    let (code, msg) = load(&c, &dir.c()).unwrap_err();
    assert_eq!(code, sw_result::SW_ERR_CHECKPOINT_TRUNCATED, "{msg}");
    // Not a checkpoint at all.
    std::fs::write(
        &file,
        b"just some text, long enough to have a header's length....",
    )
    .unwrap();
    let (code, msg) = load(&c, &dir.c()).unwrap_err();
    assert_eq!(code, sw_result::SW_ERR_NOT_A_CHECKPOINT, "{msg}");
    // And the good file loads.
    std::fs::write(&file, &good).unwrap();
    let t = load(&c, &dir.c()).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(export(t, &[42]).0, [168.0, 169.0, 170.0, 171.0]);

    // Saving into a folder that cannot be made: an I/O error naming the file.
    let blocked = dir.0.join("table-5.swrows").join("below");
    let blocked = CString::new(blocked.to_str().unwrap()).unwrap();
    let mut report = sw_save_report {
        rows: 77,
        ..Default::default()
    };
    assert_eq!(
        sw_ps_table_save(t, blocked.as_ptr(), &mut report),
        sw_result::SW_ERR_CHECKPOINT_IO
    );
    assert!(
        last_error().contains("creating the directory"),
        "{}",
        last_error()
    );
    assert_eq!(report.rows, 77, "no output on failure");
    sw_ps_table_free(t);
}

#[test]
fn rows_by_id_in_and_out() {
    let mut c = config();
    c.max_rows = 3;
    let t = new_table(&c);
    assert_eq!(sw_ps_table_state_len(t), 4);
    let ids = [10u64, 20];
    let values = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
    let state = [0.5f32; 8];
    let mut report = sw_load_report::default();
    let load_rows = |ids: &[u64], values: &[f32], state: &[f32], report: &mut sw_load_report| {
        sw_ps_table_load_rows(
            t,
            ids.as_ptr(),
            ids.len(),
            values.as_ptr(),
            values.len(),
            if state.is_empty() {
                ptr::null()
            } else {
                state.as_ptr()
            },
            state.len(),
            report,
        )
    };
    assert_eq!(
        load_rows(&ids, &values, &state, &mut report),
        sw_result::SW_OK,
        "{}",
        last_error()
    );
    assert_eq!((report.created, report.overwritten), (2, 0));
    let (got, got_state, missing) = export(t, &[20, 30, 10]);
    assert_eq!(got[..4], values[4..]);
    assert_eq!(got[4..8], [0.0; 4]);
    assert_eq!(got[8..], values[..4]);
    assert_eq!(got_state[..4], [0.5; 4]);
    assert_eq!(missing, [1]);
    // Overwrite one, keeping its state.
    assert_eq!(
        load_rows(&[10], &[9.0; 4], &[], &mut report),
        sw_result::SW_OK
    );
    assert_eq!((report.created, report.overwritten), (0, 1));
    assert_eq!(export(t, &[10]).0, [9.0; 4]);
    assert_eq!(export(t, &[10]).1, [0.5; 4]);
    // A buffer of the wrong length: nothing written.
    let before = report;
    assert_eq!(
        load_rows(&[10], &[1.0; 3], &[], &mut report),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    assert!(
        last_error().contains("values holds 3 f32, not 4"),
        "{}",
        last_error()
    );
    assert_eq!(report.overwritten, before.overwritten);
    // Past the row cap of 3: the first new row is taken, the next refused.
    assert_eq!(
        load_rows(&[40, 50], &[1.0; 8], &[], &mut report),
        sw_result::SW_ERR_TABLE_FULL
    );
    assert!(last_error().contains("after 1 rows"), "{}", last_error());
    assert_eq!(sw_ps_table_len(t), 3);
    sw_ps_table_free(t);
}

#[test]
fn maintain_evicts_rows_left_untouched() {
    let mut c = config();
    c.evict_untouched = 2;
    let t = new_table(&c);
    let ids: Vec<u64> = (0..50).collect();
    let mut report = sw_load_report::default();
    let r = sw_ps_table_load_rows(
        t,
        ids.as_ptr(),
        50,
        vec![1.0f32; 200].as_ptr(),
        200,
        ptr::null(),
        0,
        &mut report,
    );
    assert_eq!(r, sw_result::SW_OK, "{}", last_error());
    let mut done = sw_maintain_report::default();
    assert_eq!(sw_ps_table_maintain(t, &mut done), sw_result::SW_OK);
    assert_eq!(done.evicted_untouched, 0);
    for tick in 1..=3 {
        assert_eq!(sw_ps_table_advance_clock(t), tick);
    }
    assert_eq!(sw_ps_table_maintain(t, &mut done), sw_result::SW_OK);
    assert_eq!(done.evicted_untouched, 50);
    assert_eq!(sw_ps_table_len(t), 0);
    let mut m = sw_table_metrics::default();
    let mut n_hot = 0;
    sw_ps_table_metrics(t, &mut m, ptr::null_mut(), 0, &mut n_hot);
    assert_eq!((m.evicted_untouched, m.clock, m.loaded), (50, 3, 50));
    sw_ps_table_free(t);
}

#[test]
fn nulls_and_bad_settings_are_refused() {
    let mut t = 0x1 as *mut sw_ps_table;
    assert_eq!(sw_ps_table_new(ptr::null(), &mut t), sw_result::SW_ERR_NULL);
    let mut c = sw_ps_table_config_default(4);
    c.served = BF16; // stored as f32: served as f32 only
    assert_eq!(
        sw_ps_table_new(&c, &mut t),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    assert!(last_error().contains("served as F32"), "{}", last_error());
    c = sw_ps_table_config_default(0);
    assert_eq!(
        sw_ps_table_new(&c, &mut t),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    assert!(last_error().contains("config.dim 0"), "{}", last_error());
    assert_eq!(t as usize, 0x1, "no partial success");
    assert_eq!(
        sw_ps_table_load(&config(), ptr::null(), &mut t),
        sw_result::SW_ERR_NULL
    );
    // Getters give 0 and NULL for NULL; freeing NULL does nothing.
    assert!(sw_ps_table_as_table(ptr::null()).is_null());
    assert_eq!(sw_ps_table_dim(ptr::null()), 0);
    assert_eq!(sw_ps_table_len(ptr::null()), 0);
    assert_eq!(sw_ps_table_advance_clock(ptr::null()), 0);
    sw_ps_table_free(ptr::null_mut());
    let mut done = sw_maintain_report::default();
    assert_eq!(
        sw_ps_table_maintain(ptr::null(), &mut done),
        sw_result::SW_ERR_NULL
    );
    let mut name = [0 as std::ffi::c_char; 8];
    assert_eq!(
        sw_checkpoint_file(5, name.as_mut_ptr(), name.len()),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    assert!(last_error().contains("needs 15 bytes"), "{}", last_error());
}
