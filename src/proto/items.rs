//! The entries of tensor-carrying frames as the encoder takes them: the tensors to send,
//! push items, response items and rows tables, each able to write its meta entry.

use crate::wire::{
    emit_rows_meta, pull_rows_meta_len, LossScale, Missing, PushEntry, ResponseEntry, Status,
    TensorMeta, Versions,
};

/// A tensor to send.
#[derive(Debug, Clone, Copy)]
pub struct OutTensor<'a> {
    /// Its meta; `chunked` is decided by the encoder and ignored here.
    pub meta: TensorMeta<'a>,
    /// Its contents (`meta.byte_len` bytes), read only when they are copied.
    pub bytes: &'a [u8],
    /// The caller's name for the contents, echoed in [`Piece::Tensor`](super::Piece::Tensor);
    /// [`COPY_TOKEN`] for contents that must be copied during the call (never referenced
    /// afterwards).
    pub token: u64,
}

/// The token of contents the encoder must copy whatever their size: they do not outlive
/// the call. A tensor with it must fit the frame (it cannot be chunked).
pub const COPY_TOKEN: u64 = u64::MAX;

/// An entry of a tensor-carrying frame (`PUSH` or `RESPONSE`).
pub(super) trait TensorItem<'a> {
    fn tensor(&self) -> Option<&OutTensor<'a>>;
    fn meta_len(&self) -> usize;
    fn emit(&self, buf: &mut [u8], chunked: bool);
}

/// One entry of a push.
#[derive(Debug, Clone, Copy)]
pub struct PushItem<'a> {
    /// Variable the tensor is for.
    pub var_id: u64,
    /// The tensor.
    pub tensor: OutTensor<'a>,
}

impl<'a> TensorItem<'a> for PushItem<'a> {
    fn tensor(&self) -> Option<&OutTensor<'a>> {
        Some(&self.tensor)
    }
    fn meta_len(&self) -> usize {
        8 + self.tensor.meta.buffer_len()
    }
    fn emit(&self, buf: &mut [u8], chunked: bool) {
        let meta = TensorMeta {
            chunked,
            ..self.tensor.meta
        };
        PushEntry {
            var_id: self.var_id,
            meta,
        }
        .emit(buf);
    }
}

/// One entry of a response.
#[derive(Debug, Clone, Copy)]
pub struct ResponseItem<'a> {
    /// The request item answered.
    pub index: u32,
    /// Its status.
    pub status: Status,
    /// The tensor, for a successful recv or pull item (the block of a rows pull).
    pub tensor: Option<OutTensor<'a>>,
    /// For a rows pull: the positions of the rows not found.
    pub missing: Missing<'a>,
    /// For a rows pull that carried held versions: the rows' versions and the positions
    /// answered unchanged (the block holds the other rows only).
    pub versions: Versions<'a>,
}

/// One table of a `PULL_ROWS`: the block asked for (`[ids, row...]`) and the ids.
#[derive(Debug, Clone, Copy)]
pub struct RowsQuery<'a> {
    /// The table.
    pub table: u32,
    /// The block's dtype and shape.
    pub block: TensorMeta<'a>,
    /// The row ids.
    pub ids: &'a [u64],
    /// The version of each id the requester holds (0: none), as many as the ids; empty:
    /// the section carries none (only on a connection that negotiated `ROW_VERSIONS`).
    pub held: &'a [u64],
}

/// One table of a `PUSH_ROWS`: the ids and their gradient rows as one block.
#[derive(Debug, Clone, Copy)]
pub struct RowsItem<'a> {
    /// The table.
    pub table: u32,
    /// The row ids.
    pub ids: &'a [u64],
    /// The block (`[ids, row...]`).
    pub block: OutTensor<'a>,
    /// The factor the gradients were multiplied by, which the responder divides out
    /// (only on a connection that negotiated `ROW_FORMATS`; `docs/wire-format.md` 4.9).
    pub loss_scale: Option<LossScale>,
}

impl<'a> TensorItem<'a> for RowsItem<'a> {
    fn tensor(&self) -> Option<&OutTensor<'a>> {
        Some(&self.block)
    }
    fn meta_len(&self) -> usize {
        pull_rows_meta_len(self.block.meta.dims.len(), self.ids.len())
    }
    fn emit(&self, buf: &mut [u8], chunked: bool) {
        let meta = TensorMeta {
            chunked,
            ..self.block.meta
        };
        emit_rows_meta(self.table, self.loss_scale, &meta, self.ids, buf);
    }
}

/// Whether `block` is a rows block for `n` ids: live, `[n, row...]`, at least one byte.
pub(super) fn is_rows_block(block: &TensorMeta<'_>, n: usize) -> bool {
    !block.dead && block.byte_len > 0 && n > 0 && block.dims.get(0) == Some(n as u64)
}

impl<'a> TensorItem<'a> for ResponseItem<'a> {
    fn tensor(&self) -> Option<&OutTensor<'a>> {
        self.tensor.as_ref()
    }
    fn meta_len(&self) -> usize {
        8 + self.tensor.map_or(0, |t| t.meta.buffer_len())
            + self.missing.buffer_len()
            + self.versions.buffer_len()
    }
    fn emit(&self, buf: &mut [u8], chunked: bool) {
        let tensor = self.tensor.map(|t| TensorMeta { chunked, ..t.meta });
        ResponseEntry {
            index: self.index,
            status: self.status,
            tensor,
            missing: self.missing,
            versions: self.versions,
        }
        .emit(buf);
    }
}
