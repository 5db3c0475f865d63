//! The pipelined sharded rows client over the C ABI: a table partitioned over PS tasks,
//! whose steps overlap their communication with the caller's computation. The rows of the
//! next batch are requested early (`sw_pipeline_prefetch`), gradients are pushed without
//! waiting for the answers (`sw_pipeline_push`), a staleness bound keeps the rows honest,
//! and a push that failed after its call had returned fails the next call.

use std::ffi::{c_char, c_void};
use std::time::Duration;

use arrayvec::ArrayVec;
use starwire::client::{Client, Mode};
use starwire::rows::{PipelineReport, PipelineSettings, PushFailure, MAX_TABLES};
use starwire::{DType, Error, ErrorKind, Pipeline};

use crate::boundary::boundary;
use crate::cast::{free_box, ref_from, to_boxed, try_mut, try_out, try_ref, try_slice};
use crate::cast::{try_slice_mut, Boxed, Castable};
use crate::client::{client_mut, sw_client, with_client, ClientHandle};
use crate::result::{sw_result, Failure};
use crate::sharded::{partition_of, peers_of, row_dims_of, scale_of, sw_partition};
use crate::sharded_tables::{batch_grads, batch_ids, batch_outs, one_batch_per_table};
use crate::sharded_tables::{sw_table_batch, sw_table_shape, sw_unique_batch, table_shapes};
use crate::sharded_tables::{unique_slices, UniqueSlices};

/// How far a pipeline runs ahead of its PS tasks (`sw_pipeline_settings_default` gives the
/// defaults; `sw_pipeline_new` refuses values out of range, naming the field).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct sw_pipeline_settings {
    /// The staleness bound `s`: the rows a step uses may miss at most `s` of this worker's
    /// own most recent pushes (they reflect every earlier one). 0: each pull waits for the
    /// pushes before it to be answered, and its rows are those `sw_sharded_pull` would give
    /// after `sw_sharded_push` returned. Any value; default 1.
    pub staleness: u32,
    /// The most pushes in flight (sent, not yet answered by every PS they went to): a push
    /// waits until the one this many pushes before it has been answered. 1 to 64; default 2.
    pub max_pushes_in_flight: u32,
    /// The time each request is given from when it is sent, in milliseconds, before it fails
    /// with `SW_ERR_TIMEOUT`; 0: no limit (a PS that stops answering without closing its
    /// connection then holds a wait forever). Default 60000.
    pub timeout_ms: u64,
    /// The wire dtype code rows travel as: 0 (the default) for the table's dtype; for a
    /// table of f32 (10), bf16 (7) or f16 (6) rows, any of those three (the caller's rows
    /// stay in the table's dtype; see `sw_sharded_set_wire_dtype`, which does the same).
    pub wire_dtype: u8,
    /// The factor pushed gradients were multiplied by (a loss scale, 2^-126 to 2^126),
    /// which the PS divides out before applying them; 0 (the default): none. For tables of
    /// f32, bf16 and f16 rows.
    pub loss_scale: f32,
    /// The bytes of the worker's row cache (its rows and their index, all allocated when
    /// the pipeline is made); 0 (the default): no cache, every row of every step pulled.
    /// Not 0: at least the bytes of one row with its id, clock, version and index cells,
    /// `row_bytes + 33`. Each row costs `row_bytes + 25` bytes, and 8 to 16 of index. With a
    /// staleness bound `s >= 1`, a cached row that misses at most `s` of this worker's
    /// pushes when used is served from the cache, not pulled (`cache_hits` of the report);
    /// with `s = 0` the cache serves nothing without asking. Either way the cached rows
    /// too old to serve are named in the pull with their versions, and a PS that keeps
    /// row versions (and announces `row_versions`) answers those nobody changed
    /// unchanged, without their bytes
    /// (`rows_unchanged`). This worker's own pushes do not patch cached rows.
    pub cache_bytes: u64,
}

