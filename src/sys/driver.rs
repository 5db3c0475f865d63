//! One I/O interface over both backends, completion-style.
//!
//! The event loop asks for operations — accept, connect, recv, sendmsg — on a *slot* (its
//! connection number) and later receives one completion per operation: `(user_data, result)`
//! with the result a byte count, a new fd, or `-errno`, exactly like io_uring. On io_uring
//! the operations are ring entries. On epoll the driver tries the non-blocking syscall at
//! once and, only on `EAGAIN`, remembers the operation and retries it when edge-triggered
//! readiness arrives; either way it reports a completion. The loop above this is therefore
//! the same code for both backends.
//!
//! Kernel memory: the driver owns everything the kernel reads or writes for an operation
//! until that operation's completion has been reaped — the socket address of a connect,
//! the `msghdr` and iovecs of a send, and the data itself: the buffer a receive writes into
//! and the blocks and tensors a send reads are lent to the driver by value and given back
//! after the completion ([`loan`](super::loan)). Every call here is therefore safe. To
//! abandon the operations of a socket, `shutdown(2)` it ([`Driver::shutdown`]): pending
//! operations then complete promptly (recv with 0, send with `EPIPE`, accept with
//! `EINVAL`), after which the fd may be closed. A driver dropped with operations in flight
//! cancels them and waits for their completions (bounded); memory of any the kernel still
//! holds after that is leaked, never freed. Completions carry `io::Result`: the kernel's
//! `-errno` is converted here.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use io_uring::{opcode, types};
use nix::libc;

use super::bufpool::BufPool;
use super::doorbell::Doorbell;
use super::epoll::{Events, Interest, Poller};
use super::loan::{Gather, IoBuf, IoBufMut, RecvMem, SendMem, SlotMem};
use super::ops::{decode, ACCEPT_DIRECT, USER_DATA_DOORBELL};
pub use super::ops::{user_data, IoCompletion, Op, Socket, LISTENER};
use super::uring::{on_socket, RecvRing, Removed, UringDriver, UringOptions};
use super::Backend;

/// Writes `addr` as a C sockaddr into `out`; returns its length.
fn write_sockaddr(addr: &SocketAddr, out: &mut libc::sockaddr_storage) -> libc::socklen_t {
    let storage = nix::sys::socket::SockaddrStorage::from(*addr);
    use nix::sys::socket::SockaddrLike;
    let len = storage.len();
    // SAFETY: `storage.as_ptr()` points at `len` valid bytes of sockaddr, and `out` is a
    // sockaddr_storage, large enough for any socket address.
    unsafe {
        std::ptr::copy_nonoverlapping(
            storage.as_ptr().cast::<u8>(),
            (out as *mut libc::sockaddr_storage).cast::<u8>(),
            len as usize,
        );
    }
    len
}

/// The backend-specific half of a loop. One per loop, so the size difference between the
/// variants costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
enum Io {
    /// io_uring.
    Uring(UringDriver),
    /// epoll with eager non-blocking syscalls.
    Epoll(EpollDriver),
}

/// A loop's I/O: the backend, the kernel memory of each slot's operations (including the
/// memory lent to them, see [`loan`](super::loan)), and the receive-buffer pool. `M` is the
/// memory of a tensor received in place, `S` a tensor sent by reference.
pub struct Driver<M: IoBufMut, S: IoBuf> {
    /// Dropped in `Drop`, after the operations in flight have been drained.
    io: std::mem::ManuallyDrop<Io>,
    /// Per slot, what the kernel reads and writes for the slot's operations; allocated on a
    /// slot's first use and reused.
    mem: Vec<Option<Box<SlotMem<M, S>>>>,
    /// Receive buffers lent to connections, registered with io_uring when possible.
    pool: BufPool,
}

