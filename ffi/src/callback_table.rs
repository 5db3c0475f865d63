//! A table of embedding rows whose rows live on the C side: `sw_table_new` with callbacks,
//! served by a runtime like the tables starwire makes.

use std::ffi::c_void;
use std::sync::Arc;

use starwire::rows::MAX_ROW_RANK;
use starwire::{DType, Status, Table};

use crate::boundary::boundary;
use crate::cast::{to_boxed, try_out, try_ref, try_slice, Castable, Plain};
use crate::result::{sw_result, Failure};
use crate::table::sw_table;

/// A table's rows as C callbacks. They run on a loop thread (or a handler thread), possibly
/// several at once: they must be thread-safe.
///
/// `pull` writes the rows of `ids[0..n]`, in order, into `out` (`byte_len == n *
/// row_bytes` bytes, row `i` at `i * row_bytes`, little-endian elements, no alignment
/// promised); for ids it has no row for, it writes their positions (increasing, below `n`)
/// to `missing`, which has room for `n`, and their count to `*n_missing` (it starts at 0);
/// starwire zeroes those rows. It returns a wire status: 0 `OK`, or why the whole table
/// failed (7 `INVALID_ARGUMENT`, 8 `INTERNAL`, ...).
///
/// `push` applies the gradient rows `grads` (`byte_len == n * row_bytes` bytes, laid out as
/// `pull`'s `out`) to the rows of `ids[0..n]` and returns a wire status.
///
/// The pointers are valid for the call only. A NULL callback answers with `UNIMPLEMENTED`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct sw_table_callbacks {
    /// Passed to both callbacks.
    pub user_data: *mut c_void,
    /// Writes rows.
    pub pull: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            ids: *const u64,
            n: usize,
            out: *mut c_void,
            byte_len: u64,
            missing: *mut u32,
            n_missing: *mut usize,
        ) -> u32,
    >,
    /// Applies gradient rows.
    pub push: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            ids: *const u64,
            n: usize,
            grads: *const c_void,
            byte_len: u64,
        ) -> u32,
    >,
}

impl Castable for sw_table_callbacks {
    type Ownership = Plain;
    type RustType = sw_table_callbacks;
}

/// A table served through C callbacks.
struct CTable {
    callbacks: sw_table_callbacks,
    dtype: DType,
    row_dims: Vec<u64>,
    row_bytes: usize,
}

// SAFETY: `sw_table_callbacks`' contract requires thread-safe callbacks and user data.
unsafe impl Send for CTable {}
// SAFETY: several loop threads may call the callbacks at once, which
// `sw_table_callbacks`' contract allows (thread-safe callbacks); the copied callbacks and
// the row shape are never written.
unsafe impl Sync for CTable {}

fn status(code: u32) -> Status {
    Status::from(code.min(u32::from(u16::MAX)) as u16)
}

impl Table for CTable {
    fn dtype(&self) -> DType {
        self.dtype
    }

    fn row_dims(&self) -> &[u64] {
        &self.row_dims
    }

    fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    fn pull(&self, ids: &[u64], out: &mut [u8], missing: &mut Vec<u32>) -> Status {
        let Some(pull) = self.callbacks.pull else {
            return Status::Unimplemented;
        };
        if Some(out.len()) != ids.len().checked_mul(self.row_bytes) {
            return Status::InvalidArgument;
        }
        let at = missing.len();
        missing.resize(at + ids.len(), 0);
        let mut n_missing = 0usize;
        // SAFETY: the table's callback, thread-safe by `sw_table_callbacks`' contract, called
        // with its own user data, `ids.len()` ids, `out` of the `out.len()` bytes it is told
        // (`ids.len() * row_bytes`, checked above), room for `ids.len()` positions in
        // `missing` and a count, all valid for the call.
        let code = unsafe {
            pull(
                self.callbacks.user_data,
                ids.as_ptr(),
                ids.len(),
                out.as_mut_ptr().cast(),
                out.len() as u64,
                missing[at..].as_mut_ptr(),
                &mut n_missing,
            )
        };
        let n_missing = n_missing.min(ids.len());
        missing.truncate(at + n_missing);
        let s = status(code);
        if !s.is_ok() {
            missing.truncate(at);
            return s;
        }
        // The positions are checked by the runtime (increasing, in range); here only the
        // rows in range are zeroed.
        for &p in &missing[at..] {
            let start = (p as usize).saturating_mul(self.row_bytes);
            if let Some(row) = out.get_mut(start..start.saturating_add(self.row_bytes)) {
                row.fill(0);
            }
        }
        s
    }

    fn push(&self, ids: &[u64], grads: &[u8]) -> Status {
        let Some(push) = self.callbacks.push else {
            return Status::Unimplemented;
        };
        if Some(grads.len()) != ids.len().checked_mul(self.row_bytes) {
            return Status::InvalidArgument;
        }
        // SAFETY: the table's callback, thread-safe by `sw_table_callbacks`' contract, called
        // with its own user data, `ids.len()` ids and the `grads.len()` bytes it is told
        // (`ids.len() * row_bytes`, checked above), valid for the call.
        status(unsafe {
            push(
                self.callbacks.user_data,
                ids.as_ptr(),
                ids.len(),
                grads.as_ptr().cast(),
                grads.len() as u64,
            )
        })
    }
}

/// Creates a table whose rows the caller keeps: rows of `dtype` shaped
/// `row_dims[0..rank]`, pulled and pushed through `callbacks` (copied; `user_data` must stay
/// valid while any runtime serves the table). Serve it by giving it to
/// `sw_runtime_options.tables`. On `SW_OK`, `*out` is a new handle the caller frees with
/// `sw_table_free`.
///
/// Fails with `SW_ERR_INVALID_ARGUMENT` for an unknown dtype, rows of no bytes or more than
/// 7 row dimensions.
///
/// # Safety
/// `row_dims` points at `rank` values (may be NULL when `rank` is 0); `callbacks` at valid
/// callbacks as `sw_table_callbacks` says; `out` is writable.
#[no_mangle]
pub extern "C" fn sw_table_new(
    dtype: u8,
    row_dims: *const u64,
    rank: u32,
    callbacks: *const sw_table_callbacks,
    out: *mut *mut sw_table,
) -> sw_result {
    boundary!({
        let callbacks = *try_ref!(callbacks);
        let out = try_out!(out);
        if rank as usize > MAX_ROW_RANK {
            return Err(Failure::invalid(format!(
                "rank {rank} is above {MAX_ROW_RANK}"
            )));
        }
        let row_dims = try_slice!(row_dims, rank as usize).to_vec();
        let dtype = DType::from(dtype);
        let row_bytes = starwire::service::row_bytes(dtype, &row_dims);
        if row_bytes == 0 || row_bytes == usize::MAX {
            return Err(Failure::invalid(format!(
                "unknown dtype {} or rows of no bytes",
                u8::from(dtype)
            )));
        }
        let table = CTable {
            callbacks,
            dtype,
            row_dims,
            row_bytes,
        };
        out.write(to_boxed::<sw_table>(Arc::new(table)));
        Ok(())
    })
}
