//! Starting and stopping the event loops, and submitting requests to them.
//!
//! [`Runtime::start`] starts one loop thread per core it is given (see
//! [`Config::loop_count`]), each pinned first if asked, then building its state. A thread
//! that wants to send requests takes a [`Handle`]: per loop, a single-producer ring of
//! requests into the loop and one of completions back, so submitting takes no lock and
//! touches no line another submitter writes. A request goes to the loop that owns the
//! connection to its peer (a hash of peer and lane), which also answers it.
//!
//! [`Embedded`] is the same loop driven by the caller's own thread: no loop threads, no
//! rings, no cross-thread hop.

use std::hash::{Hash, Hasher};
use std::io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::error::Error;
use crate::event_loop::{Loop, LoopParts, LoopShared};
use crate::pool::{HandlerPool, Job};
use crate::rendezvous::Rendezvous;
use crate::service::SharedService;
use crate::session::{Callback, Completion, Endpoint, Request, RequestOp, Spare};
use crate::spsc::{self, Consumer, Producer, ThreadWaker};
use crate::stats::Stats;
use crate::sys::{self, affinity, socket, Backend};
use crate::tensor::{HeapAllocator, SharedAllocator, Tensor};
use std::sync::mpsc::SyncSender;

/// Payload of at least this many bytes is received straight into the tensor's memory;
/// shorter payload is copied once out of the receive buffer.
pub const DEFAULT_ZERO_COPY_MIN: u64 = 16 * 1024;

/// What a runtime serves, and how it receives tensors.
#[derive(Clone, Default)]
pub struct Options {
    /// Address every loop listens on (port 0 picks one port for all).
    pub listen: Option<SocketAddr>,
    /// Answers the pulls and pushes that arrive; without one they fail with
    /// `UNIMPLEMENTED`.
    pub service: Option<SharedService>,
    /// The task's rendezvous: recvs from peers take the tensors published in it. Without
    /// one, recvs fail with `UNIMPLEMENTED`.
    pub rendezvous: Option<Arc<Rendezvous>>,
    /// Memory for received tensors; [`HeapAllocator`] when `None`.
    pub allocator: Option<SharedAllocator>,
    /// Payload of at least this many bytes is received in place (default
    /// [`DEFAULT_ZERO_COPY_MIN`]).
    pub zero_copy_min: Option<u64>,
    /// Connections this task expects (its peers times `connections_per_peer`). The
    /// default loop count is `min(16, connections)`, never more than the CPUs this process
    /// may run on; unknown (`None`): as many loops as allowed CPUs, at most 16.
    pub connections: Option<usize>,
    /// Threads that run the service's handlers. 0 (the default): handlers run inline on
    /// the loop that received the request. See `docs/tuning.md` for when to use a pool.
    pub handler_threads: usize,
}

impl Options {
    /// Options that listen on `addr`.
    pub fn listen(addr: SocketAddr) -> Options {
        Options {
            listen: Some(addr),
            ..Options::default()
        }
    }

    fn parts(
        &self,
        index: usize,
        jobs: Option<SyncSender<Job>>,
        accepted: &Arc<AtomicUsize>,
    ) -> LoopParts {
        LoopParts {
            service: self.service.clone(),
            rendezvous: self.rendezvous.clone(),
            jobs,
            index,
            allocator: self
                .allocator
                .clone()
                .unwrap_or_else(|| Arc::new(HeapAllocator::default())),
            zero_copy_min: self.zero_copy_min.unwrap_or(DEFAULT_ZERO_COPY_MIN),
            accepted: accepted.clone(),
        }
    }
}

/// How long a waiting thread spins before it parks (when not polling).
const WAIT_SPIN: Duration = Duration::from_micros(20);

/// Listen backlog of each loop's listener.
const BACKLOG: i32 = 1024;
/// Most recycled completions an embedded loop keeps for reuse.
const SPARES_KEPT: usize = 1024;

struct Inner {
    cfg: Arc<Config>,
    loops: Vec<Arc<LoopShared>>,
    stopped: AtomicBool,
}

/// The running event loops of one task.
pub struct Runtime {
    inner: Arc<Inner>,
    /// Handler threads, when the service runs on a pool.
    pool: Option<HandlerPool>,
    threads: Vec<JoinHandle<()>>,
    backend: Backend,
    local_addr: Option<SocketAddr>,
}