impl<M: IoBufMut, S: IoBuf> Driver<M, S> {
    /// A driver for `backend` with room for about `entries` operations in flight, waking on
    /// `doorbell`; an io_uring ring is set up as `opts` asks (see [`UringOptions`]; with
    /// `SetupFlags::Auto`, drive the driver from one thread).
    pub fn new(
        backend: Backend,
        entries: u32,
        doorbell: &Doorbell,
        opts: UringOptions,
    ) -> io::Result<Self> {
        let io = match backend {
            Backend::Uring => Io::Uring(UringDriver::new(entries, doorbell, opts)?),
            Backend::Epoll => Io::Epoll(EpollDriver::new(doorbell)?),
        };
        Ok(Driver {
            io: std::mem::ManuallyDrop::new(io),
            mem: Vec::new(),
            pool: BufPool::new(0, 1),
        })
    }

    /// Which backend this is.
    pub fn backend(&self) -> Backend {
        match &*self.io {
            Io::Uring(_) => Backend::Uring,
            Io::Epoll(_) => Backend::Epoll,
        }
    }

    /// The optional kernel features this driver uses.
    pub fn features(&self) -> super::IoFeatures {
        let fixed_buffers = self.pool.is_registered();
        match &*self.io {
            Io::Uring(d) => {
                let c = d.ring.capabilities();
                super::IoFeatures {
                    single_issuer: c.single_issuer,
                    defer_taskrun: c.defer_taskrun,
                    coop_taskrun: c.coop_taskrun,
                    taskrun_flag: c.taskrun_flag,
                    ext_arg: c.feat_ext_arg,
                    fixed_buffers,
                    fixed_files: d.files.is_on(),
                    direct_accept: d.files.direct_accept(),
                    registered_ring_fd: c.registered_ring_fd,
                    multishot_accept: c.defer_taskrun || c.coop_taskrun,
                    multishot_recv: d.recv_ring().is_some(),
                    recv_bundles: d.recv_ring().is_some_and(|r| r.bundles),
                    recv_incremental: d.recv_ring().is_some_and(|r| r.incremental),
                    sq_entries: c.sq_entries,
                    cq_entries: c.cq_entries,
                }
            }
            Io::Epoll(_) => super::IoFeatures::default(),
        }
    }

    /// Starts watching `fd` for `slot` (epoll registers it; io_uring enters it in the
    /// ring's file table, if it has one with a free entry).
    pub fn register(&mut self, slot: u32, fd: RawFd) -> io::Result<()> {
        match &mut *self.io {
            Io::Uring(d) => {
                d.files.enter(&mut d.ring, slot, fd);
                Ok(())
            }
            Io::Epoll(d) => d.register(slot, fd),
        }
    }

    /// Stops watching `slot`'s fd. Call once its operations have all completed, and
    /// before closing the fd (io_uring's file table holds the socket open until then).
    pub fn deregister(&mut self, slot: u32) {
        match &mut *self.io {
            Io::Uring(d) => {
                let busy = d.release(slot);
                match d.files.remove(&mut d.ring, slot) {
                    Ok(Removed::Done) => {}
                    Ok(Removed::Direct(index)) => {
                        d.close_direct(index, busy);
                        d.maybe_back_to_direct();
                    }
                    Err(e) => log::error!("slot {slot}: leaving the io_uring file table: {e}"),
                }
            }
            Io::Epoll(d) => d.deregister(slot),
        }
    }

