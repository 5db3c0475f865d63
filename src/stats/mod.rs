//! Per-loop counters, written by their loop only, read by snapshots.
//!
//! Each loop owns one cache-padded block of atomics. The loop is the only writer, so an
//! update is a relaxed load and store (no locked instruction); readers sum the blocks with
//! relaxed loads. A snapshot is therefore not a single instant across loops, only a sum of
//! per-counter values that each were true at some point.

mod counters;
mod histogram;
mod json;
mod peers;
mod request_kind;
mod single_writer;
mod tables;
pub(crate) mod trace;

pub use counters::Stats;
pub(crate) use counters::{Counters, PeerRegistry};
pub use histogram::{bucket_high, bucket_low, Histogram, BUCKETS, MAX_TRACKED_NS, SUB_BUCKETS};
pub use json::{MAX_PEERS_IN_DOCUMENT, STATS_FORMAT_VERSION};
pub(crate) use peers::PeerBlock;
pub use peers::{Metrics, OpMetrics, Outcome, PeerMetrics, Side, OUTCOMES};
pub use request_kind::{RequestKind, REQUEST_KINDS};
pub(crate) use single_writer::add;
pub use tables::{HotId, TableMetrics};
