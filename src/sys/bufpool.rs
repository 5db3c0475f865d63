//! The per-loop pool of receive buffers (`STARWIRE_BUF_SIZE`), registered with io_uring as
//! fixed buffers when the kernel and the locked-memory limit allow.
//!
//! The pool is allocated once, when the loop starts, as equal buffers of the connections'
//! receive-buffer size. A connection borrows one for its life ([`BufPool::lend`]) and gives it
//! back when it is dropped ([`BufPool::give_back`]); connections beyond the pool's count use
//! ordinary heap buffers. A buffer never moves or reallocates while lent (the decoder grows
//! into a separate buffer instead), so its address stays the one registered with the kernel,
//! and a read into it can name it by index (`READ_FIXED`), which spares the kernel mapping
//! the user pages on every operation. It is the shape of the pinned pool an RDMA backend
//! needs.
//!
//! No allocation after [`BufPool::new`]: lending and giving back move `Vec`s in and out of
//! slots that exist from the start.

use nix::libc;

/// Most fixed buffers one io_uring accepts (`IORING_MAX_REG_BUFFERS`).
pub const MAX_FIXED_BUFFERS: usize = 1 << 14;

/// Equal receive buffers owned by one loop; see the module documentation.
#[derive(Debug)]
pub struct BufPool {
    /// Bytes of each buffer.
    each: usize,
    /// The buffers not lent out, by index.
    slots: Vec<Option<Vec<u8>>>,
    /// Indexes of the buffers in `slots`, the next to lend last.
    free: Vec<u16>,
    /// Start address of each buffer, as registered; never changes.
    bases: Vec<usize>,
    registered: bool,
    /// Buffers that came back changed: kept, never reused (see [`BufPool::give_back`]).
    retired: Vec<Vec<u8>>,
}

impl BufPool {
    /// A pool of `total / each` buffers of `each` bytes (at most [`MAX_FIXED_BUFFERS`]);
    /// empty when `total` is 0 or smaller than one buffer.
    pub fn new(total: u64, each: usize) -> BufPool {
        let each = each.max(1);
        let count = (total / each as u64).min(MAX_FIXED_BUFFERS as u64) as usize;
        let mut slots = Vec::with_capacity(count);
        let mut bases = Vec::with_capacity(count);
        for _ in 0..count {
            let mut buf = vec![0u8; each];
            bases.push(buf.as_mut_ptr() as usize);
            slots.push(Some(buf));
        }
        BufPool {
            each,
            slots,
            free: (0..count as u16).rev().collect(),
            bases,
            registered: false,
            retired: Vec::new(),
        }
    }

    /// How many buffers the pool has.
    pub fn count(&self) -> usize {
        self.bases.len()
    }

    /// Bytes of all buffers together.
    pub fn bytes(&self) -> u64 {
        (self.count() * self.each) as u64
    }

    /// Buffers not lent out.
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// One iovec per buffer, in index order, for registration. Call before lending any:
    /// the addresses are those of the buffers the pool holds.
    pub fn iovecs(&mut self) -> Vec<libc::iovec> {
        self.bases
            .iter()
            .map(|&base| libc::iovec {
                iov_base: base as *mut libc::c_void,
                iov_len: self.each,
            })
            .collect()
    }

    /// Records whether registration succeeded.
    pub fn set_registered(&mut self, registered: bool) {
        self.registered = registered;
    }

    /// Whether the buffers are registered with the kernel as fixed buffers.
    pub fn is_registered(&self) -> bool {
        self.registered
    }

    /// Lends a buffer: its index and the buffer, or `None` when all are lent.
    pub fn lend(&mut self) -> Option<(u16, Vec<u8>)> {
        let index = self.free.pop()?;
        let buf = self.slots[index as usize].take();
        debug_assert!(buf.is_some());
        buf.map(|b| (index, b))
    }

    /// Takes back buffer `index`. A buffer that is not the one lent under that index (its
    /// address differs, or the index is not lent) is dropped instead of reused, and the
    /// index retired: a registered index must only ever name its own memory.
    pub fn give_back(&mut self, index: u16, buf: Vec<u8>) {
        let i = index as usize;
        let same = self.bases.get(i) == Some(&(buf.as_ptr() as usize))
            && buf.len() == self.each
            && self.slots[i].is_none();
        if !same {
            log::error!("receive buffer {index} came back changed; retiring it");
            // Kept rather than freed: memory the loop cannot account for may be registered
            // memory, which the kernel may still write to (see `Drop`).
            self.retired.push(buf);
            return;
        }
        self.slots[i] = Some(buf);
        self.free.push(index);
    }

    /// Buffers retired because they came back changed.
    pub fn retired(&self) -> usize {
        self.retired.len()
    }

    /// Whether `ptr..ptr+len` lies inside buffer `index` (so a fixed read may target it).
    pub fn contains(&self, index: u16, ptr: *const u8, len: usize) -> bool {
        let Some(&base) = self.bases.get(index as usize) else {
            return false;
        };
        let start = ptr as usize;
        start >= base && start.saturating_add(len) <= base + self.each
    }
}

impl Drop for BufPool {
    fn drop(&mut self) {
        if self.registered {
            // A retired buffer may be registered memory the kernel still holds: leaked, not
            // freed. Unregistered pools free them.
            for buf in self.retired.drain(..) {
                std::mem::forget(buf);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_lend_and_give_back() {
        let mut pool = BufPool::new(10 << 10, 4 << 10);
        assert_eq!(pool.count(), 2);
        assert_eq!(pool.bytes(), 8 << 10);
        let iov = pool.iovecs();
        assert_eq!(iov.len(), 2);
        let (i, mut a) = pool.lend().unwrap();
        assert_eq!(i, 0);
        assert_eq!(a.as_ptr() as usize, iov[0].iov_base as usize);
        assert!(pool.contains(i, a.as_ptr(), a.len()));
        assert!(!pool.contains(i, a.as_ptr(), a.len() + 1));
        assert!(pool.contains(i, a[100..].as_mut_ptr(), 16));
        let (j, b) = pool.lend().unwrap();
        assert_eq!(j, 1);
        assert!(!pool.contains(j, a.as_ptr(), 1));
        assert!(pool.lend().is_none());
        pool.give_back(i, a);
        assert_eq!(pool.available(), 1);
        pool.give_back(j, b);
        assert_eq!(pool.available(), 2);
        assert_eq!(pool.lend().unwrap().0, 1);
    }

    #[test]
    fn a_foreign_buffer_is_not_taken_back() {
        let mut pool = BufPool::new(8 << 10, 4 << 10);
        let (i, _kept) = pool.lend().unwrap();
        pool.give_back(i, vec![0; 4 << 10]);
        assert_eq!(pool.available(), 1, "index {i} is retired");
        assert_eq!(pool.retired(), 1);
        // Giving back an index that is not lent is refused too.
        let (j, b) = pool.lend().unwrap();
        pool.give_back(j, b);
        let (k, b) = pool.lend().unwrap();
        assert_eq!(k, j);
        pool.give_back(i, b);
        assert_eq!(pool.available(), 0);
    }

    #[test]
    fn empty_pools() {
        assert_eq!(BufPool::new(0, 4096).count(), 0);
        assert_eq!(BufPool::new(4095, 4096).count(), 0);
        assert!(BufPool::new(0, 4096).lend().is_none());
    }
}
