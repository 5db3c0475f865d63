//! One event loop per thread, shared-nothing: the I/O half.
//!
//! A loop owns its listener socket (bound with `SO_REUSEPORT`, so the kernel spreads
//! accepted connections over the loops), the sockets of its connections, its driver and its
//! receive-buffer pool. What the bytes mean is the [`Session`]'s business: the loop accepts,
//! connects, receives where the session says, sends what the session hands it, and tells it
//! what happened and what time it is. Other threads reach a loop only through
//! single-producer rings (one per submitting [`Handle`](crate::Handle)) and its
//! [`LoopShared`].
//!
//! One iteration ([`Loop::turn`]): take new handles, posted work and requests, submit and
//! reap I/O, start writes, fire the session's timers. Each step does a bounded amount of
//! work and reports progress; with nothing to do the loop spins for its budget and then
//! parks in the kernel (`io_uring_enter` or `epoll_wait`) until a completion, a timer or the
//! doorbell.
//!
//! Memory: what a receive writes into (the connection's receive buffer, or a tensor's
//! memory) and what a send reads (the encoder's arena blocks, shared tensors) is lent to
//! the driver by value for the life of the operation and handed back to the session after
//! its completion, so nothing here can free memory the kernel uses. Closing is two-phase
//! for the socket's sake: `shutdown(2)` it (its pending operations complete promptly), then
//! release the connection in the session, and close the descriptor, when the last one has.

mod idle;
mod io;
mod shared;

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::error::OsError;
use crate::session::{
    Action, Completion, RecvLoan, RecvPlace, Request, SendSink, Session, SessionParts,
};
use crate::stats::add;
use crate::sys::bufpool::BufPool;
use crate::sys::driver::{Driver, IoCompletion, Op, Socket, LISTENER};
use crate::sys::loan::{Gather, RecvMem, SendMem};
use crate::sys::uring::{SetupFlags, UringOptions};
use crate::sys::{socket, Backend};
use crate::tensor::{Tensor, TensorMemory};

use idle::{IdlePacer, IdleStep};
use io::{lost, IoConn};
pub(crate) use shared::{LoopShared, Posted};

/// Wait before accepting again after EMFILE and friends.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What a loop serves and how it receives tensors, and what it shares with the others.
#[derive(Clone)]
pub(crate) struct LoopParts {
    pub session: SessionParts,
    /// Connections accepted and not yet closed, over all the runtime's loops.
    pub accepted: Arc<AtomicUsize>,
}

/// The driver of a loop: tensors are received into their allocator's memory and sent
/// shared.
type LoopDriver = Driver<Box<dyn TensorMemory>, Arc<Tensor>>;

/// The per-thread event loop.
pub(crate) struct Loop {
    cfg: Arc<Config>,
    shared: Arc<LoopShared>,
    /// Holds the memory of the operations in flight; dropping it drains them.
    driver: LoopDriver,
    session: Session,
    listener: Option<OwnedFd>,
    /// When to accept again after running out of descriptors or memory.
    accept_retry: Option<Instant>,
    /// I/O state per connection slot (the session's slot numbers).
    io: Vec<Option<IoConn>>,
    dirty: Vec<u32>,
    io_events: Vec<IoCompletion>,
    stopping: bool,
    /// Accepted connections open, shared by the runtime's loops (`max_connections`).
    accepted: Arc<AtomicUsize>,
    /// Spare vector swapped with the posted-work queue, so neither is reallocated.
    posted: Vec<Posted>,
}

