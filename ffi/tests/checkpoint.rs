//! Checkpoints and table refusals over the C ABI, called as C would: a PS runtime whose
//! checkpoint directory is a setting saves its tables when a client asks (blocking, or
//! submitted and waited for; from a client of the runtime's loops or an embedded one), and
//! a new table loads them; a PS without a directory refuses with its words; a rows pull
//! answered in part carries the PS's words about the tables it refused.

use starwire_ffi::metrics::sw_string_free;
use starwire_ffi::*;
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::PathBuf;
use std::ptr;

const F32: u8 = 10;
const DIM: usize = 4;

fn last_error() -> String {
    // SAFETY: `sw_last_error` returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(sw_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn last_remote() -> String {
    // SAFETY: as `sw_last_error`.
    unsafe { CStr::from_ptr(sw_last_error_remote()) }
        .to_string_lossy()
        .into_owned()
}

/// A string starwire returned, read and freed.
fn taken(s: *mut c_char) -> String {
    assert!(!s.is_null());
    // SAFETY: a NUL-terminated string from starwire, freed once below.
    let text = unsafe { CStr::from_ptr(s) }.to_str().unwrap().to_owned();
    sw_string_free(s);
    text
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A scratch folder, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("sw-ffi-ckpt-{}-{name}", std::process::id()));
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

/// Table 3: rows of 4 f32 made at zero, SGD with learning rate 1.
fn config() -> sw_ps_table_config {
    let mut c = sw_ps_table_config_default(DIM);
    c.table_id = 3;
    c.optimizer.lr = 1.0;
    c
}

/// A PS runtime serving table 3 with `settings` (names and values), a worker and its
/// client.
struct Cluster {
    ps: *mut sw_runtime,
    worker: *mut sw_runtime,
    client: *mut sw_client,
    peer: CString,
}

