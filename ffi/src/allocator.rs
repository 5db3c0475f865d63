//! Tensor memory that C owns: what the trainer's allocator hooks (`sw_allocator`) return
//! for received tensors, and the caller's memory a tensor of `sw_tensor_wrap` sends from.
//!
//! Both are `TensorMemory` over raw memory and call back into C to give it back: with the
//! casts (`cast.rs`), the crate's `unsafe` lives here, each use saying why it holds.

use std::ffi::c_void;
use std::sync::Arc;

use starwire::{TensorAllocator, TensorDesc, TensorMemory};

use crate::cast::{ref_from, Castable, Plain};
use crate::result::Failure;

/// Memory for received tensors, chosen by the trainer. `allocate` is called once per
/// received tensor of at least one byte, before any of its payload is read, on a loop
/// thread (for an embedded client, on its own thread, inside its call that waits or
/// polls: hold no lock there that `allocate` takes); it returns memory of at least `byte_len` bytes (which starwire writes the
/// payload into, from the socket directly for large tensors), or NULL to fail that tensor
/// (status `RESOURCE_EXHAUSTED`; the request and connection go on). `release` is called
/// with the same pointer when the tensor is dropped, on any thread. Both must be
/// thread-safe; the memory must stay valid and unmoved until `release`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct sw_allocator {
    /// Passed to both callbacks.
    pub user_data: *mut c_void,
    /// Returns memory for a tensor, or NULL.
    pub allocate: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            dtype: u8,
            dims: *const u64,
            rank: u32,
            byte_len: u64,
        ) -> *mut c_void,
    >,
    /// Takes back memory `allocate` returned.
    pub release:
        Option<unsafe extern "C" fn(user_data: *mut c_void, data: *mut c_void, byte_len: u64)>,
}

impl Castable for sw_allocator {
    type Ownership = Plain;
    type RustType = sw_allocator;
}

/// The allocator `p` describes (a copy of its callbacks), or `None` for NULL.
pub(crate) fn allocator_of(
    p: *const sw_allocator,
) -> Result<Option<Arc<dyn TensorAllocator>>, Failure> {
    let Some(a) = ref_from(p) else {
        return Ok(None);
    };
    if a.allocate.is_none() {
        return Err(Failure::null("sw_allocator.allocate"));
    }
    Ok(Some(Arc::new(CAllocator(*a))))
}

/// A C allocator, callable from any thread (its contract says so).
struct CAllocator(sw_allocator);

// SAFETY: `sw_allocator`'s contract requires thread-safe callbacks and user data.
unsafe impl Send for CAllocator {}
// SAFETY: several loop threads may call `allocate` at once, which `sw_allocator`'s contract
// allows (thread-safe callbacks); the copied callbacks are never written.
unsafe impl Sync for CAllocator {}

impl TensorAllocator for CAllocator {
    fn allocate(&self, desc: &TensorDesc<'_>) -> Option<Box<dyn TensorMemory>> {
        let len = usize::try_from(desc.byte_len).ok()?;
        if len == 0 {
            return Some(Box::new(Vec::<u8>::new()));
        }
        let allocate = self.0.allocate?;
        // SAFETY: the trainer's callback, thread-safe by `sw_allocator`'s contract, called
        // with its own user data and `dims`, `desc.dims.len()` values that live for the
        // call.
        let ptr = unsafe {
            allocate(
                self.0.user_data,
                desc.dtype.into(),
                desc.dims.as_ptr(),
                desc.dims.len() as u32,
                desc.byte_len,
            )
        };
        if ptr.is_null() {
            return None;
        }
        Some(Box::new(CMemory {
            ptr: ptr.cast(),
            len,
            alloc: self.0,
        }))
    }
}

/// Memory from a C allocator, released through it when dropped.
struct CMemory {
    ptr: *mut u8,
    len: usize,
    alloc: sw_allocator,
}

// SAFETY: the memory is owned by this value until `release`; the callbacks are thread-safe
// per `sw_allocator`'s contract.
unsafe impl Send for CMemory {}
// SAFETY: shared access only reads the bytes.
unsafe impl Sync for CMemory {}

// SAFETY: `ptr`/`len` never change while the value lives, and the allocator's contract keeps
// the memory valid and unmoved until `release` (in `drop`).
unsafe impl TensorMemory for CMemory {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `allocate` returned `len` bytes at `ptr` (not NULL, and `len` above 0:
        // checked there), which `sw_allocator`'s contract keeps valid until `release`, in
        // `drop`; starwire writes them only through `bytes_mut`, which `&self` excludes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes the slice the only view of the memory.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for CMemory {
    fn drop(&mut self) {
        if let Some(release) = self.alloc.release {
            // SAFETY: the trainer's callback, thread-safe by `sw_allocator`'s contract, given
            // back the pointer and length its `allocate` returned, once: this value owned the
            // memory alone and is dropped once.
            unsafe { release(self.alloc.user_data, self.ptr.cast(), self.len as u64) };
        }
    }
}

/// The caller's memory lent to a tensor of `sw_tensor_wrap`; `release` is called when the
/// last reference is dropped.
pub(crate) struct Borrowed {
    pub(crate) ptr: *const u8,
    pub(crate) len: usize,
    pub(crate) release: Option<unsafe extern "C" fn(user_data: *mut c_void)>,
    pub(crate) user_data: *mut c_void,
}

// SAFETY: `sw_tensor_wrap`'s contract keeps the memory valid and unchanged while the tensor
// lives, and makes `release` and `user_data` usable from any thread.
unsafe impl Send for Borrowed {}
// SAFETY: shared references only read the memory (`bytes`), which the caller keeps
// unchanged while the tensor lives; `release` runs once, from `drop`, which takes `&mut`.
unsafe impl Sync for Borrowed {}

// SAFETY: `ptr`/`len` never change while the value lives, and `sw_tensor_wrap`'s contract
// keeps the memory valid and unmoved until `release` (in `drop`).
unsafe impl TensorMemory for Borrowed {
    fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `len` (above 0) bytes at `ptr`, which `sw_tensor_wrap` checked is not NULL
        // and whose contract keeps valid and unchanged until `release`, in `drop`; nothing
        // writes them (`bytes_mut` gives none of them).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // Never reached: a wrapped tensor is only sent and read (`sw_tensor_data_mut`
        // refuses it); written through, it would write the caller's memory.
        &mut []
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        if let Some(release) = self.release {
            // SAFETY: the caller's callback, usable from any thread by `sw_tensor_wrap`'s
            // contract, called once (this value is dropped once) with its own user data.
            unsafe { release(self.user_data) };
        }
    }
}
