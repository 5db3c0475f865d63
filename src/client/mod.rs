//! The one way a trainer submits requests, whichever thread drives the loop.
//!
//! [`Client`] is one type over two modes:
//!
//! - [`Handle`] (`Client<Threads>`): the loops run on threads of a [`Runtime`]; requests
//!   travel over single-producer rings, completions come back the same way.
//! - [`Embedded`] (`Client<Local>`): one loop run by the caller's own thread; waiting for
//!   a completion is what drives it.
//!
//! One type rather than a trait the two implement: the bookkeeping a caller relies on
//! (tags, lanes over `connections_per_peer`, completions kept until taken, backpressure,
//! recycled vectors, typed waits) is written once, so the two modes cannot drift apart, and
//! calling a request method needs no trait import. Code for both modes is generic over the
//! mode: `fn step<M: Mode>(client: &mut Client<M>)`.
//!
//! Every request method takes the peer as `impl Into<Peer>` (a [`SocketAddr`] works) and
//! returns a [`Ticket`] typed by the request, or the [`Error`] that kept it from being
//! queued. [`Client::wait`] turns a ticket into the request's typed result: the tensors of
//! a pull, the round-trip time of a ping, the statuses of a push. [`Client::wait_any`] and
//! [`Client::poll`] hand out [`Completion`]s, whose typed accessors
//! ([`Completion::into_pulled`] and the like) do the same for the callback and
//! any-order paths. No wait drops another request's completion: it stays for a later
//! `wait`, `wait_any` or `poll`.
//!
//! [`Runtime`]: crate::Runtime

mod members;
mod metrics;
mod rows;
mod startup;
mod ticket;
mod trace;
mod wait_spin;

pub use startup::Unreachable;
pub use ticket::{Kind, Ping, Pull, PullRows, Push, Recv, RemoteStats, Ticket};
use wait_spin::WaitSpin;

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use crate::cluster::Peer;
use crate::config::Config;
use crate::error::{Error, ErrorKind};
use crate::event_loop::{Loop, LoopShared};
use crate::runtime::{self, Options, StartError, StartReport};
use crate::session::Spare;
use crate::session::{Budget, Callback, Completion, Reply, Request, RequestOp};
use crate::spsc::ThreadWaker;
use crate::stats::Stats;
use crate::sys::{socket, Backend};
use crate::tensor::{SharedAllocator, Tensor};
use crate::wire::Status;

/// The requests of a [`Runtime`](crate::Runtime)'s loop threads: a `Client` over
/// [`Threads`]. `Send`, not `Sync`: it may move to another thread; the loops wake the
/// thread that submitted its first request, so use it there once it has been used
/// (elsewhere its waits look every 100 µs instead of being woken).
pub type Handle = Client<Threads>;

/// A loop driven by the caller's own thread: a `Client` over [`Local`]. No loop threads,
/// no rings, no cross-thread hop; nothing runs unless the caller waits, polls or drives.
pub type Embedded = Client<Local>;

/// How long a [`Handle`] waiting for a completion spins before it parks (when not
/// polling). Not the loop's spin budget: where the caller shares a CPU with its loop, a
/// long spin takes the CPU the loop needs to bring the answer in (measured:
/// docs/performance-log.md, run C).
const HANDLE_WAIT_SPIN: Duration = Duration::from_micros(20);
/// Longest a parked [`Handle`] sleeps before it looks again (a missed wake costs this).
const HANDLE_PARK_MAX: Duration = Duration::from_millis(50);
/// How often a [`Handle`] used on another thread than at its first request looks for its
/// completions once it stops spinning (the loops wake the first thread).
const MOVED_HANDLE_POLL: Duration = Duration::from_micros(100);
/// Longest an [`Embedded`] loop parks in the kernel at once, so that a condition of
/// [`Client::run_until`] set by another thread is seen soon.
const LOCAL_PARK_MAX: Duration = Duration::from_millis(10);
/// Most recycled completions an embedded loop keeps for reuse.
const LOCAL_SPARES_KEPT: usize = 1024;

/// A copy of a completion's error for the lending accessors: an error that names its peer
/// and carries the remote message is not `Copy` (its message is shared, not copied).
fn owned(e: &Error) -> Error {
    e.clone()
}

