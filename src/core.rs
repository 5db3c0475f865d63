//! One event loop per thread, shared-nothing.
//!
//! A loop owns its listener socket (bound with `SO_REUSEPORT`, so the kernel spreads accepted
//! connections over the loops), the connections it accepted or opened, its request-context
//! slab, its buffers and its counters. Other threads reach it only through single-producer
//! rings (one per submitting [`Handle`](crate::Handle)) and its doorbell.
//!
//! One iteration ([`Loop::turn`]): take new handles, drain the request rings, submit and reap
//! I/O, advance the sans-IO connections, start writes, fire timers. Each step does a bounded
//! amount of work and reports progress; with nothing to do the loop spins for its budget and
//! then parks in the kernel (`io_uring_enter` or `epoll_wait`) until a completion, a timer or
//! the doorbell.
//!
//! Buffer lifetime: a connection's receive buffer, its outgoing arena and the `msghdr`/iovec
//! block handed to the kernel stay owned by the connection until every operation on it has
//! completed. Closing a connection is therefore two-phase: `shutdown(2)` the socket (its
//! pending operations complete promptly), then drop the connection when the last one has.
// The loop hands buffer pointers to the driver; each such call is an `unsafe` block below
// whose SAFETY comment points at the two-phase close that keeps the memory alive.
#![allow(unsafe_code)]

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use nix::libc;
use slab::Slab;

use crate::config::Config;
use crate::ctx::{CtxSlab, Handle as CtxHandle};
use crate::error::Error;
use crate::proto::{ConnEvent, Connection, EncoderConfig, Identity, Piece, Side};
use crate::spsc::{Consumer, Producer, ThreadWaker};
use crate::stats::{add, Counters, RequestKind};
use crate::sys::doorbell::Doorbell;
use crate::sys::driver::{Completion as IoCompletion, Driver, Op, LISTENER};
use crate::sys::{socket, Backend};
use crate::wire::{Body, Kind, Status};

/// Most iovecs in one send.
const MAX_IOV: usize = 64;
/// How long a connection closing for an error may take to send its last frame.
const CLOSE_LINGER: Duration = Duration::from_secs(1);
/// Most requests taken from one handle's ring per iteration (bounded work per step).
const DRAIN_BATCH: usize = 256;

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RequestOp {
    /// A ping with this many payload bytes.
    Ping { payload: u32 },
}

impl RequestOp {
    fn kind(&self) -> RequestKind {
        match self {
            RequestOp::Ping { .. } => RequestKind::Ping,
        }
    }
}

/// A request travelling from a handle to the loop that owns the peer's connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request {
    pub op: RequestOp,
    pub peer: SocketAddr,
    /// Which of the peer's connections (0..connections_per_peer) carries it.
    pub lane: u32,
    pub deadline: Option<Instant>,
    /// The submitter's name for the request, echoed in its completion.
    pub tag: u64,
}

/// The answer to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reply {
    /// A ping's answer: the round-trip time measured by the loop, from the request being
    /// queued on the connection to the pong being decoded, and the echoed payload size.
    Pong {
        /// Round-trip time.
        rtt: Duration,
        /// Payload bytes echoed.
        payload: u32,
    },
}

/// A finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The tag given when the request was submitted.
    pub tag: u64,
    /// The answer, or why there is none.
    pub result: Result<Reply, Error>,
}

/// Callback run on the loop thread for every completion of a handle.
pub type Callback = Arc<dyn Fn(Completion) + Send + Sync>;

/// A submitting handle's end, as the loop sees it.
pub(crate) struct Endpoint {
    pub requests: Consumer<Request>,
    pub completions: Producer<Completion>,
    pub callback: Option<Callback>,
    pub waker: Arc<ThreadWaker>,
}

/// State a loop shares with the runtime and the handles.
pub(crate) struct LoopShared {
    pub doorbell: Doorbell,
    /// Set by the loop just before it parks; a producer that swaps it to false rings.
    pub parked: CachePadded<AtomicBool>,
    pub stop: AtomicBool,
    pub new_endpoints: Mutex<Vec<Endpoint>>,
    pub has_new_endpoints: AtomicBool,
    pub counters: CachePadded<Counters>,
}

impl LoopShared {
    pub(crate) fn new() -> std::io::Result<LoopShared> {
        Ok(LoopShared {
            doorbell: Doorbell::new()?,
            parked: CachePadded::new(AtomicBool::new(false)),
            stop: AtomicBool::new(false),
            new_endpoints: Mutex::new(Vec::new()),
            has_new_endpoints: AtomicBool::new(false),
            counters: CachePadded::new(Counters::default()),
        })
    }

    /// Wakes the loop if it is parked: once per parked period, not once per message.
    pub(crate) fn wake(&self) {
        if self.parked.load(Ordering::SeqCst) && self.parked.swap(false, Ordering::SeqCst) {
            self.doorbell.ring();
        }
    }
}

/// Who gets a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// Endpoint number in the loop's table, and the generation of that entry (entries are
    /// reused once a handle is gone; a completion owed to the old handle is dropped).
    Endpoint(u32, u32),
    /// The embedding thread (embedded mode).
    Local,
}

