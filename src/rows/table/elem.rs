//! The floating-point formats a [`PsTable`](super::PsTable) stores its rows in and serves
//! them as, and how elements are packed into the 64-bit words of a slot.
//!
//! A row of `dim` elements takes `ceil(dim × size / 8)` words: element `j` sits in word
//! `j / per_word` at bit `(j % per_word) × bits`, so a word's little-endian bytes are its
//! elements' little-endian bytes in order, and a row of words copied out as little-endian
//! bytes is the row as it travels. Bits of the last word past the row are zero.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::wire::DType;

/// A floating-point element format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Float {
    /// IEEE 754 binary32.
    F32,
    /// bfloat16: the top half of a binary32 (8 exponent bits, 7 mantissa bits); rounded to
    /// nearest, ties to even.
    Bf16,
    /// IEEE 754 binary16 (5 exponent bits, 10 mantissa bits); rounded to nearest, ties to
    /// even; magnitudes beyond 65504 become infinite.
    F16,
}

impl Float {
    /// Bytes of one element.
    pub fn size(self) -> usize {
        match self {
            Float::F32 => 4,
            Float::Bf16 | Float::F16 => 2,
        }
    }

    /// The wire's name of this format.
    pub fn dtype(self) -> DType {
        match self {
            Float::F32 => DType::F32,
            Float::Bf16 => DType::BF16,
            Float::F16 => DType::F16,
        }
    }

    /// The format a wire dtype names, if it is one of these.
    pub fn from_dtype(dtype: DType) -> Option<Float> {
        match dtype {
            DType::F32 => Some(Float::F32),
            DType::BF16 => Some(Float::Bf16),
            DType::F16 => Some(Float::F16),
            _ => None,
        }
    }

    /// Words of a row of `dim` elements.
    pub(super) fn words(self, dim: usize) -> usize {
        (dim * self.size()).div_ceil(8)
    }
}

/// Elements a push computes together (and the unit of the fixed-size loads below).
pub(super) const CHUNK: usize = 8;

/// One element format, for code generic over it (a pull or push loop is compiled once per
/// format, with no branch per element).
pub(super) trait Format {
    /// Elements per 64-bit word.
    const PER_WORD: usize;
    /// Bytes per element.
    const BYTES: usize;
    /// The element whose bits are the low `8 × BYTES` bits of `bits`.
    fn decode(bits: u64) -> f32;
    /// The bits of `x` in this format.
    fn encode(x: f32) -> u64;

    /// Elements `first..first + 8` of the row in `words` (`first` a multiple of 8, all
    /// eight in the row): straight-line code, no loop bounds to check per element.
    #[inline(always)]
    fn load8(words: &[AtomicU64], first: usize) -> [f32; CHUNK] {
        let w = &words[first / Self::PER_WORD..][..CHUNK / Self::PER_WORD];
        let bits = 64 / Self::PER_WORD;
        let mask = u64::MAX >> (64 - bits);
        std::array::from_fn(|k| {
            let word = w[k / Self::PER_WORD].load(Relaxed);
            Self::decode((word >> ((k % Self::PER_WORD) * bits)) & mask)
        })
    }

    /// Stores eight elements as elements `first..first + 8` of the row in `words`.
    #[inline(always)]
    fn store8(words: &[AtomicU64], first: usize, vals: &[f32; CHUNK]) {
        let w = &words[first / Self::PER_WORD..][..CHUNK / Self::PER_WORD];
        let bits = 64 / Self::PER_WORD;
        for (i, word) in w.iter().enumerate() {
            let mut v = 0u64;
            for j in 0..Self::PER_WORD {
                v |= Self::encode(vals[i * Self::PER_WORD + j]) << (j * bits);
            }
            word.store(v, Relaxed);
        }
    }

    /// Eight little-endian elements from the start of `bytes`.
    #[inline(always)]
    fn read8(bytes: &[u8]) -> [f32; CHUNK] {
        let b = &bytes[..CHUNK * Self::BYTES];
        std::array::from_fn(|k| {
            let mut le = [0u8; 8];
            le[..Self::BYTES].copy_from_slice(&b[k * Self::BYTES..(k + 1) * Self::BYTES]);
            Self::decode(u64::from_le_bytes(le))
        })
    }

