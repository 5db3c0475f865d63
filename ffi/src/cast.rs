//! Pointer casts at the C boundary. Every pointer C passes in becomes a Rust reference,
//! slice or string here, and every handle C holds is made and taken back here. Besides the
//! memory C lends tensors (`allocator.rs`, `buffers.rs`) and the trampolines that call C's
//! callbacks, this is the crate's only `unsafe`: the exported functions have none of their
//! own, and reach their arguments through the `try_*!` macros below, which leave the body
//! with `SW_ERR_NULL` (or `SW_ERR_INVALID_ARGUMENT`) naming the argument.
//!
//! The casts are sound because of the contract the header states for every C caller (the
//! conventions at its top, and each function's `# Safety`):
//! - a handle pointer (`sw_runtime *`, `sw_client *`, `sw_tensor *`, ...) is NULL or one
//!   starwire gave out and that is not freed before the call returns; a handle passed as a
//!   mutable pointer (a client, a sharded table, a reply a tensor is taken from) is used by
//!   one thread at a time;
//! - an array argument is NULL only when its count is 0, and otherwise points at that many
//!   initialized elements, valid for the call, that the caller does not change meanwhile;
//! - a string argument is NULL or NUL-terminated, valid for the call;
//! - an output pointer is NULL or points at room for its value, which the caller does not
//!   use during the call.
//!
//! The casts check what can be checked (NULL, lengths of 0, UTF-8) and rely on the rest.
//! They take pointers that came from C only, and the references they give are used for the
//! call only. [`Castable`] ties each handle type to the one Rust type behind it, so that a
//! `sw_client *` can only become the client it is.

use std::ffi::{c_char, CStr, CString};
use std::mem::MaybeUninit;

/// How a C pointer to a [`Castable`] relates to its Rust value.
pub(crate) trait Ownership {}

/// The C pointer is a `Box<RustType>` this crate made ([`to_boxed`]) and gave to C as a
/// handle; C gives it back to the type's `*_free`, which drops the box ([`free_box`]).
///
/// No handle is an `Arc` for C: a handle to a shared value (a tensor, a table) is a box
/// holding one `Arc` reference, so that freeing one handle drops one reference. A boxed
/// type's value may also be lent to C without a box of its own ([`lend`]: a reply's
/// tensors, the tensors of a push callback); C reads those, and never frees them.
pub(crate) struct Boxed;

/// The C pointer points at the caller's own `#[repr(C)]` struct (options, callbacks),
/// which is its Rust type: read through a plain reference, for the call.
pub(crate) struct Plain;

impl Ownership for Boxed {}
impl Ownership for Plain {}

/// A C type and the Rust value a pointer to it points at.
pub(crate) trait Castable {
    /// Whether the pointer is a box this crate made, or the caller's struct.
    type Ownership: Ownership;
    /// The Rust value behind the pointer (for [`Plain`], the C type itself).
    type RustType;
}

/// `p` as a reference to the Rust value behind it; `None` for NULL.
pub(crate) fn ref_from<'a, C: Castable>(p: *const C) -> Option<&'a C::RustType> {
    // SAFETY: `p` is NULL (giving `None`) or, by the header's contract, a live value of
    // the kind `Castable` says: a box `to_boxed` made of a `C::RustType` (the cast undoes
    // the one there), or a value of it lent by its owner, not freed before the call
    // returns; or the caller's struct, whose Rust type is `C` itself. Either way it is
    // aligned and initialized, and while the reference is used (the call) nothing writes
    // it: a handle shared between threads is only read through `&`.
    unsafe { p.cast::<C::RustType>().as_ref() }
}

/// `p` as a mutable reference to the Rust value behind it; `None` for NULL.
pub(crate) fn mut_from<'a, C>(p: *mut C) -> Option<&'a mut C::RustType>
where
    C: Castable<Ownership = Boxed>,
{
    // SAFETY: `p` is NULL (giving `None`) or a live handle, a box `to_boxed` made of a
    // `C::RustType` (the cast undoes the one there); the header lets one thread at a time
    // call with a handle passed as a mutable pointer, so nothing else reads or writes the
    // value while this reference is used (the call).
    unsafe { p.cast::<C::RustType>().as_mut() }
}