impl Runtime {
    /// Starts the loops. With `listen`, every loop listens on that address (port 0 picks
    /// one port for all of them; see [`local_addr`](Self::local_addr)) and answers the
    /// requests its accepted connections carry.
    pub fn start(config: Config, listen: Option<SocketAddr>) -> io::Result<Runtime> {
        Self::start_with(
            config,
            Options {
                listen,
                ..Options::default()
            },
        )
    }

    /// Starts the loops with a service, an allocator, or other [`Options`].
    pub fn start_with(config: Config, options: Options) -> io::Result<Runtime> {
        let listen = options.listen;
        let (backend, caps) = sys::select(config.backend)?;
        log::info!(
            "starwire: backend {backend}{}",
            if caps.is_some() { " (probed)" } else { "" }
        );
        let allowed = affinity::allowed_cpus()?;
        let n = config.loop_count(options.connections.unwrap_or(usize::MAX), allowed.len());
        let pins = if config.pin {
            Some(crate::config::pin_plan(n, &allowed).map_err(io::Error::other)?)
        } else {
            None
        };
        let mut listeners: Vec<Option<OwnedFd>> = Vec::with_capacity(n);
        let mut local_addr = None;
        if let Some(addr) = listen {
            let first = socket::listen_tcp(addr, BACKLOG)?;
            let bound = socket::local_addr(&first)?;
            local_addr = Some(bound);
            listeners.push(Some(first));
            for _ in 1..n {
                listeners.push(Some(socket::listen_tcp(bound, BACKLOG)?));
            }
        } else {
            listeners.resize_with(n, || None);
        }
        let cfg = Arc::new(config);
        let shared: Vec<Arc<LoopShared>> = (0..n)
            .map(|_| LoopShared::new().map(Arc::new))
            .collect::<io::Result<_>>()?;
        if let Some(r) = &options.rendezvous {
            r.attach(shared.clone());
        }
        let pool = match (&options.service, options.handler_threads) {
            (Some(service), n) if n > 0 => {
                Some(HandlerPool::start(n, service.clone(), shared.clone())?)
            }
            _ => None,
        };
        let inner = Arc::new(Inner {
            cfg: cfg.clone(),
            loops: shared.clone(),
            stopped: AtomicBool::new(false),
        });
        let mut rt = Runtime {
            inner,
            pool: None,
            threads: Vec::with_capacity(n),
            backend,
            local_addr,
        };
        let accepted = Arc::new(AtomicUsize::new(0));
        for (i, listener) in listeners.into_iter().enumerate() {
            let (ready_tx, ready_rx) = mpsc::channel::<io::Result<()>>();
            let cfg = cfg.clone();
            let sh = shared[i].clone();
            let cpu = pins.as_ref().map(|p| p[i]);
            let parts = options.parts(i, pool.as_ref().and_then(|p| p.sender()), &accepted);
            let thread = std::thread::Builder::new()
                .name(format!("starwire-loop-{i}"))
                .spawn(move || {
                    // Pin first, allocate second.
                    if let Some(cpu) = cpu {
                        if let Err(e) = affinity::pin_current_thread(cpu) {
                            let _ = ready_tx.send(Err(io::Error::other(format!(
                                "pinning loop {i} to CPU {cpu}: {e}"
                            ))));
                            return;
                        }
                    }
                    let mut lp = match Loop::new(cfg, sh, backend, listener, parts) {
                        Ok(lp) => lp,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    lp.run();
                })?;
            rt.threads.push(thread);
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(io::Error::other(format!("loop {i} died at start"))),
            }
        }
        rt.pool = pool;
        Ok(rt)
    }