impl Loop {
    /// A loop on `backend`, listening on `listener` if given. Call on the loop's thread,
    /// after pinning: this allocates the loop's state.
    pub(crate) fn new(
        cfg: Arc<Config>,
        shared: Arc<LoopShared>,
        backend: Backend,
        listener: Option<OwnedFd>,
        parts: LoopParts,
    ) -> std::io::Result<Loop> {
        let entries = 1024u32;
        let flags = if cfg.uring_flags {
            SetupFlags::Auto
        } else {
            SetupFlags::Off
        };
        let opts = UringOptions {
            flags,
            fixed_files: cfg.uring_fixed_files,
            direct_accept: cfg.uring_direct_accept,
            recv_bufs: cfg.uring_recv_bufs,
            recv_bundles: cfg.uring_recv_bundles,
            recv_incremental: cfg.uring_recv_incremental,
        };
        let driver = LoopDriver::new(backend, entries, &shared.doorbell, opts)?;
        if let Some(ring) = driver.recv_ring() {
            add(&shared.counters.recv_ring_bytes, ring.bytes as u64);
        }
        let session = Session::new(cfg.clone(), shared.counters.clone(), parts.session);
        let mut lp = Loop {
            cfg,
            shared,
            driver,
            session,
            listener,
            accept_retry: None,
            io: Vec::with_capacity(64),
            dirty: Vec::with_capacity(64),
            io_events: Vec::with_capacity(1024),
            stopping: false,
            accepted: parts.accepted,
            posted: Vec::new(),
        };
        lp.start_buf_pool();
        if let Some(l) = &lp.listener {
            let fd = l.as_raw_fd();
            lp.driver.register(LISTENER, fd)?;
            lp.driver.accept(LISTENER, fd)?;
        }
        Ok(lp)
    }

    /// Allocates the receive-buffer pool and registers it with io_uring. A registration
    /// the kernel refuses (usually `RLIMIT_MEMLOCK`) is logged once per loop with the
    /// numbers, and the pool is used unregistered.
    fn start_buf_pool(&mut self) {
        let pool = BufPool::new(self.cfg.buf_size, self.cfg.recv_buffer);
        if self.cfg.buf_size > 0 && pool.count() == 0 {
            log::warn!(
                "{}={} is less than one receive buffer ({} bytes): no buffer pool",
                crate::config::ENV_BUF_SIZE,
                self.cfg.buf_size,
                self.cfg.recv_buffer
            );
        }
        if pool.count() == 0 {
            return;
        }
        let (count, bytes) = (pool.count(), pool.bytes());
        let counters = &self.shared.counters;
        add(&counters.buf_pool_bytes, bytes);
        match self.driver.set_pool(pool) {
            Ok(true) => {
                add(&counters.buf_registered_bytes, bytes);
                log::debug!(
                    "registered {count} receive buffers ({bytes} bytes) as io_uring fixed buffers"
                );
            }
            Ok(false) => {}
            Err(e) => log::warn!("{e}; using the receive buffers unregistered"),
        }
    }

    /// The I/O state of connection `slot`, created (with a pool buffer for its decoder, if
    /// one is free) the first time.
    fn io_for(&mut self, slot: u32) -> &mut IoConn {
        let i = slot as usize;
        if self.io.len() <= i {
            self.io.resize_with(i + 1, || None);
        }
        if self.io[i].is_none() {
            let mut conn = IoConn::new(None);
            if let Some((index, buf)) = self.driver.pool().lend() {
                // Replaced before any byte arrived: nothing buffered is lost.
                match self.session.swap_buffer(slot, buf) {
                    Ok(old) => {
                        drop(old);
                        conn.pool_buf = Some(index);
                    }
                    Err(buf) => self.driver.pool().give_back(index, buf),
                }
            }
            self.io[i] = Some(conn);
        }
        self.io[i].as_mut().expect("just set")
    }

    fn io_mut(&mut self, slot: u32) -> Option<&mut IoConn> {
        self.io.get_mut(slot as usize).and_then(Option::as_mut)
    }

    /// The optional kernel features the loop's I/O uses.
    pub(crate) fn io_features(&self) -> crate::sys::IoFeatures {
        self.driver.features()
    }

    pub(crate) fn backend(&self) -> Backend {
        self.driver.backend()
    }

