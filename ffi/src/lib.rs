//! C ABI for starwire: runtimes, PS services as C callbacks, tables of embedding rows (the
//! PS table, with its checkpoints and metrics, and the small in-memory table) and rows
//! requests into the caller's memory, the sharded and the pipelined sharded rows clients,
//! per-thread client handles, tensor allocator hooks, the rendezvous, and stats. The header
//! `include/starwire.h` is generated from this crate by cbindgen (see `cbindgen.toml`;
//! `tests/header.rs` fails when the committed header drifts from the code).
//!
//! Conventions, for every function:
//! - the body runs inside a panic boundary: a panic returns `SW_ERR_PANIC`, never unwinds
//!   into C;
//! - every pointer is checked for NULL (`SW_ERR_NULL`);
//! - outputs are written only when the call returns `SW_OK`;
//! - on failure, `sw_last_error()` describes it (per thread, until the next call).
//!
//! Layout, in the order the header lists the functions: `result` (`sw_result`, the last
//! error), `version`, then one module per C type: `tensor`, `allocator` (`sw_allocator`,
//! and the tensor memory C lends), `service`, `table`, `ps_config` and `ps_table` (the PS
//! table: its settings, and the table), `runtime`, `reply`, `client` (every
//! `sw_client_*` request goes through its `submit`), `rows` (`sw_rows` and the rows
//! requests, with `buffers`: the caller's buffers a rows pull receives into), `bench`,
//! `callback_table`, `checkpoint` (the checkpoint request), `metrics`, `resolver`,
//! `sharded`, `pipeline` (the pipelined sharded client, on `sharded`'s partitions and
//! peers). Below them all, `boundary` (the
//! panic boundary every exported body runs inside) and `cast` (the typed pointer casts
//! through which the exported functions, which have no `unsafe` of their own, reach their
//! arguments). Imports go one way: `boundary` <- `result` <- `cast` <- the C types, which
//! use each other downwards only.
//!
//! `unsafe` lives in `cast`, and, for the memory and the callbacks C owns, in `allocator`,
//! `buffers` and the trampolines of `service`, `callback_table` and `client`; every block
//! says why it holds, one unsafe operation per block (the lints below require the comment
//! and the one operation).
#![allow(non_camel_case_types)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(clippy::multiple_unsafe_ops_per_block)]

mod boundary;
mod cast;

mod result;
mod version;

mod tensor;

mod allocator;
mod service;
mod table;

mod ps_config;
mod ps_table;

mod runtime;

mod reply;

mod buffers;
mod client;

mod rows;

mod bench;
mod callback_table;
mod checkpoint;
pub mod metrics;
mod resolver;
mod sharded;
mod sharded_tables;

mod pipeline;

pub use allocator::*;
pub use bench::*;
pub use callback_table::*;
pub use checkpoint::*;
pub use client::*;
pub use pipeline::*;
pub use ps_config::*;
pub use ps_table::*;
pub use reply::*;
pub use resolver::*;
pub use result::*;
pub use rows::*;
pub use runtime::*;
pub use service::*;
pub use sharded::*;
pub use sharded_tables::*;
pub use table::*;
pub use tensor::*;
pub use version::*;