    /// Takes the socket a direct accept put at `index` of the ring's file table as
    /// `slot`'s (io_uring only: only its accepts complete with [`Socket::Direct`]). It has
    /// no descriptor: operations on `slot` name it by index, whatever fd they are given,
    /// and [`deregister`](Self::deregister) closes it. An error (a slot number past any
    /// the session gives) closes it.
    pub fn adopt_direct(&mut self, slot: u32, index: u32) -> io::Result<()> {
        if let Io::Uring(d) = &mut *self.io {
            if d.files.adopt_direct(slot, index) {
                return Ok(());
            }
            d.close_direct(index, false);
        }
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("slot {slot} cannot take direct socket {index}"),
        ))
    }

    /// Makes the ring's file table `own` entries for the loop and `direct` for direct
    /// accepts (tests of a full table). Call before any socket is entered.
    #[cfg(test)]
    pub(crate) fn file_table_for_test(&mut self, own: u32, direct: u32) {
        if let Io::Uring(d) = &mut *self.io {
            d.ring.unregister_files().unwrap();
            d.files = super::uring::FixedFiles::new(&mut d.ring, own, direct);
        }
    }

    /// Whether direct accepts ran out of file table entries (an accept failed with
    /// `ENFILE` for that): accepts go into descriptors for now, and the next one can be
    /// armed at once.
    pub fn direct_accept_full(&self) -> bool {
        match &*self.io {
            Io::Uring(d) => d.direct_accept_full(),
            Io::Epoll(_) => false,
        }
    }

    /// Closes a direct socket no slot took (see [`adopt_direct`](Self::adopt_direct)).
    pub fn close_direct(&mut self, index: u32) {
        if let Io::Uring(d) = &mut *self.io {
            d.close_direct(index, false);
        }
    }

    /// Makes every pending operation on `slot`'s socket `fd` complete soon, so it can be
    /// closed (a direct socket, `fd` -1, by a ring operation).
    pub fn shutdown(&mut self, slot: u32, fd: RawFd) {
        if fd >= 0 {
            // SAFETY: shutdown(2) on an fd we own; no memory is passed.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        }
        if let Io::Uring(d) = &mut *self.io {
            if let (true, Some(index)) = (fd < 0, d.files.index(slot)) {
                d.shutdown_direct(index);
            }
            // shutdown(2) does not abort a connect still in progress (it would wait for the
            // TCP connect timeout): cancel it. Without such an operation the cancel
            // completes with -ENOENT, which is ignored (its user_data has no operation).
            let entry = opcode::AsyncCancel::new(user_data(slot, Op::Connect))
                .build()
                .user_data((slot as u64) << 8);
            // SAFETY: the cancel entry references no memory.
            if let Err(e) = unsafe { d.push_urgent(&entry) } {
                log::warn!("cancelling connect on slot {slot}: {e}");
            }
        }
        if let Io::Epoll(d) = &mut *self.io {
            // Readiness for a shut-down socket arrives as an event; run the pending
            // operations now anyway so a socket that never reports still completes.
            d.retry(slot, true, true);
        }
    }

    /// Accepts a connection on listener `fd`; completes with the new socket or `-errno`: a
    /// descriptor (non-blocking, close-on-exec), or with direct accept on an io_uring ring
    /// an entry of its file table (see [`adopt_direct`](Self::adopt_direct)). Call again
    /// after each completion. On an io_uring ring with task-work flags (Linux 5.19 or
    /// later) one multishot accept stays in the kernel and completes once per connection:
    /// calling again while it does is a no-op, and an error ends it (the next call arms a
    /// new one).
    pub fn accept(&mut self, slot: u32, fd: RawFd) -> io::Result<()> {
        match &mut *self.io {
            Io::Uring(d) => {
                if d.accept_armed {
                    return Ok(());
                }
                let caps = d.ring.capabilities();
                let multishot = caps.defer_taskrun || caps.coop_taskrun;
                let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
                let entry = if multishot && d.files.accept_direct_now() {
                    // Into the file table, where close-on-exec means nothing (and is
                    // refused).
                    opcode::AcceptMulti::new(types::Fd(fd))
                        .allocate_file_index(true)
                        .flags(libc::SOCK_NONBLOCK)
                        .build()
                        .user_data(((slot as u64) << 8) | ACCEPT_DIRECT)
                } else if multishot {
                    opcode::AcceptMulti::new(types::Fd(fd))
                        .flags(flags)
                        .build()
                        .user_data(user_data(slot, Op::Accept))
                } else {
                    let (addr, len) = (std::ptr::null_mut(), std::ptr::null_mut());
                    opcode::Accept::new(types::Fd(fd), addr, len)
                        .flags(flags)
                        .build()
                        .user_data(user_data(slot, Op::Accept))
                };
                d.accept_user_data = entry.get_user_data();
                // SAFETY: no memory is referenced (no address pointers).
                unsafe { d.push(&entry)? };
                d.accept_armed = true;
                Ok(())
            }
            Io::Epoll(d) => {
                d.pending(slot).accept = true;
                d.retry(slot, true, false);
                Ok(())
            }
        }
    }

    /// Whether an accept is under way: asked for, and its last completion not delivered
    /// yet (a multishot one stays so between its completions). Shutting the listener
    /// down ends it.
    pub fn accepting(&self) -> bool {
        match &*self.io {
            Io::Uring(d) => d.accept_armed,
            Io::Epoll(d) => d.listener.accept,
        }
    }

    /// The kernel memory of `slot`, allocated on first use.
    fn mem(&mut self, slot: u32) -> &mut SlotMem<M, S> {
        let i = slot as usize;
        if self.mem.len() <= i {
            self.mem.resize_with(i + 1, || None);
        }
        self.mem[i].get_or_insert_with(SlotMem::new)
    }

    /// Connects `fd` to `addr`; completes with 0 or the error.
    pub fn connect(&mut self, slot: u32, fd: RawFd, addr: &SocketAddr) -> io::Result<()> {
        let mem = self.mem(slot);
        mem.addr_len = write_sockaddr(addr, &mut mem.addr);
        let len = mem.addr_len;
        let addr: *const libc::sockaddr = (&mem.addr as *const libc::sockaddr_storage).cast();
        mem.connect_busy = true;
        let r = match &mut *self.io {
            Io::Uring(d) => {
                let entry = on_socket!(d, slot, fd, |s| opcode::Connect::new(s, addr, len)
                    .build()
                    .user_data(user_data(slot, Op::Connect)));
                // SAFETY: `addr` points into the slot's boxed memory, which the driver keeps
                // until the connect's completion has been reaped (`connect_busy`).
                unsafe { d.push_urgent(&entry) }
            }
            Io::Epoll(d) => {
                // SAFETY: `addr`/`len` describe the sockaddr just written.
                let rc = unsafe { libc::connect(fd, addr, len) };
                let err = errno_of(rc);
                if err == -libc::EINPROGRESS {
                    d.pending(slot).connect = true;
                } else {
                    d.ready
                        .push_back((user_data(slot, Op::Connect), err.min(0)));
                }
                Ok(())
            }
        };
        if r.is_err() {
            self.mem(slot).connect_busy = false;
        }
        r
    }

    /// Receives into bytes `start..start + len` of `mem`, which the driver keeps until the
    /// completion (the count, 0 at the end of the stream, or the error) has been reaped;
    /// then [`take_recv`](Self::take_recv) gives it back. `fixed` names the pool buffer
    /// `mem` is, if the caller knows it: on io_uring, when that buffer is registered and
    /// `mem` lies in it, the receive is a `READ_FIXED`, which spares the kernel mapping the
    /// user pages on every operation; the result says whether it is. An operation that
    /// cannot be started gives `mem` back with the error.
    ///
    /// `ahead`: bytes past `len` may be read ahead and kept for the next receives of the
    /// slot. On io_uring with a ring of provided buffers such a receive into a connection
    /// buffer is served by a multishot receive (see [`UringDriver`]); any other receive
    /// reads exactly what it asks for, straight into `mem`, once the data kept is used up.
    #[allow(clippy::too_many_arguments)]
    pub fn recv(
        &mut self,
        slot: u32,
        fd: RawFd,
        mem: RecvMem<M>,
        start: usize,
        len: usize,
        ahead: bool,
        fixed: Option<u16>,
    ) -> Result<bool, (io::Error, RecvMem<M>)> {
        let is_buffer = matches!(mem, RecvMem::Buffer(_));
        let slot_mem = self.mem(slot);
        if slot_mem.recv_busy || slot_mem.recv.is_some() {
            let e = io::Error::other("a receive is already in flight");
            return Err((e, mem));
        }
        let (buf, len) = match slot_mem.lend_recv(mem, start, len) {
            Ok(p) => p,
            Err(mem) => {
                let e = io::Error::new(io::ErrorKind::InvalidInput, "receive range out of bounds");
                return Err((e, mem));
            }
        };
        slot_mem.recv_busy = true;
        let fixed = fixed.filter(|&i| {
            is_buffer && self.pool.is_registered() && self.pool.contains(i, buf, len as usize)
        });
        let r = match &mut *self.io {
            // SAFETY: `buf..buf+len` lies in memory the slot holds until the completion has
            // been reaped (`recv_busy`); a fixed read's range was checked to lie in pool
            // buffer `index`, registered for the life of the ring.
            Io::Uring(d) => unsafe { d.recv(slot, fd, buf, len, is_buffer && ahead, fixed) },
            Io::Epoll(d) => {
                let p = d.pending(slot);
                p.recv = Some((buf, len));
                if !p.drained {
                    d.retry(slot, true, false);
                }
                Ok(false)
            }
        };
        match r {
            Ok(fixed) => Ok(fixed),
            Err(e) => {
                let mem = self.mem(slot);
                mem.recv_busy = false;
                let (m, _) = mem.recv.take().expect("lent just above");
                Err((e, m))
            }
        }
    }

    /// Whether a receive on `slot` has been started and its completion not yet reaped.
    pub fn recv_in_flight(&self, slot: u32) -> bool {
        self.mem
            .get(slot as usize)
            .and_then(Option::as_ref)
            .is_some_and(|m| m.recv_busy)
    }

    /// The memory of `slot`'s last receive, once its completion has been reaped.
    pub fn take_recv(&mut self, slot: u32) -> Option<RecvMem<M>> {
        let mem = self.mem.get_mut(slot as usize)?.as_mut()?;
        if mem.recv_busy {
            return None;
        }
        mem.recv.take().map(|(m, _)| m)
    }

    /// The next send on `slot`, emptied; fill it, then call [`send`](Self::send). `None`
    /// while the previous send is in flight.
    pub fn gather(&mut self, slot: u32) -> Option<Gather<'_, M, S>> {
        let mem = self.mem(slot);
        if mem.send_busy {
            return None;
        }
        mem.send.clear();
        mem.iov_len = 0;
        Some(Gather { mem, bytes: 0 })
    }

    /// Sends the pieces [`gather`](Self::gather) collected for `slot`, as one message (with
    /// `MSG_NOSIGNAL`); completes with the bytes sent or the error. The memory they are in
    /// stays with the driver until then; [`take_sent`](Self::take_sent) gives it back. A
    /// send that cannot be started leaves it there too.
    pub fn send(&mut self, slot: u32, fd: RawFd) -> io::Result<()> {
        let mem = self.mem(slot);
        if mem.send_busy {
            return Err(io::Error::other("a send is already in flight"));
        }
        // SAFETY: msghdr is plain old data; all-zero (null pointers, zero lengths) is valid.
        mem.msg = unsafe { std::mem::zeroed() };
        mem.msg.msg_iov = mem.iov.as_mut_ptr();
        mem.msg.msg_iovlen = mem.iov_len as _;
        let msg: *const libc::msghdr = &mem.msg;
        mem.send_busy = true;
        let r = match &mut *self.io {
            Io::Uring(d) => {
                let entry = on_socket!(d, slot, fd, |s| opcode::SendMsg::new(s, msg)
                    .flags(libc::MSG_NOSIGNAL as u32)
                    .build())
                .user_data(user_data(slot, Op::Send));
                // SAFETY: the message, its iovecs and the memory they point into (checked
                // to lie in the owners by `Gather::piece`) are the slot's, kept until the
                // completion has been reaped (`send_busy`).
                unsafe { d.push_urgent(&entry) }
            }
            Io::Epoll(d) => {
                d.pending(slot).send = Some(msg);
                d.retry(slot, false, true);
                Ok(())
            }
        };
        if r.is_err() {
            self.mem(slot).send_busy = false;
        }
        r
    }

    /// Hands the memory of `slot`'s last send to `f`, once its completion has been reaped.
    pub fn take_sent(&mut self, slot: u32, mut f: impl FnMut(SendMem<S>)) {
        let Some(mem) = self.mem.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        if mem.send_busy {
            return;
        }
        mem.iov_len = 0;
        for m in mem.send.drain(..) {
            f(m);
        }
    }

    /// Takes `pool` as the receive-buffer pool and registers it with io_uring as fixed
    /// buffers. `Ok(false)` on epoll, or when the pool is empty; errors carry the sizes
    /// asked for and, for ENOMEM, the `RLIMIT_MEMLOCK` numbers (the pool is then used
    /// unregistered).
    pub fn set_pool(&mut self, pool: BufPool) -> io::Result<bool> {
        self.pool = pool;
        if self.pool.count() == 0 {
            return Ok(false);
        }
        let iov = self.pool.iovecs();
        let registered = match &mut *self.io {
            // SAFETY: the pool's buffers are allocated once and freed only with the driver
            // (the pool is its field, and the ring that holds the registration is dropped
            // first); a buffer lent out comes back at the same address, or is retired and
            // kept (`BufPool::give_back`).
            Io::Uring(d) => unsafe { d.ring.register_buffers(&iov) }.map(|()| true)?,
            Io::Epoll(_) => false,
        };
        self.pool.set_registered(registered);
        Ok(registered)
    }

    /// The receive-buffer pool.
    pub fn pool(&mut self) -> &mut BufPool {
        &mut self.pool
    }

    /// Submits every queued entry now, also those [`complete`](Self::complete) leaves
    /// queued until the next enter (re-armed receives, accepts, the doorbell poll). Call
    /// when a loop turn found nothing to do, before spinning: otherwise a receive re-armed
    /// with no send to carry it would wait for the park.
    pub fn submit_pending(&mut self) -> io::Result<()> {
        match &mut *self.io {
            Io::Uring(d) => d.submit_pending(),
            Io::Epoll(_) => Ok(()),
        }
    }

    /// Submits what is queued and delivers ready completions to `f`, waiting up to
    /// `timeout` for the first one when `wait` is true (`None`: no limit). Returns how many
    /// completions were delivered. The memory of a completed operation can be taken back
    /// from then on.
    pub fn complete(
        &mut self,
        wait: bool,
        timeout: Option<Duration>,
        mut f: impl FnMut(IoCompletion),
    ) -> io::Result<usize> {
        let mem = &mut self.mem;
        let mut reaped = |c: IoCompletion| {
            if let IoCompletion::Op { slot, op, .. } = c {
                if let Some(m) = mem.get_mut(slot as usize).and_then(Option::as_mut) {
                    match op {
                        Op::Recv => m.recv_busy = false,
                        Op::Send => m.send_busy = false,
                        Op::Connect => m.connect_busy = false,
                        Op::Accept => {}
                    }
                }
            }
            f(c)
        };
        match &mut *self.io {
            Io::Uring(d) => d.complete(wait, timeout, &mut reaped),
            Io::Epoll(d) => d.complete(wait, timeout, &mut reaped),
        }
    }

    /// Operations whose completion has not been reaped yet.
    pub fn in_flight(&self) -> usize {
        let multishots = match &*self.io {
            Io::Uring(d) => d.multishots_in_flight(),
            Io::Epoll(_) => 0,
        };
        let ops: usize = (self.mem.iter().flatten())
            .map(|m| m.recv_busy as usize + m.send_busy as usize + m.connect_busy as usize)
            .sum();
        ops + multishots
    }

    /// The io_uring ring of provided buffers that multishot receives take data from;
    /// `None` on epoll or without one.
    pub fn recv_ring(&self) -> Option<RecvRing> {
        match &*self.io {
            Io::Uring(d) => d.recv_ring(),
            Io::Epoll(_) => None,
        }
    }

    /// Cancels every operation in flight and reaps completions until none is left, for a
    /// second at most. Returns whether all completed. For a driver that is going: on
    /// io_uring no receive is started after it.
    pub(crate) fn drain(&mut self) -> bool {
        if let Io::Uring(d) = &mut *self.io {
            d.cancel_all_multi();
            for (slot, m) in self.mem.iter().enumerate() {
                let Some(m) = m else { continue };
                let ops = [
                    (m.recv_busy, Op::Recv),
                    (m.send_busy, Op::Send),
                    (m.connect_busy, Op::Connect),
                ];
                for (_, op) in ops.iter().filter(|(busy, _)| *busy) {
                    let entry = opcode::AsyncCancel::new(user_data(slot as u32, *op))
                        .build()
                        .user_data((slot as u64) << 8);
                    // SAFETY: the cancel entry references no memory.
                    if let Err(e) = unsafe { d.push_urgent(&entry) } {
                        log::warn!("cancelling on slot {slot}: {e}");
                    }
                }
            }
        }
        for _ in 0..1000 {
            if self.in_flight() == 0 {
                return true;
            }
            if self
                .complete(true, Some(Duration::from_millis(1)), |_| {})
                .is_err()
            {
                break;
            }
        }
        self.in_flight() == 0
    }
}