    /// Runs until the runtime asks to stop and every operation has drained.
    pub(crate) fn run(&mut self) {
        let mut pacer = IdlePacer::default();
        let mut last = Instant::now();
        // One clock read per turn: the time read after a turn is the next turn's `now`.
        let mut now = last;
        loop {
            let progress = self.turn_at(now);
            now = Instant::now();
            let spent = now.saturating_duration_since(last).as_nanos() as u64;
            last = now;
            if progress {
                add(&self.shared.counters.busy_ns, spent);
                pacer.progress();
                continue;
            }
            self.submit_pending();
            if self.stopping && self.finished() {
                return;
            }
            add(&self.shared.counters.spin_ns, spent);
            let polling = self.cfg.polling && !self.stopping;
            match pacer.idle(now, polling, self.cfg.spin) {
                IdleStep::Spin => core::hint::spin_loop(),
                IdleStep::Yield => std::thread::yield_now(),
                IdleStep::Park => {
                    self.park(now);
                    let woke = Instant::now();
                    add(
                        &self.shared.counters.parked_ns,
                        woke.saturating_duration_since(now).as_nanos() as u64,
                    );
                    add(&self.shared.counters.parks, 1);
                    last = woke;
                    now = woke;
                    pacer.woke();
                }
            }
        }
    }

    /// When the next timer (the session's, or the accept retry) is due, from `now`.
    fn next_timer(&self, now: Instant) -> Option<Duration> {
        let at = match (self.session.poll_timeout(), self.accept_retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        at.map(|at| at.saturating_duration_since(now))
    }

    /// Parks in the kernel until I/O, the next timer, or the doorbell.
    fn park(&mut self, now: Instant) {
        self.shared.parked.store(true, Ordering::SeqCst);
        // Pairs with the fence in `LoopShared::wake`: a producer that published before it
        // could see the flag is seen by this re-check; one that publishes after rings.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.work_queued() {
            self.shared.parked.store(false, Ordering::SeqCst);
            return;
        }
        let timeout = self.next_timer(now);
        self.io(true, timeout, now);
        self.shared.parked.store(false, Ordering::SeqCst);
    }

    fn work_queued(&self) -> bool {
        self.shared.stop.load(Ordering::SeqCst) && !self.stopping
            || self.shared.has_new_endpoints.load(Ordering::SeqCst)
            || self.shared.has_deliveries.load(Ordering::SeqCst)
            || self.session.requests_waiting()
    }

    fn finished(&self) -> bool {
        self.session.is_empty() && !self.driver.accepting()
    }

    /// One bounded iteration; returns whether anything happened.
    pub(crate) fn turn(&mut self) -> bool {
        self.turn_at(Instant::now())
    }

    /// One bounded iteration at time `now` (read once by the caller; nothing in the turn
    /// reads the clock again unless it waits in the kernel).
    fn turn_at(&mut self, now: Instant) -> bool {
        let mut progress = false;
        if !self.stopping && self.shared.stop.load(Ordering::Acquire) {
            self.begin_stop(now);
            progress = true;
        }
        progress |= self.take_endpoints();
        progress |= self.take_posted();
        progress |= self.session.drain_requests(now);
        self.apply_actions(now);
        progress |= self.io(false, None, now);
        progress |= self.flush(now);
        progress |= self.session.handle_timeout(now);
        if self.accept_retry.is_some_and(|at| at <= now) {
            self.accept_retry = None;
            progress = true;
            if !self.stopping && !self.driver.accepting() {
                self.rearm_accept();
            }
        }
        self.apply_actions(now);
        progress
    }

    fn take_endpoints(&mut self) -> bool {
        if !self.shared.has_new_endpoints.load(Ordering::Acquire) {
            return false;
        }
        let mut new = match self.shared.new_handles.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        self.shared
            .has_new_endpoints
            .store(false, Ordering::Release);
        for ep in new.drain(..) {
            self.session.add_handle(ep);
        }
        true
    }

    /// Answers recvs whose keys were published by other threads, and sends the answers of
    /// pool handlers.
    fn take_posted(&mut self) -> bool {
        if !self.shared.has_deliveries.load(Ordering::Acquire) {
            return false;
        }
        let mut batch = std::mem::take(&mut self.posted);
        self.shared.take_posted(&mut batch);
        for posted in batch.drain(..) {
            match posted {
                Posted::Recv(d) => self.session.deliver_recv(d),
                Posted::Answer(a) => self.session.take_answer(a),
                Posted::Retired(r) => self.session.set_retired(r),
            }
        }
        self.posted = batch;
        true
    }

