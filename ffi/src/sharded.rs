//! The sharded rows client over the C ABI: one table partitioned over PS tasks, a batch
//! pulled into (or pushed from) the caller's `[batch, row]` buffer with one request per PS,
//! all in flight at once.

use std::ffi::{c_char, c_void};
use std::mem::MaybeUninit;

use starwire::rows::{Partition, StepReport, MAX_ROW_RANK};
use starwire::{DType, Peer, Sharded};

use crate::boundary::boundary;
use crate::cast::{free_box, to_boxed, try_mut, try_out, try_peer, try_ref, try_slice};
use crate::cast::{try_slice_mut, Boxed, Castable};
use crate::client::{deadline, stepping_client, sw_client, with_client};
use crate::result::{sw_result, Failure};

/// How ids are spread over the PS tasks: the `kind` of `sw_partition`.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum sw_partition_kind {
    /// Shard `id % shards` (TensorFlow's `"mod"`).
    SW_PARTITION_MOD = 0,
    /// Contiguous ranges of `0..vocab` (TensorFlow's `"div"`): the first `vocab % shards`
    /// shards hold one id more; ids at or above `vocab` go to the last shard.
    SW_PARTITION_DIV = 1,
    /// Shard `mix64(id) % shards` (splitmix64's finalizer): even for patterned ids.
    SW_PARTITION_HASH = 2,
}

/// How ids are spread over the PS tasks.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sw_partition {
    /// A `sw_partition_kind`.
    pub kind: u32,
    /// `SW_PARTITION_DIV`: the number of ids of the table. Otherwise unused.
    pub vocab: u64,
}

/// What a sharded step did.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct sw_step_report {
    /// Distinct ids the step sent.
    pub unique: usize,
    /// Rows of the batch the PS tasks did not have (a pull; left zero in the buffer).
    pub missing: usize,
    /// PS tasks whose part failed (see `sw_sharded_part`).
    pub failed: usize,
    /// The first PS (in the order given) whose part failed; `SIZE_MAX` if none did.
    pub first_failed: usize,
    /// PS parts of a pull whose rows came back in the table's dtype although another wire
    /// dtype was set (`sw_sharded_set_wire_dtype`): that PS did not announce `row_formats`
    /// (an earlier release, or `STARWIRE_WIRE_FEATURES=none`). The rows are right all the
    /// same.
    pub fallbacks: usize,
}

/// A table of embedding rows partitioned over PS tasks, seen from a worker: each step's
/// ids deduplicated, spread over the PS tasks, sent as one rows request per PS, and the
/// answers scattered into the caller's buffer (duplicates filled); a push sums the
/// gradients of duplicate ids first (f32 and f64 rows). Used by one thread at a time.
pub struct sw_sharded {
    _private: [u8; 0],
}

/// What a `sw_sharded` handle is.
pub(crate) struct ShardedHandle {
    sharded: Sharded,
    /// The last step's outcome per PS.
    parts: Failures,
}

/// The last step's outcome per PS: its result and, when it failed, its message.
#[derive(Default)]
pub(crate) struct Failures(Vec<Failure>);

impl Failures {
    /// Keeps the outcome of each PS part of `done`.
    pub(crate) fn keep(&mut self, done: &StepReport) {
        self.0.clear();
        self.0.extend(done.shards.iter().map(|part| match part {
            Ok(_) => Failure::new(sw_result::SW_OK, ""),
            Err(e) => Failure::from(e.clone()),
        }));
    }

    /// `done` as the C ABI reports it.
    pub(crate) fn report(&self, done: &StepReport) -> sw_step_report {
        sw_step_report {
            unique: done.unique,
            missing: done.missing,
            failed: self.0.iter().filter(|p| p.code != sw_result::SW_OK).count(),
            first_failed: done.first_error().map_or(usize::MAX, |(i, _)| i),
            fallbacks: done.fallbacks,
        }
    }

    /// Keeps the outcome of each PS part of `done`, writes `done` to `report` as the C ABI
    /// reports it, and returns the first failed part's failure, if one failed.
    pub(crate) fn settle(
        &mut self,
        done: &StepReport,
        report: &mut MaybeUninit<sw_step_report>,
    ) -> Result<(), Failure> {
        self.keep(done);
        report.write(self.report(done));
        self.first_failure()
    }

    /// The first failed part's failure, if one failed.
    pub(crate) fn first_failure(&self) -> Result<(), Failure> {
        match self.0.iter().find(|p| p.code != sw_result::SW_OK) {
            Some(f) => Err(f.clone()),
            None => Ok(()),
        }
    }

