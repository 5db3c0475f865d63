//! Why a frame was rejected: the one cheap error type of the wire layer.

use super::status::Status;
use core::fmt;

/// Why a frame was rejected. Cheap to copy; the layers above add context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The buffer is shorter than the structure it should hold.
    Truncated,
    /// The first four bytes are not `SWRE`.
    BadMagic,
    /// A version other than this module's.
    BadVersion(u8),
    /// A frame kind this version does not define.
    UnknownKind(u8),
    /// A field that must be zero is not.
    ReservedNotZero,
    /// An undefined flag bit is set, or `END` is used where the kind forbids it.
    BadFlags,
    /// A nonzero status on a kind that must carry 0, or status 0 on `ERROR`.
    BadStatus,
    /// Handle 0 on a request, `PONG`, `RESPONSE` or `CHUNK`, or a nonzero handle on
    /// `HELLO`/`HELLO_ACK`.
    BadHandle,
    /// The frame is longer than the receiver's `max_frame`.
    FrameTooLarge {
        /// Total length the header announces.
        len: u64,
        /// The receiver's limit.
        max: u32,
    },
    /// `count` is not allowed for this kind, or exceeds `max_tensors`.
    BadCount,
    /// `meta_len` does not match the meta section's content.
    BadMetaLen,
    /// `payload_len` does not match what the meta section implies.
    BadPayloadLen,
    /// A key is empty or longer than `max_key`.
    BadKey,
    /// A tensor's rank exceeds `max_rank`.
    RankTooLarge,
    /// A dimension above 2^63 - 1.
    BadDim,
    /// A dtype this version does not define.
    UnknownDType(u8),
    /// `byte_len` differs from element size x shape, or the product overflows.
    ByteLenMismatch,
    /// `byte_len` exceeds `max_tensor_bytes`.
    TensorTooLarge,
    /// A dead tensor with contents, dimensions, or chunks.
    BadDeadTensor,
    /// A chunked tensor with no contents.
    BadChunked,
    /// A response entry inconsistent with its status.
    BadEntry,
    /// A job name, token or message outside its fixed bounds.
    BadString,
    /// A limit announced in a hello outside its allowed range (section 6).
    BadLimits,
    /// A rows table whose block is not `[ids, row...]` of at least one row byte, or that
    /// is dead, or chunked in a `PULL_ROWS`.
    BadRows,
    /// The ids of a frame exceed `max_rows`.
    TooManyRows,
    /// A row exceeds `max_row_bytes`.
    RowTooLarge,
    /// A missing-rows report that is empty, not increasing, out of range, or on an entry
    /// without a block.
    BadMissing,
    /// A rows table's `loss_scale` that is not 0 or a scale from 2^-126 to 2^126, or one
    /// on a `PULL_ROWS`.
    BadLossScale,
    /// A rows pull's flags word with an undefined bit, or a row-versions report that does
    /// not add up: a row count of 0 or above `max_rows`, bitmap bits
    /// past the rows, a block whose rows are not the rows left out of the bitmap, or a
    /// missing row reported unchanged or with a version (`docs/wire-format.md` 4.9).
    BadVersions,
}

impl Error {
    /// The status a receiver reports to its peer for this rejection.
    pub fn status(self) -> Status {
        match self {
            Error::BadVersion(_) => Status::VersionMismatch,
            _ => Status::Protocol,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Truncated => f.write_str("truncated structure"),
            Error::BadMagic => f.write_str("bad magic (not a starwire frame)"),
            Error::BadVersion(v) => write!(f, "unsupported protocol version {v}"),
            Error::UnknownKind(k) => write!(f, "unknown frame kind {k}"),
            Error::ReservedNotZero => f.write_str("reserved field is not zero"),
            Error::BadFlags => f.write_str("undefined or misplaced flag"),
            Error::BadStatus => f.write_str("status not allowed for this frame kind"),
            Error::BadHandle => f.write_str("handle not allowed for this frame kind"),
            Error::FrameTooLarge { len, max } => {
                write!(f, "frame of {len} bytes exceeds max_frame {max}")
            }
            Error::BadCount => f.write_str("item count not allowed or over max_tensors"),
            Error::BadMetaLen => f.write_str("meta_len does not match the meta section"),
            Error::BadPayloadLen => f.write_str("payload_len does not match the tensors"),
            Error::BadKey => f.write_str("key empty or longer than max_key"),
            Error::RankTooLarge => f.write_str("tensor rank over max_rank"),
            Error::BadDim => f.write_str("tensor dimension above 2^63-1"),
            Error::UnknownDType(d) => write!(f, "unknown dtype {d}"),
            Error::ByteLenMismatch => f.write_str("byte_len does not match dtype x shape"),
            Error::TensorTooLarge => f.write_str("tensor byte_len over max_tensor_bytes"),
            Error::BadDeadTensor => f.write_str("dead tensor with contents, shape or chunks"),
            Error::BadChunked => f.write_str("invalid chunked tensor declaration"),
            Error::BadEntry => f.write_str("response entry inconsistent with its status"),
            Error::BadString => f.write_str("job name, token or message out of bounds"),
            Error::BadLimits => f.write_str("announced limit out of its allowed range"),
            Error::BadRows => f.write_str("invalid rows table"),
            Error::TooManyRows => f.write_str("ids of the frame over max_rows"),
            Error::RowTooLarge => f.write_str("row bytes over max_row_bytes"),
            Error::BadMissing => f.write_str("invalid missing-rows report"),
            Error::BadLossScale => f.write_str("invalid loss scale in a rows table"),
            Error::BadVersions => f.write_str("invalid row versions"),
        }
    }
}

impl std::error::Error for Error {}

/// Result of wire-level parsing.
pub type Result<T> = core::result::Result<T, Error>;

/// A tensor meta that runs past the meta section is a length error of the section.
pub(super) fn truncated_meta(e: Error) -> Error {
    if e == Error::Truncated {
        Error::BadMetaLen
    } else {
        e
    }
}
