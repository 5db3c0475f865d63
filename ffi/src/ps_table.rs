//! `sw_ps_table`: starwire's PS table (`PsTable`): made from a `sw_ps_table_config`, or
//! loaded from a checkpoint; served through its `sw_table` view (`sw_ps_table_as_table`)
//! like any table; saved, measured, maintained, and loaded and exported by id.

use std::ffi::c_char;
use std::path::Path;
use std::sync::Arc;

use starwire::rows::ps::{checkpoint_file, CheckpointError, CheckpointErrorKind, RowsError};
use starwire::rows::PsTable;
use starwire::Table;

use crate::boundary::boundary;
use crate::cast::{free_box, lend, ref_from, to_boxed, to_c_string, Boxed, Castable};
use crate::cast::{try_out, try_out_slice, try_ref, try_slice, try_slice_mut, try_str};
use crate::ps_config::{builder_of, sw_ps_table_config};
use crate::result::sw_result::{self, *};
use crate::result::{c_string, Failure};
use crate::table::sw_table;

/// starwire's PS table: rows and their optimizer state in one slot of a huge-page arena, a
/// lock-free index, no lock and no allocation on the pull and push path. Shared: a runtime
/// serving it keeps its own reference, and freeing the handle drops one.
pub struct sw_ps_table {
    _private: [u8; 0],
}

/// What a `sw_ps_table` handle is: the table, and the same table as a `sw_table` to serve.
pub(crate) struct PsTableHandle {
    ps: Arc<PsTable>,
    table: Arc<dyn Table>,
}

impl Castable for sw_ps_table {
    type Ownership = Boxed;
    type RustType = PsTableHandle;
}

fn handle_of(table: PsTable) -> *mut sw_ps_table {
    let ps = Arc::new(table);
    let table = ps.clone() as Arc<dyn Table>;
    to_boxed(PsTableHandle { ps, table })
}

/// A checkpoint error as C sees it: a code per kind, and its message (which names the file).
fn checkpoint_failure(e: CheckpointError) -> Failure {
    let code = match e.kind() {
        CheckpointErrorKind::Io { .. } => SW_ERR_CHECKPOINT_IO,
        CheckpointErrorKind::NotACheckpoint => SW_ERR_NOT_A_CHECKPOINT,
        CheckpointErrorKind::Version { .. } => SW_ERR_CHECKPOINT_VERSION,
        CheckpointErrorKind::Truncated { .. } => SW_ERR_CHECKPOINT_TRUNCATED,
        CheckpointErrorKind::Corrupted { .. } => SW_ERR_CHECKPOINT_CORRUPTED,
        CheckpointErrorKind::Shape { .. } => SW_ERR_CHECKPOINT_SHAPE,
        _ => SW_ERR_CHECKPOINT_TABLE,
    };
    Failure::new(code, e.to_string())
}

/// Creates an empty PS table with the settings of `config` (see `sw_ps_table_config`;
/// start from `sw_ps_table_config_default`). Serve it by giving `sw_ps_table_as_table(t)`
/// to `sw_runtime_options.tables`, under `config->table_id`. On `SW_OK`, `*out` is a new
/// handle the caller frees with `sw_ps_table_free`.
///
/// Fails with `SW_ERR_INVALID_ARGUMENT` naming a setting out of range, or the memory that
/// could not be reserved.
///
/// # Safety
/// `config` points at a config; `out` is writable.
#[no_mangle]
pub extern "C" fn sw_ps_table_new(
    config: *const sw_ps_table_config,
    out: *mut *mut sw_ps_table,
) -> sw_result {
    boundary!({
        let config = try_ref!(config);
        let out = try_out!(out);
        let table = builder_of(config)?
            .build()
            .map_err(|e| Failure::invalid(e.to_string()))?;
        out.write(handle_of(table));
        Ok(())
    })
}

