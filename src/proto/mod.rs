//! Sans-IO stream codec for the v1 wire format.
//!
//! Nothing here performs a syscall or reads a clock. The [`Decoder`] takes bytes split at
//! any point and yields frames, payload pieces and precise errors; it also says where the
//! next bytes from the socket must land ([`NextRead`]), which is what lets a large tensor
//! be received straight into the memory its allocator returned. The [`Encoder`] turns
//! frames into an ordered list of segments — header and meta bytes in its own arena,
//! tensor bytes by reference — from which the I/O layer builds `iovec`s, so tensor bytes
//! are never copied on the way out.

mod conn;
mod decoder;
mod encoder;
mod items;
mod output;

pub use conn::{CloseReason, ConnEvent, Connection, Identity, PeerInfo};
pub use crate::wire::Side;
pub use decoder::{Decoder, Event, Frame, NextRead, PayloadTarget};
pub use encoder::{
    EncodeError, Encoder, EncoderConfig, OutPiece, OutTensor, Piece, PushItem, ResponseItem, RowsItem,
    RowsQuery, Segment, COPY_TOKEN,
};

use crate::wire;
use core::fmt;

/// Why the stream cannot be decoded any further. After an error the decoder refuses all
/// further input: the connection must be closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// A frame broke a wire-format rule.
    Wire(wire::Error),
    /// A `CHUNK` arrived when no chunked tensor was declared.
    UnexpectedChunk,
    /// A `CHUNK` for another tensor than the one in progress, or at the wrong offset, or
    /// running past the tensor's end.
    ChunkMismatch,
    /// More than `max_tensors` chunked tensors declared and incomplete.
    TooManyChunked,
    /// The decoder already failed; it accepts nothing more.
    Poisoned,
}

impl Error {
    /// The status to report to the peer before closing.
    pub fn status(self) -> wire::Status {
        match self {
            Error::Wire(e) => e.status(),
            _ => wire::Status::Protocol,
        }
    }
}

impl From<wire::Error> for Error {
    fn from(e: wire::Error) -> Self {
        Error::Wire(e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Wire(e) => write!(f, "malformed frame: {e}"),
            Error::UnexpectedChunk => f.write_str("chunk without a declared chunked tensor"),
            Error::ChunkMismatch => f.write_str("chunk does not continue the tensor in progress"),
            Error::TooManyChunked => f.write_str("too many incomplete chunked tensors"),
            Error::Poisoned => f.write_str("decoder already failed"),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests;
