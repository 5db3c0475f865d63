//! Several tables partitioned over the same PS tasks, over the C ABI: a step's batches of
//! all the tables pulled (or pushed) with one rows request per PS.

use std::ffi::{c_char, c_void};

use arrayvec::ArrayVec;
use starwire::rows::{ShardedTables, TableShape, MAX_TABLES};
use starwire::DType;

use crate::boundary::boundary;
use crate::cast::{free_box, ref_from, to_boxed, try_mut, try_out, try_ref, try_slice};
use crate::cast::{try_slice_mut, Boxed, Castable};
use crate::client::{deadline, stepping_client, sw_client, with_client};
use crate::result::{sw_result, Failure};
use crate::sharded::{partition_of, peers_of, row_dims_of, scale_of, sw_partition};
use crate::sharded::{sw_step_report, Failures};

/// One table of a `sw_sharded_tables`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sw_table_shape {
    /// The table, as the PS tasks number their tables.
    pub table: u32,
    /// Element type of the rows (wire dtype code, as for `sw_tensor_new`).
    pub dtype: u8,
    /// Shape of one row, `rank` values; may be NULL when `rank` is 0.
    pub row_dims: *const u64,
    /// Dimensions of one row, at most 7.
    pub rank: u32,
    /// How the table's ids are spread over the PS tasks.
    pub partition: sw_partition,
}

/// One table's part of a step of a `sw_sharded_tables`: its ids and its rows.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sw_table_batch {
    /// The ids (duplicates allowed); may be NULL when `n` is 0.
    pub ids: *const u64,
    /// Number of ids (0: the table takes no part in the step).
    pub n: usize,
    /// The rows, row `i` for `ids[i]`: a pull writes them here, a push reads the gradient
    /// rows from here. May be NULL when `n` is 0.
    pub data: *mut c_void,
    /// Bytes at `data`: exactly `n * row_bytes`.
    pub byte_len: u64,
}

/// One table's part of a unique pull (`sw_sharded_tables_pull_unique`): its batch of ids
/// in, its distinct ids, their rows and each position's index among them out.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sw_unique_batch {
    /// The ids (duplicates allowed); may be NULL when `n` is 0.
    pub ids: *const u64,
    /// Number of ids (0: the table takes no part in the step).
    pub n: usize,
    /// Room for `n` int64 values: for each position `i`, the index of `ids[i]` in
    /// `unique`.
    pub inverse: *mut i64,
    /// Room for `n` ids: the distinct ids (grouped by PS task, each task's in the order
    /// first seen), `unique_len` of them.
    pub unique: *mut u64,
    /// Room for `n` rows (`byte_len >= n * row_bytes`): row `j` for `unique[j]`.
    pub data: *mut c_void,
    /// Bytes at `data`.
    pub byte_len: u64,
    /// Written by the call: the number of distinct ids.
    pub unique_len: usize,
}

/// Several tables of embedding rows partitioned over the same PS tasks, seen from a
/// worker: a step takes a batch of ids per table, deduplicates and partitions each as
/// `sw_sharded` does, and sends each PS ONE rows request carrying every table's ids it
/// holds (all PS requests in flight at once), so a step over `T` tables and `P` PS tasks
/// is at most `P` requests each way, not `T * P`. A push sums each table's duplicate
/// gradients (f32 and f64 rows) and sends each PS one request likewise. Used by one
/// thread at a time.
pub struct sw_sharded_tables {
    _private: [u8; 0],
}

/// What a `sw_sharded_tables` handle is.
pub(crate) struct ShardedTablesHandle {
    tables: ShardedTables,
    /// The last step's outcome per PS.
    parts: Failures,
}

impl Castable for sw_sharded_tables {
    type Ownership = Boxed;
    type RustType = ShardedTablesHandle;
}