    /// Eight elements, little-endian, into the start of `bytes`.
    #[inline(always)]
    fn write8(vals: &[f32; CHUNK], bytes: &mut [u8]) {
        let b = &mut bytes[..CHUNK * Self::BYTES];
        for (v, d) in vals.iter().zip(b.chunks_exact_mut(Self::BYTES)) {
            d.copy_from_slice(&Self::encode(*v).to_le_bytes()[..Self::BYTES]);
        }
    }
}

/// [`Float::F32`] as a [`Format`].
pub(super) struct F32;
/// [`Float::Bf16`] as a [`Format`].
pub(super) struct Bf16;
/// [`Float::F16`] as a [`Format`].
pub(super) struct F16;

impl Format for F32 {
    const PER_WORD: usize = 2;
    const BYTES: usize = 4;
    fn decode(bits: u64) -> f32 {
        f32::from_bits(bits as u32)
    }
    fn encode(x: f32) -> u64 {
        u64::from(x.to_bits())
    }
}

impl Format for Bf16 {
    const PER_WORD: usize = 4;
    const BYTES: usize = 2;
    fn decode(bits: u64) -> f32 {
        bf16_to_f32(bits as u16)
    }
    fn encode(x: f32) -> u64 {
        u64::from(f32_to_bf16(x))
    }
}

impl Format for F16 {
    const PER_WORD: usize = 4;
    const BYTES: usize = 2;
    fn decode(bits: u64) -> f32 {
        f16_to_f32(bits as u16)
    }
    fn encode(x: f32) -> u64 {
        u64::from(f32_to_f16(x))
    }
}

/// Elements `first..first + out.len()` of the row in `words`, as f32. `first` is a multiple
/// of `F::PER_WORD`.
#[inline]
pub(super) fn load<F: Format>(words: &[AtomicU64], first: usize, out: &mut [f32]) {
    let bits = 64 / F::PER_WORD;
    let mask = u64::MAX >> (64 - bits);
    for (w, vals) in words[first / F::PER_WORD..]
        .iter()
        .zip(out.chunks_mut(F::PER_WORD))
    {
        let word = w.load(Relaxed);
        for (j, v) in vals.iter_mut().enumerate() {
            *v = F::decode((word >> (j * bits)) & mask);
        }
    }
}

/// Stores `vals` as elements `first..` of the row in `words` (`first` a multiple of
/// `F::PER_WORD`); the rest of a last, partly covered word is zero.
#[inline]
pub(super) fn store<F: Format>(words: &[AtomicU64], first: usize, vals: &[f32]) {
    let bits = 64 / F::PER_WORD;
    for (w, vals) in words[first / F::PER_WORD..]
        .iter()
        .zip(vals.chunks(F::PER_WORD))
    {
        let mut word = 0u64;
        for (j, &v) in vals.iter().enumerate() {
            word |= F::encode(v) << (j * bits);
        }
        w.store(word, Relaxed);
    }
}

/// Reads `out.len()` little-endian elements of format `F` from `bytes`.
#[inline]
pub(super) fn read<F: Format>(bytes: &[u8], out: &mut [f32]) {
    for (v, b) in out.iter_mut().zip(bytes.chunks_exact(F::BYTES)) {
        let mut le = [0u8; 8];
        le[..F::BYTES].copy_from_slice(b);
        *v = F::decode(u64::from_le_bytes(le));
    }
}

/// Writes `vals` as little-endian elements of format `F` into `bytes`.
#[inline]
pub(super) fn write<F: Format>(vals: &[f32], bytes: &mut [u8]) {
    for (v, b) in vals.iter().zip(bytes.chunks_exact_mut(F::BYTES)) {
        b.copy_from_slice(&F::encode(*v).to_le_bytes()[..F::BYTES]);
    }
}

/// Copies the row in `words` out as its little-endian bytes, `out.len()` of them: the row
/// as it travels when it is served in the format it is stored in.
#[inline]
pub(super) fn copy_out(words: &[AtomicU64], out: &mut [u8]) {
    let whole = out.len() / 8;
    let mut chunks = out.chunks_exact_mut(8);
    for (d, w) in (&mut chunks).zip(words) {
        d.copy_from_slice(&w.load(Relaxed).to_le_bytes());
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let last = words[whole].load(Relaxed).to_le_bytes();
        rest.copy_from_slice(&last[..rest.len()]);
    }
}