impl<M: IoBufMut, S: IoBuf> Drop for Driver<M, S> {
    fn drop(&mut self) {
        if matches!(*self.io, Io::Uring(_)) && self.in_flight() > 0 && !self.drain() {
            // Operations still in the kernel may write into or read the memory lent to them
            // and their slot's `msghdr`. Closing the ring cancels them asynchronously, so
            // freeing that memory now could let the kernel use freed memory: leak it. A
            // fixed read may also still write into a registered pool buffer.
            log::error!(
                "I/O driver dropped with {} operations in flight that did not drain; \
                 leaking their memory",
                self.in_flight()
            );
            for m in self.mem.iter_mut() {
                if m.as_ref().is_some_and(|m| m.busy()) {
                    std::mem::forget(m.take());
                }
            }
            std::mem::forget(std::mem::replace(&mut self.pool, BufPool::new(0, 1)));
            if let Io::Uring(d) = &mut *self.io {
                d.leak_multi();
            }
        }
        if let Io::Uring(d) = &mut *self.io {
            // Closes of direct sockets still queued go to the kernel.
            if let Err(e) = d.submit_pending() {
                log::warn!("io_uring: submitting before the ring goes: {e}");
            }
            // The file table's references to sockets whose descriptors are closed (or about
            // to be) go now, on this thread, rather than in the ring's asynchronous teardown.
            d.files.clear(&mut d.ring);
        }
        // SAFETY: dropped once, here, and not used after.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.io) };
    }
}