/// An in-flight request.
#[derive(Debug)]
struct Pending {
    tag: u64,
    origin: Origin,
    op: RequestOp,
    conn: u32,
    /// When the request was queued on the connection.
    sent: Option<Instant>,
    /// Completed (by deadline) while its answer may still arrive: the answer is dropped.
    abandoned: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    Deadline(u64),
    Reconnect {
        slot: u32,
        generation: u32,
    },
    Handshake {
        slot: u32,
        generation: u32,
    },
    /// A connection whose protocol closed gets this long to flush its last frame.
    Close {
        slot: u32,
        generation: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the connect to complete.
    Connecting,
    /// Waiting to retry a failed connect.
    Backoff,
    /// Connected, handshake in progress.
    Handshaking,
    /// Usable.
    Open,
    /// Shutting down: waiting for in-flight operations before the socket is closed.
    Closing,
}

/// Memory handed to the kernel for one connection; boxed so it never moves.
struct ConnIo {
    iov: [libc::iovec; MAX_IOV],
    msg: libc::msghdr,
    addr: libc::sockaddr_storage,
    addr_len: libc::socklen_t,
}

struct Conn {
    fd: Option<OwnedFd>,
    proto: Connection,
    io: Box<ConnIo>,
    phase: Phase,
    /// Bumped each time the slot's connection is replaced (reconnect), for timers.
    generation: u32,
    reading: bool,
    writing: bool,
    connecting: bool,
    /// Bytes handed to the send in flight.
    sending: u64,
    /// `Some` for connections this loop opened: the peer and lane they serve.
    outgoing: Option<(SocketAddr, u32)>,
    attempts: u32,
    /// Requests waiting for the handshake (context handles).
    waiting: VecDeque<u64>,
    dirty: bool,
    /// Set when the connection is being closed for an error; what in-flight requests get.
    failure: Error,
}

impl Conn {
    fn fd(&self) -> RawFd {
        self.fd.as_ref().map_or(-1, |f| f.as_raw_fd())
    }

    fn ops_in_flight(&self) -> bool {
        self.reading || self.writing || self.connecting
    }
}

/// The per-thread event loop.
pub(crate) struct Loop {
    cfg: Arc<Config>,
    shared: Arc<LoopShared>,
    driver: Driver,
    identity: Identity,
    listener: Option<OwnedFd>,
    accepting: bool,
    conns: Slab<Conn>,
    peers: HashMap<(SocketAddr, u32), u32>,
    ctxs: CtxSlab<Pending>,
    timers: BinaryHeap<Reverse<(Instant, Timer)>>,
    outbox: Outbox,
    dirty: Vec<u32>,
    scratch: Vec<u64>,
    io_events: Vec<IoCompletion>,
    stopping: bool,
    zeros: Vec<u8>,
    /// Source of connection generations: unique per connection and per connect attempt,
    /// so a timer never acts on a later connection that reuses its slot.
    serial: u32,
}

impl Loop {
    /// A loop on `backend`, listening on `listener` if given. Call on the loop's thread,
    /// after pinning: this allocates the loop's state.
    pub(crate) fn new(
        cfg: Arc<Config>,
        shared: Arc<LoopShared>,
        backend: Backend,
        listener: Option<OwnedFd>,
    ) -> std::io::Result<Loop> {
        let entries = 1024u32;
        let driver = Driver::new(backend, entries, &shared.doorbell)?;
        let mut job = arrayvec::ArrayVec::new();
        job.try_extend_from_slice(cfg.job.as_bytes()).ok();
        let token = cfg.cluster_token.as_ref().map(|t| {
            let mut v = arrayvec::ArrayVec::new();
            v.try_extend_from_slice(t).ok();
            v
        });
        let identity = Identity {
            cluster_id: cfg.cluster_id,
            job,
            task_index: cfg.task_index,
            token,
        };
        let mut lp = Loop {
            ctxs: CtxSlab::with_capacity(cfg.max_inflight),
            timers: BinaryHeap::with_capacity(cfg.max_inflight.min(1 << 16)),
            cfg,
            shared,
            driver,
            identity,
            listener,
            accepting: false,
            conns: Slab::with_capacity(64),
            peers: HashMap::new(),
            outbox: Outbox::default(),
            dirty: Vec::with_capacity(64),
            scratch: Vec::new(),
            io_events: Vec::with_capacity(1024),
            stopping: false,
            zeros: Vec::new(),
            serial: 0,
        };
        if let Some(l) = &lp.listener {
            let fd = l.as_raw_fd();
            lp.driver.register(LISTENER, fd)?;
            lp.driver.accept(LISTENER, fd)?;
            lp.accepting = true;
        }
        Ok(lp)
    }

    fn next_serial(&mut self) -> u32 {
        self.serial = self.serial.wrapping_add(1);
        self.serial
    }

    pub(crate) fn backend(&self) -> Backend {
        self.driver.backend()
    }

