//! Views and reprs of the v2 wire format. `docs/wire-format.md` is the specification;
//! this module is the only place that reads or writes the bytes of a frame.
//!
//! The shape follows smoltcp's `wire` module:
//!
//! - a *view* (`Header<T>`, `TensorMetaView<T>`) wraps a byte buffer. `new_unchecked` wraps
//!   without checks; `new_checked` (or `check_len`) verifies the buffer is long enough, after
//!   which no accessor can panic. Field offsets live in a private `mod field`.
//! - a *repr* (`HeaderRepr`, `TensorMeta`, `HelloRepr`, ...) is a small high-level value.
//!   `parse` validates everything the specification says a receiver must check, against the
//!   receiver's [`Limits`]; `emit` writes exactly `buffer_len()` bytes.
//!
//! Parsing never panics, never reads out of bounds and never allocates: variable-length
//! parts (keys, ids, entries) are returned as iterators over the already-validated bytes.

mod body;
mod header;
mod rows;
mod tensor;

#[cfg(test)]
mod tests;

pub use body::{
    cancel_meta_len, emit_cancel_meta, emit_pull_meta, emit_recv_meta, pull_meta_len,
    recv_meta_len, Body, ChunkRepr, ErrorRepr, HelloRepr, ItemIndexes, Keys, PushEntries, PushEntry, RecvBody, ResponseEntries, ResponseEntry,
    TensorEntries, TensorEntry, VarIds, ENTRY_HAS_TENSOR, MAX_ERROR_MESSAGE, MAX_JOB_NAME,
    MAX_TOKEN,
};
pub use rows::{
    emit_pull_rows_meta, pull_rows_meta_len, Missing, RowsTable, RowsTables, ENTRY_HAS_MISSING,
};
pub use header::{Header, HeaderRepr, FrameKind, FLAG_END, HEADER_LEN, MAGIC, VERSION};
pub use tensor::{DType, Dims, TensorMeta, TensorMetaView, MAX_RANK, TENSOR_META_FIXED_LEN};

use core::fmt;