    /// The address the loops listen on.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// The backend the loops run on.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Number of loops.
    pub fn loops(&self) -> usize {
        self.inner.loops.len()
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// A handle for the calling thread; completions are waited for with [`Handle::wait`].
    /// `capacity` bounds the requests it may have outstanding (rounded up to a power of
    /// two).
    pub fn handle(&self, capacity: usize) -> Handle {
        self.new_handle(capacity, None)
    }

    /// A handle whose completions run `callback` on the loop thread that completes them.
    /// The callback must be quick and must not block.
    pub fn handle_with_callback(&self, capacity: usize, callback: Callback) -> Handle {
        self.new_handle(capacity, Some(callback))
    }

    fn new_handle(&self, capacity: usize, callback: Option<Callback>) -> Handle {
        let waker = ThreadWaker::current();
        let mut lanes = Vec::with_capacity(self.inner.loops.len());
        let mut ring_capacity = 0;
        for shared in &self.inner.loops {
            let (req_tx, req_rx) = spsc::channel::<Request>(capacity.max(2));
            let (done_tx, done_rx) = spsc::channel::<Completion>(capacity.max(2));
            ring_capacity = req_tx.capacity();
            let endpoint = Endpoint {
                requests: req_rx,
                completions: done_tx,
                callback: callback.clone(),
                waker: waker.clone(),
            };
            match shared.new_endpoints.lock() {
                Ok(mut v) => v.push(endpoint),
                Err(p) => p.into_inner().push(endpoint),
            }
            shared.has_new_endpoints.store(true, Ordering::SeqCst);
            shared.wake();
            lanes.push(Lane {
                requests: req_tx,
                completions: done_rx,
            });
        }
        Handle {
            inner: self.inner.clone(),
            lanes,
            waker,
            callback: callback.is_some(),
            capacity: ring_capacity,
            outstanding: 0,
            next_tag: 1,
            done: Vec::with_capacity(ring_capacity),
            next_lane: 0,
            spares: Vec::new(),
        }
    }

    /// Sums every loop's counters.
    pub fn stats(&self) -> Stats {
        let mut s = Stats::default();
        for l in &self.inner.loops {
            s.add_loop(&l.counters);
        }
        s
    }

    /// Stops the loops: requests in flight or queued complete with [`Error::Shutdown`],
    /// connections and listeners are closed, threads are joined.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        for l in &self.inner.loops {
            l.stop.store(true, Ordering::SeqCst);
            l.parked.store(false, Ordering::SeqCst);
            l.doorbell.ring();
        }
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                log::error!("a starwire loop thread panicked");
            }
        }
        if let Some(mut pool) = self.pool.take() {
            pool.stop();
        }
        self.inner.stopped.store(true, Ordering::SeqCst);
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Lane {
    requests: Producer<Request>,
    completions: Consumer<Completion>,
}

/// A thread's way to submit requests. `Send` (it may move to another thread before use),
/// not `Sync`: one thread submits through it at a time.
pub struct Handle {
    inner: Arc<Inner>,
    lanes: Vec<Lane>,
    waker: Arc<ThreadWaker>,
    callback: bool,
    capacity: usize,
    outstanding: usize,
    next_tag: u64,
    done: Vec<Completion>,
    next_lane: u32,
    /// Vectors of recycled completions, for the next requests.
    spares: Vec<Spare>,
}

impl Handle {
    /// Sends a ping with `payload` bytes to `peer`. Returns the tag its completion will
    /// carry. The reply is [`Reply::Pong`](crate::Reply::Pong) with the round-trip time.
    pub fn ping(
        &mut self,
        peer: SocketAddr,
        payload: u32,
        deadline: Option<Instant>,
    ) -> Result<u64, Error> {
        self.submit(RequestOp::Ping { payload }, peer, deadline)
    }

    /// Reads variables `ids` from `peer`. The reply is [`Reply::Pulled`](crate::Reply::Pulled)
    /// with one tensor (or status) per id, in memory from the runtime's allocator.
    pub fn pull(
        &mut self,
        peer: SocketAddr,
        ids: Vec<u64>,
        deadline: Option<Instant>,
    ) -> Result<u64, Error> {
        self.submit(RequestOp::Pull { ids, alloc: None }, peer, deadline)
    }

    /// Like [`pull`](Self::pull), with the ids copied into a vector this handle keeps: with
    /// completions handed back through [`recycle`](Self::recycle), a steady stream of
    /// `pull_slice` / `wait` / `recycle` allocates nothing (tensors of at most
    /// [`Tensor::INLINE_MAX`] bytes from the default allocator live inside their `Tensor`).
    pub fn pull_slice(
        &mut self,
        peer: SocketAddr,
        ids: &[u64],
        deadline: Option<Instant>,
    ) -> Result<u64, Error> {
        let mut spare = self.spares.pop().unwrap_or_default();
        let op = RequestOp::Pull {
            ids: spare.take_ids(ids),
            alloc: None,
        };
        self.submit_with(op, peer, deadline, spare)
    }

