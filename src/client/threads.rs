//! The mode of a [`Handle`](super::Handle): loop threads of a [`Runtime`](crate::Runtime),
//! reached over single-producer rings; and the runtime's method that makes handles.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use crate::runtime;
use crate::session::{Callback, Completion, Request};
use crate::spsc::ThreadWaker;

use super::api::Client;
use super::mode::sealed::{Drive, Outgoing};
use super::mode::Mode;

/// How long a [`Handle`](crate::Handle) waiting for a completion spins before it parks (when not
/// polling). Not the loop's spin budget: where the caller shares a CPU with its loop, a
/// long spin takes the CPU the loop needs to bring the answer in (measured:
/// docs/performance-log.md, run C).
const HANDLE_WAIT_SPIN: Duration = Duration::from_micros(20);
/// Longest a parked [`Handle`](crate::Handle) sleeps before it looks again (a missed wake costs this).
const HANDLE_PARK_MAX: Duration = Duration::from_millis(50);
/// How often a [`Handle`](crate::Handle) used on another thread than at its first request looks for its
/// completions once it stops spinning (the loops wake the first thread).
const MOVED_HANDLE_POLL: Duration = Duration::from_micros(100);

/// The mode of a [`Handle`](crate::Handle): the runtime's loop threads, reached over rings.
pub struct Threads {
    pub(super) inner: Arc<runtime::Inner>,
    pub(super) lanes: Vec<runtime::Lane>,
    /// The loops' ends of the rings, handed over at first use: the loops then wake the
    /// thread that uses the handle, not the one that made it.
    pub(super) unregistered: Vec<runtime::LoopEnds>,
    pub(super) callback: Option<Callback>,
    /// The waker the loops ring, and the thread it wakes; set at first use.
    pub(super) waker: Option<(Arc<ThreadWaker>, ThreadId)>,
}

impl Client<Threads> {
    pub(crate) fn threads(
        inner: Arc<runtime::Inner>,
        lanes: Vec<runtime::Lane>,
        unregistered: Vec<runtime::LoopEnds>,
        capacity: usize,
        callback: Option<Callback>,
    ) -> Client<Threads> {
        let cfg = inner.cfg.clone();
        let has_callback = callback.is_some();
        Client::with_mode(
            Threads {
                inner,
                lanes,
                unregistered,
                callback,
                waker: None,
            },
            &cfg,
            capacity,
            has_callback,
            // As many as can be in flight: a full pipeline of recycled requests allocates
            // nothing.
            capacity,
        )
    }
}

impl Drive for Threads {
    fn send(&mut self, req: Outgoing) -> Result<(), Outgoing> {
        if self.waker.is_none() {
            let waker = ThreadWaker::current();
            let ends = std::mem::take(&mut self.unregistered);
            runtime::register(&self.inner, ends, self.callback.take(), &waker);
            self.waker = Some((waker, std::thread::current().id()));
        }
        let req = req.0;
        let index = runtime::loop_for(req.peer, req.lane, self.lanes.len());
        self.lanes[index].requests.push(req).map_err(Outgoing)?;
        self.inner.loops[index].wake();
        Ok(())
    }

    fn next(&mut self) -> Option<Completion> {
        self.lanes
            .iter_mut()
            .find_map(|lane| lane.completions.pop())
    }

    fn turn(&mut self) {}

    fn idle(&mut self, idle_since: &mut Instant) {
        if self.inner.cfg.polling || idle_since.elapsed() < HANDLE_WAIT_SPIN {
            // Yield rather than spin: the loop this handle waits for may share its CPU (a
            // pure spin there keeps the loop off it for the scheduler's time slice: about
            // 8 ms per round trip, docs/performance.md runs I11 and I12). With polling the
            // wait never parks.
            std::thread::yield_now();
            return;
        }
        let Some((waker, home)) = &self.waker else {
            // Nothing was ever submitted: nothing can arrive.
            core::hint::spin_loop();
            return;
        };
        if std::thread::current().id() != *home {
            // Moved to another thread after first use: the loops wake the first one, so
            // look again after a short sleep instead of parking until a wake.
            std::thread::park_timeout(MOVED_HANDLE_POLL);
            return;
        }
        waker.prepare_park();
        let ready = self.lanes.iter().any(|l| !l.completions.is_empty());
        if !ready && !self.stopped() {
            waker.park(Some(HANDLE_PARK_MAX));
        }
        waker.clear_park();
    }

    fn stopped(&self) -> bool {
        self.inner.stopped.load(Ordering::Acquire)
    }
}

impl Mode for Threads {}

// Handles are made here, beside the client they are, so that the runtime below does not
// import the client layer.
impl crate::Runtime {
    /// A handle for a trainer thread: the thread that submits its first request, which
    /// the loops then wake when its completions arrive (see [`Client::wait`]).
    /// `capacity` bounds the requests it may have outstanding (rounded up to a power of
    /// two).
    ///
    /// [`Client::wait`]: crate::Client::wait
    pub fn handle(&self, capacity: usize) -> Client<Threads> {
        self.new_handle(capacity, None)
    }

    /// A handle whose completions run `callback` on the loop thread that completes them
    /// (read them with the typed accessors, e.g. [`Completion::into_pulled`]); its waits
    /// have nothing to wait for. The callback must be quick and must not block.
    pub fn handle_with_callback(&self, capacity: usize, callback: Callback) -> Client<Threads> {
        self.new_handle(capacity, Some(callback))
    }

    fn new_handle(&self, capacity: usize, callback: Option<Callback>) -> Client<Threads> {
        let mut lanes = Vec::with_capacity(self.inner().loops.len());
        let mut loop_ends = Vec::with_capacity(self.inner().loops.len());
        let mut ring_capacity = 0;
        for _ in &self.inner().loops {
            let (req_tx, req_rx) = crate::spsc::channel::<Request>(capacity.max(2));
            let (done_tx, done_rx) = crate::spsc::channel::<Completion>(capacity.max(2));
            ring_capacity = req_tx.capacity();
            loop_ends.push((req_rx, done_tx));
            lanes.push(runtime::Lane {
                requests: req_tx,
                completions: done_rx,
            });
        }
        Client::threads(
            self.inner().clone(),
            lanes,
            loop_ends,
            ring_capacity,
            callback,
        )
    }
}