macro_rules! enum_with_unknown {
    (
        $(#[$enum_attr:meta])*
        pub enum $name:ident($ty:ty) {
            $( $(#[$variant_attr:meta])* $variant:ident = $value:expr ),+ $(,)?
        }
    ) => {
        $(#[$enum_attr])*
        #[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Clone, Copy)]
        pub enum $name {
            $( $(#[$variant_attr])* $variant ),*,
            /// A value this version does not define.
            Unknown($ty),
        }

        impl ::core::convert::From<$ty> for $name {
            fn from(value: $ty) -> Self {
                match value {
                    $( $value => $name::$variant ),*,
                    other => $name::Unknown(other),
                }
            }
        }

        impl ::core::convert::From<$name> for $ty {
            fn from(value: $name) -> Self {
                match value {
                    $( $name::$variant => $value ),*,
                    $name::Unknown(other) => other,
                }
            }
        }
    };
}
pub(crate) use enum_with_unknown;

enum_with_unknown! {
    /// Status of a whole request (`ERROR` frames) or of one item (`RESPONSE` entries).
    pub enum Status(u16) {
        /// Success.
        Ok = 0,
        /// No such variable, or the key is unknown to the responder's service.
        NotFound = 1,
        /// The step was aborted while the recv was pending.
        Aborted = 2,
        /// The request was cancelled.
        Cancelled = 3,
        /// The request's deadline passed.
        DeadlineExceeded = 4,
        /// The responder is shutting down.
        Shutdown = 5,
        /// A limit was hit: no free request slot, or an allocation failed.
        ResourceExhausted = 6,
        /// Well-formed but unacceptable.
        InvalidArgument = 7,
        /// The service's handler failed.
        Internal = 8,
        /// The responder serves no handler for this kind.
        Unimplemented = 9,
        /// The connection to the peer was lost.
        Unavailable = 10,
        /// A protocol violation.
        Protocol = 11,
        /// Unsupported protocol version.
        VersionMismatch = 12,
        /// The peers belong to different clusters.
        ClusterMismatch = 13,
        /// The cluster token is missing or wrong.
        Unauthenticated = 14,
        /// The server refuses the client's task identity.
        TaskRejected = 15,
    }
}

impl Status {
    /// Whether this is [`Status::Ok`].
    pub fn is_ok(self) -> bool {
        self == Status::Ok
    }
}

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
        }
    }
}

impl std::error::Error for Error {}

/// Result of wire-level parsing.
pub type Result<T> = core::result::Result<T, Error>;

/// The receiver's parse-time limits (section 6 of the specification).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest frame accepted, header included.
    pub max_frame: u32,
    /// Longest rendezvous key.
    pub max_key: u16,
    /// Most items in one `FUSED_RECV`, `PULL`, `PUSH` or `RESPONSE`.
    pub max_tensors: u32,
    /// Highest tensor rank.
    pub max_rank: u8,
    /// Largest tensor, in bytes.
    pub max_tensor_bytes: u64,
    /// Most tables in one `PULL_ROWS` or `PUSH_ROWS`.
    pub max_tables: u32,
    /// Most row ids in one frame (over all its tables), and most missing rows reported in
    /// one `RESPONSE` entry.
    pub max_rows: u32,
    /// Largest row, in bytes.
    pub max_row_bytes: u32,
}

impl Limits {
    /// Smallest `max_frame` a peer may announce or be configured with.
    pub const MIN_FRAME: u32 = 64 * 1024;
    /// Largest configurable `max_frame`.
    pub const MAX_FRAME: u32 = 1 << 30;
    /// Largest configurable `max_tensors`.
    pub const MAX_TENSORS: u32 = 1 << 24;
    /// Largest configurable `max_tables`.
    pub const MAX_TABLES: u32 = 1 << 16;
    /// Largest configurable `max_rows`.
    pub const MAX_ROWS: u32 = 1 << 26;
    /// Largest configurable `max_row_bytes`.
    pub const MAX_ROW_BYTES: u32 = 1 << 30;

    /// Checks every limit against its allowed range; the error names the field.
    pub fn validate(&self) -> core::result::Result<(), &'static str> {
        if !(Self::MIN_FRAME..=Self::MAX_FRAME).contains(&self.max_frame) {
            return Err("max_frame must be between 65536 and 1073741824");
        }
        if self.max_key == 0 {
            return Err("max_key must be between 1 and 65535");
        }
        if !(1..=Self::MAX_TENSORS).contains(&self.max_tensors) {
            return Err("max_tensors must be between 1 and 16777216");
        }
        if self.max_rank as usize > MAX_RANK {
            return Err("max_rank must be at most 32");
        }
        if self.max_tensor_bytes > i64::MAX as u64 {
            return Err("max_tensor_bytes must be at most 2^63-1");
        }
        if !(1..=Self::MAX_TABLES).contains(&self.max_tables) {
            return Err("max_tables must be between 1 and 65536");
        }
        if !(1..=Self::MAX_ROWS).contains(&self.max_rows) {
            return Err("max_rows must be between 1 and 67108864");
        }
        if !(1..=Self::MAX_ROW_BYTES).contains(&self.max_row_bytes) {
            return Err("max_row_bytes must be between 1 and 1073741824");
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame: 16 << 20,
            max_key: 4096,
            max_tensors: 65_536,
            max_rank: 16,
            max_tensor_bytes: 4 << 30,
            max_tables: 1024,
            max_rows: 1 << 20,
            max_row_bytes: 1 << 20,
        }
    }
}

/// Reads a little-endian u16 at `at`; the caller has checked the bounds.
#[inline]
fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[inline]
fn get_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

#[inline]
fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

#[inline]
fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

#[inline]
fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

#[inline]
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Which end of a connection a task is: the client opened it (sends `HELLO`, then
/// requests), the server accepted it (answers `HELLO_ACK`, then serves). A task's metrics
/// of a peer count one side: the requests it sent (client) or served (server).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    /// Opened the connection: sends `HELLO` and requests.
    Client,
    /// Accepted the connection: answers `HELLO_ACK` and serves.
    Server,
}

impl Side {
    /// `"client"` or `"server"`.
    pub fn name(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Server => "server",
        }
    }
}
