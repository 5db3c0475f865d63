//! `sw_rows`: one table of a rows request, checked into `RowsArg`; and the rows requests of
//! a `sw_client`: pulls into the caller's buffers (submitted, or submitted and waited for in
//! one call, plain or naming the versions of the rows the caller holds) and pushes from the
//! caller's buffers or tensors.

use std::ffi::{c_char, c_void};
use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use starwire::rows::{PulledRows, Rows, MAX_ROW_RANK};
use starwire::{DType, Reply, Status};

use crate::boundary::boundary;
use crate::buffers::{lock, RowsAllocator, RowsTargets, Target};
use crate::cast::{try_out, try_out_slice, try_peer, try_ref, try_slice, Castable, Plain};
use crate::client::{client_mut, deadline, submit, sw_client, with_client};
use crate::result::sw_result::{self, *};
use crate::result::Failure;
use crate::tensor::sw_tensor;

/// One table of a rows request: the table, its rows' dtype and shape, the row ids, and the
/// rows' bytes (`n * row_bytes`, rows in the order of the ids, little-endian elements;
/// `row_bytes` is the element size times the product of `row_dims`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sw_rows {
    /// The table, as the PS numbers its tables.
    pub table: u32,
    /// Element type of the rows (wire dtype code, as for `sw_tensor_new`).
    pub dtype: u8,
    /// Shape of one row, `rank` values (e.g. `{dim}`); may be NULL when `rank` is 0.
    pub row_dims: *const u64,
    /// Dimensions of one row, at most 7.
    pub rank: u32,
    /// The row ids (may repeat).
    pub ids: *const u64,
    /// Number of ids, at least 1.
    pub n: usize,
    /// The rows: a pull writes them here (the caller's output buffer); a push reads the
    /// gradient rows from here.
    pub data: *mut c_void,
    /// Bytes at `data`: exactly `n * row_bytes`.
    pub byte_len: u64,
}

impl Castable for sw_rows {
    type Ownership = Plain;
    type RustType = sw_rows;
}

/// A checked table of a rows request.
pub(crate) struct RowsArg<'a> {
    pub(crate) rows: Rows<'a>,
    data: *mut u8,
    len: usize,
}

impl RowsArg<'_> {
    /// The caller's buffer of this table, for a pull to receive its rows into.
    fn target(&self) -> Target {
        Target {
            ptr: self.data,
            len: self.len,
            dtype: self.rows.dtype,
            dims: std::iter::once(self.rows.ids.len() as u64)
                .chain(self.rows.row_dims.iter().copied())
                .collect(),
        }
    }
}

