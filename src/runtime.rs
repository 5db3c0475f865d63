//! Starting and stopping the event loops, and submitting requests to them.
//!
//! [`Runtime::start`] starts one loop thread per core it is given (see
//! [`Config::loop_count`]), each pinned first if asked, then building its state. A thread
//! that wants to send requests takes a [`Handle`]: per loop, a single-producer ring of
//! requests into the loop and one of completions back, so submitting takes no lock and
//! touches no line another submitter writes. A request goes to the loop that owns the
//! connection to its peer (a hash of peer and lane), which also answers it.
//!
//! [`Embedded`](crate::Embedded) is the same loop driven by the caller's own thread: no
//! loop threads, no rings, no cross-thread hop. Both are a [`Client`](crate::Client)
//! (`client.rs`). What start-up changed from what was asked is kept in a [`StartReport`];
//! what kept it from starting is a [`StartError`].

use std::fmt;
use std::hash::{Hash, Hasher};
use std::io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use crate::config::{BackendChoice, Config};
use crate::event_loop::{Loop, LoopParts, LoopShared};
use crate::pool::{HandlerPool, Job};
use crate::rendezvous::Rendezvous;
use crate::service::SharedService;
use crate::session::{Budget, Callback, Completion, HandleRings, Request, SessionParts};
use crate::spsc::{Consumer, Producer, ThreadWaker};
use crate::stats::Stats;
use crate::sys::{self, affinity, socket, Backend, IoFeatures};
use crate::tensor::{HeapAllocator, SharedAllocator};
use crate::upkeep::{Checkpoints, Upkeep};
use std::sync::mpsc::SyncSender;

pub use crate::config::DEFAULT_ZERO_COPY_MIN;

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
    /// Payload of at least this many bytes is received in place; `None`: the config's
    /// `zero_copy_min` (`STARWIRE_ZERO_COPY_MIN`, default [`DEFAULT_ZERO_COPY_MIN`]).
    pub zero_copy_min: Option<u64>,
    /// Connections this task expects (its peers times `connections_per_peer`). The
    /// default loop count is `min(16, connections)`, never more than the CPUs this process
    /// may run on; unknown (`None`): as many loops as allowed CPUs, at most 16.
    pub connections: Option<usize>,
    /// Threads that run the service's handlers; 0: handlers run inline on the loop that
    /// received the request. `None`: the config's `handler_threads`
    /// (`STARWIRE_HANDLER_THREADS`, default 0). See `docs/tuning.md` for when to use a pool.
    pub handler_threads: Option<usize>,
}

impl Options {
    /// Options that listen on `addr`.
    pub fn listen(addr: SocketAddr) -> Options {
        Options {
            listen: Some(addr),
            ..Options::default()
        }
    }

    pub(crate) fn parts(
        &self,
        cfg: &Config,
        index: usize,
        jobs: Option<SyncSender<Job>>,
        checkpoints: Result<Checkpoints, &'static str>,
        accepted: &Arc<AtomicUsize>,
        budget: &Arc<Budget>,
    ) -> LoopParts {
        let (checkpoints, no_checkpoints) = match checkpoints {
            Ok(c) => (Some(c), ""),
            Err(why) => (None, why),
        };
        LoopParts {
            session: SessionParts {
                service: self.service.clone(),
                rendezvous: self.rendezvous.clone(),
                jobs,
                index,
                allocator: self
                    .allocator
                    .clone()
                    .unwrap_or_else(|| Arc::new(HeapAllocator::default())),
                zero_copy_min: self.zero_copy_min.unwrap_or(cfg.zero_copy_min),
                budget: budget.clone(),
                checkpoints,
                no_checkpoints,
            },
            accepted: accepted.clone(),
        }
    }
}