    /// Runs until the runtime asks to stop and every operation has drained.
    pub(crate) fn run(&mut self) {
        let mut idle_since: Option<Instant> = None;
        let mut last = Instant::now();
        loop {
            let progress = self.turn();
            let now = Instant::now();
            let spent = now.saturating_duration_since(last).as_nanos() as u64;
            last = now;
            if progress {
                add(&self.shared.counters.busy_ns, spent);
                idle_since = None;
                continue;
            }
            if self.stopping && self.finished() {
                return;
            }
            add(&self.shared.counters.spin_ns, spent);
            if self.cfg.polling && !self.stopping {
                core::hint::spin_loop();
                continue;
            }
            let since = *idle_since.get_or_insert(now);
            if now.saturating_duration_since(since) < self.cfg.spin {
                core::hint::spin_loop();
                continue;
            }
            self.park(now);
            let woke = Instant::now();
            add(
                &self.shared.counters.parked_ns,
                woke.saturating_duration_since(now).as_nanos() as u64,
            );
            add(&self.shared.counters.parks, 1);
            last = woke;
            idle_since = None;
        }
    }

    /// Parks in the kernel until I/O, the next timer, or the doorbell.
    fn park(&mut self, now: Instant) {
        self.shared.parked.store(true, Ordering::SeqCst);
        // Re-check after announcing: a producer that pushed before seeing the flag is seen
        // here; one that pushed after will ring the doorbell.
        if self.work_queued() {
            self.shared.parked.store(false, Ordering::SeqCst);
            return;
        }
        let timeout = self
            .timers
            .peek()
            .map(|Reverse((at, _))| at.saturating_duration_since(now));
        self.io(true, timeout);
        self.shared.parked.store(false, Ordering::SeqCst);
    }

    fn work_queued(&self) -> bool {
        self.shared.stop.load(Ordering::SeqCst) && !self.stopping
            || self.shared.has_new_endpoints.load(Ordering::SeqCst)
            || self
                .outbox
                .endpoints
                .iter()
                .flatten()
                .any(|e| !e.requests.is_empty())
    }

    fn finished(&self) -> bool {
        self.conns.is_empty() && !self.accepting
    }

    /// One bounded iteration; returns whether anything happened.
    pub(crate) fn turn(&mut self) -> bool {
        let now = Instant::now();
        let mut progress = false;
        if !self.stopping && self.shared.stop.load(Ordering::Acquire) {
            self.begin_stop();
            progress = true;
        }
        progress |= self.take_endpoints();
        progress |= self.drain_requests(now);
        progress |= self.io(false, None);
        progress |= self.flush();
        progress |= self.fire_timers(now);
        progress
    }

    fn take_endpoints(&mut self) -> bool {
        if !self.shared.has_new_endpoints.load(Ordering::Acquire) {
            return false;
        }
        let mut new = match self.shared.new_endpoints.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        self.shared
            .has_new_endpoints
            .store(false, Ordering::Release);
        for ep in new.drain(..) {
            match self.outbox.endpoints.iter().position(Option::is_none) {
                Some(i) => {
                    self.outbox.endpoints[i] = Some(ep);
                    self.outbox.generations[i] = self.outbox.generations[i].wrapping_add(1);
                }
                None => {
                    self.outbox.endpoints.push(Some(ep));
                    self.outbox.generations.push(0);
                }
            }
        }
        true
    }

    fn drain_requests(&mut self, now: Instant) -> bool {
        let mut progress = false;
        for i in 0..self.outbox.endpoints.len() {
            let mut batch = 0;
            while batch < DRAIN_BATCH {
                let Some(ep) = self.outbox.endpoints[i].as_mut() else {
                    break;
                };
                let Some(req) = ep.requests.pop() else {
                    if ep.requests.is_closed() && ep.requests.is_empty() {
                        // The handle is gone; completions still owed to it are dropped.
                        self.outbox.endpoints[i] = None;
                    }
                    break;
                };
                batch += 1;
                let origin = Origin::Endpoint(i as u32, self.outbox.generations[i]);
                self.submit(req, origin, now);
            }
            progress |= batch > 0;
        }
        progress
    }

    /// Starts a request (from a ring, or directly in embedded mode).
    fn submit(&mut self, req: Request, origin: Origin, now: Instant) {
        if self.stopping {
            return self.deliver(origin, req.tag, req.op.kind(), Err(Error::Shutdown));
        }
        let slot = match self.peer_conn(req.peer, req.lane, now) {
            Ok(s) => s,
            Err(e) => return self.deliver(origin, req.tag, req.op.kind(), Err(e)),
        };
        let pending = Pending {
            tag: req.tag,
            origin,
            op: req.op,
            conn: slot,
            sent: None,
            abandoned: false,
        };
        let handle = match self.ctxs.insert(pending) {
            Ok(h) => h.to_raw(),
            Err(_) => {
                return self.deliver(origin, req.tag, req.op.kind(), Err(Error::Backpressure))
            }
        };
        if let Some(deadline) = req.deadline {
            self.push_deadline(deadline, handle);
        }
        let open = self.conns[slot as usize].phase == Phase::Open;
        if open {
            self.send_request(slot, handle, now);
        } else {
            self.conns[slot as usize].waiting.push_back(handle);
        }
    }