// A full ring hands the request back by value, as the ring itself does: boxing it would
// allocate on every submission.
#[allow(clippy::result_large_err)]
mod sealed {
    use super::*;

    /// A request on its way to a mode (a wrapper: the request type is the crate's own).
    pub struct Outgoing(pub(crate) Request);

    /// What a mode does for its [`Client`]; not implementable outside the crate.
    pub trait Drive {
        /// Queues `req` on the loop that owns its `(peer, lane)`; gives it back when that
        /// loop's ring is full.
        fn send(&mut self, req: Outgoing) -> Result<(), Outgoing>;
        /// The next delivered completion, if any.
        fn next(&mut self) -> Option<Completion>;
        /// Runs the loop once if this thread drives it, without waiting.
        fn turn(&mut self);
        /// One step of waiting for something to arrive: spin or park, as the configured
        /// spin and polling settings say. `idle_since` is when waiting began, reset when
        /// anything happens.
        fn idle(&mut self, idle_since: &mut Instant);
        /// The loops are gone: whatever they did not complete never will be.
        fn stopped(&self) -> bool;
        /// A wait is about to idle for the first time.
        fn wait_begins(&mut self) {}
        /// A wait that had to idle ended after `took` (from its first idle step).
        fn waited(&mut self, _took: Duration) {}
    }

    /// Marks the request kinds a [`Ticket`] can name.
    pub trait Sealed {}
}

/// The two ways a [`Client`]'s requests reach a loop: [`Threads`] and [`Local`]. Sealed.
pub trait Mode: sealed::Drive {}
impl Mode for Threads {}
impl Mode for Local {}

/// Typed results of a finished request, for completions taken with
/// [`Client::wait_any`], [`Client::poll`], [`Client::wait_tag`] or given to a
/// [`Callback`](crate::Callback). Each fails with the request's error, or with
/// [`ErrorKind::OtherKind`] when the completion is of another kind of request.
impl Completion {
    /// A pull's tensors: per id, in order, the tensor or why there is none.
    pub fn into_pulled(self) -> Result<Vec<Result<Tensor, Status>>, Error> {
        match self.result? {
            Reply::Pulled(items) => Ok(items),
            _ => Err(Error::new(ErrorKind::OtherKind)),
        }
    }

    /// A recv's tensors: per key, in order, the tensor (possibly dead) or why there is
    /// none.
    pub fn into_received(self) -> Result<Vec<Result<Tensor, Status>>, Error> {
        match self.result? {
            Reply::Received(items) => Ok(items),
            _ => Err(Error::new(ErrorKind::OtherKind)),
        }
    }

    /// A rows pull's blocks: per table, in order.
    pub fn into_rows(self) -> Result<crate::session::PulledRows, Error> {
        match self.result? {
            Reply::Rows(rows) => Ok(rows),
            _ => Err(Error::new(ErrorKind::OtherKind)),
        }
    }

    /// A rows pull's blocks, lent, as [`pulled`](Self::pulled).
    pub fn rows(&self) -> Result<&crate::session::PulledRows, Error> {
        match &self.result {
            Ok(Reply::Rows(rows)) => Ok(rows),
            Ok(_) => Err(Error::new(ErrorKind::OtherKind)),
            Err(e) => Err(owned(e)),
        }
    }

    /// A push's statuses: per item, in order, how the service took it.
    pub fn into_pushed(self) -> Result<Vec<Status>, Error> {
        match self.result? {
            Reply::Pushed(statuses) => Ok(statuses),
            _ => Err(Error::new(ErrorKind::OtherKind)),
        }
    }

    /// A ping's round-trip time, measured by the loop from the request being queued on
    /// the connection to the pong being decoded.
    pub fn into_pong(self) -> Result<Duration, Error> {
        match self.result? {
            Reply::Pong { rtt, .. } => Ok(rtt),
            _ => Err(Error::new(ErrorKind::OtherKind)),
        }
    }