/// `value` as a new handle for C: a box, which C gives back to be freed ([`box_from`]).
pub(crate) fn to_boxed<C>(value: C::RustType) -> *mut C
where
    C: Castable<Ownership = Boxed>,
{
    Box::into_raw(Box::new(value)).cast()
}

/// Takes back the box behind a handle (freed by C, or passed to starwire by a callback);
/// `None` for NULL.
pub(crate) fn box_from<C>(p: *mut C) -> Option<Box<C::RustType>>
where
    C: Castable<Ownership = Boxed>,
{
    if p.is_null() {
        return None;
    }
    // SAFETY: not NULL; by the header's contract a handle C frees, or whose ownership a
    // callback passes to starwire, is a box `to_boxed` made of a `C::RustType` (the cast
    // undoes the one there) and not freed or passed on before, so the box is rebuilt once.
    Some(unsafe { Box::from_raw(p.cast::<C::RustType>()) })
}

/// Drops the box behind a handle; nothing for NULL.
pub(crate) fn free_box<C>(p: *mut C)
where
    C: Castable<Ownership = Boxed>,
{
    drop(box_from(p));
}

/// A pointer to `value` for C to read (not to free) while `value` lives.
pub(crate) fn lend<C>(value: &C::RustType) -> *const C
where
    C: Castable<Ownership = Boxed>,
{
    (value as *const C::RustType).cast()
}

/// `s` as a string for C, given back to [`free_c_string`] (`sw_string_free`).
pub(crate) fn to_c_string(s: CString) -> *mut c_char {
    s.into_raw()
}

/// Drops a string [`to_c_string`] gave C; nothing for NULL.
pub(crate) fn free_c_string(p: *mut c_char) {
    if p.is_null() {
        return;
    }
    // SAFETY: not NULL; by `sw_string_free`'s contract a string C frees is one starwire
    // returned (made by `to_c_string`, `CString::into_raw`) and not freed before, so it is
    // rebuilt once, with the length `into_raw` left it (C does not write it).
    drop(unsafe { CString::from_raw(p) });
}

/// `n` elements at `p`: an empty slice when `n` is 0 (`p` may then be NULL); `None` for a
/// NULL `p` otherwise.
pub(crate) fn slice_from<'a, T: Copy>(p: *const T, n: usize) -> Option<&'a [T]> {
    if n == 0 {
        return Some(&[]);
    }
    if p.is_null() {
        return None;
    }
    // SAFETY: not NULL, `n` above 0; by the header's contract an array argument with a
    // count is a C array of that many initialized `T` (so aligned, and within one object),
    // valid for the call and not changed by the caller meanwhile. `T: Copy`: the elements
    // are only read, never dropped.
    Some(unsafe { std::slice::from_raw_parts(p, n) })
}

/// `n` writable elements at `p`: an empty slice when `n` is 0 (`p` may then be NULL);
/// `None` for a NULL `p` otherwise.
pub(crate) fn slice_mut_from<'a, T: Copy>(p: *mut T, n: usize) -> Option<&'a mut [T]> {
    if n == 0 {
        return Some(&mut []);
    }
    if p.is_null() {
        return None;
    }
    // SAFETY: not NULL, `n` above 0; by the header's contract a buffer argument with a
    // count is a C array of that many initialized `T` (so aligned, and within one object),
    // valid for the call, which the caller neither reads nor writes meanwhile. `T: Copy`:
    // overwritten elements need no drop.
    Some(unsafe { std::slice::from_raw_parts_mut(p, n) })
}

/// The room an output pointer points at, for its value; `None` for NULL.
pub(crate) fn out_from<'a, T>(p: *mut T) -> Option<&'a mut MaybeUninit<T>> {
    // SAFETY: `p` is NULL (giving `None`) or, by the header's contract, room for a `T`
    // (aligned: a C object of that type), valid for the call, which the caller does not use
    // meanwhile. `MaybeUninit` claims nothing about what the room holds now.
    unsafe { p.cast::<MaybeUninit<T>>().as_mut() }
}

