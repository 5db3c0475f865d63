//! Why a stream cannot be decoded any further.

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