    /// Carries out what the session asked of the sockets.
    fn apply_actions(&mut self, now: Instant) {
        while let Some(action) = self.session.poll_action() {
            match action {
                Action::Connect { slot, addr } => self.connect(slot, addr, now),
                Action::Close { slot } => self.close(slot),
            }
        }
    }

    /// Opens a socket for `slot` and starts connecting it; an immediate failure goes back
    /// to the session, which retries with backoff or gives up.
    fn connect(&mut self, slot: u32, peer: SocketAddr, now: Instant) {
        let fd = match socket::tcp_socket(&peer) {
            Ok(fd) => fd,
            Err(e) => {
                log::warn!("socket for {peer}: {e}");
                self.io_for(slot);
                return self.session.connect_failed(slot, OsError::of(&e), now);
            }
        };
        socket::set_nodelay(&fd, true).ok();
        let raw = fd.as_raw_fd();
        if let Err(e) = self.driver.register(slot, raw) {
            log::warn!("register socket for {peer}: {e}");
            self.io_for(slot);
            return self.session.connect_failed(slot, OsError::of(&e), now);
        }
        let conn = self.io_for(slot);
        conn.sock = Some(Socket::Fd(fd));
        conn.connecting = true;
        if let Err(e) = self.driver.connect(slot, raw, &peer) {
            log::warn!("connect to {peer}: {e}");
            self.drop_socket(slot);
            self.session.connect_failed(slot, OsError::of(&e), now);
        }
    }

    /// Closes the socket of `slot` (a failed connect attempt; the slot lives on).
    fn drop_socket(&mut self, slot: u32) {
        let Some(conn) = self.io_mut(slot) else {
            return;
        };
        conn.connecting = false;
        if let Some(sock) = conn.sock.take() {
            self.driver.deregister(slot);
            drop(sock);
        }
    }

    /// The session closed `slot`: shut its socket so that pending operations complete, and
    /// release it once none is left.
    fn close(&mut self, slot: u32) {
        let Some(conn) = self.io_mut(slot) else {
            // No I/O state: nothing can be in flight (every path that connects or adopts
            // creates it first, so this is only a safeguard).
            drop(self.session.release(slot));
            return;
        };
        conn.closing = true;
        let fd = conn.fd();
        if conn.sock.is_some() && conn.ops_in_flight() {
            self.driver.shutdown(slot, fd);
        }
        self.maybe_finish(slot);
    }

    /// Releases a closing connection once nothing is in flight on it.
    fn maybe_finish(&mut self, slot: u32) {
        let Some(conn) = self.io_mut(slot) else {
            return;
        };
        if !conn.closing || conn.ops_in_flight() {
            return;
        }
        let conn = self.io[slot as usize].take().expect("checked above");
        if conn.sock.is_some() {
            self.driver.deregister(slot);
        }
        drop(conn.sock);
        if conn.counted {
            self.accepted.fetch_sub(1, Ordering::Relaxed);
        }
        // No operation is in flight: the buffer is the loop's again.
        let buf = self.session.release(slot);
        if let Some(index) = conn.pool_buf {
            self.driver.pool().give_back(index, buf);
        }
    }

    /// Submits the re-armed receives and accepts the driver keeps queued until its next
    /// enter: called when a turn found nothing to do, so that they are in the kernel
    /// before the loop spins or returns to its caller.
    fn submit_pending(&mut self) {
        if let Err(e) = self.driver.submit_pending() {
            log::error!("event loop submit failed: {e}");
        }
    }

    /// Submits and reaps I/O, handling every completion.
    /// `now` is the turn's time; after a wait in the kernel the clock is read again.
    fn io(&mut self, wait: bool, timeout: Option<Duration>, now: Instant) -> bool {
        let mut events = std::mem::take(&mut self.io_events);
        let r = self.driver.complete(wait, timeout, |c| events.push(c));
        if let Err(e) = r {
            log::error!("event loop I/O wait failed: {e}");
        }
        if let Some(ring) = self.driver.recv_ring() {
            let counter = &self.shared.counters.recv_ring_exhausted;
            counter.store(ring.exhausted, Ordering::Relaxed);
        }
        let progress = !events.is_empty();
        let now = if wait && progress {
            Instant::now()
        } else {
            now
        };
        for c in events.drain(..) {
            match c {
                IoCompletion::Doorbell => {}
                IoCompletion::Accepted(result) => self.on_accept(result, now),
                IoCompletion::Op { slot, op, result } => self.on_io(slot, op, result, now),
            }
            self.apply_actions(now);
        }
        self.io_events = events;
        progress
    }