/// Starts the upkeep thread when the service serves tables: the thread, and for the loops
/// where checkpoint requests go (or why they are refused).
#[allow(clippy::type_complexity)]
pub(crate) fn start_upkeep(
    cfg: &Config,
    options: &Options,
    loops: &[Arc<LoopShared>],
) -> Result<(Option<Upkeep>, Result<Checkpoints, &'static str>), StartError> {
    let Some(service) = options
        .service
        .as_ref()
        .filter(|s| !s.table_ids().is_empty())
    else {
        return Ok((None, Err("this task serves no tables to save")));
    };
    let upkeep = Upkeep::start(
        service.clone(),
        cfg.table_upkeep,
        cfg.checkpoint_dir.clone(),
        format!("{}:{}", cfg.job, cfg.task_index),
        loops.to_vec(),
    )
    .map_err(StartError::Thread)?;
    let checkpoints = match (&cfg.checkpoint_dir, upkeep.checkpoints()) {
        (Some(_), Some(c)) => Ok(c),
        _ => Err(
            "checkpoints are off on this task: it has no checkpoint directory \
                  (STARWIRE_CHECKPOINT_DIR)",
        ),
    };
    Ok((Some(upkeep), checkpoints))
}

/// Each table's line of the start-up report.
pub(crate) fn table_reports(service: &dyn crate::service::Service) -> Vec<String> {
    service
        .table_ids()
        .into_iter()
        .filter_map(|id| service.table(id)?.report())
        .collect()
}

/// Listen backlog of each loop's listener.
pub(crate) const BACKLOG: i32 = 1024;

pub(crate) struct Inner {
    pub(crate) cfg: Arc<Config>,
    pub(crate) loops: Vec<Arc<LoopShared>>,
    pub(crate) stopped: AtomicBool,
    /// The receive budget the loops share.
    pub(crate) budget: Arc<Budget>,
    /// Addresses of tasks that moved or left the cluster ([`Runtime::update_cluster`]).
    pub(crate) retired: std::sync::Mutex<crate::cluster::Retirements>,
}

/// A handle's pair of rings with one loop.
pub(crate) struct Lane {
    pub(crate) requests: Producer<Request>,
    pub(crate) completions: Consumer<Completion>,
}

/// The loop's ends of a handle's rings, until the handle is first used.
pub(crate) type LoopEnds = (Consumer<Request>, Producer<Completion>);

/// Hands a handle's ring ends to each loop, with the waker of the thread that waits.
pub(crate) fn register(
    inner: &Inner,
    ends: Vec<LoopEnds>,
    callback: Option<Callback>,
    waker: &Arc<ThreadWaker>,
) {
    for (shared, (requests, completions)) in inner.loops.iter().zip(ends) {
        let endpoint = HandleRings {
            requests,
            completions,
            callback: callback.clone(),
            waker: waker.clone(),
        };
        match shared.new_handles.lock() {
            Ok(mut v) => v.push(endpoint),
            Err(p) => p.into_inner().push(endpoint),
        }
        shared.has_new_endpoints.store(true, Ordering::SeqCst);
        shared.wake();
    }
}

/// The running event loops of one task.
pub struct Runtime {
    inner: Arc<Inner>,
    /// Handler threads, when the service runs on a pool.
    pool: Option<HandlerPool>,
    /// The tables' upkeep and checkpoints, when the service serves tables.
    upkeep: Option<Upkeep>,
    /// What the task serves (for its tables' metrics).
    service: Option<SharedService>,
    threads: Vec<JoinHandle<()>>,
    backend: Backend,
    local_addr: Option<SocketAddr>,
    report: StartReport,
}

impl Runtime {
    /// Starts the loops. With `listen`, every loop listens on that address (port 0 picks
    /// one port for all of them; see [`local_addr`](Self::local_addr)) and answers the
    /// requests its accepted connections carry.
    pub fn start(config: Config, listen: Option<SocketAddr>) -> Result<Runtime, StartError> {
        Self::start_with(
            config,
            Options {
                listen,
                ..Options::default()
            },
        )
    }

