//! The encoder's output: segments queued in write order, and the pieces a writer reads.

/// One piece of output, in write order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece<'a> {
    /// Bytes from the arena.
    Bytes(&'a [u8]),
    /// Bytes `offset..offset + len` of the tensor the caller named `token`.
    Tensor {
        /// The caller's token.
        token: u64,
        /// Start within the tensor's contents.
        offset: u64,
        /// Number of bytes.
        len: u64,
    },
}

/// One piece of output by position ([`Encoder::out_piece`](super::Encoder::out_piece)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutPiece {
    /// Bytes `start..start + len` of arena block `block`.
    Arena {
        /// Block number.
        block: u32,
        /// Start in the block.
        start: usize,
        /// Number of bytes.
        len: usize,
    },
    /// Bytes `offset..offset + len` of the tensor the caller named `token`.
    Tensor {
        /// The caller's token.
        token: u64,
        /// Start within the tensor's contents.
        offset: u64,
        /// Number of bytes.
        len: u64,
    },
}

/// A queued output segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment {
    /// Bytes in arena block `block`.
    Arena {
        /// Block number.
        block: u32,
        /// Start in the block.
        start: u32,
        /// Length.
        len: u32,
    },
    /// Bytes of a referenced tensor.
    Tensor {
        /// The caller's token.
        token: u64,
        /// Start in the tensor.
        offset: u64,
        /// Length.
        len: u64,
        /// The tensor's last bytes: once written, the token is released.
        last: bool,
    },
}

impl Segment {
    pub(super) fn len(&self) -> u64 {
        match *self {
            Segment::Arena { len, .. } => len as u64,
            Segment::Tensor { len, .. } => len,
        }
    }
}