    /// Adds a request deadline. Entries of requests answered earlier stay in the heap until
    /// they come up; when they outnumber the live requests, they are swept out, so the heap
    /// stays within a small multiple of the in-flight requests (amortized O(1) per request).
    fn push_deadline(&mut self, deadline: Instant, handle: u64) {
        if self.timers.len() > 2 * self.ctxs.len() + 1024 {
            let ctxs = &self.ctxs;
            self.timers.retain(|Reverse((_, t))| match *t {
                Timer::Deadline(h) => ctxs.contains(CtxHandle::from_raw(h)),
                _ => true,
            });
        }
        self.timers
            .push(Reverse((deadline, Timer::Deadline(handle))));
    }

    /// Encodes request `handle` on connection `slot`.
    fn send_request(&mut self, slot: u32, handle: u64, now: Instant) {
        let Ok(p) = self.ctxs.get_mut(CtxHandle::from_raw(handle)) else {
            return;
        };
        if p.abandoned {
            self.ctxs.remove(CtxHandle::from_raw(handle)).ok();
            return;
        }
        p.sent = Some(now);
        let op = p.op;
        let conn = &mut self.conns[slot as usize];
        let result = match op {
            RequestOp::Ping { payload } => {
                let n = payload as usize;
                if self.zeros.len() < n {
                    self.zeros.resize(n, 0);
                }
                conn.proto.encoder().ping(handle, &self.zeros[..n])
            }
        };
        match result {
            Ok(()) => {
                add(&self.shared.counters.frames_out, 1);
                mark_dirty(&mut self.dirty, conn, slot);
            }
            Err(e) => {
                log::debug!("request not encodable: {e}");
                if let Ok(p) = self.ctxs.remove(CtxHandle::from_raw(handle)) {
                    self.deliver(p.origin, p.tag, p.op.kind(), Err(Error::InvalidArgument));
                }
            }
        }
    }

    /// The connection for `(peer, lane)`, opened on demand.
    fn peer_conn(&mut self, peer: SocketAddr, lane: u32, now: Instant) -> Result<u32, Error> {
        if let Some(&slot) = self.peers.get(&(peer, lane)) {
            return Ok(slot);
        }
        let proto = self.new_proto(Side::Client);
        let conn = Conn {
            fd: None,
            proto,
            io: new_conn_io(),
            phase: Phase::Backoff,
            generation: self.next_serial(),
            reading: false,
            writing: false,
            connecting: false,
            sending: 0,
            outgoing: Some((peer, lane)),
            attempts: 0,
            waiting: VecDeque::new(),
            dirty: false,
            failure: Error::ConnectionLost,
        };
        let slot = self.conns.insert(conn) as u32;
        self.peers.insert((peer, lane), slot);
        self.start_connect(slot, now);
        Ok(slot)
    }

    fn new_proto(&self, side: Side) -> Connection {
        let encoder = EncoderConfig {
            chunk_size: self.cfg.chunk_size,
            ..EncoderConfig::default()
        };
        Connection::new(
            side,
            self.identity.clone(),
            self.cfg.limits,
            self.cfg.recv_buffer,
            encoder,
        )
    }

    /// Opens a socket and starts connecting it; on an immediate failure, schedules a retry.
    fn start_connect(&mut self, slot: u32, now: Instant) {
        let conn = &mut self.conns[slot as usize];
        let Some((peer, _)) = conn.outgoing else {
            return;
        };
        let fd = match socket::tcp_socket(&peer) {
            Ok(fd) => fd,
            Err(e) => {
                log::warn!("socket for {peer}: {e}");
                return self.connect_failed(slot, now);
            }
        };
        socket::set_nodelay(&fd, true).ok();
        let raw = fd.as_raw_fd();
        if let Err(e) = self.driver.register(slot, raw) {
            log::warn!("register socket for {peer}: {e}");
            return self.connect_failed(slot, now);
        }
        let conn = &mut self.conns[slot as usize];
        conn.io.addr_len = write_sockaddr(&peer, &mut conn.io.addr);
        conn.fd = Some(fd);
        conn.phase = Phase::Connecting;
        conn.connecting = true;
        // One limit for connect and handshake together.
        let generation = conn.generation;
        let deadline = now + self.cfg.handshake_timeout;
        self.timers
            .push(Reverse((deadline, Timer::Handshake { slot, generation })));
        let conn = &mut self.conns[slot as usize];
        let addr: *const libc::sockaddr = (&conn.io.addr as *const libc::sockaddr_storage).cast();
        let len = conn.io.addr_len;
        // SAFETY: `addr` points into the connection's boxed `ConnIo`, which is dropped only
        // after this operation's completion has been reaped (two-phase close).
        if let Err(e) = unsafe { self.driver.connect(slot, raw, addr, len) } {
            log::warn!("connect to {peer}: {e}");
            self.conns[slot as usize].connecting = false;
            self.connect_failed(slot, now);
        }
    }

    /// A connect attempt failed: retry with backoff, or give up and fail what waits.
    fn connect_failed(&mut self, slot: u32, now: Instant) {
        let conn = &mut self.conns[slot as usize];
        if let Some(fd) = conn.fd.take() {
            self.driver.deregister(slot);
            drop(fd);
        }
        conn.attempts += 1;
        let peer = conn.outgoing.map(|(p, _)| p);
        if conn.attempts <= self.cfg.connect_retries && !self.stopping {
            let delay = self.cfg.connect_delay(conn.attempts);
            conn.phase = Phase::Backoff;
            self.serial = self.serial.wrapping_add(1);
            conn.generation = self.serial;
            let generation = conn.generation;
            add(&self.shared.counters.reconnects, 1);
            log::debug!(
                "connect to {peer:?} failed (attempt {}); retrying in {delay:?}",
                conn.attempts
            );
            self.timers.push(Reverse((
                now + delay,
                Timer::Reconnect { slot, generation },
            )));
        } else {
            log::warn!(
                "giving up on {peer:?} after {} connect attempts",
                conn.attempts
            );
            conn.failure = Error::ConnectFailed;
            self.finish_close(slot);
        }
    }