    /// Starts the loops with a service, an allocator, or other [`Options`]. What start-up
    /// chose differently from what was asked (fewer loops, a backend fallback, a loop left
    /// unpinned) is in [`report`](Self::report).
    pub fn start_with(config: Config, options: Options) -> Result<Runtime, StartError> {
        let listen = options.listen;
        let (backend, fallback) = select_backend(&config)?;
        let allowed = affinity::allowed_cpus().map_err(StartError::AllowedCpus)?;
        let n = config.loop_count(options.connections.unwrap_or(usize::MAX), allowed.len());
        let mut report = StartReport::new(backend, n, fallback);
        if let Some(asked) = config.loops {
            if asked > n {
                report.notes.push(StartNote::LoopsClamped {
                    asked,
                    allowed_cpus: allowed.len(),
                });
            }
        }
        let pins = if config.pin {
            Some(crate::config::pin_plan(n, &allowed).map_err(StartError::PinPlan)?)
        } else {
            None
        };
        let mut listeners: Vec<Option<OwnedFd>> = Vec::with_capacity(n);
        let mut local_addr = None;
        if let Some(addr) = listen {
            let listen_err = |source| StartError::Listen { addr, source };
            let first = socket::listen_tcp_exclusive(addr, BACKLOG, n > 1).map_err(listen_err)?;
            let bound = socket::local_addr(&first).map_err(listen_err)?;
            local_addr = Some(bound);
            listeners.push(Some(first));
            for _ in 1..n {
                let l =
                    socket::listen_tcp(bound, BACKLOG).map_err(|source| StartError::Listen {
                        addr: bound,
                        source,
                    })?;
                listeners.push(Some(l));
            }
        } else {
            listeners.resize_with(n, || None);
        }
        let cfg = Arc::new(config);
        let shared: Vec<Arc<LoopShared>> = (0..n)
            .map(|index| {
                LoopShared::new()
                    .map(Arc::new)
                    .map_err(|source| StartError::Loop { index, source })
            })
            .collect::<Result<_, _>>()?;
        let counters: Vec<_> = shared.iter().map(|l| l.counters.clone()).collect();
        crate::stats::PeerRegistry::link(&counters);
        if let Some(r) = &options.rendezvous {
            r.attach(shared.clone());
        }
        let threads = options.handler_threads.unwrap_or(cfg.handler_threads);
        let pool = match (&options.service, threads) {
            (Some(service), n) if n > 0 => Some(
                HandlerPool::start(n, service.clone(), shared.clone())
                    .map_err(StartError::HandlerPool)?,
            ),
            _ => None,
        };
        let (upkeep, checkpoints) = start_upkeep(&cfg, &options, &shared)?;
        report.tables = options
            .service
            .as_deref()
            .map(table_reports)
            .unwrap_or_default();
        let inner = Arc::new(Inner {
            cfg: cfg.clone(),
            loops: shared.clone(),
            stopped: AtomicBool::new(false),
            budget: Budget::of(&cfg),
            retired: Default::default(),
        });
        let mut rt = Runtime {
            inner,
            pool: None,
            upkeep: None,
            service: options.service.clone(),
            threads: Vec::with_capacity(n),
            backend,
            local_addr,
            report: StartReport::new(backend, n, None),
        };
        let accepted = Arc::new(AtomicUsize::new(0));
        for (i, listener) in listeners.into_iter().enumerate() {
            // Ok(Some(note)): the loop runs, but not pinned as asked.
            let (ready_tx, ready_rx) =
                mpsc::channel::<Result<(Option<StartNote>, IoFeatures), StartError>>();
            let cfg = cfg.clone();
            let sh = shared[i].clone();
            let cpu = pins.as_ref().map(|p| p[i]);
            let jobs = pool.as_ref().and_then(|p| p.sender());
            let parts = options.parts(
                &cfg,
                i,
                jobs,
                checkpoints.clone(),
                &accepted,
                &rt.inner.budget,
            );
            let thread = std::thread::Builder::new()
                .name(format!("starwire-loop-{i}"))
                .spawn(move || {
                    // Pin first, allocate second. A refused pin leaves the loop running
                    // where the scheduler puts it, and says so in the report.
                    let mut note = None;
                    if let Some(cpu) = cpu {
                        if let Err(e) = affinity::pin_current_thread(cpu) {
                            log::warn!("starwire: loop {i} not pinned to CPU {cpu}: {e}");
                            note = Some(StartNote::NotPinned {
                                index: i,
                                cpu,
                                reason: e.to_string(),
                            });
                        }
                    }
                    let mut lp = match Loop::new(cfg, sh, backend, listener, parts) {
                        Ok(lp) => lp,
                        Err(source) => {
                            let _ = ready_tx.send(Err(StartError::Loop { index: i, source }));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok((note, lp.io_features())));
                    lp.run();
                })
                .map_err(StartError::Thread)?;
            rt.threads.push(thread);
            match ready_rx.recv() {
                Ok(Ok((note, features))) => {
                    report.notes.extend(note);
                    if i == 0 {
                        report.features = features;
                    }
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(StartError::Loop {
                        index: i,
                        source: io::Error::other("the loop thread died at start"),
                    })
                }
            }
        }
        rt.report = report;
        rt.pool = pool;
        rt.upkeep = upkeep;
        Ok(rt)
    }

    /// What start-up chose: the backend, the number of loops and the kernel features in
    /// use, and in [`notes`](StartReport::notes) what it did differently from what was
    /// asked (fewer loops than asked for, for the CPUs this process may run on; a backend
    /// fallback; a loop left unpinned), empty when everything was as asked. `Display`
    /// prints one line of what runs, always, then one line per note: for an operator's
    /// log at start. To log only the differences, print the notes.
    pub fn report(&self) -> &StartReport {
        &self.report
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

    /// What the loops share with the handles.
    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// Sums every loop's counters.
    pub fn stats(&self) -> Stats {
        let mut s = Stats::default();
        for l in &self.inner.loops {
            s.add_loop(&l.counters);
        }
        s.add_budget(self.inner.budget.used(), self.inner.budget.refused());
        s
    }

    /// Takes a change of the cluster: `old` resolved the tasks this runtime has been sending
    /// to, `new` resolves them now (built from the new cluster spec or `.endpoint_map`).
    /// Tasks that moved or left have their old addresses retired on every loop: a request
    /// to one fails at once with [`ErrorKind::NotInCluster`](crate::ErrorKind::NotInCluster)
    /// (its message names the task and where it went), and connections to one are drained —
    /// the requests already on them finish, nothing new is sent — then closed. Peers
    /// resolved with `new` reach moved tasks at their new addresses over new connections;
    /// point a [`Sharded`](crate::Sharded) client at them with
    /// [`set_peers`](crate::Sharded::set_peers). An address a task of `new` has is not
    /// retired (a task may come back to it). Returns what changed; an error, and no
    /// change, when a task of either resolver cannot be resolved.
    pub fn update_cluster(
        &self,
        old: &crate::Resolver,
        new: &crate::Resolver,
    ) -> Result<crate::ClusterChange, crate::ResolveError> {
        let change = crate::ClusterChange::between(old, new)?;
        let tasks = new.tasks()?;
        let retired = {
            let mut r = self.inner.retired.lock().unwrap_or_else(|p| p.into_inner());
            crate::cluster::apply(&mut r, &change, &tasks);
            Arc::new(r.clone())
        };
        if !change.is_empty() {
            log::info!("cluster changed: {change}");
        }
        for l in &self.inner.loops {
            l.post_retired(retired.clone());
        }
        Ok(change)
    }

    /// Per-peer, per-operation metrics of every loop, merged by peer: requests by
    /// outcome, bytes, items, latency histograms. Takes no lock the loops take on their
    /// request path.
    pub fn metrics(&self) -> crate::stats::Metrics {
        let counters: Vec<&crate::stats::Counters> =
            self.inner.loops.iter().map(|l| &**l.counters).collect();
        crate::stats::Metrics::of(&counters)
    }

    /// The JSON document a `STATS` request is answered with (`docs/wire-format.md`,
    /// section 4.11): this task's [`stats`](Self::stats) totals and [`metrics`](Self::metrics),
    /// and the metrics of the tables its service serves.
    pub fn metrics_json(&self) -> String {
        let task = format!("{}:{}", self.inner.cfg.job, self.inner.cfg.task_index);
        let tables = (self.service.as_deref())
            .map(crate::service::table_metrics)
            .unwrap_or_default();
        self.metrics()
            .to_json_with_tables(&task, &self.stats(), &tables)
    }

    /// Stops the loops: requests in flight or queued complete with [`ErrorKind::Shutdown`](crate::ErrorKind::Shutdown),
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
        // A checkpoint being written is finished first.
        if let Some(mut upkeep) = self.upkeep.take() {
            upkeep.stop();
        }
        self.inner.stopped.store(true, Ordering::SeqCst);
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The loop that owns the connection for `(peer, lane)`.
pub(crate) fn loop_for(peer: SocketAddr, lane: u32, loops: usize) -> usize {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    peer.hash(&mut h);
    lane.hash(&mut h);
    (h.finish() % loops as u64) as usize
}

/// Chooses the backend as [`sys::select`] does, keeping why io_uring was not used when
/// `auto` fell back to epoll (the probe's error, or the features the ring lacks).
pub(crate) fn select_backend(config: &Config) -> Result<(Backend, Option<String>), StartError> {
    // Same size as the probe `sys::select` makes.
    const PROBE_ENTRIES: u32 = 8;
    let mut why = None;
    let (backend, _) = sys::select_with(config.backend, || {
        let ring = sys::uring::Ring::new(PROBE_ENTRIES);
        match &ring {
            Err(e) => why = Some(format!("io_uring unavailable: {e}")),
            Ok(r) => {
                let missing: Vec<&str> = r.capabilities().missing_required().collect();
                if !missing.is_empty() {
                    why = Some(format!("io_uring lacks {}", missing.join(", ")));
                }
            }
        }
        ring
    })
    .map_err(StartError::Backend)?;
    let fallback = match backend {
        Backend::Epoll if config.backend == BackendChoice::Auto => why,
        _ => None,
    };
    Ok((backend, fallback))
}

/// One thing start-up did differently from what was asked.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StartNote {
    /// More loops were asked for than the CPUs this process may run on; one loop per
    /// allowed CPU runs.
    LoopsClamped {
        /// Loops asked for (`NETWORK_*_CORE_NUMBER` or `ConfigBuilder::loops`).
        asked: usize,
        /// CPUs in this process's affinity mask.
        allowed_cpus: usize,
    },
    /// `auto` found io_uring unusable and runs on epoll.
    BackendFallback {
        /// Why io_uring was not used.
        reason: String,
    },
    /// Pinning was asked for but the kernel refused it for this loop, which runs unpinned.
    NotPinned {
        /// The loop.
        index: usize,
        /// The CPU it was to run on.
        cpu: usize,
        /// The kernel's answer.
        reason: String,
    },
}

impl fmt::Display for StartNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartNote::LoopsClamped {
                asked,
                allowed_cpus,
            } => write!(
                f,
                "{asked} event loops asked for, but this process may run on {allowed_cpus} \
                 CPUs: running {allowed_cpus}"
            ),
            StartNote::BackendFallback { reason } => {
                write!(f, "backend epoll instead of io_uring ({reason})")
            }
            StartNote::NotPinned { index, cpu, reason } => {
                write!(f, "loop {index} not pinned to CPU {cpu} ({reason})")
            }
        }
    }
}