/// The caller's buffers of a pull of `args`.
fn targets_of(args: &[RowsArg<'_>]) -> Arc<RowsTargets> {
    Arc::new(RowsTargets::new(args.iter().map(RowsArg::target).collect()))
}

/// The tables of a rows request, checked: at least one, each with ids, a known dtype, at
/// most `MAX_ROW_RANK` row dimensions, and `byte_len == n * row_bytes` bytes at `data`.
fn rows_args<'a>(tables: *const sw_rows, n: usize) -> Result<Vec<RowsArg<'a>>, Failure> {
    rows_args_with(tables, n, true)
}

/// As `rows_args`; `data` may be NULL (and is then not to be used) unless `need_data`.
pub(crate) fn rows_args_with<'a>(
    tables: *const sw_rows,
    n: usize,
    need_data: bool,
) -> Result<Vec<RowsArg<'a>>, Failure> {
    let tables = try_slice!(tables, n);
    if tables.is_empty() {
        return Err(Failure::invalid("no tables"));
    }
    let mut args = Vec::with_capacity(tables.len());
    for (i, t) in tables.iter().enumerate() {
        if t.rank as usize > MAX_ROW_RANK {
            return Err(Failure::invalid(format!(
                "tables[{i}].rank {} is above {MAX_ROW_RANK}",
                t.rank
            )));
        }
        let row_dims = try_slice!(t.row_dims, t.rank as usize, format!("tables[{i}].row_dims"));
        let ids = try_slice!(t.ids, t.n, format!("tables[{i}].ids"));
        if ids.is_empty() {
            return Err(Failure::invalid(format!("tables[{i}] has no ids")));
        }
        let rows = Rows::new(t.table, DType::from(t.dtype), row_dims, ids);
        let Some(row_bytes) = rows.row_bytes().filter(|&b| b > 0) else {
            return Err(Failure::invalid(format!(
                "tables[{i}]: unknown dtype {} or rows of no bytes",
                t.dtype
            )));
        };
        let want = row_bytes.checked_mul(ids.len() as u64);
        if want != Some(t.byte_len) {
            return Err(Failure::invalid(format!(
                "tables[{i}].byte_len is {}, not {} ids of {row_bytes} bytes",
                t.byte_len,
                ids.len()
            )));
        }
        // Not read here: a pull lends the buffer to the runtime, a push reads it through
        // `try_slice!`.
        if need_data && t.data.is_null() {
            return Err(Failure::null(format!("tables[{i}].data")));
        }
        let len =
            usize::try_from(t.byte_len).map_err(|_| Failure::invalid("byte_len too large"))?;
        args.push(RowsArg {
            rows,
            data: t.data.cast(),
            len,
        });
    }
    Ok(args)
}

/// Pulls rows of `n_tables` tables from `peer` in one request: per table, `tables[t].n` rows
/// of `tables[t].table`, written into the caller's buffer `tables[t].data`
/// (`tables[t].byte_len == n * row_bytes` bytes, rows in the order of the ids). The rows
/// are received straight into those buffers: the runtime's allocator for the request hands
/// out the caller's buffer of each table, so large blocks go from the socket to the buffer
/// with no copy (small ones are copied once out of the receive buffer, as every small
/// tensor). Only if the peer answers tables of the same dtype and shape out of order does a
/// block land in another of the request's buffers; it is then copied into place at the
/// wait.
///
/// Wait for it with `sw_client_wait`; a client made with a callback gets the reply in its
/// callback instead, called once starwire holds none of the buffers (a pull given up
/// mid-transfer may still be receiving into them: the callback then comes when that
/// receive has ended, on the thread that ended it). The reply has one item per table:
/// `sw_reply_status` (0, or
/// 1 `NOT_FOUND` for a table the peer does not serve, 7 `INVALID_ARGUMENT` for a dtype or
/// row shape other than the table's, ...) and `sw_reply_missing` (the rows the peer did not
/// have, whose bytes are zero). A table's buffer holds its rows only when its status is 0.
///
/// Fails at once with `SW_ERR_INVALID_ARGUMENT` when `n_tables` is 0, or a table has no
/// ids, an unknown dtype, more than 7 row dimensions, or a `byte_len` other than
/// `n * row_bytes`; with `SW_ERR_NULL` for a NULL `data`.
///
/// # Safety
/// As `sw_client_ping`; `tables` points at `n_tables` values whose `row_dims` and `ids`
/// are valid for the call, and whose `data` stays valid, and is neither read nor written by
/// the caller, until `sw_client_wait` for this request returns, or its callback is called
/// (or `sw_client_free`, which waits for either).
#[no_mangle]
pub extern "C" fn sw_client_pull_rows(
    c: *mut sw_client,
    peer: *const c_char,
    tables: *const sw_rows,
    n_tables: usize,
    timeout_ms: u64,
    tag: *mut u64,
) -> sw_result {
    boundary!({
        submit(c, peer, tag, |client, peer| {
            let args = rows_args(tables, n_tables)?;
            let targets = targets_of(&args);
            let rows: Vec<Rows<'_>> = args.iter().map(|a| a.rows).collect();
            let alloc = Arc::new(RowsAllocator(targets.clone()));
            let t = match &client.callback_rows {
                Some(cb) => {
                    // Registered before the callback can look for it: the callback takes
                    // this lock, and submitting never waits for the loop.
                    let mut pending = lock(&cb.pending);
                    let t = with_client!(client, |h| h.pull_rows_into(
                        peer,
                        &rows,
                        alloc,
                        deadline(timeout_ms)
                    ))?;
                    pending.insert(t.tag(), targets);
                    cb.count.fetch_add(1, Ordering::AcqRel);
                    t
                }
                None => {
                    let t = with_client!(client, |h| h.pull_rows_into(
                        peer,
                        &rows,
                        alloc,
                        deadline(timeout_ms)
                    ))?;
                    client.rows.insert(t.tag(), targets);
                    t
                }
            };
            Ok::<_, Failure>(t.tag())
        })
    })
}

