//! The server side of pull and push: what the trainer implements, a [`Service`] and its
//! [`Table`]s of embedding rows.
//!
//! A PS task implements [`Service`]: what a pull returns and how a push is applied are the
//! trainer's. Handlers run inline on the loop that owns the connection the request arrived
//! on: there is no thread hop, and a loop runs one handler at a time, but every loop may
//! run handlers concurrently, so a service shared by several loops must synchronize its
//! own state (shard it, or use atomics or short locks). Keep inline handlers short — a slow
//! handler delays every other connection of its loop; see `docs/tuning.md`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::stats::TableMetrics;
use crate::tensor::Tensor;
use crate::wire::{DType, Status};

/// What the trainer serves.
pub trait Service: Send + Sync {
    /// Current values of variables `ids`: push one entry per id, in order, into `out`.
    /// The default answers every id with `UNIMPLEMENTED`.
    fn pull(&self, ids: &[u64], out: &mut Vec<Result<Arc<Tensor>, Status>>) {
        out.extend(ids.iter().map(|_| Err(Status::Unimplemented)));
    }

    /// Applies pushed tensors (gradients): push one status per item, in order, into
    /// `statuses`. The tensors arrive in memory from the runtime's allocator. Take what you
    /// keep out of `items` (`items.drain(..)`, or `std::mem::replace` of an entry); what is
    /// left is dropped after the call, and the vector itself is reused for the next push.
    /// The default answers every item with `UNIMPLEMENTED`.
    fn push(&self, items: &mut Vec<(u64, Tensor)>, statuses: &mut Vec<Status>) {
        statuses.extend(items.iter().map(|_| Status::Unimplemented));
    }

    /// The table of embedding rows numbered `table`, for `PULL_ROWS` and `PUSH_ROWS`; a
    /// table not served is answered `NOT_FOUND`. The default serves none.
    fn table(&self, table: u32) -> Option<&dyn Table> {
        let _ = table;
        None
    }

    /// The numbers of the tables [`table`](Self::table) serves, for what concerns all of
    /// them: read when the runtime starts (the tables it maintains with
    /// [`Table::maintain`], and the start-up report), and at each checkpoint and `STATS`
    /// request; never per row request. The default lists none: a service that serves
    /// tables should list them, or they are served but never saved, maintained, reported
    /// nor named when a request asks for a table it does not serve.
    fn table_ids(&self) -> Vec<u32> {
        Vec::new()
    }
}

/// A shared service.
pub type SharedService = Arc<dyn Service>;

/// The metrics of `service`'s tables that keep them, by table number.
pub(crate) fn table_metrics(service: &dyn Service) -> Vec<(u32, TableMetrics)> {
    service
        .table_ids()
        .into_iter()
        .filter_map(|id| {
            let table = service.table(id)?;
            let m = crate::panic::guarded("Table::metrics", || table.metrics()).flatten()?;
            Some((id, m))
        })
        .collect()
}

/// `service.pull` into `out` (emptied first), one result per id whatever the service did
/// (a panic: `INTERNAL`).
pub(crate) fn pull(service: &dyn Service, ids: &[u64], out: &mut Vec<Result<Arc<Tensor>, Status>>) {
    out.clear();
    if crate::panic::guarded("Service::pull", || service.pull(ids, out)).is_none() {
        out.clear();
    }
    out.resize_with(ids.len(), || Err(Status::Internal));
    out.truncate(ids.len());
}

/// A table of embedding rows served by a PS task. Called from several event-loop threads at
/// once.
///
/// A type that is both a [`Service`] and a `Table` (a PS whose one table answers for
/// itself) has two `pull` and two `push` methods, so a call must name its trait:
/// `Table::pull(&shard, ..)`, `Service::pull(&shard, ..)` (`shard.pull(..)` is ambiguous
/// where both traits are in scope). Its [`Service::table`] returns itself:
///
/// ```
/// use starwire::{DType, Service, Status, Table};
///
/// struct Shard {
///     dims: [u64; 1],
/// }
///
/// impl Table for Shard {
///     fn dtype(&self) -> DType {
///         DType::F32
///     }
///     fn row_dims(&self) -> &[u64] {
///         &self.dims
///     }
///     fn pull(&self, _ids: &[u64], out: &mut [u8], _missing: &mut Vec<u32>) -> Status {
///         out.fill(0);
///         Status::Ok
///     }
///     fn push(&self, _ids: &[u64], _grads: &[u8]) -> Status {
///         Status::Ok
///     }
/// }
///
/// impl Service for Shard {
///     fn table(&self, table: u32) -> Option<&dyn Table> {
///         (table == 0).then_some(self as &dyn Table)
///     }
/// }
///
/// let shard = Shard { dims: [2] };
/// let mut row = [0xffu8; 8];
/// assert_eq!(Table::pull(&shard, &[5], &mut row, &mut Vec::new()), Status::Ok);
/// let mut tensors = Vec::new();
/// Service::pull(&shard, &[5], &mut tensors); // the default: UNIMPLEMENTED
/// assert_eq!(tensors[0].as_ref().err(), Some(&Status::Unimplemented));
/// ```
pub trait Table: Send + Sync {
    /// Element type of the rows.
    fn dtype(&self) -> DType;

    /// Shape of one row (e.g. `[dim]`).
    fn row_dims(&self) -> &[u64];