/// What a runtime (or an embedded loop) started with, and what it did differently from
/// what was asked. `Display` gives a line of what runs (`starwire: 2 event loops on
/// uring (...)`), always, then one line per [note](StartReport::notes), for an operator's
/// log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartReport {
    backend: Backend,
    loops: usize,
    notes: Vec<StartNote>,
    features: IoFeatures,
    tables: Vec<String>,
}

impl StartReport {
    pub(crate) fn new(backend: Backend, loops: usize, fallback: Option<String>) -> StartReport {
        StartReport {
            backend,
            loops,
            notes: fallback
                .map(|reason| StartNote::BackendFallback { reason })
                .into_iter()
                .collect(),
            features: IoFeatures::default(),
            tables: Vec::new(),
        }
    }

    /// With the served tables' lines (see [`tables`](Self::tables)).
    pub(crate) fn with_tables(mut self, tables: Option<Vec<String>>) -> StartReport {
        self.tables = tables.unwrap_or_default();
        self
    }

    /// With the kernel features the loops' I/O uses.
    pub(crate) fn with_features(mut self, features: IoFeatures) -> StartReport {
        self.features = features;
        self
    }

    /// The optional kernel features the loops' I/O uses (those of the first loop: every
    /// loop probes the same kernel). All off on epoll.
    pub fn features(&self) -> IoFeatures {
        self.features
    }

