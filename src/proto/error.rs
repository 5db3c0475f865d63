//! Why a stream cannot be decoded any further, and why a frame cannot be encoded.

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

/// Why a frame could not be encoded. Nothing was queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodeError {
    /// The header and meta section alone exceed the peer's `max_frame`: split the request.
    FrameTooLarge {
        /// Bytes the frame would need.
        len: u64,
        /// The peer's limit.
        max: u32,
    },
    /// A key is empty or longer than 65,535 bytes.
    BadKey,
    /// An item count outside what the kind allows.
    BadCount,
    /// A tensor's `bytes` length differs from its meta's `byte_len`, or its meta is invalid.
    BadTensor,
    /// A hello with an invalid job name, token or `max_frame`.
    BadHello,
    /// A field of an optional feature (a rows push's loss scale) on a connection that did
    /// not negotiate it.
    NotNegotiated,
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::FrameTooLarge { len, max } => {
                write!(f, "frame of {len} bytes exceeds the peer's max_frame {max}")
            }
            EncodeError::BadKey => f.write_str("key empty or longer than 65535 bytes"),
            EncodeError::BadCount => f.write_str("item count not allowed for this frame"),
            EncodeError::BadTensor => f.write_str("tensor contents do not match its meta"),
            EncodeError::BadHello => f.write_str("invalid hello"),
            EncodeError::NotNegotiated => {
                f.write_str("a field of a feature the connection did not negotiate")
            }
        }
    }
}

impl std::error::Error for EncodeError {}
