//! Rows in bf16 and f16 on the wire through the C ABI (`sw_sharded_set_wire_dtype`,
//! `sw_sharded_set_loss_scale`, the `wire_dtype` and `loss_scale` of
//! `sw_pipeline_settings`): a PS on loopback with an f32 table, a worker asking for
//! narrower rows, and a PS whose handshake does not announce `row_formats`.

mod common;

use common::*;
use starwire_ffi::*;
use std::ffi::{c_char, CStr, CString};
use std::ptr;

const F32: u8 = 10;
const F16: u8 = 6;
const BF16: u8 = 7;
const TABLE: u32 = 5;

/// A PS serving an f32 reference table of rows of 2 (missing until pushed, SGD with rate
/// 1) with `settings` on top, or a worker.
fn runtime(ps: bool, settings: &[(&CStr, &CStr)]) -> *mut sw_runtime {
    mem_table_runtime(ps, TABLE, 2, INIT_MISSING, 1.0, settings)
}

/// A PS (with `settings`), a worker, its client, and a sharded table over the PS.
struct Setup {
    ps: *mut sw_runtime,
    worker: *mut sw_runtime,
    client: *mut sw_client,
    sharded: *mut sw_sharded,
    peer: CString,
}

impl Setup {
    fn new(settings: &[(&CStr, &CStr)]) -> Setup {
        let ps = runtime(true, settings);
        let worker = runtime(false, &[]);
        let mut client = ptr::null_mut();
        ok(sw_client_new(worker, 16, &mut client));
        let peer = CString::new(format!("127.0.0.1:{}", sw_runtime_port(ps))).unwrap();
        let sharded = sharded(&peer, F32);
        Setup {
            ps,
            worker,
            client,
            sharded,
            peer,
        }
    }

    fn push(&self, ids: &[u64], grads: &[f32]) -> sw_step_report {
        let grads = f32_bytes(grads);
        let mut report = sw_step_report::default();
        ok(sw_sharded_push(
            self.sharded,
            self.client,
            ids.as_ptr(),
            ids.len(),
            grads.as_ptr().cast(),
            grads.len() as u64,
            10_000,
            &mut report,
        ));
        report
    }

    fn pull(&self, ids: &[u64]) -> (Vec<f32>, sw_step_report) {
        let mut out = vec![0xffu8; ids.len() * 8];
        let mut report = sw_step_report::default();
        ok(sw_sharded_pull(
            self.sharded,
            self.client,
            ids.as_ptr(),
            ids.len(),
            out.as_mut_ptr().cast(),
            out.len() as u64,
            10_000,
            &mut report,
        ));
        (to_f32(&out), report)
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        sw_sharded_free(self.sharded);
        sw_client_free(self.client);
        sw_runtime_free(self.worker);
        sw_runtime_free(self.ps);
    }
}

fn sharded(peer: &CString, dtype: u8) -> *mut sw_sharded {
    let peers = [peer.as_ptr()];
    let part = sw_partition {
        kind: sw_partition_kind::SW_PARTITION_MOD as u32,
        vocab: 0,
    };
    let dims = [2u64];
    let mut s = ptr::null_mut();
    ok(sw_sharded_new(
        peers.as_ptr(),
        1,
        part,
        TABLE,
        dtype,
        dims.as_ptr(),
        1,
        &mut s,
    ));
    s
}

/// Rows that bf16 does not carry exactly: -(each of these), after a push at rate 1.
const ROWS: [f32; 4] = [0.1234567, -1.0101, 3.3333333, 1e-3];

#[test]
fn a_bf16_pull_rounds_and_a_scaled_bf16_push_applies_the_unscaled_gradient_in_f32() {
    let t = Setup::new(&[]);
    t.push(&[1, 2], &ROWS);
    let exact: Vec<f32> = ROWS.iter().map(|x| -x).collect();
    assert_eq!(t.pull(&[1, 2]).0, exact);

    assert_eq!(sw_sharded_wire_dtype(t.sharded), F32);
    ok(sw_sharded_set_wire_dtype(t.sharded, BF16));
    assert_eq!(sw_sharded_wire_dtype(t.sharded), BF16);
    let (rows, report) = t.pull(&[2, 1, 2]);
    let want: Vec<f32> = [2, 3, 0, 1, 2, 3].iter().map(|&i| bf16(exact[i])).collect();
    assert_eq!(rows, want);
    assert_ne!(rows[..2], exact[2..]);
    assert_eq!((report.unique, report.fallbacks), (2, 0));

    // Gradients 0.5 and 0.25 times a loss scale of 1024, in bf16 (exact): the PS divides
    // the scale out and applies them to its f32 rows.
    ok(sw_sharded_set_loss_scale(t.sharded, 1024.0));
    t.push(&[1, 2], &[512.0, 512.0, 256.0, 256.0]);
    ok(sw_sharded_set_wire_dtype(t.sharded, F32));
    let after = t.pull(&[1, 2]).0;
    let want = [
        exact[0] - 0.5,
        exact[1] - 0.5,
        exact[2] - 0.25,
        exact[3] - 0.25,
    ];
    assert_eq!(after, want);
    // Not a row that went through bf16 on the PS: the table stays f32.
    assert_ne!(after[0], bf16(after[0]));

    // 0 is no scale again.
    ok(sw_sharded_set_loss_scale(t.sharded, 0.0));
    t.push(&[1], &[1.0, 1.0]);
    assert_eq!(t.pull(&[1]).0, [want[0] - 1.0, want[1] - 1.0]);
}