/// Creates the tables `shapes[0..n_tables]` (1 to 64, no table twice) partitioned over
/// the PS tasks `peers[0..n_peers]` (`task@host:port` or `host:port`, as for
/// `sw_sharded_new`). On `SW_OK`, `*out` is a new handle the caller frees with
/// `sw_sharded_tables_free`.
///
/// Fails with `SW_ERR_INVALID_ARGUMENT` for no peers, a peer that is not an address, no
/// tables or more than 64, a table named twice, an unknown partition kind or dtype, rows
/// of no bytes, or more than 7 row dimensions.
///
/// # Safety
/// `peers` points at `n_peers` NUL-terminated strings; `shapes` at `n_tables` values, each
/// `row_dims` at `rank` values; `out` is writable.
#[no_mangle]
pub extern "C" fn sw_sharded_tables_new(
    peers: *const *const c_char,
    n_peers: usize,
    shapes: *const sw_table_shape,
    n_tables: usize,
    out: *mut *mut sw_sharded_tables,
) -> sw_result {
    boundary!({
        let out = try_out!(out);
        let peers = peers_of(peers, n_peers)?;
        let shapes = table_shapes(try_slice!(shapes, n_tables))?;
        let tables = ShardedTables::new(peers, &shapes)?;
        out.write(to_boxed(ShardedTablesHandle {
            tables,
            parts: Failures::default(),
        }));
        Ok(())
    })
}

/// The tables `given` describes (at most [`MAX_TABLES`]).
pub(crate) fn table_shapes<'a>(
    given: &[sw_table_shape],
) -> Result<ArrayVec<TableShape<'a>, MAX_TABLES>, Failure> {
    if given.len() > MAX_TABLES {
        return Err(Failure::invalid(format!(
            "{} tables; at most {MAX_TABLES}",
            given.len()
        )));
    }
    let mut shapes = ArrayVec::new();
    for s in given {
        shapes.push(TableShape {
            table: s.table,
            dtype: DType::from(s.dtype),
            row_dims: row_dims_of(s.row_dims, s.rank)?,
            partition: partition_of(s.partition)?,
        });
    }
    Ok(shapes)
}

/// Releases the tables. NULL is ignored.
///
/// # Safety
/// `s` is NULL or a handle from `sw_sharded_tables_new` not freed before.
#[no_mangle]
pub extern "C" fn sw_sharded_tables_free(s: *mut sw_sharded_tables) {
    boundary!((), { free_box(s) })
}

/// Every table's rows travel as `dtype` from the next step on, as
/// `sw_sharded_set_wire_dtype` says. `SW_ERR_INVALID_ARGUMENT`, changing nothing, when a
/// table's rows do not travel as `dtype` (naming the table).
///
/// # Safety
/// `s` is a live handle used by this thread only.
#[no_mangle]
pub extern "C" fn sw_sharded_tables_set_wire_dtype(
    s: *mut sw_sharded_tables,
    dtype: u8,
) -> sw_result {
    boundary!({
        let s = try_mut!(s, "sharded tables");
        Ok(s.tables.set_wire_dtype(DType::from(dtype))?)
    })
}

/// Pushes of every table from the next one on are sent with the loss scale `scale` (0:
/// none), as `sw_sharded_set_loss_scale` says. `SW_ERR_INVALID_ARGUMENT`, changing
/// nothing, for a scale out of range or a table of rows other than f32, bf16 and f16.
///
/// # Safety
/// `s` is a live handle used by this thread only.
#[no_mangle]
pub extern "C" fn sw_sharded_tables_set_loss_scale(
    s: *mut sw_sharded_tables,
    scale: f32,
) -> sw_result {
    boundary!({
        let s = try_mut!(s, "sharded tables");
        Ok(s.tables.set_loss_scale(scale_of(scale))?)
    })
}

/// Number of tables (0 for NULL).
///
/// # Safety
/// `s` is NULL or a live handle.
#[no_mangle]
pub extern "C" fn sw_sharded_tables_len(s: *const sw_sharded_tables) -> usize {
    boundary!(0, { ref_from(s).map_or(0, |h| h.tables.len()) })
}

/// Which way a step goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    Pull,
    Push,
}

/// Refuses another number of batches than tables.
pub(crate) fn one_batch_per_table(batches: usize, tables: usize) -> Result<(), Failure> {
    if batches != tables {
        return Err(Failure::invalid(format!(
            "{batches} batches for {tables} tables"
        )));
    }
    Ok(())
}

/// The arrays of unique batches, one per table.
pub(crate) struct UniqueSlices<'a> {
    pub ids: ArrayVec<&'a [u64], MAX_TABLES>,
    pub inverse: ArrayVec<&'a mut [i64], MAX_TABLES>,
    pub unique: ArrayVec<&'a mut [u64], MAX_TABLES>,
    pub outs: ArrayVec<&'a mut [u8], MAX_TABLES>,
}

