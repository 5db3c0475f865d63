//! C ABI for starwire: runtimes, PS services as C callbacks, tables of embedding rows (the
//! reference in-memory table) and rows requests into the caller's memory, per-thread client
//! handles, tensor allocator hooks, the rendezvous, and stats. The header
//! `include/starwire.h` is generated from this file by cbindgen (see `cbindgen.toml`;
//! `tests/header.rs` fails when the committed header drifts from the code).
//!
//! Conventions, for every function:
//! - the body runs inside a panic boundary: a panic returns `SW_ERR_PANIC`, never unwinds
//!   into C;
//! - every pointer is checked for NULL (`SW_ERR_NULL`);
//! - outputs are written only when the call returns `SW_OK`;
//! - on failure, `sw_last_error()` describes it (per thread, until the next call).
#![allow(non_camel_case_types)]

mod bench;
mod callback_table;
pub mod metrics;
mod resolver;
mod sharded;

pub use bench::*;
pub use callback_table::*;
pub use resolver::*;
pub use sharded::*;

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use starwire::config::ConfigBuilder;
use starwire::rows::{Init, MemTable, Optimizer, Tables};
use starwire::rows::{PulledRows, Rows, MAX_ROW_RANK};
use starwire::Config;
use starwire::{
    Completion, Embedded, Error, ErrorKind, Handle, Options, Rendezvous, Reply, Runtime, Service,
    Table, Tensor, TensorAllocator, TensorDesc, TensorMemory,
};
use starwire::{DType, Status};

// ----- results and errors -----

/// What a call returned. `SW_OK` is 0; the values are stable.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum sw_result {
    /// Success.
    SW_OK = 0,
    /// A required pointer was NULL.
    SW_ERR_NULL = 1,
    /// An argument is invalid (bad address, dtype, shape, length, empty list, unknown tag).
    SW_ERR_INVALID_ARGUMENT = 2,
    /// A setting is malformed or out of range (the message names it).
    SW_ERR_CONFIG = 3,
    /// An operating-system error (listening, starting loops).
    SW_ERR_IO = 4,
    /// The request's deadline passed.
    SW_ERR_TIMEOUT = 5,
    /// The connection to the peer was lost.
    SW_ERR_CONNECTION_LOST = 6,
    /// The peer could not be reached.
    SW_ERR_CONNECT_FAILED = 7,
    /// The peer refused the handshake (cluster id or token).
    SW_ERR_REFUSED = 8,
    /// The peer answered the request with an error status (see the message).
    SW_ERR_REMOTE = 9,
    /// The peer violated the protocol; its connection was closed.
    SW_ERR_PROTOCOL = 10,
    /// Too many requests in flight on this client.
    SW_ERR_BACKPRESSURE = 11,
    /// The runtime is shutting down.
    SW_ERR_SHUTDOWN = 12,
    /// starwire panicked inside this call (a bug); the call had no effect.
    SW_ERR_PANIC = 13,
    /// The rendezvous key is already published and not yet received.
    SW_ERR_ALREADY_PUBLISHED = 14,
}

use sw_result::*;

/// A failure: its code and message, and for an error the peer reported (`SW_ERR_REMOTE`,
/// `SW_ERR_REFUSED`), its wire status and the peer's own message.
#[derive(Clone)]
struct Failure {
    code: sw_result,
    msg: String,
    remote: Option<(u32, String)>,
}

impl Failure {
    fn new(code: sw_result, msg: impl Into<String>) -> Failure {
        Failure {
            code,
            msg: msg.into(),
            remote: None,
        }
    }
    fn null(what: &str) -> Failure {
        Failure::new(SW_ERR_NULL, format!("{what} is NULL"))
    }
    fn invalid(msg: impl Into<String>) -> Failure {
        Failure::new(SW_ERR_INVALID_ARGUMENT, msg.into())
    }
    /// This thread's last error, failed with `code` by a call made from inside another
    /// (which records it again as its own).
    fn again(code: sw_result) -> Failure {
        LAST_ERROR.with(|e| {
            let e = e.borrow();
            Failure {
                code,
                msg: e.message.to_string_lossy().into_owned(),
                remote: (e.status != 0)
                    .then(|| (e.status, e.remote.to_string_lossy().into_owned())),
            }
        })
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        let code = match e.kind() {
            ErrorKind::Timeout => SW_ERR_TIMEOUT,
            ErrorKind::ConnectionLost => SW_ERR_CONNECTION_LOST,
            // A task that moved or left the cluster: as unreachable as one that refuses
            // connections; the message says where it went.
            ErrorKind::ConnectFailed | ErrorKind::NotInCluster => SW_ERR_CONNECT_FAILED,
            ErrorKind::Refused(_) => SW_ERR_REFUSED,
            ErrorKind::Remote(_) => SW_ERR_REMOTE,
            ErrorKind::Protocol => SW_ERR_PROTOCOL,
            ErrorKind::Backpressure => SW_ERR_BACKPRESSURE,
            ErrorKind::Shutdown => SW_ERR_SHUTDOWN,
            _ => SW_ERR_INVALID_ARGUMENT,
        };
        let remote = match e.kind() {
            ErrorKind::Refused(s) | ErrorKind::Remote(s) => Some((
                u32::from(u16::from(s)),
                e.remote_message().unwrap_or_default().to_owned(),
            )),
            _ => None,
        };
        Failure {
            code,
            msg: e.to_string(),
            remote,
        }
    }
}

/// What `sw_last_error`, `sw_last_error_status` and `sw_last_error_remote` give.
#[derive(Default)]
struct LastError {
    message: CString,
    status: u32,
    remote: CString,
}

thread_local! {
    static LAST_ERROR: RefCell<LastError> = RefCell::new(LastError::default());
}

fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

fn set_last_error(msg: &str) {
    record(&Failure::new(SW_ERR_INVALID_ARGUMENT, msg));
}

/// Makes `f` this thread's last error.
fn record(f: &Failure) {
    let (status, remote) = match &f.remote {
        Some((status, remote)) => (*status, c_string(remote)),
        None => (0, CString::default()),
    };
    let last = LastError {
        message: c_string(&f.msg),
        status,
        remote,
    };
    LAST_ERROR.with(|e| *e.borrow_mut() = last);
}

/// Runs `f` inside the panic boundary, recording the error message of a failure.
fn boundary(f: impl FnOnce() -> Result<(), Failure>) -> sw_result {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => SW_OK,
        Ok(Err(failure)) => {
            record(&failure);
            failure.code
        }
        Err(_) => {
            set_last_error("starwire panicked inside this call");
            SW_ERR_PANIC
        }
    }
}

/// Runs `f`, a getter that cannot fail, inside the panic boundary (`default` on a panic).
fn boundary_value<T>(default: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(default)
}

/// The message of this thread's last failed call: a NUL-terminated string owned by
/// starwire, valid until the next starwire call on this thread. Empty if none failed.
#[no_mangle]
pub extern "C" fn sw_last_error() -> *const c_char {
    boundary_value(c"".as_ptr(), || {
        LAST_ERROR.with(|e| e.borrow().message.as_ptr())
    })
}

/// For this thread's last failed call, when it failed with `SW_ERR_REMOTE` or
/// `SW_ERR_REFUSED`: the wire status the peer answered with (9 `UNIMPLEMENTED`, ... as in
/// `docs/wire-format.md`). 0 otherwise.
#[no_mangle]
pub extern "C" fn sw_last_error_status() -> u32 {
    boundary_value(0, || LAST_ERROR.with(|e| e.borrow().status))
}

/// For this thread's last failed call, when it failed with `SW_ERR_REMOTE` or
/// `SW_ERR_REFUSED`: the peer's own message (a NUL-terminated string owned by starwire,
/// valid until the next starwire call on this thread; empty if the peer sent none, or for
/// other failures).
#[no_mangle]
pub extern "C" fn sw_last_error_remote() -> *const c_char {
    boundary_value(c"".as_ptr(), || {
        LAST_ERROR.with(|e| e.borrow().remote.as_ptr())
    })
}

/// The starwire version as a NUL-terminated C string with static lifetime.
#[no_mangle]
pub extern "C" fn starwire_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

// ----- pointer helpers -----

/// `p` as a reference, or `SW_ERR_NULL` naming `what`.
///
/// # Safety
/// `p` is NULL or points at a live `T` for the returned lifetime.
unsafe fn reference<'a, T>(p: *const T, what: &str) -> Result<&'a T, Failure> {
    // SAFETY: the caller guarantees `p` is NULL or valid.
    unsafe { p.as_ref() }.ok_or_else(|| Failure::null(what))
}

/// `p` as a mutable reference, or `SW_ERR_NULL` naming `what`.
///
/// # Safety
/// `p` is NULL or points at a live `T`, used by no one else for the returned lifetime.
unsafe fn reference_mut<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T, Failure> {
    // SAFETY: the caller guarantees `p` is NULL or valid and unaliased.
    unsafe { p.as_mut() }.ok_or_else(|| Failure::null(what))
}

/// `n` elements at `p` (NULL allowed only when `n` is 0).
///
/// # Safety
/// `p` points at `n` initialized elements, or `n` is 0.
unsafe fn slice<'a, T>(p: *const T, n: usize, what: &str) -> Result<&'a [T], Failure> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Failure::null(what));
    }
    // SAFETY: non-null, and the caller guarantees `n` initialized elements.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// As [`slice`], naming the argument only when it is NULL (no message built per call).
///
/// # Safety
/// As [`slice`].
unsafe fn slice_named<'a, T>(
    p: *const T,
    n: usize,
    what: impl FnOnce() -> String,
) -> Result<&'a [T], Failure> {
    if n > 0 && p.is_null() {
        return Err(Failure::null(&what()));
    }
    // SAFETY: forwarded; not NULL when `n` is above 0.
    unsafe { slice(p, n, "") }
}

/// A NUL-terminated string argument.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn string<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if p.is_null() {
        return Err(Failure::null(what));
    }
    // SAFETY: non-null and NUL-terminated per the caller.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map_err(|_| Failure::invalid(format!("{what} is not UTF-8")))
}

/// A `host:port` argument.
///
/// # Safety
/// As [`string`].
unsafe fn address(p: *const c_char, what: &str) -> Result<SocketAddr, Failure> {
    // SAFETY: forwarded.
    let s = unsafe { string(p, what) }?;
    s.parse()
        .map_err(|_| Failure::invalid(format!("{what} {s:?} is not an address (host:port)")))
}

/// Writes `value` through an output pointer checked earlier.
///
/// # Safety
/// `out` is valid for a write of `T`.
unsafe fn write<T>(out: *mut T, value: T) {
    // SAFETY: per the caller.
    unsafe { out.write(value) }
}

fn deadline(timeout_ms: u64) -> Option<Instant> {
    (timeout_ms > 0).then(|| Instant::now() + Duration::from_millis(timeout_ms))
}

// ----- tensors -----

/// A tensor: dtype, shape and contents (shared; freeing a handle drops one reference).
pub struct sw_tensor {
    tensor: Arc<Tensor>,
    /// Its contents are the caller's memory (`sw_tensor_wrap`), never written by starwire.
    borrowed: bool,
}

impl sw_tensor {
    fn owned(tensor: Arc<Tensor>) -> sw_tensor {
        sw_tensor {
            tensor,
            borrowed: false,
        }
    }
}

