//! Tables of embedding rows a PS task serves.

use crate::wire::{DType, Status};

/// A table of embedding rows served by a PS task.
pub trait Table: Send + Sync {
    /// Element type of the rows.
    fn dtype(&self) -> DType;
    /// Shape of one row (e.g. `[dim]`).
    fn row_dims(&self) -> &[u64];
    /// Writes the rows of `ids`, in order, into `out`.
    fn pull(&self, ids: &[u64], out: &mut [u8], missing: &mut Vec<u32>) -> Status;
    /// Applies the gradient rows `grads` to the rows of `ids`.
    fn push(&self, ids: &[u64], grads: &[u8]) -> Status;
}