/// The room for `n` values at `p` (`n` may be 0); `None` for NULL.
pub(crate) fn out_slice_from<'a, T>(p: *mut T, n: usize) -> Option<&'a mut [MaybeUninit<T>]> {
    if p.is_null() {
        return None;
    }
    // SAFETY: not NULL; by the header's contract an output array has room for the count it
    // is given with (a C array of `T`, so aligned, and within one object), valid for the
    // call, which the caller does not use meanwhile. `MaybeUninit` claims nothing about
    // what the room holds now.
    Some(unsafe { std::slice::from_raw_parts_mut(p.cast::<MaybeUninit<T>>(), n) })
}

/// The NUL-terminated string at `p`; `None` for NULL.
pub(crate) fn cstr_from<'a>(p: *const c_char) -> Option<&'a CStr> {
    if p.is_null() {
        return None;
    }
    // SAFETY: not NULL; by the header's contract a string argument is NUL-terminated,
    // valid for the call and not changed by the caller meanwhile.
    Some(unsafe { CStr::from_ptr(p) })
}

/// `$p` (a `*const C`) as `&C::RustType`, or leaves the body with `SW_ERR_NULL` naming
/// `$what` (by default the argument's name).
macro_rules! try_ref {
    ($p:ident) => {
        $crate::cast::try_ref!($p, stringify!($p))
    };
    ($p:expr, $what:expr) => {
        match $crate::cast::ref_from($p) {
            Some(r) => r,
            None => return Err($crate::result::Failure::null($what)),
        }
    };
}
pub(crate) use try_ref;

/// `$p` (a `*mut C`) as `&mut C::RustType`, or leaves the body with `SW_ERR_NULL`.
macro_rules! try_mut {
    ($p:ident) => {
        $crate::cast::try_mut!($p, stringify!($p))
    };
    ($p:expr, $what:expr) => {
        match $crate::cast::mut_from($p) {
            Some(r) => r,
            None => return Err($crate::result::Failure::null($what)),
        }
    };
}
pub(crate) use try_mut;

/// `$n` elements at `$p` (NULL allowed when `$n` is 0), or leaves the body with
/// `SW_ERR_NULL`.
macro_rules! try_slice {
    ($p:ident, $n:expr) => {
        $crate::cast::try_slice!($p, $n, stringify!($p))
    };
    ($p:expr, $n:expr, $what:expr) => {
        match $crate::cast::slice_from($p, $n) {
            Some(s) => s,
            None => return Err($crate::result::Failure::null($what)),
        }
    };
}
pub(crate) use try_slice;

/// `$n` writable elements at `$p` (NULL allowed when `$n` is 0), or leaves the body with
/// `SW_ERR_NULL`.
macro_rules! try_slice_mut {
    ($p:ident, $n:expr) => {
        $crate::cast::try_slice_mut!($p, $n, stringify!($p))
    };
    ($p:expr, $n:expr, $what:expr) => {
        match $crate::cast::slice_mut_from($p, $n) {
            Some(s) => s,
            None => return Err($crate::result::Failure::null($what)),
        }
    };
}
pub(crate) use try_slice_mut;

/// The room at output pointer `$p` (`&mut MaybeUninit<T>`, written once the call succeeds),
/// or leaves the body with `SW_ERR_NULL`.
macro_rules! try_out {
    ($p:ident) => {
        $crate::cast::try_out!($p, stringify!($p))
    };
    ($p:expr, $what:expr) => {
        match $crate::cast::out_from($p) {
            Some(o) => o,
            None => return Err($crate::result::Failure::null($what)),
        }
    };
}
pub(crate) use try_out;

/// The room for `$n` values at `$p` (`&mut [MaybeUninit<T>]`), or leaves the body with
/// `SW_ERR_NULL` (also when `$n` is 0: take it only when there is something to write, where
/// NULL is allowed for nothing).
macro_rules! try_out_slice {
    ($p:ident, $n:expr) => {
        $crate::cast::try_out_slice!($p, $n, stringify!($p))
    };
    ($p:expr, $n:expr, $what:expr) => {
        match $crate::cast::out_slice_from($p, $n) {
            Some(o) => o,
            None => return Err($crate::result::Failure::null($what)),
        }
    };
}
pub(crate) use try_out_slice;

