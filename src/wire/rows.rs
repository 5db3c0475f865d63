//! Embedding rows as packed blocks: the table sections of `PULL_ROWS` and `PUSH_ROWS`
//! (specification 4.9) and the missing-rows report of a `RESPONSE` entry (4.5).
//!
//! A table section names one table once, with the block of rows it is about as one tensor
//! meta (`[n, row...]`) and the `n` row ids. Per row the wire carries its 8-byte id and its
//! bytes in the block: no per-row descriptor.

use super::bytes::{get_u32, get_u64, put_u32, put_u64};
use super::error::truncated_meta;
use super::features::{LossScale, WireFeatures};
use super::tensor::TensorMeta;
use super::{Error, Limits, Result};

/// Response entry flag: a missing-rows report follows the tensor meta.
pub const ENTRY_HAS_MISSING: u16 = 2;

/// Fixed part of a table section: table id, and a word that is reserved, or the loss scale
/// with [`WireFeatures::ROW_FORMATS`].
const TABLE_FIXED_LEN: usize = 8;

/// One table of a `PULL_ROWS` or `PUSH_ROWS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowsTable<'a> {
    /// The table, as the responder numbers its tables.
    pub table: u32,
    /// The block: `[n, row...]`, `n` the number of ids. In a `PULL_ROWS` the block asked
    /// for (it travels in the answer); in a `PUSH_ROWS` the gradient rows, whose contents
    /// are in the payload section (or in `CHUNK` frames when `chunked`).
    pub block: TensorMeta<'a>,
    /// The row ids, as little-endian u64 bytes (`8 × n`).
    ids: &'a [u8],
    /// In a `PUSH_ROWS` on a connection with [`WireFeatures::ROW_FORMATS`]: the factor the
    /// gradients were multiplied by, which the responder divides out. `None` travels as 0
    /// (the reserved word of a connection without the feature).
    pub loss_scale: Option<LossScale>,
}

impl<'a> RowsTable<'a> {
    /// A table section for `ids` with block `block` (`block.dims[0]` must equal
    /// `ids.len() / 8`; the encoder checks), without a loss scale.
    pub fn new(table: u32, block: TensorMeta<'a>, ids: &'a [u8]) -> RowsTable<'a> {
        RowsTable {
            table,
            block,
            ids,
            loss_scale: None,
        }
    }

    /// Number of rows (ids).
    pub fn len(&self) -> usize {
        self.ids.len() / 8
    }

    /// Whether the table has no rows (never, once parsed).
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Id of row `i`.
    pub fn id(&self, i: usize) -> Option<u64> {
        self.ids.get(8 * i..8 * i + 8).map(|b| get_u64(b, 0))
    }

    /// The ids, in row order.
    pub fn ids(&self) -> impl ExactSizeIterator<Item = u64> + 'a {
        self.ids.chunks_exact(8).map(|b| get_u64(b, 0))
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> u64 {
        match self.len() as u64 {
            0 => 0,
            n => self.block.byte_len / n,
        }
    }

    /// The shape of one row: the block's dimensions after the first.
    pub fn row_dims(&self) -> impl Iterator<Item = u64> + 'a {
        self.block.dims.iter().skip(1)
    }

    /// Bytes needed to emit.
    pub fn buffer_len(&self) -> usize {
        TABLE_FIXED_LEN + self.block.buffer_len() + self.ids.len()
    }

    /// Writes exactly `buffer_len()` bytes.
    pub fn emit(&self, buf: &mut [u8]) {
        put_u32(buf, 0, self.table);
        put_u32(buf, 4, LossScale::to_wire(self.loss_scale));
        let m = self.block.buffer_len();
        self.block.emit(&mut buf[TABLE_FIXED_LEN..]);
        let at = TABLE_FIXED_LEN + m;
        buf[at..at + self.ids.len()].copy_from_slice(self.ids);
    }
}

