//! [`Client`]: the requests of either mode, their tags, and the waits that take their
//! completions.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Instant;

use crate::cluster::Peer;
use crate::config::Config;
use crate::error::{Error, ErrorKind};
use crate::session::{Completion, Request, RequestOp, Spare};
use crate::tensor::{SharedAllocator, Tensor};

use super::mode::sealed::Outgoing;
use super::mode::Mode;
use super::ticket::{Kind, Ping, Pull, Push, Recv, Ticket};

/// Most recycled completions an embedded loop keeps for reuse.
pub(super) const LOCAL_SPARES_KEPT: usize = 1024;

/// Submits requests and takes their completions; see the [module docs](crate::client).
///
/// Requests are spread over the peer's `connections_per_peer` connections in turn (of a
/// [`Handle`](crate::Handle), over the loops they map to; of an
/// [`Embedded`](crate::Embedded), all on its loop). A connection is opened when a request
/// first needs it, with `TCP_NODELAY` set (Nagle's algorithm off: a small request goes out
/// at once), as accepted connections have it too. A request's completion is kept until it
/// is taken by [`wait`](Self::wait), [`wait_tag`](Self::wait_tag),
/// [`wait_any`](Self::wait_any) or [`poll`](Self::poll), whichever comes first; waits
/// never drop completions of other requests.
///
/// # Waiting
///
/// Every wait ([`wait`](Self::wait), [`wait_tag`](Self::wait_tag),
/// [`wait_any`](Self::wait_any)) spins, then parks; with the `polling` setting it
/// busy-polls. An [`Embedded`](crate::Embedded) loop is run meanwhile, spinning for the
/// `spin` budget before it parks in the kernel, or for twice its recent waits' average when
/// that is longer (up to 250 µs; a `spin` of 0 parks at once); a
/// [`Handle`](crate::Handle) spins 20 µs (its loop needs the CPU more) before it parks
/// until its loop wakes it.
///
/// # Unreachable peers
///
/// A request to a peer with no open connection waits for one: a connect attempt, and after
/// a failed attempt (the system's answer: refused, no route to host) another, up to
/// `connect_retries` times, retry `n` (from 0) after
/// [`connect_delay`](crate::Config::connect_delay)`(n)`: `connect_backoff` doubled per
/// retry, at most 2 s. With the defaults (`STARWIRE_CONNECT_RETRIES` 8,
/// `STARWIRE_CONNECT_BACKOFF_MS` 10) the retries wait 10, 20, 40, 80, 160, 320, 640 and
/// 1280 ms, 2.55 s in all ([`Config::connect_retry_wait`](crate::Config::connect_retry_wait)).
/// An attempt the peer does not answer at all is given up after `handshake_timeout`
/// (`STARWIRE_HANDSHAKE_TIMEOUT_MS`, 5 s), without more retries.
///
/// So a request with no deadline to a peer that cannot be reached fails with
/// [`ErrorKind::ConnectFailed`] after about 2.55 s when nothing listens at its address,
/// after 5 s when its host does not answer, and in any case within 47.55 s (2.55 s plus
/// 5 s for each of the 9 attempts: [`Config::connect_give_up_bound`](crate::Config::connect_give_up_bound)).
/// The error says where, how often, for how long and why:
/// `could not connect to ps:1 (10.0.0.2:5555) after 9 attempts over 2.6 s: connection
/// refused` ([`Error::task`], [`Error::os_error`], [`Error::connect_attempts`]). The next
/// request to that peer starts over.
///
/// A deadline cuts the schedule short: the request fails at its deadline with
/// [`ErrorKind::Timeout`], saying it was still connecting and why the last attempt failed
/// (`deadline exceeded while connecting to ps:1 (10.0.0.2:5555): connection refused
/// (attempt 3)`); the connection goes on trying for the requests still waiting for it.
/// A peer is named by its task where the request's [`Peer`] was resolved from a task name
/// (or from an address the cluster has a task at), or once a handshake named it; else by
/// its address.
pub struct Client<M: Mode> {
    pub(super) mode: M,
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
    pub(super) trace: bool,
    /// The sharded step requests are submitted for (0: none), for the trace.
    pub(super) trace_step: u64,
}