/// Each unique batch's arrays, checked not NULL (at most [`MAX_TABLES`] batches: checked
/// by the caller).
pub(crate) fn unique_slices<'a>(batches: &[sw_unique_batch]) -> Result<UniqueSlices<'a>, Failure> {
    let mut s = UniqueSlices {
        ids: ArrayVec::new(),
        inverse: ArrayVec::new(),
        unique: ArrayVec::new(),
        outs: ArrayVec::new(),
    };
    for (i, b) in batches.iter().enumerate() {
        s.ids
            .push(try_slice!(b.ids, b.n, format!("batches[{i}].ids")));
        s.inverse.push(try_slice_mut!(
            b.inverse,
            b.n,
            format!("batches[{i}].inverse")
        ));
        s.unique.push(try_slice_mut!(
            b.unique,
            b.n,
            format!("batches[{i}].unique")
        ));
        let len = usize::try_from(b.byte_len).map_err(|_| {
            Failure::invalid(format!("batches[{i}].byte_len {} too large", b.byte_len))
        })?;
        s.outs.push(try_slice_mut!(
            b.data.cast::<u8>(),
            len,
            format!("batches[{i}].data")
        ));
    }
    Ok(s)
}

/// Each batch's ids, and the length of its data (checked to fit memory). The caller has
/// checked that there are at most [`MAX_TABLES`] batches.
pub(crate) fn batch_ids<'a>(
    batches: &[sw_table_batch],
) -> Result<(ArrayVec<&'a [u64], MAX_TABLES>, ArrayVec<usize, MAX_TABLES>), Failure> {
    let mut ids = ArrayVec::new();
    let mut lens = ArrayVec::new();
    for (i, b) in batches.iter().enumerate() {
        ids.push(try_slice!(b.ids, b.n, format!("batches[{i}].ids")));
        lens.push(usize::try_from(b.byte_len).map_err(|_| {
            Failure::invalid(format!("batches[{i}].byte_len {} too large", b.byte_len))
        })?);
    }
    Ok((ids, lens))
}

/// Each batch's data, `lens[i]` writable bytes, for the rows of a pull.
pub(crate) fn batch_outs<'a>(
    batches: &[sw_table_batch],
    lens: &[usize],
) -> Result<ArrayVec<&'a mut [u8], MAX_TABLES>, Failure> {
    let mut outs = ArrayVec::new();
    for (i, b) in batches.iter().enumerate() {
        outs.push(try_slice_mut!(
            b.data.cast::<u8>(),
            lens[i],
            format!("batches[{i}].data")
        ));
    }
    Ok(outs)
}

/// Each batch's data, `lens[i]` readable bytes, for the gradients of a push.
pub(crate) fn batch_grads<'a>(
    batches: &[sw_table_batch],
    lens: &[usize],
) -> Result<ArrayVec<&'a [u8], MAX_TABLES>, Failure> {
    let mut grads = ArrayVec::new();
    for (i, b) in batches.iter().enumerate() {
        grads.push(try_slice!(
            b.data.cast::<u8>().cast_const(),
            lens[i],
            format!("batches[{i}].data")
        ));
    }
    Ok(grads)
}

/// One step: checks, runs, keeps the parts' outcomes and writes the report.
fn step(
    s: *mut sw_sharded_tables,
    c: *mut sw_client,
    batches: *const sw_table_batch,
    n_tables: usize,
    way: Way,
    timeout_ms: u64,
    report: *mut sw_step_report,
) -> Result<(), Failure> {
    let s = try_mut!(s, "sharded tables");
    let client = stepping_client(c)?;
    let report = try_out!(report);
    let batches = try_slice!(batches, n_tables);
    one_batch_per_table(batches.len(), s.tables.len())?;
    let (ids, lens) = batch_ids(batches)?;
    let deadline = deadline(timeout_ms);
    let done = if way == Way::Pull {
        let mut outs = batch_outs(batches, &lens)?;
        with_client!(client, |h| s.tables.pull(h, &ids, &mut outs, deadline))?
    } else {
        let grads = batch_grads(batches, &lens)?;
        with_client!(client, |h| s.tables.push(h, &ids, &grads, deadline))?
    };
    s.parts.settle(done, report)
}