/// Creates a PS table with the settings of `config` holding the rows of its checkpoint in
/// folder `dir` (the file `sw_checkpoint_file` names for `config->table_id`, written by
/// `sw_ps_table_save`), and the table's clock. Optimizer parameters (learning rate, ...)
/// are `config`'s; the file's shape (table id, `dim`, stored format, optimizer state) must
/// be. On `SW_OK`, `*out` is a new handle the caller frees with `sw_ps_table_free`.
///
/// Fails, having built no table, with `SW_ERR_INVALID_ARGUMENT` for a setting out of range,
/// or with a checkpoint code: `SW_ERR_CHECKPOINT_IO` (the file cannot be opened or read;
/// a missing file too), `SW_ERR_NOT_A_CHECKPOINT`, `SW_ERR_CHECKPOINT_VERSION`,
/// `SW_ERR_CHECKPOINT_TRUNCATED`, `SW_ERR_CHECKPOINT_CORRUPTED`, `SW_ERR_CHECKPOINT_SHAPE`
/// or `SW_ERR_CHECKPOINT_TABLE` (a row cap below the file's rows); the message names the
/// file and what is wrong.
///
/// # Safety
/// `config` points at a config; `dir` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub extern "C" fn sw_ps_table_load(
    config: *const sw_ps_table_config,
    dir: *const c_char,
    out: *mut *mut sw_ps_table,
) -> sw_result {
    boundary!({
        let config = try_ref!(config);
        let dir = try_str!(dir);
        let out = try_out!(out);
        let table = builder_of(config)?.load(dir).map_err(checkpoint_failure)?;
        out.write(handle_of(table));
        Ok(())
    })
}

/// Releases a PS table handle (a runtime serving the table keeps serving it). NULL is
/// ignored.
///
/// # Safety
/// `t` is NULL or a handle from `sw_ps_table_new` or `sw_ps_table_load` not freed before.
#[no_mangle]
pub extern "C" fn sw_ps_table_free(t: *mut sw_ps_table) {
    boundary!((), { free_box(t) })
}

/// The table as a `sw_table`, for `sw_runtime_options.tables` (the runtime keeps its own
/// reference to the table). The pointer is `t`'s: valid until `t` is freed, and not to be
/// freed itself. NULL for NULL.
///
/// # Safety
/// `t` is NULL or a live PS table.
#[no_mangle]
pub extern "C" fn sw_ps_table_as_table(t: *const sw_ps_table) -> *const sw_table {
    boundary!(std::ptr::null(), {
        ref_from(t).map_or(std::ptr::null(), |h| lend::<sw_table>(&h.table))
    })
}

/// The table's number (0 for NULL).
///
/// # Safety
/// `t` is NULL or a live PS table.
#[no_mangle]
pub extern "C" fn sw_ps_table_id(t: *const sw_ps_table) -> u32 {
    boundary!(0, { ref_from(t).map_or(0, |h| h.ps.table_id()) })
}

/// Elements per row (0 for NULL).
///
/// # Safety
/// `t` is NULL or a live PS table.
#[no_mangle]
pub extern "C" fn sw_ps_table_dim(t: *const sw_ps_table) -> usize {
    boundary!(0, { ref_from(t).map_or(0, |h| h.ps.dim()) })
}

/// Float32 values of optimizer state per row (0 for SGD, `dim` for Adagrad, `2 + 2 *
/// dim` for Adam; 0 for NULL): the `state` of `sw_ps_table_load_rows` and
/// `sw_ps_table_export_rows` holds this many per row.
///
/// # Safety
/// `t` is NULL or a live PS table.
#[no_mangle]
pub extern "C" fn sw_ps_table_state_len(t: *const sw_ps_table) -> usize {
    boundary!(0, { ref_from(t).map_or(0, |h| h.ps.state_len()) })
}

/// Rows stored now (0 for NULL).
///
/// # Safety
/// `t` is NULL or a live PS table.
#[no_mangle]
pub extern "C" fn sw_ps_table_len(t: *const sw_ps_table) -> u64 {
    boundary!(0, { ref_from(t).map_or(0, |h| h.ps.len()) })
}

/// The table's clock: the ticks `evict_untouched` counts (0 for NULL).
///
/// # Safety
/// `t` is NULL or a live PS table.
#[no_mangle]
pub extern "C" fn sw_ps_table_clock(t: *const sw_ps_table) -> u64 {
    boundary!(0, { ref_from(t).map_or(0, |h| h.ps.clock()) })
}

/// Advances the table's clock by one tick (per training step, per minute: the caller's
/// choice) and returns the new value (0 for NULL, which does nothing). A row pulled or
/// pushed is stamped with the clock; `sw_ps_table_maintain` evicts the rows untouched for
/// `evict_untouched` ticks.
///
/// # Safety
/// `t` is NULL or a live PS table.
#[no_mangle]
pub extern "C" fn sw_ps_table_advance_clock(t: *const sw_ps_table) -> u64 {
    boundary!(0, { ref_from(t).map_or(0, |h| h.ps.advance_clock()) })
}

