//! The server side of pull and push: what the trainer implements.
//!
//! A PS task implements [`Service`]: what a pull returns and how a push is applied are the
//! trainer's. Handlers run inline on the loop that owns the connection the request arrived
//! on: there is no thread hop, and a loop runs one handler at a time, but every loop may
//! run handlers concurrently, so a service shared by several loops must synchronize its
//! own state (shard it, or use atomics or short locks). Keep inline handlers short — a slow
//! handler delays every other connection of its loop; see `docs/tuning.md`.

use std::sync::Arc;

use crate::table::Table;
use crate::tensor::Tensor;
use crate::wire::Status;

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
}

/// A shared service.
pub type SharedService = Arc<dyn Service>;

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

/// A registry of tables serves their rows; pulls and pushes of tensors by id are
/// `UNIMPLEMENTED`.
impl Service for crate::table::Tables {
    fn table(&self, table: u32) -> Option<&dyn Table> {
        self.get(table)
    }
}
