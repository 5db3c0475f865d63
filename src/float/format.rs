//! [`Float`]: the element formats rows convert between.

use crate::wire::DType;

/// A floating-point element format rows may be kept in or travel as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Float {
    /// IEEE 754 binary32.
    F32,
    /// bfloat16: the top half of a binary32 (8 exponent bits, 7 mantissa bits); rounded to
    /// nearest, ties to even.
    Bf16,
    /// IEEE 754 binary16 (5 exponent bits, 10 mantissa bits); rounded to nearest, ties to
    /// even; magnitudes from 65,520 on become infinite.
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
}