fn new_handle(tensor: Arc<Tensor>) -> *mut sw_tensor {
    Box::into_raw(Box::new(sw_tensor::owned(tensor)))
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
pub unsafe extern "C" fn sw_tensor_new(
    dtype: u8,
    dims: *const u64,
    rank: u32,
    data: *const c_void,
    byte_len: u64,
    out: *mut *mut sw_tensor,
) -> sw_result {
    boundary(|| {
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        // SAFETY: per this function's contract.
        let dims = unsafe { slice(dims, rank as usize, "dims") }?;
        let len = usize::try_from(byte_len).map_err(|_| Failure::invalid("byte_len too large"))?;
        // SAFETY: per this function's contract.
        let bytes = unsafe { slice(data.cast::<u8>(), len, "data") }?;
        let t = Tensor::from_slice(DType::from(dtype), dims, bytes)
            .map_err(|e| Failure::invalid(format!("tensor: {e}")))?;
        // SAFETY: checked non-null above.
        unsafe { write(out, new_handle(Arc::new(t))) };
        Ok(())
    })
}

/// The caller's memory lent to a tensor of `sw_tensor_wrap`; `release` is called when the
/// last reference is dropped.
struct Borrowed {
    ptr: *const u8,
    len: usize,
    release: Option<unsafe extern "C" fn(user_data: *mut c_void)>,
    user_data: *mut c_void,
}

// SAFETY: `sw_tensor_wrap`'s contract keeps the memory valid and unchanged while the tensor
// lives, and makes `release` and `user_data` usable from any thread.
unsafe impl Send for Borrowed {}
// SAFETY: as above; starwire only reads the memory.
unsafe impl Sync for Borrowed {}

// SAFETY: `ptr`/`len` never change while the value lives, and `sw_tensor_wrap`'s contract
// keeps the memory valid and unmoved until `release` (in `drop`).
unsafe impl TensorMemory for Borrowed {
    fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `len` bytes at `ptr`, valid until `release`.
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
            // SAFETY: the caller's callback, called once, with its user data.
            unsafe { release(self.user_data) };
        }
    }
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
pub unsafe extern "C" fn sw_tensor_wrap(
    dtype: u8,
    dims: *const u64,
    rank: u32,
    data: *const c_void,
    byte_len: u64,
    release: Option<unsafe extern "C" fn(user_data: *mut c_void)>,
    user_data: *mut c_void,
    out: *mut *mut sw_tensor,
) -> sw_result {
    boundary(|| {
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        // SAFETY: per this function's contract.
        let dims = unsafe { slice(dims, rank as usize, "dims") }?;
        let len = usize::try_from(byte_len).map_err(|_| Failure::invalid("byte_len too large"))?;
        if len > 0 && data.is_null() {
            return Err(Failure::null("data"));
        }
        let dtype = DType::from(dtype);
        let want = starwire::service::row_bytes(dtype, dims);
        let memory = Borrowed {
            ptr: data.cast(),
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
        let handle = Box::new(sw_tensor {
            tensor: Arc::new(t),
            borrowed: true,
        });
        // SAFETY: checked non-null above.
        unsafe { write(out, Box::into_raw(handle)) };
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
pub unsafe extern "C" fn sw_tensor_shared(t: *const sw_tensor) -> bool {
    // SAFETY: per this function's contract.
    boundary_value(false, || {
        unsafe { t.as_ref() }.is_some_and(|t| Arc::strong_count(&t.tensor) > 1)
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
pub unsafe extern "C" fn sw_tensor_data_mut(t: *mut sw_tensor) -> *mut c_void {
    boundary_value(std::ptr::null_mut(), || {
        // SAFETY: per this function's contract.
        let Some(t) = (unsafe { t.as_mut() }) else {
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
pub unsafe extern "C" fn sw_tensor_clone(t: *const sw_tensor) -> *mut sw_tensor {
    boundary_value(std::ptr::null_mut(), || {
        // SAFETY: per this function's contract.
        match unsafe { t.as_ref() } {
            Some(t) => Box::into_raw(Box::new(sw_tensor {
                tensor: t.tensor.clone(),
                borrowed: t.borrowed,
            })),
            None => std::ptr::null_mut(),
        }
    })
}

/// Releases a tensor handle. NULL is ignored.
///
/// # Safety
/// `t` is NULL or a handle from starwire not freed before.
#[no_mangle]
pub unsafe extern "C" fn sw_tensor_free(t: *mut sw_tensor) {
    boundary_value((), || {
        if !t.is_null() {
            // SAFETY: made by `Box::into_raw` in `new_handle`, freed once per the contract.
            drop(unsafe { Box::from_raw(t) });
        }
    })
}

/// The tensor's dtype code (0 if `t` is NULL).
///
/// # Safety
/// `t` is NULL or a live tensor handle.
#[no_mangle]
pub unsafe extern "C" fn sw_tensor_dtype(t: *const sw_tensor) -> u8 {
    // SAFETY: per this function's contract.
    boundary_value(0, || {
        unsafe { t.as_ref() }.map_or(0, |t| t.tensor.dtype().into())
    })
}

/// The tensor's rank (0 if `t` is NULL).
///
/// # Safety
/// `t` is NULL or a live tensor handle.
#[no_mangle]
pub unsafe extern "C" fn sw_tensor_rank(t: *const sw_tensor) -> u32 {
    // SAFETY: per this function's contract.
    boundary_value(0, || {
        unsafe { t.as_ref() }.map_or(0, |t| t.tensor.dims().len() as u32)
    })
}

/// The tensor's shape, `rank` values owned by the tensor (NULL if `t` is NULL).
///
/// # Safety
/// `t` is NULL or a live tensor handle; the pointer is valid while the handle lives.
#[no_mangle]
pub unsafe extern "C" fn sw_tensor_dims(t: *const sw_tensor) -> *const u64 {
    boundary_value(std::ptr::null(), || {
        // SAFETY: per this function's contract.
        unsafe { t.as_ref() }.map_or(std::ptr::null(), |t| t.tensor.dims().as_ptr())
    })
}

/// The tensor's contents, `sw_tensor_byte_len` bytes owned by the tensor (NULL if `t` is
/// NULL). Read-only: a tensor may be shared.
///
/// # Safety
/// `t` is NULL or a live tensor handle; the pointer is valid while the handle lives.
#[no_mangle]
pub unsafe extern "C" fn sw_tensor_data(t: *const sw_tensor) -> *const c_void {
    boundary_value(std::ptr::null(), || {
        // SAFETY: per this function's contract.
        unsafe { t.as_ref() }.map_or(std::ptr::null(), |t| t.tensor.bytes().as_ptr().cast())
    })
}

/// Bytes of contents (0 if `t` is NULL).
///
/// # Safety
/// `t` is NULL or a live tensor handle.
#[no_mangle]
pub unsafe extern "C" fn sw_tensor_byte_len(t: *const sw_tensor) -> u64 {
    // SAFETY: per this function's contract.
    boundary_value(0, || {
        unsafe { t.as_ref() }.map_or(0, |t| t.tensor.byte_len() as u64)
    })
}

/// Whether the tensor is dead (a rendezvous value whose producer did not run).
///
/// # Safety
/// `t` is NULL or a live tensor handle.
#[no_mangle]
pub unsafe extern "C" fn sw_tensor_is_dead(t: *const sw_tensor) -> bool {
    // SAFETY: per this function's contract.
    boundary_value(false, || {
        unsafe { t.as_ref() }.is_some_and(|t| t.tensor.is_dead())
    })
}

// ----- allocator hook -----

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

/// A C allocator, callable from any thread (its contract says so).
struct CAllocator(sw_allocator);

// SAFETY: `sw_allocator`'s contract requires thread-safe callbacks and user data.
unsafe impl Send for CAllocator {}
// SAFETY: as above.
unsafe impl Sync for CAllocator {}

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
        // SAFETY: `len` bytes at `ptr` stay valid until `release`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes the slice unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for CMemory {
    fn drop(&mut self) {
        if let Some(release) = self.alloc.release {
            // SAFETY: the pointer came from this allocator's `allocate`, released once.
            unsafe { release(self.alloc.user_data, self.ptr.cast(), self.len as u64) };
        }
    }
}

impl TensorAllocator for CAllocator {
    fn allocate(&self, desc: &TensorDesc<'_>) -> Option<Box<dyn TensorMemory>> {
        let len = usize::try_from(desc.byte_len).ok()?;
        if len == 0 {
            return Some(Box::new(Vec::<u8>::new()));
        }
        let allocate = self.0.allocate?;
        // SAFETY: a C callback with valid arguments; `dims` lives for the call.
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

/// # Safety
/// `p` is NULL or a valid `sw_allocator`.
unsafe fn allocator(p: *const sw_allocator) -> Result<Option<Arc<dyn TensorAllocator>>, Failure> {
    // SAFETY: per the caller.
    let Some(a) = (unsafe { p.as_ref() }) else {
        return Ok(None);
    };
    if a.allocate.is_none() {
        return Err(Failure::null("sw_allocator.allocate"));
    }
    Ok(Some(Arc::new(CAllocator(*a))))
}

// ----- service -----

/// A PS task's service, as C callbacks. They run on a loop thread (or a handler thread when
/// `handler_threads > 0`), possibly several at once: they must be thread-safe.
///
/// `pull` gets `n` variable ids and fills, for each `i`, `out_tensors[i]` with a tensor
/// handle whose ownership passes to starwire (from `sw_tensor_new` or `sw_tensor_clone`),
/// or leaves it NULL and sets `out_statuses[i]` to why there is none (wire status codes:
/// 1 `NOT_FOUND`, 7 `INVALID_ARGUMENT`, 8 `INTERNAL`, as in `docs/wire-format.md`).
/// `out_tensors` starts all NULL and `out_statuses` all 0 (`OK`).
///
/// `push` gets `n` pushed tensors, borrowed for the call (`sw_tensor_clone` keeps one), and
/// sets `out_statuses[i]` per item (it starts all 0, `OK`).
///
/// A NULL callback answers its requests with `UNIMPLEMENTED`. Rendezvous recvs are not a
/// callback: they are answered from what the task publishes (`sw_runtime_publish`); rows
/// requests are not either: they are answered by the tables given in `sw_runtime_options`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct sw_service {
    /// Passed to both callbacks.
    pub user_data: *mut c_void,
    /// Answers a pull.
    pub pull: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            ids: *const u64,
            n: usize,
            out_tensors: *mut *mut sw_tensor,
            out_statuses: *mut u32,
        ),
    >,
    /// Applies a push.
    pub push: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            ids: *const u64,
            tensors: *const *const sw_tensor,
            n: usize,
            out_statuses: *mut u32,
        ),
    >,
}

/// A C service and the tables of rows served with it.
struct CService(sw_service, Tables);

// SAFETY: `sw_service`'s contract requires thread-safe callbacks and user data; tables are
// `Send + Sync`.
unsafe impl Send for CService {}
// SAFETY: as above.
unsafe impl Sync for CService {}

impl Service for CService {
    fn table(&self, table: u32) -> Option<&dyn Table> {
        self.1.get(table)
    }

    fn pull(&self, ids: &[u64], out: &mut Vec<Result<Arc<Tensor>, Status>>) {
        let Some(pull) = self.0.pull else {
            out.extend(ids.iter().map(|_| Err(Status::Unimplemented)));
            return;
        };
        let mut tensors: Vec<*mut sw_tensor> = vec![std::ptr::null_mut(); ids.len()];
        let mut statuses = vec![0u32; ids.len()];
        // SAFETY: the arrays hold `ids.len()` elements each and live for the call.
        unsafe {
            pull(
                self.0.user_data,
                ids.as_ptr(),
                ids.len(),
                tensors.as_mut_ptr(),
                statuses.as_mut_ptr(),
            )
        };
        for (t, s) in tensors.into_iter().zip(statuses) {
            out.push(if t.is_null() {
                let s = Status::from(s.min(u16::MAX as u32) as u16);
                Err(if s.is_ok() { Status::NotFound } else { s })
            } else {
                // SAFETY: the callback passed ownership of a handle made by starwire.
                Ok(unsafe { Box::from_raw(t) }.tensor)
            });
        }
    }

    fn push(&self, items: &mut Vec<(u64, Tensor)>, statuses: &mut Vec<Status>) {
        let Some(push) = self.0.push else {
            statuses.extend(items.iter().map(|_| Status::Unimplemented));
            return;
        };
        let ids: Vec<u64> = items.iter().map(|(id, _)| *id).collect();
        let handles: Vec<sw_tensor> = items
            .drain(..)
            .map(|(_, t)| sw_tensor::owned(Arc::new(t)))
            .collect();
        let ptrs: Vec<*const sw_tensor> = handles.iter().map(|h| h as *const _).collect();
        let mut out = vec![0u32; ids.len()];
        // SAFETY: the arrays hold `ids.len()` elements each and live for the call.
        unsafe {
            push(
                self.0.user_data,
                ids.as_ptr(),
                ptrs.as_ptr(),
                ids.len(),
                out.as_mut_ptr(),
            )
        };
        statuses.extend(
            out.into_iter()
                .map(|s| Status::from(s.min(u16::MAX as u32) as u16)),
        );
    }
}

// ----- tables -----

/// How a reference in-memory table creates rows: the `kind` of `sw_init`.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum sw_init_kind {
    /// Rows start at zero; a pull of an unknown id creates its row.
    SW_INIT_ZEROS = 0,
    /// A pull creates no row: unknown ids are reported missing (their bytes are zero). A
    /// push to an unknown id creates its row at zero.
    SW_INIT_MISSING = 1,
    /// Each element uniform in `[-scale, scale]`, a fixed function of (id, element, seed),
    /// so every PS task and every run agree; a pull of an unknown id creates its row.
    SW_INIT_UNIFORM = 2,
}

/// How a reference in-memory table creates rows.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sw_init {
    /// A `sw_init_kind`.
    pub kind: u32,
    /// `SW_INIT_UNIFORM`: half-width of the range (finite, at least 0). Otherwise unused.
    pub scale: f32,
    /// `SW_INIT_UNIFORM`: selects the values. Otherwise unused.
    pub seed: u64,
}

/// How a reference in-memory table applies a gradient row `g` to a row `w`: the `kind` of
/// `sw_optimizer`.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum sw_optimizer_kind {
    /// `w -= lr * g`, element by element.
    SW_OPTIMIZER_SGD = 0,
    /// `acc += g * g; w -= lr * g / sqrt(acc)`, element by element, `acc` starting at
    /// `initial_accumulator`.
    SW_OPTIMIZER_ADAGRAD = 1,
}

/// How a reference in-memory table applies gradients.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sw_optimizer {
    /// A `sw_optimizer_kind`.
    pub kind: u32,
    /// Learning rate (finite).
    pub lr: f32,
    /// `SW_OPTIMIZER_ADAGRAD`: each element's squared-gradient sum when its row is created
    /// (finite, greater than 0). Otherwise unused.
    pub initial_accumulator: f32,
}

/// A table of embedding rows a PS task serves (shared: a runtime serving it keeps its own
/// reference, and freeing a handle drops one).
pub struct sw_table {
    table: Arc<dyn Table>,
}

fn init_of(init: sw_init) -> Result<Init, Failure> {
    match init.kind {
        k if k == sw_init_kind::SW_INIT_ZEROS as u32 => Ok(Init::Zeros),
        k if k == sw_init_kind::SW_INIT_MISSING as u32 => Ok(Init::Missing),
        k if k == sw_init_kind::SW_INIT_UNIFORM as u32 => {
            if !(init.scale.is_finite() && init.scale >= 0.0) {
                return Err(Failure::invalid(format!(
                    "init.scale {} is not a finite value of at least 0",
                    init.scale
                )));
            }
            Ok(Init::Uniform {
                scale: init.scale,
                seed: init.seed,
            })
        }
        k => Err(Failure::invalid(format!(
            "init.kind {k} is not a sw_init_kind"
        ))),
    }
}

fn optimizer_of(o: sw_optimizer) -> Result<Optimizer, Failure> {
    if !o.lr.is_finite() {
        return Err(Failure::invalid(format!(
            "optimizer.lr {} is not finite",
            o.lr
        )));
    }
    match o.kind {
        k if k == sw_optimizer_kind::SW_OPTIMIZER_SGD as u32 => Ok(Optimizer::Sgd { lr: o.lr }),
        k if k == sw_optimizer_kind::SW_OPTIMIZER_ADAGRAD as u32 => {
            let acc = o.initial_accumulator;
            if !(acc.is_finite() && acc > 0.0) {
                return Err(Failure::invalid(format!(
                    "optimizer.initial_accumulator {acc} is not a finite value above 0"
                )));
            }
            Ok(Optimizer::Adagrad {
                lr: o.lr,
                initial_accumulator: acc,
            })
        }
        k => Err(Failure::invalid(format!(
            "optimizer.kind {k} is not a sw_optimizer_kind"
        ))),
    }
}

/// Creates the reference in-memory table: rows of `dim` float32 (dtype 10, row shape
/// `{dim}`), created as `init` says and updated by `optimizer`; safe to serve from every
/// loop at once. Serve it by giving it to `sw_runtime_options.tables`. On `SW_OK`, `*out` is
/// a new handle the caller frees with `sw_table_free`.
///
/// Fails with `SW_ERR_INVALID_ARGUMENT` for a `dim` of 0 or above 2^32 - 1, an unknown
/// kind, or a parameter out of range (see `sw_init` and `sw_optimizer`).
///
/// # Safety
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn sw_mem_table_new(
    dim: usize,
    init: sw_init,
    optimizer: sw_optimizer,
    out: *mut *mut sw_table,
) -> sw_result {
    boundary(|| {
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        if dim == 0 || dim > u32::MAX as usize {
            return Err(Failure::invalid(format!("dim {dim} is not 1 to 2^32 - 1")));
        }
        let table = MemTable::new(dim, init_of(init)?, optimizer_of(optimizer)?);
        let handle = Box::new(sw_table {
            table: Arc::new(table),
        });
        // SAFETY: checked non-null above.
        unsafe { write(out, Box::into_raw(handle)) };
        Ok(())
    })
}

/// Releases a table handle (a runtime serving the table keeps serving it). NULL is ignored.
///
/// # Safety
/// `t` is NULL or a handle from starwire not freed before.
#[no_mangle]
pub unsafe extern "C" fn sw_table_free(t: *mut sw_table) {
    boundary_value((), || {
        if !t.is_null() {
            // SAFETY: made by `Box::into_raw` in `sw_mem_table_new`, freed once.
            drop(unsafe { Box::from_raw(t) });
        }
    })
}

/// The registry of `options`' tables.
///
/// # Safety
/// `ids` and `tables` point at `n` values each (may be NULL when `n` is 0); each table is
/// NULL or a live handle.
unsafe fn tables_of(
    ids: *const u32,
    tables: *const *const sw_table,
    n: usize,
) -> Result<Tables, Failure> {
    // SAFETY: per the caller.
    let (ids, ts) = unsafe {
        (
            slice(ids, n, "options.table_ids")?,
            slice(tables, n, "options.tables")?,
        )
    };
    let mut registry = Tables::new();
    for (i, (&id, &t)) in ids.iter().zip(ts).enumerate() {
        // SAFETY: per the caller.
        let t = unsafe { reference(t, &format!("options.tables[{i}]")) }?;
        if registry.get(id).is_some() {
            return Err(Failure::invalid(format!("table id {id} given twice")));
        }
        registry = registry.with(id, t.table.clone());
    }
    Ok(registry)
}

// ----- runtime -----

/// How to start a runtime. Settings are named by their environment variables
/// (`STARWIRE_BACKEND`, `NETWORK_PS_CORE_NUMBER`, `STARWIRE_CLUSTER_TOKEN`, ... see
/// `docs/tuning.md`) and validated the same way.
#[repr(C)]
pub struct sw_runtime_options {
    /// Job name (`ps`, `worker`, `chief`, ...): decides which role variables apply. Required.
    pub job: *const c_char,
    /// Task index within the job.
    pub task_index: u32,
    /// `settings` names and values (NUL-terminated strings); may be NULL when 0.
    pub setting_names: *const *const c_char,
    /// Values, in the order of `setting_names`.
    pub setting_values: *const *const c_char,
    /// Number of settings.
    pub settings: usize,
    /// Whether settings not given are read from the process environment.
    pub use_env: bool,
    /// `host:port` to listen on (port 0 picks one), or NULL for a client-only runtime.
    pub listen: *const c_char,
    /// The PS service, or NULL.
    pub service: *const sw_service,
    /// Memory for received tensors, or NULL for starwire's heap allocator.
    pub allocator: *const sw_allocator,
    /// Handler threads for the service (0: handlers run inline on the loops).
    pub handler_threads: u32,
    /// Ids of the tables of embedding rows served (`PULL_ROWS`, `PUSH_ROWS`): `tables[i]` is
    /// served as table `table_ids[i]`, ids distinct; may be NULL when `n_tables` is 0. A
    /// table not given is answered `NOT_FOUND`.
    pub table_ids: *const u32,
    /// The tables, in the order of `table_ids` (from `sw_mem_table_new` or `sw_table_new`). The runtime keeps
    /// its own references: the caller may free its handles once `sw_runtime_new` returns.
    pub tables: *const *const sw_table,
    /// Number of tables.
    pub n_tables: usize,
}

/// A running starwire runtime: event loops, and the task's rendezvous.
pub struct sw_runtime {
    runtime: Runtime,
    rendezvous: Arc<Rendezvous>,
    /// Where its settings came from, for the embedded clients made from it.
    source: ConfigSource,
    /// Its allocator hooks, which its embedded clients use too.
    allocator: Option<Arc<dyn TensorAllocator>>,
}

/// `n` settings given as two arrays of strings, names and values.
///
/// # Safety
/// `names` and `values` point at `n` NUL-terminated strings each (may be NULL when `n` is 0).
unsafe fn settings_of(
    names: *const *const c_char,
    values: *const *const c_char,
    n: usize,
) -> Result<Vec<(String, std::ffi::OsString)>, Failure> {
    // SAFETY: per this function's contract.
    let names = unsafe { slice(names, n, "setting_names") }?;
    // SAFETY: per this function's contract.
    let values = unsafe { slice(values, n, "setting_values") }?;
    let mut settings = Vec::with_capacity(n);
    for (&n, &v) in names.iter().zip(values) {
        // SAFETY: per this function's contract.
        let (n, v) = unsafe { (string(n, "setting name")?, string(v, "setting value")?) };
        settings.push((n.to_string(), std::ffi::OsString::from(v)));
    }
    Ok(settings)
}

/// A runtime's settings as given: read again, with more on top, for its embedded clients.
struct ConfigSource {
    job: String,
    task_index: u32,
    settings: Vec<(String, std::ffi::OsString)>,
    use_env: bool,
}

impl ConfigSource {
    /// The configuration of these settings, with `more` given on top of them.
    fn config(&self, more: &[(String, std::ffi::OsString)]) -> Result<Config, Failure> {
        let lookup = |name: &str| {
            let given = more
                .iter()
                .chain(&self.settings)
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone());
            given.or_else(|| {
                if self.use_env {
                    std::env::var_os(name)
                } else {
                    None
                }
            })
        };
        ConfigBuilder::from_lookup(&self.job, self.task_index, lookup)
            .and_then(|b| b.build())
            .map_err(|e| Failure::new(SW_ERR_CONFIG, e.to_string()))
    }
}

/// Starts a runtime. On `SW_OK`, `*out` is a runtime the caller stops with
/// `sw_runtime_free`.
///
/// # Safety
/// `options` points at valid options (their strings NUL-terminated, arrays of `settings`
/// and `n_tables` entries, tables live handles); `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn sw_runtime_new(
    options: *const sw_runtime_options,
    out: *mut *mut sw_runtime,
) -> sw_result {
    boundary(|| {
        // SAFETY: per this function's contract.
        let o = unsafe { reference(options, "options") }?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        // SAFETY: per this function's contract.
        let job = unsafe { string(o.job, "options.job") }?;
        // SAFETY: per this function's contract.
        let settings = unsafe { settings_of(o.setting_names, o.setting_values, o.settings) }?;
        let source = ConfigSource {
            job: job.to_string(),
            task_index: o.task_index,
            settings,
            use_env: o.use_env,
        };
        let config = source.config(&[])?;
        let listen = if o.listen.is_null() {
            None
        } else {
            // SAFETY: per this function's contract.
            Some(unsafe { address(o.listen, "options.listen") }?)
        };
        // SAFETY: per this function's contract.
        let tables = unsafe { tables_of(o.table_ids, o.tables, o.n_tables) }?;
        // SAFETY: per this function's contract.
        let service = match (unsafe { o.service.as_ref() }, tables.is_empty()) {
            (None, true) => None,
            (s, _) => {
                let callbacks = s.copied().unwrap_or(sw_service {
                    user_data: std::ptr::null_mut(),
                    pull: None,
                    push: None,
                });
                Some(Arc::new(CService(callbacks, tables)) as Arc<dyn Service>)
            }
        };
        let rendezvous = Rendezvous::new();
        // SAFETY: per this function's contract.
        let allocator = unsafe { allocator(o.allocator) }?;
        let options = Options {
            listen,
            service,
            rendezvous: Some(rendezvous.clone()),
            allocator: allocator.clone(),
            handler_threads: Some(o.handler_threads as usize),
            ..Options::default()
        };
        let runtime = Runtime::start_with(config, options)
            .map_err(|e| Failure::new(SW_ERR_IO, format!("starting the runtime: {e}")))?;
        let rt = Box::new(sw_runtime {
            runtime,
            rendezvous,
            source,
            allocator,
        });
        // SAFETY: checked non-null above.
        unsafe { write(out, Box::into_raw(rt)) };
        Ok(())
    })
}

/// The port the runtime listens on (0 if it does not listen, or `rt` is NULL).
///
/// # Safety
/// `rt` is NULL or a live runtime.
#[no_mangle]
pub unsafe extern "C" fn sw_runtime_port(rt: *const sw_runtime) -> u16 {
    boundary_value(0, || {
        // SAFETY: per this function's contract.
        unsafe { rt.as_ref() }
            .and_then(|r| r.runtime.local_addr())
            .map_or(0, |a| a.port())
    })
}

/// Publishes `tensor` under `key` (`key_len` bytes) in this task's rendezvous: a recv of
/// `key` from a peer, waiting or future, gets it, exactly once. The tensor is shared, not
/// copied; the caller keeps its handle.
///
/// # Safety
/// `rt` and `tensor` are live handles; `key` points at `key_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn sw_runtime_publish(
    rt: *const sw_runtime,
    key: *const u8,
    key_len: usize,
    tensor: *const sw_tensor,
) -> sw_result {
    boundary(|| {
        // SAFETY: per this function's contract.
        let (rt, t) = unsafe { (reference(rt, "rt")?, reference(tensor, "tensor")?) };
        // SAFETY: per this function's contract.
        let key = unsafe { slice(key, key_len, "key") }?;
        if key.is_empty() {
            return Err(Failure::invalid("empty rendezvous key"));
        }
        rt.rendezvous
            .publish(key, t.tensor.clone())
            .map_err(|e| Failure::new(SW_ERR_ALREADY_PUBLISHED, e.to_string()))
    })
}

/// Fails every recv of `step` still waiting in this task's rendezvous (status `ABORTED`).
///
/// # Safety
/// `rt` is a live runtime.
#[no_mangle]
pub unsafe extern "C" fn sw_runtime_abort_step(rt: *const sw_runtime, step: u64) -> sw_result {
    boundary(|| {
        // SAFETY: per this function's contract.
        unsafe { reference(rt, "rt") }?.rendezvous.abort_step(step);
        Ok(())
    })
}

/// Counters of all the runtime's loops.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct sw_stats {
    /// Frames received.
    pub frames_in: u64,
    /// Frames sent.
    pub frames_out: u64,
    /// Bytes received.
    pub bytes_in: u64,
    /// Bytes sent.
    pub bytes_out: u64,
    /// Requests completed successfully.
    pub requests_completed: u64,
    /// Requests failed.
    pub requests_failed: u64,
    /// Connections accepted.
    pub connections_accepted: u64,
    /// Connections opened to peers.
    pub connections_opened: u64,
    /// Connections lost.
    pub connections_lost: u64,
    /// Tensor payload bytes received straight into tensor memory.
    pub payload_direct: u64,
    /// Tensor payload bytes copied out of receive buffers.
    pub payload_copied: u64,
}

/// Writes a snapshot of the runtime's counters to `*out`.
///
/// # Safety
/// `rt` is a live runtime; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn sw_runtime_stats(rt: *const sw_runtime, out: *mut sw_stats) -> sw_result {
    boundary(|| {
        // SAFETY: per this function's contract.
        let rt = unsafe { reference(rt, "rt") }?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        // SAFETY: checked non-null above.
        unsafe { write(out, sw_stats::of(&rt.runtime.stats())) };
        Ok(())
    })
}

