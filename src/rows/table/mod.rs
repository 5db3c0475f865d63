//! Tables of embedding rows a PS task serves: [`PsTable`], the table built for a PS (see
//! [`ps`]), [`MemTable`], the first reference table (kept as the baseline the benchmarks
//! measure), and [`Tables`], the registry that names them by id.
//!
//! A [`Table`](crate::Table) answers a pull of ids with one packed block of rows and
//! applies a push of gradient rows. Rows travel as raw little-endian bytes with no
//! alignment, `row_bytes` each, in the order of the ids.

mod admit;
mod bulk;
pub mod checkpoint;
mod config;
mod elem;
mod epoch;
mod index;
mod init;
mod level;
mod mem;
mod metrics;
mod optim;
mod pieces;
mod ps_table;
mod registry;
mod slots;
mod upkeep;
mod version;
mod xxh64;

pub use config::PsTableBuilder;
pub use mem::{Init, MemTable, Optimizer};
pub use ps_table::PsTable;
pub use registry::Tables;

pub mod ps {
    //! [`PsTable`]: rows and their optimizer state in one slot of a huge-page arena, a
    //! lock-free index that grows in bounded steps, no lock and no allocation on the pull
    //! and push path; creation, admission, eviction, bulk load and export, checkpoints and
    //! metrics.
    //!
    //! ```
    //! use starwire::rows::ps::{Init, Optimizer};
    //! use starwire::rows::{PsTable, Tables};
    //! use starwire::Table;
    //! use std::sync::Arc;
    //!
    //! # fn main() -> Result<(), Box<dyn std::error::Error>> {
    //! let table = PsTable::builder(4)
    //!     .table_id(1)
    //!     .init(Init::Uniform { scale: 0.05, seed: 7 })
    //!     .optimizer(Optimizer::Adagrad { lr: 0.1, initial_accumulator: 0.1 })
    //!     .capacity(100_000) // rows expected: the index starts at their size
    //!     .build()?;
    //! eprintln!("{}", table.report()); // the layout, and whether huge pages were granted
    //!
    //! // A pull creates the rows it asks for, with the initializer's values.
    //! let (mut out, mut missing) = (vec![0u8; 2 * table.row_bytes()], Vec::new());
    //! assert!(table.pull(&[7, 8], &mut out, &mut missing).is_ok());
    //! assert!(missing.is_empty());
    //! assert_eq!(table.get(7).unwrap()[0], Init::Uniform { scale: 0.05, seed: 7 }.value(1, 7, 0));
    //!
    //! // A push applies gradient rows, in the same layout.
    //! let grads: Vec<u8> = [0.5f32; 8].iter().flat_map(|g| g.to_le_bytes()).collect();
    //! assert!(table.push(&[7, 8], &grads).is_ok());
    //! assert_eq!(table.metrics().rows, 2);
    //!
    //! // Save it, and build its replacement from the checkpoint.
    //! let dir = std::env::temp_dir().join(format!("starwire-doc-{}", std::process::id()));
    //! table.save(&dir)?;
    //! let again = table.settings().clone().load(&dir)?;
    //! assert_eq!(again.get(8), table.get(8));
    //! # std::fs::remove_dir_all(&dir)?;
    //!
    //! // Serve it: a registry of tables is a `Service`.
    //! let tables = Tables::new().with(1, Arc::new(again));
    //! # let _ = tables;
    //! # Ok(())
    //! # }
    //! ```
    //!
    //! **A slot** holds a row and its optimizer state together: the id (8 bytes), the row's
    //! version (8 bytes, see below), the row's elements packed into 64-bit words
    //! ([`Float`]: f32, or bf16/f16 to halve them), the optimizer's state (f32; Adagrad's
    //! sums, Adam's moments and step powers). 16 f32 with Adagrad: 144 bytes. Slots sit end to end in one arena: address space reserved once
    //! (nothing is charged for it), committed as rows are added, advised `MADV_HUGEPAGE` (a
    //! random row costs about 29 ns with transparent huge pages and 72 ns without on the
    //! machines measured; [`PsTable::report`] says whether the advice was taken). Slots never
    //! move.
    //!
    //! **The index** maps an id to its slot: open addressing in buckets of eight 8-byte
    //! entries (one cache line), each entry a slot number, a 16-bit tag of the id's hash and a
    //! 16-bit stamp of the last touch; the id is checked in the slot, which the call reads
    //! anyway. A pull of an existing row reads one index line and the row; a push reads and
    //! writes the row and its state. A call looks its ids up sixteen at a time, loading every
    //! index line of the group, then every slot, before it uses any, so the memory latencies
    //! of a group overlap. About 10 bytes of index per row (built 2/5 full, grown at
    //! 4/5): 16 f32 with Adagrad take about 154 bytes per row, 1.2 times the 128 bytes of row
    //! and state, when the table was built with the rows expected
    //! ([`capacity`](PsTableBuilder::capacity)).
    //!
    //! **Row versions**: every row has a version, a number from the table's clock that
    //! changes with each push applied to the row and is given when a pull, a push or a load
    //! creates or overwrites it; a worker that caches rows pulls with the versions it holds
    //! ([`Client::pull_rows_versioned`](crate::Client::pull_rows_versioned)) and the rows
    //! whose version is unchanged are not sent ([`Table::pull_versioned`](crate::Table)).
    //! The clock is one counter per table, advanced once per push call (not per row), and
    //! starts at 4 × the Unix time in nanoseconds when the table is built or loaded: a
    //! version never repeats in a table's life, and a table built later (restarted from a
    //! checkpoint or from empty) starts above every version an earlier one gave, so an
    //! evicted and re-created row, or a row of a restarted PS, never matches a version a
    //! worker holds. Checkpoints do not store versions; a loaded row takes a new one. A push
    //! writes the version after the row and a pull reads it before the row, so a row read
    //! at a version holds at least what that version names (under `Hogwild` a pull that
    //! crosses a push may read part of it; the next push's version makes the next pull
    //! send the row again).
    //!
    //! **Growth** never stops a loop for long: when the index level is 4/5 full, the next
    //! (sized for the rows at 2/5) is faulted in 8 MiB at a time, then made current, and the
    //! entries of the old one are copied over by the calls that follow, 256 buckets a step
    //! (each step a fraction of a millisecond; any thread may take any piece, so a thread
    //! preempted mid-way holds up no one); a lookup checks the new level, then the old one,
    //! while the copy runs. The old level's memory goes back to the kernel once every call
    //! that could see it has ended (a grace period counted per call, not per row). Address
    //! space (not memory) is reserved up front for the largest table allowed, a slot and 160
    //! bytes of index per row: set [`max_rows`](PsTableBuilder::max_rows) to bound it (the
    //! default, 2^32 rows of 16 f32 with Adagrad, reserves about 1.2 TiB of the 128 TiB a
    //! process has).
    //!
    //! **Concurrency**: any number of loops call the same table; no lock is shared between
    //! them on the row path, and nothing on it allocates. Insertion of a new id is a
    //! compare-and-swap of an index entry. What two calls on the *same* row may observe is a
    //! setting, [`Consistency`]: `Hogwild` (relaxed atomic words: a pull may see a row partly
    //! updated, concurrent pushes may lose updates; the exact rules are on the enum) or
    //! `PerRow` (a lock per row for pushes, a sequence count for pulls: no lost update, whole
    //! rows). Never undefined behaviour: rows are only read and written as atomic words.
    //!
    //! **Rows are created** by pulls and pushes ([`Create`]), optionally only at the `n`-th
    //! sighting of an id ([`admit_after`](PsTableBuilder::admit_after)), with values from
    //! [`Init`], a function of (table, id, element, seed), so every PS creates the same row.
    //! **Evicted** by [`PsTable::maintain`]: rows untouched for a number of ticks of the
    //! table's clock, or the least recently touched over a row cap; their slots are reused
    //! after a grace period. **Loaded and exported** by id ([`PsTable::load_rows`],
    //! [`PsTable::export_rows`], [`PsTable::for_each_row`]), and **checkpointed**:
    //! [`PsTable::save`], [`PsTableBuilder::load`], in a versioned, checksummed format
    //! written atomically (see [`checkpoint`](checkpoint) for the format).
    //! [`PsTable::metrics`] counts rows, bytes, calls, creations, refusals, evictions and
    //! samples the hottest ids.

    pub use super::bulk::{LoadReport, RowsError};
    pub use super::checkpoint::{
        self, checkpoint_file, CheckpointError, CheckpointErrorKind, CHECKPOINT_VERSION,
    };
    pub use super::config::{
        BuildError, Consistency, Create, PsTableBuilder, MAX_DIM, MAX_EVICT_TICKS,
    };
    pub use super::elem::Float;
    pub use super::init::Init;
    pub use super::optim::Optimizer;
    pub use super::ps_table::{HugePageOutcome, PsTable, TableReport};
    pub use super::upkeep::MaintainReport;
    pub use crate::service::{SaveError, SaveReport};
    pub use crate::stats::{HotId, TableMetrics};
}