fn errno_of(rc: i32) -> i32 {
    if rc < 0 {
        -std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    } else {
        rc
    }
}

fn errno_of_isize(rc: isize) -> i32 {
    if rc < 0 {
        -std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    } else {
        rc.min(i32::MAX as isize) as i32
    }
}

/// Operations waiting for readiness on one slot.
#[derive(Debug)]
struct Pending {
    fd: RawFd,
    /// The last receive emptied the socket: the next one waits for readiness instead of
    /// trying first (edge-triggered epoll reports any data that arrives later).
    drained: bool,
    /// The peer closed its side (or the socket failed): no readiness edge will come again,
    /// so receives always try, until they read the end of the stream.
    read_closed: bool,
    accept: bool,
    connect: bool,
    recv: Option<(*mut u8, u32)>,
    send: Option<*const libc::msghdr>,
}

impl Pending {
    const fn empty() -> Pending {
        Pending {
            fd: -1,
            drained: false,
            read_closed: false,
            accept: false,
            connect: false,
            recv: None,
            send: None,
        }
    }
}

/// epoll half.
pub struct EpollDriver {
    poller: Poller,
    events: Events,
    slots: Vec<Pending>,
    listener: Pending,
    /// Completions produced by eager syscalls or readiness, not yet delivered.
    ready: VecDeque<(u64, i32)>,
    doorbell_fd: RawFd,
}

