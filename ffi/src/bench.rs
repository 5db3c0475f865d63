//! A benchmarking aid: a blocking rows pull made by the Rust client itself, or by the C
//! ABI's `sw_client_pull_rows_wait`, timed call by call inside the library, for a language
//! binding to measure what it adds above Rust on the same client.

use std::ffi::c_char;
use std::time::Instant;

use starwire::Reply;

use crate::boundary::boundary;
use crate::cast::{ref_from, try_out_slice, try_peer};
use crate::client::{client_mut, deadline, sw_client, with_client};
use crate::result::sw_result::{self, *};
use crate::result::Failure;
use crate::rows::{rows_args_with, sw_client_pull_rows_wait, sw_rows, table_failure};

/// Which blocking rows pull `sw_bench_pull_rows` makes (its `how`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum sw_bench_pull {
    /// The Rust client's own: `Handle::pull_rows` (the block in memory from the runtime's
    /// allocator), `Handle::wait_tag`, a look at the block and the missing rows,
    /// `Handle::recycle`. What a Rust program does, and `commctl bench -o pull-rows`.
    SW_BENCH_PULL_RUST = 0,
    /// `sw_client_pull_rows_wait`, into `rows->data`: the C ABI's blocking pull, without the
    /// cost of calling it from another language.
    SW_BENCH_PULL_C = 1,
}

/// A benchmarking aid, not for applications: makes `calls` rows pulls of `rows` (one table)
/// the way `how` (a `sw_bench_pull`) says, one after the other, and writes the time of each,
/// in nanoseconds, to `latencies_ns`, read from before the submit to after the request's
/// vectors are recycled (`SW_BENCH_PULL_RUST`) or the C function returned
/// (`SW_BENCH_PULL_C`). Nothing else runs between the two clock readings.
///
/// A binding measures its overhead above Rust by alternating its own blocking pull (for
/// Python, `Client.pull_rows` around `sw_client_pull_rows_wait`) with one call of this,
/// request by request, on the same client, connection and server, so that both meet the
/// same load and the same waits (`ffi/python/bench/bench_pull_rows.py`). The C form tells
/// the C ABI's share of that overhead from the binding's own.
///
/// With `SW_BENCH_PULL_RUST`, `rows->data` is not used and may be NULL (`rows->byte_len` is
/// still checked: `n * row_bytes`); with `SW_BENCH_PULL_C` the rows are written there, as
/// `sw_client_pull_rows_wait` writes them. Fails as `sw_client_pull_rows_wait` does, at the
/// first pull that fails (`latencies_ns` is then not written); with
/// `SW_ERR_INVALID_ARGUMENT` for `calls` 0, an unknown `how`, and a client made with a
/// callback.
///
/// # Safety
/// As `sw_client_pull_rows_wait`, without its `missing` and `missing_count`; `latencies_ns`
/// has room for `calls` values.
#[no_mangle]
pub extern "C" fn sw_bench_pull_rows(
    c: *mut sw_client,
    peer: *const c_char,
    rows: *const sw_rows,
    timeout_ms: u64,
    how: u32,
    calls: usize,
    latencies_ns: *mut u64,
) -> sw_result {
    boundary!({
        if calls == 0 {
            return Err(Failure::invalid("no calls"));
        }
        let out = try_out_slice!(latencies_ns, calls);
        let mut latencies = Vec::with_capacity(calls);
        if how == sw_bench_pull::SW_BENCH_PULL_C as u32 {
            // Room for `rows->n` missing positions (`rows` NULL: the call fails on it first).
            let n = ref_from(rows).map_or(0, |r| r.n);
            let mut missing = vec![0u32; n];
            let mut count = 0;
            for _ in 0..calls {
                let start = Instant::now();
                let r = sw_client_pull_rows_wait(
                    c,
                    peer,
                    rows,
                    timeout_ms,
                    missing.as_mut_ptr(),
                    &mut count,
                );
                latencies.push(start.elapsed().as_nanos() as u64);
                if r != SW_OK {
                    // Its message is this thread's last error already.
                    return Err(Failure::again(r));
                }
            }
        } else if how == sw_bench_pull::SW_BENCH_PULL_RUST as u32 {
            let client = client_mut(c)?;
            let peer = try_peer!(peer);
            if client.callback {
                return Err(Failure::invalid(
                    "a rows pull is waited for with sw_client_wait: not for a client with a callback",
                ));
            }
            // `data` is not used.
            let args = rows_args_with(rows, 1, false)?;
            let request = [args[0].rows];
            let table = request[0].table;
            for _ in 0..calls {
                let start = Instant::now();
                let completion = with_client!(client, |h| h
                    .pull_rows(peer, &request, deadline(timeout_ms))
                    .and_then(|t| h.wait_tag(t.tag())))?;
                let outcome = match &completion.result {
                    Ok(Reply::Rows(r)) => match r.block(0) {
                        Ok(_) if r.missing(0).len() <= request[0].ids.len() => Ok(()),
                        Ok(_) => Err(Failure::new(
                            SW_ERR_PROTOCOL,
                            "more rows missing than asked for",
                        )),
                        Err(status) => Err(table_failure(table, u16::from(status) as u32)),
                    },
                    Ok(_) => Err(Failure::new(
                        SW_ERR_PROTOCOL,
                        "not an answer to a rows pull",
                    )),
                    Err(e) => Err(Failure::from(e.clone())),
                };
                with_client!(client, |h| h.recycle(completion));
                latencies.push(start.elapsed().as_nanos() as u64);
                outcome?;
            }
        } else {
            return Err(Failure::invalid(format!(
                "how {how} is not a sw_bench_pull"
            )));
        }
        for (o, &l) in out.iter_mut().zip(&latencies) {
            o.write(l);
        }
        Ok(())
    })
}