    /// Submits and reaps I/O, handling every completion.
    fn io(&mut self, wait: bool, timeout: Option<Duration>) -> bool {
        let mut events = std::mem::take(&mut self.io_events);
        let r = self.driver.complete(wait, timeout, |c| events.push(c));
        if let Err(e) = r {
            log::error!("event loop I/O wait failed: {e}");
        }
        let progress = !events.is_empty();
        let now = Instant::now();
        for c in events.drain(..) {
            match c {
                IoCompletion::Doorbell => {}
                IoCompletion::Op { slot, op, result } => self.on_io(slot, op, result, now),
            }
        }
        self.io_events = events;
        progress
    }

    fn on_io(&mut self, slot: u32, op: Op, result: i32, now: Instant) {
        if slot == LISTENER {
            return self.on_accept(result, now);
        }
        if !self.conns.contains(slot as usize) {
            log::error!("completion for unknown connection slot {slot}");
            return;
        }
        match op {
            Op::Connect => {
                let conn = &mut self.conns[slot as usize];
                conn.connecting = false;
                if conn.phase == Phase::Closing {
                    return self.maybe_finish(slot);
                }
                if result < 0 {
                    let peer = conn.outgoing.map(|(p, _)| p);
                    log::debug!("connect to {peer:?}: {}", errno_str(result));
                    return self.connect_failed(slot, now);
                }
                conn.phase = Phase::Handshaking;
                mark_dirty(&mut self.dirty, conn, slot);
                self.arm_recv(slot);
            }
            Op::Recv => {
                let conn = &mut self.conns[slot as usize];
                conn.reading = false;
                if conn.phase == Phase::Closing {
                    return self.maybe_finish(slot);
                }
                if result <= 0 {
                    let why = if result == 0 {
                        "peer closed the connection".to_string()
                    } else {
                        errno_str(result)
                    };
                    log::debug!("connection {slot}: {why}");
                    return self.lose(slot, Error::ConnectionLost);
                }
                add(&self.shared.counters.bytes_in, result as u64);
                conn.proto.decoder().filled(result as usize);
                self.process(slot, now);
                self.arm_recv(slot);
            }
            Op::Send => {
                let conn = &mut self.conns[slot as usize];
                conn.writing = false;
                if conn.phase == Phase::Closing {
                    return self.maybe_finish(slot);
                }
                if result < 0 {
                    log::debug!("connection {slot}: send: {}", errno_str(result));
                    return self.lose(slot, Error::ConnectionLost);
                }
                add(&self.shared.counters.bytes_out, result as u64);
                conn.proto.encoder().advance(result as u64);
                mark_dirty(&mut self.dirty, conn, slot);
            }
            Op::Accept => {}
        }
    }

    fn on_accept(&mut self, result: i32, now: Instant) {
        self.accepting = false;
        if self.stopping {
            return;
        }
        if result >= 0 {
            // SAFETY: a successful accept returns a new fd that nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(result) };
            self.adopt(fd, now);
        } else if result != -libc::EAGAIN && result != -libc::EINTR {
            // EMFILE and friends: log and keep accepting; the connection stays in the
            // backlog until a descriptor is free.
            log::warn!("accept: {}", errno_str(result));
        }
        if let Some(l) = &self.listener {
            let fd = l.as_raw_fd();
            match self.driver.accept(LISTENER, fd) {
                Ok(()) => self.accepting = true,
                Err(e) => log::error!("accept: {e}"),
            }
        }
    }

    /// Takes an accepted socket as a server-side connection.
    fn adopt(&mut self, fd: OwnedFd, now: Instant) {
        socket::set_nodelay(&fd, true).ok();
        let proto = self.new_proto(Side::Server);
        let raw = fd.as_raw_fd();
        let generation = self.next_serial();
        let slot = self.conns.insert(Conn {
            fd: Some(fd),
            proto,
            io: new_conn_io(),
            phase: Phase::Handshaking,
            generation,
            reading: false,
            writing: false,
            connecting: false,
            sending: 0,
            outgoing: None,
            attempts: 0,
            waiting: VecDeque::new(),
            dirty: false,
            failure: Error::ConnectionLost,
        }) as u32;
        if let Err(e) = self.driver.register(slot, raw) {
            log::warn!("register accepted socket: {e}");
            self.conns.remove(slot as usize);
            return;
        }
        add(&self.shared.counters.connections_accepted, 1);
        let deadline = now + self.cfg.handshake_timeout;
        let generation = self.conns[slot as usize].generation;
        self.timers
            .push(Reverse((deadline, Timer::Handshake { slot, generation })));
        self.arm_recv(slot);
    }