/// A rows pull of one table, submitted and waited for in one call: `sw_client_pull_rows`
/// with `n_tables` 1, then `sw_client_wait`, without a reply to read and free. The rows are
/// received into `rows->data` as there. On `SW_OK` the table's rows are in `rows->data` and
/// the positions (in `rows->ids`, increasing) of the rows the peer did not have (their
/// bytes are zero) are in `missing`, `*missing_count` of them; `missing` has room for
/// `rows->n` positions.
///
/// Fails as the two calls do: at once on an invalid argument, and with the request's
/// outcome (`SW_ERR_TIMEOUT`, `SW_ERR_CONNECTION_LOST`, ...); a table the peer refused
/// (`NOT_FOUND`, `INVALID_ARGUMENT`, ...) is `SW_ERR_REMOTE`, with its wire status in
/// `sw_last_error_status`. Once this returns, whatever it returns, starwire no longer touches
/// `rows->data`: a pull given up by its deadline while the block is being received into
/// `rows->data` returns when that receive ends, which a peer that stops sending bounds by
/// `STARWIRE_PROGRESS_TIMEOUT_MS` (30 s by default; the connection is then closed). Not for
/// clients made with a callback (`SW_ERR_INVALID_ARGUMENT`).
///
/// This is the blocking call of language bindings: one foreign call per pull, and a
/// waiting thread that holds no lock of the caller's runtime (a Python binding releases
/// the GIL around it).
///
/// # Safety
/// As `sw_client_ping`; `rows` points at one `sw_rows` whose pointers are valid for the
/// call, `data` neither read nor written by the caller during it; `missing` has room for
/// `rows->n` values; `missing_count` is writable.
#[no_mangle]
pub extern "C" fn sw_client_pull_rows_wait(
    c: *mut sw_client,
    peer: *const c_char,
    rows: *const sw_rows,
    timeout_ms: u64,
    missing: *mut u32,
    missing_count: *mut usize,
) -> sw_result {
    boundary!({
        let client = client_mut(c)?;
        let peer = try_peer!(peer);
        let missing_count = try_out!(missing_count);
        if client.callback {
            return Err(Failure::invalid(
                "a rows pull is waited for with sw_client_wait: not for a client with a callback",
            ));
        }
        let args = rows_args(rows, 1)?;
        let targets = targets_of(&args);
        let alloc = Arc::new(RowsAllocator(targets.clone()));
        let request = [args[0].rows];
        let completion = match with_client!(client, |h| h
            .pull_rows_into(peer, &request, alloc, deadline(timeout_ms))
            .and_then(|t| h.wait_tag(t.tag())))
        {
            Ok(c) => c,
            Err(e) => {
                client.wait_released(&targets);
                return Err(Failure::from(e));
            }
        };
        let answer = match &completion.result {
            Ok(Reply::Rows(rows)) => one_table(&targets, rows, &args[0], missing),
            Ok(_) => Err(Failure::new(
                SW_ERR_PROTOCOL,
                "not an answer to a rows pull",
            )),
            Err(e) => Err(Failure::from(e.clone())),
        };
        // Drops the blocks (giving the buffer back); the request's and the answer's vectors
        // serve the client's next requests.
        with_client!(client, |h| h.recycle(completion));
        // A pull given up mid-transfer may still be receiving into the buffer.
        client.wait_released(&targets);
        missing_count.write(answer?);
        Ok(())
    })
}

