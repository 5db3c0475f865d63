//! A hint to the CPU that memory will be read soon: lookups in tables larger than the
//! caches issue it for the rows they will use next, so that the misses of many rows overlap
//! instead of stalling one after the other. A demand load used as a prefetch holds its
//! instruction in the reorder window until the line arrives, which caps how many misses
//! can be outstanding; a prefetch retires at once.

/// Asks for the cache line holding `p` to be brought in for reading. A hint: it never
/// faults, whatever the address, and changes nothing a program can observe but timing.
#[inline(always)]
pub fn read<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 only hints the cache: it does not fault on any address, valid or
    // not, and writes nothing; its target feature (SSE) is part of every x86_64 CPU.
    unsafe {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Asks for the cache line holding `p` to be brought in for writing (owned, so the store
/// that follows need not ask again). A hint, like [`read`].
#[inline(always)]
pub fn write<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as for `read`: a prefetch hint never faults and writes nothing.
    unsafe {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0};
        _mm_prefetch::<_MM_HINT_ET0>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