/// Writes to `out` the NUL-terminated file name of table `table_id`'s checkpoint in a
/// checkpoint folder (`table-<id>.swrows`). `out` has room for `capacity` bytes (32
/// always suffice). Fails with `SW_ERR_INVALID_ARGUMENT` when `capacity` is too small.
///
/// # Safety
/// `out` has room for `capacity` bytes.
#[no_mangle]
pub extern "C" fn sw_checkpoint_file(
    table_id: u32,
    out: *mut c_char,
    capacity: usize,
) -> sw_result {
    boundary!({
        let out = try_out_slice!(out, capacity);
        let name = checkpoint_file(table_id);
        if name.len() >= capacity {
            return Err(Failure::invalid(format!(
                "{name} needs {} bytes and out has {capacity}",
                name.len() + 1
            )));
        }
        for (o, b) in out.iter_mut().zip(name.bytes().chain([0])) {
            o.write(b as c_char);
        }
        Ok(())
    })
}

/// What `sw_ps_table_save` wrote, and how long it took.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct sw_save_report {
    /// Rows saved.
    pub rows: u64,
    /// Bytes of the file.
    pub bytes: u64,
    /// Seconds from start to the file in place.
    pub seconds: f64,
    /// Of which in write calls.
    pub writing_seconds: f64,
    /// Of which waiting for the disk (`fsync`).
    pub syncing_seconds: f64,
    /// Whether rows went to the disk around the page cache (`O_DIRECT`).
    pub direct_io: bool,
}

/// Saves the table into folder `dir` (created if missing) as the file
/// `sw_checkpoint_file` names for its id, atomically (written aside, flushed, renamed
/// into place: a reader sees the old file or the new one whole), while the table goes on
/// serving (a fuzzy snapshot: rows pushed meanwhile may be saved before or after). On
/// `SW_OK`, `*out` says what was written. Fails with `SW_ERR_CHECKPOINT_IO` naming the file
/// and the step that failed; no file is then left in place of the checkpoint.
///
/// # Safety
/// `t` is a live PS table; `dir` a NUL-terminated string; `out` writable.
#[no_mangle]
pub extern "C" fn sw_ps_table_save(
    t: *const sw_ps_table,
    dir: *const c_char,
    out: *mut sw_save_report,
) -> sw_result {
    boundary!({
        let t = try_ref!(t, "table");
        let dir = try_str!(dir);
        let out = try_out!(out);
        let r = t.ps.save(Path::new(dir)).map_err(checkpoint_failure)?;
        out.write(sw_save_report {
            rows: r.rows,
            bytes: r.bytes,
            seconds: r.elapsed.as_secs_f64(),
            writing_seconds: r.writing.as_secs_f64(),
            syncing_seconds: r.syncing.as_secs_f64(),
            direct_io: r.direct_io,
        });
        Ok(())
    })
}

/// Writes to `*out` one line saying how the table is laid out and what it got from the
/// kernel (`table 1: 16 x F32 (served F32), adagrad; slot 136 B ...; huge pages: advised
/// (THP mode madvise)`), for a PS's start-up report. The caller frees it with
/// `sw_string_free`.
///
/// # Safety
/// `t` is a live PS table; `out` writable.
#[no_mangle]
pub extern "C" fn sw_ps_table_report(t: *const sw_ps_table, out: *mut *mut c_char) -> sw_result {
    boundary!({
        let t = try_ref!(t, "table");
        let out = try_out!(out);
        out.write(to_c_string(c_string(&t.ps.report().to_string())));
        Ok(())
    })
}

/// A table's counters and state at one moment. Counters count from the table's creation;
/// `rows`, the bytes and `clock` are the state when read.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct sw_table_metrics {
    /// Rows stored.
    pub rows: u64,
    /// Bytes of the rows and their optimizer state.
    pub data_bytes: u64,
    /// Bytes of memory the table uses: slots handed out, index levels in use, fixed parts.
    pub memory_bytes: u64,
    /// Bytes of memory committed (what `memory_bytes` counts, slots committed ahead, index
    /// memory not given back yet).
    pub committed_bytes: u64,
    /// Entries of the index level in use.
    pub index_capacity: u64,
    /// Pull calls.
    pub pulls: u64,
    /// Push calls.
    pub pushes: u64,
    /// Rows pulled.
    pub pulled_rows: u64,
    /// Rows pulled that the table does not have (answered missing).
    pub missing: u64,
    /// Rows pushed (applied or dropped).
    pub pushed_rows: u64,
    /// Pushed rows dropped: their row does not exist and was not created.
    pub dropped_pushes: u64,
    /// Rows created by pulls and pushes.
    pub created: u64,
    /// Rows written by bulk loads and checkpoint loads.
    pub loaded: u64,
    /// Sightings of ids not admitted yet.
    pub not_admitted: u64,
    /// Rows not created because the table was full (row cap, or memory).
    pub refused: u64,
    /// Rows evicted as untouched for `evict_untouched` ticks.
    pub evicted_untouched: u64,
    /// Rows evicted to bring the table under its row cap.
    pub evicted_over_cap: u64,
    /// Index levels built (growths, and rebuilds that clear evicted entries).
    pub index_builds: u64,
    /// The table's clock.
    pub clock: u64,
    /// One row in this many is sampled for the hottest ids (0: off).
    pub hot_sample_every: u32,
}