impl EpollDriver {
    fn new(doorbell: &Doorbell) -> io::Result<EpollDriver> {
        let poller = Poller::new()?;
        poller.add(doorbell, USER_DATA_DOORBELL, Interest::READABLE)?;
        Ok(EpollDriver {
            poller,
            events: Events::with_capacity(1024),
            slots: Vec::new(),
            listener: Pending::empty(),
            ready: VecDeque::with_capacity(1024),
            doorbell_fd: doorbell.as_raw_fd(),
        })
    }

    fn pending(&mut self, slot: u32) -> &mut Pending {
        if slot == LISTENER {
            return &mut self.listener;
        }
        let i = slot as usize;
        if i >= self.slots.len() {
            self.slots.resize_with(i + 1, Pending::empty);
        }
        &mut self.slots[i]
    }

    fn register(&mut self, slot: u32, fd: RawFd) -> io::Result<()> {
        *self.pending(slot) = Pending {
            fd,
            ..Pending::empty()
        };
        // SAFETY: the fd is open and owned by the loop until `deregister`.
        let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        self.poller.add(borrowed, slot as u64, Interest::BOTH)
    }

    fn deregister(&mut self, slot: u32) {
        let p = self.pending(slot);
        let fd = std::mem::replace(&mut p.fd, -1);
        debug_assert!(p.recv.is_none() && p.send.is_none() && !p.accept && !p.connect);
        if fd >= 0 {
            // SAFETY: the fd is still open (the loop closes it after deregistering).
            let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            self.poller.delete(borrowed).ok();
        }
    }

