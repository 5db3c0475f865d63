//! Embedding rows in another float format than the one they are kept in: f32, bf16 and f16
//! converted into each other, as `docs/wire-format.md` (4.9) specifies for rows that travel
//! in a format other than their table's.
//!
//! - Widening (bf16 or f16 to f32) is exact; a NaN stays a NaN with its payload.
//! - Narrowing (f32 to bf16 or f16) rounds to nearest, ties to even, subnormals included
//!   (nothing is flushed to zero); a NaN becomes a quiet NaN of the same sign keeping the top
//!   bits of its payload; magnitudes past the largest finite value of the format round to
//!   infinity (f16: from 65,520 on).
//! - bf16 to f16 and back go through f32: exact widening, then one rounding.
//! - A scale factor, when given, multiplies each element in f32 between the two steps.
//!
//! [`convert`] works on little-endian bytes without alignment, as rows travel and as
//! tables hand them out: one element at a time in branch-free code that the compiler
//! vectorizes (8 elements per instruction with AVX2, which x86-64 CPUs that have it use,
//! chosen once at run time; 4 with the baseline SSE2); f32 to f16 with the F16C
//! instruction where the CPU has it (the same results). The scalar functions
//! ([`f32_to_bf16`], ...) are the reference the kernels are tested against.

mod dispatch;
#[cfg(target_arch = "x86_64")]
mod f16c;
mod format;
mod kernels;

use crate::wire::DType;

pub use format::Float;
pub use kernels::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
pub(crate) use kernels::{bf16_bits, f16_bits, from_bf16_bits, from_f16_bits};

/// Whether rows of `from` convert to rows of `to`: both are f32, bf16 or f16.
pub fn convertible(from: DType, to: DType) -> bool {
    Float::from_dtype(from).is_some() && Float::from_dtype(to).is_some()
}

/// Why a conversion cannot run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvertError {
    /// A format other than f32, bf16 or f16.
    NotFloat(DType),
    /// `src` and `dst` do not hold the same number of elements (or not whole elements).
    Length {
        /// Bytes of the source.
        src: usize,
        /// Bytes of the destination.
        dst: usize,
    },
}

impl std::fmt::Display for ConvertError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConvertError::NotFloat(d) => write!(
                f,
                "rows convert only between f32, bf16 and f16, not {}",
                d.name()
            ),
            ConvertError::Length { src, dst } => write!(
                f,
                "conversion of {src} bytes into {dst}: not the same number of elements"
            ),
        }
    }
}

impl std::error::Error for ConvertError {}

/// Converts the little-endian elements of `src` (format `from`) into `dst` (format `to`,
/// as many elements), each multiplied by `mul` in f32 first when given. Same format and
/// no factor: a copy. Allocates nothing.
pub fn convert(
    from: DType,
    src: &[u8],
    to: DType,
    dst: &mut [u8],
    mul: Option<f32>,
) -> Result<(), ConvertError> {
    let f = Float::from_dtype(from).ok_or(ConvertError::NotFloat(from))?;
    let t = Float::from_dtype(to).ok_or(ConvertError::NotFloat(to))?;
    if src.len() % f.size() != 0 || src.len() / f.size() * t.size() != dst.len() {
        return Err(ConvertError::Length {
            src: src.len(),
            dst: dst.len(),
        });
    }
    dispatch::convert(f, src, t, dst, mul);
    Ok(())
}

/// Converts f32 values into little-endian elements of `to` in `dst` (as many), each
/// multiplied by `mul` first when given.
pub fn narrow_from(
    values: &[f32],
    to: DType,
    dst: &mut [u8],
    mul: Option<f32>,
) -> Result<(), ConvertError> {
    let t = Float::from_dtype(to).ok_or(ConvertError::NotFloat(to))?;
    if values.len() * t.size() != dst.len() {
        return Err(ConvertError::Length {
            src: values.len() * 4,
            dst: dst.len(),
        });
    }
    dispatch::narrow_from(values, t, dst, mul);
    Ok(())
}

/// Converts the little-endian elements of `src` (format `from`) into f32 values in `out`
/// (as many).
pub fn widen_into(from: DType, src: &[u8], out: &mut [f32]) -> Result<(), ConvertError> {
    let f = Float::from_dtype(from).ok_or(ConvertError::NotFloat(from))?;
    if src.len() != out.len() * f.size() {
        return Err(ConvertError::Length {
            src: src.len(),
            dst: out.len() * 4,
        });
    }
    dispatch::widen_into(f, src, out);
    Ok(())
}

#[cfg(test)]
mod tests;
