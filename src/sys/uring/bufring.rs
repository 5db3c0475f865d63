//! A ring of provided buffers (`IORING_REGISTER_PBUF_RING`, Linux 5.19) that multishot
//! receives take their buffers from: the kernel picks the next buffer when data arrives
//! and names it in the completion (its id in the flags); the loop copies the data out and
//! gives the buffer back, which makes it the kernel's again.
//!
//! With incremental consumption (`IOU_PBUF_RING_INC`, Linux 6.12) the kernel fills a buffer
//! across several receives, of any connections, before it moves on to the next: each
//! completion names the buffer and flags whether the kernel goes on with it
//! (`IORING_CQE_F_BUF_MORE`); its bytes start where the previous completion's ended. A
//! buffer is then given back once the kernel is done with it *and* every piece of it is
//! copied out: each buffer counts its *pins*, one for the kernel while it may still write
//! into it and one per piece not yet released.
//!
//! The ring of buffer descriptors and the buffers themselves are this struct's heap
//! memory, allocated once. The kernel writes into a buffer between taking it and posting
//! its completion; from then until [`BufRing::release`] hands it back, the buffer is ours
//! to read. Both allocations must outlive every operation that may take a buffer: the
//! driver that owns this ring leaks it rather than free it while such an operation is
//! still in the kernel.

use std::alloc::{self, Layout};
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, Ordering};

use nix::libc;

use super::Ring;

/// Bytes per buffer. A small frame (a ping, a 100-row answer) fits in one; a larger one
/// takes several completions, or, when it is received in place, is read directly.
pub const RECV_BUF_SIZE: usize = 16 << 10;

/// The buffer group id the loop's ring is registered under.
pub const BUF_GROUP: u16 = 0;

/// One `struct io_uring_buf`: where a buffer is, its length, and its id.
#[repr(C)]
struct Entry {
    addr: u64,
    len: u32,
    bid: u16,
    /// In entry 0, the ring's tail (the kernel's `resv` field).
    resv: u16,
}

/// A registered ring of `count` buffers of [`RECV_BUF_SIZE`] bytes.
pub struct BufRing {
    /// `count` entries, page-aligned, shared with the kernel.
    entries: NonNull<Entry>,
    /// `count * RECV_BUF_SIZE` bytes of buffers.
    bufs: NonNull<u8>,
    count: u16,
    /// The tail this side has published (entries added so far, wrapping).
    tail: u16,
    /// The head as completions show it: entries the kernel has taken, wrapping. The kernel
    /// takes entries in ring order, one per receive or several for a bundle.
    head: u16,
    /// The buffer id put at each ring position.
    bid_at: Vec<u16>,
    /// Buffers the kernel holds: provided and not yet finished with (named by a completion;
    /// with incremental consumption, by one without `BUF_MORE`).
    in_kernel: u16,
    /// Whether the kernel consumes buffers incrementally.
    incremental: bool,
    /// Per buffer: where the kernel's next bytes into it go (incremental consumption).
    filled: Vec<u32>,
    /// Per buffer: its pins (the kernel's while it may write into it, and one per piece
    /// not released); provided again when the last goes.
    pins: Vec<u16>,
}