/// Pulls the rows of each table's batch `batches[t]` (in the order the tables were given;
/// `n_tables` of them) into its `data`: one rows request per PS that holds any of the ids,
/// all in flight at once, waited for through `c` (a client made by `sw_client_new`). Rows
/// a PS does not have are left zero and counted in `report->missing` (over all tables);
/// `report->fallbacks` counts the tables' blocks that came back in the table's dtype
/// although another wire dtype was set.
///
/// A PS that fails fails its part alone (every table's rows at that PS): the rows of the
/// others are written. The result, `*report` and `sw_sharded_tables_part` as for
/// `sw_sharded_pull`. Arguments that are not valid (another number of batches than
/// tables, a `byte_len` other than `n * row_bytes`) fail the call before anything is sent
/// (`SW_ERR_INVALID_ARGUMENT`, `SW_ERR_NULL`), `*report` untouched.
///
/// # Safety
/// `s`, `c` are live handles used by this thread only; `batches` points at `n_tables`
/// values, each `ids` at `n` values and `data` at `byte_len` writable bytes not used by
/// anyone else during the call; `report` is writable.
#[no_mangle]
pub extern "C" fn sw_sharded_tables_pull(
    s: *mut sw_sharded_tables,
    c: *mut sw_client,
    batches: *const sw_table_batch,
    n_tables: usize,
    timeout_ms: u64,
    report: *mut sw_step_report,
) -> sw_result {
    boundary!({ step(s, c, batches, n_tables, Way::Pull, timeout_ms, report) })
}

/// Pushes each table's gradient rows `batches[t].data` of its ids: each table's duplicate
/// gradients summed (f32 and f64 rows), then each PS gets one request with every table's
/// distinct ids it holds and their summed rows, all in flight at once. The result and
/// `*report` as for `sw_sharded_tables_pull`.
///
/// # Safety
/// As `sw_sharded_tables_pull`, with each `data` pointing at `byte_len` readable bytes.
#[no_mangle]
pub extern "C" fn sw_sharded_tables_push(
    s: *mut sw_sharded_tables,
    c: *mut sw_client,
    batches: *const sw_table_batch,
    n_tables: usize,
    timeout_ms: u64,
    report: *mut sw_step_report,
) -> sw_result {
    boundary!({ step(s, c, batches, n_tables, Way::Push, timeout_ms, report) })
}

/// Pulls each distinct id of each table's batch once, with one rows request per PS for all
/// the tables (as `sw_sharded_tables_pull`), for a caller that builds its batches from the
/// distinct rows: for each table `t`, writes its distinct ids into `batches[t].unique`,
/// their rows into `batches[t].data`, each position's index among them into
/// `batches[t].inverse` and their number into `batches[t].unique_len` (what is past them in
/// `unique` and `data` is left as it was). The result, `*report` and
/// `sw_sharded_tables_part` as for `sw_sharded_tables_pull`; arguments that are not valid
/// fail the call before anything is sent, `*report` and the batches untouched.
///
/// # Safety
/// `s`, `c` are live handles used by this thread only; `batches` points at `n_tables`
/// writable values, each with `ids` at `n` values, `inverse` at `n` writable int64 values,
/// `unique` at `n` writable uint64 values and `data` at `byte_len` writable bytes, none of
/// them overlapping or used by anyone else during the call; `report` is writable.
#[no_mangle]
pub extern "C" fn sw_sharded_tables_pull_unique(
    s: *mut sw_sharded_tables,
    c: *mut sw_client,
    batches: *mut sw_unique_batch,
    n_tables: usize,
    timeout_ms: u64,
    report: *mut sw_step_report,
) -> sw_result {
    boundary!({
        let s = try_mut!(s, "sharded tables");
        let client = stepping_client(c)?;
        let report = try_out!(report);
        let batches = try_slice_mut!(batches, n_tables);
        one_batch_per_table(batches.len(), s.tables.len())?;
        let UniqueSlices {
            ids,
            mut inverse,
            mut unique,
            mut outs,
        } = unique_slices(batches)?;
        let deadline = deadline(timeout_ms);
        let done = with_client!(client, |h| s.tables.pull_unique(
            h,
            &ids,
            &mut inverse,
            &mut unique,
            &mut outs,
            deadline
        ))?;
        let settled = s.parts.settle(done, report);
        for (i, b) in batches.iter_mut().enumerate() {
            b.unique_len = s.tables.unique_len(i);
        }
        settled
    })
}

/// The last step's outcome at PS `i` (in the order given to `sw_sharded_tables_new`), as
/// `sw_sharded_part` says.
///
/// # Safety
/// `s` is a live handle.
#[no_mangle]
pub extern "C" fn sw_sharded_tables_part(s: *const sw_sharded_tables, i: usize) -> sw_result {
    boundary!({
        let s = try_ref!(s, "sharded tables");
        s.parts.part(i)
    })
}