    /// Starts a receive into the connection's buffer if none is in flight.
    fn arm_recv(&mut self, slot: u32) {
        let conn = &mut self.conns[slot as usize];
        if conn.reading
            || conn.phase == Phase::Closing
            || conn.fd.is_none()
            || conn.proto.is_closed()
        {
            return;
        }
        let fd = conn.fd();
        let spare = conn.proto.decoder().spare();
        if spare.is_empty() {
            // Buffered bytes must be decoded first; `process` runs before every re-arm, so
            // this means the decoder is stuck on a frame it cannot finish.
            log::error!("connection {slot}: receive buffer full; closing");
            return self.lose(slot, Error::Protocol);
        }
        let len = spare.len().min(u32::MAX as usize) as u32;
        let ptr = spare.as_mut_ptr();
        conn.reading = true;
        // SAFETY: `ptr..ptr+len` is the spare room of the connection's receive buffer. The
        // decoder neither moves nor touches it until `filled` after this completion, and
        // the connection is dropped only once the completion has been reaped.
        if let Err(e) = unsafe { self.driver.recv(slot, fd, ptr, len) } {
            log::warn!("connection {slot}: recv: {e}");
            self.conns[slot as usize].reading = false;
            self.lose(slot, Error::ConnectionLost);
        }
    }

    /// Decodes what connection `slot` has received and acts on it.
    fn process(&mut self, slot: u32, now: Instant) {
        let Loop {
            conns,
            ctxs,
            outbox,
            shared,
            dirty,
            ..
        } = self;
        let conn = &mut conns[slot as usize];
        let mut opened = false;
        let mut violation = None;
        conn.proto.process(|ev, _encoder| match ev {
            ConnEvent::Opened => opened = true,
            ConnEvent::Frame(f) => {
                add(&shared.counters.frames_in, 1);
                match f.header.kind {
                    Kind::Pong | Kind::Error => {
                        let h = CtxHandle::from_raw(f.header.handle);
                        let result = match f.body {
                            Body::Error(_) => Err(Error::Remote(f.header.status)),
                            _ => Ok(()),
                        };
                        match ctxs.get(h) {
                            Ok(p) if p.conn == slot && matches!(p.op, RequestOp::Ping { .. }) => {
                                let p = ctxs.remove(h).expect("looked up above");
                                if !p.abandoned {
                                    let rtt = p.sent.map_or(Duration::ZERO, |s| now - s);
                                    let reply = result.map(|()| Reply::Pong {
                                        rtt,
                                        payload: f.header.payload_len,
                                    });
                                    deliver(outbox, shared, p.origin, p.tag, p.op.kind(), reply);
                                }
                            }
                            _ => violation = Some("answer with an unknown or stale handle"),
                        }
                    }
                    _ => {
                        // Requests other than ping are served by the transport layer; a
                        // peer that sends one to a loop without a service gets an error.
                        if f.header.kind.is_request() {
                            let _ = _encoder.error(
                                f.header.handle,
                                Status::Unimplemented,
                                "no service for this request kind",
                            );
                        }
                    }
                }
            }
            ConnEvent::Payload { .. } | ConnEvent::FrameEnd(_) => {}
        });
        if let Some(why) = violation {
            log::warn!("connection {slot}: {why}; closing");
            conn.proto.abort(Status::Protocol, why);
        }
        mark_dirty(dirty, conn, slot);
        if opened {
            conn.phase = Phase::Open;
            if conn.outgoing.is_some() {
                add(&shared.counters.connections_opened, 1);
                conn.attempts = 0;
                while let Some(h) = self.conns[slot as usize].waiting.pop_front() {
                    self.send_request(slot, h, now);
                }
            }
        }
        let conn = &mut self.conns[slot as usize];
        if conn.proto.is_closed() {
            let failure = match conn.proto.close_reason() {
                Some(crate::proto::CloseReason::Refused { status, .. }) => Error::Refused(*status),
                Some(crate::proto::CloseReason::Rejected { status, .. })
                    if conn.outgoing.is_some() =>
                {
                    Error::Refused(*status)
                }
                _ => Error::Protocol,
            };
            conn.failure = failure;
            // Let the queued ERROR frame go out before closing, but not for long: a peer
            // that does not read must not keep the connection.
            mark_dirty(&mut self.dirty, conn, slot);
            let generation = conn.generation;
            self.timers.push(Reverse((
                now + CLOSE_LINGER,
                Timer::Close { slot, generation },
            )));
        }
    }