/// An id among the hottest of a table, and how often it was sampled (roughly its pulls and
/// pushes over `hot_sample_every`, since the counts last halved in `sw_ps_table_maintain`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct sw_hot_id {
    /// The row's id.
    pub id: u64,
    /// Times it was sampled.
    pub sampled: u64,
}

/// Writes the table's counters and state to `*out`, and its hottest ids sampled, hottest
/// first, to `hot` (room for `hot_capacity`; NULL when 0), their number to `*n_hot` (fewer
/// when fewer were sampled; 0 with sampling off).
///
/// # Safety
/// `t` is a live PS table; `out` and `n_hot` writable; `hot` NULL or room for
/// `hot_capacity` entries.
#[no_mangle]
pub extern "C" fn sw_ps_table_metrics(
    t: *const sw_ps_table,
    out: *mut sw_table_metrics,
    hot: *mut sw_hot_id,
    hot_capacity: usize,
    n_hot: *mut usize,
) -> sw_result {
    boundary!({
        let t = try_ref!(t, "table");
        let out = try_out!(out);
        let n_hot = try_out!(n_hot);
        let ids = if hot_capacity > 0 {
            let room = try_out_slice!(hot, hot_capacity);
            let ids = t.ps.hot_ids(hot_capacity);
            for (slot, h) in room.iter_mut().zip(&ids) {
                slot.write(sw_hot_id {
                    id: h.id,
                    sampled: h.sampled,
                });
            }
            ids.len()
        } else {
            0
        };
        let m = t.ps.metrics();
        out.write(sw_table_metrics {
            rows: m.rows,
            data_bytes: m.data_bytes,
            memory_bytes: m.memory_bytes,
            committed_bytes: m.committed_bytes,
            index_capacity: m.index_capacity,
            pulls: m.pulls,
            pushes: m.pushes,
            pulled_rows: m.pulled_rows,
            missing: m.missing,
            pushed_rows: m.pushed_rows,
            dropped_pushes: m.dropped_pushes,
            created: m.created,
            loaded: m.loaded,
            not_admitted: m.not_admitted,
            refused: m.refused,
            evicted_untouched: m.evicted_untouched,
            evicted_over_cap: m.evicted_over_cap,
            index_builds: m.index_builds,
            clock: m.clock,
            hot_sample_every: m.hot_sample_every,
        });
        n_hot.write(ids);
        Ok(())
    })
}

/// What one `sw_ps_table_maintain` did.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct sw_maintain_report {
    /// Index housekeeping steps run.
    pub index_steps: u64,
    /// Slots of evicted rows made reusable.
    pub slots_reused: u64,
    /// Slots of evicted rows still waiting for calls that may see them to end.
    pub slots_waiting: u64,
    /// Rows evicted as untouched for `evict_untouched` ticks.
    pub evicted_untouched: u64,
    /// Rows evicted to bring the table under its row cap.
    pub evicted_over_cap: u64,
}

/// Upkeep off the row path, while loops serve the table: finishes index work under way,
/// makes the slots of evicted rows reusable once no call can see them, evicts rows
/// untouched for `evict_untouched` ticks and, over 95 % of the row cap, the least recently
/// touched down to 90 %; halves the hot-id counts. A runtime serving the table runs it on a
/// thread of its own every `STARWIRE_TABLE_UPKEEP_MS` (1 s by default); call it for a table
/// no runtime serves, or to see what a pass does. Concurrent calls take turns. On `SW_OK`,
/// `*out` says what it did.
///
/// # Safety
/// `t` is a live PS table; `out` writable.
#[no_mangle]
pub extern "C" fn sw_ps_table_maintain(
    t: *const sw_ps_table,
    out: *mut sw_maintain_report,
) -> sw_result {
    boundary!({
        let t = try_ref!(t, "table");
        let out = try_out!(out);
        let r = t.ps.maintain();
        out.write(sw_maintain_report {
            index_steps: r.index_steps,
            slots_reused: r.slots_reused,
            slots_waiting: r.slots_waiting,
            evicted_untouched: r.evicted_untouched,
            evicted_over_cap: r.evicted_over_cap,
        });
        Ok(())
    })
}