    fn on_io(&mut self, slot: u32, op: Op, result: std::io::Result<u32>, now: Instant) {
        let Some(conn) = self.io_mut(slot) else {
            log::error!("completion for unknown connection slot {slot}");
            return;
        };
        match op {
            Op::Connect => {
                conn.connecting = false;
                if conn.closing {
                    return self.maybe_finish(slot);
                }
                if let Err(e) = result {
                    log::debug!("connection {slot}: connect: {e}");
                    self.drop_socket(slot);
                    // The session gets the reason as a value, for the error it may give.
                    return self.session.connect_failed(slot, OsError::of(&e), now);
                }
                self.session.connected(slot);
                self.arm_recv(slot);
            }
            Op::Recv => {
                conn.reading = false;
                let direct = std::mem::take(&mut conn.direct);
                let closing = conn.closing;
                let n = match &result {
                    Ok(n) if !closing => *n,
                    _ => 0,
                };
                // Counted before the session sees the bytes: they may complete a request
                // whose waiter then reads the counters.
                add(&self.shared.counters.bytes_in, n as u64);
                if direct {
                    add(&self.shared.counters.payload_direct, n as u64);
                }
                self.return_recv(slot, n as usize, now);
                if closing {
                    return self.maybe_finish(slot);
                }
                match result {
                    Ok(0) => return self.session.peer_closed(slot),
                    Err(e) => {
                        log::debug!("connection {slot}: {e}");
                        return self.session.lose(slot, lost(&e));
                    }
                    Ok(_) => {}
                }
                self.arm_recv(slot);
            }
            Op::Send => {
                conn.writing = false;
                let closing = conn.closing;
                self.return_sent(slot);
                if closing {
                    return self.maybe_finish(slot);
                }
                let n = match result {
                    Ok(n) => n,
                    Err(e) => {
                        log::debug!("connection {slot}: send: {e}");
                        return self.session.lose(slot, lost(&e));
                    }
                };
                add(&self.shared.counters.bytes_out, n as u64);
                self.session.sent(slot, n as usize, now);
                // Reading may resume: its answers drained.
                self.arm_recv(slot);
            }
            Op::Accept => {}
        }
    }

    fn on_accept(&mut self, result: std::io::Result<Socket>, now: Instant) {
        if self.stopping {
            if let Ok(Socket::Direct(index)) = result {
                self.driver.close_direct(index);
            }
            return;
        }
        match result {
            Ok(sock) => self.adopt(sock, now),
            // The kernel's part of the file table is full (the driver logged it and closes
            // the connection), or an accept into descriptors was ended to go back to direct
            // accepts: the next accept can start now.
            Err(e)
                if e.raw_os_error() == Some(nix::libc::ENFILE)
                    && self.driver.direct_accept_full() => {}
            Err(e)
                if !matches!(
                    e.raw_os_error(),
                    Some(
                        nix::libc::EAGAIN
                            | nix::libc::EINTR
                            | nix::libc::ECONNABORTED
                            | nix::libc::ECANCELED
                    )
                ) =>
            {
                // EMFILE, ENFILE, ENOBUFS, ENOMEM: the connection stays in the backlog; try
                // again a little later instead of spinning on the same error.
                log::warn!("accept: {e}; retrying in {ACCEPT_BACKOFF:?}");
                self.accept_retry = Some(now + ACCEPT_BACKOFF);
                return;
            }
            Err(_) => {}
        }
        self.rearm_accept();
    }

    fn rearm_accept(&mut self) {
        if let Some(l) = &self.listener {
            let fd = l.as_raw_fd();
            if let Err(e) = self.driver.accept(LISTENER, fd) {
                log::error!("accept: {e}");
            }
        }
    }