    /// A pull's tensors, lent: the completion can then go back through
    /// [`Client::recycle`], so that a steady stream of pulls allocates nothing.
    pub fn pulled(&self) -> Result<&[Result<Tensor, Status>], Error> {
        match &self.result {
            Ok(Reply::Pulled(items)) => Ok(items),
            Ok(_) => Err(Error::new(ErrorKind::OtherKind)),
            Err(e) => Err(owned(e)),
        }
    }

    /// A recv's tensors, lent, as [`pulled`](Self::pulled).
    pub fn received(&self) -> Result<&[Result<Tensor, Status>], Error> {
        match &self.result {
            Ok(Reply::Received(items)) => Ok(items),
            Ok(_) => Err(Error::new(ErrorKind::OtherKind)),
            Err(e) => Err(owned(e)),
        }
    }

    /// A push's statuses, lent, as [`pulled`](Self::pulled).
    pub fn pushed(&self) -> Result<&[Status], Error> {
        match &self.result {
            Ok(Reply::Pushed(statuses)) => Ok(statuses),
            Ok(_) => Err(Error::new(ErrorKind::OtherKind)),
            Err(e) => Err(owned(e)),
        }
    }
}

/// Submits requests and takes their completions; see the [module docs](self).
///
/// Requests are spread over the peer's `connections_per_peer` connections in turn. A
/// request's completion is kept until it is taken by [`wait`](Self::wait),
/// [`wait_tag`](Self::wait_tag), [`wait_any`](Self::wait_any) or [`poll`](Self::poll),
/// whichever comes first; waits never drop completions of other requests.
pub struct Client<M: Mode> {
    mode: M,
    /// The peer's connections requests are spread over (`connections_per_peer`).
    lanes: u32,
    next_lane: u32,
    /// Most requests outstanding at once (a Handle's ring size).
    capacity: usize,
    /// Completions go to a callback, never to this client.
    callback: bool,
    /// Tags submitted whose completion has not been taken.
    outstanding: Tags,
    /// Completions delivered while another was waited for, not yet taken.
    done: VecDeque<Completion>,
    /// Vectors of recycled completions, for the next requests.
    spares: Vec<Spare>,
    spares_kept: usize,
    /// Requests are stamped with their submit time (`STARWIRE_TRACE`).
    trace: bool,
    /// The sharded step requests are submitted for (0: none), for the trace.
    trace_step: u64,
}

impl<M: Mode> Client<M> {
    fn with_mode(
        mode: M,
        cfg: &Config,
        capacity: usize,
        callback: bool,
        spares_kept: usize,
    ) -> Client<M> {
        // Sized for the usual number in flight up front; they grow (once) past it.
        let expected = capacity.min(LOCAL_SPARES_KEPT);
        Client {
            mode,
            lanes: cfg.connections_per_peer.max(1) as u32,
            next_lane: 0,
            capacity,
            callback,
            outstanding: Tags::with_capacity(expected),
            done: VecDeque::with_capacity(expected),
            spares: Vec::new(),
            spares_kept: spares_kept.max(1),
            trace: cfg.trace,
            trace_step: 0,
        }
    }

    /// Sends a ping with `payload` bytes to `peer`; its result is the round-trip time.
    pub fn ping(
        &mut self,
        peer: impl Into<Peer>,
        payload: u32,
        deadline: Option<Instant>,
    ) -> Result<Ticket<Ping>, Error> {
        self.submit(RequestOp::Ping { payload }, peer.into(), deadline)
    }

    /// Reads variables `ids` from `peer`: per id, its tensor (in memory from the runtime's
    /// allocator) or why there is none.
    pub fn pull(
        &mut self,
        peer: impl Into<Peer>,
        ids: Vec<u64>,
        deadline: Option<Instant>,
    ) -> Result<Ticket<Pull>, Error> {
        self.submit(RequestOp::Pull { ids, alloc: None }, peer.into(), deadline)
    }

    /// Like [`pull`](Self::pull), with the ids copied into a vector this client keeps: with
    /// completions taken by [`wait_tag`](Self::wait_tag) and handed back through
    /// [`recycle`](Self::recycle), a steady stream of pulls allocates nothing (tensors of
    /// at most [`Tensor::INLINE_MAX`] bytes from the default allocator live inside their
    /// `Tensor`).
    pub fn pull_slice(
        &mut self,
        peer: impl Into<Peer>,
        ids: &[u64],
        deadline: Option<Instant>,
    ) -> Result<Ticket<Pull>, Error> {
        let mut spare = self.spares.pop().unwrap_or_default();
        let op = RequestOp::Pull {
            ids: spare.take_ids(ids),
            alloc: None,
        };
        self.submit_with(op, peer.into(), deadline, spare)
    }

