//! The library's version.

use std::ffi::c_char;

use crate::boundary::boundary;

/// The starwire version as a NUL-terminated C string with static lifetime.
#[no_mangle]
pub extern "C" fn starwire_version() -> *const c_char {
    boundary!(std::ptr::null(), {
        concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
    })
}