    /// Takes an accepted socket as a server-side connection.
    fn adopt(&mut self, sock: Socket, now: Instant) {
        let open = self.accepted.fetch_add(1, Ordering::Relaxed);
        if open >= self.cfg.max_connections {
            self.accepted.fetch_sub(1, Ordering::Relaxed);
            add(&self.shared.counters.connections_refused, 1);
            log::warn!(
                "refusing a connection: {open} accepted connections are open, the limit \
                 (STARWIRE_MAX_CONNECTIONS)"
            );
            if let Socket::Direct(index) = sock {
                self.driver.close_direct(index);
            }
            return; // dropping a descriptor closes it
        }
        let slot = self.session.adopt(now);
        let taken = match &sock {
            Socket::Fd(fd) => {
                // A direct socket has it from the listener.
                socket::set_nodelay(fd, true).ok();
                self.driver.register(slot, fd.as_raw_fd())
            }
            &Socket::Direct(index) => self.driver.adopt_direct(slot, index),
        };
        if let Err(e) = taken {
            log::warn!("register accepted socket: {e}");
            self.session.discard(slot);
            self.accepted.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        let conn = self.io_for(slot);
        conn.sock = Some(sock);
        conn.counted = true;
        add(&self.shared.counters.connections_accepted, 1);
        self.arm_recv(slot);
    }

    /// Starts a receive where the session wants the next bytes, if none is in flight.
    fn arm_recv(&mut self, slot: u32) {
        let Some(conn) = self.io.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        if conn.reading || conn.closing || conn.sock.is_none() {
            return;
        }
        let fd = conn.fd();
        let fixed = conn.pool_buf;
        let Some(RecvPlace {
            mem,
            start,
            len,
            ahead,
        }) = self.session.lend_recv(slot)
        else {
            return;
        };
        let (mem, direct) = match mem {
            RecvLoan::Buffer(b) => (RecvMem::Buffer(b), false),
            RecvLoan::Tensor(m) => (RecvMem::Memory(m), true),
        };
        conn.reading = true;
        conn.direct = direct;
        add(&self.shared.counters.reads, 1);
        match self.driver.recv(slot, fd, mem, start, len, ahead, fixed) {
            Ok(true) => add(&self.shared.counters.fixed_reads, 1),
            Ok(false) => {}
            Err((e, mem)) => {
                log::warn!("connection {slot}: recv: {e}");
                if let Some(conn) = self.io_mut(slot) {
                    conn.reading = false;
                    conn.direct = false;
                }
                self.session.received(slot, loan_of(mem), 0, Instant::now());
                self.session.lose(slot, lost(&e));
            }
        }
    }

    /// Gives the memory of `slot`'s completed receive back to the session, with the `n`
    /// bytes it received.
    fn return_recv(&mut self, slot: u32, n: usize, now: Instant) {
        match self.driver.take_recv(slot) {
            Some(mem) => self.session.received(slot, loan_of(mem), n, now),
            None => log::error!("connection {slot}: receive completed without its memory"),
        }
    }

    /// Gives the blocks of `slot`'s completed send back to the session's encoder (the
    /// shared tensors it read are dropped here).
    fn return_sent(&mut self, slot: u32) {
        let session = &mut self.session;
        self.driver.take_sent(slot, |m| {
            if let SendMem::Block { tag, buf } = m {
                session.restore_block(slot, tag, buf);
            }
        });
    }

    /// Starts writes on connections with output.
    fn flush(&mut self, now: Instant) -> bool {
        let mut progress = false;
        let mut dirty = std::mem::take(&mut self.dirty);
        self.session.take_dirty(&mut dirty);
        let acc = self.cfg.acc_size as u64;
        for &slot in &dirty {
            let Some(conn) = self.io.get_mut(slot as usize).and_then(Option::as_mut) else {
                continue;
            };
            if conn.writing || conn.sock.is_none() || conn.connecting || conn.closing {
                continue;
            }
            let fd = conn.fd();
            let Some(gather) = self.driver.gather(slot) else {
                continue;
            };
            let mut sink = Sink {
                gather,
                blocks: arrayvec::ArrayVec::new(),
            };
            if !self.session.transmit(slot, acc, &mut sink) {
                drop(sink);
                self.return_sent(slot);
                continue;
            }
            drop(sink);
            conn.writing = true;
            if let Err(e) = self.driver.send(slot, fd) {
                log::warn!("connection {slot}: send: {e}");
                if let Some(conn) = self.io_mut(slot) {
                    conn.writing = false;
                }
                self.return_sent(slot);
                self.session.lose(slot, lost(&e));
            }
            progress = true;
        }
        self.dirty = dirty;
        self.apply_actions(now);
        progress
    }

    fn begin_stop(&mut self, now: Instant) {
        self.stopping = true;
        self.session.shutdown(now);
        self.apply_actions(now);
        if let Some(l) = &self.listener {
            // A multishot accept stays in the kernel between its completions.
            if self.driver.accepting() {
                self.driver.shutdown(LISTENER, l.as_raw_fd());
            }
        }
    }

    // ----- embedded mode -----

    /// Submits a request from the embedding thread.
    pub(crate) fn submit_local(&mut self, req: Request) {
        self.session.submit_local(req);
    }

    /// Completions for the embedding thread.
    pub(crate) fn take_local(&mut self) -> Option<Completion> {
        self.session.take_local()
    }

    /// Runs iterations until one makes no progress, or parks for up to `timeout` when the
    /// first makes none.
    pub(crate) fn poll_local(&mut self, timeout: Option<Duration>) -> bool {
        let mut progress = false;
        while self.turn() {
            progress = true;
        }
        if !progress {
            self.submit_pending();
        }
        if !progress && timeout != Some(Duration::ZERO) {
            let now = Instant::now();
            let next = self.next_timer(now);
            let t = match (timeout, next) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            progress |= self.io(true, t, now);
            while self.turn() {
                progress = true;
            }
        }
        progress
    }

    pub(crate) fn stop_local(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        while !(self.stopping && self.finished()) {
            if !self.turn() {
                self.io(true, Some(Duration::from_millis(10)), Instant::now());
            }
        }
    }

    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        self.listener
            .as_ref()
            .and_then(|l| socket::local_addr(l).ok())
    }
}

