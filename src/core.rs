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
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use nix::libc;
use slab::Slab;

use crate::config::Config;
use crate::ctx::{CtxSlab, Full, Handle as CtxHandle};
use crate::error::Error;
use crate::pool::PushScratch;
use crate::pool::{Answer, Job, ReplyTo};
use crate::proto::{
    ConnEvent, Connection, Encoder, EncoderConfig, Identity, NextRead, PayloadTarget, Piece,
    PushItem, ResponseItem, Side,
};
use crate::rendezvous::{Delivery, Rendezvous, Waiter};
use crate::service::SharedService;
use crate::spsc::{Consumer, Producer, ThreadWaker};
use crate::stats::{add, Counters, RequestKind};
use crate::sys::bufpool::BufPool;
use crate::sys::doorbell::Doorbell;
use crate::sys::driver::{Completion as IoCompletion, Driver, Op, LISTENER};
use crate::sys::{socket, Backend};
use crate::tensor::{SharedAllocator, Tensor};
use crate::transport::{IncomingPush, PushVecs, ReplyState, Spare};
use crate::wire::{Body, Kind, Status};

/// Most iovecs in one send.
const MAX_IOV: usize = 64;
/// Requests a peer may have waiting on one connection (recvs for unpublished keys, pushes
/// still arriving); more are refused with `RESOURCE_EXHAUSTED`.
const MAX_SERVED: usize = 4096;
/// Requests given up by deadline whose late answers are recognised and ignored.
const ABANDONED_KEPT: usize = 4096;
/// Wait before accepting again after EMFILE and friends.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Header and meta of a `CHUNK` frame.
const CHUNK_HEAD: usize = crate::wire::HEADER_LEN + 16;
/// How long a connection closing for an error may take to send its last frame.
const CLOSE_LINGER: Duration = Duration::from_secs(1);
/// Most requests taken from one handle's ring per iteration (bounded work per step).
const DRAIN_BATCH: usize = 256;

/// What a request asks for.
pub(crate) enum RequestOp {
    /// A ping with this many payload bytes.
    Ping { payload: u32 },
    /// Values of variables; received tensors get memory from `alloc` (or the runtime's).
    Pull {
        ids: Vec<u64>,
        alloc: Option<SharedAllocator>,
    },
    /// Tensors for variables.
    Push { items: Vec<(u64, Arc<Tensor>)> },
    /// Rendezvous keys of a step (one key: `RECV`; more: `FUSED_RECV`).
    Recv { step: u64, keys: Vec<Vec<u8>> },
}

impl RequestOp {
    fn kind(&self) -> RequestKind {
        match self {
            RequestOp::Ping { .. } => RequestKind::Ping,
            RequestOp::Pull { .. } => RequestKind::Pull,
            RequestOp::Push { .. } => RequestKind::Push,
            RequestOp::Recv { keys, .. } if keys.len() == 1 => RequestKind::Recv,
            RequestOp::Recv { .. } => RequestKind::FusedRecv,
        }
    }

    /// The state its answer is assembled in, in `spare`'s vectors.
    fn reply_state(&self, spare: &mut Spare) -> ReplyState {
        match self {
            RequestOp::Ping { .. } => ReplyState::Ping,
            RequestOp::Pull { ids, .. } => ReplyState::pull(ids.len(), false, spare),
            RequestOp::Push { items } => ReplyState::push(items.len(), spare),
            RequestOp::Recv { keys, .. } => ReplyState::pull(keys.len(), true, spare),
        }
    }
}

/// A request travelling from a handle to the loop that owns the peer's connection.
pub(crate) struct Request {
    pub op: RequestOp,
    pub peer: SocketAddr,
    /// Which of the peer's connections (0..connections_per_peer) carries it.
    pub lane: u32,
    pub deadline: Option<Instant>,
    /// The submitter's name for the request, echoed in its completion.
    pub tag: u64,
    /// Vectors for the answer, returned with the completion.
    pub spare: Spare,
}

/// The answer to a request.
#[derive(Debug, PartialEq)]
#[non_exhaustive]
pub enum Reply {
    /// A pull's answer: per id, its tensor or why there is none.
    Pulled(Vec<Result<Tensor, Status>>),
    /// A push's answer: per item, how the service took it.
    Pushed(Vec<Status>),
    /// A recv's answer: per key, its tensor (possibly dead) or why there is none.
    Received(Vec<Result<Tensor, Status>>),
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
#[derive(Debug, PartialEq)]
pub struct Completion {
    /// The tag given when the request was submitted.
    pub tag: u64,
    /// The answer, or why there is none.
    pub result: Result<Reply, Error>,
    /// Vectors the request used, for the submitter's next requests.
    pub(crate) spare: Spare,
}

impl Completion {
    pub(crate) fn new(tag: u64, result: Result<Reply, Error>) -> Completion {
        Completion {
            tag,
            result,
            spare: Spare::default(),
        }
    }