    /// Starts writes on connections with queued output.
    fn flush(&mut self) -> bool {
        let mut progress = false;
        let mut i = 0;
        while i < self.dirty.len() {
            let slot = self.dirty[i];
            i += 1;
            if !self.conns.contains(slot as usize) {
                continue;
            }
            let conn = &mut self.conns[slot as usize];
            conn.dirty = false;
            if conn.writing || conn.fd.is_none() || conn.connecting {
                continue;
            }
            if !matches!(conn.phase, Phase::Open | Phase::Handshaking) {
                continue;
            }
            let acc = self.cfg.acc_size as u64;
            let enc = conn.proto.encoder();
            enc.fill(acc);
            if enc.ready_bytes() == 0 {
                if conn.proto.is_closed() {
                    // Nothing more to say: close.
                    let failure = conn.failure;
                    self.lose(slot, failure);
                }
                continue;
            }
            let mut n = 0usize;
            let mut total = 0u64;
            let mut bad = false;
            let fd = conn.fd();
            let io = &mut *conn.io;
            for piece in conn.proto.encoder().pieces() {
                if n == MAX_IOV || total >= acc {
                    break;
                }
                let (ptr, len) = match piece {
                    Piece::Bytes(b) => (b.as_ptr(), b.len()),
                    Piece::Tensor { .. } => {
                        bad = true;
                        break;
                    }
                };
                io.iov[n] = libc::iovec {
                    iov_base: ptr as *mut libc::c_void,
                    iov_len: len,
                };
                n += 1;
                total += len as u64;
            }
            if bad {
                log::error!("connection {slot}: tensor output without a tensor store");
                self.lose(slot, Error::Protocol);
                continue;
            }
            io.msg = empty_msghdr();
            io.msg.msg_iov = io.iov.as_mut_ptr();
            io.msg.msg_iovlen = n as _;
            conn.writing = true;
            conn.sending = total;
            let msg: *const libc::msghdr = &io.msg;
            // SAFETY: the msghdr and iovecs live in the connection's boxed `ConnIo`; the
            // iovecs point into the encoder's arena blocks, which do not move or get reused
            // before `advance` (after this completion). The connection is dropped only once
            // the completion has been reaped.
            if let Err(e) = unsafe { self.driver.send(slot, fd, msg) } {
                log::warn!("connection {slot}: send: {e}");
                self.conns[slot as usize].writing = false;
                self.lose(slot, Error::ConnectionLost);
            }
            progress = true;
        }
        self.dirty.clear();
        progress
    }

    fn fire_timers(&mut self, now: Instant) -> bool {
        let mut progress = false;
        while let Some(Reverse((at, _))) = self.timers.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((_, timer))) = self.timers.pop() else {
                break;
            };
            progress = true;
            match timer {
                Timer::Deadline(h) => {
                    let h = CtxHandle::from_raw(h);
                    if let Ok(p) = self.ctxs.get_mut(h) {
                        if !p.abandoned {
                            p.abandoned = true;
                            let (origin, tag, kind) = (p.origin, p.tag, p.op.kind());
                            // Not yet sent: nothing can answer it, free the slot now.
                            if p.sent.is_none() {
                                self.ctxs.remove(h).ok();
                            }
                            self.deliver(origin, tag, kind, Err(Error::Timeout));
                        }
                    }
                }
                Timer::Reconnect { slot, generation } => {
                    let live = self
                        .conns
                        .get(slot as usize)
                        .is_some_and(|c| c.generation == generation && c.phase == Phase::Backoff);
                    if live {
                        self.start_connect(slot, now);
                    }
                }
                Timer::Close { slot, generation } => {
                    let lingering = self
                        .conns
                        .get(slot as usize)
                        .is_some_and(|c| c.generation == generation && c.phase != Phase::Closing);
                    if lingering {
                        let failure = self.conns[slot as usize].failure;
                        self.lose(slot, failure);
                    }
                }
                Timer::Handshake { slot, generation } => {
                    let stuck = self.conns.get(slot as usize).is_some_and(|c| {
                        c.generation == generation
                            && matches!(c.phase, Phase::Handshaking | Phase::Connecting)
                    });
                    if stuck {
                        log::warn!("connection {slot}: handshake timed out");
                        self.lose(slot, Error::ConnectionLost);
                    }
                }
            }
        }
        progress
    }

    fn deliver(
        &mut self,
        origin: Origin,
        tag: u64,
        kind: RequestKind,
        result: Result<Reply, Error>,
    ) {
        deliver(&mut self.outbox, &self.shared, origin, tag, kind, result);
    }

    /// Closes connection `slot` for `why`: fails its requests now, and drops it once its
    /// operations have completed.
    fn lose(&mut self, slot: u32, why: Error) {
        let Some(conn) = self.conns.get_mut(slot as usize) else {
            return;
        };
        if conn.phase == Phase::Closing {
            return;
        }
        add(&self.shared.counters.connections_lost, 1);
        // A reason the protocol found (a refusal, a violation) outranks what the socket
        // said afterwards (usually the peer closing it).
        if !conn.proto.is_closed() {
            conn.failure = why;
        }
        if let Some(key) = conn.outgoing {
            // Later requests to this peer open a new connection.
            if self.peers.get(&key) == Some(&slot) {
                self.peers.remove(&key);
            }
        }
        self.finish_close(slot);
    }

    /// Fails everything on the connection and shuts its socket; the slot is freed when no
    /// operation is left in flight.
    fn finish_close(&mut self, slot: u32) {
        let conn = &mut self.conns[slot as usize];
        conn.phase = Phase::Closing;
        let why = conn.failure;
        if let Some((peer, lane)) = conn.outgoing {
            if self.peers.get(&(peer, lane)) == Some(&slot) {
                self.peers.remove(&(peer, lane));
            }
        }
        // Requests waiting for this connection, and requests in flight on it.
        let mut failed = std::mem::take(&mut self.scratch);
        failed.extend(conn.waiting.drain(..));
        for (h, p) in self.ctxs.iter() {
            if p.conn == slot && p.sent.is_some() {
                failed.push(h.to_raw());
            }
        }
        for h in failed.drain(..) {
            if let Ok(p) = self.ctxs.remove(CtxHandle::from_raw(h)) {
                if !p.abandoned {
                    self.deliver(p.origin, p.tag, p.op.kind(), Err(why));
                }
            }
        }
        self.scratch = failed;
        let conn = &mut self.conns[slot as usize];
        let fd = conn.fd();
        if fd >= 0 && conn.ops_in_flight() {
            self.driver.shutdown(slot, fd);
        }
        self.maybe_finish(slot);
    }

    /// Drops a closing connection once nothing is in flight on it.
    fn maybe_finish(&mut self, slot: u32) {
        let conn = &self.conns[slot as usize];
        if conn.phase != Phase::Closing || conn.ops_in_flight() {
            return;
        }
        if conn.fd.is_some() {
            self.driver.deregister(slot);
        }
        self.conns.remove(slot as usize);
    }

    fn begin_stop(&mut self) {
        self.stopping = true;
        // Requests still in the rings fail with Shutdown.
        let now = Instant::now();
        for i in 0..self.outbox.endpoints.len() {
            let origin = Origin::Endpoint(i as u32, self.outbox.generations[i]);
            while let Some(req) = self.outbox.endpoints[i]
                .as_mut()
                .and_then(|e| e.requests.pop())
            {
                self.submit(req, origin, now);
            }
        }
        let slots: Vec<u32> = self.conns.iter().map(|(s, _)| s as u32).collect();
        for slot in slots {
            let conn = &mut self.conns[slot as usize];
            conn.proto.abort(Status::Shutdown, "shutting down");
            conn.failure = Error::Shutdown;
            self.lose(slot, Error::Shutdown);
        }
        if let Some(l) = &self.listener {
            if self.accepting {
                self.driver.shutdown(LISTENER, l.as_raw_fd());
            }
        }
    }

    // ----- embedded mode -----

    /// Submits a request from the embedding thread.
    pub(crate) fn submit_local(&mut self, req: Request) {
        self.submit(req, Origin::Local, Instant::now());
    }

    /// Completions for the embedding thread.
    pub(crate) fn take_local(&mut self) -> Option<Completion> {
        self.outbox.local.pop_front()
    }

    /// Runs iterations until one makes no progress, or parks for up to `timeout` when the
    /// first makes none.
    pub(crate) fn poll_local(&mut self, timeout: Option<Duration>) -> bool {
        let mut progress = false;
        while self.turn() {
            progress = true;
        }
        if !progress && timeout != Some(Duration::ZERO) {
            let now = Instant::now();
            let next = self
                .timers
                .peek()
                .map(|Reverse((at, _))| at.saturating_duration_since(now));
            let t = match (timeout, next) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            progress |= self.io(true, t);
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
                self.io(true, Some(Duration::from_millis(10)));
            }
        }
    }

    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        self.listener
            .as_ref()
            .and_then(|l| socket::local_addr(l).ok())
    }
}