    /// Runs the pending operations of `slot` that readiness may have unblocked.
    fn retry(&mut self, slot: u32, readable: bool, writable: bool) {
        let p = if slot == LISTENER {
            &mut self.listener
        } else {
            match self.slots.get_mut(slot as usize) {
                Some(p) => p,
                None => return,
            }
        };
        let fd = p.fd;
        if readable {
            if p.accept {
                // SAFETY: accept4 with null address pointers references no memory.
                let rc = unsafe {
                    libc::accept4(
                        fd,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                    )
                };
                let r = errno_of(rc);
                if r != -libc::EAGAIN && r != -libc::ECONNABORTED && r != -libc::EINTR {
                    p.accept = false;
                    self.ready.push_back((user_data(slot, Op::Accept), r));
                }
            }
            if let Some((buf, len)) = p.recv {
                // SAFETY: the loop keeps `buf..buf+len` valid while the recv is pending.
                let rc = unsafe { libc::recv(fd, buf.cast(), len as usize, 0) };
                let r = errno_of_isize(rc);
                if r == -libc::EAGAIN {
                    p.drained = true;
                } else if r != -libc::EINTR {
                    // A short read took everything there was, except an end of stream
                    // that arrived with the data: its edge is already spent.
                    p.drained = r >= 0 && (r as u32) < len && !p.read_closed;
                    p.recv = None;
                    self.ready.push_back((user_data(slot, Op::Recv), r));
                }
            }
        }
        if writable {
            if p.connect {
                let r = match super::socket::take_socket_error(
                    // SAFETY: the fd is open while registered.
                    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
                ) {
                    Ok(None) => 0,
                    Ok(Some(e)) | Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
                };
                p.connect = false;
                self.ready.push_back((user_data(slot, Op::Connect), r));
            }
            if let Some(msg) = p.send {
                // SAFETY: the loop keeps the message and its buffers valid while pending.
                let rc = unsafe { libc::sendmsg(fd, msg, libc::MSG_NOSIGNAL) };
                let r = errno_of_isize(rc);
                if r != -libc::EAGAIN && r != -libc::EINTR {
                    p.send = None;
                    self.ready.push_back((user_data(slot, Op::Send), r));
                }
            }
        }
    }

