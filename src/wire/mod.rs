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
mod bytes;
mod error;
mod features;
mod header;
mod limits;
mod macros;
mod rows;
mod status;
mod tensor;

#[cfg(test)]
mod tests;

pub use body::{
    cancel_meta_len, emit_cancel_meta, emit_pull_meta, emit_recv_meta, pull_meta_len,
    recv_meta_len, Body, ChunkRepr, ErrorRepr, HelloRepr, ItemIndexes, Keys, PushEntries, PushEntry, RecvBody, ResponseEntries, ResponseEntry,
    TensorEntries, TensorEntry, VarIds, ENTRY_HAS_TENSOR, MAX_ERROR_MESSAGE, MAX_JOB_NAME,
    MAX_TOKEN,
};
pub use features::{LossScale, WireFeatures};
pub use rows::{
    emit_pull_rows_meta, emit_pull_rows_versioned_meta, emit_rows_meta, pull_rows_meta_len,
    pull_rows_versioned_meta_len, versions_bitmap_len, Missing, RowsTable, RowsTables,
    Versions, ENTRY_HAS_MISSING, ENTRY_HAS_VERSIONS, PULL_HELD_VERSIONS,
};
pub use header::{Header, HeaderRepr, FrameKind, FLAG_END, HEADER_LEN, MAGIC, VERSION};
pub use error::{Error, Result};
pub use limits::{Limits, MAX_RANK};
pub use status::Status;
pub use tensor::{DType, Dims, TensorMeta, TensorMetaView, TENSOR_META_FIXED_LEN};

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