    /// The outcome at PS `i`; `SW_ERR_INVALID_ARGUMENT` when the last step had no part `i`.
    pub(crate) fn part(&self, i: usize) -> Result<(), Failure> {
        let p = self.0.get(i).ok_or_else(|| {
            Failure::invalid(format!(
                "part {i}: the last step has {} parts",
                self.0.len()
            ))
        })?;
        match p.code {
            sw_result::SW_OK => Ok(()),
            _ => Err(p.clone()),
        }
    }
}

impl Castable for sw_sharded {
    type Ownership = Boxed;
    type RustType = ShardedHandle;
}

/// `p` as a [`Partition`], or `SW_ERR_INVALID_ARGUMENT` for an unknown kind.
pub(crate) fn partition_of(p: sw_partition) -> Result<Partition, Failure> {
    match p.kind {
        k if k == sw_partition_kind::SW_PARTITION_MOD as u32 => Ok(Partition::Mod),
        k if k == sw_partition_kind::SW_PARTITION_DIV as u32 => {
            Ok(Partition::Div { vocab: p.vocab })
        }
        k if k == sw_partition_kind::SW_PARTITION_HASH as u32 => Ok(Partition::Hash),
        k => Err(Failure::invalid(format!(
            "partition.kind {k} is not a sw_partition_kind"
        ))),
    }
}

/// The PS tasks `peers[0..n]` (`task@host:port` or `host:port`): `SW_ERR_INVALID_ARGUMENT`
/// for none, or for one that is not an address (naming it).
pub(crate) fn peers_of(peers: *const *const c_char, n: usize) -> Result<Vec<Peer>, Failure> {
    let texts = try_slice!(peers, n);
    if texts.is_empty() {
        return Err(Failure::invalid("no peers"));
    }
    texts
        .iter()
        .enumerate()
        .map(|(i, &p)| Ok(try_peer!(p, format!("peers[{i}]"))))
        .collect()
}

/// The row shape `row_dims[0..rank]` (NULL allowed for rank 0): `SW_ERR_INVALID_ARGUMENT`
/// for more than `MAX_ROW_RANK` dimensions.
pub(crate) fn row_dims_of<'a>(row_dims: *const u64, rank: u32) -> Result<&'a [u64], Failure> {
    if rank as usize > MAX_ROW_RANK {
        return Err(Failure::invalid(format!(
            "rank {rank} is above {MAX_ROW_RANK}"
        )));
    }
    Ok(try_slice!(row_dims, rank as usize))
}

/// Creates a sharded table: table `table` of rows of `dtype` shaped `row_dims[0..rank]`,
/// PS task `i` at `peers[i]` (`task@host:port` from `sw_resolver_peer`, whose failures then
/// name the task, or `host:port`) holding the ids `partition` gives it. A step's part for
/// a PS that cannot be reached fails alone (`sw_sharded_part`), after the connect retries
/// (about 2.55 s with the defaults when nothing listens there, within 47.55 s in any case;
/// see `sw_client`) unless the step's `timeout_ms` comes first. On `SW_OK`, `*out` is a new handle the caller frees
/// with `sw_sharded_free`.
///
/// Fails with `SW_ERR_INVALID_ARGUMENT` for no peers, a peer that is not an address, an
/// unknown partition kind or dtype, rows of no bytes, or more than 7 row dimensions.
///
/// # Safety
/// `peers` points at `n_peers` NUL-terminated strings; `row_dims` at `rank` values (may be
/// NULL when `rank` is 0); `out` is writable.
#[no_mangle]
pub extern "C" fn sw_sharded_new(
    peers: *const *const c_char,
    n_peers: usize,
    partition: sw_partition,
    table: u32,
    dtype: u8,
    row_dims: *const u64,
    rank: u32,
    out: *mut *mut sw_sharded,
) -> sw_result {
    boundary!({
        let out = try_out!(out);
        let peers = peers_of(peers, n_peers)?;
        let row_dims = row_dims_of(row_dims, rank)?;
        let sharded = Sharded::new(
            peers,
            partition_of(partition)?,
            table,
            DType::from(dtype),
            row_dims,
        )?;
        out.write(to_boxed(ShardedHandle {
            sharded,
            parts: Failures::default(),
        }));
        Ok(())
    })
}

/// Releases a sharded table. NULL is ignored.
///
/// # Safety
/// `s` is NULL or a handle from `sw_sharded_new` not freed before.
#[no_mangle]
pub extern "C" fn sw_sharded_free(s: *mut sw_sharded) {
    boundary!((), { free_box(s) })
}

/// Which way a step goes.
enum Step {
    Pull(*mut u8),
    Push(*const u8),
}

