//! Tensor meta: dtype, shape and length of a tensor's contents (specification 4.7).

use super::bytes::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};
use super::limits::MAX_RANK;
use super::macros::enum_with_unknown;
use super::{Error, Limits, Result};

/// Length of the fixed part of a tensor meta; the dimensions follow.
pub const TENSOR_META_FIXED_LEN: usize = 16;

const FLAG_DEAD: u16 = 1;
const FLAG_CHUNKED: u16 = 2;

mod field {
    pub const DTYPE: usize = 0;
    pub const RANK: usize = 1;
    pub const FLAGS: usize = 2;
    pub const RESERVED: usize = 4;
    pub const BYTE_LEN: usize = 8;
    pub const DIMS: usize = 16;
}

enum_with_unknown! {
    /// Element type of a tensor.
    pub enum DType(u8) {
        /// Boolean, one byte, 0 or 1.
        Bool = 1,
        /// Unsigned 8-bit.
        U8 = 2,
        /// Signed 8-bit.
        I8 = 3,
        /// Unsigned 16-bit.
        U16 = 4,
        /// Signed 16-bit.
        I16 = 5,
        /// IEEE 754 binary16.
        F16 = 6,
        /// bfloat16.
        BF16 = 7,
        /// Unsigned 32-bit.
        U32 = 8,
        /// Signed 32-bit.
        I32 = 9,
        /// IEEE 754 binary32.
        F32 = 10,
        /// Unsigned 64-bit.
        U64 = 11,
        /// Signed 64-bit.
        I64 = 12,
        /// IEEE 754 binary64.
        F64 = 13,
        /// Two f32: real, imaginary.
        Complex64 = 14,
        /// Two f64: real, imaginary.
        Complex128 = 15,
    }
}

impl DType {
    /// The type's name in lower case, as messages write it (`f32`, `bf16`, `complex64`);
    /// `unknown` for a code this version does not know.
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::U16 => "u16",
            DType::I16 => "i16",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::U32 => "u32",
            DType::I32 => "i32",
            DType::F32 => "f32",
            DType::U64 => "u64",
            DType::I64 => "i64",
            DType::F64 => "f64",
            DType::Complex64 => "complex64",
            DType::Complex128 => "complex128",
            DType::Unknown(_) => "unknown",
        }
    }

    /// Size of one element in bytes, or `None` for an unknown dtype.
    pub fn size(self) -> Option<u64> {
        Some(match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::U16 | DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::U64 | DType::I64 | DType::F64 | DType::Complex64 => 8,
            DType::Complex128 => 16,
            DType::Unknown(_) => return None,
        })
    }
}

/// A view of a tensor meta inside a meta section.
#[derive(Debug, Clone, Copy)]
pub struct TensorMetaView<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TensorMetaView<T> {
    /// Wraps without checks.
    pub const fn new_unchecked(buffer: T) -> Self {
        TensorMetaView { buffer }
    }

    /// Wraps after [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let v = Self::new_unchecked(buffer);
        v.check_len()?;
        Ok(v)
    }

    /// Checks the buffer holds the fixed part and every dimension the rank announces.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < TENSOR_META_FIXED_LEN || b.len() < self.total_len_unchecked() {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    fn total_len_unchecked(&self) -> usize {
        TENSOR_META_FIXED_LEN + 8 * self.buffer.as_ref()[field::RANK] as usize
    }

    /// Length of this meta: fixed part plus dimensions.
    pub fn total_len(&self) -> usize {
        self.total_len_unchecked()
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        DType::from(self.buffer.as_ref()[field::DTYPE])
    }

    /// Number of dimensions.
    pub fn rank(&self) -> u8 {
        self.buffer.as_ref()[field::RANK]
    }

    /// Tensor flags.
    pub fn flags(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::FLAGS)
    }

    /// Reserved word (must be zero).
    pub fn reserved(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::RESERVED)
    }

    /// Length of the contents in bytes.
    pub fn byte_len(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::BYTE_LEN)
    }

    /// Dimension `i`, `None` past the rank.
    pub fn dim(&self, i: usize) -> Option<u64> {
        if i >= self.rank() as usize {
            return None;
        }
        Some(get_u64(self.buffer.as_ref(), field::DIMS + 8 * i))
    }
}

