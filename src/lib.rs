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

pub mod client;
pub mod cluster;
pub mod config;
pub(crate) mod core;
pub mod ctx;
pub mod endpoint_map;
mod error;
pub mod peer;
mod pool;
pub mod proto;
pub mod rendezvous;
mod runtime;
pub mod service;
pub mod spsc;
pub mod stats;
#[allow(dead_code)]
pub(crate) mod sys;
pub mod tensor;
mod transport;
pub mod wire;

pub use crate::core::{Callback, Completion, Reply};
pub use client::{Client, Embedded, Handle, Ticket};
pub use config::Config;
pub use error::Error;
pub use peer::Peer;
pub use rendezvous::Rendezvous;
pub use runtime::{Options, Runtime, StartError, StartNote, StartReport, DEFAULT_ZERO_COPY_MIN};
pub use service::Service;
pub use stats::Stats;
pub use tensor::{HeapAllocator, Tensor, TensorAllocator, TensorDesc, TensorMemory};