impl Loop {
    #[cfg(test)]
    fn io_in_flight(&self) -> bool {
        self.io.iter().flatten().any(IoConn::ops_in_flight)
    }
}

/// The memory of a completed receive, as the session lent it.
fn loan_of(mem: RecvMem<Box<dyn TensorMemory>>) -> RecvLoan {
    match mem {
        RecvMem::Buffer(b) => RecvLoan::Buffer(b),
        RecvMem::Memory(m) => RecvLoan::Tensor(m),
    }
}

/// A send being filled: the driver's iovecs and owners, and which of the encoder's blocks
/// are lent to it already (by owner number).
struct Sink<'a> {
    gather: Gather<'a, Box<dyn TensorMemory>, Arc<Tensor>>,
    blocks: arrayvec::ArrayVec<(u32, usize), { crate::sys::loan::MAX_IOV }>,
}

impl SendSink for Sink<'_> {
    fn has_room(&self) -> bool {
        self.gather.has_room()
    }

    fn bytes(&self) -> u64 {
        self.gather.bytes()
    }

    fn block(&mut self, block: u32, buf: Box<[u8]>, start: usize, len: usize) {
        // `has_room` was checked: the owner and the piece fit.
        if let Ok(owner) = self.gather.own(SendMem::Block { tag: block, buf }) {
            self.blocks.push((block, owner));
            self.gather.piece(owner, start, len);
        }
    }

    fn in_block(&mut self, block: u32, start: usize, len: usize) {
        if let Some(&(_, owner)) = self.blocks.iter().find(|(b, _)| *b == block) {
            self.gather.piece(owner, start, len);
        }
    }

    fn tensor(&mut self, tensor: Arc<Tensor>, start: usize, len: usize) {
        if let Ok(owner) = self.gather.own(SendMem::Shared(tensor)) {
            self.gather.piece(owner, start, len);
        }
    }
}

#[cfg(test)]
mod tests;