impl sw_stats {
    fn of(s: &starwire::Stats) -> sw_stats {
        sw_stats {
            frames_in: s.frames_in,
            frames_out: s.frames_out,
            bytes_in: s.bytes_in,
            bytes_out: s.bytes_out,
            requests_completed: s.completed.iter().sum(),
            requests_failed: s.failed.iter().sum(),
            connections_accepted: s.connections_accepted,
            connections_opened: s.connections_opened,
            connections_lost: s.connections_lost,
            payload_direct: s.payload_direct,
            payload_copied: s.payload_copied,
        }
    }
}

/// Writes a snapshot of an embedded client's counters (those of its own loop, which the
/// runtime's do not include) to `*out`. `SW_ERR_INVALID_ARGUMENT` for a client of the
/// runtime's loops: its requests are in `sw_runtime_stats`.
///
/// # Safety
/// `c` is a live client used by this thread only; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn sw_client_loop_stats(c: *mut sw_client, out: *mut sw_stats) -> sw_result {
    boundary(|| {
        // SAFETY: per this function's contract.
        let client = unsafe { client_mut(c) }?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let Driven::Caller(caller) = &client.driven else {
            return Err(Failure::invalid(
                "not an embedded client: its requests are in its runtime's stats",
            ));
        };
        // SAFETY: checked non-null above.
        unsafe { write(out, sw_stats::of(&caller.client.stats())) };
        Ok(())
    })
}

