//! Sans-IO stream codec for the v1 wire format.
//!
//! Nothing here performs a syscall or reads a clock. The [`Decoder`] takes bytes split at
//! any point and yields frames, payload pieces and precise errors; it also says where the
//! next bytes from the socket must land ([`NextRead`]), which is what lets a large tensor
//! be received straight into the memory its allocator returned. The [`Encoder`] turns
//! frames into an ordered list of segments — header and meta bytes in its own arena,
//! tensor bytes by reference — from which the I/O layer builds `iovec`s, so tensor bytes
//! are never copied on the way out.

mod arena;
mod conn;
mod decoder;
mod encoder;
mod error;
mod items;
mod output;

pub use conn::{CloseReason, ConnEvent, Connection, Flow, Identity, PeerInfo};
pub use crate::wire::Side;
pub use decoder::{Decoder, Event, Frame, NextRead, Owed, PayloadTarget};
pub use error::Error;
pub use encoder::{
    EncodeError, Encoder, EncoderConfig, OutPiece, OutTensor, Piece, PushItem, ResponseItem, RowsItem,
    RowsQuery, Segment, COPY_TOKEN,
};

#[cfg(test)]
mod tests;