    fn complete(
        &mut self,
        wait: bool,
        timeout: Option<Duration>,
        f: &mut dyn FnMut(IoCompletion),
    ) -> io::Result<usize> {
        let block = wait && self.ready.is_empty();
        let timeout = if block { timeout } else { Some(Duration::ZERO) };
        self.poller.wait(&mut self.events, timeout)?;
        let mut doorbell = false;
        for i in 0..self.events.len() {
            let Some(ev) = self.events.get(i) else {
                break;
            };
            if ev.token() == USER_DATA_DOORBELL {
                doorbell = true;
                continue;
            }
            let gone = ev.is_error() || ev.is_hup();
            let readable = ev.is_readable() || ev.is_read_closed() || gone;
            if readable {
                if let Some(p) = self.slots.get_mut(ev.token() as usize) {
                    p.drained = false;
                    p.read_closed |= ev.is_read_closed() || gone;
                }
            }
            self.retry(ev.token() as u32, readable, ev.is_writable() || gone);
        }
        if doorbell {
            let mut v = 0u64;
            // SAFETY: reads 8 bytes into a local u64 from the non-blocking eventfd.
            unsafe { libc::read(self.doorbell_fd, (&mut v as *mut u64).cast(), 8) };
        }
        let mut n = 0;
        while let Some((user_data, result)) = self.ready.pop_front() {
            if let Some(c) = decode(user_data, result) {
                f(c);
                n += 1;
            }
        }
        if doorbell {
            f(IoCompletion::Doorbell);
            n += 1;
        }
        Ok(n)
    }
}
