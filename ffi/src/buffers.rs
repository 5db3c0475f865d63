//! The caller's buffers of a rows pull (`sw_client_pull_rows`, `sw_client_pull_rows_wait`),
//! lent to the runtime as the memory each table's block is received into, and given back
//! before the request's wait returns (or its callback is called).
//!
//! `Lent` is `TensorMemory` over the caller's memory: with the casts (`cast.rs`) and the
//! allocator hooks (`allocator.rs`), the crate's `unsafe` lives here, each use saying why
//! it holds.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use starwire::rows::PulledRows;
use starwire::{DType, Status, TensorAllocator, TensorDesc, TensorMemory};

/// The wire status code of a block (0 for a block).
pub(crate) fn status_code<T>(block: Result<T, Status>) -> u32 {
    block.err().map_or(0, |s| u16::from(s) as u32)
}

/// A reply on its way to a callback that waits for the caller's buffers.
pub(crate) struct Deferred(pub(crate) Box<dyn FnOnce() + Send>);

/// Locks `m`, taking a poisoned lock as is (the counts it guards stay consistent).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The caller's buffer of one table of a rows pull.
pub(crate) struct Target {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
    pub(crate) dtype: DType,
    /// The block's shape: `[n, row...]`.
    pub(crate) dims: Vec<u64>,
}

/// The caller's buffers of a rows pull, and which of them starwire holds.
pub(crate) struct RowsTargets {
    targets: Vec<Target>,
    state: Mutex<Held>,
    /// Signalled when the last buffer held is given back and a thread waits for it.
    released: Condvar,
}

/// Which of a rows pull's buffers starwire holds.
struct Held {
    /// Per table, whether its buffer was handed out.
    taken: Vec<bool>,
    /// How many handed out are still held.
    lent: usize,
    /// For a client with a callback: its call once none is.
    deferred: Option<Deferred>,
    /// Threads in `wait_released`: giving the last buffer back signals only when there are
    /// some (a signal is a system call, on the waiting thread's critical path otherwise).
    waiters: usize,
}

// SAFETY: the pointers are the caller's buffers, which `sw_client_pull_rows`' contract keeps
// valid (and unused by the caller) until the request's wait returns, or its callback is
// called, which both wait for every buffer to be given back; they are only written through
// `Lent`, by the one thread receiving a block into it, or by `place` once the blocks are
// received.
unsafe impl Send for RowsTargets {}
// SAFETY: shared references read the pointers, never the memory behind them (written
// only as said above, by one holder at a time), and the shared state is behind a mutex.
unsafe impl Sync for RowsTargets {}

impl RowsTargets {
    pub(crate) fn new(targets: Vec<Target>) -> RowsTargets {
        RowsTargets {
            state: Mutex::new(Held {
                taken: vec![false; targets.len()],
                lent: 0,
                deferred: None,
                waiters: 0,
            }),
            targets,
            released: Condvar::new(),
        }
    }

    /// Whether starwire holds one of the buffers.
    pub(crate) fn held(&self) -> bool {
        lock(&self.state).lent > 0
    }

    /// Waits until starwire holds none of the buffers.
    pub(crate) fn wait_released(&self) {
        let mut state = lock(&self.state);
        while state.lent > 0 {
            state.waiters += 1;
            state = self
                .released
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            state.waiters -= 1;
        }
    }

    /// Runs `call` once starwire holds none of the buffers: now, or when the last is given
    /// back (on the thread that gives it back).
    pub(crate) fn when_released(&self, call: Deferred) {
        let mut state = lock(&self.state);
        if state.lent > 0 {
            state.deferred = Some(call);
            return;
        }
        drop(state);
        (call.0)();
    }

    /// Puts each received block of `rows` in its table's buffer and gives the statuses.
    pub(crate) fn place(&self, rows: &PulledRows) -> Vec<u32> {
        place(
            &self.targets,
            (0..rows.len()).map(|t| rows.block(t).map(|b| b.bytes())),
        )
    }