impl<'a> TensorMetaView<&'a [u8]> {
    fn dims_bytes(&self) -> &'a [u8] {
        &self.buffer[field::DIMS..self.total_len_unchecked()]
    }
}

/// A tensor's shape: the little-endian dims of a parsed frame, or native ones to emit.
#[derive(Debug, Clone, Copy)]
pub enum Dims<'a> {
    /// Dimensions as they sit in a frame: 8 little-endian bytes each.
    Wire(&'a [u8]),
    /// Dimensions in memory.
    Native(&'a [u64]),
}

impl<'a> Dims<'a> {
    /// Number of dimensions.
    pub fn len(&self) -> usize {
        match self {
            Dims::Wire(b) => b.len() / 8,
            Dims::Native(d) => d.len(),
        }
    }

    /// Whether rank is 0.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Dimension `i`.
    pub fn get(&self, i: usize) -> Option<u64> {
        match self {
            Dims::Wire(b) => b.get(8 * i..8 * i + 8).map(|s| get_u64(s, 0)),
            Dims::Native(d) => d.get(i).copied(),
        }
    }

    /// The dimensions, outermost first.
    pub fn iter(&self) -> impl Iterator<Item = u64> + Clone + 'a {
        let this = *self;
        (0..this.len()).map(move |i| this.get(i).unwrap_or(0))
    }

    /// Number of elements: 0 when any dimension is 0, 1 for rank 0, otherwise the
    /// product of the dimensions; `None` when that product overflows u64.
    pub fn elements(&self) -> Option<u64> {
        if self.iter().any(|d| d == 0) {
            return Some(0);
        }
        self.iter().try_fold(1u64, |acc, d| acc.checked_mul(d))
    }
}

impl PartialEq for Dims<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Dims<'_> {}

/// A validated tensor meta.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorMeta<'a> {
    /// Element type (known after `parse`).
    pub dtype: DType,
    /// A dead tensor: no contents, rank 0.
    pub dead: bool,
    /// Contents follow in `CHUNK` frames rather than in this frame's payload.
    pub chunked: bool,
    /// Length of the contents.
    pub byte_len: u64,
    /// Shape.
    pub dims: Dims<'a>,
}

impl<'a> TensorMeta<'a> {
    /// A live, unchunked tensor meta with `byte_len` computed from dtype and shape;
    /// `None` when the dtype is unknown or the size overflows.
    pub fn new(dtype: DType, dims: &'a [u64]) -> Option<TensorMeta<'a>> {
        let dims = Dims::Native(dims);
        let byte_len = dims.elements()?.checked_mul(dtype.size()?)?;
        Some(TensorMeta {
            dtype,
            dead: false,
            chunked: false,
            byte_len,
            dims,
        })
    }

    /// A dead tensor meta.
    pub fn dead(dtype: DType) -> TensorMeta<'static> {
        TensorMeta {
            dtype,
            dead: true,
            chunked: false,
            byte_len: 0,
            dims: Dims::Native(&[]),
        }
    }