    /// Like [`pull`](Self::pull), with received tensors placed in memory from `alloc` — for
    /// instance buffers the caller already owns.
    pub fn pull_into(
        &mut self,
        peer: impl Into<Peer>,
        ids: Vec<u64>,
        alloc: SharedAllocator,
        deadline: Option<Instant>,
    ) -> Result<Ticket<Pull>, Error> {
        let op = RequestOp::Pull {
            ids,
            alloc: Some(alloc),
        };
        self.submit(op, peer.into(), deadline)
    }

    /// Delivers tensors (gradients) for variables to `peer`; per item, how the service
    /// took it. Their bytes are sent from the tensors themselves (no copy above a small
    /// size), which the runtime holds until they are written.
    pub fn push(
        &mut self,
        peer: impl Into<Peer>,
        items: Vec<(u64, Arc<Tensor>)>,
        deadline: Option<Instant>,
    ) -> Result<Ticket<Push>, Error> {
        self.submit(RequestOp::Push { items }, peer.into(), deadline)
    }

    /// Like [`push`](Self::push), with the items (reference counts, not tensor bytes)
    /// copied into a vector this client keeps; allocation-free with
    /// [`recycle`](Self::recycle), as [`pull_slice`](Self::pull_slice).
    pub fn push_slice(
        &mut self,
        peer: impl Into<Peer>,
        items: &[(u64, Arc<Tensor>)],
        deadline: Option<Instant>,
    ) -> Result<Ticket<Push>, Error> {
        let mut spare = self.spares.pop().unwrap_or_default();
        let op = RequestOp::Push {
            items: spare.take_items(items),
        };
        self.submit_with(op, peer.into(), deadline, spare)
    }

    /// Receives the tensor published under `key` in `peer`'s rendezvous for step `step`.
    /// Completes when it is published (before or after this request arrives), with one
    /// entry.
    pub fn recv(
        &mut self,
        peer: impl Into<Peer>,
        step: u64,
        key: &[u8],
        deadline: Option<Instant>,
    ) -> Result<Ticket<Recv>, Error> {
        let op = RequestOp::Recv {
            step,
            keys: vec![key.to_vec()],
        };
        self.submit(op, peer.into(), deadline)
    }

    /// Receives many keys in one round trip (one `FUSED_RECV` frame). The peer sends each
    /// tensor as soon as it is published, so a late one does not hold back the others; the
    /// request completes when all have arrived, each with its own status. No keys:
    /// [`ErrorKind::InvalidArgument`].
    pub fn recv_many(
        &mut self,
        peer: impl Into<Peer>,
        step: u64,
        keys: Vec<Vec<u8>>,
        deadline: Option<Instant>,
    ) -> Result<Ticket<Recv>, Error> {
        if keys.is_empty() {
            return Err(Error::new(ErrorKind::InvalidArgument));
        }
        self.submit(RequestOp::Recv { step, keys }, peer.into(), deadline)
    }

    fn submit<K>(
        &mut self,
        op: RequestOp,
        peer: Peer,
        deadline: Option<Instant>,
    ) -> Result<Ticket<K>, Error> {
        let spare = self.spare();
        self.submit_with(op, peer, deadline, spare)
    }

    /// A request's submit time and step, read only when tracing.
    #[inline]
    fn stamp(&self) -> crate::session::Stamp {
        if !self.trace {
            return crate::session::Stamp::default();
        }
        crate::session::Stamp {
            submitted: Some(Instant::now()),
            step: self.trace_step,
        }
    }

    /// Vectors of a finished request, for a new one.
    pub(crate) fn spare(&mut self) -> Spare {
        self.spares.pop().unwrap_or_default()
    }

    /// Keeps the vectors of a request that was not submitted.
    pub(crate) fn recycle_spare(&mut self, spare: Spare) {
        if self.spares.len() < self.spares_kept {
            self.spares.push(spare);
        }
    }

