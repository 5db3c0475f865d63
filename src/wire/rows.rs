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

/// Response entry flag: a missing-rows report follows the tensor meta (and the versions
/// report, when there is one).
pub const ENTRY_HAS_MISSING: u16 = 2;

/// Response entry flag (with [`WireFeatures::ROW_VERSIONS`]): a row-versions report
/// follows the tensor meta.
pub const ENTRY_HAS_VERSIONS: u16 = 4;

/// Flag of a `PULL_ROWS` table section's second word (with
/// [`WireFeatures::ROW_VERSIONS`]): the held version of each id follows the ids, and the
/// answer carries the rows' versions.
pub const PULL_HELD_VERSIONS: u32 = 1;

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
    /// In a `PULL_ROWS` on a connection with [`WireFeatures::ROW_VERSIONS`]: the version
    /// of each id the requester holds (0: none), little-endian u64 bytes (`8 × n`), or
    /// empty when the section carries none (the answer then carries no versions).
    held: &'a [u8],
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
            held: &[],
        }
    }

    /// The same section (a pull's) carrying `held`, the held version of each id as
    /// little-endian u64 bytes (`8 × n`).
    pub fn with_held(self, held: &'a [u8]) -> RowsTable<'a> {
        RowsTable { held, ..self }
    }

    /// Whether the section carries held versions (and so asks for the rows' versions).
    pub fn has_held(&self) -> bool {
        !self.held.is_empty()
    }

    /// The held versions, in row order (none when the section carries none).
    pub fn held(&self) -> impl ExactSizeIterator<Item = u64> + 'a {
        self.held.chunks_exact(8).map(|b| get_u64(b, 0))
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
        TABLE_FIXED_LEN + self.block.buffer_len() + self.ids.len() + self.held.len()
    }

    /// Writes exactly `buffer_len()` bytes.
    pub fn emit(&self, buf: &mut [u8]) {
        put_u32(buf, 0, self.table);
        let word = if self.has_held() {
            PULL_HELD_VERSIONS
        } else {
            LossScale::to_wire(self.loss_scale)
        };
        put_u32(buf, 4, word);
        let m = self.block.buffer_len();
        self.block.emit(&mut buf[TABLE_FIXED_LEN..]);
        let at = TABLE_FIXED_LEN + m;
        buf[at..at + self.ids.len()].copy_from_slice(self.ids);
        let at = at + self.ids.len();
        buf[at..at + self.held.len()].copy_from_slice(self.held);
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

/// Meta length of a `PULL_ROWS` table section for a block of rank `rank`, `n` ids and,
/// when `held`, their held versions.
pub fn pull_rows_versioned_meta_len(rank: usize, n: usize, held: bool) -> usize {
    pull_rows_meta_len(rank, n) + if held { 8 * n } else { 0 }
}

/// Writes a `PULL_ROWS` table section with the held version of each id (`held`, as many
/// as `ids`; only on a connection that negotiated [`WireFeatures::ROW_VERSIONS`], the
/// encoder does not check): `pull_rows_versioned_meta_len(block rank, ids.len(), true)`
/// bytes.
pub fn emit_pull_rows_versioned_meta(
    table: u32,
    block: &TensorMeta<'_>,
    ids: &[u64],
    held: &[u64],
    buf: &mut [u8],
) {
    emit_rows_meta(table, None, block, ids, buf);
    put_u32(buf, 4, PULL_HELD_VERSIONS);
    let at = pull_rows_meta_len(block.dims.len(), ids.len());
    for (i, v) in held.iter().enumerate() {
        put_u64(buf, at + 8 * i, *v);
    }
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
    /// The tables of a `PULL_ROWS` (their second word is flags, not a loss scale).
    pull: bool,
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
        let versions = features.contains(WireFeatures::ROW_VERSIONS);
        for _ in 0..count {
            let rest = meta.get(at..).ok_or(Error::BadMetaLen)?;
            if rest.len() < TABLE_FIXED_LEN {
                return Err(Error::BadMetaLen);
            }
            let held = match get_u32(rest, 4) {
                0 => false,
                // A pull's word is its flags with the feature, reserved without it.
                PULL_HELD_VERSIONS if !push && versions => true,
                _ if !push && versions => return Err(Error::BadVersions),
                _ if !scales => return Err(Error::ReservedNotZero),
                bits if !push || LossScale::from_wire(bits).is_err() => {
                    return Err(Error::BadLossScale)
                }
                _ => false,
            };
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
            // n <= max_rows <= 2^26: no overflow; held versions as many as the ids.
            let ids_len = if held { 16 } else { 8 } * n as usize;
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
            pull: !push,
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
        // Checked by `parse`: 0, a scale in range (a push), or the pull's flags.
        let word = get_u32(fixed, 4);
        let (loss_scale, held) = match self.pull {
            true => (None, word == PULL_HELD_VERSIONS),
            false => (LossScale::from_wire(word).ok().flatten(), false),
        };
        let (block, len) = TensorMeta::parse_validated(self.bytes.get(TABLE_FIXED_LEN..)?)?;
        let at = TABLE_FIXED_LEN + len;
        let n = block.dims.get(0)? as usize;
        let ids = self.bytes.get(at..at + 8 * n)?;
        let held_len = if held { 8 * n } else { 0 };
        let held = self.bytes.get(at + 8 * n..at + 8 * n + held_len)?;
        self.bytes = self.bytes.get(at + 8 * n + held_len..)?;
        self.remaining -= 1;
        Some(RowsTable {
            table,
            block,
            ids,
            loss_scale,
            held,
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

/// The row-versions report of a `RESPONSE` entry answering a `PULL_ROWS` table that carried
/// held versions (with [`WireFeatures::ROW_VERSIONS`], 4.9): the request's row count `n`,
/// a bitmap of the positions answered *unchanged* (the row's version is the one held; its
/// bytes are not in the block), and the current version of every other position, in
/// position order (0: the table keeps no versions, or the row is missing). The block holds
/// the rows of the positions not unchanged, in position order.
///
/// Wire layout: `n` (u32), `⌈n / 8⌉` bytes of bitmap (position `i` is bit `i % 8` of byte
/// `i / 8`; bits from `n` on are zero), then `8 × (n − unchanged)` bytes of versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Versions<'a> {
    /// Rows of the request's table; 0: no report.
    n: u32,
    /// The bitmap, `⌈n / 8⌉` bytes.
    unchanged: &'a [u8],
    /// The versions of the positions not unchanged.
    versions: VersionWords<'a>,
}

/// The versions of a [`Versions`] report, as on the wire or native.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum VersionWords<'a> {
    Wire(&'a [u8]),
    Native(&'a [u64]),
}

impl Default for VersionWords<'_> {
    fn default() -> Self {
        VersionWords::Native(&[])
    }
}

/// Bytes of the bitmap of a report of `n` rows.
pub fn versions_bitmap_len(n: usize) -> usize {
    n.div_ceil(8)
}

impl<'a> Versions<'a> {
    /// A report for emitting: `unchanged`, the bitmap of `n` positions
    /// ([`versions_bitmap_len`] bytes), and `versions`, one per position whose bit is clear.
    /// `None` when the lengths do not add up.
    pub fn new(n: u32, unchanged: &'a [u8], versions: &'a [u64]) -> Option<Versions<'a>> {
        let ok = n > 0
            && unchanged.len() == versions_bitmap_len(n as usize)
            && bits_past(unchanged, n) == 0
            && popcount(unchanged) as usize + versions.len() == n as usize;
        ok.then_some(Versions {
            n,
            unchanged,
            versions: VersionWords::Native(versions),
        })
    }

    /// Validates the report at the start of `buf` for a block of `block_rows` rows; returns
    /// it and its length.
    pub(super) fn parse(buf: &'a [u8], block_rows: u64, limits: &Limits) -> Result<(Self, usize)> {
        if buf.len() < 4 {
            return Err(Error::BadMetaLen);
        }
        let n = get_u32(buf, 0);
        if n == 0 || n > limits.max_rows {
            return Err(Error::BadVersions);
        }
        let bitmap_end = 4 + versions_bitmap_len(n as usize);
        let unchanged = buf.get(4..bitmap_end).ok_or(Error::BadMetaLen)?;
        if bits_past(unchanged, n) != 0 {
            return Err(Error::BadVersions);
        }
        let sent = n as u64 - popcount(unchanged);
        if sent != block_rows {
            return Err(Error::BadVersions);
        }
        let end = bitmap_end + 8 * sent as usize;
        let versions = buf.get(bitmap_end..end).ok_or(Error::BadMetaLen)?;
        let report = Versions {
            n,
            unchanged,
            versions: VersionWords::Wire(versions),
        };
        Ok((report, end))
    }

    /// Re-reads a report that [`parse`](Self::parse) accepted.
    pub(super) fn parse_validated(buf: &'a [u8]) -> Option<(Self, usize)> {
        let n = get_u32(buf.get(..4)?, 0);
        let bitmap_end = 4 + versions_bitmap_len(n as usize);
        let unchanged = buf.get(4..bitmap_end)?;
        let sent = n as usize - popcount(unchanged) as usize;
        let end = bitmap_end + 8 * sent;
        let versions = buf.get(bitmap_end..end)?;
        let report = Versions {
            n,
            unchanged,
            versions: VersionWords::Wire(versions),
        };
        Some((report, end))
    }

    /// Whether there is no report (an entry without `HAS_VERSIONS`).
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Rows of the request's table (0: no report).
    pub fn rows(&self) -> usize {
        self.n as usize
    }

    /// Whether position `i` was answered unchanged.
    pub fn is_unchanged(&self, i: usize) -> bool {
        i < self.n as usize && self.unchanged[i / 8] & (1 << (i % 8)) != 0
    }

    /// The bitmap of unchanged positions, as on the wire.
    pub fn unchanged_bitmap(&self) -> &'a [u8] {
        self.unchanged
    }

    /// Number of positions answered unchanged.
    pub fn unchanged_count(&self) -> usize {
        popcount(self.unchanged) as usize
    }

    /// Number of versions carried: the positions not unchanged (the block's rows).
    pub fn sent(&self) -> usize {
        self.n as usize - self.unchanged_count()
    }

    /// Version `k` of the positions not unchanged (in position order).
    pub fn sent_version(&self, k: usize) -> Option<u64> {
        match self.versions {
            VersionWords::Wire(b) => b.get(8 * k..8 * k + 8).map(|b| get_u64(b, 0)),
            VersionWords::Native(v) => v.get(k).copied(),
        }
    }

    /// Bytes needed to emit (nothing when empty).
    pub fn buffer_len(&self) -> usize {
        if self.is_empty() {
            0
        } else {
            4 + self.unchanged.len() + 8 * self.sent()
        }
    }

    /// Writes exactly `buffer_len()` bytes.
    pub fn emit(&self, buf: &mut [u8]) {
        if self.is_empty() {
            return;
        }
        put_u32(buf, 0, self.n);
        let at = 4 + self.unchanged.len();
        buf[4..at].copy_from_slice(self.unchanged);
        match self.versions {
            VersionWords::Wire(b) => buf[at..at + b.len()].copy_from_slice(b),
            VersionWords::Native(v) => {
                for (k, version) in v.iter().enumerate() {
                    put_u64(buf, at + 8 * k, *version);
                }
            }
        }
    }
}

/// Set bits of a bitmap.
fn popcount(bits: &[u8]) -> u64 {
    bits.iter().map(|b| u64::from(b.count_ones())).sum()
}

/// The bits of the last byte of an `n`-position bitmap from position `n` on.
fn bits_past(bits: &[u8], n: u32) -> u8 {
    match (n % 8, bits.last()) {
        (0, _) | (_, None) => 0,
        (r, Some(last)) => last & !((1u8 << r) - 1),
    }
}
