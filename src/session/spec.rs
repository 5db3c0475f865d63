//! What a rows request names: per table, its number, the dtype and shape of its rows, and
//! the ids ([`Rows`], as a submitter gives them; [`RowsSpec`], as a request keeps them).
//! Data only.

use arrayvec::ArrayVec;

use crate::float::Float;
use crate::wire::{DType, LossScale};

/// Highest rank of one row (the block adds the row count in front).
pub const MAX_ROW_RANK: usize = 7;

/// One table of a rows request: the table, its rows' dtype and shape, the row ids, and
/// how the rows travel.
///
/// `dtype` is the element type of the rows as the caller holds them (the table's); `wire`
/// the one they travel as, f32, bf16 or f16 for rows of one of those
/// (`docs/wire-format.md` 4.9). A pull's block arrives as it travelled
/// ([`PulledRows::read_f32`](crate::rows::PulledRows::read_f32) widens it); a push's
/// gradients are given in `dtype` and narrowed into `wire` as they are sent, and
/// `loss_scale` tells the PS what they were multiplied by. A peer whose handshake did not
/// announce `row_formats` is sent `dtype` rows instead (and gradients divided by the loss
/// scale here): the request is served all the same, and the block's dtype says so.
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
    /// The element type the rows travel as: `dtype`, or for f32, bf16 and f16 rows any of
    /// the three.
    pub wire: DType,
    /// On a push: the factor the gradients were multiplied by, which the PS divides out
    /// before it applies them. Ignored on a pull.
    pub loss_scale: Option<LossScale>,
}

impl<'a> Rows<'a> {
    /// Rows `ids` of `table`, each of `dtype` and shape `row_dims`, travelling as `dtype`.
    pub fn new(table: u32, dtype: DType, row_dims: &'a [u64], ids: &'a [u64]) -> Rows<'a> {
        Rows {
            table,
            dtype,
            row_dims,
            ids,
            wire: dtype,
            loss_scale: None,
        }
    }

    /// The same rows travelling as `wire`.
    pub fn travel_as(self, wire: DType) -> Rows<'a> {
        Rows { wire, ..self }
    }

    /// The same rows (gradients) multiplied by `scale`.
    pub fn scaled_by(self, scale: Option<LossScale>) -> Rows<'a> {
        Rows {
            loss_scale: scale,
            ..self
        }
    }

    /// Bytes of one row; `None` for an unknown dtype or a size that overflows.
    pub fn row_bytes(&self) -> Option<u64> {
        self.row_dims
            .iter()
            .try_fold(self.dtype.size()?, |acc, d| acc.checked_mul(*d))
    }
}

/// What a request keeps of one table: its number, the block that travels and the rows'
/// own dtype.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RowsSpec {
    pub table: u32,
    /// The rows' dtype as the submitter holds them (a push's gradient bytes).
    pub dtype: DType,
    /// The dtype they travel as.
    pub wire: DType,
    /// A push's loss scale, sent with it.
    pub loss_scale: Option<LossScale>,
    /// A push's loss scale the peer cannot take: divided out here before sending.
    pub unscale: Option<LossScale>,
    /// `[ids, row...]`.
    pub dims: ArrayVec<u64, { MAX_ROW_RANK + 1 }>,
}

impl RowsSpec {
    /// The spec of `rows`, checked: a known dtype, a row rank of at most
    /// [`MAX_ROW_RANK`], at least one id, at least one byte per row, a `wire` dtype that
    /// is `dtype` or (both float) converts from it, and a loss scale only on float rows.
    pub(crate) fn of(rows: &Rows<'_>) -> Option<RowsSpec> {
        if rows.ids.is_empty() || rows.row_dims.len() > MAX_ROW_RANK {
            return None;
        }
        let float = Float::from_dtype(rows.dtype).is_some();
        if rows.wire != rows.dtype && !(float && Float::from_dtype(rows.wire).is_some()) {
            return None;
        }
        if rows.loss_scale.is_some() && !float {
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
            wire: rows.wire,
            loss_scale: rows.loss_scale,
            unscale: None,
            dims,
        })
    }

    /// Number of rows.
    pub(crate) fn len(&self) -> usize {
        self.dims[0] as usize
    }

    /// The meta of the block that travels.
    pub(crate) fn meta(&self) -> crate::wire::TensorMeta<'_> {
        crate::wire::TensorMeta::new(self.wire, &self.dims).expect("checked in RowsSpec::of")
    }

    /// Bytes of the block in the rows' own dtype (a push's gradients as submitted).
    pub(crate) fn own_bytes(&self) -> u64 {
        crate::wire::TensorMeta::new(self.dtype, &self.dims)
            .expect("checked in RowsSpec::of")
            .byte_len
    }

    /// Whether the block needs the `ROW_FORMATS` feature: it travels in another dtype
    /// than the rows', or with a loss scale.
    pub(crate) fn needs_row_formats(&self) -> bool {
        self.wire != self.dtype || self.loss_scale.is_some()
    }

    /// For a peer without `ROW_FORMATS`: the rows travel as their own dtype, and a loss
    /// scale is divided out before sending.
    pub(crate) fn fall_back(&mut self) {
        self.wire = self.dtype;
        self.unscale = self.loss_scale.take().or(self.unscale);
    }

    /// What a push's gradients are multiplied by on the way out, when they are converted
    /// at all: `Some(None)` a conversion without a factor, `Some(Some(f))` with one.
    pub(crate) fn conversion(&self) -> Option<Option<f32>> {
        match self.unscale {
            Some(s) => Some(Some(s.reciprocal())),
            None => (self.wire != self.dtype).then_some(None),
        }
    }
}
