//! What a rows request names: per table, its number, the dtype and shape of its rows, and
//! the ids ([`Rows`], as a submitter gives them; [`RowsSpec`], as a request keeps them).
//! Data only.

use arrayvec::ArrayVec;

use crate::wire::DType;

/// Highest rank of one row (the block adds the row count in front).
pub const MAX_ROW_RANK: usize = 7;

/// One table of a rows request: the table, its rows' dtype and shape, and the row ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rows<'a> {
    /// The table, as the PS numbers its tables.
    pub table: u32,
    /// Element type of the rows.
    pub dtype: DType,
    /// Shape of one row, e.g. `[dim]` (at most [`MAX_ROW_RANK`] dimensions).
    pub row_dims: &'a [u64],
    /// The row ids (at least one).
    pub ids: &'a [u64],
}

impl<'a> Rows<'a> {
    /// Rows `ids` of `table`, each of `dtype` and shape `row_dims`.
    pub fn new(table: u32, dtype: DType, row_dims: &'a [u64], ids: &'a [u64]) -> Rows<'a> {
        Rows {
            table,
            dtype,
            row_dims,
            ids,
        }
    }

    /// Bytes of one row; `None` for an unknown dtype or a size that overflows.
    pub fn row_bytes(&self) -> Option<u64> {
        self.row_dims
            .iter()
            .try_fold(self.dtype.size()?, |acc, d| acc.checked_mul(*d))
    }
}

/// What a request keeps of one table: its number and the block it expects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RowsSpec {
    pub table: u32,
    pub dtype: DType,
    /// `[ids, row...]`.
    pub dims: ArrayVec<u64, { MAX_ROW_RANK + 1 }>,
}

impl RowsSpec {
    /// The spec of `rows`, checked: a known dtype, a row rank of at most
    /// [`MAX_ROW_RANK`], at least one id, and at least one byte per row.
    pub(crate) fn of(rows: &Rows<'_>) -> Option<RowsSpec> {
        if rows.ids.is_empty() || rows.row_dims.len() > MAX_ROW_RANK {
            return None;
        }
        let row = rows.row_bytes()?;
        row.checked_mul(rows.ids.len() as u64).filter(|&b| b > 0)?;
        let mut dims = ArrayVec::new();
        dims.push(rows.ids.len() as u64);
        dims.try_extend_from_slice(rows.row_dims).ok()?;
        Some(RowsSpec {
            table: rows.table,
            dtype: rows.dtype,
            dims,
        })
    }

    /// Number of rows.
    pub(crate) fn len(&self) -> usize {
        self.dims[0] as usize
    }

    /// The block's meta.
    pub(crate) fn meta(&self) -> crate::wire::TensorMeta<'_> {
        crate::wire::TensorMeta::new(self.dtype, &self.dims).expect("checked in RowsSpec::of")
    }
}