#[test]
fn an_f16_pull_rounds_to_f16() {
    let t = Setup::new(&[]);
    t.push(&[7], &ROWS[..2]);
    ok(sw_sharded_set_wire_dtype(t.sharded, F16));
    let rows = t.pull(&[7]).0;
    // The nearest f16 values: 0.1234567 is 1.9755859375 * 2^-4 (mantissa 999 of 1024),
    // 1.0101 is 1 + 10/1024.
    assert_eq!(rows, [-(1.0 + 999.0 / 1024.0) / 16.0, 1.0 + 10.0 / 1024.0]);
}

#[test]
fn bad_wire_dtypes_and_loss_scales_are_refused_changing_nothing() {
    let t = Setup::new(&[]);
    assert_eq!(
        sw_sharded_set_wire_dtype(t.sharded, 2),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    assert!(last_error().contains("not as u8"), "{}", last_error());
    assert_eq!(sw_sharded_wire_dtype(t.sharded), F32);
    for bad in [-1.0, f32::NAN, f32::INFINITY, 1e-39, 1e38] {
        assert_eq!(
            sw_sharded_set_loss_scale(t.sharded, bad),
            sw_result::SW_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("loss scale"), "{}", last_error());
    }
    assert_eq!(
        sw_sharded_set_wire_dtype(ptr::null_mut(), BF16),
        sw_result::SW_ERR_NULL
    );
    assert_eq!(sw_sharded_wire_dtype(ptr::null()), 0);
    // f64 rows travel as they are, and take no loss scale.
    let wide = sharded(&t.peer, 13);
    assert_eq!(
        sw_sharded_set_wire_dtype(wide, BF16),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    assert!(last_error().contains("f64 rows"), "{}", last_error());
    assert_eq!(
        sw_sharded_set_loss_scale(wide, 2.0),
        sw_result::SW_ERR_INVALID_ARGUMENT
    );
    sw_sharded_free(wide);
    // The sharded table still works as f32.
    t.push(&[3], &[1.0, 2.0]);
    assert_eq!(t.pull(&[3]).0, [-1.0, -2.0]);
}

#[test]
fn a_ps_without_row_formats_serves_a_bf16_client_f32_rows() {
    let t = Setup::new(&[(c"STARWIRE_WIRE_FEATURES", c"none")]);
    t.push(&[1, 2], &ROWS);
    ok(sw_sharded_set_wire_dtype(t.sharded, BF16));
    ok(sw_sharded_set_loss_scale(t.sharded, 8.0));
    let (rows, report) = t.pull(&[1, 2]);
    let exact: Vec<f32> = ROWS.iter().map(|x| -x).collect();
    assert_eq!(rows, exact);
    assert_eq!((report.fallbacks, report.failed), (1, 0));
    // The scale is divided out before sending, as the PS cannot.
    t.push(&[1], &[8.0, 16.0]);
    assert_eq!(t.pull(&[1]).0, [exact[0] - 1.0, exact[1] - 2.0]);
}

fn pipeline(t: &Setup, settings: sw_pipeline_settings) -> Result<*mut sw_pipeline, sw_result> {
    let peers: [*const c_char; 1] = [t.peer.as_ptr()];
    let part = sw_partition {
        kind: sw_partition_kind::SW_PARTITION_MOD as u32,
        vocab: 0,
    };
    let dims = [2u64];
    let mut p = ptr::null_mut();
    match sw_pipeline_new(
        t.client,
        peers.as_ptr(),
        1,
        part,
        TABLE,
        F32,
        dims.as_ptr(),
        1,
        settings,
        &mut p,
    ) {
        sw_result::SW_OK => Ok(p),
        r => Err(r),
    }
}

#[test]
fn a_pipeline_with_a_bf16_wire_and_a_loss_scale() {
    let t = Setup::new(&[]);
    t.push(&[4], &ROWS[2..]);
    let d = sw_pipeline_settings_default();
    assert_eq!((d.wire_dtype, d.loss_scale), (0, 0.0));
    let p = pipeline(
        &t,
        sw_pipeline_settings {
            staleness: 0,
            wire_dtype: BF16,
            loss_scale: 4.0,
            ..d
        },
    )
    .unwrap();
    let ids = [4u64];
    let mut out = vec![0u8; 8];
    let mut report = sw_pipeline_report::default();
    ok(sw_pipeline_pull(
        p,
        t.client,
        ids.as_ptr(),
        1,
        out.as_mut_ptr().cast(),
        8,
        &mut report,
    ));
    assert_eq!(to_f32(&out), [bf16(-ROWS[2]), bf16(-ROWS[3])]);
    let grads = f32_bytes(&[4.0, 2.0]);
    ok(sw_pipeline_push(
        p,
        t.client,
        ids.as_ptr(),
        1,
        grads.as_ptr().cast(),
        8,
        &mut report,
    ));
    ok(sw_pipeline_flush(p, t.client, &mut report));
    sw_pipeline_free(p);
    assert_eq!(t.pull(&ids).0, [-ROWS[2] - 1.0, -ROWS[3] - 0.5]);

    for (wire_dtype, loss_scale, says) in [(2, 0.0, "wire_dtype"), (F32, -4.0, "loss scale")] {
        let bad = sw_pipeline_settings {
            wire_dtype,
            loss_scale,
            ..d
        };
        assert_eq!(
            pipeline(&t, bad).unwrap_err(),
            sw_result::SW_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains(says), "{}", last_error());
    }
}
