//! A counter that one loop writes and snapshots read: an update is a relaxed load and
//! store, no locked instruction.

use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Adds `n` to a counter that only the calling loop writes.
#[inline]
pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Relaxed).wrapping_add(n), Relaxed);
}