    /// Puts the rows of a one-table versioned pull's answer in the table's buffer, which
    /// holds the caller's copy of the rows: a block received into the buffer (every row
    /// sent, in order) is in place; another (the rows that changed, in position order) has
    /// each row written at its position, the rows that came unchanged left as they are.
    /// The table's status (as `place` gives it) and the rows written.
    pub(crate) fn place_changed(&self, rows: &PulledRows) -> (u32, usize) {
        let (Some(target), 1) = (self.targets.first(), rows.len()) else {
            return (u16::from(Status::Internal) as u32, 0);
        };
        let block = match rows.block(0) {
            Ok(b) => b,
            Err(s) => return (status_code::<()>(Err(s)), 0),
        };
        if block.bytes().as_ptr() == target.ptr.cast_const() {
            let n = target.dims.first().map_or(0, |&n| n as usize);
            return if block.byte_len() == target.len {
                (0, n)
            } else {
                (u16::from(Status::Internal) as u32, 0)
            };
        }
        // SAFETY: `len` bytes at `ptr`, the caller's buffer of the one table (not NULL:
        // `rows_args` checked), which `sw_client_pull_rows_versioned_wait`'s contract keeps
        // valid and unused by the caller during the call; the block is elsewhere (its
        // pointer is not the buffer's, and the allocator hands out the buffer whole or not
        // at all), and nothing else writes the buffer once the answer is in.
        let dest = unsafe { std::slice::from_raw_parts_mut(target.ptr, target.len) };
        match rows.write_changed(0, dest) {
            Ok(n) => (0, n),
            Err(_) => (u16::from(Status::Internal) as u32, 0),
        }
    }
}

/// Puts `blocks[t]` in `targets[t]`: nothing to do for a block received into it (the rule),
/// a copy for one received elsewhere (a peer answering tables of the same shape out of
/// order, so that their blocks went into each other's buffers; all such blocks are copied
/// out before any is written). The statuses, per table: 0, the block's error, or
/// `INTERNAL` for a block of another length than its buffer.
fn place<'a>(
    targets: &[Target],
    blocks: impl Iterator<Item = Result<&'a [u8], Status>>,
) -> Vec<u32> {
    let mut statuses = Vec::with_capacity(targets.len());
    let mut misplaced = Vec::new();
    for (t, (target, block)) in targets.iter().zip(blocks).enumerate() {
        match block {
            Ok(b) if b.len() != target.len => statuses.push(u16::from(Status::Internal) as u32),
            Ok(b) => {
                if b.as_ptr() != target.ptr.cast_const() {
                    misplaced.push((t, b.to_vec()));
                }
                statuses.push(0);
            }
            Err(s) => statuses.push(status_code::<()>(Err(s))),
        }
    }
    for (t, bytes) in misplaced {
        // SAFETY: the target's buffer holds `len == bytes.len()` bytes (checked above),
        // which `sw_client_pull_rows`' contract keeps valid and unused by the caller until
        // the request's wait returns or its callback is called (after this); `bytes` is a
        // copy, apart from it; the blocks viewing the buffers were copied out above and are
        // not read again.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), targets[t].ptr, bytes.len()) };
    }
    statuses
}

/// The allocator of a rows pull's blocks: each block gets the buffer of the first table of
/// its dtype and shape not yet served (the buffer of its own table, unless the peer
/// answers tables of one shape out of order); heap memory if none is left.
pub(crate) struct RowsAllocator(pub(crate) Arc<RowsTargets>);

impl TensorAllocator for RowsAllocator {
    fn allocate(&self, desc: &TensorDesc<'_>) -> Option<Box<dyn TensorMemory>> {
        let len = usize::try_from(desc.byte_len).ok()?;
        let owner = &self.0;
        let mut state = lock(&owner.state);
        let Held { taken, lent, .. } = &mut *state;
        let free = owner
            .targets
            .iter()
            .zip(taken.iter())
            .position(|(t, &taken)| {
                !taken && t.dtype == desc.dtype && t.dims == desc.dims && t.len == len
            });
        let Some(i) = free else {
            return Some(Box::new(vec![0u8; len]));
        };
        taken[i] = true;
        *lent += 1;
        Some(Box::new(Lent {
            ptr: owner.targets[i].ptr,
            len,
            owner: owner.clone(),
        }))
    }
}

/// A caller's buffer lent to the runtime for one block; given back when dropped.
struct Lent {
    ptr: *mut u8,
    len: usize,
    owner: Arc<RowsTargets>,
}

// SAFETY: the buffer is the caller's, valid while lent (`sw_client_pull_rows`' contract and
// the wait for its return), and lent to this value alone (`Held::taken`).
unsafe impl Send for Lent {}
// SAFETY: shared access only reads the bytes.
unsafe impl Sync for Lent {}