/// A one-table rows pull's answer put in place: the table's status checked, and the
/// positions of its missing rows written to `missing` (room for `arg`'s ids); their count.
fn one_table(
    targets: &RowsTargets,
    rows: &PulledRows,
    arg: &RowsArg<'_>,
    missing: *mut u32,
) -> Result<usize, Failure> {
    let status = targets.place(rows).first().copied().unwrap_or(u32::MAX);
    if status != 0 {
        return Err(table_failure(arg.rows.table, status));
    }
    one_table_missing(rows, arg, missing)
}

/// The positions of a one-table rows pull's missing rows written to `missing` (room for
/// `arg`'s ids); their count.
fn one_table_missing(
    rows: &PulledRows,
    arg: &RowsArg<'_>,
    missing: *mut u32,
) -> Result<usize, Failure> {
    let m = rows.missing(0);
    if m.len() > arg.rows.ids.len() {
        return Err(Failure::new(
            SW_ERR_PROTOCOL,
            "more rows missing than asked for",
        ));
    }
    if !m.is_empty() {
        // Room for `rows->n` positions, of which `m.len()` (no more: checked above).
        let out = try_out_slice!(missing, m.len());
        for (o, &p) in out.iter_mut().zip(m) {
            o.write(p);
        }
    }
    Ok(m.len())
}

/// A rows pull of one table for a caller that holds some of its rows already (a cache of
/// rows), submitted and waited for in one call: `sw_client_pull_rows_wait` that names, per
/// id, the version of the row the caller holds, and gets back only the rows whose version
/// changed. `held[i]` is the version of the row of `rows->ids[i]` the caller holds in
/// `rows->data` (row `i` there), or 0 for none (such a row is always sent).
///
/// On `SW_OK`: each row that was sent (changed, or not held) is written at its position in
/// `rows->data`, and the rows that came unchanged are left as they are there (the caller's
/// copy is the PS's row); `versions[i]` is the version of row `i` as the PS has it (the held
/// one when it came unchanged; 0, unknown, for a missing row and for every row from a PS
/// or table that keeps or speaks no versions: hold such rows as version 0, so that the next
/// pull asks for them again); `unchanged[i]` says whether row `i` came unchanged (its bytes
/// did not travel); `*changed` is the number of rows written; and the missing rows (zero
/// in `rows->data`) are in `missing`, `*missing_count` of them, as for
/// `sw_client_pull_rows_wait`. A version is a number the PS's table gives a row each time
/// a push changes it (and when it creates or loads it), never twice, so a held version
/// that matches is the row as the PS has it.
///
/// A PS that did not announce `row_versions` (an earlier release, or
/// `STARWIRE_WIRE_FEATURES` without it on either end) is sent a plain pull: every row comes
/// back changed, with version 0. When every row is sent they are received straight into
/// `rows->data`, as `sw_client_pull_rows_wait` receives them; when only some are, they
/// arrive in memory of starwire's and are copied into place.
///
/// Fails as `sw_client_pull_rows_wait` does (`rows->data` is then as the pull left it:
/// rows received into it may have been written), and with `SW_ERR_NULL` naming `held`,
/// `versions`, `unchanged` or `changed` when NULL. Not for clients made with a callback.
///
/// # Safety
/// As `sw_client_pull_rows_wait`; `rows->data` holds the caller's rows (any bytes where
/// none is held); `held` points at `rows->n` values; `versions` and `unchanged` have room
/// for `rows->n` values; `changed` is writable.
#[no_mangle]
pub extern "C" fn sw_client_pull_rows_versioned_wait(
    c: *mut sw_client,
    peer: *const c_char,
    rows: *const sw_rows,
    held: *const u64,
    timeout_ms: u64,
    versions: *mut u64,
    unchanged: *mut bool,
    changed: *mut usize,
    missing: *mut u32,
    missing_count: *mut usize,
) -> sw_result {
    boundary!({
        let client = client_mut(c)?;
        let peer = try_peer!(peer);
        let changed = try_out!(changed);
        let missing_count = try_out!(missing_count);
        if client.callback {
            return Err(Failure::invalid(
                "a rows pull is waited for with sw_client_wait: not for a client with a callback",
            ));
        }
        let args = rows_args(rows, 1)?;
        let n = args[0].rows.ids.len();
        let held = try_slice!(held, n);
        let out = Versioned {
            versions: try_out_slice!(versions, n),
            unchanged: try_out_slice!(unchanged, n),
            missing,
        };
        let targets = targets_of(&args);
        let alloc = Arc::new(RowsAllocator(targets.clone()));
        let request = [args[0].rows];
        let completion = match with_client!(client, |h| h
            .pull_rows_versioned_into(peer, &request, held, alloc, deadline(timeout_ms))
            .and_then(|t| h.wait_tag(t.tag())))
        {
            Ok(c) => c,
            Err(e) => {
                client.wait_released(&targets);
                return Err(Failure::from(e));
            }
        };
        let answer = match &completion.result {
            Ok(Reply::Rows(rows)) => versioned_table(&targets, rows, &args[0], out),
            Ok(_) => Err(Failure::new(
                SW_ERR_PROTOCOL,
                "not an answer to a rows pull",
            )),
            Err(e) => Err(Failure::from(e.clone())),
        };
        with_client!(client, |h| h.recycle(completion));
        client.wait_released(&targets);
        let (written, missed) = answer?;
        changed.write(written);
        missing_count.write(missed);
        Ok(())
    })
}