    pub(crate) fn submit_with<K>(
        &mut self,
        op: RequestOp,
        peer: Peer,
        deadline: Option<Instant>,
        spare: Spare,
    ) -> Result<Ticket<K>, Error> {
        let refused = if self.mode.stopped() {
            Some(Error::new(ErrorKind::Shutdown))
        } else if !self.callback && self.outstanding.len() >= self.capacity {
            Some(Error::new(ErrorKind::Backpressure))
        } else {
            None
        };
        if let Some(e) = refused {
            self.spares.push(spare);
            return Err(e);
        }
        let lane = self.next_lane % self.lanes;
        let tag = self.outstanding.insert();
        let req = Request {
            op,
            peer: peer.addr(),
            lane,
            deadline,
            tag,
            spare,
            trace: self.stamp(),
        };
        if let Err(sealed::Outgoing(req)) = self.mode.send(sealed::Outgoing(req)) {
            self.outstanding.remove(tag);
            self.spares.push(req.spare);
            return Err(Error::new(ErrorKind::Backpressure));
        }
        self.next_lane = self.next_lane.wrapping_add(1);
        if self.callback {
            // Completions go to the callback: nothing to wait for. The tag stays unique
            // among this client's requests (its generation moves on).
            self.outstanding.remove(tag);
        }
        Ok(Ticket {
            tag,
            kind: PhantomData,
        })
    }

    /// Waits for the request of `ticket` and gives its typed result. Completions of other
    /// requests that arrive meanwhile are kept. A ticket whose completion was already
    /// taken (by [`wait_any`](Self::wait_any) or [`poll`](Self::poll)), or one of a
    /// callback client: [`ErrorKind::NotOutstanding`] at once.
    pub fn wait<K: Kind>(&mut self, ticket: Ticket<K>) -> Result<K::Output, Error> {
        let mut c = self.wait_tag(ticket.tag)?;
        // The request's own vectors serve the next requests; the reply's go to the caller.
        let spare = std::mem::take(&mut c.spare);
        if self.spares.len() < self.spares_kept {
            self.spares.push(spare);
        }
        K::output(c)
    }

    /// Waits for the completion tagged `tag`, keeping those of other requests that arrive
    /// meanwhile. Waiting spins, then parks; with the `polling` setting it busy-polls. An
    /// [`Embedded`] loop is run meanwhile, spinning for the `spin` budget before it parks
    /// in the kernel, or for twice its recent waits' average when that is longer (up to
    /// 250 µs; a `spin` of 0 parks at once); a [`Handle`] spins 20 µs (its loop needs the
    /// CPU more) before it parks until its loop wakes it. A tag that is not outstanding
    /// (never submitted, already taken, or submitted through a callback client):
    /// [`ErrorKind::NotOutstanding`] at once, never a hang.
    pub fn wait_tag(&mut self, tag: u64) -> Result<Completion, Error> {
        if !self.outstanding.contains(tag) {
            return Err(Error::new(ErrorKind::NotOutstanding));
        }
        Ok(self.wait_for(Some(tag)))
    }

    /// Waits for the next completion of any outstanding request. None outstanding (or a
    /// callback client): [`ErrorKind::NotOutstanding`] at once.
    pub fn wait_any(&mut self) -> Result<Completion, Error> {
        if self.outstanding.is_empty() {
            return Err(Error::new(ErrorKind::NotOutstanding));
        }
        Ok(self.wait_for(None))
    }

    /// A completion if one is ready, without waiting (an [`Embedded`] loop runs once).
    pub fn poll(&mut self) -> Option<Completion> {
        self.mode.turn();
        if let Some(c) = self.take(None) {
            return Some(c);
        }
        let c = self.mode.next()?;
        self.outstanding.remove(c.tag);
        Some(c)
    }