/// `x` in bfloat16, rounded to nearest with ties to even; a NaN stays a (quiet) NaN.
pub(super) fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1));
    (rounded >> 16) as u16
}

/// The f32 a bfloat16 stands for (exact).
pub(super) fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// `x` in binary16, rounded to nearest with ties to even; out of range: infinite; a NaN
/// stays a (quiet) NaN.
pub(super) fn f32_to_f16(x: f32) -> u16 {
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
pub(super) fn f16_to_f32(h: u16) -> f32 {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(f32_to_bf16(1.0 + 1.0 / 256.0), 0x3f80);
        // 1 + 3 × 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up.
        assert_eq!(f32_to_bf16(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(f32_to_bf16(-2.5), 0xc020);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80);
        // Every bfloat16 survives a round trip through f32.
        for h in 0..=u16::MAX {
            let x = bf16_to_f32(h);
            if !x.is_nan() {
                assert_eq!(f32_to_bf16(x), h, "{h:#x}");
            }
        }
    }

    #[test]
    fn f16_conversions() {
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(-2.0), 0xc000);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00); // rounds up past the largest finite
        assert_eq!(f32_to_f16(1e9), 0x7c00);
        assert_eq!(f32_to_f16(f32::NEG_INFINITY), 0xfc00);
        assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
        // The smallest subnormal, 2^-24, and half of it (a tie, to even: zero).
        assert_eq!(f32_to_f16(5.960_464_5e-8), 0x0001);
        assert_eq!(f32_to_f16(2.980_232_2e-8), 0x0000);
        assert_eq!(f32_to_f16(-0.0), 0x8000);
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even.
        assert_eq!(f32_to_f16(1.0 + 1.0 / 2048.0), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 / 2048.0), 0x3c02);
        // Every binary16 survives a round trip through f32.
        for h in 0..=u16::MAX {
            let x = f16_to_f32(h);
            if !x.is_nan() {
                assert_eq!(f32_to_f16(x), h, "{h:#x}");
            }
        }
        // Against the nearest binary16 found by search, for values between grid points.
        for i in 0..20_000u32 {
            let x = (i as f32 - 10_000.0) * 0.001_234_5;
            let h = f32_to_f16(x);
            let err = (f16_to_f32(h) - x).abs();
            for n in [h.wrapping_sub(1), h.wrapping_add(1)] {
                let y = f16_to_f32(n);
                if y.is_finite() && y.signum() == x.signum() {
                    assert!(err <= (y - x).abs(), "{x}: {h:#x} vs {n:#x}");
                }
            }
        }
    }

    #[test]
    fn packing_is_little_endian_bytes_in_order() {
        let words: Vec<AtomicU64> = (0..3).map(|_| AtomicU64::new(0)).collect();
        let vals = [1.0f32, -2.0, 3.5, 0.25, 7.0];
        store::<F32>(&words, 0, &vals);
        let mut out = [0u8; 20];
        copy_out(&words, &mut out);
        let want: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(out[..], want[..]);
        // The last word's unused half is zero.
        assert_eq!(words[2].load(Relaxed) >> 32, 0);
        let mut back = [0f32; 5];
        load::<F32>(&words, 0, &mut back);
        assert_eq!(back, vals);
        let mut from_bytes = [0f32; 5];
        read::<F32>(&out, &mut from_bytes);
        assert_eq!(from_bytes, vals);

        store::<Bf16>(&words, 0, &vals);
        let mut out = [0u8; 10];
        copy_out(&words, &mut out);
        let want: Vec<u8> = vals
            .iter()
            .flat_map(|&v| f32_to_bf16(v).to_le_bytes())
            .collect();
        assert_eq!(out[..], want[..]);
        let mut back = [0f32; 5];
        load::<Bf16>(&words, 0, &mut back);
        assert_eq!(back, vals); // all exact in bf16
        let mut bytes = [0u8; 10];
        write::<Bf16>(&back, &mut bytes);
        assert_eq!(bytes, out);
        // From element 4: the second word.
        let mut tail = [0f32; 1];
        load::<Bf16>(&words, 4, &mut tail);
        assert_eq!(tail, [7.0]);
        assert_eq!(Float::Bf16.words(5), 2);
        assert_eq!(Float::F32.words(5), 3);
        assert_eq!(Float::from_dtype(DType::F16), Some(Float::F16));
        assert_eq!(Float::from_dtype(DType::F64), None);
    }
}
