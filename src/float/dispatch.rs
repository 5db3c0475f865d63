//! Which build of the kernels runs: on x86-64 CPUs with AVX2, the same code compiled for
//! AVX2 (8 elements per instruction instead of the baseline's 4), chosen once.
//!
//! `unsafe` is allowed here for one reason: a function compiled for a CPU feature may be
//! called only where the CPU has it, which the compiler cannot know of a baseline build;
//! the one call site checks it first (`is_x86_feature_detected!`, cached).
#![allow(unsafe_code)]

use super::kernels::{run, Bf16Le, F16Le, F32Le, Load, Store, Values};
use super::format::Float;

/// Runs the kernel `L -> S`, with the widest vectors this CPU has.
#[inline(always)]
fn pick<L: Load, S: Store, const SCALED: bool>(src: &[L::U], dst: &mut [S::U], mul: f32) {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: `run_avx2` needs AVX2, and `avx2()` says the CPU has it (cpuid, through
        // `is_x86_feature_detected!`). Its body is the safe `run`, compiled for AVX2.
        return unsafe { run_avx2::<L, S, SCALED>(src, dst, mul) };
    }
    run::<L, S, SCALED>(src, dst, mul)
}

/// [`run`] compiled for AVX2.
///
/// # Safety
///
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn run_avx2<L: Load, S: Store, const SCALED: bool>(
    src: &[L::U],
    dst: &mut [S::U],
    mul: f32,
) {
    run::<L, S, SCALED>(src, dst, mul)
}

/// Whether the CPU has AVX2 (asked once, then cached).
#[cfg(target_arch = "x86_64")]
#[inline]
fn avx2() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
    // 0: not asked yet; 1: no; 2: yes.
    static LEVEL: AtomicU8 = AtomicU8::new(0);
    match LEVEL.load(Relaxed) {
        0 => {
            let yes = std::is_x86_feature_detected!("avx2");
            LEVEL.store(if yes { 2 } else { 1 }, Relaxed);
            yes
        }
        level => level == 2,
    }
}

/// Runs `L -> S` scaled by `mul` when given.
#[inline(always)]
fn scaled<L: Load, S: Store>(src: &[L::U], dst: &mut [S::U], mul: Option<f32>) {
    match mul {
        Some(m) => pick::<L, S, true>(src, dst, m),
        None => pick::<L, S, false>(src, dst, 1.0),
    }
}

/// f32 bytes into f16 bytes: with F16C where the CPU has it.
fn f32_to_f16(src: &[u8], dst: &mut [u8], mul: Option<f32>) {
    #[cfg(target_arch = "x86_64")]
    if super::f16c::narrow_bytes(src, dst, mul) {
        return;
    }
    scaled::<F32Le, F16Le>(src, dst, mul)
}

/// f32 values into f16 bytes: with F16C where the CPU has it.
fn values_to_f16(values: &[f32], dst: &mut [u8], mul: Option<f32>) {
    #[cfg(target_arch = "x86_64")]
    if super::f16c::narrow_values(values, dst, mul) {
        return;
    }
    scaled::<Values, F16Le>(values, dst, mul)
}

/// Bytes of `from` into bytes of `to` (lengths checked by the caller).
pub(super) fn convert(from: Float, src: &[u8], to: Float, dst: &mut [u8], mul: Option<f32>) {
    match (from, to, mul) {
        (f, t, None) if f == t => dst.copy_from_slice(src),
        (Float::F32, Float::F32, _) => scaled::<F32Le, F32Le>(src, dst, mul),
        (Float::F32, Float::Bf16, _) => scaled::<F32Le, Bf16Le>(src, dst, mul),
        (Float::F32, Float::F16, _) => f32_to_f16(src, dst, mul),
        (Float::Bf16, Float::F32, _) => scaled::<Bf16Le, F32Le>(src, dst, mul),
        (Float::Bf16, Float::Bf16, _) => scaled::<Bf16Le, Bf16Le>(src, dst, mul),
        (Float::Bf16, Float::F16, _) => scaled::<Bf16Le, F16Le>(src, dst, mul),
        (Float::F16, Float::F32, _) => scaled::<F16Le, F32Le>(src, dst, mul),
        (Float::F16, Float::Bf16, _) => scaled::<F16Le, Bf16Le>(src, dst, mul),
        (Float::F16, Float::F16, _) => scaled::<F16Le, F16Le>(src, dst, mul),
    }
}

/// f32 values into bytes of `to` (lengths checked by the caller).
pub(super) fn narrow_from(values: &[f32], to: Float, dst: &mut [u8], mul: Option<f32>) {
    match to {
        Float::F32 => scaled::<Values, F32Le>(values, dst, mul),
        Float::Bf16 => scaled::<Values, Bf16Le>(values, dst, mul),
        Float::F16 => values_to_f16(values, dst, mul),
    }
}

/// Bytes of `from` into f32 values (lengths checked by the caller).
pub(super) fn widen_into(from: Float, src: &[u8], out: &mut [f32]) {
    match from {
        Float::F32 => scaled::<F32Le, Values>(src, out, None),
        Float::Bf16 => scaled::<Bf16Le, Values>(src, out, None),
        Float::F16 => scaled::<F16Le, Values>(src, out, None),
    }
}