    /// Like [`push`](Self::push), with the items (reference counts, not tensor bytes)
    /// copied into a vector this handle keeps; allocation-free with
    /// [`recycle`](Self::recycle), as [`pull_slice`](Self::pull_slice).
    pub fn push_slice(
        &mut self,
        peer: SocketAddr,
        items: &[(u64, Arc<Tensor>)],
        deadline: Option<Instant>,
    ) -> Result<u64, Error> {
        let mut spare = self.spares.pop().unwrap_or_default();
        let op = RequestOp::Push {
            items: spare.take_items(items),
        };
        self.submit_with(op, peer, deadline, spare)
    }

    /// Hands a completion back once its reply has been used: its vectors (the reply's, and
    /// those the request was submitted with) serve the next requests of this handle, so
    /// that they allocate nothing. Tensors still in the reply are dropped.
    pub fn recycle(&mut self, completion: Completion) {
        if self.spares.len() < self.capacity.max(1) {
            self.spares.push(completion.into_spare());
        }
    }

    /// Like [`pull`](Self::pull), with received tensors placed in memory from `alloc` — for
    /// instance buffers the caller already owns.
    pub fn pull_into(
        &mut self,
        peer: SocketAddr,
        ids: Vec<u64>,
        alloc: SharedAllocator,
        deadline: Option<Instant>,
    ) -> Result<u64, Error> {
        let op = RequestOp::Pull {
            ids,
            alloc: Some(alloc),
        };
        self.submit(op, peer, deadline)
    }

    /// Receives the tensor published under `key` in `peer`'s rendezvous for step `step`.
    /// Completes when it is published (before or after this request arrives). The reply is
    /// [`Reply::Received`](crate::Reply::Received) with one entry.
    pub fn recv(
        &mut self,
        peer: SocketAddr,
        step: u64,
        key: &[u8],
        deadline: Option<Instant>,
    ) -> Result<u64, Error> {
        let op = RequestOp::Recv {
            step,
            keys: vec![key.to_vec()],
        };
        self.submit(op, peer, deadline)
    }

    /// Receives many keys in one round trip (one `FUSED_RECV` frame). The peer sends each
    /// tensor as soon as it is published, so a late one does not hold back the others; the
    /// request completes when all have arrived, each with its own status.
    pub fn recv_many(
        &mut self,
        peer: SocketAddr,
        step: u64,
        keys: Vec<Vec<u8>>,
        deadline: Option<Instant>,
    ) -> Result<u64, Error> {
        if keys.is_empty() {
            return Err(Error::InvalidArgument);
        }
        self.submit(RequestOp::Recv { step, keys }, peer, deadline)
    }

    /// Delivers tensors (gradients) for variables to `peer`. Their bytes are sent from the
    /// tensors themselves (no copy above a small size), which the runtime holds until they
    /// are written. The reply is [`Reply::Pushed`](crate::Reply::Pushed), one status per
    /// item.
    pub fn push(
        &mut self,
        peer: SocketAddr,
        items: Vec<(u64, Arc<Tensor>)>,
        deadline: Option<Instant>,
    ) -> Result<u64, Error> {
        self.submit(RequestOp::Push { items }, peer, deadline)
    }

    fn submit(
        &mut self,
        op: RequestOp,
        peer: SocketAddr,
        deadline: Option<Instant>,
    ) -> Result<u64, Error> {
        let spare = self.spares.pop().unwrap_or_default();
        self.submit_with(op, peer, deadline, spare)
    }

    fn submit_with(
        &mut self,
        op: RequestOp,
        peer: SocketAddr,
        deadline: Option<Instant>,
        spare: Spare,
    ) -> Result<u64, Error> {
        if self.inner.stopped.load(Ordering::Acquire) {
            return Err(Error::Shutdown);
        }
        if !self.callback && self.outstanding >= self.capacity {
            return Err(Error::Backpressure);
        }
        let lanes = self.inner.cfg.connections_per_peer.max(1) as u32;
        let lane = self.next_lane % lanes;
        self.next_lane = self.next_lane.wrapping_add(1);
        let index = loop_for(peer, lane, self.lanes.len());
        let tag = self.next_tag;
        let req = Request {
            op,
            peer,
            lane,
            deadline,
            tag,
            spare,
        };
        if let Err(req) = self.lanes[index].requests.push(req) {
            self.spares.push(req.spare);
            return Err(Error::Backpressure);
        }
        self.next_tag += 1;
        self.outstanding += 1;
        self.inner.loops[index].wake();
        Ok(tag)
    }