// SAFETY: `ptr`/`len` never change while the value lives, and the buffer stays valid and
// unmoved until the value is dropped: the request's wait, and freeing the client, wait for
// that.
unsafe impl TensorMemory for Lent {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes at `ptr`, the caller's buffer of one table (not NULL, `len`
        // above 0: `rows_args` checked both), which stays valid and unused by the caller
        // until the request's wait returns or its callback is called, and those wait for
        // this value to be dropped; it is lent to this value alone, and `&self` excludes
        // `bytes_mut`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes the slice the only view of the buffer.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let mut state = lock(&self.owner.state);
        state.lent -= 1;
        let last = state.lent == 0;
        let deferred = if last { state.deferred.take() } else { None };
        let waiters = last && state.waiters > 0;
        drop(state);
        if waiters {
            self.owner.released.notify_all();
        }
        if let Some(call) = deferred {
            (call.0)();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(buf: &mut [u8]) -> Target {
        Target {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            dtype: DType::U8,
            dims: vec![buf.len() as u64],
        }
    }

    #[test]
    fn blocks_received_into_each_others_buffers_are_put_in_place() {
        // Tables 0 and 2 of one shape, answered out of order: 0's block went into 2's
        // buffer and 2's into 0's. Table 1's block is where it belongs; table 3 failed.
        let (mut b0, mut b1, mut b2, mut b3) = ([2u8; 4], [1u8; 4], [0u8; 4], [9u8; 4]);
        let targets = [
            target(&mut b0),
            target(&mut b1),
            target(&mut b2),
            target(&mut b3),
        ];
        // SAFETY: views of the buffers through the targets' pointers, as the runtime's
        // blocks are; not used once `place` writes.
        let view = |t: &Target| unsafe { std::slice::from_raw_parts(t.ptr.cast_const(), t.len) };
        let blocks = [
            Ok(view(&targets[2])),
            Ok(view(&targets[1])),
            Ok(view(&targets[0])),
            Err(Status::NotFound),
        ];
        assert_eq!(place(&targets, blocks.into_iter()), [0, 0, 0, 1]);
        let short = [7u8; 3];
        assert_eq!(place(&targets[..1], [Ok(&short[..])].into_iter()), [8]);
        drop(targets);
        assert_eq!((b0, b1, b2, b3), ([0; 4], [1; 4], [2; 4], [9; 4]));
    }

    /// The targets of a rows pull of ids 1 and 2 (rows of 4 u8) from two tables, into `a`
    /// and `b`.
    fn two_targets(a: &mut [u8; 8], b: &mut [u8; 8]) -> Arc<RowsTargets> {
        let targets = [a, b].map(|buf| Target {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            dtype: DType::U8,
            dims: vec![2, 4],
        });
        Arc::new(RowsTargets::new(targets.into()))
    }

    #[test]
    fn the_allocator_hands_out_each_buffer_once_by_shape() {
        let (mut a, mut b) = ([0u8; 8], [0u8; 8]);
        let targets = two_targets(&mut a, &mut b);
        let alloc = RowsAllocator(targets.clone());
        let desc = |dims: &'static [u64]| TensorDesc {
            dtype: DType::U8,
            dims,
            byte_len: 8,
        };
        let m1 = alloc.allocate(&desc(&[2, 4])).unwrap();
        let m2 = alloc.allocate(&desc(&[2, 4])).unwrap();
        assert_eq!(m1.bytes().as_ptr(), targets.targets[0].ptr.cast_const());
        assert_eq!(m2.bytes().as_ptr(), targets.targets[1].ptr.cast_const());
        // None left, or another shape: heap memory.
        let m3 = alloc.allocate(&desc(&[2, 4])).unwrap();
        let m4 = alloc.allocate(&desc(&[4, 2])).unwrap();
        for m in [&m3, &m4] {
            let p = m.bytes().as_ptr();
            assert!(targets.targets.iter().all(|t| t.ptr.cast_const() != p));
        }
        assert_eq!(lock(&targets.state).lent, 2);
        drop((m1, m2, m3, m4));
        assert_eq!(lock(&targets.state).lent, 0);
        targets.wait_released();
    }

    #[test]
    fn a_thread_waiting_for_the_buffers_is_woken_by_the_last_one_given_back() {
        let (mut a, mut b) = ([0u8; 8], [0u8; 8]);
        let targets = two_targets(&mut a, &mut b);
        let alloc = RowsAllocator(targets.clone());
        let desc = TensorDesc {
            dtype: DType::U8,
            dims: &[2, 4],
            byte_len: 8,
        };
        let (m1, m2) = (
            alloc.allocate(&desc).unwrap(),
            alloc.allocate(&desc).unwrap(),
        );
        // Given back with no one waiting: nothing to signal, and nothing left held.
        drop(m1);
        assert_eq!(lock(&targets.state).lent, 1);
        let waiter = {
            let targets = targets.clone();
            std::thread::spawn(move || targets.wait_released())
        };
        // The waiter is counted under the lock before it sleeps, so once it is counted the
        // last buffer given back has to wake it.
        while lock(&targets.state).waiters == 0 {
            std::thread::yield_now();
        }
        drop(m2);
        waiter.join().unwrap();
        let state = lock(&targets.state);
        assert_eq!((state.lent, state.waiters), (0, 0));
    }
}
