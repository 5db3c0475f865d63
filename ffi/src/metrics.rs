//! Per-peer metrics through the C ABI: a runtime's metrics as a JSON document (the one a
//! `STATS` request is answered with, `docs/wire-format.md` section 4.11), a stats request
//! to a peer, and the request trace as a Chrome trace JSON document.

use std::ffi::c_char;

use crate::boundary::boundary;
use crate::cast::{free_c_string, to_c_string, try_out, try_ref};
use crate::client::{deadline, submit, sw_client, with_client};
use crate::result::{c_string, sw_result, Failure};
use crate::runtime::sw_runtime;

/// Writes to `*out` this runtime's counters and per-peer, per-operation metrics (requests
/// by outcome, bytes, tensors and rows, latency percentiles and histogram buckets) as a
/// NUL-terminated JSON document (`docs/wire-format.md`, section 4.11). The caller frees it
/// with `sw_string_free`.
///
/// # Safety
/// `rt` is a live runtime; `out` is writable.
#[no_mangle]
pub extern "C" fn sw_runtime_metrics_json(
    rt: *const sw_runtime,
    out: *mut *mut c_char,
) -> sw_result {
    boundary!({ runtime_string(rt, out, |rt| rt.metrics_json()) })
}

/// Writes to `*out` this runtime's request trace as a NUL-terminated Chrome trace /
/// Perfetto JSON document (per request: submitted, sent, answered, completed; see the
/// README's Trace section), and empties the trace. With tracing off (`STARWIRE_TRACE`) the
/// document holds no requests. The caller frees it with `sw_string_free`.
///
/// # Safety
/// `rt` is a live runtime; `out` is writable.
#[no_mangle]
pub extern "C" fn sw_runtime_trace_json(rt: *const sw_runtime, out: *mut *mut c_char) -> sw_result {
    boundary!({ runtime_string(rt, out, |rt| rt.trace_json()) })
}

/// Writes to `*out` the document `f` makes of `rt`'s runtime, as a string the caller frees
/// with `sw_string_free`.
fn runtime_string(
    rt: *const sw_runtime,
    out: *mut *mut c_char,
    f: impl FnOnce(&starwire::Runtime) -> String,
) -> Result<(), Failure> {
    let rt = try_ref!(rt);
    let out = try_out!(out);
    out.write(to_c_string(c_string(&f(&rt.runtime))));
    Ok(())
}

/// Frees a string starwire returned (`sw_runtime_metrics_json`, `sw_runtime_trace_json`,
/// `sw_ps_table_report`, `sw_client_checkpoint_wait`).
/// NULL is ignored.
///
/// # Safety
/// `s` is NULL or a string from starwire not freed before.
#[no_mangle]
pub extern "C" fn sw_string_free(s: *mut c_char) {
    boundary!((), { free_c_string(s) })
}

/// Asks `peer` (`host:port`) for its counters and latencies (a `STATS` request). The reply
/// has one tensor (dtype `U8`, rank 1) holding the peer's JSON document, not
/// NUL-terminated; a peer with the stats endpoint off fails the request with
/// `SW_ERR_REMOTE` and status `UNIMPLEMENTED` (9). `timeout_ms` 0: no deadline.
///
/// # Safety
/// `c` is a live client used by this thread only; `peer` a NUL-terminated string; `tag`
/// writable.
#[no_mangle]
pub extern "C" fn sw_client_stats(
    c: *mut sw_client,
    peer: *const c_char,
    timeout_ms: u64,
    tag: *mut u64,
) -> sw_result {
    boundary!({
        submit(c, peer, tag, |client, p| {
            with_client!(client, |h| h
                .remote_stats(p, deadline(timeout_ms))
                .map(|t| t.tag()))
        })
    })
}