    /// Moves every delivered completion into `done`.
    fn collect(&mut self) -> bool {
        let mut got = false;
        for lane in &mut self.lanes {
            while let Some(c) = lane.completions.pop() {
                self.done.push(c);
                got = true;
            }
        }
        got
    }

    fn take(&mut self, tag: Option<u64>) -> Option<Completion> {
        let i = match tag {
            Some(t) => self.done.iter().position(|c| c.tag == t)?,
            None if self.done.is_empty() => return None,
            None => 0,
        };
        self.outstanding -= 1;
        Some(self.done.swap_remove(i))
    }

    /// A completion if one is ready, without waiting.
    pub fn poll(&mut self) -> Option<Completion> {
        self.collect();
        self.take(None)
    }

    /// Waits for the completion of `tag`: spins for 20 µs (without end when polling), then
    /// parks until woken.
    pub fn wait(&mut self, tag: u64) -> Completion {
        self.wait_for(Some(tag))
    }

    /// Waits for any completion.
    pub fn wait_any(&mut self) -> Completion {
        self.wait_for(None)
    }

    fn wait_for(&mut self, tag: Option<u64>) -> Completion {
        let start = Instant::now();
        loop {
            self.collect();
            if let Some(c) = self.take(tag) {
                return c;
            }
            if self.callback || self.outstanding == 0 {
                // Nothing can arrive: callbacks consume completions, or none is owed.
                return Completion::new(tag.unwrap_or(0), Err(Error::InvalidArgument));
            }
            if self.inner.stopped.load(Ordering::Acquire) {
                // The loops are gone; whatever they did not answer never will be.
                self.collect();
                if let Some(c) = self.take(tag) {
                    return c;
                }
                self.outstanding -= 1;
                return Completion::new(tag.unwrap_or(0), Err(Error::Shutdown));
            }
            // Spin briefly (without end when polling), then park. Not the loop's spin budget:
            // where the caller shares a CPU with its loop, a long spin takes the CPU the loop
            // needs to bring the answer in (measured: docs/performance-log.md, run C).
            if self.inner.cfg.polling || start.elapsed() < WAIT_SPIN {
                core::hint::spin_loop();
                continue;
            }
            self.waker.prepare_park();
            let ready = self.lanes.iter().any(|l| !l.completions.is_empty());
            if !ready {
                self.waker.park(Some(Duration::from_millis(50)));
            }
            self.waker.clear_park();
        }
    }

    /// Requests submitted whose completion has not been taken yet.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }
}

/// The loop that owns the connection for `(peer, lane)`.
fn loop_for(peer: SocketAddr, lane: u32, loops: usize) -> usize {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    peer.hash(&mut h);
    lane.hash(&mut h);
    (h.finish() % loops as u64) as usize
}

/// A loop driven by the caller's own thread.
pub struct Embedded {
    lp: Loop,
    shared: Arc<LoopShared>,
    next_tag: u64,
    /// Vectors of recycled completions, for the next requests.
    spares: Vec<Spare>,
}

impl Embedded {
    /// A loop for the calling thread, listening on `listen` if given. Nothing runs until
    /// the caller calls [`poll`](Self::poll) (or [`wait`](Self::wait)).
    pub fn new(config: Config, listen: Option<SocketAddr>) -> io::Result<Embedded> {
        Self::with_options(
            config,
            Options {
                listen,
                ..Options::default()
            },
        )
    }

    /// A loop for the calling thread with a service, an allocator, or other [`Options`].
    pub fn with_options(config: Config, options: Options) -> io::Result<Embedded> {
        let listen = options.listen;
        let (backend, _) = sys::select(config.backend)?;
        let listener = match listen {
            Some(addr) => Some(socket::listen_tcp(addr, BACKLOG)?),
            None => None,
        };
        let shared = Arc::new(LoopShared::new()?);
        if let Some(r) = &options.rendezvous {
            r.attach(vec![shared.clone()]);
        }
        let lp = Loop::new(
            Arc::new(config),
            shared.clone(),
            backend,
            listener,
            options.parts(0, None, &Arc::new(AtomicUsize::new(0))),
        )?;
        Ok(Embedded {
            lp,
            shared,
            next_tag: 1,
            spares: Vec::new(),
        })
    }

