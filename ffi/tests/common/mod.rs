//! Helpers the C ABI's rows tests share: the last error's text, a result that must be
//! `SW_OK`, f32 rows as little-endian bytes and back, and bfloat16 rounding.
#![allow(dead_code)]

use starwire_ffi::{sw_last_error, sw_result};
use std::ffi::CStr;

pub fn last_error() -> String {
    // SAFETY: `sw_last_error` returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(sw_last_error()) }
        .to_string_lossy()
        .into_owned()
}

pub fn ok(r: sw_result) {
    assert_eq!(r, sw_result::SW_OK, "{}", last_error());
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// `x` rounded to the nearest bfloat16 (ties to even).
pub fn bf16(x: f32) -> f32 {
    let bits = x.to_bits();
    f32::from_bits(bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000)
}