/// Meta length of a `PULL_ROWS` or `PUSH_ROWS` table section for a block of rank `rank`
/// and `n` ids.
pub fn pull_rows_meta_len(rank: usize, n: usize) -> usize {
    TABLE_FIXED_LEN + super::TENSOR_META_FIXED_LEN + 8 * rank + 8 * n
}

/// Writes a table section (`pull_rows_meta_len(block rank, ids.len())` bytes) from native
/// ids, without a loss scale.
pub fn emit_pull_rows_meta(table: u32, block: &TensorMeta<'_>, ids: &[u64], buf: &mut [u8]) {
    emit_rows_meta(table, None, block, ids, buf)
}

/// Writes a table section (`pull_rows_meta_len(block rank, ids.len())` bytes) from native
/// ids, with `loss_scale` (only on a `PUSH_ROWS` of a connection that negotiated
/// [`WireFeatures::ROW_FORMATS`]; the encoder does not check).
pub fn emit_rows_meta(
    table: u32,
    loss_scale: Option<LossScale>,
    block: &TensorMeta<'_>,
    ids: &[u64],
    buf: &mut [u8],
) {
    put_u32(buf, 0, table);
    put_u32(buf, 4, LossScale::to_wire(loss_scale));
    let m = block.buffer_len();
    block.emit(&mut buf[TABLE_FIXED_LEN..]);
    let at = TABLE_FIXED_LEN + m;
    for (i, id) in ids.iter().enumerate() {
        put_u64(buf, at + 8 * i, *id);
    }
}

/// Iterator over the validated tables of a `PULL_ROWS` or `PUSH_ROWS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowsTables<'a> {
    bytes: &'a [u8],
    remaining: u32,
}

impl<'a> RowsTables<'a> {
    /// Validates the table sections on a connection with `features`; returns them and the
    /// inline payload bytes they declare (always 0 for a pull).
    pub(super) fn parse(
        meta: &'a [u8],
        count: u32,
        limits: &Limits,
        push: bool,
        features: WireFeatures,
    ) -> Result<(Self, u64)> {
        let (mut at, mut inline, mut rows) = (0usize, 0u64, 0u64);
        let scales = features.contains(WireFeatures::ROW_FORMATS);
        for _ in 0..count {
            let rest = meta.get(at..).ok_or(Error::BadMetaLen)?;
            if rest.len() < TABLE_FIXED_LEN {
                return Err(Error::BadMetaLen);
            }
            match get_u32(rest, 4) {
                0 => {}
                _ if !scales => return Err(Error::ReservedNotZero),
                bits if !push || LossScale::from_wire(bits).is_err() => {
                    return Err(Error::BadLossScale)
                }
                _ => {}
            }
            let (block, len) =
                TensorMeta::parse(&rest[TABLE_FIXED_LEN..], limits).map_err(truncated_meta)?;
            let n = block.dims.get(0).ok_or(Error::BadRows)?;
            if block.dead || n == 0 || block.byte_len == 0 || (block.chunked && !push) {
                return Err(Error::BadRows);
            }
            rows += n;
            if rows > limits.max_rows as u64 {
                return Err(Error::TooManyRows);
            }
            if block.byte_len / n > limits.max_row_bytes as u64 {
                return Err(Error::RowTooLarge);
            }
            at += TABLE_FIXED_LEN + len;
            let ids_len = 8 * n as usize; // n <= max_rows <= 2^26: no overflow
            if meta.len() - at.min(meta.len()) < ids_len {
                return Err(Error::BadMetaLen);
            }
            at += ids_len;
            if push && block.is_inline() {
                inline = inline
                    .checked_add(block.byte_len)
                    .ok_or(Error::BadPayloadLen)?;
            }
        }
        if at != meta.len() {
            return Err(Error::BadMetaLen);
        }
        let tables = RowsTables {
            bytes: meta,
            remaining: count,
        };
        Ok((tables, inline))
    }

    /// Number of tables not yet iterated.
    pub fn len(&self) -> usize {
        self.remaining as usize
    }

    /// Whether no table is left.
    pub fn is_empty(&self) -> bool {
        self.remaining == 0
    }
}

