//! The floating-point formats a [`PsTable`](super::PsTable) stores its rows in and serves
//! them as, and how elements are packed into the 64-bit words of a slot.
//!
//! A row of `dim` elements takes `ceil(dim × size / 8)` words: element `j` sits in word
//! `j / per_word` at bit `(j % per_word) × bits`, so a word's little-endian bytes are its
//! elements' little-endian bytes in order, and a row of words copied out as little-endian
//! bytes is the row as it travels. Bits of the last word past the row are zero.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::float::{bf16_bits, f16_bits, from_bf16_bits, from_f16_bits};

pub use crate::float::Float;

/// Words of a row of `dim` elements of `format`.
pub(super) fn words(format: Float, dim: usize) -> usize {
    (dim * format.size()).div_ceil(8)
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
        from_bf16_bits(bits as u16)
    }
    fn encode(x: f32) -> u64 {
        u64::from(bf16_bits(x))
    }
}

impl Format for F16 {
    const PER_WORD: usize = 4;
    const BYTES: usize = 2;
    fn decode(bits: u64) -> f32 {
        from_f16_bits(bits as u16)
    }
    fn encode(x: f32) -> u64 {
        u64::from(f16_bits(x))
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

#[cfg(test)]
mod tests {
    use super::*;

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
            .flat_map(|&v| crate::float::f32_to_bf16(v).to_le_bytes())
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
        assert_eq!(super::words(Float::Bf16, 5), 2);
        assert_eq!(super::words(Float::F32, 5), 3);
    }
}
