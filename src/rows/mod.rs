//! Rows of partitioned embedding tables: the sans-IO planning of a worker's sharded pulls
//! and pushes ([`Plan`]), ids spread over the PS shards by a [`Partition`].

mod plan;

pub(crate) use plan::{splitmix64, IdMap};
pub use plan::{Partition, Plan, PlanError};