    /// Writes the rows of `ids`, in order, into `out`: exactly `ids.len() * row_bytes`
    /// bytes, row `i` at `i * row_bytes`, little-endian elements; `out` has no alignment.
    /// For an id it has no row for, writes zeros and appends the id's position to `missing`
    /// (positions increasing). Any other failure: a non-OK [`Status`]
    /// ([`Status::InvalidArgument`] for an `out` of the wrong length).
    fn pull(&self, ids: &[u64], out: &mut [u8], missing: &mut Vec<u32>) -> Status;

    /// Applies the gradient rows `grads` (same layout as [`pull`](Self::pull)'s `out`) to
    /// the rows of `ids`. [`Status::InvalidArgument`] for `grads` of the wrong length.
    fn push(&self, ids: &[u64], grads: &[u8]) -> Status;

    /// [`pull`](Self::pull) for a requester that holds some of the rows already (row
    /// versions, `docs/wire-format.md` 4.9): `held[i]` is the version of `ids[i]`'s row the
    /// requester holds (0: none). Writes into `versions[i]` the row's current version —
    /// a value that changes with every push applied to the row and that no other contents
    /// of the row ever had, also across the table's restarts, rebuilds and evictions — and
    /// 0 for a missing row or a table that keeps no versions. A row whose version is
    /// nonzero and equal to `held[i]` is answered *unchanged*: the server does not send it,
    /// and the table need not write it (its bytes in `out` are then unspecified); every
    /// other row is written as by [`pull`](Self::pull). `held` and `versions` have
    /// `ids.len()` elements ([`Status::InvalidArgument`] otherwise).
    ///
    /// The default keeps no versions: every version 0, every row pulled (so answered
    /// changed). [`PsTable`](crate::rows::PsTable) and [`MemTable`](crate::rows::MemTable)
    /// keep versions.
    fn pull_versioned(
        &self,
        ids: &[u64],
        held: &[u64],
        out: &mut [u8],
        versions: &mut [u64],
        missing: &mut Vec<u32>,
    ) -> Status {
        if held.len() != ids.len() || versions.len() != ids.len() {
            return Status::InvalidArgument;
        }
        versions.fill(0);
        self.pull(ids, out, missing)
    }

    /// Bytes of one row: the element size times the product of [`row_dims`](Self::row_dims).
    /// Saturates at `usize::MAX` (an unknown dtype, an overflowing shape), a length no
    /// buffer has.
    fn row_bytes(&self) -> usize {
        row_bytes(self.dtype(), self.row_dims())
    }

    /// The table's counters and state, for `STATS` (`commctl stats`). The default keeps
    /// none.
    fn metrics(&self) -> Option<TableMetrics> {
        None
    }

    /// Saves the table into a file of its own in `dir`, written atomically (the file
    /// appears whole or not at all), while the table goes on serving. Called from a thread
    /// of the runtime's (not a loop) when a checkpoint of the task is asked for. The
    /// default: [`SaveError::Unsupported`].
    fn save(&self, dir: &Path) -> Result<SaveReport, SaveError> {
        let _ = dir;
        Err(SaveError::Unsupported)
    }

    /// Housekeeping (eviction of rows, giving memory back), called about once a second
    /// from a thread of the runtime's while the table serves. The default does nothing.
    fn maintain(&self) {}

    /// One line for the start-up report: how the table is laid out and what it got from
    /// the kernel (huge pages). The default says nothing.
    fn report(&self) -> Option<String> {
        None
    }
}

/// What a table's [`save`](Table::save) wrote, and how long it took.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SaveReport {
    /// The checkpoint file.
    pub path: PathBuf,
    /// Rows saved.
    pub rows: u64,
    /// Bytes of the file.
    pub bytes: u64,
    /// From start to the file in place.
    pub elapsed: Duration,
    /// Of which in `write` calls (copying into the page cache, or waiting for the disk).
    pub writing: Duration,
    /// Of which waiting for `fsync`.
    pub syncing: Duration,
    /// Whether rows went to the disk around the page cache (`O_DIRECT`; not on every file
    /// system).
    pub direct_io: bool,
}

impl SaveReport {
    /// Bytes per second from start to the file in place, in GB/s.
    pub fn gb_per_s(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e9
    }
}

/// Why a table's [`save`](Table::save) saved nothing.
#[derive(Debug)]
#[non_exhaustive]
pub enum SaveError {
    /// The table cannot be saved (it does not implement [`Table::save`]).
    Unsupported,
    /// Saving failed; the error names the file and what went wrong. No file was left in
    /// place of the checkpoint (an earlier one stays as it was).
    Failed(Box<dyn std::error::Error + Send + Sync>),
}

impl fmt::Display for SaveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SaveError::Unsupported => f.write_str("this table cannot be saved"),
            SaveError::Failed(e) => fmt::Display::fmt(e, f),
        }
    }
}

impl std::error::Error for SaveError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SaveError::Unsupported => None,
            SaveError::Failed(e) => Some(&**e),
        }
    }
}

/// Bytes of a row of `dtype` elements shaped `dims`; `usize::MAX` for an unknown dtype or a
/// size that overflows.
pub fn row_bytes(dtype: DType, dims: &[u64]) -> usize {
    let elem = match dtype.size() {
        Some(n) => n,
        None => return usize::MAX,
    };
    dims.iter()
        .try_fold(elem, |acc, &d| acc.checked_mul(d))
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(usize::MAX)
}