impl<'a> Iterator for RowsTables<'a> {
    type Item = RowsTable<'a>;

    fn next(&mut self) -> Option<RowsTable<'a>> {
        if self.remaining == 0 {
            return None;
        }
        let fixed = self.bytes.get(..TABLE_FIXED_LEN)?;
        let table = get_u32(fixed, 0);
        // Checked by `parse`: 0, or a scale in range.
        let loss_scale = LossScale::from_wire(get_u32(fixed, 4)).ok().flatten();
        let (block, len) = TensorMeta::parse_validated(self.bytes.get(TABLE_FIXED_LEN..)?)?;
        let at = TABLE_FIXED_LEN + len;
        let n = block.dims.get(0)? as usize;
        let ids = self.bytes.get(at..at + 8 * n)?;
        self.bytes = self.bytes.get(at + 8 * n..)?;
        self.remaining -= 1;
        Some(RowsTable {
            table,
            block,
            ids,
            loss_scale,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining as usize, Some(self.remaining as usize))
    }
}

/// The rows a responder did not have, by position in the request's ids (increasing); their
/// bytes in the block are zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing<'a> {
    /// Little-endian u32 positions, as on the wire.
    Wire(&'a [u8]),
    /// Native positions, for emitting.
    Native(&'a [u32]),
}

impl Default for Missing<'_> {
    fn default() -> Self {
        Missing::Native(&[])
    }
}

impl<'a> Missing<'a> {
    /// Validates the report at the start of `buf` (a u32 count, then the positions) for a
    /// block of `rows` rows; returns it and its length.
    pub(super) fn parse(buf: &'a [u8], rows: u64, limits: &Limits) -> Result<(Self, usize)> {
        if buf.len() < 4 {
            return Err(Error::BadMetaLen);
        }
        let count = get_u32(buf, 0);
        if count == 0 || count > limits.max_rows || count as u64 > rows {
            return Err(Error::BadMissing);
        }
        let len = 4 + 4 * count as usize;
        let bytes = buf.get(4..len).ok_or(Error::BadMetaLen)?;
        let mut prev: Option<u32> = None;
        for p in bytes.chunks_exact(4).map(|b| get_u32(b, 0)) {
            if p as u64 >= rows || prev.is_some_and(|q| p <= q) {
                return Err(Error::BadMissing);
            }
            prev = Some(p);
        }
        Ok((Missing::Wire(bytes), len))
    }

    /// Re-reads a report that [`parse`](Self::parse) accepted.
    pub(super) fn parse_validated(buf: &'a [u8]) -> Option<(Self, usize)> {
        let count = get_u32(buf.get(..4)?, 0) as usize;
        let bytes = buf.get(4..4 + 4 * count)?;
        Some((Missing::Wire(bytes), 4 + 4 * count))
    }

    /// Number of missing rows.
    pub fn len(&self) -> usize {
        match self {
            Missing::Wire(b) => b.len() / 4,
            Missing::Native(v) => v.len(),
        }
    }

    /// Whether every row was found.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Position `i` of the report.
    pub fn get(&self, i: usize) -> Option<u32> {
        match self {
            Missing::Wire(b) => b.get(4 * i..4 * i + 4).map(|b| get_u32(b, 0)),
            Missing::Native(v) => v.get(i).copied(),
        }
    }

    /// The positions, increasing.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = u32> + 'a {
        let m = *self;
        (0..m.len()).map(move |i| m.get(i).unwrap_or(0))
    }

    /// Bytes needed to emit (nothing when empty).
    pub fn buffer_len(&self) -> usize {
        if self.is_empty() {
            0
        } else {
            4 + 4 * self.len()
        }
    }

    /// Writes exactly `buffer_len()` bytes.
    pub fn emit(&self, buf: &mut [u8]) {
        if self.is_empty() {
            return;
        }
        put_u32(buf, 0, self.len() as u32);
        for (i, p) in self.iter().enumerate() {
            put_u32(buf, 4 + 4 * i, p);
        }
    }
}