/// Stops the runtime: in-flight requests fail with `SW_ERR_SHUTDOWN`, loops are joined.
/// Free every client of this runtime first. NULL is ignored.
///
/// # Safety
/// `rt` is NULL or a runtime from `sw_runtime_new` not freed before.
#[no_mangle]
pub unsafe extern "C" fn sw_runtime_free(rt: *mut sw_runtime) {
    boundary_value((), || {
        if !rt.is_null() {
            // SAFETY: made by `Box::into_raw` in `sw_runtime_new`, freed once.
            let rt = unsafe { Box::from_raw(rt) };
            rt.runtime.shutdown();
        }
    })
}

// ----- replies -----

/// The answer to a request: per item, a tensor or a status (a pull or recv); per item, a
/// status (a push, a rows push); per table, a status and the rows missing (a rows pull,
/// whose rows are in the caller's memory); or a round-trip time (a ping).
pub struct sw_reply {
    tensors: Vec<Option<sw_tensor>>,
    statuses: Vec<u32>,
    rtt_us: f64,
    /// A rows pull: the positions of the missing rows, all tables'.
    missing: Vec<u32>,
    /// A rows pull: per table, where its positions are in `missing` (start, count).
    spans: Vec<(usize, usize)>,
}

/// The reply of `reply`; for a rows pull, its blocks are put in `targets` first (when
/// given), and dropped.
fn reply_of(reply: Reply, targets: Option<&RowsTargets>) -> sw_reply {
    let mut r = sw_reply {
        tensors: Vec::new(),
        statuses: Vec::new(),
        rtt_us: 0.0,
        missing: Vec::new(),
        spans: Vec::new(),
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
        }
        Reply::Pulled(items) | Reply::Received(items) => {
            for item in items {
                match item {
                    Ok(t) => {
                        r.tensors.push(Some(sw_tensor::owned(Arc::new(t))));
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

/// The wire status code of a block (0 for a block).
fn status_code<T>(block: Result<T, Status>) -> u32 {
    block.err().map_or(0, |s| u16::from(s) as u32)
}

/// A completion as C sees it: the result code and, on success, a reply (a rows pull's
/// blocks put in `targets`).
fn outcome(
    result: Result<Reply, Error>,
    targets: Option<&RowsTargets>,
) -> (sw_result, Option<Box<sw_reply>>) {
    match result {
        Ok(reply) => (SW_OK, Some(Box::new(reply_of(reply, targets)))),
        Err(e) => {
            let failure = Failure::from(e);
            record(&failure);
            (failure.code, None)
        }
    }
}

/// Items in the reply: ids, keys, pushed items, or tables of a rows request (0 for a ping,
/// or if `r` is NULL).
///
/// # Safety
/// `r` is NULL or a live reply.
#[no_mangle]
pub unsafe extern "C" fn sw_reply_count(r: *const sw_reply) -> usize {
    // SAFETY: per this function's contract.
    boundary_value(0, || unsafe { r.as_ref() }.map_or(0, |r| r.statuses.len()))
}

/// Item `i`'s wire status: 0 (`OK`) or why it failed (1 `NOT_FOUND`, 6
/// `RESOURCE_EXHAUSTED` when the allocator refused, ... as in `docs/wire-format.md`).
/// `u32::MAX` if out of range.
///
/// # Safety
/// `r` is NULL or a live reply.
#[no_mangle]
pub unsafe extern "C" fn sw_reply_status(r: *const sw_reply, i: usize) -> u32 {
    boundary_value(u32::MAX, || {
        // SAFETY: per this function's contract.
        unsafe { r.as_ref() }
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
pub unsafe extern "C" fn sw_reply_tensor(r: *const sw_reply, i: usize) -> *const sw_tensor {
    boundary_value(std::ptr::null(), || {
        // SAFETY: per this function's contract.
        unsafe { r.as_ref() }
            .and_then(|r| r.tensors.get(i))
            .and_then(|t| t.as_ref())
            .map_or(std::ptr::null(), |t| t as *const sw_tensor)
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
pub unsafe extern "C" fn sw_reply_take_tensor(r: *mut sw_reply, i: usize) -> *mut sw_tensor {
    boundary_value(std::ptr::null_mut(), || {
        // SAFETY: per this function's contract.
        unsafe { r.as_mut() }
            .and_then(|r| r.tensors.get_mut(i))
            .and_then(Option::take)
            .map_or(std::ptr::null_mut(), |t| Box::into_raw(Box::new(t)))
    })
}

/// A ping's round-trip time in microseconds (0 for other replies).
///
/// # Safety
/// `r` is NULL or a live reply.
#[no_mangle]
pub unsafe extern "C" fn sw_reply_rtt_us(r: *const sw_reply) -> f64 {
    // SAFETY: per this function's contract.
    boundary_value(0.0, || unsafe { r.as_ref() }.map_or(0.0, |r| r.rtt_us))
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
pub unsafe extern "C" fn sw_reply_missing(
    r: *const sw_reply,
    t: usize,
    positions: *mut u32,
    capacity: usize,
    count: *mut usize,
) -> sw_result {
    boundary(|| {
        // SAFETY: per this function's contract.
        let r = unsafe { reference(r, "reply") }?;
        if count.is_null() {
            return Err(Failure::null("count"));
        }
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
            if positions.is_null() {
                return Err(Failure::null("positions"));
            }
            // SAFETY: `positions` has room for `capacity >= n` values per the contract, and
            // is not memory of the reply.
            unsafe { std::ptr::copy_nonoverlapping(r.missing[start..].as_ptr(), positions, n) };
        }
        // SAFETY: checked non-null above.
        unsafe { write(count, n) };
        Ok(())
    })
}

/// Releases a reply and the tensors it still holds. NULL is ignored.
///
/// # Safety
/// `r` is NULL or a reply from starwire not freed before.
#[no_mangle]
pub unsafe extern "C" fn sw_reply_free(r: *mut sw_reply) {
    boundary_value((), || {
        if !r.is_null() {
            // SAFETY: made by `Box::into_raw` in this crate, freed once.
            drop(unsafe { Box::from_raw(r) });
        }
    })
}

// ----- clients -----

/// A thread's way to submit requests. Used by one thread at a time (a client of the
/// runtime's loops may move between threads; an embedded one stays on the thread that made
/// it); make one per submitting thread.
pub struct sw_client {
    driven: Driven,
    /// Whether completions go to a callback (no `sw_client_wait`).
    callback: bool,
    /// Rows pulls not yet waited for, by tag: the caller's buffers their blocks go to.
    rows: HashMap<u64, Arc<RowsTargets>>,
    /// For a client with a callback: its rows pulls in flight, shared with the callback.
    callback_rows: Option<Arc<CallbackRows>>,
    /// Completions reported by `sw_client_poll` or `sw_client_wait_any`, kept for
    /// `sw_client_wait`.
    ready: HashMap<u64, Completion>,
}

/// What moves a client's requests.
// The common kind stays inline (no pointer to follow per call); the embedded one, larger
// still, is boxed.
#[allow(clippy::large_enum_variant)]
enum Driven {
    /// The runtime's loop threads; the caller's thread only waits.
    Threads(Handle),
    /// A loop of the client's own, run by the thread that made it (`sw_client_new_embedded`).
    Caller(Box<CallerDriven>),
}

/// An embedded client, and the thread that made it: its only driver (an io_uring ring
/// made for a single issuer refuses any other thread).
struct CallerDriven {
    client: Embedded,
    owner: ThreadId,
}

/// Runs `$body` with `$h` bound to the client's [`starwire::Client`], whatever drives it.
macro_rules! with_client {
    ($client:expr, |$h:ident| $body:expr) => {
        match &mut $client.driven {
            $crate::Driven::Threads($h) => $body,
            $crate::Driven::Caller(caller) => {
                let $h = &mut caller.client;
                $body
            }
        }
    };
}
pub(crate) use with_client;

/// `c` as a client this thread may use: `SW_ERR_INVALID_ARGUMENT` for an embedded client
/// made by another thread.
///
/// # Safety
/// As [`reference_mut`].
unsafe fn client_mut<'a>(c: *mut sw_client) -> Result<&'a mut sw_client, Failure> {
    // SAFETY: per the caller.
    let client = unsafe { reference_mut(c, "client") }?;
    if let Driven::Caller(caller) = &client.driven {
        if caller.owner != std::thread::current().id() {
            return Err(Failure::invalid(
                "an embedded client is used only by the thread that made it",
            ));
        }
    }
    Ok(client)
}

impl sw_client {
    fn new(driven: Driven, callback: bool) -> sw_client {
        sw_client {
            driven,
            callback,
            rows: HashMap::new(),
            callback_rows: None,
            ready: HashMap::new(),
        }
    }

    /// Waits until starwire holds none of `targets`' buffers (a rows pull given up
    /// mid-transfer may still be receiving into them). An embedded client runs its loop
    /// meanwhile: nothing else would.
    /// After a submission: an embedded client's loop turned once, so that the request goes
    /// out now, not at the next wait (the caller may compute meanwhile).
    fn submitted(&mut self) {
        if let Driven::Caller(caller) = &mut self.driven {
            caller.client.drive(Some(Duration::ZERO));
        }
    }

    fn wait_released(&mut self, targets: &RowsTargets) {
        match &mut self.driven {
            Driven::Threads(_) => targets.wait_released(),
            Driven::Caller(caller) => {
                while targets.held() {
                    caller.client.drive(Some(Duration::from_millis(1)));
                }
            }
        }
    }
}

/// The rows pulls in flight of a client with a callback, by tag, for the callback to find
/// the caller's buffers of each (`count` spares it the lock for other completions).
#[derive(Default)]
struct CallbackRows {
    pending: Mutex<HashMap<u64, Arc<RowsTargets>>>,
    count: std::sync::atomic::AtomicUsize,
}

/// A reply on its way to a callback that waits for the caller's buffers.
struct Deferred(Box<dyn FnOnce() + Send>);

/// A reply pointer handed to a callback later, maybe on another thread.
struct ReplyPtr(*mut sw_reply);

// SAFETY: the reply is owned by this value alone until the callback takes it.
unsafe impl Send for ReplyPtr {}

/// A client of `rt` with room for `capacity` requests in flight, whose completions are
/// taken with `sw_client_wait`. Free it with `sw_client_free` before its runtime.
///
/// # Safety
/// `rt` is a live runtime; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn sw_client_new(
    rt: *const sw_runtime,
    capacity: u32,
    out: *mut *mut sw_client,
) -> sw_result {
    // SAFETY: per this function's contract.
    unsafe {
        new_client(rt, out, |rt| {
            let handle = rt.runtime.handle(capacity.max(1) as usize);
            Ok(sw_client::new(Driven::Threads(handle), false))
        })
    }
}

/// The common part of making a client: checks `rt` and `out`, makes the client with
/// `make`, and writes it to `out`.
///
/// # Safety
/// `rt` is NULL or a live runtime; `out` is NULL or writable.
unsafe fn new_client(
    rt: *const sw_runtime,
    out: *mut *mut sw_client,
    make: impl FnOnce(&sw_runtime) -> Result<sw_client, Failure>,
) -> sw_result {
    boundary(|| {
        // SAFETY: per the caller.
        let rt = unsafe { reference(rt, "rt") }?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let client = Box::new(make(rt)?);
        // SAFETY: checked non-null above.
        unsafe { write(out, Box::into_raw(client)) };
        Ok(())
    })
}

/// A client that runs an event loop of its own on the calling thread, instead of handing
/// its requests to the runtime's loops: an *embedded* client. No thread hop on either
/// side of a request, and no loop thread to share a CPU with; in exchange the client moves
/// only while its thread is inside one of its calls (a wait, a poll, a submission), and
/// only the thread that made it may use it (`SW_ERR_INVALID_ARGUMENT` on any other) and
/// free it (`sw_client_free` on another frees nothing).
///
/// A submission turns the loop once, which sends the request at once on a connection that
/// is up; connecting, and taking in the answer, happen during the calls that wait or poll.
/// Its settings are those `rt` was made with (its
/// job, task and settings, and, with `use_env`, the environment as it is now), with the
/// `settings` given here on top: `WORKER_ENABLE_POLLING=true` (or the PS's) makes its waits
/// busy-poll; otherwise they spin for `STARWIRE_SPIN_US`, or twice the client's recent
/// average wait when longer (up to 250 µs), before they sleep in the kernel. It uses the runtime's allocator hooks, called on this thread during its calls
/// (not on a loop thread); it has no limit on requests in flight and no callback form. It
/// is a client only: it does not listen, and it does not serve. Free it before its
/// runtime.
///
/// # Safety
/// `rt` is a live runtime; `setting_names` and `setting_values` point at `settings`
/// NUL-terminated strings each (NULL allowed when `settings` is 0); `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn sw_client_new_embedded(
    rt: *const sw_runtime,
    setting_names: *const *const c_char,
    setting_values: *const *const c_char,
    settings: usize,
    out: *mut *mut sw_client,
) -> sw_result {
    let make = |rt: &sw_runtime| {
        // SAFETY: per this function's contract.
        let more = unsafe { settings_of(setting_names, setting_values, settings) }?;
        let config = rt.source.config(&more)?;
        let options = Options {
            allocator: rt.allocator.clone(),
            ..Options::default()
        };
        let client = Embedded::with_options(config, options)
            .map_err(|e| Failure::new(SW_ERR_IO, format!("starting an embedded client: {e}")))?;
        let driven = Driven::Caller(Box::new(CallerDriven {
            client,
            owner: std::thread::current().id(),
        }));
        Ok(sw_client::new(driven, false))
    };
    // SAFETY: per this function's contract.
    unsafe { new_client(rt, out, make) }
}

/// Callback and user data, callable from loop threads (the callback's contract says so).
struct CCallback(
    unsafe extern "C" fn(*mut c_void, u64, sw_result, *mut sw_reply),
    *mut c_void,
);
// SAFETY: `sw_completion_fn` callers promise thread-safe callbacks and user data.
unsafe impl Send for CCallback {}
// SAFETY: as above.
unsafe impl Sync for CCallback {}

impl CCallback {
    fn call(&self, tag: u64, code: sw_result, reply: *mut sw_reply) {
        // SAFETY: a C callback with the caller's user data; the reply's ownership passes to
        // it.
        unsafe { (self.0)(self.1, tag, code, reply) };
    }
}

/// A client whose completions are delivered to `callback` (with `user_data`) instead of
/// through `sw_client_wait`: it is called once per completed request, on a loop thread
/// (keep it short; it must not wait on a client). `result` is the request's outcome;
/// `reply` is its answer when `result` is `SW_OK` (owned by the callback: free it with
/// `sw_reply_free`), NULL otherwise.
///
/// # Safety
/// `rt` is a live runtime; `callback` and `user_data` are safe to use from loop threads
/// until the client's runtime is freed; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn sw_client_new_with_callback(
    rt: *const sw_runtime,
    capacity: u32,
    callback: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            tag: u64,
            result: sw_result,
            reply: *mut sw_reply,
        ),
    >,
    user_data: *mut c_void,
    out: *mut *mut sw_client,
) -> sw_result {
    // SAFETY: per this function's contract.
    unsafe {
        new_client(rt, out, |rt| {
            let callback = callback.ok_or_else(|| Failure::null("callback"))?;
            let cb = Arc::new(CCallback(callback, user_data));
            let rows = Arc::new(CallbackRows::default());
            let shared = rows.clone();
            let handle = rt.runtime.handle_with_callback(
                capacity.max(1) as usize,
                Arc::new(move |c: Completion| {
                    let tag = c.tag;
                    let targets = if shared.count.load(std::sync::atomic::Ordering::Acquire) > 0 {
                        let t = lock(&shared.pending).remove(&tag);
                        if t.is_some() {
                            shared
                                .count
                                .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                        }
                        t
                    } else {
                        None
                    };
                    let (code, reply) = outcome(c.result, targets.as_deref());
                    let reply = ReplyPtr(reply.map_or(std::ptr::null_mut(), Box::into_raw));
                    let cb = cb.clone();
                    let call = move || {
                        let reply = reply;
                        cb.call(tag, code, reply.0)
                    };
                    match targets {
                        // The reply waits until starwire holds none of the caller's buffers (a
                        // pull given up mid-transfer may still be receiving into them).
                        Some(t) => t.when_released(Deferred(Box::new(call))),
                        None => call(),
                    }
                }),
            );
            let mut client = sw_client::new(Driven::Threads(handle), true);
            client.callback_rows = Some(rows);
            Ok(client)
        })
    }
}

/// Releases a client. Its rows pulls still in flight are waited for first (they write into
/// the caller's buffers); its other requests still in flight complete unobserved. NULL is
/// ignored.
///
/// An embedded client is freed only by the thread that made it: on another thread this
/// frees nothing and `sw_last_error` says so (this function returns nothing). The client
/// is left as it was, for its own thread to use and free; until then its buffers and
/// tensors in flight stay in use, as for any request not waited for.
///
/// # Safety
/// `c` is NULL or a client from starwire not freed before, and no other thread is inside
/// a call with it.
#[no_mangle]
pub unsafe extern "C" fn sw_client_free(c: *mut sw_client) {
    boundary_value((), || {
        if !c.is_null() {
            // SAFETY: made by `Box::into_raw` in this crate, freed once.
            let mut client = unsafe { Box::from_raw(c) };
            if let Driven::Caller(caller) = &client.driven {
                if caller.owner != std::thread::current().id() {
                    // Only its own thread can run its loop, which may still be receiving
                    // into the caller's buffers, or hold requests in the kernel: it is
                    // left for that thread.
                    let f = Failure::invalid(
                        "sw_client_free: an embedded client is freed only by the thread that \
                         made it; nothing was freed",
                    );
                    log::error!("{}", f.msg);
                    record(&f);
                    std::mem::forget(client);
                    return;
                }
            }
            // Completions already reported (`sw_client_poll`, `sw_client_wait_any`) and not
            // waited for: dropped, giving back the buffers their rows hold.
            client.ready.clear();
            for (tag, targets) in std::mem::take(&mut client.rows) {
                drop(with_client!(client, |h| h.wait_tag(tag)));
                client.wait_released(&targets);
            }
            if let Some(cb) = &client.callback_rows {
                // A callback client's rows pulls: until each has been handed to the callback
                // (which happens once the caller's buffers are back).
                while cb.count.load(std::sync::atomic::Ordering::Acquire) > 0 {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
        }
    })
}

/// The common part of every submission: checks `c`, `peer` and `tag`, submits, writes the
/// tag.
///
/// # Safety
/// As the submitting functions.
unsafe fn submit(
    c: *mut sw_client,
    peer: *const c_char,
    tag: *mut u64,
    f: impl FnOnce(&mut sw_client, SocketAddr) -> Result<u64, Error>,
) -> sw_result {
    boundary(|| {
        // SAFETY: per the caller.
        let client = unsafe { client_mut(c) }?;
        // SAFETY: per the caller.
        let peer = unsafe { address(peer, "peer") }?;
        if tag.is_null() {
            return Err(Failure::null("tag"));
        }
        let t = f(client, peer)?;
        client.submitted();
        // SAFETY: checked non-null above.
        unsafe { write(tag, t) };
        Ok(())
    })
}

/// Pings `peer` (`host:port`) with `payload` bytes. `timeout_ms` 0: no deadline. On `SW_OK`,
/// `*tag` names the request.
///
/// # Safety
/// `c` is a live client used by this thread only; `peer` a NUL-terminated string; `tag`
/// writable.
#[no_mangle]
pub unsafe extern "C" fn sw_client_ping(
    c: *mut sw_client,
    peer: *const c_char,
    payload: u32,
    timeout_ms: u64,
    tag: *mut u64,
) -> sw_result {
    // SAFETY: per this function's contract.
    unsafe {
        submit(c, peer, tag, |client, p| {
            with_client!(client, |h| h
                .ping(p, payload, deadline(timeout_ms))
                .map(|t| t.tag()))
        })
    }
}

/// Pulls variables `ids[0..n]` from `peer`: the reply has one tensor (or status) per id,
/// in memory from the runtime's allocator.
///
/// # Safety
/// As `sw_client_ping`; `ids` points at `n` values.
#[no_mangle]
pub unsafe extern "C" fn sw_client_pull(
    c: *mut sw_client,
    peer: *const c_char,
    ids: *const u64,
    n: usize,
    timeout_ms: u64,
    tag: *mut u64,
) -> sw_result {
    // SAFETY: per this function's contract.
    let ids = match unsafe { slice(ids, n, "ids") } {
        Ok(ids) => ids,
        Err(f) => return boundary(|| Err(f)),
    };
    // SAFETY: per this function's contract.
    unsafe {
        submit(c, peer, tag, |client, p| {
            with_client!(client, |h| h
                .pull_slice(p, ids, deadline(timeout_ms))
                .map(|t| t.tag()))
        })
    }
}

/// Like `sw_client_pull`, with the received tensors in memory from `alloc` (for instance
/// buffers the caller already owns).
///
/// # Safety
/// As `sw_client_pull`; `alloc` points at a valid allocator that outlives the reply's
/// tensors.
#[no_mangle]
pub unsafe extern "C" fn sw_client_pull_into(
    c: *mut sw_client,
    peer: *const c_char,
    ids: *const u64,
    n: usize,
    alloc: *const sw_allocator,
    timeout_ms: u64,
    tag: *mut u64,
) -> sw_result {
    // SAFETY: per this function's contract.
    let prepared = unsafe { slice(ids, n, "ids") }.and_then(|ids| {
        if alloc.is_null() {
            return Err(Failure::null("alloc"));
        }
        // SAFETY: per this function's contract.
        Ok((ids.to_vec(), unsafe { allocator(alloc) }?))
    });
    let (ids, Some(alloc)) = (match prepared {
        Ok(p) => p,
        Err(f) => return boundary(|| Err(f)),
    }) else {
        return boundary(|| Err(Failure::null("alloc")));
    };
    // SAFETY: per this function's contract.
    unsafe {
        submit(c, peer, tag, |client, p| {
            with_client!(client, |h| h
                .pull_into(p, ids, alloc, deadline(timeout_ms))
                .map(|t| t.tag()))
        })
    }
}

/// Pushes `tensors[i]` for variable `ids[i]`, `i < n`, to `peer`. The tensors are shared
/// with the runtime until sent (not copied); the caller keeps its handles.
///
/// # Safety
/// As `sw_client_ping`; `ids` and `tensors` point at `n` values, each tensor a live handle.
#[no_mangle]
pub unsafe extern "C" fn sw_client_push(
    c: *mut sw_client,
    peer: *const c_char,
    ids: *const u64,
    tensors: *const *const sw_tensor,
    n: usize,
    timeout_ms: u64,
    tag: *mut u64,
) -> sw_result {
    let items = (|| {
        // SAFETY: per this function's contract.
        let (ids, ts) = unsafe { (slice(ids, n, "ids")?, slice(tensors, n, "tensors")?) };
        ids.iter()
            .zip(ts)
            .map(|(&id, &t)| {
                // SAFETY: per this function's contract.
                let t = unsafe { reference(t, "tensors[i]") }?;
                Ok((id, t.tensor.clone()))
            })
            .collect::<Result<Vec<_>, Failure>>()
    })();
    let items = match items {
        Ok(items) => items,
        Err(f) => return boundary(|| Err(f)),
    };
    // SAFETY: per this function's contract.
    unsafe {
        submit(c, peer, tag, |client, p| {
            with_client!(client, |h| h
                .push(p, items, deadline(timeout_ms))
                .map(|t| t.tag()))
        })
    }
}

/// Receives the tensor `peer` publishes under `key` (`key_len` bytes) for `step`: completes
/// when it is published there, before or after this request arrives.
///
/// # Safety
/// As `sw_client_ping`; `key` points at `key_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn sw_client_recv(
    c: *mut sw_client,
    peer: *const c_char,
    step: u64,
    key: *const u8,
    key_len: usize,
    timeout_ms: u64,
    tag: *mut u64,
) -> sw_result {
    // SAFETY: per this function's contract.
    let key = match unsafe { slice(key, key_len, "key") } {
        Ok(k) => k,
        Err(f) => return boundary(|| Err(f)),
    };
    // SAFETY: per this function's contract.
    unsafe {
        submit(c, peer, tag, |client, p| {
            with_client!(client, |h| h
                .recv(p, step, key, deadline(timeout_ms))
                .map(|t| t.tag()))
        })
    }
}

/// Receives `n` keys (`keys[i]`, `key_lens[i]` bytes) in one round trip (one fused frame);
/// each tensor is sent as soon as it is published, and the reply has one entry per key.
///
/// # Safety
/// As `sw_client_ping`; `keys` and `key_lens` point at `n` values, `keys[i]` at
/// `key_lens[i]` bytes.
#[no_mangle]
pub unsafe extern "C" fn sw_client_recv_many(
    c: *mut sw_client,
    peer: *const c_char,
    step: u64,
    keys: *const *const u8,
    key_lens: *const usize,
    n: usize,
    timeout_ms: u64,
    tag: *mut u64,
) -> sw_result {
    let keys = (|| {
        // SAFETY: per this function's contract.
        let (ks, lens) = unsafe { (slice(keys, n, "keys")?, slice(key_lens, n, "key_lens")?) };
        ks.iter()
            .zip(lens)
            // SAFETY: per this function's contract.
            .map(|(&k, &len)| unsafe { slice(k, len, "keys[i]") }.map(<[u8]>::to_vec))
            .collect::<Result<Vec<_>, Failure>>()
    })();
    let keys = match keys {
        Ok(k) => k,
        Err(f) => return boundary(|| Err(f)),
    };
    // SAFETY: per this function's contract.
    unsafe {
        submit(c, peer, tag, |client, p| {
            with_client!(client, |h| h
                .recv_many(p, step, keys, deadline(timeout_ms))
                .map(|t| t.tag()))
        })
    }
}

// ----- rows -----

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

/// A checked table of a rows request.
struct RowsArg<'a> {
    rows: Rows<'a>,
    data: *mut u8,
    len: usize,
}

/// The tables of a rows request, checked: at least one, each with ids, a known dtype, at
/// most `MAX_ROW_RANK` row dimensions, and `byte_len == n * row_bytes` bytes at `data`.
///
/// # Safety
/// `tables` points at `n` values whose pointers are valid as `sw_rows` says, for `'a`.
unsafe fn rows_args<'a>(tables: *const sw_rows, n: usize) -> Result<Vec<RowsArg<'a>>, Failure> {
    // SAFETY: per the caller.
    unsafe { rows_args_with(tables, n, true) }
}

/// As `rows_args`; `data` may be NULL (and is then not to be used) unless `need_data`.
///
/// # Safety
/// As `rows_args`.
unsafe fn rows_args_with<'a>(
    tables: *const sw_rows,
    n: usize,
    need_data: bool,
) -> Result<Vec<RowsArg<'a>>, Failure> {
    // SAFETY: per the caller.
    let tables = unsafe { slice(tables, n, "tables") }?;
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
        // SAFETY: per the caller.
        let row_dims = unsafe {
            slice_named(t.row_dims, t.rank as usize, || {
                format!("tables[{i}].row_dims")
            })
        }?;
        // SAFETY: per the caller.
        let ids = unsafe { slice_named(t.ids, t.n, || format!("tables[{i}].ids")) }?;
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
        if need_data && t.data.is_null() {
            return Err(Failure::null(&format!("tables[{i}].data")));
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

/// Locks `m`, taking a poisoned lock as is (the counts it guards stay consistent).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The caller's buffer of one table of a rows pull.
struct Target {
    ptr: *mut u8,
    len: usize,
    dtype: DType,
    /// The block's shape: `[n, row...]`.
    dims: Vec<u64>,
}

/// The caller's buffers of a rows pull, and which of them starwire holds.
struct RowsTargets {
    targets: Vec<Target>,
    state: Mutex<Held>,
    /// Signalled when the last buffer held is given back and a thread waits for it.
    released: Condvar,
}

/// Which of a rows pull's buffers starwire holds.
struct Held {
    /// Per table, whether its buffer was handed out.
    taken: Vec<bool>,
    /// How many handed out are still held.
    lent: usize,
    /// For a client with a callback: its call once none is.
    deferred: Option<Deferred>,
    /// Threads in `wait_released`: giving the last buffer back signals only when there are
    /// some (a signal is a system call, on the waiting thread's critical path otherwise).
    waiters: usize,
}

// SAFETY: the pointers are the caller's buffers, which `sw_client_pull_rows`' contract keeps
// valid until the request's wait; they are only written by the runtime through `Lent`, or
// by `place` once the blocks are received.
unsafe impl Send for RowsTargets {}
// SAFETY: as above; the shared state is behind a mutex.
unsafe impl Sync for RowsTargets {}

impl RowsTargets {
    fn new(args: &[RowsArg<'_>]) -> RowsTargets {
        let targets: Vec<Target> = args
            .iter()
            .map(|a| Target {
                ptr: a.data,
                len: a.len,
                dtype: a.rows.dtype,
                dims: std::iter::once(a.rows.ids.len() as u64)
                    .chain(a.rows.row_dims.iter().copied())
                    .collect(),
            })
            .collect();
        RowsTargets {
            state: Mutex::new(Held {
                taken: vec![false; targets.len()],
                lent: 0,
                deferred: None,
                waiters: 0,
            }),
            targets,
            released: Condvar::new(),
        }
    }

    /// Waits until starwire holds none of the buffers.
    /// Whether starwire holds one of the buffers.
    fn held(&self) -> bool {
        lock(&self.state).lent > 0
    }

    fn wait_released(&self) {
        let mut state = lock(&self.state);
        while state.lent > 0 {
            state.waiters += 1;
            state = self
                .released
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            state.waiters -= 1;
        }
    }

    /// Runs `call` once starwire holds none of the buffers: now, or when the last is given
    /// back (on the thread that gives it back).
    fn when_released(&self, call: Deferred) {
        let mut state = lock(&self.state);
        if state.lent > 0 {
            state.deferred = Some(call);
            return;
        }
        drop(state);
        (call.0)();
    }

    /// Puts each received block of `rows` in its table's buffer and gives the statuses.
    fn place(&self, rows: &PulledRows) -> Vec<u32> {
        place(
            &self.targets,
            (0..rows.len()).map(|t| rows.block(t).map(|b| b.bytes())),
        )
    }
}

/// Puts `blocks[t]` in `targets[t]`: nothing to do for a block received into it (the rule),
/// a copy for one received elsewhere (a peer answering tables of the same shape out of
/// order, so that their blocks went into each other's buffers; all such blocks are copied
/// out before any is written). The statuses, per table: 0, the block's error, or
/// `INTERNAL` for a block of another length than its buffer.
fn place<'a>(
    targets: &[Target],
    blocks: impl Iterator<Item = Result<&'a [u8], Status>>,
) -> Vec<u32> {
    let mut statuses = Vec::with_capacity(targets.len());
    let mut misplaced = Vec::new();
    for (t, (target, block)) in targets.iter().zip(blocks).enumerate() {
        match block {
            Ok(b) if b.len() != target.len => statuses.push(u16::from(Status::Internal) as u32),
            Ok(b) => {
                if b.as_ptr() != target.ptr.cast_const() {
                    misplaced.push((t, b.to_vec()));
                }
                statuses.push(0);
            }
            Err(s) => statuses.push(status_code::<()>(Err(s))),
        }
    }
    for (t, bytes) in misplaced {
        // SAFETY: the buffer holds `len == bytes.len()` bytes (checked above) and is valid
        // per `sw_client_pull_rows`' contract; no reference to it is used after this point.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), targets[t].ptr, bytes.len()) };
    }
    statuses
}

/// The allocator of a rows pull's blocks: each block gets the buffer of the first table of
/// its dtype and shape not yet served (the buffer of its own table, unless the peer
/// answers tables of one shape out of order); heap memory if none is left.
struct RowsAllocator(Arc<RowsTargets>);

impl TensorAllocator for RowsAllocator {
    fn allocate(&self, desc: &TensorDesc<'_>) -> Option<Box<dyn TensorMemory>> {
        let len = usize::try_from(desc.byte_len).ok()?;
        let owner = &self.0;
        let mut state = lock(&owner.state);
        let Held { taken, lent, .. } = &mut *state;
        let free = owner
            .targets
            .iter()
            .zip(taken.iter())
            .position(|(t, &taken)| {
                !taken && t.dtype == desc.dtype && t.dims == desc.dims && t.len == len
            });
        let Some(i) = free else {
            return Some(Box::new(vec![0u8; len]));
        };
        taken[i] = true;
        *lent += 1;
        Some(Box::new(Lent {
            ptr: owner.targets[i].ptr,
            len,
            owner: owner.clone(),
        }))
    }
}

/// A caller's buffer lent to the runtime for one block; given back when dropped.
struct Lent {
    ptr: *mut u8,
    len: usize,
    owner: Arc<RowsTargets>,
}

// SAFETY: the buffer is the caller's, valid while lent (`sw_client_pull_rows`' contract and
// the wait for its return), and lent to this value alone.
unsafe impl Send for Lent {}
// SAFETY: shared access only reads the bytes.
unsafe impl Sync for Lent {}

// SAFETY: `ptr`/`len` never change while the value lives, and the buffer stays valid and
// unmoved until the value is dropped: the request's wait, and freeing the client, wait for
// that.
unsafe impl TensorMemory for Lent {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes at `ptr` stay valid while lent.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes the slice unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let mut state = lock(&self.owner.state);
        state.lent -= 1;
        let last = state.lent == 0;
        let deferred = if last { state.deferred.take() } else { None };
        let waiters = last && state.waiters > 0;
        drop(state);
        if waiters {
            self.owner.released.notify_all();
        }
        if let Some(call) = deferred {
            (call.0)();
        }
    }
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
pub unsafe extern "C" fn sw_client_pull_rows(
    c: *mut sw_client,
    peer: *const c_char,
    tables: *const sw_rows,
    n_tables: usize,
    timeout_ms: u64,
    tag: *mut u64,
) -> sw_result {
    boundary(|| {
        // SAFETY: per this function's contract.
        let client = unsafe { client_mut(c) }?;
        // SAFETY: per this function's contract.
        let peer = unsafe { address(peer, "peer") }?;
        if tag.is_null() {
            return Err(Failure::null("tag"));
        }
        // SAFETY: per this function's contract.
        let args = unsafe { rows_args(tables, n_tables) }?;
        let targets = Arc::new(RowsTargets::new(&args));
        let rows: Vec<Rows<'_>> = args.iter().map(|a| a.rows).collect();
        let alloc = Arc::new(RowsAllocator(targets.clone()));
        let t = match &client.callback_rows {
            Some(cb) => {
                // Registered before the callback can look for it: the callback takes this
                // lock, and submitting never waits for the loop.
                let mut pending = lock(&cb.pending);
                let t = with_client!(client, |h| h.pull_rows_into(
                    peer,
                    &rows,
                    alloc,
                    deadline(timeout_ms)
                ))?;
                pending.insert(t.tag(), targets);
                cb.count.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
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
        client.submitted();
        // SAFETY: checked non-null above.
        unsafe { write(tag, t.tag()) };
        Ok(())
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
pub unsafe extern "C" fn sw_client_pull_rows_wait(
    c: *mut sw_client,
    peer: *const c_char,
    rows: *const sw_rows,
    timeout_ms: u64,
    missing: *mut u32,
    missing_count: *mut usize,
) -> sw_result {
    boundary(|| {
        // SAFETY: per this function's contract.
        let client = unsafe { client_mut(c) }?;
        // SAFETY: per this function's contract.
        let peer = unsafe { address(peer, "peer") }?;
        if missing_count.is_null() {
            return Err(Failure::null("missing_count"));
        }
        if client.callback {
            return Err(Failure::invalid(
                "a rows pull is waited for with sw_client_wait: not for a client with a callback",
            ));
        }
        // SAFETY: per this function's contract.
        let args = unsafe { rows_args(rows, 1) }?;
        let targets = Arc::new(RowsTargets::new(&args));
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
            Ok(Reply::Rows(rows)) => {
                let status = targets.place(rows).first().copied().unwrap_or(u32::MAX);
                let m = rows.missing(0);
                if status != 0 {
                    Err(table_failure(args[0].rows.table, status))
                } else if m.len() > args[0].rows.ids.len() {
                    Err(Failure::new(
                        SW_ERR_PROTOCOL,
                        "more rows missing than asked for",
                    ))
                } else if !m.is_empty() && missing.is_null() {
                    Err(Failure::null("missing"))
                } else {
                    if !m.is_empty() {
                        // SAFETY: `missing` has room for `rows->n` values per this
                        // function's contract, and at most that many are written (checked
                        // above); it is not memory of the reply.
                        unsafe { std::ptr::copy_nonoverlapping(m.as_ptr(), missing, m.len()) };
                    }
                    Ok(m.len())
                }
            }
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
        let count = answer?;
        // SAFETY: checked non-null above.
        unsafe { write(missing_count, count) };
        Ok(())
    })
}

/// The failure of a rows table the peer answered with wire status `status`.
fn table_failure(table: u32, status: u32) -> Failure {
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
pub unsafe extern "C" fn sw_client_push_rows(
    c: *mut sw_client,
    peer: *const c_char,
    tables: *const sw_rows,
    n_tables: usize,
    timeout_ms: u64,
    tag: *mut u64,
) -> sw_result {
    boundary(|| {
        // SAFETY: per this function's contract.
        let client = unsafe { client_mut(c) }?;
        // SAFETY: per this function's contract.
        let peer = unsafe { address(peer, "peer") }?;
        if tag.is_null() {
            return Err(Failure::null("tag"));
        }
        // SAFETY: per this function's contract.
        let args = unsafe { rows_args(tables, n_tables) }?;
        let items: Vec<(Rows<'_>, &[u8])> = args
            .iter()
            .map(|a| {
                // SAFETY: `len` bytes at `data`, valid for the call per this function's
                // contract.
                let grads = unsafe { std::slice::from_raw_parts(a.data.cast_const(), a.len) };
                (a.rows, grads)
            })
            .collect();
        let t = with_client!(client, |h| h.push_rows(peer, &items, deadline(timeout_ms)))?;
        client.submitted();
        // SAFETY: checked non-null above.
        unsafe { write(tag, t.tag()) };
        Ok(())
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
pub unsafe extern "C" fn sw_client_push_rows_tensors(
    c: *mut sw_client,
    peer: *const c_char,
    tables: *const sw_rows,
    grads: *const *const sw_tensor,
    n_tables: usize,
    timeout_ms: u64,
    tag: *mut u64,
) -> sw_result {
    boundary(|| {
        // SAFETY: per this function's contract.
        let client = unsafe { client_mut(c) }?;
        // SAFETY: per this function's contract.
        let peer = unsafe { address(peer, "peer") }?;
        if tag.is_null() {
            return Err(Failure::null("tag"));
        }
        // SAFETY: per this function's contract.
        let args = unsafe { rows_args_with(tables, n_tables, false) }?;
        // SAFETY: per this function's contract.
        let grads = unsafe { slice(grads, n_tables, "grads") }?;
        let mut items = Vec::with_capacity(args.len());
        for (i, (a, &g)) in args.iter().zip(grads).enumerate() {
            // SAFETY: per this function's contract.
            let g = unsafe { reference(g, "grads[i]") }?;
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
        client.submitted();
        // SAFETY: checked non-null above.
        unsafe { write(tag, t.tag()) };
        Ok(())
    })
}

/// Waits for request `tag` of this client (spins briefly, then parks). Returns the
/// request's outcome; on `SW_OK`, `*reply` is its answer, which the caller frees with
/// `sw_reply_free`. Completions of other requests that arrive meanwhile are kept for their
/// own wait; a request `sw_client_poll` or `sw_client_wait_any` reported is answered at
/// once. Not for clients made with a callback (`SW_ERR_INVALID_ARGUMENT`). For a rows
/// pull, once this returns (whatever it returns) starwire no longer touches the request's
/// buffers: a pull given up by its deadline while a receive into a buffer is in flight is
/// waited for until that receive ends.
///
/// # Safety
/// `c` is a live client used by this thread only; `reply` is writable.
#[no_mangle]
pub unsafe extern "C" fn sw_client_wait(
    c: *mut sw_client,
    tag: u64,
    reply: *mut *mut sw_reply,
) -> sw_result {
    let mut code = SW_OK;
    let r = boundary(|| {
        // SAFETY: per this function's contract.
        let client = unsafe { client_mut(c) }?;
        if reply.is_null() {
            return Err(Failure::null("reply"));
        }
        let mut completion = match client.ready.remove(&tag) {
            Some(c) => c,
            None => with_client!(client, |h| h.wait_tag(tag)).map_err(|_| {
                Failure::invalid(format!(
                    "request {tag} is not outstanding (never submitted, already waited for, \
                     or submitted through a client with a callback)"
                ))
            })?,
        };
        let targets = client.rows.remove(&tag);
        let result =
            std::mem::replace(&mut completion.result, Err(Error::new(ErrorKind::Shutdown)));
        // The request's vectors serve the client's next requests (no allocation for them).
        with_client!(client, |h| h.recycle(completion));
        let (result, answer) = outcome(result, targets.as_deref());
        if let Some(targets) = targets {
            // A rows pull given up mid-transfer may still be receiving into the buffers.
            client.wait_released(&targets);
        }
        code = result;
        if let Some(answer) = answer {
            // SAFETY: checked non-null above.
            unsafe { write(reply, Box::into_raw(answer)) };
        }
        Ok(())
    });
    if r != SW_OK {
        return r;
    }
    code
}

/// Whether a request of this client has completed, without waiting: on `SW_OK`, `*ready`
/// says whether one has and, if so, `*tag` names it. Each completed request is reported
/// once (by this or `sw_client_wait_any`); its answer is then taken with `sw_client_wait`,
/// which returns at once. Not for clients made with a callback (`SW_ERR_INVALID_ARGUMENT`).
///
/// # Safety
/// `c` is a live client used by this thread only; `tag` and `ready` are writable.
#[no_mangle]
pub unsafe extern "C" fn sw_client_poll(
    c: *mut sw_client,
    tag: *mut u64,
    ready: *mut bool,
) -> sw_result {
    boundary(|| {
        // SAFETY: per this function's contract.
        let client = unsafe { client_mut(c) }?;
        if tag.is_null() || ready.is_null() {
            return Err(Failure::null(if tag.is_null() { "tag" } else { "ready" }));
        }
        if client.callback {
            return Err(Failure::invalid(
                "a client with a callback has nothing to poll: its completions go to the callback",
            ));
        }
        let completion = with_client!(client, |h| h.poll());
        // SAFETY: checked non-null above.
        unsafe { write(ready, completion.is_some()) };
        if let Some(c) = completion {
            // SAFETY: checked non-null above.
            unsafe { write(tag, c.tag) };
            client.ready.insert(c.tag, c);
        }
        Ok(())
    })
}

/// Waits for the next request of this client to complete (spins briefly, then parks), and
/// writes its tag to `*tag`; reported once, as by `sw_client_poll`, and its answer then
/// taken with `sw_client_wait`. `SW_ERR_INVALID_ARGUMENT` when no request is outstanding
/// (all completed ones already reported), and for clients made with a callback.
///
/// # Safety
/// `c` is a live client used by this thread only; `tag` is writable.
#[no_mangle]
pub unsafe extern "C" fn sw_client_wait_any(c: *mut sw_client, tag: *mut u64) -> sw_result {
    boundary(|| {
        // SAFETY: per this function's contract.
        let client = unsafe { client_mut(c) }?;
        if tag.is_null() {
            return Err(Failure::null("tag"));
        }
        if client.callback {
            return Err(Failure::invalid(
                "a client with a callback has nothing to wait for: its completions go to the callback",
            ));
        }
        let c = with_client!(client, |h| h.wait_any()).map_err(|_| {
            Failure::invalid("no request outstanding (every completed one already reported)")
        })?;
        // SAFETY: checked non-null above.
        unsafe { write(tag, c.tag) };
        client.ready.insert(c.tag, c);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_the_boundary_becomes_an_error_code() {
        let r = boundary(|| panic!("a bug"));
        assert_eq!(r, SW_ERR_PANIC);
        // SAFETY: `sw_last_error` returns a NUL-terminated string valid until the next call.
        let msg = unsafe { CStr::from_ptr(sw_last_error()) };
        assert!(msg.to_string_lossy().contains("panicked"));
        assert_eq!(boundary_value(7, || -> u32 { panic!("in a getter") }), 7);
        assert_eq!(boundary(|| Ok(())), SW_OK);
    }

    fn target(buf: &mut [u8]) -> Target {
        Target {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            dtype: DType::U8,
            dims: vec![buf.len() as u64],
        }
    }

    #[test]
    fn blocks_received_into_each_others_buffers_are_put_in_place() {
        // Tables 0 and 2 of one shape, answered out of order: 0's block went into 2's
        // buffer and 2's into 0's. Table 1's block is where it belongs; table 3 failed.
        let (mut b0, mut b1, mut b2, mut b3) = ([2u8; 4], [1u8; 4], [0u8; 4], [9u8; 4]);
        let targets = [
            target(&mut b0),
            target(&mut b1),
            target(&mut b2),
            target(&mut b3),
        ];
        // SAFETY: views of the buffers through the targets' pointers, as the runtime's
        // blocks are; not used once `place` writes.
        let view = |t: &Target| unsafe { std::slice::from_raw_parts(t.ptr.cast_const(), t.len) };
        let blocks = [
            Ok(view(&targets[2])),
            Ok(view(&targets[1])),
            Ok(view(&targets[0])),
            Err(Status::NotFound),
        ];
        assert_eq!(place(&targets, blocks.into_iter()), [0, 0, 0, 1]);
        let short = [7u8; 3];
        assert_eq!(place(&targets[..1], [Ok(&short[..])].into_iter()), [8]);
        drop(targets);
        assert_eq!((b0, b1, b2, b3), ([0; 4], [1; 4], [2; 4], [9; 4]));
    }

    /// The targets of a rows pull of ids 1 and 2 (rows of 4 u8) from two tables, into `a`
    /// and `b`.
    fn two_targets(a: &mut [u8; 8], b: &mut [u8; 8]) -> Arc<RowsTargets> {
        let ids = [1u64, 2];
        let row = [4u64];
        let args = [a, b].map(|buf| RowsArg {
            rows: Rows::new(0, DType::U8, &row, &ids),
            data: buf.as_mut_ptr(),
            len: buf.len(),
        });
        Arc::new(RowsTargets::new(&args))
    }

    #[test]
    fn the_allocator_hands_out_each_buffer_once_by_shape() {
        let (mut a, mut b) = ([0u8; 8], [0u8; 8]);
        let targets = two_targets(&mut a, &mut b);
        let alloc = RowsAllocator(targets.clone());
        let desc = |dims: &'static [u64]| TensorDesc {
            dtype: DType::U8,
            dims,
            byte_len: 8,
        };
        let m1 = alloc.allocate(&desc(&[2, 4])).unwrap();
        let m2 = alloc.allocate(&desc(&[2, 4])).unwrap();
        assert_eq!(m1.bytes().as_ptr(), targets.targets[0].ptr.cast_const());
        assert_eq!(m2.bytes().as_ptr(), targets.targets[1].ptr.cast_const());
        // None left, or another shape: heap memory.
        let m3 = alloc.allocate(&desc(&[2, 4])).unwrap();
        let m4 = alloc.allocate(&desc(&[4, 2])).unwrap();
        for m in [&m3, &m4] {
            let p = m.bytes().as_ptr();
            assert!(targets.targets.iter().all(|t| t.ptr.cast_const() != p));
        }
        assert_eq!(lock(&targets.state).lent, 2);
        drop((m1, m2, m3, m4));
        assert_eq!(lock(&targets.state).lent, 0);
        targets.wait_released();
    }

    #[test]
    fn a_thread_waiting_for_the_buffers_is_woken_by_the_last_one_given_back() {
        let (mut a, mut b) = ([0u8; 8], [0u8; 8]);
        let targets = two_targets(&mut a, &mut b);
        let alloc = RowsAllocator(targets.clone());
        let desc = TensorDesc {
            dtype: DType::U8,
            dims: &[2, 4],
            byte_len: 8,
        };
        let (m1, m2) = (
            alloc.allocate(&desc).unwrap(),
            alloc.allocate(&desc).unwrap(),
        );
        // Given back with no one waiting: nothing to signal, and nothing left held.
        drop(m1);
        assert_eq!(lock(&targets.state).lent, 1);
        let waiter = {
            let targets = targets.clone();
            std::thread::spawn(move || targets.wait_released())
        };
        // The waiter is counted under the lock before it sleeps, so once it is counted the
        // last buffer given back has to wake it.
        while lock(&targets.state).waiters == 0 {
            std::thread::yield_now();
        }
        drop(m2);
        waiter.join().unwrap();
        let state = lock(&targets.state);
        assert_eq!((state.lent, state.waiters), (0, 0));
    }
}