impl<M: Mode> Client<M> {
    pub(super) fn with_mode(
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

    /// Sends a ping with `payload` bytes to `peer`; its result is the round-trip time
    /// (with the echoed payload size: [`Completion::pong`], through
    /// [`wait_tag`](Self::wait_tag)).
    ///
    /// `deadline`: when to give up (then [`ErrorKind::Timeout`]); `None` waits for the
    /// answer, or for the connect-retry schedule to fail (about 2.55 s with the defaults
    /// when nothing listens at the peer, at most 47.55 s; see
    /// [Unreachable peers](Self#unreachable-peers)).
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
    ///
    /// `deadline`: when to give up (then [`ErrorKind::Timeout`]); `None` waits for the
    /// answer, or for the connect-retry schedule to fail (about 2.55 s with the defaults
    /// when nothing listens at the peer, at most 47.55 s; see
    /// [Unreachable peers](Self#unreachable-peers)).
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
    ///
    /// `deadline`: when to give up (then [`ErrorKind::Timeout`]); `None` waits for the
    /// answer, or for the connect-retry schedule to fail (about 2.55 s with the defaults
    /// when nothing listens at the peer, at most 47.55 s; see
    /// [Unreachable peers](Self#unreachable-peers)).
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
    ///
    /// `deadline`: when to give up (then [`ErrorKind::Timeout`]); `None` waits for the
    /// answer, or for the connect-retry schedule to fail (about 2.55 s with the defaults
    /// when nothing listens at the peer, at most 47.55 s; see
    /// [Unreachable peers](Self#unreachable-peers)).
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
            task: peer.task(),
            lane,
            deadline,
            tag,
            spare,
            trace: self.stamp(),
        };
        if let Err(Outgoing(req)) = self.mode.send(Outgoing(req)) {
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
    /// meanwhile; it spins, then parks, as every wait does (see
    /// [Waiting](Self#waiting)). A tag that is not outstanding (never submitted, already
    /// taken, or submitted through a callback client): [`ErrorKind::NotOutstanding`] at
    /// once, never a hang.
    pub fn wait_tag(&mut self, tag: u64) -> Result<Completion, Error> {
        if !self.outstanding.contains(tag) {
            return Err(Error::new(ErrorKind::NotOutstanding));
        }
        Ok(self.wait_for(Some(tag)))
    }

    /// Waits for the next completion of any outstanding request; it spins, then parks, as
    /// every wait does (see [Waiting](Self#waiting)): an [`Embedded`](crate::Embedded)
    /// loop is run meanwhile. None outstanding (or a callback client):
    /// [`ErrorKind::NotOutstanding`] at once.
    pub fn wait_any(&mut self) -> Result<Completion, Error> {
        if self.outstanding.is_empty() {
            return Err(Error::new(ErrorKind::NotOutstanding));
        }
        Ok(self.wait_for(None))
    }

    /// A completion if one is ready, without waiting (an [`Embedded`](crate::Embedded) loop runs once).
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

    /// Runs an embedded loop once (which also sends what was queued) and keeps every
    /// completion delivered so far for [`take_tag`](Self::take_tag) and the waits: for a
    /// caller that checks several of its requests without waiting.
    pub(crate) fn gather(&mut self) {
        self.mode.turn();
        while let Some(c) = self.mode.next() {
            self.done.push_back(c);
        }
    }

    /// The completion of `tag` if [`gather`](Self::gather) or a wait has kept it, without
    /// waiting.
    pub(crate) fn take_tag(&mut self, tag: u64) -> Option<Completion> {
        self.take(Some(tag))
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

impl<K: Kind> Ticket<K> {
    /// [`client.wait(ticket)`](Client::wait), for a request and its wait in one line:
    /// `let pulled = h.pull(peer, ids, None)?.wait(&mut h)?;`.
    pub fn wait<M: Mode>(self, client: &mut Client<M>) -> Result<K::Output, Error> {
        client.wait(self)
    }
}
