//! The conversions element by element: the scalar reference ([`f32_to_bf16`], ...), the
//! branch-free forms the kernels use, and the kernel itself, generic over where elements
//! come from and go to.

/// `x` in bfloat16, rounded to nearest with ties to even; a NaN stays a (quiet) NaN.
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1));
    (rounded >> 16) as u16
}

/// The f32 a bfloat16 stands for (exact).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// `x` in binary16, rounded to nearest with ties to even; out of range: infinite; a NaN
/// stays a (quiet) NaN.
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        let nan = if man != 0 {
            0x200 | (man >> 13) as u16
        } else {
            0
        };
        return sign | 0x7c00 | nan;
    }
    // The exponent rebiased for binary16.
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // A subnormal binary16 (or zero): the mantissa with its implicit bit, shifted.
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1 << shift) - 1);
        let mut h = m >> shift;
        if rest > half || (rest == half && h & 1 == 1) {
            h += 1;
        }
        return sign | h as u16;
    }
    let mut h = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    // A carry out of the mantissa raises the exponent, to infinity at the top: correct.
    if rest > 0x1000 || (rest == 0x1000 && h & 1 == 1) {
        h += 1;
    }
    sign | h as u16
}

/// The f32 a binary16 stands for (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    match exp {
        0 => {
            // Zero or subnormal: man × 2^-24, exact in f32.
            let v = man as f32 * (1.0 / 16_777_216.0);
            if sign != 0 {
                -v
            } else {
                v
            }
        }
        0x1f => f32::from_bits(sign | 0x7f80_0000 | (man << 13)),
        _ => f32::from_bits(sign | ((exp + 112) << 23) | (man << 13)),
    }
}

// ----- branch-free forms: the same results, written so that a loop of them vectorizes -----

/// [`f32_to_bf16`] without a branch.
#[inline(always)]
pub(crate) fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
    let quiet = (b >> 16) | 0x40;
    (if x.is_nan() { quiet } else { rounded }) as u16
}

/// [`bf16_to_f32`] (already branch-free).
#[inline(always)]
pub(crate) fn from_bf16_bits(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// [`f32_to_f16`] without a branch.
#[inline(always)]
pub(crate) fn f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = (b >> 16) & 0x8000;
    let a = b & 0x7fff_ffff;
    // Normal results: rebias the exponent (-112 << 23) and round the 13 bits dropped to
    // nearest even (0xfff, plus the lowest bit kept); a carry past 65,504 gives infinity.
    let odd = (a >> 13) & 1;
    let normal = a.wrapping_add(0xc800_0fff).wrapping_add(odd) >> 13;
    // Below 2^-14: adding 0.5 rounds to a multiple of 2^-24 (the ulp of 0.5 in f32, and
    // the step of binary16's subnormals), to nearest even; what is above 0.5 is the result.
    let sub = (f32::from_bits(a) + 0.5).to_bits().wrapping_sub(0x3f00_0000);
    let mut h = if a < 0x3880_0000 { sub } else { normal };
    h = if a >= 0x4780_0000 { 0x7c00 } else { h };
    h = if a > 0x7f80_0000 {
        0x7e00 | ((a >> 13) & 0x3ff)
    } else {
        h
    };
    (h | sign) as u16
}

/// [`f16_to_f32`] without a branch.
#[inline(always)]
pub(crate) fn from_f16_bits(h: u16) -> f32 {
    let h = u32::from(h);
    // Exponent and mantissa moved into place and scaled by 2^112: exact for normal and
    // subnormal values alike (the product of a subnormal f32 and a power of two).
    let scaled = f32::from_bits((h & 0x7fff) << 13) * f32::from_bits((254 - 15) << 23);
    let bits = scaled.to_bits();
    // Infinity and NaN (exponent 31) land at 65,536 and above: give them f32's top
    // exponent, with the mantissa (a NaN's payload) kept.
    let infnan = 0u32.wrapping_sub(u32::from(scaled >= 65_536.0));
    f32::from_bits(bits | (0x7f80_0000 & infnan) | ((h & 0x8000) << 16))
}