/// One step of `s` through `c`: checks, runs, keeps the parts' outcomes and writes the
/// report. The failure is the first failed part's, when one failed (the report written).
// The arguments of the two C functions it serves, passed through as they are.
#[allow(clippy::too_many_arguments)]
fn step(
    s: *mut sw_sharded,
    c: *mut sw_client,
    ids: *const u64,
    n: usize,
    data: Step,
    byte_len: u64,
    timeout_ms: u64,
    report: *mut sw_step_report,
) -> Result<(), Failure> {
    let s = try_mut!(s, "sharded");
    let client = stepping_client(c)?;
    let report = try_out!(report);
    let ids = try_slice!(ids, n);
    let len = usize::try_from(byte_len).map_err(|_| Failure::invalid("byte_len too large"))?;
    let want = ids.len().checked_mul(s.sharded.row_bytes());
    if want != Some(len) {
        return Err(Failure::invalid(format!(
            "{byte_len} bytes for {} ids of {} bytes",
            ids.len(),
            s.sharded.row_bytes()
        )));
    }
    let deadline = deadline(timeout_ms);
    let done = match data {
        Step::Pull(out) => {
            let out = try_slice_mut!(out, len);
            with_client!(client, |h| s.sharded.pull(h, ids, out, deadline))?
        }
        Step::Push(grads) => {
            let grads = try_slice!(grads, len);
            with_client!(client, |h| s.sharded.push(h, ids, grads, deadline))?
        }
    };
    s.parts.settle(done, report)
}

/// Pulls the rows of `ids[0..n]` (duplicates allowed) into `out`, `byte_len == n *
/// row_bytes` bytes, row `i` for `ids[i]`: one rows request per PS that has ids, all in
/// flight at once, waited for through `c` (a client made by `sw_client_new`). Rows a PS
/// does not have are left zero and counted in `report->missing`.
///
/// A PS that fails fails its part alone: the rows of the others are written. The result is
/// `SW_OK` when every part succeeded, else the first failed part's result (with its
/// message); in both cases `*report` is written, and `sw_sharded_part` tells each PS's
/// outcome. Arguments that are not valid fail the call before anything is sent
/// (`SW_ERR_INVALID_ARGUMENT`, `SW_ERR_NULL`), `*report` untouched.
///
/// # Safety
/// `s`, `c` are live handles used by this thread only; `ids` points at `n` values (may be
/// NULL when `n` is 0); `out` at `byte_len` writable bytes not used by anyone else during
/// the call; `report` is writable.
#[no_mangle]
pub extern "C" fn sw_sharded_pull(
    s: *mut sw_sharded,
    c: *mut sw_client,
    ids: *const u64,
    n: usize,
    out: *mut c_void,
    byte_len: u64,
    timeout_ms: u64,
    report: *mut sw_step_report,
) -> sw_result {
    let out = Step::Pull(out.cast());
    boundary!({ step(s, c, ids, n, out, byte_len, timeout_ms, report) })
}

/// Pulls each distinct id of `ids[0..n]` (duplicates allowed) once, for a caller that builds
/// its batch from the distinct rows itself: writes the distinct ids into `unique`, their
/// rows into `out` (row `j` for `unique[j]`) and, for each position `i` of the batch, the
/// index of `ids[i]` in `unique` into `inverse[i]`. `unique` and `out` have room for `n`
/// ids and rows (`byte_len >= n * row_bytes`; what is past the distinct ones is left as it
/// was); `report->unique` says how many were written. The distinct ids are grouped by PS
/// task (in the order of the tasks), each task's in the order first seen. The requests,
/// the failures and `*report` are as for `sw_sharded_pull` (`missing` counts batch
/// positions).
///
/// # Safety
/// As `sw_sharded_pull`, with `inverse` pointing at `n` writable int64 values and `unique`
/// at `n` writable uint64 values; `ids`, `inverse`, `unique` and `out` do not overlap.
#[no_mangle]
pub extern "C" fn sw_sharded_pull_unique(
    s: *mut sw_sharded,
    c: *mut sw_client,
    ids: *const u64,
    n: usize,
    inverse: *mut i64,
    unique: *mut u64,
    out: *mut c_void,
    byte_len: u64,
    timeout_ms: u64,
    report: *mut sw_step_report,
) -> sw_result {
    boundary!({
        let s = try_mut!(s, "sharded");
        let client = stepping_client(c)?;
        let report = try_out!(report);
        let ids = try_slice!(ids, n);
        let inverse = try_slice_mut!(inverse, n);
        let unique = try_slice_mut!(unique, n);
        let len = usize::try_from(byte_len).map_err(|_| Failure::invalid("byte_len too large"))?;
        let want = ids.len().saturating_mul(s.sharded.row_bytes());
        if len < want {
            return Err(Failure::invalid(format!(
                "{byte_len} bytes of out for {} ids of {} bytes (at least {want})",
                ids.len(),
                s.sharded.row_bytes()
            )));
        }
        let out = try_slice_mut!(out.cast::<u8>(), len, "out");
        let deadline = deadline(timeout_ms);
        let done = with_client!(client, |h| s
            .sharded
            .pull_unique(h, ids, inverse, unique, out, deadline))?;
        s.parts.settle(done, report)
    })
}

