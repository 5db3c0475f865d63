//! C ABI for starwire. For now it exposes only the library version; the full
//! embedding API (runtime, server callbacks, client handles) follows.

/// The starwire version as a NUL-terminated C string with static lifetime.
#[no_mangle]
pub extern "C" fn starwire_version() -> *const std::ffi::c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
