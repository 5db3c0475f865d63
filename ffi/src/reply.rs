//! `sw_reply`: the answer to a request as C reads it (per item a tensor or a status, per
//! rows table a status and the rows missing, or a ping's round-trip time).

use std::ffi::{c_char, CString};
use std::sync::Arc;

use starwire::{Error, Reply};

use crate::boundary::boundary;
use crate::buffers::{status_code, RowsTargets};
use crate::cast::{free_box, lend, mut_from, ref_from, to_boxed, Boxed, Castable};
use crate::cast::{try_out, try_out_slice, try_ref};
use crate::result::{c_string, sw_result, Failure};
use crate::tensor::{sw_tensor, TensorHandle};

/// The answer to a request: per item, a tensor or a status (a pull or recv); per item, a
/// status (a push, a rows push); per table, a status and the rows missing (a rows pull,
/// whose rows are in the caller's memory); or a round-trip time (a ping).
pub struct sw_reply {
    _private: [u8; 0],
}

/// What a `sw_reply` handle is: a completed request's answer, as C reads it.
pub(crate) struct ReplyHandle {
    tensors: Vec<Option<TensorHandle>>,
    statuses: Vec<u32>,
    rtt_us: f64,
    /// A rows pull: the positions of the missing rows, all tables'.
    missing: Vec<u32>,
    /// A rows pull: per table, where its positions are in `missing` (start, count).
    spans: Vec<(usize, usize)>,
    /// A rows pull answered in part: what the peer said about the tables it refused.
    refusal: Option<CString>,
}

impl Castable for sw_reply {
    type Ownership = Boxed;
    type RustType = ReplyHandle;
}

/// The reply of `reply`; for a rows pull, its blocks are put in `targets` first (when
/// given), and dropped.
fn reply_of(reply: Reply, targets: Option<&RowsTargets>) -> ReplyHandle {
    let mut r = ReplyHandle {
        tensors: Vec::new(),
        statuses: Vec::new(),
        rtt_us: 0.0,
        missing: Vec::new(),
        spans: Vec::new(),
        refusal: None,
    };
    match reply {
        Reply::Rows(rows) => {
            r.statuses = match targets {
                Some(targets) => targets.place(&rows),
                None => (0..rows.len())
                    .map(|t| status_code(rows.block(t)))
                    .collect(),
            };
            for t in 0..rows.len() {
                let m = rows.missing(t);
                r.spans.push((r.missing.len(), m.len()));
                r.missing.extend_from_slice(m);
            }
            r.refusal = rows.refusal().map(c_string);
        }
        Reply::Pulled(items) | Reply::Received(items) => {
            for item in items {
                match item {
                    Ok(t) => {
                        r.tensors.push(Some(TensorHandle::owned(Arc::new(t))));
                        r.statuses.push(0);
                    }
                    Err(s) => {
                        r.tensors.push(None);
                        r.statuses.push(u16::from(s) as u32);
                    }
                }
            }
        }
        Reply::Pushed(statuses) => {
            r.statuses = statuses.into_iter().map(|s| u16::from(s) as u32).collect();
        }
        Reply::Pong { rtt, .. } => r.rtt_us = rtt.as_secs_f64() * 1e6,
        _ => {}
    }
    r
}

/// A completion's result as C sees it: a reply (a rows pull's blocks put in `targets`), or
/// the failure.
pub(crate) fn answer(
    result: Result<Reply, Error>,
    targets: Option<&RowsTargets>,
) -> Result<ReplyHandle, Failure> {
    match result {
        Ok(reply) => Ok(reply_of(reply, targets)),
        Err(e) => Err(Failure::from(e)),
    }
}

/// Items in the reply: ids, keys, pushed items, or tables of a rows request (0 for a ping,
/// or if `r` is NULL).
///
/// # Safety
/// `r` is NULL or a live reply.
#[no_mangle]
pub extern "C" fn sw_reply_count(r: *const sw_reply) -> usize {
    boundary!(0, { ref_from(r).map_or(0, |r| r.statuses.len()) })
}

/// Item `i`'s wire status: 0 (`OK`) or why it failed (1 `NOT_FOUND`, 6
/// `RESOURCE_EXHAUSTED` when the allocator refused, ... as in `docs/wire-format.md`).
/// `u32::MAX` if out of range.
///
/// # Safety
/// `r` is NULL or a live reply.
#[no_mangle]
pub extern "C" fn sw_reply_status(r: *const sw_reply, i: usize) -> u32 {
    boundary!(u32::MAX, {
        ref_from(r)
            .and_then(|r| r.statuses.get(i).copied())
            .unwrap_or(u32::MAX)
    })
}

