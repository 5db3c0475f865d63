//! `sw_tensor`: a handle to a shared tensor, made from a copy of the caller's bytes or
//! around the caller's memory, and read by getters.

use std::ffi::c_void;
use std::sync::Arc;

use starwire::{DType, Tensor};

use crate::allocator::Borrowed;
use crate::boundary::boundary;
use crate::cast::{free_box, mut_from, ref_from, to_boxed, try_out, try_slice, Boxed, Castable};
use crate::result::{sw_result, Failure};

/// A tensor: dtype, shape and contents (shared; freeing a handle drops one reference).
pub struct sw_tensor {
    _private: [u8; 0],
}

/// What a `sw_tensor` handle is: one reference to a shared tensor.
pub(crate) struct TensorHandle {
    pub(crate) tensor: Arc<Tensor>,
    /// Its contents are the caller's memory (`sw_tensor_wrap`), never written by starwire.
    pub(crate) borrowed: bool,
}

impl Castable for sw_tensor {
    type Ownership = Boxed;
    type RustType = TensorHandle;
}

impl TensorHandle {
    pub(crate) fn owned(tensor: Arc<Tensor>) -> TensorHandle {
        TensorHandle {
            tensor,
            borrowed: false,
        }
    }
}

/// Creates a tensor holding a copy of `byte_len` bytes at `data`, of element type `dtype`
/// (the wire code: 1 bool, 2 u8, 3 i8, 4 u16, 5 i16, 6 f16, 7 bf16, 8 u32, 9 i32, 10 f32,
/// 11 u64, 12 i64, 13 f64, ...) and shape `dims[0..rank]`. `byte_len` must equal the
/// element size times the number of elements. On `SW_OK`, `*out` is a new handle the
/// caller frees with `sw_tensor_free`.
///
/// # Safety
/// `dims` points at `rank` values (may be NULL when `rank` is 0); `data` at `byte_len`
/// bytes (may be NULL when `byte_len` is 0); `out` is writable.
#[no_mangle]
pub extern "C" fn sw_tensor_new(
    dtype: u8,
    dims: *const u64,
    rank: u32,
    data: *const c_void,
    byte_len: u64,
    out: *mut *mut sw_tensor,
) -> sw_result {
    boundary!({
        let out = try_out!(out);
        let dims = try_slice!(dims, rank as usize);
        let len = usize::try_from(byte_len).map_err(|_| Failure::invalid("byte_len too large"))?;
        let bytes = try_slice!(data.cast::<u8>(), len, "data");
        let t = Tensor::from_slice(DType::from(dtype), dims, bytes)
            .map_err(|e| Failure::invalid(format!("tensor: {e}")))?;
        out.write(to_boxed(TensorHandle::owned(Arc::new(t))));
        Ok(())
    })
}

/// Creates a tensor whose contents are the caller's `byte_len` bytes at `data`, not copied:
/// a push or publish of it sends them straight from that memory. Dtype, shape and length as
/// `sw_tensor_new`. The memory must stay valid and unchanged until the tensor's last
/// reference is dropped, which starwire reports by calling `release(user_data)` once (on
/// any thread; `release` may be NULL, then ask `sw_tensor_shared` of the caller's handle).
/// On `SW_OK`, `*out` is a new handle the caller frees with `sw_tensor_free`; on failure
/// `release` has been called before this returns.
///
/// # Safety
/// `dims` points at `rank` values (may be NULL when `rank` is 0); `data` at `byte_len`
/// bytes that stay valid and unchanged as said above (may be NULL when `byte_len` is 0);
/// `release`, when not NULL, is safe to call with `user_data` from any thread; `out` is
/// writable.
#[no_mangle]
pub extern "C" fn sw_tensor_wrap(
    dtype: u8,
    dims: *const u64,
    rank: u32,
    data: *const c_void,
    byte_len: u64,
    release: Option<unsafe extern "C" fn(user_data: *mut c_void)>,
    user_data: *mut c_void,
    out: *mut *mut sw_tensor,
) -> sw_result {
    boundary!({
        let out = try_out!(out);
        let dims = try_slice!(dims, rank as usize);
        let len = usize::try_from(byte_len).map_err(|_| Failure::invalid("byte_len too large"))?;
        let bytes = try_slice!(data.cast::<u8>(), len, "data");
        let dtype = DType::from(dtype);
        let want = starwire::service::row_bytes(dtype, dims);
        let memory = Borrowed {
            ptr: bytes.as_ptr(),
            len,
            release,
            user_data,
        };
        if want == usize::MAX || want != len {
            // Dropping `memory` calls `release`: the memory is not used.
            drop(memory);
            return Err(Failure::invalid(format!(
                "tensor: {byte_len} bytes are not dtype {} in shape {dims:?}",
                u8::from(dtype)
            )));
        }
        let t = Tensor::from_memory(dtype, dims, Box::new(memory))
            .map_err(|e| Failure::invalid(format!("tensor: {e}")))?;
        out.write(to_boxed(TensorHandle {
            tensor: Arc::new(t),
            borrowed: true,
        }));
        Ok(())
    })
}