    /// Hands a completion back once its reply has been used: its vectors (the reply's, and
    /// those the request was submitted with) serve the next requests of this client, so
    /// that they allocate nothing. Tensors still in the reply are dropped, except the
    /// blocks of a rows pull: the memory of up to two of them (of at most 1 MiB each) is
    /// kept for the blocks of the next rows pulls that use the runtime's allocator (not
    /// [`pull_rows_into`](Self::pull_rows_into)'s), so a steady stream of them allocates
    /// nothing either. Take a block out first ([`PulledRows::take_block`](crate::session::PulledRows::take_block)) to keep it.
    pub fn recycle(&mut self, completion: Completion) {
        if self.spares.len() < self.spares_kept {
            self.spares.push(completion.into_spare());
        }
    }

    /// Requests submitted whose completion has not been taken yet (0 for a callback
    /// client).
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    fn wait_for(&mut self, tag: Option<u64>) -> Completion {
        // Read the clock only once there is nothing to take.
        let mut idle_since: Option<Instant> = None;
        let mut started: Option<Instant> = None;
        loop {
            if let Some(c) = self.take(tag) {
                return c;
            }
            // Fresh completions, one at a time: the one waited for goes straight back, the
            // others are kept for later waits.
            while let Some(c) = self.mode.next() {
                if tag.map_or(true, |t| t == c.tag) {
                    self.outstanding.remove(c.tag);
                    if let (Some(start), Some(end)) = (started, idle_since) {
                        // The last idle step stamped when it saw progress: no clock read.
                        self.mode.waited(end.saturating_duration_since(start));
                    }
                    return c;
                }
                self.done.push_back(c);
            }
            if self.mode.stopped() {
                // The loops are gone; whatever they did not answer never will be.
                if let Some(c) = self.mode.next() {
                    self.done.push_back(c);
                    continue;
                }
                let t = match tag {
                    Some(t) => t,
                    None => self.outstanding.any().expect("checked by the caller"),
                };
                self.outstanding.remove(t);
                return Completion::new(t, Err(Error::new(ErrorKind::Shutdown)));
            }
            let since = idle_since.get_or_insert_with(Instant::now);
            if started.is_none() {
                started = Some(*since);
                self.mode.wait_begins();
            }
            self.mode.idle(since);
        }
    }

    /// Takes a kept completion of `tag` (any, for `None`).
    fn take(&mut self, tag: Option<u64>) -> Option<Completion> {
        if self.done.is_empty() {
            return None;
        }
        let i = match tag {
            Some(t) => self.done.iter().position(|c| c.tag == t)?,
            None => 0,
        };
        // In order of arrival.
        let c = self.done.remove(i)?;
        self.outstanding.remove(c.tag);
        Some(c)
    }
}

/// The tags of a client's outstanding requests: a slot index and a generation, so that
/// telling whether a tag is outstanding, taking one and giving one back are O(1) and
/// allocate nothing once the table has grown to the most requests ever in flight. A tag
/// of a finished request is never outstanding again (its slot's generation moved on).
struct Tags {
    /// Per slot: its generation, odd while a request holds it.
    generations: Vec<u32>,
    free: Vec<u32>,
    live: usize,
}

impl Tags {
    fn with_capacity(n: usize) -> Tags {
        Tags {
            generations: Vec::with_capacity(n),
            free: Vec::with_capacity(n),
            live: 0,
        }
    }

    /// A new outstanding tag.
    fn insert(&mut self) -> u64 {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.generations.push(0);
                (self.generations.len() - 1) as u32
            }
        };
        let g = &mut self.generations[slot as usize];
        *g = g.wrapping_add(1);
        self.live += 1;
        (u64::from(slot) << 32) | u64::from(*g)
    }

    fn contains(&self, tag: u64) -> bool {
        let (slot, g) = ((tag >> 32) as usize, tag as u32);
        g % 2 == 1 && self.generations.get(slot) == Some(&g)
    }

    /// Takes `tag` out, if it is outstanding.
    fn remove(&mut self, tag: u64) {
        if self.contains(tag) {
            let slot = (tag >> 32) as u32;
            let g = &mut self.generations[slot as usize];
            *g = g.wrapping_add(1);
            self.free.push(slot);
            self.live -= 1;
        }
    }

    /// Some outstanding tag.
    fn any(&self) -> Option<u64> {
        let slot = self.generations.iter().position(|g| g % 2 == 1)?;
        Some(((slot as u64) << 32) | u64::from(self.generations[slot]))
    }

    fn len(&self) -> usize {
        self.live
    }

    fn is_empty(&self) -> bool {
        self.live == 0
    }
}

