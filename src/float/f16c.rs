//! f32 to binary16 with the x86-64 F16C instruction `vcvtps2ph`: 8 elements per
//! instruction, rounded to nearest even, subnormal results kept, NaNs made quiet keeping
//! the top bits of their payload: the reference's results, which the tests compare bit for
//! bit. (The other direction stays in software: `vcvtph2ps` makes a signalling NaN quiet,
//! where widening must be exact.)
//!
//! `unsafe` is allowed here for two reasons: a function compiled for a CPU feature may be
//! called only where the CPU has it (checked first, once, `is_x86_feature_detected!`), and
//! the unaligned loads and stores of the intrinsics take raw pointers (each in bounds, as
//! said where it is done).
#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m128i, _mm256_cvtps_ph, _mm256_loadu_ps, _mm256_mul_ps, _mm256_set1_ps, _mm_storeu_si128,
    _MM_FROUND_TO_NEAREST_INT,
};
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use super::kernels::f16_bits;

/// Whether the CPU has F16C and AVX (asked once, then cached).
#[inline]
pub(super) fn available() -> bool {
    // 0: not asked yet; 1: no; 2: yes.
    static LEVEL: AtomicU8 = AtomicU8::new(0);
    match LEVEL.load(Relaxed) {
        0 => {
            let yes = std::is_x86_feature_detected!("f16c") && std::is_x86_feature_detected!("avx");
            LEVEL.store(if yes { 2 } else { 1 }, Relaxed);
            yes
        }
        level => level == 2,
    }
}

/// The little-endian f32 of `src` (as many as `dst` has room for), each times `mul` when
/// given, into little-endian binary16 in `dst`; `false`, doing nothing, on a CPU without
/// F16C.
pub(super) fn narrow_bytes(src: &[u8], dst: &mut [u8], mul: Option<f32>) -> bool {
    if !available() {
        return false;
    }
    let n = (src.len() / 4).min(dst.len() / 2);
    // SAFETY: the CPU has F16C and AVX (`available`); `src` holds `n` f32, 4 bytes each.
    unsafe { narrow(src.as_ptr().cast(), n, dst, mul) };
    true
}

/// [`narrow_bytes`] from f32 values.
pub(super) fn narrow_values(src: &[f32], dst: &mut [u8], mul: Option<f32>) -> bool {
    if !available() {
        return false;
    }
    let n = src.len().min(dst.len() / 2);
    // SAFETY: the CPU has F16C and AVX (`available`); `src` holds `n` f32.
    unsafe { narrow(src.as_ptr(), n, dst, mul) };
    true
}

/// `n` f32 read from `src` (any alignment), each times `mul` when given, into binary16 in
/// `dst` (`2 n` bytes at least).
///
/// # Safety
///
/// The CPU must have F16C and AVX, and `src` must be valid for reading `n` f32 (not
/// necessarily aligned).
#[target_feature(enable = "avx,f16c")]
unsafe fn narrow(src: *const f32, n: usize, dst: &mut [u8], mul: Option<f32>) {
    let whole = n / 8 * 8;
    let out = dst.as_mut_ptr();
    let mut i = 0;
    while i < whole {
        // SAFETY: i + 8 <= n: the 8 f32 at `src + i` are readable (the caller's promise),
        // and bytes 2i..2i + 16 of `dst` are in bounds (it has 2n); the unaligned load and
        // store take any address.
        unsafe {
            let v = _mm256_loadu_ps(src.add(i));
            let v = match mul {
                Some(m) => _mm256_mul_ps(v, _mm256_set1_ps(m)),
                None => v,
            };
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm_storeu_si128(out.add(2 * i).cast::<__m128i>(), h);
        }
        i += 8;
    }
    for k in whole..n {
        // SAFETY: k < n: the f32 at `src + k` is readable (the caller's promise).
        let v = unsafe { src.add(k).read_unaligned() };
        let v = mul.map_or(v, |m| v * m);
        dst[2 * k..2 * k + 2].copy_from_slice(&f16_bits(v).to_le_bytes());
    }
}