    /// The backend the loops run on.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The number of loops running.
    pub fn loops(&self) -> usize {
        self.loops
    }

    /// What was done differently from what was asked; empty when everything was as asked.
    pub fn notes(&self) -> &[StartNote] {
        &self.notes
    }

    /// One line per table the service serves that reports itself ([`Table::report`]):
    /// its layout and what it got from the kernel (huge pages).
    ///
    /// [`Table::report`]: crate::Table::report
    pub fn tables(&self) -> &[String] {
        &self.tables
    }
}

impl fmt::Display for StartReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.loops == 1 { "" } else { "s" };
        write!(
            f,
            "starwire: {} event loop{s} on {}",
            self.loops, self.backend
        )?;
        if self.backend == Backend::Uring {
            write!(f, " ({})", self.features)?;
        }
        for note in &self.notes {
            write!(f, "\n  {note}")?;
        }
        for table in &self.tables {
            write!(f, "\n  {table}")?;
        }
        Ok(())
    }
}

/// Why a runtime or an embedded loop could not start: the setting or resource that
/// failed, and the system's error.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// The backend could not be set up (`STARWIRE_BACKEND`: a forced io_uring the kernel
    /// refuses, or an error that is not "unavailable", such as a memlock limit).
    Backend(io::Error),
    /// The CPUs this process may run on could not be read.
    AllowedCpus(io::Error),
    /// Pinning was asked for, with more loops than CPUs to pin them to.
    PinPlan(crate::config::PinPlanError),
    /// The listen address could not be bound (in use, not local, no permission).
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The system's error.
        source: io::Error,
    },
    /// A loop could not set up its state (its ring or epoll instance, doorbell, listener
    /// registration).
    Loop {
        /// The loop.
        index: usize,
        /// The system's error.
        source: io::Error,
    },
    /// A loop thread could not be started.
    Thread(io::Error),
    /// The handler pool's threads could not be started.
    HandlerPool(io::Error),
}

