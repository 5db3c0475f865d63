//! The element types a typed rows buffer may hold ([`RowElement`]), and their conversion
//! from and to the little-endian bytes rows travel as.

use crate::error::Error;
use crate::wire::DType;

mod sealed {
    /// Marks the types [`RowElement`](super::RowElement) is implemented for.
    pub trait Sealed {}
}

/// An element of embedding rows as a Rust buffer holds it: `f32`, `f64`, `i8`, `i16`,
/// `i32`, `i64`, `u8`, `u16`, `u32` or `u64`, each with its wire [`DType`]. Rows travel as
/// little-endian bytes with no alignment; the typed calls of [`Sharded`](crate::Sharded)
/// ([`pull_typed`](crate::Sharded::pull_typed), [`push_typed`](crate::Sharded::push_typed))
/// convert with these. Sealed: the set follows the wire's dtypes.
pub trait RowElement: Copy + sealed::Sealed + 'static {
    /// The element's wire dtype.
    const DTYPE: DType;
    /// Bytes of one element.
    const SIZE: usize;
    /// The element held in `bytes`, [`SIZE`](Self::SIZE) little-endian bytes.
    fn from_le(bytes: &[u8]) -> Self;
    /// Writes the element into `out`, [`SIZE`](Self::SIZE) bytes, little-endian.
    fn write_le(self, out: &mut [u8]);
}

macro_rules! row_elements {
    ($($t:ty => $dtype:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl RowElement for $t {
            const DTYPE: DType = DType::$dtype;
            const SIZE: usize = core::mem::size_of::<$t>();
            #[inline]
            fn from_le(bytes: &[u8]) -> $t {
                let mut b = [0u8; core::mem::size_of::<$t>()];
                b.copy_from_slice(bytes);
                <$t>::from_le_bytes(b)
            }
            #[inline]
            fn write_le(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}

row_elements!(
    f32 => F32,
    f64 => F64,
    i8 => I8,
    i16 => I16,
    i32 => I32,
    i64 => I64,
    u8 => U8,
    u16 => U16,
    u32 => U32,
    u64 => U64,
);

/// Converts little-endian `bytes` into `out` (`out.len() * T::SIZE` bytes).
pub(crate) fn decode<T: RowElement>(bytes: &[u8], out: &mut [T]) {
    debug_assert_eq!(bytes.len(), out.len() * T::SIZE);
    for (v, b) in out.iter_mut().zip(bytes.chunks_exact(T::SIZE)) {
        *v = T::from_le(b);
    }
}

/// Converts `values` into little-endian `out` (`values.len() * T::SIZE` bytes).
pub(crate) fn encode<T: RowElement>(values: &[T], out: &mut [u8]) {
    debug_assert_eq!(out.len(), values.len() * T::SIZE);
    for (v, b) in values.iter().zip(out.chunks_exact_mut(T::SIZE)) {
        v.write_le(b);
    }
}

/// Checks that `T` is the element type of table `table` (rows of `dtype`, `row_bytes` each)
/// and that `len` elements are whole rows for `ids`; the bytes they take. `what` names the
/// caller's slice in the error.
pub(crate) fn typed_len<T: RowElement>(
    table: u32,
    dtype: DType,
    row_bytes: usize,
    ids: &[u64],
    len: usize,
    what: &str,
) -> Result<usize, Error> {
    if T::DTYPE != dtype {
        return Err(Error::invalid(&format!(
            "rows: table {table} holds {dtype:?} rows; {what} is of {:?}",
            T::DTYPE
        )));
    }
    let bytes = len.checked_mul(T::SIZE);
    if bytes != ids.len().checked_mul(row_bytes) {
        return Err(Error::invalid(&format!(
            "rows: {what} holds {len} elements; {} ids need {} ({} per row)",
            ids.len(),
            ids.len().saturating_mul(row_bytes / T::SIZE),
            row_bytes / T::SIZE
        )));
    }
    Ok(len * T::SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_round_trip_through_little_endian_bytes() {
        let values = [1.5f32, -0.25, f32::MAX];
        let mut bytes = [0u8; 12];
        encode(&values, &mut bytes);
        assert_eq!(&bytes[..4], &1.5f32.to_le_bytes());
        let mut back = [0f32; 3];
        decode(&bytes, &mut back);
        assert_eq!(back, values);
        let mut b = [0u8; 8];
        encode(&[-2i64], &mut b);
        assert_eq!(<i64 as RowElement>::from_le(&b), -2);
        assert_eq!(
            (<u16 as RowElement>::DTYPE, <u16 as RowElement>::SIZE),
            (DType::U16, 2)
        );
        assert_eq!(<f64 as RowElement>::DTYPE.size(), Some(8));
    }
}