// ----- the kernel -----

/// Where a kernel reads elements: units of `U`, `W` of them per element.
pub(crate) trait Load {
    type U: Copy;
    const W: usize;
    fn load(u: &[Self::U]) -> f32;
}

/// Where a kernel writes elements.
pub(crate) trait Store {
    type U: Copy;
    const W: usize;
    fn store(v: f32, u: &mut [Self::U]);
}

/// The first 4 bytes of `u`.
#[inline(always)]
fn word(u: &[u8]) -> [u8; 4] {
    let mut w = [0u8; 4];
    w.copy_from_slice(&u[..4]);
    w
}

/// The first 2 bytes of `u`.
#[inline(always)]
fn half(u: &[u8]) -> [u8; 2] {
    let mut h = [0u8; 2];
    h.copy_from_slice(&u[..2]);
    h
}

/// Little-endian f32 bytes.
pub(crate) struct F32Le;
/// Little-endian bfloat16 bytes.
pub(crate) struct Bf16Le;
/// Little-endian binary16 bytes.
pub(crate) struct F16Le;
/// f32 values.
pub(crate) struct Values;

impl Load for F32Le {
    type U = u8;
    const W: usize = 4;
    #[inline(always)]
    fn load(u: &[u8]) -> f32 {
        // Through an array: one 32-bit load (byte by byte, the compiler vectorizes the
        // bytes, which is slower).
        f32::from_le_bytes(word(u))
    }
}

impl Store for F32Le {
    type U = u8;
    const W: usize = 4;
    #[inline(always)]
    fn store(v: f32, u: &mut [u8]) {
        u[..4].copy_from_slice(&v.to_le_bytes());
    }
}

impl Load for Bf16Le {
    type U = u8;
    const W: usize = 2;
    #[inline(always)]
    fn load(u: &[u8]) -> f32 {
        from_bf16_bits(u16::from_le_bytes(half(u)))
    }
}

impl Store for Bf16Le {
    type U = u8;
    const W: usize = 2;
    #[inline(always)]
    fn store(v: f32, u: &mut [u8]) {
        u[..2].copy_from_slice(&bf16_bits(v).to_le_bytes());
    }
}

impl Load for F16Le {
    type U = u8;
    const W: usize = 2;
    #[inline(always)]
    fn load(u: &[u8]) -> f32 {
        from_f16_bits(u16::from_le_bytes(half(u)))
    }
}

impl Store for F16Le {
    type U = u8;
    const W: usize = 2;
    #[inline(always)]
    fn store(v: f32, u: &mut [u8]) {
        u[..2].copy_from_slice(&f16_bits(v).to_le_bytes());
    }
}

impl Load for Values {
    type U = f32;
    const W: usize = 1;
    #[inline(always)]
    fn load(u: &[f32]) -> f32 {
        u[0]
    }
}

impl Store for Values {
    type U = f32;
    const W: usize = 1;
    #[inline(always)]
    fn store(v: f32, u: &mut [f32]) {
        u[0] = v;
    }
}

/// Converts every element of `src` into `dst` (as many), multiplied by `mul` when
/// `SCALED`. One element per iteration, no branch: the compiler's loop vectorizer turns it
/// into 4 (SSE2) or 8 (AVX2) elements per instruction. (Chunks of 8 or 16 in local arrays
/// measured slower here: the compiler vectorized across chunks, gathering the elements of
/// four chunks into each register.)
#[inline(always)]
pub(crate) fn run<L: Load, S: Store, const SCALED: bool>(
    src: &[L::U],
    dst: &mut [S::U],
    mul: f32,
) {
    for (s, d) in src.chunks_exact(L::W).zip(dst.chunks_exact_mut(S::W)) {
        let mut v = L::load(s);
        if SCALED {
            v *= mul;
        }
        S::store(v, d);
    }
}