/// What a step of a pipeline did so far: a step runs from the `sw_pipeline_pull` that
/// delivers its rows to the next one (its pull, the prefetch of the next batch, the push
/// of its gradients), and each call writes the report of the step so far. Bytes are
/// payload (8 per id, `row_bytes` per row each way; frame headers not counted), counted in
/// the step whose call sent or took them.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct sw_pipeline_report {
    /// The step, counted from 0: the pulls that delivered rows before it.
    pub step: u64,
    /// Seconds spent in the step's calls: the time the caller's computation could not run
    /// because of communication (waiting, and the planning, summing and copying around it).
    pub visible_seconds: f64,
    /// The part of `visible_seconds` spent waiting for answers.
    pub waited_seconds: f64,
    /// Distinct ids of the step's batch.
    pub unique: usize,
    /// Positions of the batch whose row no PS had (left zero).
    pub missing: usize,
    /// Rows received (distinct rows, as the PS tasks sent them).
    pub rows_received: usize,
    /// Gradient rows sent (distinct rows, duplicates summed).
    pub rows_sent: usize,
    /// Payload bytes received.
    pub bytes_received: u64,
    /// Payload bytes sent: ids of pulls, ids and gradient rows of pushes.
    pub bytes_sent: u64,
    /// Pushes in flight when the call returned (as far as the pipeline has seen answers).
    pub pushes_in_flight: usize,
    /// PS parts of the step's pull sent before the pull was called (by a prefetch).
    pub prefetched: usize,
    /// PS parts of the step's pull sent again at the pull, because more pushes had been
    /// sent since the prefetch than the staleness bound lets its rows miss.
    pub refetched: usize,
    /// The most of this worker's pushes the step's rows may miss; never above the
    /// staleness bound.
    pub may_miss: u64,
    /// PS parts of the step's pull whose rows travelled in the table's dtype although
    /// another `wire_dtype` was set: that PS did not announce `row_formats`.
    pub fallbacks: usize,
    /// Distinct rows of the step served from the row cache, not pulled (0 without one).
    pub cache_hits: usize,
    /// Distinct rows of the step the row cache could not serve (absent, or too old), so
    /// asked for (0 without a cache).
    pub cache_misses: usize,
    /// Bytes of the rows the cache held when the step's last call returned.
    pub cache_bytes: u64,
    /// Rows the cache evicted during the step's calls.
    pub cache_evictions: u64,
    /// Distinct rows of the step the cache held too old to serve, which the pull named
    /// with their versions and the PS answered unchanged: their bytes did not travel, the
    /// cache's copy was used. Counted in `cache_misses`, not in `rows_received` (0 without
    /// a cache, or from a PS that does not keep or announce row versions).
    pub rows_unchanged: usize,
}

/// A push whose part at one PS failed after the call that sent it had returned (refused
/// by the PS, timed out, or lost with its connection), as the call that reported it found
/// it (`sw_pipeline_failed_push`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct sw_push_failure {
    /// The step whose push it was (the step of the `sw_pipeline_pull` before it).
    pub step: u64,
    /// The PS, by its position in the list the pipeline was made with.
    pub shard: usize,
    /// What failed it, as a call's result (`SW_ERR_REMOTE`, `SW_ERR_TIMEOUT`,
    /// `SW_ERR_CONNECTION_LOST`, ...).
    pub result: sw_result,
    /// For `SW_ERR_REMOTE` (and `SW_ERR_REFUSED`): the wire status the PS answered with
    /// (7 `INVALID_ARGUMENT`, ... as in `docs/wire-format.md`); 0 otherwise.
    pub status: u32,
}

/// A table of embedding rows partitioned over PS tasks, seen from a worker whose steps do
/// not wait for the network when they need not: `sw_pipeline_prefetch` hands the next
/// step's ids early (their rows are requested while this step computes),
/// `sw_pipeline_pull` takes a step's rows into the caller's memory, `sw_pipeline_push`
/// sends its gradients and returns without waiting for the answers, `sw_pipeline_flush`
/// waits for everything in flight. Batches are planned as `sw_sharded` plans them
/// (duplicates removed, one rows request per PS, duplicates filled; duplicate gradients
/// summed). A step allocates nothing once the pipeline has seen its largest batch and as
/// many pushes as may be in flight.
///
/// A pipeline is bound to the client it was made with (its requests in flight are that
/// client's): every call takes that client, and refuses another. Used by one thread at a
/// time, with its client. Do not take the client's completions with `sw_client_poll` or
/// `sw_client_wait_any` while the pipeline has requests in flight (they would be lost to
/// it, and its waits fail); the client must allow `(max_pushes_in_flight + 1) * PS tasks`
/// requests in flight (`sw_client_new`'s `capacity`). Call `sw_pipeline_flush` before
/// `sw_pipeline_free`: requests left in flight keep their completions in the client.
pub struct sw_pipeline {
    _private: [u8; 0],
}

/// What a `sw_pipeline` handle is.
pub(crate) struct PipelineHandle {
    pipeline: Pipeline,
    /// The address of the client it was made with: its calls accept that client only.
    /// Compared, never followed.
    client: usize,
}

impl Castable for sw_pipeline {
    type Ownership = Boxed;
    type RustType = PipelineHandle;
}