/// Pushes the gradient rows `grads` (`byte_len == n * row_bytes` bytes, row `i` for
/// `ids[i]`): the gradients of duplicate ids are summed (f32 and f64 rows), then each PS
/// gets its distinct ids and their summed rows in one request, all in flight at once. The
/// result and `*report` as for `sw_sharded_pull`.
///
/// # Safety
/// As `sw_sharded_pull`, with `grads` pointing at `byte_len` readable bytes.
#[no_mangle]
pub extern "C" fn sw_sharded_push(
    s: *mut sw_sharded,
    c: *mut sw_client,
    ids: *const u64,
    n: usize,
    grads: *const c_void,
    byte_len: u64,
    timeout_ms: u64,
    report: *mut sw_step_report,
) -> sw_result {
    let grads = Step::Push(grads.cast());
    boundary!({ step(s, c, ids, n, grads, byte_len, timeout_ms, report) })
}

/// The loss scale `scale` as an option: 0 is none.
pub(crate) fn scale_of(scale: f32) -> Option<f32> {
    (scale != 0.0).then_some(scale)
}

/// Rows of `s` travel as `dtype` (a wire dtype code) from the next step on: the table's
/// dtype, or for a table of f32 (10), bf16 (7) or f16 (6) rows any of those three. A pull
/// asks the PS tasks for rows in `dtype` (they round to nearest even) and widens them into
/// the caller's rows, which stay in the table's dtype; a push narrows its summed gradients
/// as it sends them. A PS that did not announce `row_formats` is sent and answers rows in
/// the table's dtype instead: the step is served all the same, and
/// `sw_step_report.fallbacks` counts such parts of a pull.
///
/// Fails with `SW_ERR_INVALID_ARGUMENT`, changing nothing, for a dtype the table's rows do
/// not travel as (the message names both).
///
/// # Safety
/// `s` is a live handle used by this thread only.
#[no_mangle]
pub extern "C" fn sw_sharded_set_wire_dtype(s: *mut sw_sharded, dtype: u8) -> sw_result {
    boundary!({
        let s = try_mut!(s, "sharded");
        Ok(s.sharded.set_wire_dtype(DType::from(dtype))?)
    })
}

/// The wire dtype code rows of `s` travel as (the table's dtype unless
/// `sw_sharded_set_wire_dtype` set another; 0 for NULL).
///
/// # Safety
/// `s` is NULL or a live handle.
#[no_mangle]
pub extern "C" fn sw_sharded_wire_dtype(s: *const sw_sharded) -> u8 {
    boundary!(0, {
        crate::cast::ref_from(s).map_or(0, |h| u8::from(h.sharded.wire_dtype()))
    })
}

/// Pushes of `s` from the next one on say their gradients were multiplied by `scale` (a
/// loss scale, 2^-126 to 2^126), which the PS divides out (multiplying by the f32 nearest
/// `1 / scale`, exact for powers of two) before applying them in the table's dtype; 0: no
/// scale (the default). For tables of f32, bf16 and f16 rows.
///
/// Fails with `SW_ERR_INVALID_ARGUMENT`, changing nothing, for a scale out of range (NaN,
/// negative, infinite, or below 2^-126 or above 2^126) or a table of other rows.
///
/// # Safety
/// `s` is a live handle used by this thread only.
#[no_mangle]
pub extern "C" fn sw_sharded_set_loss_scale(s: *mut sw_sharded, scale: f32) -> sw_result {
    boundary!({
        let s = try_mut!(s, "sharded");
        Ok(s.sharded.set_loss_scale(scale_of(scale))?)
    })
}

/// The last step's outcome at PS `i` (in the order given to `sw_sharded_new`): `SW_OK`, or
/// why its part failed (with its message for `sw_last_error`, naming the PS; a PS that
/// answered with an error status: `SW_ERR_REMOTE`, and `sw_last_error_status`).
/// `SW_ERR_INVALID_ARGUMENT` when `i` is not below the number of PS tasks, or no step ran.
///
/// # Safety
/// `s` is a live handle.
#[no_mangle]
pub extern "C" fn sw_sharded_part(s: *const sw_sharded, i: usize) -> sw_result {
    boundary!({
        let s = try_ref!(s, "sharded");
        s.parts.part(i)
    })
}