/// Where completions go: the handles' rings (or callbacks) and the embedding thread.
#[derive(Default)]
struct Outbox {
    endpoints: Vec<Option<Endpoint>>,
    /// Generation of each `endpoints` entry, bumped when the entry is reused.
    generations: Vec<u32>,
    local: VecDeque<Completion>,
}

fn deliver(
    outbox: &mut Outbox,
    shared: &LoopShared,
    origin: Origin,
    tag: u64,
    kind: RequestKind,
    result: Result<Reply, Error>,
) {
    let counter = if result.is_ok() {
        &shared.counters.completed[kind as usize]
    } else {
        &shared.counters.failed[kind as usize]
    };
    add(counter, 1);
    let completion = Completion { tag, result };
    match origin {
        Origin::Local => outbox.local.push_back(completion),
        Origin::Endpoint(i, generation) => {
            if outbox.generations.get(i as usize) != Some(&generation) {
                return;
            }
            let Some(Some(ep)) = outbox.endpoints.get_mut(i as usize) else {
                return;
            };
            if let Some(cb) = &ep.callback {
                cb(completion);
            } else if ep.completions.push(completion).is_err() {
                // The handle bounds its outstanding requests by the ring's capacity, so
                // this cannot happen while the handle lives.
                log::error!("completion ring full; completion {tag} dropped");
            }
            ep.waker.wake();
        }
    }
}

fn mark_dirty(dirty: &mut Vec<u32>, conn: &mut Conn, slot: u32) {
    if !conn.dirty {
        conn.dirty = true;
        dirty.push(slot);
    }
}

fn new_conn_io() -> Box<ConnIo> {
    Box::new(ConnIo {
        iov: [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; MAX_IOV],
        msg: empty_msghdr(),
        // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
        addr: unsafe { std::mem::zeroed() },
        addr_len: 0,
    })
}

fn empty_msghdr() -> libc::msghdr {
    // SAFETY: msghdr is plain old data; all-zero (null pointers, zero lengths) is valid.
    unsafe { std::mem::zeroed() }
}

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

fn errno_str(result: i32) -> String {
    std::io::Error::from_raw_os_error(-result).to_string()
}