fn settings_of(s: sw_pipeline_settings) -> Result<PipelineSettings, Failure> {
    let cache_bytes = usize::try_from(s.cache_bytes).map_err(|_| {
        Failure::invalid(format!(
            "settings.cache_bytes {} is more than this machine can address",
            s.cache_bytes
        ))
    })?;
    Ok(PipelineSettings::default()
        .staleness(s.staleness)
        .max_pushes_in_flight(s.max_pushes_in_flight)
        .timeout((s.timeout_ms > 0).then(|| Duration::from_millis(s.timeout_ms)))
        .wire_dtype((s.wire_dtype != 0).then(|| DType::from(s.wire_dtype)))
        .loss_scale(scale_of(s.loss_scale))
        .cache_bytes(cache_bytes))
}

fn default_settings() -> sw_pipeline_settings {
    let d = PipelineSettings::default();
    sw_pipeline_settings {
        staleness: d.staleness_bound(),
        max_pushes_in_flight: d.pushes_in_flight_bound(),
        timeout_ms: d
            .request_timeout()
            .map_or(0, |t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        wire_dtype: d.wire().map_or(0, u8::from),
        loss_scale: d.scale().unwrap_or(0.0),
        cache_bytes: d.cache_capacity() as u64,
    }
}

/// The default settings: staleness 1, 2 pushes in flight, requests given 60 s, rows
/// travelling in the table's dtype, no loss scale, no row cache.
#[no_mangle]
pub extern "C" fn sw_pipeline_settings_default() -> sw_pipeline_settings {
    boundary!(default_settings(), { default_settings() })
}

/// `c` as the client of pipeline handle `h`: `SW_ERR_NULL`, or `SW_ERR_INVALID_ARGUMENT`
/// for another client than the one it was made with, or for an embedded client of another
/// thread.
fn client_of<'a>(h: &PipelineHandle, c: *mut sw_client) -> Result<&'a mut ClientHandle, Failure> {
    let client = client_mut(c)?;
    if c as usize != h.client {
        return Err(Failure::invalid(
            "this pipeline was made with another client: its requests in flight are that \
             client's",
        ));
    }
    Ok(client)
}

/// Creates a pipeline of table `table` (rows of `dtype` shaped `row_dims[0..rank]`), PS
/// task `i` at `peers[i]` (`task@host:port` from `sw_resolver_peer`, whose failures then
/// name the task, or `host:port`) holding the ids `partition` gives it, run ahead as
/// `settings` say, bound to client `c` (made by `sw_client_new` or
/// `sw_client_new_embedded`; not one with a callback). On `SW_OK`, `*out` is a new handle
/// the caller frees with `sw_pipeline_free` (before the client).
///
/// Fails with `SW_ERR_INVALID_ARGUMENT` for no peers, a peer that is not an address, an
/// unknown partition kind or dtype, rows of no bytes, more than 7 row dimensions, or
/// settings out of range (the message names the field: a `wire_dtype` the table's rows do
/// not travel as, a `loss_scale` out of range or for rows other than f32, bf16 and f16, a
/// `cache_bytes` too small for one row or more than can be allocated).
///
/// # Safety
/// `c` is a live client; `peers` points at `n_peers` NUL-terminated strings; `row_dims` at
/// `rank` values (may be NULL when `rank` is 0); `out` is writable.
#[no_mangle]
pub extern "C" fn sw_pipeline_new(
    c: *mut sw_client,
    peers: *const *const c_char,
    n_peers: usize,
    partition: sw_partition,
    table: u32,
    dtype: u8,
    row_dims: *const u64,
    rank: u32,
    settings: sw_pipeline_settings,
    out: *mut *mut sw_pipeline,
) -> sw_result {
    boundary!({
        let out = try_out!(out);
        waiting_client(c)?;
        let peers = peers_of(peers, n_peers)?;
        let row_dims = row_dims_of(row_dims, rank)?;
        let pipeline = Pipeline::new(
            peers,
            partition_of(partition)?,
            table,
            DType::from(dtype),
            row_dims,
            settings_of(settings)?,
        )?;
        out.write(to_boxed(PipelineHandle {
            pipeline,
            client: c as usize,
        }));
        Ok(())
    })
}

/// Refuses a client with a callback: a pipeline waits for its own requests.
fn waiting_client(c: *mut sw_client) -> Result<(), Failure> {
    if client_mut(c)?.callback {
        return Err(Failure::invalid(
            "a pipeline waits for its requests: not for a client with a callback",
        ));
    }
    Ok(())
}

/// Creates a pipeline of the tables `shapes[0..n_tables]` (1 to 64, no table twice; as for
/// `sw_sharded_tables_new`) partitioned over the PS tasks `peers[0..n_peers]`, run ahead
/// together as `settings` say (each table gets a row cache of `cache_bytes`; the wire
/// dtype and loss scale apply to every table), bound to client `c`. A step's calls take
/// every table's batch at once (`sw_pipeline_pull_tables`, `sw_pipeline_prefetch_tables`,
/// `sw_pipeline_push_tables`), and each PS gets ONE request each way for all the tables
/// it holds rows of, not one per table; the staleness bound and `max_pushes_in_flight`
/// count a step's push as one; the report sums the tables' counts. The one-table calls
/// (`sw_pipeline_pull`, ...) refuse a pipeline of several tables. On `SW_OK`, `*out` is a
/// new handle the caller frees with `sw_pipeline_free`.
///
/// Fails with `SW_ERR_INVALID_ARGUMENT` as `sw_pipeline_new` and `sw_sharded_tables_new`
/// do, naming the table at fault.
///
/// # Safety
/// `c` is a live client; `peers` points at `n_peers` NUL-terminated strings; `shapes` at
/// `n_tables` values, each `row_dims` at `rank` values; `out` is writable.
#[no_mangle]
pub extern "C" fn sw_pipeline_new_tables(
    c: *mut sw_client,
    peers: *const *const c_char,
    n_peers: usize,
    shapes: *const sw_table_shape,
    n_tables: usize,
    settings: sw_pipeline_settings,
    out: *mut *mut sw_pipeline,
) -> sw_result {
    boundary!({
        let out = try_out!(out);
        waiting_client(c)?;
        let peers = peers_of(peers, n_peers)?;
        let shapes = table_shapes(try_slice!(shapes, n_tables))?;
        let pipeline = Pipeline::new_tables(peers, &shapes, settings_of(settings)?)?;
        out.write(to_boxed(PipelineHandle {
            pipeline,
            client: c as usize,
        }));
        Ok(())
    })
}

/// The number of tables of a pipeline (0 for NULL).
///
/// # Safety
/// `p` is NULL or a live handle.
#[no_mangle]
pub extern "C" fn sw_pipeline_tables(p: *const sw_pipeline) -> usize {
    boundary!(0, { ref_from(p).map_or(0, |h| h.pipeline.tables()) })
}

/// Releases a pipeline. NULL is ignored. Call `sw_pipeline_flush` first: requests it leaves
/// in flight keep their completions in its client.
///
/// # Safety
/// `p` is NULL or a handle from `sw_pipeline_new` not freed before.
#[no_mangle]
pub extern "C" fn sw_pipeline_free(p: *mut sw_pipeline) {
    boundary!((), { free_box(p) })
}

/// Batches of ids, one per table.
type Batches<'a> = ArrayVec<&'a [u64], MAX_TABLES>;

/// A call of a step, with its arguments.
// It lives on the stack for the call; boxing the large variants would allocate per step.
#[allow(clippy::large_enum_variant)]
enum Call<'a> {
    Prefetch(&'a [u64]),
    Pull(&'a [u64], &'a mut [u8]),
    Push(&'a [u64], &'a [u8]),
    PrefetchTables(Batches<'a>),
    PullTables(Batches<'a>, ArrayVec<&'a mut [u8], MAX_TABLES>),
    PushTables(Batches<'a>, ArrayVec<&'a [u8], MAX_TABLES>),
    PullUnique(UniqueSlices<'a>),
    Flush,
}

fn run<M: Mode>(pipe: &mut Pipeline, client: &mut Client<M>, call: Call<'_>) -> Result<(), Error> {
    match call {
        Call::Prefetch(ids) => pipe.prefetch(client, ids).map(|_| ()),
        Call::Pull(ids, out) => pipe.pull(client, ids, out).map(|_| ()),
        Call::Push(ids, grads) => pipe.push(client, ids, grads).map(|_| ()),
        Call::PrefetchTables(ids) => pipe.prefetch_tables(client, &ids).map(|_| ()),
        Call::PullTables(ids, mut outs) => pipe.pull_tables(client, &ids, &mut outs).map(|_| ()),
        Call::PushTables(ids, grads) => pipe.push_tables(client, &ids, &grads).map(|_| ()),
        Call::PullUnique(mut u) => pipe
            .pull_tables_unique(client, &u.ids, &mut u.inverse, &mut u.unique, &mut u.outs)
            .map(|_| ()),
        Call::Flush => pipe.flush(client).map(|_| ()),
    }
}

fn c_report(r: &PipelineReport) -> sw_pipeline_report {
    sw_pipeline_report {
        step: r.step,
        visible_seconds: r.visible.as_secs_f64(),
        waited_seconds: r.waited.as_secs_f64(),
        unique: r.unique,
        missing: r.missing,
        rows_received: r.rows_received,
        rows_sent: r.rows_sent,
        bytes_received: r.bytes_received,
        bytes_sent: r.bytes_sent,
        pushes_in_flight: r.pushes_in_flight,
        prefetched: r.prefetched,
        refetched: r.refetched,
        may_miss: r.may_miss,
        fallbacks: r.fallbacks,
        cache_hits: r.cache_hits,
        cache_misses: r.cache_misses,
        cache_bytes: r.cache_bytes,
        cache_evictions: r.cache_evictions,
        rows_unchanged: r.rows_unchanged,
    }
}

/// The failure of one push part: its error's code, message, status and reason, and the
/// PS's task name (from the error, else from the peer the pipeline was given).
fn push_failure(f: &PushFailure) -> Failure {
    let mut failure = Failure::from(f.error.clone());
    if failure.task.is_none() {
        failure.task = f.peer.task().map(str::to_owned);
    }
    failure
}

/// The failure of a call that returned `e`. When it reported push failures: the first
/// one's code, status, PS message, task and reason, with `e`'s message (which names every
/// failed step and PS).
fn failure_of(pipe: &Pipeline, e: Error) -> Failure {
    match pipe.failed_pushes().first() {
        None => Failure::from(e),
        Some(first) => Failure {
            msg: e.to_string(),
            ..push_failure(first)
        },
    }
}

/// One call of a step: the checks, the call, and the report written on success. `call`
/// reads the arguments, given the pipeline's number of tables.
fn step<'a>(
    p: *mut sw_pipeline,
    c: *mut sw_client,
    report: *mut sw_pipeline_report,
    call: impl FnOnce(usize) -> Result<Call<'a>, Failure>,
) -> Result<(), Failure> {
    let h = try_mut!(p, "pipeline");
    let client = client_of(h, c)?;
    let report = try_out!(report);
    let call = call(h.pipeline.tables())?;
    let pipe = &mut h.pipeline;
    match with_client!(client, |cl| run(pipe, cl, call)) {
        Ok(()) => {
            report.write(c_report(pipe.report()));
            Ok(())
        }
        Err(e) => Err(failure_of(pipe, e)),
    }
}

/// Hands the next step's batch `ids[0..n]` (duplicates allowed) early: each PS's part of
/// its pull is sent at once if the staleness bound allows, else by a later call that finds
/// the answers it waits for. Never waits for the network. The rows are taken by the next
/// `sw_pipeline_pull` of the same ids (a prefetch of another batch first replaces this
/// one). On `SW_OK`, `*report` is the step's report so far.
///
/// Fails, doing nothing else, when it finds pushes that failed since the last call:
/// `sw_pipeline_failed_pushes` lists them (see `sw_pipeline_push`); call it again to
/// prefetch.
///
/// # Safety
/// `p` and `c` (the pipeline's client) are live handles used by this thread only; `ids`
/// points at `n` values (may be NULL when `n` is 0); `report` is writable.
#[no_mangle]
pub extern "C" fn sw_pipeline_prefetch(
    p: *mut sw_pipeline,
    c: *mut sw_client,
    ids: *const u64,
    n: usize,
    report: *mut sw_pipeline_report,
) -> sw_result {
    boundary!({ step(p, c, report, |_| Ok(Call::Prefetch(try_slice!(ids, n)))) })
}

/// Takes the rows of step `ids[0..n]` (duplicates allowed) into `out`, `byte_len == n *
/// row_bytes` bytes, row `i` for `ids[i]`: the rows the last prefetch requested when `ids`
/// is its batch (waiting only for what has not arrived), else requested now. Rows no PS
/// has are left zero (`report->missing`). Starts a new step; on `SW_OK`, `*report` is its
/// report so far.
///
/// What the rows reflect: number this worker's pushes 1, 2, ... in the order of the
/// `sw_pipeline_push` calls that sent them, and let `P` be the number sent when the pull
/// returns. Every row reflects each of pushes `1..=P - s` (`s` the staleness bound); it may
/// or may not reflect the `s` most recent ones; pushes of other workers are not ordered
/// against it. With `s = 0` the rows are those `sw_sharded_pull` would give.
///
/// Fails with `SW_ERR_INVALID_ARGUMENT` for `out` of the wrong length (nothing done); with
/// the failure of pushes found failed since the last call (nothing delivered: see
/// `sw_pipeline_push`); and when a PS's part of this pull failed (the message names the
/// step and the PS; the other parts' rows may have been written, and the step does not
/// count).
///
/// # Safety
/// As `sw_pipeline_prefetch`, with `out` pointing at `byte_len` writable bytes not used by
/// anyone else during the call.
#[no_mangle]
pub extern "C" fn sw_pipeline_pull(
    p: *mut sw_pipeline,
    c: *mut sw_client,
    ids: *const u64,
    n: usize,
    out: *mut c_void,
    byte_len: u64,
    report: *mut sw_pipeline_report,
) -> sw_result {
    boundary!({
        step(p, c, report, |_| {
            let ids = try_slice!(ids, n);
            let len = usize::try_from(byte_len)
                .map_err(|_| Failure::invalid(format!("byte_len {byte_len} too large")))?;
            Ok(Call::Pull(
                ids,
                try_slice_mut!(out.cast::<u8>(), len, "out"),
            ))
        })
    })
}

/// Sends the gradient rows `grads` of `ids[0..n]` (`byte_len == n * row_bytes` bytes, row
/// `i` for `ids[i]`; f32 and f64 rows): duplicates summed (into the pipeline's own blocks:
/// `grads` may change as soon as the call returns), one request per PS, and returns
/// without waiting for the answers, unless the push `max_pushes_in_flight` before it is
/// still unanswered (then it waits for that one). On `SW_OK`, `*report` is the step's
/// report so far (the whole step, in the usual order pull, prefetch, push).
///
/// A push part that fails after its call returned (the PS refused it, it timed out, its
/// connection was lost) is not retried and never dropped: the next call of this pipeline
/// that finds it (`sw_pipeline_pull`, `_prefetch`, `_push` or `_flush`) fails with it and
/// does nothing else. That call's result, `sw_last_error_status`, `sw_last_error_remote`,
/// `sw_last_error_task` and `sw_last_error_os_error` are the first failed part's (the PS's
/// status and its task name, where known); `sw_last_error` names every failed step and PS;
/// `sw_pipeline_failed_pushes` and `sw_pipeline_failed_push` list them until the next call.
/// Call it again to do its work.
///
/// Fails with `SW_ERR_INVALID_ARGUMENT` for `grads` of the wrong length or rows other than
/// f32 and f64 (nothing sent), and for push failures found (this push not sent).
///
/// # Safety
/// As `sw_pipeline_prefetch`, with `grads` pointing at `byte_len` readable bytes.
#[no_mangle]
pub extern "C" fn sw_pipeline_push(
    p: *mut sw_pipeline,
    c: *mut sw_client,
    ids: *const u64,
    n: usize,
    grads: *const c_void,
    byte_len: u64,
    report: *mut sw_pipeline_report,
) -> sw_result {
    boundary!({
        step(p, c, report, |_| {
            let ids = try_slice!(ids, n);
            let len = usize::try_from(byte_len)
                .map_err(|_| Failure::invalid(format!("byte_len {byte_len} too large")))?;
            Ok(Call::Push(
                ids,
                try_slice!(grads.cast::<u8>(), len, "grads"),
            ))
        })
    })
}

/// The batches of a tables call: as many as the pipeline has tables, each table's ids and
/// the length of its data.
fn tables_call<'a>(
    batches: *const sw_table_batch,
    n_tables: usize,
    tables: usize,
) -> Result<
    (
        &'a [sw_table_batch],
        Batches<'a>,
        ArrayVec<usize, MAX_TABLES>,
    ),
    Failure,
> {
    let batches = try_slice!(batches, n_tables);
    one_batch_per_table(batches.len(), tables)?;
    let (ids, lens) = batch_ids(batches)?;
    Ok((batches, ids, lens))
}

/// `sw_pipeline_prefetch` of every table's next batch at once, for a pipeline of
/// `sw_pipeline_new_tables`: `batches[t]` is the `t`-th table's (its `ids` and `n`; `data`
/// is not read), `n_tables` the pipeline's number of tables. The rows are
/// taken by the next `sw_pipeline_pull_tables` of the same batches.
///
/// # Safety
/// `p` and `c` (the pipeline's client) are live handles used by this thread only;
/// `batches` points at `n_tables` values, each `ids` at `n` values; `report` is writable.
#[no_mangle]
pub extern "C" fn sw_pipeline_prefetch_tables(
    p: *mut sw_pipeline,
    c: *mut sw_client,
    batches: *const sw_table_batch,
    n_tables: usize,
    report: *mut sw_pipeline_report,
) -> sw_result {
    boundary!({
        step(p, c, report, |tables| {
            let (_, ids, _) = tables_call(batches, n_tables, tables)?;
            Ok(Call::PrefetchTables(ids))
        })
    })
}

/// `sw_pipeline_pull` of every table's batch at once: the rows of `batches[t]`'s ids go
/// into its `data` (`byte_len == n * row_bytes` of that table; a table with no ids this
/// step has `n == 0`). Each PS gets one request for the rows of all the tables it holds.
/// Fails as `sw_pipeline_pull` does, and with `SW_ERR_INVALID_ARGUMENT` for another number
/// of batches than tables (nothing done).
///
/// # Safety
/// As `sw_pipeline_prefetch_tables`, with each `data` pointing at `byte_len` writable bytes
/// not used by anyone else during the call (no two batches' overlapping).
#[no_mangle]
pub extern "C" fn sw_pipeline_pull_tables(
    p: *mut sw_pipeline,
    c: *mut sw_client,
    batches: *const sw_table_batch,
    n_tables: usize,
    report: *mut sw_pipeline_report,
) -> sw_result {
    boundary!({
        step(p, c, report, |tables| {
            let (batches, ids, lens) = tables_call(batches, n_tables, tables)?;
            Ok(Call::PullTables(ids, batch_outs(batches, &lens)?))
        })
    })
}

/// `sw_pipeline_push` of every table's gradients at once: `batches[t].data` holds the
/// gradient rows of its ids. Each PS gets one request with the summed gradients of all
/// the tables it holds; the push counts as one against `max_pushes_in_flight` and the
/// staleness bound. Fails as `sw_pipeline_push` does, and with `SW_ERR_INVALID_ARGUMENT`
/// for another number of batches than tables (nothing sent).
///
/// # Safety
/// As `sw_pipeline_prefetch_tables`, with each `data` pointing at `byte_len` readable
/// bytes.
#[no_mangle]
pub extern "C" fn sw_pipeline_push_tables(
    p: *mut sw_pipeline,
    c: *mut sw_client,
    batches: *const sw_table_batch,
    n_tables: usize,
    report: *mut sw_pipeline_report,
) -> sw_result {
    boundary!({
        step(p, c, report, |tables| {
            let (batches, ids, lens) = tables_call(batches, n_tables, tables)?;
            Ok(Call::PushTables(ids, batch_grads(batches, &lens)?))
        })
    })
}

/// `sw_pipeline_pull` of each distinct id of `ids[0..n]` once, for a caller that builds its
/// batch from the distinct rows: writes the distinct ids into `unique` (grouped by PS task,
/// each task's in the order first seen), their rows into `out` (row `j` for `unique[j]`)
/// and, for each position `i`, the index of `ids[i]` in `unique` into `inverse[i]`;
/// `*unique_len` (and `report->unique`) says how many were written. `unique` and `out`
/// have room for `n` ids and rows (`byte_len >= n * row_bytes`). A prefetch of the same
/// ids is taken, as by `sw_pipeline_pull`; the step's gradients may be pushed by the
/// distinct ids. Fails as `sw_pipeline_pull` does (buffers too short: nothing done); when
/// a PS's part failed, its rows in `out` are zero and `unique`, `inverse` and
/// `*unique_len` are left as they were.
///
/// # Safety
/// As `sw_pipeline_pull`, with `inverse` pointing at `n` writable int64 values, `unique`
/// at `n` writable uint64 values and `unique_len` writable; `ids`, `inverse`, `unique`
/// and `out` do not overlap.
#[no_mangle]
pub extern "C" fn sw_pipeline_pull_unique(
    p: *mut sw_pipeline,
    c: *mut sw_client,
    ids: *const u64,
    n: usize,
    inverse: *mut i64,
    unique: *mut u64,
    out: *mut c_void,
    byte_len: u64,
    unique_len: *mut usize,
    report: *mut sw_pipeline_report,
) -> sw_result {
    boundary!({
        let unique_len = try_out!(unique_len);
        let batch = [sw_unique_batch {
            ids,
            n,
            inverse,
            unique,
            data: out,
            byte_len,
            unique_len: 0,
        }];
        step(p, c, report, |tables| {
            one_batch_per_table(1, tables)?;
            Ok(Call::PullUnique(unique_slices(&batch)?))
        })?;
        unique_len.write(ref_from(p).map_or(0, |h| h.pipeline.unique_len(0)));
        Ok(())
    })
}

/// `sw_pipeline_pull_unique` of every table's batch at once, for a pipeline of
/// `sw_pipeline_new_tables`: for each table `t`, its distinct ids into
/// `batches[t].unique`, their rows into `batches[t].data`, each position's index among
/// them into `batches[t].inverse` and their number into `batches[t].unique_len`. One
/// request per PS for all the tables, as `sw_pipeline_pull_tables`. Fails as that does.
///
/// # Safety
/// `p` and `c` (the pipeline's client) are live handles used by this thread only;
/// `batches` points at `n_tables` writable values, each with `ids` at `n` values, `inverse`
/// at `n` writable int64 values, `unique` at `n` writable uint64 values and `data` at
/// `byte_len` writable bytes, none of them overlapping or used by anyone else during the
/// call; `report` is writable.
#[no_mangle]
pub extern "C" fn sw_pipeline_pull_tables_unique(
    p: *mut sw_pipeline,
    c: *mut sw_client,
    batches: *mut sw_unique_batch,
    n_tables: usize,
    report: *mut sw_pipeline_report,
) -> sw_result {
    boundary!({
        let batches = try_slice_mut!(batches, n_tables);
        step(p, c, report, |tables| {
            one_batch_per_table(batches.len(), tables)?;
            Ok(Call::PullUnique(unique_slices(batches)?))
        })?;
        if let Some(h) = ref_from(p) {
            for (i, b) in batches.iter_mut().enumerate() {
                b.unique_len = h.pipeline.unique_len(i);
            }
        }
        Ok(())
    })
}

/// Waits until every push sent has been answered by every PS, and every prefetched request
/// has its answer (kept for the pull of its batch): then nothing of the pipeline is in
/// flight. Fails with the push failures found (see `sw_pipeline_push`). On `SW_OK`,
/// `*report` is the step's report so far.
///
/// # Safety
/// `p` and `c` (the pipeline's client) are live handles used by this thread only; `report`
/// is writable.
#[no_mangle]
pub extern "C" fn sw_pipeline_flush(
    p: *mut sw_pipeline,
    c: *mut sw_client,
    report: *mut sw_pipeline_report,
) -> sw_result {
    boundary!({ step(p, c, report, |_| Ok(Call::Flush)) })
}

/// The report of the step in progress (what the last call of the pipeline that succeeded
/// wrote, or more).
///
/// # Safety
/// `p` is a live handle; `out` is writable.
#[no_mangle]
pub extern "C" fn sw_pipeline_current_report(
    p: *const sw_pipeline,
    out: *mut sw_pipeline_report,
) -> sw_result {
    boundary!({
        let h = try_ref!(p, "pipeline");
        try_out!(out).write(c_report(h.pipeline.report()));
        Ok(())
    })
}

/// Steps whose rows were delivered so far (0 for NULL).
///
/// # Safety
/// `p` is NULL or a live handle.
#[no_mangle]
pub extern "C" fn sw_pipeline_steps(p: *const sw_pipeline) -> u64 {
    boundary!(0, { ref_from(p).map_or(0, |h| h.pipeline.steps()) })
}

/// Pushes sent so far (0 for NULL).
///
/// # Safety
/// `p` is NULL or a live handle.
#[no_mangle]
pub extern "C" fn sw_pipeline_pushes(p: *const sw_pipeline) -> u64 {
    boundary!(0, { ref_from(p).map_or(0, |h| h.pipeline.pushes()) })
}

/// Pushes in flight: sent and not yet answered by every PS they went to, as far as the
/// pipeline's last call saw (0 for NULL).
///
/// # Safety
/// `p` is NULL or a live handle.
#[no_mangle]
pub extern "C" fn sw_pipeline_pushes_in_flight(p: *const sw_pipeline) -> usize {
    boundary!(0, {
        ref_from(p).map_or(0, |h| h.pipeline.pushes_in_flight())
    })
}

/// The number of push failures the last call of the pipeline failed with (0 when it
/// reported none, and for NULL).
///
/// # Safety
/// `p` is NULL or a live handle.
#[no_mangle]
pub extern "C" fn sw_pipeline_failed_pushes(p: *const sw_pipeline) -> usize {
    boundary!(0, {
        ref_from(p).map_or(0, |h| h.pipeline.failed_pushes().len())
    })
}

fn failed_at(h: &PipelineHandle, i: usize) -> Result<&PushFailure, Failure> {
    let failed = h.pipeline.failed_pushes();
    failed.get(i).ok_or_else(|| {
        Failure::invalid(format!(
            "push failure {i}: the last call reported {}",
            failed.len()
        ))
    })
}

/// Push failure `i` (in the order found) of those the last call failed with: its step, its
/// PS and what failed it. `SW_ERR_INVALID_ARGUMENT` when `i` is not below
/// `sw_pipeline_failed_pushes`.
///
/// # Safety
/// `p` is a live handle; `out` is writable.
#[no_mangle]
pub extern "C" fn sw_pipeline_failed_push(
    p: *const sw_pipeline,
    i: usize,
    out: *mut sw_push_failure,
) -> sw_result {
    boundary!({
        let h = try_ref!(p, "pipeline");
        let out = try_out!(out);
        let f = failed_at(h, i)?;
        let status = match f.error.kind() {
            ErrorKind::Remote(s) | ErrorKind::Refused(s) => u32::from(u16::from(s)),
            _ => 0,
        };
        out.write(sw_push_failure {
            step: f.step,
            shard: f.shard,
            result: push_failure(f).code,
            status,
        });
        Ok(())
    })
}

/// Push failure `i` of those the last call failed with, as a result: its code, with its
/// message for `sw_last_error` (naming the PS) and its status, PS message, task and
/// reason for the other `sw_last_error_*`. `SW_ERR_INVALID_ARGUMENT` when `i` is not below
/// `sw_pipeline_failed_pushes`.
///
/// # Safety
/// `p` is a live handle.
#[no_mangle]
pub extern "C" fn sw_pipeline_failed_push_error(p: *const sw_pipeline, i: usize) -> sw_result {
    boundary!({
        let h = try_ref!(p, "pipeline");
        Err::<(), _>(push_failure(failed_at(h, i)?))
    })
}