/// The mode of a [`Handle`]: the runtime's loop threads, reached over rings.
pub struct Threads {
    inner: Arc<runtime::Inner>,
    lanes: Vec<runtime::Lane>,
    /// The loops' ends of the rings, handed over at first use: the loops then wake the
    /// thread that uses the handle, not the one that made it.
    unregistered: Vec<runtime::LoopEnds>,
    callback: Option<Callback>,
    /// The waker the loops ring, and the thread it wakes; set at first use.
    waker: Option<(Arc<ThreadWaker>, ThreadId)>,
}

impl Client<Threads> {
    pub(crate) fn threads(
        inner: Arc<runtime::Inner>,
        lanes: Vec<runtime::Lane>,
        unregistered: Vec<runtime::LoopEnds>,
        capacity: usize,
        callback: Option<Callback>,
    ) -> Handle {
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

impl sealed::Drive for Threads {
    fn send(&mut self, req: sealed::Outgoing) -> Result<(), sealed::Outgoing> {
        if self.waker.is_none() {
            let waker = ThreadWaker::current();
            let ends = std::mem::take(&mut self.unregistered);
            runtime::register(&self.inner, ends, self.callback.take(), &waker);
            self.waker = Some((waker, std::thread::current().id()));
        }
        let req = req.0;
        let index = runtime::loop_for(req.peer, req.lane, self.lanes.len());
        self.lanes[index]
            .requests
            .push(req)
            .map_err(sealed::Outgoing)?;
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

/// The mode of a [`Embedded`] client: one loop, run by the caller's thread.
pub struct Local {
    lp: Loop,
    shared: Arc<LoopShared>,
    cfg: Arc<Config>,
    report: StartReport,
    budget: Arc<Budget>,
    /// Addresses of tasks that moved or left the cluster (`update_cluster`).
    retired: crate::cluster::Retirements,
    /// How long its waits spin before they park (see [`WaitSpin`]).
    spin: WaitSpin,
    /// A wait is under way and has not parked yet: it spins the [`WaitSpin`] budget; after
    /// a park, and outside waits (a loop that serves), the spin setting.
    fresh_wait: bool,
}

impl sealed::Drive for Local {
    fn send(&mut self, req: sealed::Outgoing) -> Result<(), sealed::Outgoing> {
        self.lp.submit_local(req.0);
        Ok(())
    }

    fn next(&mut self) -> Option<Completion> {
        self.lp.take_local()
    }

    fn turn(&mut self) {
        self.lp.poll_local(Some(Duration::ZERO));
    }

    fn idle(&mut self, idle_since: &mut Instant) {
        // As the loop threads run themselves: busy-poll when polling, else spin for the
        // spin budget while nothing happens, then park in the kernel. A wait that has not
        // parked yet spins as long as this client's waits have been taking.
        if self.lp.poll_local(Some(Duration::ZERO)) {
            *idle_since = Instant::now();
            return;
        }
        let budget = if self.fresh_wait {
            self.spin.budget(self.cfg.spin)
        } else {
            self.cfg.spin
        };
        if self.cfg.polling || idle_since.elapsed() < budget {
            core::hint::spin_loop();
            return;
        }
        self.fresh_wait = false;
        self.lp.poll_local(Some(LOCAL_PARK_MAX));
        *idle_since = Instant::now();
    }

    fn wait_begins(&mut self) {
        self.fresh_wait = true;
    }

    fn waited(&mut self, took: Duration) {
        self.fresh_wait = false;
        self.spin.observe(took);
    }

    fn stopped(&self) -> bool {
        false
    }
}

impl Client<Local> {
    /// A loop for the calling thread, listening on `listen` if given. Nothing runs until
    /// the caller waits, polls or drives it.
    pub fn new(config: Config, listen: Option<SocketAddr>) -> Result<Embedded, StartError> {
        Self::with_options(
            config,
            Options {
                listen,
                ..Options::default()
            },
        )
    }

    /// A loop for the calling thread with a service, an allocator, or other [`Options`].
    pub fn with_options(config: Config, options: Options) -> Result<Embedded, StartError> {
        let (backend, fallback) = runtime::select_backend(&config)?;
        let listener = match options.listen {
            Some(addr) => Some(
                socket::listen_tcp_exclusive(addr, runtime::BACKLOG, false)
                    .map_err(|source| StartError::Listen { addr, source })?,
            ),
            None => None,
        };
        let loop_err = |source| StartError::Loop { index: 0, source };
        let shared = Arc::new(LoopShared::new().map_err(loop_err)?);
        if let Some(r) = &options.rendezvous {
            r.attach(vec![shared.clone()]);
        }
        let cfg = Arc::new(config);
        let budget = Budget::of(&cfg);
        let lp = Loop::new(
            cfg.clone(),
            shared.clone(),
            backend,
            listener,
            options.parts(&cfg, 0, None, &Arc::new(AtomicUsize::new(0)), &budget),
        )
        .map_err(loop_err)?;
        // The fallback was logged where it was decided.
        let report = StartReport::new(backend, 1, fallback).with_features(lp.io_features());
        let local = Local {
            lp,
            shared,
            cfg: cfg.clone(),
            report,
            budget,
            retired: Default::default(),
            spin: WaitSpin::default(),
            fresh_wait: false,
        };
        Ok(Client::with_mode(
            local,
            &cfg,
            usize::MAX,
            false,
            LOCAL_SPARES_KEPT,
        ))
    }

    /// The address this loop listens on.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.mode.lp.local_addr()
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.mode.lp.backend()
    }

    /// What start-up chose differently from what was asked (a backend fallback), for the
    /// caller to print.
    pub fn report(&self) -> &StartReport {
        &self.mode.report
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.mode.cfg
    }

    /// Runs the loop once: everything ready now, or, when nothing is, waits up to `timeout`
    /// for I/O or a timer (`None`: no limit). Returns whether anything happened. Waits
    /// drive the loop themselves; this is for a loop that serves, or several loops on one
    /// thread.
    pub fn drive(&mut self, timeout: Option<Duration>) -> bool {
        self.mode.lp.poll_local(timeout)
    }

    /// Runs the loop — spinning, then parking, as the configured spin and polling settings
    /// say — until `stop` returns true; `stop` is asked after every step (at least every
    /// few milliseconds). For a loop that serves: `run_until(|_| flag.load(..))`.
    pub fn run_until(&mut self, mut stop: impl FnMut(&mut Embedded) -> bool) {
        // Not a wait: the spin setting, whatever this client's waits have been taking.
        self.mode.fresh_wait = false;
        let mut idle_since = Instant::now();
        while !stop(self) {
            sealed::Drive::idle(&mut self.mode, &mut idle_since);
        }
    }

    /// This loop's counters.
    pub fn stats(&self) -> Stats {
        let mut s = Stats::default();
        s.add_loop(&self.mode.shared.counters);
        s.add_budget(self.mode.budget.used(), self.mode.budget.refused());
        s
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        self.lp.stop_local();
    }
}

// Handles are made here, beside the client they are, so that the runtime below does not
// import the client layer.
impl crate::Runtime {
    /// A handle for a trainer thread: the thread that submits its first request, which
    /// the loops then wake when its completions arrive (see [`Client::wait`]).
    /// `capacity` bounds the requests it may have outstanding (rounded up to a power of
    /// two).
    ///
    /// [`Client::wait`]: crate::Client::wait
    pub fn handle(&self, capacity: usize) -> Handle {
        self.new_handle(capacity, None)
    }

    /// A handle whose completions run `callback` on the loop thread that completes them
    /// (read them with the typed accessors, e.g. [`Completion::into_pulled`]); its waits
    /// have nothing to wait for. The callback must be quick and must not block.
    pub fn handle_with_callback(&self, capacity: usize, callback: Callback) -> Handle {
        self.new_handle(capacity, Some(callback))
    }

    fn new_handle(&self, capacity: usize, callback: Option<Callback>) -> Handle {
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
        Handle::threads(
            self.inner().clone(),
            lanes,
            loop_ends,
            ring_capacity,
            callback,
        )
    }
}