    /// Parses and validates the meta at the start of `buf`; returns it and its length.
    pub fn parse(buf: &'a [u8], limits: &Limits) -> Result<(TensorMeta<'a>, usize)> {
        if buf.len() < TENSOR_META_FIXED_LEN {
            return Err(Error::Truncated);
        }
        let view = TensorMetaView::new_unchecked(buf);
        if view.rank() > limits.max_rank || view.rank() as usize > MAX_RANK {
            return Err(Error::RankTooLarge);
        }
        view.check_len()?;
        if view.flags() & !(FLAG_DEAD | FLAG_CHUNKED) != 0 {
            return Err(Error::BadFlags);
        }
        if view.reserved() != 0 {
            return Err(Error::ReservedNotZero);
        }
        let meta = TensorMeta {
            dtype: view.dtype(),
            dead: view.flags() & FLAG_DEAD != 0,
            chunked: view.flags() & FLAG_CHUNKED != 0,
            byte_len: view.byte_len(),
            dims: Dims::Wire(view.dims_bytes()),
        };
        meta.check(limits)?;
        Ok((meta, view.total_len()))
    }

    /// Re-reads a meta that [`parse`](Self::parse) already accepted (the entries of a body
    /// that `Body::parse` validated): the same result, without the checks. `None` only when
    /// `buf` is shorter than the meta it starts with.
    pub(crate) fn parse_validated(buf: &'a [u8]) -> Option<(TensorMeta<'a>, usize)> {
        if buf.len() < TENSOR_META_FIXED_LEN {
            return None;
        }
        let view = TensorMetaView::new_unchecked(buf);
        let total = view.total_len();
        if buf.len() < total {
            return None;
        }
        let meta = TensorMeta {
            dtype: view.dtype(),
            dead: view.flags() & FLAG_DEAD != 0,
            chunked: view.flags() & FLAG_CHUNKED != 0,
            byte_len: view.byte_len(),
            dims: Dims::Wire(view.dims_bytes()),
        };
        Some((meta, total))
    }

    /// The checks of specification 4.7 on an already decoded meta.
    pub fn check(&self, limits: &Limits) -> Result<()> {
        let elem = match self.dtype.size() {
            Some(s) => s,
            None => return Err(Error::UnknownDType(self.dtype.into())),
        };
        if self.dims.len() > limits.max_rank as usize || self.dims.len() > MAX_RANK {
            return Err(Error::RankTooLarge);
        }
        if self.dims.iter().any(|d| d > i64::MAX as u64) {
            return Err(Error::BadDim);
        }
        if self.dead {
            if self.byte_len != 0 || !self.dims.is_empty() || self.chunked {
                return Err(Error::BadDeadTensor);
            }
            return Ok(());
        }
        let expected = self
            .dims
            .elements()
            .and_then(|n| n.checked_mul(elem))
            .ok_or(Error::ByteLenMismatch)?;
        if expected != self.byte_len {
            return Err(Error::ByteLenMismatch);
        }
        if self.byte_len > limits.max_tensor_bytes {
            return Err(Error::TensorTooLarge);
        }
        if self.chunked && self.byte_len == 0 {
            return Err(Error::BadChunked);
        }
        Ok(())
    }

    /// Whether the contents travel in the payload section of the declaring frame.
    pub fn is_inline(&self) -> bool {
        !self.dead && !self.chunked
    }

    /// Bytes needed to emit this meta.
    pub fn buffer_len(&self) -> usize {
        TENSOR_META_FIXED_LEN + 8 * self.dims.len()
    }

    /// Writes exactly `buffer_len()` bytes at the start of `buf`.
    ///
    /// # Panics
    /// If `buf` is shorter than `buffer_len()` (a caller bug, never input-driven).
    pub fn emit(&self, buf: &mut [u8]) {
        let buf = &mut buf[..self.buffer_len()];
        buf[field::DTYPE] = self.dtype.into();
        buf[field::RANK] = self.dims.len() as u8;
        let mut flags = 0;
        if self.dead {
            flags |= FLAG_DEAD;
        }
        if self.chunked {
            flags |= FLAG_CHUNKED;
        }
        put_u16(buf, field::FLAGS, flags);
        put_u32(buf, field::RESERVED, 0);
        put_u64(buf, field::BYTE_LEN, self.byte_len);
        for (i, d) in self.dims.iter().enumerate() {
            put_u64(buf, field::DIMS + 8 * i, d);
        }
    }
}