/// The NUL-terminated string at `$p` as `&str`, or leaves the body with `SW_ERR_NULL`, or
/// `SW_ERR_INVALID_ARGUMENT` when it is not UTF-8.
macro_rules! try_str {
    ($p:ident) => {
        $crate::cast::try_str!($p, stringify!($p))
    };
    ($p:expr, $what:expr) => {
        match $crate::cast::cstr_from($p).map(|s| s.to_str()) {
            Some(Ok(s)) => s,
            Some(Err(_)) => {
                return Err($crate::result::Failure::invalid(format!(
                    "{} is not UTF-8",
                    $what
                )))
            }
            None => return Err($crate::result::Failure::null($what)),
        }
    };
}
pub(crate) use try_str;

/// The `host:port` string at `$p` as a `SocketAddr`, or leaves the body as [`try_str!`]
/// does, or with `SW_ERR_INVALID_ARGUMENT` when it is not an address.
macro_rules! try_addr {
    ($p:ident) => {
        $crate::cast::try_addr!($p, stringify!($p))
    };
    ($p:expr, $what:expr) => {{
        let text = $crate::cast::try_str!($p, $what);
        match text.parse::<::std::net::SocketAddr>() {
            Ok(addr) => addr,
            Err(_) => {
                return Err($crate::result::Failure::invalid(format!(
                    "{} {:?} is not an address (host:port)",
                    $what, text
                )))
            }
        }
    }};
}
pub(crate) use try_addr;

/// The peer string at `$p` (`host:port`, or `task@host:port` as `sw_resolver_peer` writes
/// it) as a [`starwire::Peer`], or leaves the body as [`try_str!`] does, or with
/// `SW_ERR_INVALID_ARGUMENT` when it is neither.
macro_rules! try_peer {
    ($p:ident) => {
        $crate::cast::try_peer!($p, stringify!($p))
    };
    ($p:expr, $what:expr) => {{
        let text = $crate::cast::try_str!($p, $what);
        match $crate::cast::peer_of(text) {
            Some(peer) => peer,
            None => {
                return Err($crate::result::Failure::invalid(format!(
                    "{} {:?} is not an address (host:port, or task@host:port)",
                    $what, text
                )))
            }
        }
    }};
}
pub(crate) use try_peer;

/// Named peers a thread keeps, at most: past it the thread's table starts over.
const NAMED_PEERS_KEPT: usize = 1024;

/// The peer `text` names: `host:port`, or `task@host:port` (a task name, `ps:1` or
/// `/job:ps/task:1`, and its data address), whose errors and metrics then name the task.
/// A text with a task is parsed once per thread and kept, so that a request naming one
/// neither allocates nor locks.
pub(crate) fn peer_of(text: &str) -> Option<starwire::Peer> {
    use std::cell::RefCell;
    use std::collections::HashMap;

    use starwire::cluster::TaskId;
    use starwire::Peer;

    thread_local! {
        static NAMED: RefCell<HashMap<Box<str>, Peer>> = RefCell::new(HashMap::new());
    }
    let Some((task, addr)) = text.split_once('@') else {
        return text.parse().ok().map(Peer::new);
    };
    NAMED.with(|named| {
        let mut named = named.borrow_mut();
        if let Some(&peer) = named.get(text) {
            return Some(peer);
        }
        let task = TaskId::parse(task).ok()?;
        let peer = Peer::new(addr.parse().ok()?).with_task(&task);
        if named.len() >= NAMED_PEERS_KEPT {
            named.clear();
        }
        named.insert(text.into(), peer);
        Some(peer)
    })
}

/// The text of `peer` for the request functions: `task@host:port` when it has a task name,
/// else `host:port`.
pub(crate) fn peer_text(peer: &starwire::Peer) -> String {
    match peer.task() {
        Some(task) => format!("{task}@{}", peer.addr()),
        None => peer.addr().to_string(),
    }
}
