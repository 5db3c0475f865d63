//! starwire: a tensor transport for parameter-server training.
//!
//! The crate is layered so that raw bytes, protocol state and syscalls never mix:
//!
//! - [`wire`]: zero-copy views and small reprs of the v1 wire format; the only
//!   place that reads or writes the bytes of a frame.
//! - [`proto`]: sans-IO stream decoder and encoder: bytes in, frames out, and where
//!   the next bytes must land.
//! - [`ctx`]: the pre-sized slab of request contexts whose handle travels in frame
//!   headers.
//! - `sys`: the only place with syscalls and most `unsafe`.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod ctx;
pub mod proto;
pub mod spsc;
#[allow(dead_code)]
pub(crate) mod sys;
pub mod wire;