/// Where a versioned pull's per-row answer goes.
struct Versioned<'a> {
    versions: &'a mut [MaybeUninit<u64>],
    unchanged: &'a mut [MaybeUninit<bool>],
    missing: *mut u32,
}

/// A one-table versioned pull's answer put in place: the rows sent written into the
/// caller's rows, the versions and unchanged flags and the missing rows' positions
/// written; the rows written and the missing count.
fn versioned_table(
    targets: &RowsTargets,
    rows: &PulledRows,
    arg: &RowsArg<'_>,
    out: Versioned<'_>,
) -> Result<(usize, usize), Failure> {
    let n = arg.rows.ids.len();
    let versions = rows.versions(0);
    if !versions.is_empty() && versions.len() != n {
        return Err(Failure::new(
            SW_ERR_PROTOCOL,
            format!("{} row versions for {n} ids", versions.len()),
        ));
    }
    let (status, written) = targets.place_changed(rows);
    if status != 0 {
        return Err(table_failure(arg.rows.table, status));
    }
    let missed = one_table_missing(rows, arg, out.missing)?;
    for (i, (v, u)) in out
        .versions
        .iter_mut()
        .zip(out.unchanged.iter_mut())
        .enumerate()
    {
        v.write(versions.get(i).copied().unwrap_or(0));
        u.write(rows.unchanged(0, i));
    }
    Ok((written, missed))
}

/// The failure of a rows table the peer answered with wire status `status`.
pub(crate) fn table_failure(table: u32, status: u32) -> Failure {
    // The wire name (`NOT_FOUND`) from the variant's (`NotFound`).
    let mut name = String::new();
    for (i, ch) in format!("{:?}", Status::from(status as u16))
        .chars()
        .enumerate()
    {
        if ch.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(ch.to_ascii_uppercase());
    }
    let mut f = Failure::new(
        SW_ERR_REMOTE,
        format!("table {table}: the peer answered {name} ({status})"),
    );
    f.remote = Some((status, String::new()));
    f
}