impl Cluster {
    fn new(table: *const sw_ps_table, settings: &[(&CStr, &CStr)]) -> Cluster {
        let names: Vec<*const c_char> = settings.iter().map(|(n, _)| n.as_ptr()).collect();
        let values: Vec<*const c_char> = settings.iter().map(|(_, v)| v.as_ptr()).collect();
        let ids = [3u32];
        let tables = [sw_ps_table_as_table(table)];
        let mut opts = sw_runtime_options {
            job: c"ps".as_ptr(),
            task_index: 0,
            setting_names: names.as_ptr(),
            setting_values: values.as_ptr(),
            settings: settings.len(),
            use_env: false,
            listen: c"127.0.0.1:0".as_ptr(),
            service: ptr::null(),
            allocator: ptr::null(),
            handler_threads: 0,
            table_ids: ids.as_ptr(),
            tables: tables.as_ptr(),
            n_tables: 1,
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
        opts.settings = 0;
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

    fn push(&self, ids: &[u64], g: f32) {
        let dims = [DIM as u64];
        let grads = f32_bytes(&vec![g; ids.len() * DIM]);
        let rows = sw_rows {
            table: 3,
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

    /// `sw_client_checkpoint_wait` through `client`: the manifest, or the result code.
    fn checkpoint(&self, client: *mut sw_client) -> Result<String, sw_result> {
        let mut manifest = ptr::null_mut();
        match sw_client_checkpoint_wait(client, self.peer.as_ptr(), 30_000, &mut manifest) {
            sw_result::SW_OK => Ok(taken(manifest)),
            r => {
                assert!(manifest.is_null(), "no output on failure");
                Err(r)
            }
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

fn rows_of(t: *const sw_ps_table, ids: &[u64]) -> (Vec<f32>, usize) {
    let mut values = vec![9.0f32; ids.len() * DIM];
    let mut missing = vec![0u32; ids.len()];
    let mut n_missing = 0;
    let r = sw_ps_table_export_rows(
        t,
        ids.as_ptr(),
        ids.len(),
        values.as_mut_ptr(),
        values.len(),
        ptr::null_mut(),
        0,
        missing.as_mut_ptr(),
        &mut n_missing,
    );
    assert_eq!(r, sw_result::SW_OK, "{}", last_error());
    (values, n_missing)
}

#[test]
fn a_ps_saves_its_tables_when_asked_and_a_new_table_loads_them() {
    let dir = Scratch::new("saved");
    let dir_c = dir.c();
    let mut table = ptr::null_mut();
    assert_eq!(sw_ps_table_new(&config(), &mut table), sw_result::SW_OK);
    let cluster = Cluster::new(
        table,
        &[
            (c"STARWIRE_CHECKPOINT_DIR", dir_c.as_c_str()),
            (c"STARWIRE_TABLE_UPKEEP_MS", c"50"),
        ],
    );
    cluster.push(&[1, 2, 70], 0.5);

    // Blocking: the manifest as a string.
    let manifest = cluster
        .checkpoint(cluster.client)
        .unwrap_or_else(|r| panic!("{r:?}: {}", last_error()));
    assert!(
        manifest.starts_with(r#"{"format":"starwire-checkpoint","version":1,"task":"ps:0""#),
        "{manifest}"
    );
    assert!(
        manifest.contains(r#""table":3,"file":"table-3.swrows","rows":3,"#),
        "{manifest}"
    );
    let on_disk = std::fs::read_to_string(dir.0.join("checkpoint.json")).unwrap();
    assert_eq!(on_disk, manifest);
    assert!(dir.0.join("table-3.swrows").exists());

    // Submitted: one U8 tensor holding the manifest.
    cluster.push(&[4], 1.0);
    let mut tag = 0;
    assert_eq!(
        sw_client_checkpoint(cluster.client, cluster.peer.as_ptr(), 30_000, &mut tag),
        sw_result::SW_OK
    );
    let mut reply = ptr::null_mut();
    assert_eq!(
        sw_client_wait(cluster.client, tag, &mut reply),
        sw_result::SW_OK,
        "{}",
        last_error()
    );
    assert_eq!((sw_reply_count(reply), sw_reply_status(reply, 0)), (1, 0));
    let t = sw_reply_tensor(reply, 0);
    // SAFETY: the tensor's bytes, valid until the reply is freed.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            sw_tensor_data(t).cast::<u8>(),
            sw_tensor_byte_len(t) as usize,
        )
    };
    let text = std::str::from_utf8(bytes).unwrap().to_owned();
    sw_reply_free(reply);
    assert!(text.contains(r#""rows":4,"#), "{text}");

    // An embedded client asks the same way.
    let mut embedded = ptr::null_mut();
    assert_eq!(
        sw_client_new_embedded(cluster.worker, ptr::null(), ptr::null(), 0, &mut embedded),
        sw_result::SW_OK
    );
    let again = cluster
        .checkpoint(embedded)
        .unwrap_or_else(|r| panic!("{r:?}: {}", last_error()));
    assert!(again.contains(r#""rows":4,"#), "{again}");
    sw_client_free(embedded);

    // A new table loads the checkpoint: the rows pushed before it, as they were served.
    let ids = [1u64, 2, 4, 70];
    let (served, missing) = rows_of(table, &ids);
    assert_eq!(missing, 0);
    assert_eq!(served[..DIM], [-0.5; DIM]);
    let mut loaded = ptr::null_mut();
    assert_eq!(
        sw_ps_table_load(&config(), dir_c.as_ptr(), &mut loaded),
        sw_result::SW_OK,
        "{}",
        last_error()
    );
    assert_eq!(sw_ps_table_len(loaded), 4);
    assert_eq!(rows_of(loaded, &ids), (served, 0));
    sw_ps_table_free(loaded);
    sw_ps_table_free(table);
}

#[test]
fn a_ps_without_a_checkpoint_directory_refuses_with_its_words() {
    let mut table = ptr::null_mut();
    assert_eq!(sw_ps_table_new(&config(), &mut table), sw_result::SW_OK);
    let cluster = Cluster::new(table, &[]);
    assert_eq!(
        cluster.checkpoint(cluster.client),
        Err(sw_result::SW_ERR_REMOTE)
    );
    assert_eq!(sw_last_error_status(), 9, "UNIMPLEMENTED");
    assert!(
        last_remote().contains("no checkpoint directory (STARWIRE_CHECKPOINT_DIR)"),
        "{}",
        last_remote()
    );
    assert!(
        last_error().contains("STARWIRE_CHECKPOINT_DIR"),
        "{}",
        last_error()
    );
    // The arguments are checked first.
    let mut out = ptr::null_mut();
    assert_eq!(
        sw_client_checkpoint_wait(cluster.client, c"nowhere".as_ptr(), 0, &mut out),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        sw_client_checkpoint_wait(cluster.client, cluster.peer.as_ptr(), 0, ptr::null_mut()),
        sw_result::SW_ERR_NULL
    );
    sw_ps_table_free(table);

    // The settings are checked like any other: a bad upkeep period names its variable.
    let mut t = ptr::null_mut();
    assert_eq!(sw_ps_table_new(&config(), &mut t), sw_result::SW_OK);
    let names = [c"STARWIRE_TABLE_UPKEEP_MS".as_ptr()];
    let values = [c"1".as_ptr()];
    let tables = [sw_ps_table_as_table(t)];
    let ids = [3u32];
    let opts = sw_runtime_options {
        job: c"ps".as_ptr(),
        task_index: 0,
        setting_names: names.as_ptr(),
        setting_values: values.as_ptr(),
        settings: 1,
        use_env: false,
        listen: c"127.0.0.1:0".as_ptr(),
        service: ptr::null(),
        allocator: ptr::null(),
        handler_threads: 0,
        table_ids: ids.as_ptr(),
        tables: tables.as_ptr(),
        n_tables: 1,
    };
    let mut rt = ptr::null_mut();
    assert_eq!(sw_runtime_new(&opts, &mut rt), sw_result::SW_ERR_CONFIG);
    assert!(rt.is_null());
    assert!(
        last_error().contains("STARWIRE_TABLE_UPKEEP_MS"),
        "{}",
        last_error()
    );
    sw_ps_table_free(t);
}

#[test]
fn a_rows_pull_answered_in_part_says_why_the_other_tables_were_refused() {
    let mut table = ptr::null_mut();
    assert_eq!(sw_ps_table_new(&config(), &mut table), sw_result::SW_OK);
    let cluster = Cluster::new(table, &[]);
    let ids = [1u64, 2];
    let (dims, wrong) = ([DIM as u64], [DIM as u64 + 1]);
    let mut served = vec![0xffu8; 2 * DIM * 4];
    let mut unknown = vec![0xffu8; 2 * DIM * 4];
    let mut other_shape = vec![0xffu8; 2 * (DIM + 1) * 4];
    let rows = |table: u32, dims: &[u64], data: &mut [u8]| sw_rows {
        table,
        dtype: F32,
        row_dims: dims.as_ptr(),
        rank: 1,
        ids: ids.as_ptr(),
        n: ids.len(),
        data: data.as_mut_ptr().cast::<c_void>(),
        byte_len: data.len() as u64,
    };
    let tables = [
        rows(3, &dims, &mut served),
        rows(9, &dims, &mut unknown),
        rows(3, &wrong, &mut other_shape),
    ];
    let mut tag = 0;
    assert_eq!(
        sw_client_pull_rows(
            cluster.client,
            cluster.peer.as_ptr(),
            tables.as_ptr(),
            3,
            5000,
            &mut tag
        ),
        sw_result::SW_OK
    );
    let mut reply = ptr::null_mut();
    assert_eq!(
        sw_client_wait(cluster.client, tag, &mut reply),
        sw_result::SW_OK,
        "{}",
        last_error()
    );
    // Per table: its status, as before; the served table's rows are in its buffer.
    let statuses: Vec<u32> = (0..3).map(|t| sw_reply_status(reply, t)).collect();
    assert_eq!(statuses, [0, 1, 7], "OK, NOT_FOUND, INVALID_ARGUMENT");
    assert!(served.iter().all(|&b| b == 0));
    // And the PS's words about the two it refused.
    // SAFETY: a NUL-terminated string owned by the reply, read before it is freed.
    let words = unsafe { CStr::from_ptr(sw_reply_refusal(reply)) }
        .to_str()
        .unwrap()
        .to_owned();
    sw_reply_free(reply);
    assert!(
        words.contains("no table 9 on this task (this task serves table 3)"),
        "{words}"
    );
    assert!(
        words.contains("table 3 holds f32 [4] rows; the request asked for f32 [5]"),
        "{words}"
    );

    // A pull answered in full has no words; neither has NULL.
    let mut tag = 0;
    assert_eq!(
        sw_client_pull_rows(
            cluster.client,
            cluster.peer.as_ptr(),
            tables.as_ptr(),
            1,
            5000,
            &mut tag
        ),
        sw_result::SW_OK
    );
    let mut reply = ptr::null_mut();
    assert_eq!(
        sw_client_wait(cluster.client, tag, &mut reply),
        sw_result::SW_OK
    );
    // SAFETY: as above.
    assert!(unsafe { CStr::from_ptr(sw_reply_refusal(reply)) }.is_empty());
    sw_reply_free(reply);
    // SAFETY: NULL gives the empty string.
    assert!(unsafe { CStr::from_ptr(sw_reply_refusal(ptr::null())) }.is_empty());

    // A pull whose every table was refused fails as a whole, with the words.
    let mut missing = [0u32; 2];
    let mut n = 0;
    let r = sw_client_pull_rows_wait(
        cluster.client,
        cluster.peer.as_ptr(),
        &tables[1],
        5000,
        missing.as_mut_ptr(),
        &mut n,
    );
    assert_eq!(r, sw_result::SW_ERR_REMOTE);
    assert_eq!(sw_last_error_status(), 1, "NOT_FOUND");
    assert!(
        last_remote().contains("no table 9 on this task"),
        "{}",
        last_remote()
    );
    sw_ps_table_free(table);
}
