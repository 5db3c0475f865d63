//! Embedding rows as packed blocks: what a worker asks a PS for, and what it gets back.
//!
//! A rows request names each table once, with the rows' dtype and shape and their ids; the
//! answer is one block per table, `ids.len() × row_bytes` in request order, and the
//! positions of the rows the PS does not have (their bytes are zero). On the wire each
//! row costs its 8-byte id and its bytes: no per-row descriptor. See
//! [`Client::pull_rows`](crate::Client::pull_rows) and
//! [`Client::push_rows`](crate::Client::push_rows); a PS serves rows through
//! [`Service::table`](crate::Service::table), for instance a [`PsTable`] (see [`ps`]).
//!
//! A worker whose tables are partitioned over several PS tasks plans each step with a
//! [`Plan`]: duplicate ids removed, the distinct ones spread over the shards by a
//! [`Partition`], the answers scattered back into the batch and the gradients of
//! duplicates summed; [`Sharded`] does all of it, with rows as bytes or,
//! through [`RowElement`], as `f32`, `f64` and the integer types. [`Pipeline`] does it
//! with a step that does not wait: the next batch's rows requested while this one
//! computes, pushes not waited for, within a staleness bound, and, with a [`RowCache`],
//! the rows of ids it pulled recently enough served without asking; several tables over
//! the same PS tasks pipeline together ([`Pipeline::new_tables`]), a step one request per
//! PS each way for all of them.

mod cache;
mod element;
mod multi;
mod pipeline;
mod plan;
mod sharded;
mod table;
mod travel;

pub use crate::session::{PulledRows, Rows, MAX_ROW_RANK};
pub use crate::wire::LossScale;
pub use cache::RowCache;
pub use element::RowElement;
pub use multi::{ShardedTables, TableShape, MAX_TABLES};
pub use pipeline::{Pipeline, PipelineReport, PipelineSettings, PushFailure, MAX_PUSHES_IN_FLIGHT};
pub use plan::{Partition, Plan, PlanError};
pub use sharded::{Sharded, StepReport};
pub use table::{ps, Init, MemTable, Optimizer, PsTable, PsTableBuilder, Tables};