    /// Every vector this completion holds, emptied, for reuse by later requests.
    pub(crate) fn into_spare(self) -> Spare {
        let mut spare = self.spare;
        if let Ok(reply) = self.result {
            spare.reclaim(reply);
        }
        spare
    }
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

/// Work other threads hand to a loop.
pub(crate) enum Posted {
    Recv(Delivery),
    Answer(Answer),
}

/// State a loop shares with the runtime and the handles.
pub(crate) struct LoopShared {
    pub doorbell: Doorbell,
    /// Set by the loop just before it parks; a producer that swaps it to false rings.
    pub parked: CachePadded<AtomicBool>,
    pub stop: AtomicBool,
    pub new_endpoints: Mutex<Vec<Endpoint>>,
    pub has_new_endpoints: AtomicBool,
    /// Rendezvous tensors for recvs waiting on this loop's connections, and answers of
    /// handlers run on the pool.
    deliveries: Mutex<Vec<Posted>>,
    has_deliveries: AtomicBool,
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
            deliveries: Mutex::new(Vec::new()),
            has_deliveries: AtomicBool::new(false),
            counters: CachePadded::new(Counters::default()),
        })
    }

    /// Hands a rendezvous delivery to this loop.
    pub(crate) fn post(&self, d: Delivery) {
        self.post_any(Posted::Recv(d));
    }

    /// Hands a pool handler's answer to this loop.
    pub(crate) fn post_answer(&self, a: Answer) {
        self.post_any(Posted::Answer(a));
    }

    fn post_any(&self, p: Posted) {
        self.deliveries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(p);
        self.has_deliveries.store(true, Ordering::Release);
        self.wake();
    }

    /// Wakes the loop if it is parked: once per parked period, not once per message.
    ///
    /// Called after publishing a request. The producer stores the ring's tail and then
    /// loads `parked`; the loop stores `parked` and then loads the tail. Each side puts a
    /// SeqCst fence between its store and its load, so at least one sees the other's
    /// store: either the loop finds the request before it parks, or the producer finds
    /// the loop parked and rings. Without the fences both loads could miss (store-load
    /// reordering) and the request would sit until the next timer.
    pub(crate) fn wake(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.parked.load(Ordering::Relaxed) && self.parked.swap(false, Ordering::SeqCst) {
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
struct Pending {
    tag: u64,
    origin: Origin,
    kind: RequestKind,
    /// What to send; taken when the request is encoded.
    op: Option<RequestOp>,
    /// The answer so far.
    state: ReplyState,
    /// Memory for received tensors, when the request brings its own.
    alloc: Option<SharedAllocator>,
    conn: u32,
    /// When the request was queued on the connection.
    sent: Option<Instant>,
    /// For recvs fused by the loop: the original requests, one per key, in key order.
    fused: Vec<Member>,
    /// The submitter's vectors, returned with the completion.
    spare: Spare,
}

/// One of the recvs the loop fused into a request; each keeps its own deadline.
#[derive(Debug, Clone, Copy)]
struct Member {
    origin: Origin,
    tag: u64,
    deadline: Option<Instant>,
    /// Already completed (its deadline passed).
    done: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    Deadline(u64),
    /// The deadline of one recv fused into the request `handle`.
    Member {
        handle: u64,
        index: u32,
    },
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
    /// Accepting again after running out of descriptors or memory.
    Accept,
    /// A connection's frame head (header and meta section) in progress must be complete
    /// `frame_timeout` after it started; at most one such timer per connection is pending.
    FrameHead {
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
    /// `Some` for connections this loop opened: the peer and lane they serve.
    outgoing: Option<(SocketAddr, u32)>,
    attempts: u32,
    /// Requests waiting for the handshake (context handles).
    waiting: VecDeque<u64>,
    dirty: bool,
    /// Set when the connection is being closed for an error; what in-flight requests get.
    failure: Error,
    /// Tensors whose bytes the encoder references, by token, until written.
    out_tensors: Slab<Arc<Tensor>>,
    /// Handle of the last frame decoded: payload of inline tensors belongs to it.
    cur_handle: u64,
    /// Whether the last frame decoded is a `PUSH` (the peer's request) rather than a
    /// `RESPONSE` (an answer to ours): the peer's handles and ours are separate namespaces.
    cur_is_push: bool,
    /// The last `CHUNK` decoded: handle, item index, and where its bytes end.
    cur_chunk: (u64, u32, u64),
    /// Chunked tensors declared and not complete, in the decoder's order: whether each was
    /// declared by a `PUSH`, and its length.
    chunk_owners: VecDeque<(bool, u64)>,
    /// Pushes being received (server side).
    incoming: Vec<IncomingPush>,
    /// Recvs being answered (server side): handle and items still owed.
    recvs: Vec<(u64, u32)>,
    /// The receive in flight reads straight into a tensor, not into the buffer.
    direct: bool,
    /// Index of the pool buffer the decoder receives into, if it has one.
    pool_buf: Option<u16>,
    /// When the frame head being received (partly) started to arrive.
    head_since: Option<Instant>,
    /// Whether a `FrameHead` timer is pending for this connection.
    head_timer: bool,
    /// Whether this is an accepted connection counted against `max_connections`.
    counted: bool,
}

impl Conn {
    fn new(fd: Option<OwnedFd>, proto: Connection, phase: Phase, generation: u32) -> Conn {
        Conn {
            fd,
            proto,
            io: new_conn_io(),
            phase,
            generation,
            reading: false,
            writing: false,
            connecting: false,
            outgoing: None,
            attempts: 0,
            waiting: VecDeque::new(),
            dirty: false,
            failure: Error::ConnectionLost,
            out_tensors: Slab::new(),
            cur_handle: 0,
            cur_is_push: false,
            cur_chunk: (0, 0, 0),
            chunk_owners: VecDeque::new(),
            incoming: Vec::new(),
            recvs: Vec::new(),
            direct: false,
            pool_buf: None,
            head_since: None,
            head_timer: false,
            counted: false,
        }
    }

    fn fd(&self) -> RawFd {
        self.fd.as_ref().map_or(-1, |f| f.as_raw_fd())
    }

    fn ops_in_flight(&self) -> bool {
        self.reading || self.writing || self.connecting
    }
}

/// What a loop serves and how it receives tensors.
#[derive(Clone)]
pub(crate) struct LoopParts {
    pub service: Option<SharedService>,
    pub rendezvous: Option<Arc<Rendezvous>>,
    /// Where heavy handlers run; `None`: inline on the loop.
    pub jobs: Option<std::sync::mpsc::SyncSender<Job>>,
    /// This loop's position among the runtime's loops.
    pub index: usize,
    pub allocator: SharedAllocator,
    pub zero_copy_min: u64,
    /// Connections accepted and not yet closed, over all the runtime's loops.
    pub accepted: Arc<AtomicUsize>,
}

/// The per-thread event loop.
pub(crate) struct Loop {
    cfg: Arc<Config>,
    shared: Arc<LoopShared>,
    /// Dropped by hand in `Drop`, or leaked when the kernel may still use loop memory.
    driver: std::mem::ManuallyDrop<Driver>,
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
    service: Option<SharedService>,
    rendezvous: Option<Arc<Rendezvous>>,
    jobs: Option<std::sync::mpsc::SyncSender<Job>>,
    index: usize,
    allocator: SharedAllocator,
    /// Payload at least this long is received straight into its tensor.
    zero_copy_min: u64,
    /// Accepted connections open, shared by the runtime's loops (`max_connections`).
    accepted: Arc<AtomicUsize>,
    /// Requests of the embedding thread, taken in the next drain pass.
    local_requests: VecDeque<Request>,
    /// Single-key recvs of the current drain pass, when tensor fusion is on.
    fuse_buf: Vec<(Request, Origin)>,
    /// Vectors the serving side reuses.
    serve: ServeScratch,
    /// Vectors for encoding pushes.
    push_scratch: PushEncodeScratch,
    /// Requests given up by deadline after they were sent: handle and connection.
    abandoned: VecDeque<(u64, u32)>,
    /// Spare vector swapped with the delivery queue, so neither is reallocated.
    posted: Vec<Posted>,
    /// Receive buffers lent to connections, registered with io_uring when possible.
    bufs: BufPool,
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
        let driver = std::mem::ManuallyDrop::new(Driver::new(backend, entries, &shared.doorbell)?);
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
            service: parts.service,
            rendezvous: parts.rendezvous,
            jobs: parts.jobs,
            index: parts.index,
            allocator: parts.allocator,
            zero_copy_min: parts.zero_copy_min,
            accepted: parts.accepted,
            local_requests: VecDeque::new(),
            fuse_buf: Vec::new(),
            serve: ServeScratch::default(),
            push_scratch: PushEncodeScratch::default(),
            abandoned: VecDeque::new(),
            posted: Vec::new(),
            bufs: BufPool::new(0, 1),
        };
        lp.start_buf_pool();
        if let Some(l) = &lp.listener {
            let fd = l.as_raw_fd();
            lp.driver.register(LISTENER, fd)?;
            lp.driver.accept(LISTENER, fd)?;
            lp.accepting = true;
        }
        Ok(lp)
    }

    /// Allocates the receive-buffer pool and registers it with io_uring. A registration
    /// the kernel refuses (usually `RLIMIT_MEMLOCK`) is logged once per loop with the
    /// numbers, and the pool is used unregistered.
    fn start_buf_pool(&mut self) {
        self.bufs = BufPool::new(self.cfg.buf_size, self.cfg.recv_buffer);
        if self.cfg.buf_size > 0 && self.bufs.count() == 0 {
            log::warn!(
                "{}={} is less than one receive buffer ({} bytes): no buffer pool",
                crate::config::ENV_BUF_SIZE,
                self.cfg.buf_size,
                self.cfg.recv_buffer
            );
        }
        if self.bufs.count() == 0 {
            return;
        }
        let counters = &self.shared.counters;
        add(&counters.buf_pool_bytes, self.bufs.bytes());
        let iov = self.bufs.iovecs();
        // SAFETY: the pool's buffers are allocated once and never freed before the loop is
        // dropped, after its driver (whose ring holds the registration); a buffer lent to a
        // connection comes back at the same address (`BufPool::give_back` retires any
        // other), and when the loop leaks its connections it leaks the pool too.
        match unsafe { self.driver.register_buffers(&iov) } {
            Ok(registered) => {
                self.bufs.set_registered(registered);
                if registered {
                    add(&counters.buf_registered_bytes, self.bufs.bytes());
                    log::debug!(
                        "registered {} receive buffers ({} bytes) as io_uring fixed buffers",
                        self.bufs.count(),
                        self.bufs.bytes()
                    );
                }
            }
            Err(e) => log::warn!("{e}; using the receive buffers unregistered"),
        }
    }

    /// Gives connection `slot`'s decoder a pool buffer, if one is free.
    fn lend_buffer(&mut self, slot: u32) {
        let Some((index, buf)) = self.bufs.lend() else {
            return;
        };
        let conn = &mut self.conns[slot as usize];
        // Replaced before any byte arrived: nothing buffered is lost.
        drop(conn.proto.decoder().swap_buffer(buf));
        conn.pool_buf = Some(index);
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
        // Pairs with the fence in `LoopShared::wake`: a producer that published before it
        // could see the flag is seen by this re-check; one that publishes after rings.
        std::sync::atomic::fence(Ordering::SeqCst);
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
            || self.shared.has_deliveries.load(Ordering::SeqCst)
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
        progress |= self.take_deliveries();
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

    /// Answers recvs whose keys were published by other threads.
    fn take_deliveries(&mut self) -> bool {
        if !self.shared.has_deliveries.load(Ordering::Acquire) {
            return false;
        }
        // Swap the queue with the loop's spare vector: both keep their capacity, so steady
        // delivery allocates nothing.
        let mut batch = std::mem::take(&mut self.posted);
        {
            let mut q = self
                .shared
                .deliveries
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            self.shared.has_deliveries.store(false, Ordering::Release);
            std::mem::swap(&mut *q, &mut batch);
        }
        for posted in batch.drain(..) {
            let d = match posted {
                Posted::Recv(d) => d,
                Posted::Answer(a) => {
                    self.take_answer(a);
                    continue;
                }
            };
            let w = d.waiter;
            let live = self.conn_live(w.conn, w.generation);
            if !live {
                // The requester went away: the tensor goes back for the next recv.
                if let (Ok(t), Some(r)) = (d.result, &self.rendezvous) {
                    r.restore(&d.key, t);
                }
                continue;
            }
            let conn = &mut self.conns[w.conn as usize];
            answer_recv(conn, w.handle, w.index, d.result);
            release_tokens(conn);
            mark_dirty(&mut self.dirty, conn, w.conn);
        }
        self.posted = batch;
        true
    }

    fn conn_live(&self, slot: u32, generation: u32) -> bool {
        self.conns.get(slot as usize).is_some_and(|c| {
            c.generation == generation && c.phase == Phase::Open && !c.proto.is_closed()
        })
    }

    /// Sends a pool handler's answer, if its connection is still there.
    fn take_answer(&mut self, a: Answer) {
        let to = match &a {
            Answer::Pull { to, .. } | Answer::Push { to, .. } => *to,
        };
        if !self.conn_live(to.conn, to.generation) {
            return;
        }
        let conn = &mut self.conns[to.conn as usize];
        let Conn {
            proto, out_tensors, ..
        } = conn;
        let scratch = &mut self.serve;
        match a {
            Answer::Pull { results, .. } => answer_pull(
                proto.encoder(),
                out_tensors,
                to.handle,
                &results,
                &mut scratch.tokens,
                &mut scratch.items,
            ),
            Answer::Push { statuses, .. } => {
                answer_push(proto.encoder(), to.handle, &statuses, &mut scratch.items)
            }
        }
        release_tokens(conn);
        mark_dirty(&mut self.dirty, conn, to.conn);
    }

    fn drain_requests(&mut self, now: Instant) -> bool {
        let mut progress = false;
        // The embedding thread's requests first (embedded mode).
        while let Some(req) = self.local_requests.pop_front() {
            progress = true;
            self.take_request(req, Origin::Local, now);
        }
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
                self.take_request(req, origin, now);
            }
            progress |= batch > 0;
        }
        self.submit_fused(now);
        progress
    }

    /// Submits a request from this drain pass, or, with tensor fusion on, holds a
    /// single-key recv back to be fused with the others of the pass.
    fn take_request(&mut self, req: Request, origin: Origin, now: Instant) {
        let single_recv = matches!(&req.op, RequestOp::Recv { keys, .. } if keys.len() == 1);
        if self.cfg.tensor_fuse && single_recv && !self.stopping {
            self.fuse_buf.push((req, origin));
        } else {
            self.submit(req, origin, now);
        }
    }

    /// Sends the recvs held back in this drain pass: one `FUSED_RECV` per peer, lane and
    /// step. Nothing waits for a timer: what arrived in the same pass goes out together.
    fn submit_fused(&mut self, now: Instant) {
        if self.fuse_buf.is_empty() {
            return;
        }
        let mut buf = std::mem::take(&mut self.fuse_buf);
        let step_of = |r: &Request| match &r.op {
            RequestOp::Recv { step, .. } => *step,
            _ => 0,
        };
        buf.sort_by_key(|(r, _)| (r.peer, r.lane, step_of(r)));
        let mut rest = buf.drain(..).peekable();
        while let Some((first, origin)) = rest.next() {
            let key = (first.peer, first.lane, step_of(&first));
            let mut group = Vec::new();
            while let Some((r, _)) = rest.peek() {
                if (r.peer, r.lane, step_of(r)) != key {
                    break;
                }
                group.push(rest.next().expect("peeked"));
            }
            if group.is_empty() {
                self.submit(first, origin, now);
                continue;
            }
            let member = |origin, r: &Request| Member {
                origin,
                tag: r.tag,
                deadline: r.deadline,
                done: false,
            };
            let mut members = vec![member(origin, &first)];
            let RequestOp::Recv { step, mut keys } = first.op else {
                continue;
            };
            for (r, o) in group {
                members.push(member(o, &r));
                if let RequestOp::Recv { keys: k, .. } = r.op {
                    keys.extend(k);
                }
            }
            // No deadline for the group: each member keeps its own.
            let fused = Request {
                op: RequestOp::Recv { step, keys },
                peer: key.0,
                lane: key.1,
                deadline: None,
                tag: 0,
                spare: Spare::default(),
            };
            self.submit_group(fused, Origin::Local, members, now);
        }
        drop(rest);
        self.fuse_buf = buf;
    }

    /// Starts a request (from a ring, or from the embedding thread).
    fn submit(&mut self, req: Request, origin: Origin, now: Instant) {
        self.submit_group(req, origin, Vec::new(), now);
    }

    /// Starts a request; `fused` lists the original recvs when the loop fused several.
    fn submit_group(&mut self, req: Request, origin: Origin, fused: Vec<Member>, now: Instant) {
        let kind = req.op.kind();
        let mut spare = req.spare;
        if self.stopping {
            return self.notify(origin, req.tag, kind, &fused, Err(Error::Shutdown), spare);
        }
        let slot = match self.peer_conn(req.peer, req.lane, now) {
            Ok(s) => s,
            Err(e) => return self.notify(origin, req.tag, kind, &fused, Err(e), spare),
        };
        let alloc = match &req.op {
            RequestOp::Pull { alloc, .. } => alloc.clone(),
            _ => None,
        };
        let pending = Pending {
            tag: req.tag,
            origin,
            kind,
            state: req.op.reply_state(&mut spare),
            op: Some(req.op),
            alloc,
            conn: slot,
            sent: None,
            fused,
            spare,
        };
        let handle = match self.ctxs.insert(pending) {
            Ok(h) => h.to_raw(),
            Err(Full(p)) => {
                let e = Err(Error::Backpressure);
                return self.notify(origin, p.tag, kind, &p.fused, e, p.spare);
            }
        };
        if let Some(deadline) = req.deadline {
            self.push_deadline(deadline, handle);
        }
        if let Ok(p) = self.ctxs.get(CtxHandle::from_raw(handle)) {
            for (i, m) in p.fused.iter().enumerate() {
                if let Some(at) = m.deadline {
                    let index = i as u32;
                    self.timers
                        .push(Reverse((at, Timer::Member { handle, index })));
                }
            }
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
        p.sent = Some(now);
        let Some(op) = p.op.take() else {
            return;
        };
        let conn = &mut self.conns[slot as usize];
        let result = match &op {
            RequestOp::Ping { payload } => {
                let n = *payload as usize;
                if self.zeros.len() < n {
                    self.zeros.resize(n, 0);
                }
                conn.proto.encoder().ping(handle, &self.zeros[..n])
            }
            RequestOp::Pull { ids, .. } => conn.proto.encoder().pull(handle, ids),
            RequestOp::Push { items } => encode_push(conn, handle, items, &mut self.push_scratch),
            RequestOp::Recv { step, keys } => {
                let fused = keys.len() != 1;
                conn.proto.encoder().recv(handle, *step, keys, fused)
            }
        };
        // The request's vectors go back to its submitter with the completion.
        match op {
            RequestOp::Pull { mut ids, .. } => {
                ids.clear();
                p.spare.ids = ids;
            }
            RequestOp::Push { mut items } => {
                items.clear();
                p.spare.items = items;
            }
            _ => {}
        }
        match result {
            Ok(()) => {
                add(&self.shared.counters.frames_out, 1);
                mark_dirty(&mut self.dirty, conn, slot);
            }
            Err(e) => {
                log::debug!("request not encodable: {e}");
                if let Ok(p) = self.ctxs.remove(CtxHandle::from_raw(handle)) {
                    let e = Err(Error::InvalidArgument);
                    self.notify(p.origin, p.tag, p.kind, &p.fused, e, p.spare);
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
            outgoing: Some((peer, lane)),
            ..Conn::new(None, proto, Phase::Backoff, self.next_serial())
        };
        let slot = self.conns.insert(conn) as u32;
        self.lend_buffer(slot);
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
                if std::mem::take(&mut conn.direct) {
                    add(&self.shared.counters.payload_direct, result as u64);
                    conn.proto.decoder().payload_received(result as u64);
                } else {
                    conn.proto.decoder().filled(result as usize);
                }
                self.process(slot, now);
                self.watch_frame_head(slot, now);
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
                release_tokens(conn);
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
        } else if result != -libc::EAGAIN && result != -libc::EINTR && result != -libc::ECONNABORTED
        {
            // EMFILE, ENFILE, ENOBUFS, ENOMEM: the connection stays in the backlog; try again
            // a little later instead of spinning on the same error.
            log::warn!(
                "accept: {}; retrying in {ACCEPT_BACKOFF:?}",
                errno_str(result)
            );
            self.timers
                .push(Reverse((Instant::now() + ACCEPT_BACKOFF, Timer::Accept)));
            return;
        }
        self.rearm_accept();
    }

    fn rearm_accept(&mut self) {
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
        let open = self.accepted.fetch_add(1, Ordering::Relaxed);
        if open >= self.cfg.max_connections {
            self.accepted.fetch_sub(1, Ordering::Relaxed);
            add(&self.shared.counters.connections_refused, 1);
            log::warn!(
                "refusing a connection: {open} accepted connections are open, the limit \
                 (STARWIRE_MAX_CONNECTIONS)"
            );
            return; // dropping `fd` closes it
        }
        socket::set_nodelay(&fd, true).ok();
        let proto = self.new_proto(Side::Server);
        let raw = fd.as_raw_fd();
        let generation = self.next_serial();
        let conn = Conn::new(Some(fd), proto, Phase::Handshaking, generation);
        let slot = self.conns.insert(conn) as u32;
        if let Err(e) = self.driver.register(slot, raw) {
            log::warn!("register accepted socket: {e}");
            self.conns.remove(slot as usize);
            self.accepted.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        self.conns[slot as usize].counted = true;
        self.lend_buffer(slot);
        add(&self.shared.counters.connections_accepted, 1);
        let deadline = now + self.cfg.handshake_timeout;
        let generation = self.conns[slot as usize].generation;
        self.timers
            .push(Reverse((deadline, Timer::Handshake { slot, generation })));
        self.arm_recv(slot);
    }

    /// Starts the frame-head timer when a frame's header or meta section has begun to
    /// arrive and is not complete (`STARWIRE_FRAME_TIMEOUT_MS`): a peer that stalls or
    /// trickles bytes there is disconnected instead of holding the connection forever.
    fn watch_frame_head(&mut self, slot: u32, now: Instant) {
        let Some(conn) = self.conns.get_mut(slot as usize) else {
            return;
        };
        let in_head = conn.phase != Phase::Closing && conn.proto.decoder().in_frame_head();
        if !in_head {
            conn.head_since = None;
            return;
        }
        conn.head_since.get_or_insert(now);
        if !conn.head_timer {
            // One timer per connection, however many frame heads arrive in pieces: when it
            // fires early for a later head, it is set again for that head's deadline.
            conn.head_timer = true;
            let timer = Timer::FrameHead {
                slot,
                generation: conn.generation,
            };
            self.timers
                .push(Reverse((now + self.cfg.frame_timeout, timer)));
        }
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
        let alloc = &*self.allocator;
        let direct = direct_target(conn, &mut self.ctxs, self.zero_copy_min, alloc, slot);
        if let Some((ptr, len)) = direct {
            conn.reading = true;
            conn.direct = true;
            add(&self.shared.counters.reads, 1);
            // SAFETY: `ptr..ptr+len` lies inside the memory of a tensor owned by a request
            // context or an incoming push of this connection. Neither is dropped while this
            // receive is in flight: requests are failed and the connection dropped only
            // once its operations have completed (`maybe_finish`), and a request completes
            // only after this payload has been reported to the decoder.
            if let Err(e) = unsafe { self.driver.recv(slot, fd, ptr, len) } {
                log::warn!("connection {slot}: recv: {e}");
                let conn = &mut self.conns[slot as usize];
                conn.reading = false;
                conn.direct = false;
                self.lose(slot, Error::ConnectionLost);
            }
            return;
        }
        let spare = conn.proto.decoder().spare();
        if spare.is_empty() {
            // Buffered bytes must be decoded first; `process` runs before every re-arm, so
            // this means the decoder is stuck on a frame it cannot finish.
            log::error!("connection {slot}: receive buffer full; closing");
            return self.lose(slot, Error::Protocol);
        }
        let ptr = spare.as_mut_ptr();
        let mut len = spare.len().min(u32::MAX as usize) as u32;
        let decoder = conn.proto.decoder();
        if decoder.chunks_pending() > 0 && decoder.is_idle() {
            // A chunk is most likely next: read just its header and meta, so that its
            // payload is received in place rather than read ahead into the buffer.
            len = len.min(CHUNK_HEAD as u32);
        } else if let Some(missing) = decoder.meta_missing().filter(|&m| m > 0) {
            // The rest of a meta section: payload after it may go straight into place.
            len = len.min(missing.min(u32::MAX as usize) as u32);
        } else if decoder.is_idle()
            && !matches!(decoder.last_payload_max(), Some(m) if m < self.zero_copy_min)
        {
            // Large frames are arriving (or none has since the handshake): read the next
            // header on its own, then its meta section (above), so that a large payload
            // goes straight into place from its first byte. Connections carrying small
            // frames keep reading as much as the buffer holds.
            len = len.min(crate::wire::HEADER_LEN as u32);
        }
        let fixed = conn
            .pool_buf
            .filter(|&i| self.bufs.is_registered() && self.bufs.contains(i, ptr, len as usize));
        conn.reading = true;
        add(&self.shared.counters.reads, 1);
        // `ptr..ptr+len` is the spare room of the connection's receive buffer. The decoder
        // neither moves nor touches it until `filled` after this completion, and the
        // connection is dropped only once the completion has been reaped.
        let armed = match fixed {
            Some(index) => {
                add(&self.shared.counters.fixed_reads, 1);
                // SAFETY: as above; and the range was just checked to lie in pool buffer
                // `index`, which stays registered for the life of the driver.
                unsafe { self.driver.recv_fixed(slot, fd, ptr, len, index) }
            }
            // SAFETY: as above.
            None => unsafe { self.driver.recv(slot, fd, ptr, len) },
        };
        if let Err(e) = armed {
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
            abandoned,
            outbox,
            shared,
            dirty,
            service,
            rendezvous,
            jobs,
            allocator,
            index,
            serve,
            ..
        } = self;
        let conn = &mut conns[slot as usize];
        let generation = conn.generation;
        let Conn {
            proto,
            out_tensors,
            cur_handle,
            cur_is_push,
            cur_chunk,
            chunk_owners,
            incoming,
            recvs,
            ..
        } = conn;
        let mut d = Dispatch {
            slot,
            now,
            ctxs,
            abandoned,
            outbox,
            shared,
            service: service.as_deref(),
            rendezvous: rendezvous.as_deref(),
            jobs: jobs.as_ref(),
            waiter_base: (*index, generation),
            recvs,
            allocator: &**allocator,
            out_tensors,
            cur_handle,
            cur_is_push,
            cur_chunk,
            chunk_owners,
            incoming,
            serve,
            opened: false,
            violation: None,
        };
        let was_closed = proto.is_closed();
        proto.process(|ev, enc| d.on_event(ev, enc));
        let (opened, violation) = (d.opened, d.violation);
        if let Some(why) = violation {
            log::warn!("connection {slot}: {why}; closing");
            conn.proto.abort(Status::Protocol, why);
        } else if let (false, Some(reason)) = (was_closed, conn.proto.close_reason()) {
            // The codec closed it: a malformed frame, or a refused handshake.
            log::warn!("connection {slot}: {reason}; closing");
        }
        release_tokens(conn);
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
                // We found the peer breaking the protocol: a protocol error, whichever side
                // opened the connection.
                Some(crate::proto::CloseReason::Rejected {
                    status: Status::Protocol,
                    ..
                }) => Error::Protocol,
                Some(crate::proto::CloseReason::Rejected { status, .. })
                    if conn.outgoing.is_some() =>
                {
                    Error::Refused(*status)
                }
                _ => Error::Protocol,
            };
            conn.failure = failure;
            // No new request may go out behind the connection's ERROR frame.
            if let Some(key) = conn.outgoing {
                if self.peers.get(&key) == Some(&slot) {
                    self.peers.remove(&key);
                }
            }
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
                    Piece::Tensor { token, offset, len } => {
                        let bytes = conn.out_tensors.get(token as usize).map(|t| t.bytes());
                        match bytes.and_then(|b| b.get(offset as usize..(offset + len) as usize)) {
                            Some(b) => (b.as_ptr(), b.len()),
                            None => {
                                bad = true;
                                break;
                            }
                        }
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
                log::error!("connection {slot}: output names a tensor it does not hold");
                self.lose(slot, Error::Protocol);
                continue;
            }
            io.msg = empty_msghdr();
            io.msg.msg_iov = io.iov.as_mut_ptr();
            io.msg.msg_iovlen = n as _;
            conn.writing = true;
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
                    if let Ok(p) = self.ctxs.remove(CtxHandle::from_raw(h)) {
                        self.abandon(h, &p);
                        let e = Err(Error::Timeout);
                        self.notify(p.origin, p.tag, p.kind, &p.fused, e, p.spare);
                    }
                }
                Timer::Member { handle, index } => {
                    let h = CtxHandle::from_raw(handle);
                    let Ok(p) = self.ctxs.get_mut(h) else {
                        continue;
                    };
                    let Some(m) = p.fused.get_mut(index as usize).filter(|m| !m.done) else {
                        continue;
                    };
                    m.done = true;
                    let (origin, tag) = (m.origin, m.tag);
                    let all_done = p.fused.iter().all(|m| m.done);
                    let timeout = Err(Error::Timeout);
                    deliver(
                        &mut self.outbox,
                        &self.shared,
                        origin,
                        tag,
                        RequestKind::Recv,
                        timeout,
                        Spare::default(),
                    );
                    if all_done {
                        if let Ok(p) = self.ctxs.remove(h) {
                            self.abandon(handle, &p);
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
                Timer::Accept => {
                    if !self.stopping && !self.accepting {
                        self.rearm_accept();
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
                Timer::FrameHead { slot, generation } => {
                    let timeout = self.cfg.frame_timeout;
                    let Some(c) = self.conns.get_mut(slot as usize) else {
                        continue;
                    };
                    if c.generation != generation || c.phase == Phase::Closing {
                        continue;
                    }
                    c.head_timer = false;
                    let Some(since) = c.head_since else {
                        continue;
                    };
                    if since + timeout > now {
                        // A later frame head: its own deadline.
                        c.head_timer = true;
                        let timer = Timer::FrameHead { slot, generation };
                        self.timers.push(Reverse((since + timeout, timer)));
                        continue;
                    }
                    log::warn!(
                        "connection {slot}: a frame's header and meta section did not arrive \
                         within {timeout:?} (STARWIRE_FRAME_TIMEOUT_MS); closing"
                    );
                    self.lose(slot, Error::Protocol);
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

    /// Remembers a request given up while its answer may still come, so that the answer is
    /// ignored rather than taken for a forged handle. Bounded: the oldest is forgotten
    /// first (a very late answer to it then closes the connection as a protocol violation).
    fn abandon(&mut self, handle: u64, p: &Pending) {
        if p.sent.is_none() {
            return;
        }
        if self.abandoned.len() == ABANDONED_KEPT {
            self.abandoned.pop_front();
        }
        self.abandoned.push_back((handle, p.conn));
    }

    fn notify(
        &mut self,
        origin: Origin,
        tag: u64,
        kind: RequestKind,
        fused: &[Member],
        result: Result<Reply, Error>,
        spare: Spare,
    ) {
        notify(
            &mut self.outbox,
            &self.shared,
            origin,
            tag,
            kind,
            fused,
            result,
            spare,
        );
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
        if let Some((peer, lane)) = conn.outgoing {
            if self.peers.get(&(peer, lane)) == Some(&slot) {
                self.peers.remove(&(peer, lane));
            }
        }
        let fd = conn.fd();
        if fd >= 0 && conn.ops_in_flight() {
            self.driver.shutdown(slot, fd);
        }
        self.maybe_finish(slot);
    }

    /// Fails the requests waiting for or in flight on connection `slot`. Runs once no
    /// operation is in flight: a receive may be writing into a request's tensor until then.
    fn fail_requests(&mut self, slot: u32) {
        let conn = &mut self.conns[slot as usize];
        let why = conn.failure;
        let mut failed = std::mem::take(&mut self.scratch);
        failed.extend(conn.waiting.drain(..));
        for (h, p) in self.ctxs.iter() {
            if p.conn == slot && p.sent.is_some() {
                failed.push(h.to_raw());
            }
        }
        for h in failed.drain(..) {
            if let Ok(p) = self.ctxs.remove(CtxHandle::from_raw(h)) {
                self.notify(p.origin, p.tag, p.kind, &p.fused, Err(why), p.spare);
            }
        }
        self.scratch = failed;
    }

    /// Drops a closing connection once nothing is in flight on it.
    fn maybe_finish(&mut self, slot: u32) {
        let conn = &self.conns[slot as usize];
        if conn.phase != Phase::Closing || conn.ops_in_flight() {
            return;
        }
        self.fail_requests(slot);
        let conn = &self.conns[slot as usize];
        if let (false, Some(r)) = (conn.recvs.is_empty(), &self.rendezvous) {
            r.forget(self.index, slot, conn.generation);
        }
        if self.conns[slot as usize].fd.is_some() {
            self.driver.deregister(slot);
        }
        let mut conn = self.conns.remove(slot as usize);
        if conn.counted {
            self.accepted.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(index) = conn.pool_buf {
            // No operation is in flight: the buffer is the loop's again.
            let buf = conn.proto.decoder().swap_buffer(Vec::new());
            self.bufs.give_back(index, buf);
        }
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
        self.local_requests.push_back(req);
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

/// Acts on one connection's decoded events: answers to our requests, and requests from
/// the peer for the service.
struct Dispatch<'a> {
    slot: u32,
    now: Instant,
    ctxs: &'a mut CtxSlab<Pending>,
    abandoned: &'a mut VecDeque<(u64, u32)>,
    outbox: &'a mut Outbox,
    shared: &'a LoopShared,
    service: Option<&'a dyn crate::service::Service>,
    rendezvous: Option<&'a Rendezvous>,
    jobs: Option<&'a std::sync::mpsc::SyncSender<Job>>,
    /// This loop's index and this connection's generation, for rendezvous waiters.
    waiter_base: (usize, u32),
    recvs: &'a mut Vec<(u64, u32)>,
    allocator: &'a dyn crate::tensor::TensorAllocator,
    out_tensors: &'a mut Slab<Arc<Tensor>>,
    cur_handle: &'a mut u64,
    cur_is_push: &'a mut bool,
    cur_chunk: &'a mut (u64, u32, u64),
    chunk_owners: &'a mut VecDeque<(bool, u64)>,
    incoming: &'a mut Vec<IncomingPush>,
    serve: &'a mut ServeScratch,
    opened: bool,
    violation: Option<&'static str>,
}

impl Dispatch<'_> {
    fn on_event(&mut self, ev: ConnEvent<'_>, enc: &mut Encoder) {
        if self.violation.is_some() {
            return;
        }
        match ev {
            ConnEvent::Opened => self.opened = true,
            ConnEvent::Frame(f) => {
                add(&self.shared.counters.frames_in, 1);
                *self.cur_handle = f.header.handle;
                let is_push = f.header.kind == Kind::Push;
                *self.cur_is_push = is_push;
                // Mirror the decoder's queue of chunked tensors (it keeps every one it
                // accepted, whatever we do with the frame), noting whose they are.
                for t in f.body.tensors().filter(|t| t.meta.chunked) {
                    self.chunk_owners.push_back((is_push, t.meta.byte_len));
                }
                let h = f.header.handle;
                match f.body {
                    Body::Pong | Body::Error(_) => self.on_pong_or_error(&f),
                    Body::Response(entries) => self.on_response(h, entries, f.header.end),
                    Body::Pull(_) | Body::Push(_) | Body::Recv(_) | Body::FusedRecv(_)
                        if self.incoming.len() + self.recvs.len() >= MAX_SERVED =>
                    {
                        // A peer may not pile up unanswered requests without limit. Its
                        // payload, if any, is still read and dropped.
                        let _ = enc.error(h, Status::ResourceExhausted, "too many requests");
                    }
                    Body::Pull(ids) => self.serve_pull(h, ids, enc),
                    Body::Push(entries) => {
                        if self.incoming.iter().any(|p| p.handle == h) {
                            self.violation = Some("push with a handle already in use");
                            return;
                        }
                        let spare = self.serve.push_vecs.pop().unwrap_or_default();
                        let push = IncomingPush::new(h, entries, self.allocator, spare);
                        self.incoming.push(push);
                    }
                    Body::Recv(r) | Body::FusedRecv(r) => self.serve_recv(h, r, enc),
                    Body::Chunk(c) => {
                        *self.cur_chunk = (h, c.index, c.offset + f.header.payload_len as u64);
                    }
                    _ => {}
                }
            }
            ConnEvent::Payload {
                target,
                offset,
                data,
            } => {
                add(&self.shared.counters.payload_copied, data.len() as u64);
                self.on_payload(target, offset, data);
            }
            ConnEvent::FrameEnd(h) => match h.kind {
                Kind::Push => {
                    if let Some(p) = self.incoming.iter_mut().find(|p| p.handle == h.handle) {
                        p.frame_done();
                    }
                    self.finish_push(h.handle, enc);
                }
                Kind::Response => {
                    self.deliver_ready_members(h.handle);
                    self.try_complete(h.handle);
                }
                Kind::Chunk => {
                    // All of the chunk's bytes have arrived, copied or received in place.
                    let (handle, index, end) = *self.cur_chunk;
                    if let Some(&(is_push, len)) = self.chunk_owners.front() {
                        if end == len {
                            self.chunk_owners.pop_front();
                        }
                        self.chunk_progress(is_push, handle, index, end, enc);
                    }
                }
                _ => {}
            },
        }
    }

    /// Looks up the request an answer names; a forged, stale or foreign handle is a
    /// protocol violation.
    fn answered(&mut self, handle: u64) -> Option<&mut Pending> {
        let slot = self.slot;
        if self.abandoned.contains(&(handle, slot)) {
            // A late answer to a request given up by deadline: ignored, payload dropped.
            return None;
        }
        match self.ctxs.get_mut(CtxHandle::from_raw(handle)) {
            Ok(p) if p.conn == slot && p.sent.is_some() => Some(p),
            _ => {
                self.violation = Some("answer with an unknown or stale handle");
                None
            }
        }
    }

    fn on_pong_or_error(&mut self, f: &crate::proto::Frame<'_>) {
        let handle = f.header.handle;
        let now = self.now;
        let Some(p) = self.answered(handle) else {
            return;
        };
        // An ERROR for a request: items already answered keep their answer (the others get
        // the status); with none answered the whole request fails.
        let partial = matches!(f.body, Body::Error(_)) && p.state.fail_open(f.header.status);
        let reply = match f.body {
            Body::Error(_) if partial => Ok(None),
            Body::Error(_) => Err(Error::Remote(f.header.status)),
            _ if matches!(p.state, ReplyState::Ping) => Ok(Some(Reply::Pong {
                rtt: p.sent.map_or(Duration::ZERO, |s| now - s),
                payload: f.header.payload_len,
            })),
            _ => {
                self.violation = Some("pong for a request that is not a ping");
                return;
            }
        };
        if let Ok(mut p) = self.ctxs.remove(CtxHandle::from_raw(handle)) {
            let reply = match reply {
                Ok(Some(pong)) => Ok(pong),
                Ok(None) => Ok(p.state.finish(&mut p.spare)),
                Err(e) => Err(e),
            };
            notify(
                self.outbox,
                self.shared,
                p.origin,
                p.tag,
                p.kind,
                &p.fused,
                reply,
                p.spare,
            );
        }
    }

    fn on_response(&mut self, handle: u64, entries: crate::wire::ResponseEntries<'_>, end: bool) {
        let default = self.allocator;
        let Some(p) = self.answered(handle) else {
            return;
        };
        let alloc: &dyn crate::tensor::TensorAllocator = match &p.alloc {
            Some(a) => &**a,
            None => default,
        };
        if let Err(why) = p.state.accept(entries, end, alloc) {
            self.violation = Some(why);
        }
    }

    /// For recvs the loop fused: completes each member whose tensor is fully in, without
    /// waiting for the others. Runs at the end of a `RESPONSE` frame (its inline payload has
    /// arrived) and at the end of a chunked tensor.
    fn deliver_ready_members(&mut self, handle: u64) {
        let h = CtxHandle::from_raw(handle);
        let Ok(p) = self.ctxs.get_mut(h) else {
            return;
        };
        if p.fused.is_empty() {
            return;
        }
        for i in 0..p.fused.len() {
            if p.fused[i].done {
                continue;
            }
            if let Some(r) = p.state.take_ready(i as u32) {
                p.fused[i].done = true;
                let m = p.fused[i];
                let one = Ok(Reply::Received(vec![r]));
                deliver(
                    self.outbox,
                    self.shared,
                    m.origin,
                    m.tag,
                    RequestKind::Recv,
                    one,
                    Spare::default(),
                );
            }
        }
        if p.fused.iter().all(|m| m.done) {
            let answered_fully = p.state.is_complete();
            self.ctxs.remove(h).ok();
            if !answered_fully {
                // More frames may still come for it; they are recognised and dropped.
                if self.abandoned.len() == ABANDONED_KEPT {
                    self.abandoned.pop_front();
                }
                self.abandoned.push_back((handle, self.slot));
            }
        }
    }

    /// Completes request `handle` if its whole answer has arrived.
    fn try_complete(&mut self, handle: u64) {
        let h = CtxHandle::from_raw(handle);
        let done = self.ctxs.get(h).is_ok_and(|p| p.state.is_complete());
        if !done {
            return;
        }
        if let Ok(mut p) = self.ctxs.remove(h) {
            let reply = Ok(p.state.finish(&mut p.spare));
            notify(
                self.outbox,
                self.shared,
                p.origin,
                p.tag,
                p.kind,
                &p.fused,
                reply,
                p.spare,
            );
        }
    }

    fn on_payload(&mut self, target: PayloadTarget, offset: u64, data: &[u8]) {
        let Some(route) = route(
            target,
            *self.cur_handle,
            *self.cur_is_push,
            self.chunk_owners,
        ) else {
            return;
        };
        let end = offset + data.len() as u64;
        let slot = self.slot;
        if let Some(t) = tensor_for(self.ctxs, self.incoming, slot, route, self.allocator) {
            let dst = t.bytes_mut();
            let (start, stop) = (offset as usize, end as usize);
            if stop <= dst.len() {
                dst[start..stop].copy_from_slice(data);
            }
        }
    }

    fn chunk_progress(
        &mut self,
        is_push: bool,
        handle: u64,
        index: u32,
        end: u64,
        enc: &mut Encoder,
    ) {
        if is_push {
            if let Some(p) = self.incoming.iter_mut().find(|p| p.handle == handle) {
                p.chunk_progress(index, end);
                self.finish_push(handle, enc);
            }
            return;
        }
        let slot = self.slot;
        let ours = self.ctxs.get_mut(CtxHandle::from_raw(handle));
        if let Some(p) = ours.into_iter().find(|p| p.conn == slot) {
            p.state.chunk_progress(index, end);
            self.deliver_ready_members(handle);
            self.try_complete(handle);
        }
    }

    /// Applies a completely received push and answers it.
    fn finish_push(&mut self, handle: u64, enc: &mut Encoder) {
        let Some(i) = self
            .incoming
            .iter()
            .position(|p| p.handle == handle && p.is_complete())
        else {
            return;
        };
        let push = self.incoming.swap_remove(i);
        let s = &mut *self.serve;
        let Some(service) = self.service else {
            s.statuses.clear();
            s.statuses.resize(push.len(), Status::Unimplemented);
            return answer_push(enc, handle, &s.statuses, &mut s.items);
        };
        let PushVecs { ids, mut results } = push.into_parts();
        if let Some(jobs) = self.jobs {
            let to = self.reply_to(handle);
            let job = Job::Push { to, ids, results };
            refuse_if_unsent(jobs.try_send(job), enc, handle);
            return;
        }
        crate::pool::apply_push(service, &ids, &mut results, &mut s.statuses, &mut s.push);
        answer_push(enc, handle, &s.statuses, &mut s.items);
        if s.push_vecs.len() < PUSH_VECS_KEPT {
            s.push_vecs.push(PushVecs { ids, results });
        }
    }

    fn reply_to(&self, handle: u64) -> ReplyTo {
        let (loop_index, generation) = self.waiter_base;
        ReplyTo {
            loop_index,
            conn: self.slot,
            generation,
            handle,
        }
    }

    /// Answers at once the keys already published; leaves waiters for the others, which
    /// are answered one by one as they are published (each in its own frame, so a slow
    /// tensor never holds back a ready one).
    fn serve_recv(&mut self, handle: u64, r: crate::wire::RecvBody<'_>, enc: &mut Encoder) {
        let Some(rendezvous) = self.rendezvous else {
            let _ = enc.error(handle, Status::Unimplemented, "no rendezvous on this task");
            return;
        };
        if self.recvs.iter().any(|&(h, _)| h == handle) {
            self.violation = Some("recv with a handle already in use");
            return;
        }
        let (loop_index, generation) = self.waiter_base;
        let mut ready = Vec::new();
        let mut waiting = 0u32;
        for (index, key) in r.keys.enumerate() {
            let waiter = Waiter {
                loop_index,
                conn: self.slot,
                generation,
                handle,
                index: index as u32,
                step: r.step_id,
            };
            match rendezvous.take_or_wait(key, waiter) {
                Some(t) => ready.push((index as u32, t)),
                None => waiting += 1,
            }
        }
        let tokens: Vec<u64> = ready
            .iter()
            .map(|(_, t)| self.out_tensors.insert(t.clone()) as u64)
            .collect();
        let items: Vec<ResponseItem<'_>> = ready
            .iter()
            .zip(&tokens)
            .map(|((index, t), &token)| ResponseItem {
                index: *index,
                status: Status::Ok,
                tensor: Some(t.out(token)),
            })
            .collect();
        if waiting > 0 {
            self.recvs.push((handle, waiting));
        }
        if waiting == 0 || !items.is_empty() {
            if let Err(k) = send_items(enc, handle, waiting == 0, &items) {
                release_unsent(self.out_tensors, tokens[k..].iter().copied());
            }
        }
    }

    fn serve_pull(&mut self, handle: u64, ids: crate::wire::VarIds<'_>, enc: &mut Encoder) {
        let Some(service) = self.service else {
            let _ = enc.error(handle, Status::Unimplemented, "no pull service");
            return;
        };
        if let Some(jobs) = self.jobs {
            let to = self.reply_to(handle);
            let ids = ids.iter().collect();
            refuse_if_unsent(jobs.try_send(Job::Pull { to, ids }), enc, handle);
            return;
        }
        let s = &mut *self.serve;
        s.ids.clear();
        s.ids.extend(ids.iter());
        crate::service::pull(service, &s.ids, &mut s.pulled);
        answer_pull(
            enc,
            self.out_tensors,
            handle,
            &s.pulled,
            &mut s.tokens,
            &mut s.items,
        );
        s.pulled.clear();
    }
}

/// Answers a request the handler pool could not take.
fn refuse_if_unsent(r: Result<(), std::sync::mpsc::TrySendError<Job>>, enc: &mut Encoder, h: u64) {
    match r {
        Ok(()) => {}
        Err(std::sync::mpsc::TrySendError::Full(_)) => {
            let _ = enc.error(h, Status::ResourceExhausted, "handlers are behind; retry");
        }
        Err(std::sync::mpsc::TrySendError::Disconnected(_)) => {
            let _ = enc.error(h, Status::Shutdown, "handler pool stopped");
        }
    }
}

/// Answers a pull with `results`, the tensors sent by reference; `tokens` and `spare` lend
/// their allocations.
fn answer_pull(
    enc: &mut Encoder,
    out_tensors: &mut Slab<Arc<Tensor>>,
    handle: u64,
    results: &[Result<Arc<Tensor>, Status>],
    tokens: &mut Vec<Option<u64>>,
    spare: &mut Vec<ResponseItem<'static>>,
) {
    tokens.clear();
    tokens.extend(results.iter().map(|r| {
        r.as_ref()
            .ok()
            .map(|t| out_tensors.insert(t.clone()) as u64)
    }));
    let mut items: Vec<ResponseItem<'_>> = recast(std::mem::take(spare));
    items.extend(
        results
            .iter()
            .zip(tokens.iter())
            .enumerate()
            .map(|(index, (r, token))| match (r, token) {
                (Ok(t), Some(token)) => ResponseItem {
                    index: index as u32,
                    status: Status::Ok,
                    tensor: Some(t.out(*token)),
                },
                (Err(s), _) => ResponseItem {
                    index: index as u32,
                    status: if s.is_ok() { Status::Internal } else { *s },
                    tensor: None,
                },
                (Ok(_), None) => ResponseItem {
                    index: index as u32,
                    status: Status::Internal,
                    tensor: None,
                },
            }),
    );
    if let Err(k) = send_items(enc, handle, true, &items) {
        release_unsent(out_tensors, tokens[k..].iter().flatten().copied());
    }
    *spare = recast(items);
}

/// Drops the references of tensors whose items were not encoded (those already queued keep
/// theirs until written).
fn release_unsent(out_tensors: &mut Slab<Arc<Tensor>>, tokens: impl Iterator<Item = u64>) {
    for t in tokens {
        out_tensors.try_remove(t as usize);
    }
}

/// Answers a push with one status per item; `spare` lends its allocation.
fn answer_push(
    enc: &mut Encoder,
    handle: u64,
    statuses: &[Status],
    spare: &mut Vec<ResponseItem<'static>>,
) {
    let mut items: Vec<ResponseItem<'_>> = recast(std::mem::take(spare));
    items.extend(
        statuses
            .iter()
            .enumerate()
            .map(|(index, &status)| ResponseItem {
                index: index as u32,
                status,
                tensor: None,
            }),
    );
    let _ = send_items(enc, handle, true, &items);
    *spare = recast(items);
}

/// An empty vector of another item type in `v`'s allocation, when the two have the same
/// layout (here: the same items, borrowing for another lifetime), so that a vector of
/// borrowing items can be kept between uses. std collects a vector's `into_iter` in place
/// when layouts match (a test checks that it still does); otherwise this allocates anew.
fn recast<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}

/// Vectors the serving side reuses from request to request, so that answering allocates
/// nothing in steady state.
#[derive(Default)]
struct ServeScratch {
    ids: Vec<u64>,
    pulled: Vec<Result<Arc<Tensor>, Status>>,
    tokens: Vec<Option<u64>>,
    items: Vec<ResponseItem<'static>>,
    statuses: Vec<Status>,
    push: PushScratch,
    /// Vectors of finished pushes, for the next ones (at most `PUSH_VECS_KEPT`).
    push_vecs: Vec<PushVecs>,
}

/// Most sets of push vectors a loop keeps for reuse.
const PUSH_VECS_KEPT: usize = 64;

/// Vectors for encoding a push, reused from push to push.
#[derive(Default)]
struct PushEncodeScratch {
    tokens: Vec<u64>,
    items: Vec<PushItem<'static>>,
}

/// Answers item `index` of the recv `handle` with a tensor delivered by the rendezvous (or
/// a failure); the last item owed carries `END`.
fn answer_recv(conn: &mut Conn, handle: u64, index: u32, result: Result<Arc<Tensor>, Status>) {
    let Some(pos) = conn.recvs.iter().position(|&(h, _)| h == handle) else {
        return;
    };
    conn.recvs[pos].1 -= 1;
    let last = conn.recvs[pos].1 == 0;
    if last {
        conn.recvs.swap_remove(pos);
    }
    let (item, token) = match &result {
        Ok(t) => {
            let token = conn.out_tensors.insert(t.clone()) as u64;
            let item = ResponseItem {
                index,
                status: Status::Ok,
                tensor: Some(t.out(token)),
            };
            (item, Some(token))
        }
        Err(s) => (
            ResponseItem {
                index,
                status: *s,
                tensor: None,
            },
            None,
        ),
    };
    let enc = conn.proto.encoder();
    if send_items(enc, handle, last, &[item]).is_err() {
        release_unsent(&mut conn.out_tensors, token.into_iter());
    }
}

/// Sends `items` in `RESPONSE` frames that fit the peer's frame limit, `end` on the last.
/// When a frame cannot be encoded, sends an `ERROR` for the request instead and returns
/// the index of the first item not sent.
fn send_items(
    enc: &mut Encoder,
    handle: u64,
    end: bool,
    items: &[ResponseItem<'_>],
) -> Result<(), usize> {
    let budget = (enc.config().max_frame / 2) as usize;
    let mut start = 0;
    loop {
        let mut stop = start;
        let mut size = 0;
        while stop < items.len() {
            let len = 8 + items[stop].tensor.map_or(0, |t| t.meta.buffer_len());
            if stop > start && size + len > budget {
                break;
            }
            size += len;
            stop += 1;
        }
        let last = stop >= items.len();
        if let Err(e) = enc.response(handle, end && last, &items[start..stop]) {
            log::warn!("cannot encode response: {e}");
            let _ = enc.error(handle, Status::Internal, "response not encodable");
            return Err(start);
        }
        if last {
            return Ok(());
        }
        start = stop;
    }
}

/// The tensor receiving payload for item `index` of the request or push `handle`;
/// memory for a chunked tensor is taken from the request's allocator (or `default`) when its
/// first bytes arrive.
fn tensor_for<'a>(
    ctxs: &'a mut CtxSlab<Pending>,
    incoming: &'a mut [IncomingPush],
    slot: u32,
    route: Route,
    default: &dyn crate::tensor::TensorAllocator,
) -> Option<&'a mut Tensor> {
    let Route {
        handle,
        index,
        is_push,
    } = route;
    if is_push {
        let p = incoming.iter_mut().find(|p| p.handle == handle)?;
        return p.tensor_mut(index, default);
    }
    let p = ctxs.get_mut(CtxHandle::from_raw(handle)).ok()?;
    if p.conn != slot {
        return None;
    }
    let alloc: &dyn crate::tensor::TensorAllocator = match &p.alloc {
        Some(a) => &**a,
        None => default,
    };
    p.state.tensor_mut(index, alloc)
}

/// Where payload goes: the item of a push the peer sent, or of an answer to our request.
#[derive(Debug, Clone, Copy)]
struct Route {
    handle: u64,
    index: u32,
    is_push: bool,
}

/// The route of payload for `target`, from the current frame (inline tensors) or the
/// oldest incomplete chunked tensor (chunks).
fn route(
    target: PayloadTarget,
    cur_handle: u64,
    cur_is_push: bool,
    chunk_owners: &VecDeque<(bool, u64)>,
) -> Option<Route> {
    match target {
        PayloadTarget::Tensor { index } => Some(Route {
            handle: cur_handle,
            index,
            is_push: cur_is_push,
        }),
        PayloadTarget::Chunk { handle, index } => Some(Route {
            handle,
            index,
            is_push: chunk_owners.front()?.0,
        }),
        PayloadTarget::Opaque => None,
    }
}

/// Queues a push whose tensors are referenced (not copied) while they are written.
fn encode_push(
    conn: &mut Conn,
    handle: u64,
    items: &[(u64, Arc<Tensor>)],
    scratch: &mut PushEncodeScratch,
) -> Result<(), crate::proto::EncodeError> {
    let tokens = &mut scratch.tokens;
    tokens.clear();
    tokens.extend(
        items
            .iter()
            .map(|(_, t)| conn.out_tensors.insert(t.clone()) as u64),
    );
    let mut push: Vec<PushItem<'_>> = recast(std::mem::take(&mut scratch.items));
    push.extend(
        items
            .iter()
            .zip(tokens.iter())
            .map(|((id, t), &token)| PushItem {
                var_id: *id,
                tensor: t.out(token),
            }),
    );
    let r = conn.proto.encoder().push(handle, &push);
    scratch.items = recast(push);
    if r.is_err() {
        for &t in tokens.iter() {
            conn.out_tensors.try_remove(t as usize);
        }
    }
    r
}

/// Where the next payload bytes of `conn` may be received directly: a pointer into the
/// destination tensor and the length, when the decoder offers at least `min` bytes of a
/// tensor that has memory.
fn direct_target(
    conn: &mut Conn,
    ctxs: &mut CtxSlab<Pending>,
    min: u64,
    alloc: &dyn crate::tensor::TensorAllocator,
    slot: u32,
) -> Option<(*mut u8, u32)> {
    let NextRead::Payload {
        target,
        offset,
        len,
    } = conn.proto.next_read()
    else {
        return None;
    };
    let route = route(
        target,
        conn.cur_handle,
        conn.cur_is_push,
        &conn.chunk_owners,
    )?;
    let tensor = tensor_for(ctxs, &mut conn.incoming, slot, route, alloc)?;
    // The tensor's size decides, not what is left of it: once a large tensor is being
    // received in place, its tail is too (a buffered read would also pull in what follows).
    if (tensor.byte_len() as u64) < min || tensor.is_inline() {
        return None;
    }
    let dst = tensor.bytes_mut().get_mut(offset as usize..)?;
    let n = (len.min(u32::MAX as u64) as usize).min(dst.len());
    if n == 0 {
        return None;
    }
    Some((dst.as_mut_ptr(), n as u32))
}

/// Drops the references the encoder no longer needs.
fn release_tokens(conn: &mut Conn) {
    let Conn {
        proto, out_tensors, ..
    } = conn;
    proto.encoder().take_released(|t| {
        out_tensors.try_remove(t as usize);
    });
}

/// Completes a request: its own completion, or, for recvs the loop fused, one completion
/// per original recv with its entry of the answer.
impl Drop for Loop {
    fn drop(&mut self) {
        let in_flight = self.conns.iter().any(|(_, c)| c.ops_in_flight());
        if in_flight && self.driver.backend() == Backend::Uring {
            // Only after a panic: operations still in the kernel may write into connection
            // buffers and tensors. Closing the ring cancels them asynchronously, so freeing
            // that memory now could let the kernel write into freed memory. Leak it instead.
            log::error!("event loop dropped with I/O in flight; leaking its buffers");
            std::mem::forget(std::mem::take(&mut self.conns));
            // Requests may own tensors that a receive writes into.
            std::mem::forget(std::mem::replace(&mut self.ctxs, CtxSlab::with_capacity(0)));
            // Registered buffers, and reads into them, may outlive the loop in the kernel.
            std::mem::forget(std::mem::replace(&mut self.bufs, BufPool::new(0, 1)));
            return;
        }
        // SAFETY: dropped once, here; nothing in flight references loop memory (epoll has no
        // kernel-side operations; io_uring has none left).
        unsafe { std::mem::ManuallyDrop::drop(&mut self.driver) };
    }
}

#[allow(clippy::too_many_arguments)]
fn notify(
    outbox: &mut Outbox,
    shared: &LoopShared,
    origin: Origin,
    tag: u64,
    kind: RequestKind,
    fused: &[Member],
    result: Result<Reply, Error>,
    spare: Spare,
) {
    if fused.is_empty() {
        return deliver(outbox, shared, origin, tag, kind, result, spare);
    }
    // Members whose own deadline already passed got their completion then.
    let live = fused.iter().filter(|m| !m.done);
    match result {
        Ok(Reply::Received(results)) => {
            for (m, r) in fused.iter().zip(results).filter(|(m, _)| !m.done) {
                let one = Ok(Reply::Received(vec![r]));
                deliver(
                    outbox,
                    shared,
                    m.origin,
                    m.tag,
                    RequestKind::Recv,
                    one,
                    Spare::default(),
                );
            }
        }
        other => {
            // A fused recv answered as something else is the peer's protocol error.
            let e = other.err().unwrap_or(Error::Protocol);
            for m in live {
                let spare = Spare::default();
                deliver(
                    outbox,
                    shared,
                    m.origin,
                    m.tag,
                    RequestKind::Recv,
                    Err(e),
                    spare,
                );
            }
        }
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
    spare: Spare,
) {
    let counter = if result.is_ok() {
        &shared.counters.completed[kind as usize]
    } else {
        &shared.counters.failed[kind as usize]
    };
    add(counter, 1);
    let completion = Completion { tag, result, spare };
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
                crate::service::guarded("completion callback", || cb(completion));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recast_keeps_the_allocation_of_borrowing_items() {
        let mut v: Vec<ResponseItem<'static>> = Vec::with_capacity(100);
        v.push(ResponseItem {
            index: 1,
            status: Status::Ok,
            tensor: None,
        });
        let ptr = v.as_ptr() as usize;
        let bytes = [0u8; 4];
        let mut w: Vec<ResponseItem<'_>> = recast(v);
        assert!(w.is_empty());
        assert_eq!((w.as_ptr() as usize, w.capacity()), (ptr, 100));
        w.push(ResponseItem {
            index: 0,
            status: Status::Ok,
            tensor: Some(crate::proto::OutTensor {
                meta: crate::wire::TensorMeta::dead(crate::wire::DType::U8),
                bytes: &bytes,
                token: 0,
            }),
        });
        let back: Vec<ResponseItem<'static>> = recast(w);
        assert_eq!((back.as_ptr() as usize, back.capacity()), (ptr, 100));
        let push: Vec<PushItem<'static>> = recast(Vec::<PushItem<'_>>::with_capacity(8));
        assert_eq!(push.capacity(), 8);
    }
}