    /// The address this loop listens on.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.lp.local_addr()
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.lp.backend()
    }

    /// Queues a ping; returns its tag. Nothing is sent before the next `poll`.
    pub fn ping(&mut self, peer: SocketAddr, payload: u32, deadline: Option<Instant>) -> u64 {
        self.local(RequestOp::Ping { payload }, peer, deadline)
    }

    /// Queues a pull; returns its tag.
    pub fn pull(&mut self, peer: SocketAddr, ids: Vec<u64>, deadline: Option<Instant>) -> u64 {
        self.local(RequestOp::Pull { ids, alloc: None }, peer, deadline)
    }

    /// Queues a pull of `ids`, copied into a vector this loop keeps; allocation-free with
    /// [`recycle`](Self::recycle), as [`Handle::pull_slice`].
    pub fn pull_slice(&mut self, peer: SocketAddr, ids: &[u64], deadline: Option<Instant>) -> u64 {
        let mut spare = self.spares.pop().unwrap_or_default();
        let op = RequestOp::Pull {
            ids: spare.take_ids(ids),
            alloc: None,
        };
        self.local_with(op, peer, deadline, spare)
    }

    /// Queues a push of `items`, copied into a vector this loop keeps; allocation-free with
    /// [`recycle`](Self::recycle), as [`Handle::push_slice`].
    pub fn push_slice(
        &mut self,
        peer: SocketAddr,
        items: &[(u64, Arc<Tensor>)],
        deadline: Option<Instant>,
    ) -> u64 {
        let mut spare = self.spares.pop().unwrap_or_default();
        let op = RequestOp::Push {
            items: spare.take_items(items),
        };
        self.local_with(op, peer, deadline, spare)
    }

    /// Hands a completion back once its reply has been used, as [`Handle::recycle`].
    pub fn recycle(&mut self, completion: Completion) {
        if self.spares.len() < SPARES_KEPT {
            self.spares.push(completion.into_spare());
        }
    }

    /// Queues a recv of `keys` (one or more); returns its tag.
    pub fn recv_many(
        &mut self,
        peer: SocketAddr,
        step: u64,
        keys: Vec<Vec<u8>>,
        deadline: Option<Instant>,
    ) -> u64 {
        self.local(RequestOp::Recv { step, keys }, peer, deadline)
    }

    /// Queues a push; returns its tag.
    pub fn push(
        &mut self,
        peer: SocketAddr,
        items: Vec<(u64, Arc<Tensor>)>,
        deadline: Option<Instant>,
    ) -> u64 {
        self.local(RequestOp::Push { items }, peer, deadline)
    }

    fn local(&mut self, op: RequestOp, peer: SocketAddr, deadline: Option<Instant>) -> u64 {
        let spare = self.spares.pop().unwrap_or_default();
        self.local_with(op, peer, deadline, spare)
    }

    fn local_with(
        &mut self,
        op: RequestOp,
        peer: SocketAddr,
        deadline: Option<Instant>,
        spare: Spare,
    ) -> u64 {
        let tag = self.next_tag;
        self.next_tag += 1;
        self.lp.submit_local(Request {
            op,
            peer,
            lane: 0,
            deadline,
            tag,
            spare,
        });
        tag
    }

    /// Runs the loop: everything ready now, or, when nothing is, waits up to `timeout` for
    /// I/O or a timer (`None`: no limit). Returns whether anything happened.
    pub fn poll(&mut self, timeout: Option<Duration>) -> bool {
        self.lp.poll_local(timeout)
    }

    /// The next completion, if any.
    pub fn completion(&mut self) -> Option<Completion> {
        self.lp.take_local()
    }

    /// Polls until the completion of `tag` arrives; completions of other tags that arrive
    /// meanwhile are dropped, so use it with one request at a time or use
    /// [`completion`](Self::completion).
    pub fn wait(&mut self, tag: u64) -> Completion {
        loop {
            while let Some(c) = self.lp.take_local() {
                if c.tag == tag {
                    return c;
                }
            }
            self.lp.poll_local(Some(Duration::from_millis(10)));
        }
    }

    /// This loop's counters.
    pub fn stats(&self) -> Stats {
        let mut s = Stats::default();
        s.add_loop(&self.shared.counters);
        s
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        self.lp.stop_local();
    }
}
