//! What a table of embedding rows reports about itself: its counters, its state and the
//! hottest ids of its sample ([`TableMetrics`]), for `STATS` and an operator's view of a hot
//! PS shard. A [`Table`](crate::Table) that keeps metrics returns them from
//! [`Table::metrics`](crate::Table::metrics).

/// An id among the hottest of a table, and how often it was sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HotId {
    /// The row's id.
    pub id: u64,
    /// Times it was sampled (roughly its pulls and pushes divided by
    /// [`TableMetrics::hot_sample_every`]), since the counts last halved.
    pub sampled: u64,
}

/// A table's counters and state at one moment: a plain struct to print or export.
///
/// Counters count from the table's creation; `rows`, the bytes and `clock` are the state
/// when read. See [`PsTable::metrics`](crate::rows::PsTable::metrics).
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct TableMetrics {
    /// Rows stored.
    pub rows: u64,
    /// Bytes of the rows and their optimizer state: `rows × (row + state bytes)`.
    pub data_bytes: u64,
    /// Bytes of memory the table uses: the slots handed out, the index levels in use, and
    /// the fixed parts (admission counters, row locks).
    pub memory_bytes: u64,
    /// Bytes of memory committed (readable and writable; resident once touched): what
    /// `memory_bytes` counts, the slots committed ahead, and index memory not given back
    /// yet.
    pub committed_bytes: u64,
    /// Entries of the index level in use.
    pub index_capacity: u64,
    /// Pull calls.
    pub pulls: u64,
    /// Push calls.
    pub pushes: u64,
    /// Rows pulled.
    pub pulled_rows: u64,
    /// Rows pulled that the table does not have (answered missing).
    pub missing: u64,
    /// Rows pulled whose version was the one the requester held: answered unchanged, their
    /// bytes not sent (row versions; the rows sent are `pulled_rows - unchanged_rows`).
    pub unchanged_rows: u64,
    /// Rows pushed (applied or dropped).
    pub pushed_rows: u64,
    /// Pushed rows dropped because their row does not exist and was not created (not
    /// admitted yet, refused, or rows are not created by pushes).
    pub dropped_pushes: u64,
    /// Rows created by pulls and pushes.
    pub created: u64,
    /// Rows written by bulk loads and checkpoint loads (created or overwritten).
    pub loaded: u64,
    /// Sightings of ids not admitted yet (below the admission threshold).
    pub not_admitted: u64,
    /// Rows not created because the table was full: at its row cap, or out of memory.
    pub refused: u64,
    /// Rows evicted because they were not touched for the set number of ticks.
    pub evicted_untouched: u64,
    /// Rows evicted to bring the table under its row cap, least recently touched first.
    pub evicted_over_cap: u64,
    /// Index levels built: growths, and rebuilds that clear evicted entries.
    pub index_builds: u64,
    /// The table's clock (see [`PsTable::advance_clock`](crate::rows::PsTable::advance_clock)).
    pub clock: u64,
    /// The hottest ids sampled, hottest first (empty when sampling is off).
    pub hot: Vec<HotId>,
    /// One row in this many is sampled for `hot` (0: off).
    pub hot_sample_every: u32,
}
