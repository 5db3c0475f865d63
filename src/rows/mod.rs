//! Embedding rows as packed blocks: what a worker asks a PS for, and what it gets back.
//!
//! A rows request names each table once, with the rows' dtype and shape and their ids; the
//! answer is one block per table, `ids.len() × row_bytes` in request order, and the
//! positions of the rows the PS does not have (their bytes are zero). On the wire each
//! row costs its 8-byte id and its bytes: no per-row descriptor. See
//! [`Client::pull_rows`](crate::Client::pull_rows) and
//! [`Client::push_rows`](crate::Client::push_rows); a PS serves rows through
//! [`Service::table`](crate::Service::table).
//!
//! A worker whose tables are partitioned over several PS tasks plans each step with a
//! [`Plan`]: duplicate ids removed, the distinct ones spread over the shards by a
//! [`Partition`], the answers scattered back into the batch and the gradients of
//! duplicates summed.

mod plan;

pub use plan::{Partition, Plan, PlanError};

use arrayvec::ArrayVec;

use crate::tensor::Tensor;
use crate::wire::{DType, Status};

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

/// The answer to a rows pull: per table, in request order, its block of rows or why there
/// is none, and the rows the PS did not have.
#[derive(Debug, PartialEq, Default)]
pub struct PulledRows {
    pub(crate) blocks: Vec<Result<Tensor, Status>>,
    /// Positions of missing rows, all tables'.
    pub(crate) missing: Vec<u32>,
    /// Per table: where its missing rows are in `missing`.
    pub(crate) spans: Vec<(u32, u32)>,
}

impl PulledRows {
    /// Number of tables.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether there are no tables.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Table `t`'s block (`[ids, row...]`, rows in request order), or why there is none.
    pub fn block(&self, t: usize) -> Result<&Tensor, Status> {
        match self.blocks.get(t) {
            Some(Ok(b)) => Ok(b),
            Some(Err(s)) => Err(*s),
            None => Err(Status::InvalidArgument),
        }
    }

    /// Takes table `t`'s block out (the answer keeps `Err(NOT_FOUND)` in its place).
    pub fn take_block(&mut self, t: usize) -> Result<Tensor, Status> {
        match self.blocks.get_mut(t) {
            Some(b) => std::mem::replace(b, Err(Status::NotFound)),
            None => Err(Status::InvalidArgument),
        }
    }

    /// Row `i` of table `t`'s block; `None` when the table failed or `i` is out of range.
    pub fn row(&self, t: usize, i: usize) -> Option<&[u8]> {
        let b = self.block(t).ok()?;
        let n = *b.dims().first()? as usize;
        let row = b.byte_len() / n;
        b.bytes().get(i * row..(i + 1) * row)
    }

    /// Positions (in the request's ids of table `t`) of the rows the PS did not have,
    /// increasing; their bytes in the block are zero.
    pub fn missing(&self, t: usize) -> &[u32] {
        match self.spans.get(t) {
            Some(&(start, len)) => &self.missing[start as usize..(start + len) as usize],
            None => &[],
        }
    }
}
