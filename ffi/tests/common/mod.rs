//! Helpers the C ABI's rows tests share: the last error's text, a result that must be
//! `SW_OK`, f32 rows as little-endian bytes and back, bfloat16 rounding, and a runtime
//! serving an in-memory table on loopback.
#![allow(dead_code)]

use starwire_ffi::*;
use std::ffi::CStr;
use std::ptr;

pub fn last_error() -> String {
    // SAFETY: `sw_last_error` returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(sw_last_error()) }
        .to_string_lossy()
        .into_owned()
}

pub fn ok(r: sw_result) {
    assert_eq!(r, sw_result::SW_OK, "{}", last_error());
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// `x` rounded to the nearest bfloat16 (ties to even).
pub fn bf16(x: f32) -> f32 {
    let bits = x.to_bits();
    f32::from_bits(bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000)
}

/// A PS runtime listening on a free loopback port and serving an in-memory table of f32
/// rows of `dim` as table `table`, its rows made as `init` says, SGD at rate `lr`; or, when
/// `ps` is false, a worker runtime (no table, not listening). Settings from the
/// environment, with no connect retries and `settings` on top.
pub fn mem_table_runtime(
    ps: bool,
    table: u32,
    dim: usize,
    init: sw_init,
    lr: f32,
    settings: &[(&CStr, &CStr)],
) -> *mut sw_runtime {
    let mut names = vec![c"STARWIRE_CONNECT_RETRIES".as_ptr()];
    let mut values = vec![c"0".as_ptr()];
    for (n, v) in settings {
        names.push(n.as_ptr());
        values.push(v.as_ptr());
    }
    let mut t = ptr::null_mut();
    let sgd = sw_optimizer {
        kind: sw_optimizer_kind::SW_OPTIMIZER_SGD as u32,
        lr,
        initial_accumulator: 0.0,
    };
    ok(sw_mem_table_new(dim, init, sgd, &mut t));
    let tables = [t.cast_const()];
    let ids = [table];
    let o = sw_runtime_options {
        job: if ps { c"ps" } else { c"worker" }.as_ptr(),
        task_index: 0,
        setting_names: names.as_ptr(),
        setting_values: values.as_ptr(),
        settings: names.len(),
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
        tables: tables.as_ptr(),
        n_tables: usize::from(ps),
    };
    let mut rt = ptr::null_mut();
    ok(sw_runtime_new(&o, &mut rt));
    sw_table_free(t);
    rt
}

/// Rows made by no pull: missing until a push makes them (at zero, then the step).
pub const INIT_MISSING: sw_init = sw_init {
    kind: sw_init_kind::SW_INIT_MISSING as u32,
    scale: 0.0,
    seed: 0,
};

/// Rows made by their first pull, each element uniform in [-0.5, 0.5] from `(id, element,
/// 7)`.
pub const INIT_UNIFORM: sw_init = sw_init {
    kind: sw_init_kind::SW_INIT_UNIFORM as u32,
    scale: 0.5,
    seed: 7,
};

/// `host:port` of runtime `rt`'s listener on loopback, as a peer for the C ABI.
pub fn peer_of(rt: *const sw_runtime) -> std::ffi::CString {
    std::ffi::CString::new(format!("127.0.0.1:{}", sw_runtime_port(rt))).unwrap()
}