/// What `sw_ps_table_load_rows` did.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct sw_load_report {
    /// Rows created.
    pub created: u64,
    /// Rows that existed and were overwritten.
    pub overwritten: u64,
}

fn rows_failure(e: RowsError) -> Failure {
    match e {
        RowsError::Refused { .. } => Failure::new(SW_ERR_TABLE_FULL, e.to_string()),
        e => Failure::invalid(e.to_string()),
    }
}

/// Writes rows by id: row `i` of `values` (`dim` float32 each, `values_len == n * dim`)
/// becomes the row of `ids[i]`, created if absent (whatever `create` and `admit_after`
/// say) or overwritten; values are converted to the stored format. With `state`
/// (`state_len == n * sw_ps_table_state_len(t)` float32) the optimizer state is set too;
/// without (NULL, 0), a created row gets the initial state and an existing row keeps its
/// own. Safe while loops serve the table. On `SW_OK`, `*out` counts what was created and
/// overwritten.
///
/// Fails with `SW_ERR_INVALID_ARGUMENT` for a length that does not fit (nothing written),
/// or `SW_ERR_TABLE_FULL` when the table refused a new row (its row cap, or memory): the
/// rows before it were written, as the message says.
///
/// # Safety
/// `t` is a live PS table; `ids` holds `n` ids, `values` `values_len` floats, `state`
/// `state_len` floats (NULL when 0); `out` writable.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn sw_ps_table_load_rows(
    t: *const sw_ps_table,
    ids: *const u64,
    n: usize,
    values: *const f32,
    values_len: usize,
    state: *const f32,
    state_len: usize,
    out: *mut sw_load_report,
) -> sw_result {
    boundary!({
        let t = try_ref!(t, "table");
        let ids = try_slice!(ids, n);
        let values = try_slice!(values, values_len);
        let state = if state_len == 0 && state.is_null() {
            None
        } else {
            Some(try_slice!(state, state_len))
        };
        let out = try_out!(out);
        let r = t.ps.load_rows(ids, values, state).map_err(rows_failure)?;
        out.write(sw_load_report {
            created: r.created,
            overwritten: r.overwritten,
        });
        Ok(())
    })
}

/// Reads rows by id, creating nothing: row `i` of `values` (`dim` float32 each,
/// `values_len == n * dim`) gets the row of `ids[i]` as float32, and with `state`
/// (`state_len == n * sw_ps_table_state_len(t)`; NULL and 0 for none) its optimizer
/// state. An id without a row reads as zeros and its position goes to `missing` (room for
/// `n`), their number to `*n_missing`. Safe while loops serve the table.
///
/// Fails with `SW_ERR_INVALID_ARGUMENT` for a length that does not fit.
///
/// # Safety
/// `t` is a live PS table; `ids` holds `n` ids; `values` room for `values_len` floats,
/// `state` for `state_len` (NULL when 0), `missing` for `n` positions (NULL when `n` is
/// 0); `n_missing` writable.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn sw_ps_table_export_rows(
    t: *const sw_ps_table,
    ids: *const u64,
    n: usize,
    values: *mut f32,
    values_len: usize,
    state: *mut f32,
    state_len: usize,
    missing: *mut u32,
    n_missing: *mut usize,
) -> sw_result {
    boundary!({
        let t = try_ref!(t, "table");
        let ids = try_slice!(ids, n);
        let values = try_slice_mut!(values, values_len);
        let state = if state_len == 0 && state.is_null() {
            None
        } else {
            Some(try_slice_mut!(state, state_len))
        };
        let n_missing = try_out!(n_missing);
        let mut gone = Vec::new();
        if n > 0 {
            let room = try_out_slice!(missing, n);
            t.ps.export_rows(ids, values, state, &mut gone)
                .map_err(rows_failure)?;
            for (slot, &i) in room.iter_mut().zip(&gone) {
                slot.write(i);
            }
        } else {
            t.ps.export_rows(ids, values, state, &mut gone)
                .map_err(rows_failure)?;
        }
        n_missing.write(gone.len());
        Ok(())
    })
}