impl StartError {
    /// The system's error kind, e.g. [`io::ErrorKind::AddrInUse`] for a listen address in
    /// use.
    pub fn kind(&self) -> io::ErrorKind {
        self.io()
            .map_or(io::ErrorKind::InvalidInput, io::Error::kind)
    }

    /// The system error behind it (all but a pin plan that does not fit).
    fn io(&self) -> Option<&io::Error> {
        match self {
            StartError::Backend(e)
            | StartError::AllowedCpus(e)
            | StartError::Thread(e)
            | StartError::HandlerPool(e)
            | StartError::Listen { source: e, .. }
            | StartError::Loop { source: e, .. } => Some(e),
            StartError::PinPlan(_) => None,
        }
    }
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Backend(e) => write!(f, "backend: {e}"),
            StartError::AllowedCpus(e) => {
                write!(f, "reading the CPUs this process may run on: {e}")
            }
            StartError::PinPlan(e) => write!(f, "pinning the event loops: {e}"),
            StartError::Listen { addr, source } => write!(f, "listening on {addr}: {source}"),
            StartError::Loop { index, source } => {
                write!(f, "setting up event loop {index}: {source}")
            }
            StartError::Thread(e) => write!(f, "starting an event loop thread: {e}"),
            StartError::HandlerPool(e) => write!(f, "starting the handler pool: {e}"),
        }
    }
}

impl std::error::Error for StartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StartError::PinPlan(e) => Some(e),
            other => other.io().map(|e| e as _),
        }
    }
}

/// For callers that handle start-up with other I/O errors: keeps the kind, and the message
/// naming what failed.
impl From<StartError> for io::Error {
    fn from(e: StartError) -> io::Error {
        io::Error::new(e.kind(), e.to_string())
    }
}