/// Whether starwire still holds a reference to the tensor besides the handle `t` (a push
/// not yet written, a publish not yet received). With `sw_tensor_wrap`'s memory, the caller
/// may reuse it once this is false and `t` is freed. False if `t` is NULL.
///
/// # Safety
/// `t` is NULL or a live tensor handle.
#[no_mangle]
pub extern "C" fn sw_tensor_shared(t: *const sw_tensor) -> bool {
    boundary!(false, {
        ref_from(t).is_some_and(|t| Arc::strong_count(&t.tensor) > 1)
    })
}

/// The tensor's contents, writable: only when `t` is the tensor's one reference (a received
/// tensor taken with `sw_reply_take_tensor`, for instance) and the memory is starwire's or
/// the allocator's, not the caller's (`sw_tensor_wrap`). NULL otherwise, or if `t` is NULL.
///
/// # Safety
/// `t` is NULL or a live tensor handle used by no other thread during the call; the pointer
/// is valid while the handle lives, and only while no other reference is made
/// (`sw_tensor_clone`, a push, a publish).
#[no_mangle]
pub extern "C" fn sw_tensor_data_mut(t: *mut sw_tensor) -> *mut c_void {
    boundary!(std::ptr::null_mut(), {
        let Some(t) = mut_from(t) else {
            return std::ptr::null_mut();
        };
        if t.borrowed {
            return std::ptr::null_mut();
        }
        match Arc::get_mut(&mut t.tensor) {
            Some(t) if t.byte_len() > 0 => t.bytes_mut().as_mut_ptr().cast(),
            _ => std::ptr::null_mut(),
        }
    })
}

/// A new handle to the same tensor (no copy). Returns NULL if `t` is NULL.
///
/// # Safety
/// `t` is NULL or a live tensor handle.
#[no_mangle]
pub extern "C" fn sw_tensor_clone(t: *const sw_tensor) -> *mut sw_tensor {
    boundary!(std::ptr::null_mut(), {
        match ref_from(t) {
            Some(t) => to_boxed(TensorHandle {
                tensor: t.tensor.clone(),
                borrowed: t.borrowed,
            }),
            None => std::ptr::null_mut(),
        }
    })
}

/// Releases a tensor handle. NULL is ignored.
///
/// # Safety
/// `t` is NULL or a handle from starwire not freed before.
#[no_mangle]
pub extern "C" fn sw_tensor_free(t: *mut sw_tensor) {
    boundary!((), { free_box(t) })
}

/// The tensor's dtype code (0 if `t` is NULL).
///
/// # Safety
/// `t` is NULL or a live tensor handle.
#[no_mangle]
pub extern "C" fn sw_tensor_dtype(t: *const sw_tensor) -> u8 {
    boundary!(0, { ref_from(t).map_or(0, |t| t.tensor.dtype().into()) })
}

/// The tensor's rank (0 if `t` is NULL).
///
/// # Safety
/// `t` is NULL or a live tensor handle.
#[no_mangle]
pub extern "C" fn sw_tensor_rank(t: *const sw_tensor) -> u32 {
    boundary!(0, {
        ref_from(t).map_or(0, |t| t.tensor.dims().len() as u32)
    })
}

/// The tensor's shape, `rank` values owned by the tensor (NULL if `t` is NULL).
///
/// # Safety
/// `t` is NULL or a live tensor handle; the pointer is valid while the handle lives.
#[no_mangle]
pub extern "C" fn sw_tensor_dims(t: *const sw_tensor) -> *const u64 {
    boundary!(std::ptr::null(), {
        ref_from(t).map_or(std::ptr::null(), |t| t.tensor.dims().as_ptr())
    })
}

/// The tensor's contents, `sw_tensor_byte_len` bytes owned by the tensor (NULL if `t` is
/// NULL). Read-only: a tensor may be shared.
///
/// # Safety
/// `t` is NULL or a live tensor handle; the pointer is valid while the handle lives.
#[no_mangle]
pub extern "C" fn sw_tensor_data(t: *const sw_tensor) -> *const c_void {
    boundary!(std::ptr::null(), {
        ref_from(t).map_or(std::ptr::null(), |t| t.tensor.bytes().as_ptr().cast())
    })
}

/// Bytes of contents (0 if `t` is NULL).
///
/// # Safety
/// `t` is NULL or a live tensor handle.
#[no_mangle]
pub extern "C" fn sw_tensor_byte_len(t: *const sw_tensor) -> u64 {
    boundary!(0, { ref_from(t).map_or(0, |t| t.tensor.byte_len() as u64) })
}

/// Whether the tensor is dead (a rendezvous value whose producer did not run).
///
/// # Safety
/// `t` is NULL or a live tensor handle.
#[no_mangle]
pub extern "C" fn sw_tensor_is_dead(t: *const sw_tensor) -> bool {
    boundary!(false, { ref_from(t).is_some_and(|t| t.tensor.is_dead()) })
}