/// Item `i`'s tensor, borrowed from the reply (valid until `sw_reply_free`; use
/// `sw_tensor_clone` to keep it), or NULL if it has none (as the items of a rows pull: their
/// rows are in the caller's buffers).
///
/// # Safety
/// `r` is NULL or a live reply.
#[no_mangle]
pub extern "C" fn sw_reply_tensor(r: *const sw_reply, i: usize) -> *const sw_tensor {
    boundary!(std::ptr::null(), {
        ref_from(r)
            .and_then(|r| r.tensors.get(i))
            .and_then(|t| t.as_ref())
            .map_or(std::ptr::null(), lend)
    })
}

/// Takes item `i`'s tensor out of the reply: a new handle the caller frees with
/// `sw_tensor_free` (and the tensor's one reference, so `sw_tensor_data_mut` works on it),
/// or NULL if the item has none or it was taken before. `sw_reply_tensor` then gives NULL
/// for the item.
///
/// # Safety
/// `r` is NULL or a live reply used by no other thread during the call.
#[no_mangle]
pub extern "C" fn sw_reply_take_tensor(r: *mut sw_reply, i: usize) -> *mut sw_tensor {
    boundary!(std::ptr::null_mut(), {
        mut_from(r)
            .and_then(|r| r.tensors.get_mut(i))
            .and_then(Option::take)
            .map_or(std::ptr::null_mut(), to_boxed)
    })
}

/// A ping's round-trip time in microseconds (0 for other replies).
///
/// # Safety
/// `r` is NULL or a live reply.
#[no_mangle]
pub extern "C" fn sw_reply_rtt_us(r: *const sw_reply) -> f64 {
    boundary!(0.0, { ref_from(r).map_or(0.0, |r| r.rtt_us) })
}

/// The positions (in table `t`'s ids, increasing) of the rows a rows pull's peer did not
/// have; their bytes in the table's buffer are zero. On `SW_OK`, `*count` positions are
/// written to `positions`, which has room for `capacity` (the table's number of ids always
/// suffices; `positions` may be NULL when `capacity` is 0). A table that failed, and every
/// item of a reply to another request, has none. `SW_ERR_INVALID_ARGUMENT` when `t` is not
/// below `sw_reply_count`, or `capacity` is too small.
///
/// # Safety
/// `r` is a live reply; `positions` has room for `capacity` values; `count` is writable.
#[no_mangle]
pub extern "C" fn sw_reply_missing(
    r: *const sw_reply,
    t: usize,
    positions: *mut u32,
    capacity: usize,
    count: *mut usize,
) -> sw_result {
    boundary!({
        let r = try_ref!(r, "reply");
        let count = try_out!(count);
        if t >= r.statuses.len() {
            return Err(Failure::invalid(format!(
                "item {t} of a reply of {} items",
                r.statuses.len()
            )));
        }
        let (start, n) = r.spans.get(t).copied().unwrap_or((0, 0));
        if n > capacity {
            return Err(Failure::invalid(format!(
                "{n} missing rows and room for {capacity}"
            )));
        }
        if n > 0 {
            // Room for `capacity` values, of which the first `n` are written.
            let positions = try_out_slice!(positions, n);
            for (p, &m) in positions.iter_mut().zip(&r.missing[start..start + n]) {
                p.write(m);
            }
        }
        count.write(n);
        Ok(())
    })
}

/// What the peer said about the tables of a rows pull it refused, when it answered some of
/// the request's tables and refused others with a reason: `"no table 9 on this task (this
/// task serves table 1)"`, `"table 1 holds f32 [16] rows; the request asked for f32 [8]"`,
/// one clause per refused table, whose `sw_reply_status` is not 0. A NUL-terminated string
/// owned by the reply, valid until `sw_reply_free`; empty when the peer said nothing, for
/// other replies, and for NULL. (A pull whose every table was refused fails as a whole
/// instead, with these words in `sw_last_error_remote`.)
///
/// # Safety
/// `r` is NULL or a live reply.
#[no_mangle]
pub extern "C" fn sw_reply_refusal(r: *const sw_reply) -> *const c_char {
    boundary!(c"".as_ptr(), {
        ref_from(r)
            .and_then(|r| r.refusal.as_deref())
            .map_or(c"".as_ptr(), |s| s.as_ptr())
    })
}

/// Releases a reply and the tensors it still holds. NULL is ignored.
///
/// # Safety
/// `r` is NULL or a reply from starwire not freed before.
#[no_mangle]
pub extern "C" fn sw_reply_free(r: *mut sw_reply) {
    boundary!((), { free_box(r) })
}