impl BufRing {
    /// A ring of `count` buffers (rounded down to a power of two, at most 32768) registered
    /// with `ring` under [`BUF_GROUP`], every buffer provided; consumed incrementally when
    /// `incremental` and the kernel accepts it (see [`incremental`](Self::incremental)).
    pub fn new(ring: &mut Ring, count: u32, incremental: bool) -> io::Result<BufRing> {
        let count = count.clamp(1, 1 << 15);
        let count = 1u32 << (31 - count.leading_zeros());
        let entries_layout = entries_layout(count as u16)?;
        let bufs_layout = bufs_layout(count as u16)?;
        // SAFETY: both layouts have a non-zero size.
        let (entries, bufs) = unsafe {
            (
                alloc::alloc_zeroed(entries_layout),
                alloc::alloc(bufs_layout),
            )
        };
        let (Some(entries), Some(bufs)) = (NonNull::new(entries), NonNull::new(bufs)) else {
            // SAFETY: freed with the layout it was allocated with, when it was.
            unsafe {
                if !entries.is_null() {
                    alloc::dealloc(entries, entries_layout);
                }
                if !bufs.is_null() {
                    alloc::dealloc(bufs, bufs_layout);
                }
            }
            return Err(io::Error::from(io::ErrorKind::OutOfMemory));
        };
        let mut me = BufRing {
            entries: entries.cast(),
            bufs,
            count: count as u16,
            tail: 0,
            head: 0,
            bid_at: vec![0; count as usize],
            in_kernel: 0,
            incremental: false,
            filled: vec![0; count as usize],
            pins: vec![0; count as usize],
        };
        let addr = me.entries.as_ptr() as u64;
        // SAFETY: the entries are page-aligned memory of `count` entries, owned by `me`,
        // which is dropped (or leaked) only after the ring's last operation that may use it
        // (this module's contract with the driver); the registration ends with the ring.
        unsafe {
            if incremental {
                match ring.register_buf_ring(addr, me.count, BUF_GROUP, true) {
                    Ok(()) => me.incremental = true,
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                        // A kernel before 6.12: whole buffers, one per receive.
                        log::debug!("io_uring: no incremental buffer consumption ({e})");
                        ring.register_buf_ring(addr, me.count, BUF_GROUP, false)?;
                    }
                    Err(e) => return Err(e),
                }
            } else {
                ring.register_buf_ring(addr, me.count, BUF_GROUP, false)?;
            }
        }
        for bid in 0..me.count {
            me.provide(bid);
        }
        Ok(me)
    }

    /// Buffers in the ring.
    pub fn count(&self) -> u16 {
        self.count
    }

    /// Buffers the kernel holds now.
    pub fn in_kernel(&self) -> u16 {
        self.in_kernel
    }

    /// Bytes of memory the ring holds.
    pub fn bytes(&self) -> usize {
        usize::from(self.count) * (RECV_BUF_SIZE + std::mem::size_of::<Entry>())
    }

    /// Whether the kernel consumes the buffers incrementally (asked for, and Linux 6.12).
    pub fn incremental(&self) -> bool {
        self.incremental
    }

    /// Takes the pieces of buffers a completion filled: it named buffer `first`, received
    /// `bytes`, and, with incremental consumption, said whether the kernel goes on with
    /// that buffer (`more`, its `BUF_MORE` flag). Calls `each` with every piece: its
    /// buffer, and where in it its bytes start and how many (a bundle fills consecutive
    /// ring entries, each whole but the last). Each piece is ours to read until
    /// [`release`](Self::release)d. Returns how many pieces, 0 when `first` is not the
    /// buffer at the ring's head (nothing is taken then).
    pub fn take(
        &mut self,
        first: u16,
        bytes: usize,
        more: bool,
        mut each: impl FnMut(u16, usize, usize),
    ) -> u16 {
        let mask = self.count - 1;
        if self.in_kernel == 0 || self.bid_at[usize::from(self.head & mask)] != first {
            return 0;
        }
        if self.incremental {
            // A completion that names a buffer consumed `bytes` of it, and `more` says
            // whether the kernel goes on with it: a 0-byte completion names one only with
            // `more` (the kernel keeps the head then) or, received early in a worker, with
            // the buffer's rest given up (`more` clear, the head moved): both agree with
            // what is done here.
            let b = usize::from(first);
            let start = self.filled[b] as usize;
            if bytes > RECV_BUF_SIZE - start {
                // More than the buffer has room for: not a completion of this ring.
                return 0;
            }
            self.filled[b] += bytes as u32;
            if more {
                // The kernel keeps its pin; the piece adds one.
                self.pins[b] += 1;
            } else {
                // The kernel is done with it: its pin passes to the piece.
                self.head = self.head.wrapping_add(1);
                self.in_kernel -= 1;
            }
            each(first, start, bytes);
            return 1;
        }
        let n = bytes
            .div_ceil(RECV_BUF_SIZE)
            .clamp(1, usize::from(self.in_kernel)) as u16;
        let mut left = bytes;
        for i in 0..n {
            let bid = self.bid_at[usize::from(self.head.wrapping_add(i) & mask)];
            let len = left.min(RECV_BUF_SIZE);
            left -= len;
            each(bid, 0, len);
        }
        self.head = self.head.wrapping_add(n);
        self.in_kernel -= n;
        n
    }

    /// Lets go of a piece of buffer `bid` (from [`take`](Self::take)): the buffer is
    /// provided again once no piece of it is held and the kernel is done with it.
    pub fn release(&mut self, bid: u16) {
        let Some(pins) = self.pins.get_mut(usize::from(bid)) else {
            return;
        };
        *pins = pins.saturating_sub(1);
        if *pins == 0 {
            self.provide(bid);
        }
    }

    /// Bytes `start..start + len` of buffer `bid`, which a completion named and which has
    /// not been provided again; empty when the range is outside the buffer.
    pub fn data(&self, bid: u16, start: usize, len: usize) -> &[u8] {
        if bid >= self.count || !matches!(start.checked_add(len), Some(e) if e <= RECV_BUF_SIZE) {
            return &[];
        }
        // SAFETY: the range lies in buffer `bid` (checked above). A completion named it and
        // it has not been provided since, so the kernel does not write it; `&self` keeps
        // `provide` (which needs `&mut`) from handing it back while the slice lives.
        unsafe {
            std::slice::from_raw_parts(
                self.bufs
                    .as_ptr()
                    .add(usize::from(bid) * RECV_BUF_SIZE + start),
                len,
            )
        }
    }

    /// Hands buffer `bid` to the kernel again (or for the first time): its whole room, with
    /// the kernel's pin.
    fn provide(&mut self, bid: u16) {
        if bid >= self.count {
            return;
        }
        self.filled[usize::from(bid)] = 0;
        self.pins[usize::from(bid)] = 1;
        let index = usize::from(self.tail & (self.count - 1));
        // SAFETY: `index` < count, inside the entries allocation. The kernel reads entries
        // only between its head and the published tail, and this one lies past the tail
        // (the ring never holds more than `count` buffers: a bid is provided again only
        // once its last pin goes, the kernel's among them).
        unsafe {
            let e = self.entries.as_ptr().add(index);
            (*e).addr = self.bufs.as_ptr().add(usize::from(bid) * RECV_BUF_SIZE) as u64;
            (*e).len = RECV_BUF_SIZE as u32;
            (*e).bid = bid;
        }
        self.bid_at[index] = bid;
        self.tail = self.tail.wrapping_add(1);
        // SAFETY: the tail lives in entry 0's last two bytes, which the kernel reads
        // atomically; `AtomicU16` has the layout of `u16`, and the release store publishes
        // the entry written above before the kernel can see the new tail.
        unsafe {
            let tail = std::ptr::addr_of_mut!((*self.entries.as_ptr()).resv);
            AtomicU16::from_ptr(tail).store(self.tail, Ordering::Release);
        }
        self.in_kernel += 1;
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with these layouts (which `new` checked); the driver
        // drops the ring only when no operation may take a buffer any more.
        unsafe {
            alloc::dealloc(
                self.entries.as_ptr().cast(),
                entries_layout(self.count).expect("checked in new"),
            );
            alloc::dealloc(
                self.bufs.as_ptr(),
                bufs_layout(self.count).expect("checked in new"),
            );
        }
    }
}

impl std::fmt::Debug for BufRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufRing")
            .field("count", &self.count)
            .field("in_kernel", &self.in_kernel)
            .field("incremental", &self.incremental)
            .finish()
    }
}

/// The entries' layout: whole pages, page-aligned (the kernel requires the ring to start
/// on a page).
fn entries_layout(count: u16) -> io::Result<Layout> {
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        p if p > 0 => p as usize,
        _ => 4096,
    };
    let size = usize::from(count) * std::mem::size_of::<Entry>();
    Layout::from_size_align(size.max(page), page).map_err(|_| io::ErrorKind::InvalidInput.into())
}

fn bufs_layout(count: u16) -> io::Result<Layout> {
    Layout::from_size_align(usize::from(count) * RECV_BUF_SIZE, 64)
        .map_err(|_| io::ErrorKind::InvalidInput.into())
}