/// Pushes gradient rows of `n_tables` tables to `peer` in one request: per table, the rows
/// at `tables[t].data` (`n * row_bytes` bytes, in the order of the ids) for its ids. The
/// ids and rows are copied before this returns: the caller may reuse its buffers at once.
/// `sw_client_push_rows_tensors` sends the rows from the caller's memory instead.
/// The reply (`sw_client_wait`, or the callback) has one status per table: 0, or 1
/// `NOT_FOUND` for a table the peer does not serve, 7 `INVALID_ARGUMENT` for a dtype or
/// row shape other than the table's, ...
///
/// Fails at once as `sw_client_pull_rows` does.
///
/// # Safety
/// As `sw_client_ping`; `tables` points at `n_tables` values whose pointers are valid for
/// the call.
#[no_mangle]
pub extern "C" fn sw_client_push_rows(
    c: *mut sw_client,
    peer: *const c_char,
    tables: *const sw_rows,
    n_tables: usize,
    timeout_ms: u64,
    tag: *mut u64,
) -> sw_result {
    boundary!({
        submit(c, peer, tag, |client, peer| {
            let args = rows_args(tables, n_tables)?;
            let items = args
                .iter()
                .map(|a| {
                    Ok((
                        a.rows,
                        try_slice!(a.data.cast_const(), a.len, "tables[i].data"),
                    ))
                })
                .collect::<Result<Vec<(Rows<'_>, &[u8])>, Failure>>()?;
            let t = with_client!(client, |h| h.push_rows(peer, &items, deadline(timeout_ms)))?;
            Ok::<_, Failure>(t.tag())
        })
    })
}

/// Pushes gradient rows of `n_tables` tables to `peer` in one request, as
/// `sw_client_push_rows` does, with table `t`'s gradient rows in tensor `grads[t]` instead
/// of at `tables[t].data` (which is not read, and may be NULL): its contents are the
/// `tables[t].byte_len` bytes of rows (its dtype and shape are not looked at), sent from
/// the tensor's own memory without a copy (contents of at most 256 bytes, the encoder's
/// inline threshold, are copied into the frame: cheaper than one more `iovec`). The ids are
/// copied before this returns.
///
/// The tensors are shared with the runtime until written, as with `sw_client_push`; the
/// caller keeps its handles. To send from the caller's own buffer, wrap it with
/// `sw_tensor_wrap`: the buffer must then stay valid and unchanged until starwire drops its
/// last reference to that tensor (`release` called, or `sw_tensor_shared` false once the
/// caller's handle is the only one), which may come shortly after the reply: the reply
/// alone does not free the buffer. Fails at once as `sw_client_push_rows` does, and when
/// a tensor's byte length is not its table's `byte_len`.
///
/// # Safety
/// As `sw_client_push_rows`; `grads` points at `n_tables` live tensor handles.
#[no_mangle]
pub extern "C" fn sw_client_push_rows_tensors(
    c: *mut sw_client,
    peer: *const c_char,
    tables: *const sw_rows,
    grads: *const *const sw_tensor,
    n_tables: usize,
    timeout_ms: u64,
    tag: *mut u64,
) -> sw_result {
    boundary!({
        submit(c, peer, tag, |client, peer| {
            let args = rows_args_with(tables, n_tables, false)?;
            let grads = try_slice!(grads, n_tables);
            let mut items = Vec::with_capacity(args.len());
            for (i, (a, &g)) in args.iter().zip(grads).enumerate() {
                let g = try_ref!(g, "grads[i]");
                if g.tensor.byte_len() != a.len {
                    return Err(Failure::invalid(format!(
                        "grads[{i}] is {} bytes, not tables[{i}].byte_len {}",
                        g.tensor.byte_len(),
                        a.len
                    )));
                }
                items.push((a.rows, g.tensor.clone()));
            }
            let t = with_client!(client, |h| h.push_rows_shared(
                peer,
                &items,
                deadline(timeout_ms)
            ))?;
            Ok(t.tag())
        })
    })
}
