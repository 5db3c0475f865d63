//! The sans-IO protocol state of one event loop: its connections' codecs and phases, the
//! requests in flight and their matching, fusion, serving, routing requests to connections,
//! and timers.
//!
//! A [`Session`] does no I/O and never reads the clock. The event loop feeds it what
//! happened — requests from handles, bytes received, bytes sent, connects that completed
//! or failed, the time — and asks it what to do: which connections have output
//! ([`Session::take_dirty`] and [`Session::transmit`], which lend the encoder's blocks),
//! where the next bytes of a connection must land ([`Session::lend_recv`], which lends the
//! buffer or tensor memory until [`Session::received`] gives it back), which sockets to
//! open or close
//! ([`Session::poll_action`]) and when to call again ([`Session::poll_timeout`]). So the
//! protocol is tested in memory with simulated time (`tests.rs`), no sockets involved.
//!
//! Files: `conn.rs` (one connection's state), `request.rs` (the client side: submitting,
//! fusing and encoding requests), `dispatch.rs` (acting on decoded frames: answers),
//! `serve.rs` (the serving side), `reply.rs` (answers being assembled, pushes being
//! received), `outbox.rs` (completions), `timer.rs`.

mod budget;
mod conn;
mod dispatch;
mod io;
mod liveness;
mod members;
mod metrics;
mod outbox;
mod reply;
mod request;
mod serve;
mod timer;
mod trace;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_utils::CachePadded;
use slab::Slab;

use crate::config::Config;
use crate::ctx::CtxSlab;
use crate::error::{Error, ErrorKind};
use crate::pool::{Answer, Job};
use crate::proto::{CloseReason, Connection, EncoderConfig, Identity, OutTensor, Side};
use crate::rendezvous::{Delivery, Rendezvous};
use crate::service::SharedService;
use crate::stats::{add, Counters, RequestKind};
use crate::tensor::{SharedAllocator, Tensor};
use crate::wire::{Status, HEADER_LEN};

pub(crate) use budget::Budget;
use budget::ConnBudget;
use conn::{mark_dirty, Conn, Phase};
use dispatch::Dispatch;
pub(crate) use io::{RecvLoan, RecvPlace, SendSink};
use outbox::Outbox;
use request::{Pending, PushEncodeScratch};
use serve::{answer_pull, answer_pull_rows, answer_push, answer_recv, ServeScratch};
use timer::{Timer, Timers};

pub use outbox::{Callback, Completion, Reply};
pub(crate) use outbox::{HandleRings, Submitter};
pub use reply::PulledRows;
pub(crate) use reply::Spare;
pub(crate) use request::{Request, RequestOp, RowsSpec};
pub use request::{Rows, MAX_ROW_RANK};
pub(crate) use trace::Stamp;

/// Most requests taken from one handle's ring per drain pass (bounded work per step).
const DRAIN_BATCH: usize = 256;
/// Header and meta of a `CHUNK` frame.
const CHUNK_HEAD: usize = HEADER_LEN + 16;

/// What the session serves and how it receives tensors.
#[derive(Clone)]
pub(crate) struct SessionParts {
    pub service: Option<SharedService>,
    pub rendezvous: Option<Arc<Rendezvous>>,
    /// Where heavy handlers run; `None`: inline on the loop.
    pub jobs: Option<std::sync::mpsc::SyncSender<Job>>,
    /// The loop's position among the runtime's loops (rendezvous waiters and pool answers
    /// find their way back by it).
    pub index: usize,
    pub allocator: SharedAllocator,
    /// Payload at least this long is received straight into its tensor.
    pub zero_copy_min: u64,
    /// The task's receive budget, shared by its loops.
    pub budget: Arc<Budget>,
}

/// What the loop must do with a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Open a socket for connection `slot` and connect it to `addr`; report the outcome
    /// with [`Session::connected`] or [`Session::connect_failed`].
    Connect { slot: u32, addr: SocketAddr },
    /// Connection `slot` is closed: stop its I/O (shut the socket down) and, once no
    /// operation is in flight on it, call [`Session::release`].
    Close { slot: u32 },
}

/// The loop's sans-IO protocol state. See the module docs.
pub(crate) struct Session {
    cfg: Arc<Config>,
    counters: Arc<CachePadded<Counters>>,
    identity: Identity,
    conns: Slab<Conn>,
    /// The connection carrying requests to each (peer, lane).
    peers: HashMap<(SocketAddr, u32), u32, BuildHasherDefault<PeerHasher>>,
    ctxs: CtxSlab<Pending>,
    timers: Timers,
    outbox: Outbox,
    /// Connections with output to write.
    dirty: Vec<u32>,
    actions: VecDeque<Action>,
    scratch: Vec<u64>,
    stopping: bool,
    /// Ping payload.
    zeros: Vec<u8>,
    /// Source of connection generations.
    serial: u32,
    service: Option<SharedService>,
    rendezvous: Option<Arc<Rendezvous>>,
    jobs: Option<std::sync::mpsc::SyncSender<Job>>,
    index: usize,
    allocator: SharedAllocator,
    zero_copy_min: u64,
    budget: Arc<Budget>,
    /// Timer count above which answered deadlines are swept out of the heap.
    sweep_at: usize,
    /// Requests of the embedding thread, taken in the next drain pass.
    local_requests: VecDeque<Request>,
    /// Single-key recvs of the current drain pass, when tensor fusion is on.
    fuse_buf: Vec<(Request, Submitter)>,
    /// Vectors the serving side reuses.
    serve: ServeScratch,
    /// Vectors for encoding pushes.
    push_scratch: PushEncodeScratch,
    /// Requests given up by deadline after they were sent: handle and connection.
    abandoned: VecDeque<(u64, u32)>,
    /// Per-peer metric blocks, by the index connections keep.
    peer_table: metrics::PeerTable,
    /// This task's name (`job:index`) for stats answers; `None`: the stats endpoint is off.
    stats_task: Option<String>,
    /// Addresses of tasks that moved or left the cluster: not sent to.
    retired: Arc<crate::cluster::Retirements>,
    /// Connections to retired addresses, closed once no request is left on them.
    draining: Vec<u32>,
    /// The request trace (off unless `STARWIRE_TRACE`).
    trace: trace::Tracer,
}

/// Hashes the (peer, lane) keys of the session's routing table, looked up once per
/// request. The keys are addresses this task's own trainer names, never bytes from the
/// network, so a fast multiplicative hash is enough (std's SipHash cost more than the
/// rest of routing a request).
#[derive(Default)]
pub(crate) struct PeerHasher(u64);

impl std::hash::Hasher for PeerHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.write_u64(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// The tensor as encoder input: its meta, its bytes, and the caller's `token` for them.
pub(crate) fn out_tensor(t: &Tensor, token: u64) -> OutTensor<'_> {
    OutTensor {
        meta: t.meta(),
        bytes: t.bytes(),
        token,
    }
}

impl Session {
    pub(crate) fn new(
        cfg: Arc<Config>,
        counters: Arc<CachePadded<Counters>>,
        parts: SessionParts,
    ) -> Session {
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
        let stats_task = cfg
            .stats_endpoint
            .then(|| format!("{}:{}", cfg.job, cfg.task_index));
        Session {
            ctxs: CtxSlab::with_capacity(cfg.max_inflight),
            timers: Timers::with_capacity(cfg.max_inflight.min(1 << 16)),
            trace: trace::Tracer::new(&cfg),
            cfg,
            counters,
            identity,
            conns: Slab::with_capacity(64),
            peers: HashMap::default(),
            outbox: Outbox::default(),
            dirty: Vec::with_capacity(64),
            actions: VecDeque::new(),
            scratch: Vec::new(),
            stopping: false,
            zeros: Vec::new(),
            serial: 0,
            service: parts.service,
            rendezvous: parts.rendezvous,
            jobs: parts.jobs,
            index: parts.index,
            allocator: parts.allocator,
            zero_copy_min: parts.zero_copy_min,
            budget: parts.budget,
            sweep_at: timer::SWEEP_MIN,
            local_requests: VecDeque::new(),
            fuse_buf: Vec::new(),
            serve: ServeScratch::default(),
            push_scratch: PushEncodeScratch::default(),
            abandoned: VecDeque::new(),
            peer_table: metrics::PeerTable::default(),
            stats_task,
            retired: Arc::default(),
            draining: Vec::new(),
        }
    }

    fn next_serial(&mut self) -> u32 {
        self.serial = self.serial.wrapping_add(1);
        self.serial
    }

    // ----- requests and completions -----

    /// Takes a new handle's end.
    pub(crate) fn add_handle(&mut self, ep: HandleRings) {
        self.outbox.add(ep);
    }

    /// Whether a handle's ring holds requests not taken yet.
    pub(crate) fn requests_waiting(&self) -> bool {
        self.outbox.requests_waiting()
    }

    /// Queues a request of the embedding thread for the next drain pass.
    pub(crate) fn submit_local(&mut self, req: Request) {
        self.local_requests.push_back(req);
    }

    /// The next completion for the embedding thread.
    pub(crate) fn take_local(&mut self) -> Option<Completion> {
        self.outbox.local.pop_front()
    }

    /// Takes the requests waiting (a bounded batch per handle) and starts them; the recvs of
    /// the pass are fused. Returns whether there were any.
    pub(crate) fn drain_requests(&mut self, now: Instant) -> bool {
        let mut progress = false;
        self.trace.tick(now, &self.counters.trace, &self.peer_table);
        // The embedding thread's requests first (embedded mode).
        while let Some(req) = self.local_requests.pop_front() {
            progress = true;
            self.take_request(req, Submitter::Local, now);
        }
        for i in 0..self.outbox.handles.len() {
            let mut batch = 0;
            while batch < DRAIN_BATCH {
                let Some(ep) = self.outbox.handles[i].as_mut() else {
                    break;
                };
                let Some(req) = ep.requests.pop() else {
                    if ep.requests.is_closed() && ep.requests.is_empty() {
                        // The handle is gone; completions still owed to it are dropped.
                        self.outbox.handles[i] = None;
                    }
                    break;
                };
                batch += 1;
                let origin = Submitter::Handle(i as u32, self.outbox.generations[i]);
                self.take_request(req, origin, now);
            }
            progress |= batch > 0;
        }
        self.submit_fused(now);
        progress
    }

    /// Completes a request for `peer`; an error names it.
    #[allow(clippy::too_many_arguments)]
    fn notify(
        &mut self,
        peer: Option<SocketAddr>,
        origin: Submitter,
        tag: u64,
        kind: RequestKind,
        fused: &[outbox::Member],
        result: Result<Reply, Error>,
        spare: Spare,
        traced: Option<(trace::Marks, Option<Instant>)>,
    ) {
        if self.trace.on() {
            let index = peer.map_or(metrics::NO_PEER, |a| self.peer_table.index_of(a));
            let (marks, sent) = traced.map_or((None, None), |(m, s)| (Some(m), s));
            let marks = marks.as_ref();
            let now = self.trace.now();
            self.trace
                .ended(now, tag, kind, index, sent, marks, &result);
        }
        let counters = &self.counters;
        let result = result.map_err(|e| match peer {
            Some(peer) => e.with_peer(peer),
            None => e,
        });
        // Requests that end here were not answered by their peer: no latency.
        let meter = metrics::Meter {
            block: self.peer_table.of_addr(peer),
            latency: None,
        };
        self.outbox
            .notify(counters, meter, origin, tag, kind, fused, result, spare);
    }

    /// Answers a recv whose key another thread published.
    pub(crate) fn deliver_recv(&mut self, d: Delivery) {
        let w = d.waiter;
        if !self.conn_live(w.conn, w.generation) {
            // The requester went away: the tensor goes back for the next recv.
            if let (Ok(t), Some(r)) = (d.result, &self.rendezvous) {
                r.restore(&d.key, t);
            }
            return;
        }
        let conn = &mut self.conns[w.conn as usize];
        if let Some(back) = answer_recv(conn, w.handle, w.index, d.result) {
            // Its recv was cancelled or expired while the tensor was on its way here.
            if let (Ok(t), Some(r)) = (back, &self.rendezvous) {
                r.restore(&d.key, t);
            }
            return;
        }
        if !conn.recvs.iter().any(|&(h, _)| h == w.handle) {
            // Its last item answered.
            let block = self.peer_table.get(conn.metrics);
            metrics::served_end(block, RequestKind::Recv, crate::stats::Outcome::Ok);
        }
        conn.release_tokens();
        mark_dirty(&mut self.dirty, conn, w.conn);
    }

    /// Sends a pool handler's answer, if its connection is still there.
    pub(crate) fn take_answer(&mut self, a: Answer) {
        let to = a.to();
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
            Answer::PullRows { tables, .. } => answer_pull_rows(
                proto.encoder(),
                out_tensors,
                to.handle,
                &tables,
                &mut scratch.tokens,
                &mut scratch.items,
            ),
        }
        conn.release_tokens();
        mark_dirty(&mut self.dirty, conn, to.conn);
    }

    fn conn_live(&self, slot: u32, generation: u32) -> bool {
        self.conns.get(slot as usize).is_some_and(|c| {
            c.generation == generation && c.phase == Phase::Open && !c.proto.is_closed()
        })
    }

    // ----- connections -----

    /// The peer connection `slot` was opened to, named in its requests' errors.
    fn peer_of(&self, slot: u32) -> Option<SocketAddr> {
        self.conns
            .get(slot as usize)
            .and_then(|c| c.outgoing)
            .map(|(peer, _)| peer)
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

    fn conn_budget(&self) -> ConnBudget {
        ConnBudget::new(&self.budget)
    }

    /// The connection for `(peer, lane)`, opened on demand.
    fn peer_conn(&mut self, peer: SocketAddr, lane: u32, now: Instant) -> u32 {
        if let Some(&slot) = self.peers.get(&(peer, lane)) {
            return slot;
        }
        let proto = self.new_proto(Side::Client);
        let conn = Conn {
            outgoing: Some((peer, lane)),
            ..Conn::new(
                proto,
                Phase::Backoff,
                self.next_serial(),
                self.conn_budget(),
                now,
            )
        };
        let slot = self.conns.insert(conn) as u32;
        self.peers.insert((peer, lane), slot);
        self.conns[slot as usize].metrics = self.peer_table.client(&self.counters, peer);
        self.start_connect(slot, now);
        slot
    }

    /// Asks the loop to connect `slot`; connect and handshake share one time limit.
    fn start_connect(&mut self, slot: u32, now: Instant) {
        let conn = &mut self.conns[slot as usize];
        let Some((addr, _)) = conn.outgoing else {
            return;
        };
        conn.phase = Phase::Connecting;
        let generation = conn.generation;
        let deadline = now + self.cfg.handshake_timeout;
        self.timers
            .push(deadline, Timer::Handshake { slot, generation });
        self.actions.push_back(Action::Connect { slot, addr });
    }

    /// The connect of `slot` succeeded: the handshake starts.
    pub(crate) fn connected(&mut self, slot: u32) {
        let Some(conn) = self.conns.get_mut(slot as usize) else {
            return;
        };
        if conn.phase != Phase::Connecting {
            return;
        }
        conn.phase = Phase::Handshaking;
        mark_dirty(&mut self.dirty, conn, slot);
    }

    /// A connect attempt of `slot` failed (the loop has closed its socket): retry with
    /// backoff, or give up and fail what waits.
    pub(crate) fn connect_failed(&mut self, slot: u32, now: Instant) {
        let Some(conn) = self.conns.get_mut(slot as usize) else {
            return;
        };
        if conn.phase == Phase::Closing {
            return;
        }
        conn.attempts += 1;
        let peer = conn.outgoing.map(|(p, _)| p);
        if conn.attempts <= self.cfg.connect_retries && !self.stopping {
            let delay = self.cfg.connect_delay(conn.attempts);
            conn.phase = Phase::Backoff;
            self.serial = self.serial.wrapping_add(1);
            conn.generation = self.serial;
            let generation = conn.generation;
            add(&self.counters.reconnects, 1);
            if let Some(b) = self.peer_table.get(conn.metrics) {
                add(&b.reconnects, 1);
            }
            log::debug!(
                "connect to {peer:?} failed (attempt {}); retrying in {delay:?}",
                conn.attempts
            );
            self.timers
                .push(now + delay, Timer::Reconnect { slot, generation });
        } else {
            log::warn!(
                "giving up on {peer:?} after {} connect attempts",
                conn.attempts
            );
            conn.failure = Error::new(ErrorKind::ConnectFailed);
            self.finish_close(slot);
        }
    }

    /// A connection accepted by the loop; returns its slot.
    pub(crate) fn adopt(&mut self, now: Instant) -> u32 {
        let proto = self.new_proto(Side::Server);
        let generation = self.next_serial();
        let conn = Conn::new(
            proto,
            Phase::Handshaking,
            generation,
            self.conn_budget(),
            now,
        );
        let slot = self.conns.insert(conn) as u32;
        let deadline = now + self.cfg.handshake_timeout;
        self.timers
            .push(deadline, Timer::Handshake { slot, generation });
        slot
    }

    /// Replaces the receive buffer of connection `slot` before any byte arrived; returns
    /// the one it had, or `buf` back as the error when there is no such connection.
    pub(crate) fn swap_buffer(&mut self, slot: u32, buf: Vec<u8>) -> Result<Vec<u8>, Vec<u8>> {
        match self.conns.get_mut(slot as usize) {
            Some(c) => Ok(c.proto.decoder().swap_buffer(buf)),
            None => Err(buf),
        }
    }

    /// The next socket operation the loop must start, if any.
    pub(crate) fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Moves the connections with output into `out` (emptied first).
    pub(crate) fn take_dirty(&mut self, out: &mut Vec<u32>) {
        out.clear();
        std::mem::swap(&mut self.dirty, out);
        for &slot in out.iter() {
            if let Some(c) = self.conns.get_mut(slot as usize) {
                c.dirty = false;
            }
        }
    }

    /// Decodes what connection `slot` has received and acts on it.
    fn process(&mut self, slot: u32, now: Instant) {
        let Session {
            conns,
            ctxs,
            abandoned,
            outbox,
            counters,
            dirty,
            service,
            rendezvous,
            jobs,
            allocator,
            index,
            serve,
            timers,
            peer_table,
            stats_task,
            trace,
            ..
        } = self;
        let conn = &mut conns[slot as usize];
        let metrics = peer_table.get(conn.metrics);
        let peer_index = conn.metrics;
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
            outgoing,
            budget,
            ..
        } = conn;
        let outgoing = *outgoing;
        let mut d = Dispatch {
            slot,
            now,
            ctxs,
            abandoned,
            outbox,
            counters,
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
            budget,
            serve,
            timers,
            max_served: self.cfg.max_served,
            peer: outgoing.map(|(peer, _)| peer),
            metrics,
            peer_index,
            trace,
            stats_task: stats_task.as_deref(),
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
        conn.release_tokens();
        mark_dirty(dirty, conn, slot);
        if opened {
            conn.phase = Phase::Open;
            self.note_opened(slot);
            let conn = &mut self.conns[slot as usize];
            if conn.outgoing.is_some() {
                add(&self.counters.connections_opened, 1);
                conn.attempts = 0;
                while let Some(h) = self.conns[slot as usize].waiting.pop_front() {
                    self.send_request(slot, h, now);
                }
            }
            self.start_heartbeat(slot, now);
        }
        let conn = &mut self.conns[slot as usize];
        if conn.proto.is_closed() && !was_closed {
            let failure = match conn.proto.close_reason() {
                Some(CloseReason::Refused { status, message }) => {
                    Error::new(ErrorKind::Refused(*status)).with_message(message.as_str())
                }
                // We found the peer breaking the protocol: a protocol error, whichever side
                // opened the connection.
                Some(CloseReason::Rejected {
                    status: Status::Protocol,
                    ..
                }) => Error::new(ErrorKind::Protocol),
                Some(CloseReason::Rejected { status, .. }) if conn.outgoing.is_some() => {
                    Error::new(ErrorKind::Refused(*status))
                }
                _ => Error::new(ErrorKind::Protocol),
            };
            self.linger_then_close(slot, failure, now);
        }
    }

    /// Closes connection `slot` for `why`: its requests fail once the loop releases it.
    pub(crate) fn lose(&mut self, slot: u32, why: Error) {
        let Some(conn) = self.conns.get_mut(slot as usize) else {
            return;
        };
        if conn.phase == Phase::Closing {
            return;
        }
        add(&self.counters.connections_lost, 1);
        if let Some(b) = self.peer_table.get(conn.metrics) {
            add(&b.connections_lost, 1);
        }
        // A reason the protocol found (a refusal, a violation) outranks what the socket
        // said afterwards (usually the peer closing it).
        if !conn.proto.is_closed() {
            conn.failure = why;
        }
        self.finish_close(slot);
    }

    /// Marks `slot` closed and asks the loop to close its socket; later requests to its
    /// peer open a new connection.
    fn finish_close(&mut self, slot: u32) {
        self.conns[slot as usize].phase = Phase::Closing;
        self.unroute(slot);
        self.actions.push_back(Action::Close { slot });
    }

    /// Takes `slot` out of the routing table: later requests to its peer and lane open a
    /// new connection.
    fn unroute(&mut self, slot: u32) {
        if let Some(key) = self.conns.get(slot as usize).and_then(|c| c.outgoing) {
            if self.peers.get(&key) == Some(&slot) {
                self.peers.remove(&key);
            }
        }
    }

    /// Frees closed connection `slot` once the loop has no operation in flight on it (a
    /// receive may write into a request's tensor until then): fails the requests waiting
    /// for or in flight on it, and returns its receive buffer.
    pub(crate) fn release(&mut self, slot: u32) -> Vec<u8> {
        let Some(conn) = self.conns.get_mut(slot as usize) else {
            return Vec::new();
        };
        debug_assert_eq!(conn.phase, Phase::Closing, "released before it was closed");
        let why = conn.failure.clone();
        let mut failed = std::mem::take(&mut self.scratch);
        failed.extend(conn.waiting.drain(..));
        for (h, p) in self.ctxs.iter() {
            if p.conn == slot && p.sent.is_some() {
                failed.push(h.to_raw());
            }
        }
        for h in failed.drain(..) {
            if let Ok(p) = self.ctxs.remove(crate::ctx::CtxKey::from_raw(h)) {
                self.notify(
                    self.peer_of(p.conn),
                    p.origin,
                    p.tag,
                    p.kind,
                    &p.fused,
                    Err(why.clone()),
                    p.spare,
                    Some((p.trace, p.sent)),
                );
            }
        }
        self.scratch = failed;
        let conn = &self.conns[slot as usize];
        self.note_unanswered(slot);
        if let (false, Some(r)) = (conn.recvs.is_empty(), &self.rendezvous) {
            r.forget(self.index, slot, conn.generation);
        }
        // Unrouted when it was closed (`finish_close`).
        let mut conn = self.conns.remove(slot as usize);
        let counted = conn.arena_counted as u64;
        add(&self.counters.send_arena_bytes, counted.wrapping_neg());
        conn.proto.decoder().swap_buffer(Vec::new())
    }

    /// Forgets connection `slot`, just adopted, whose socket the loop could not take on
    /// (nothing was received or sent on it).
    pub(crate) fn discard(&mut self, slot: u32) {
        if self.conns.contains(slot as usize) {
            self.conns[slot as usize].phase = Phase::Closing;
            drop(self.release(slot));
        }
    }

    /// Stops: requests still in the rings fail with `SHUTDOWN`, every connection is
    /// aborted (an `ERROR` frame is queued) and closed.
    pub(crate) fn shutdown(&mut self, now: Instant) {
        self.stopping = true;
        for i in 0..self.outbox.handles.len() {
            let origin = Submitter::Handle(i as u32, self.outbox.generations[i]);
            while let Some(req) = self.outbox.handles[i]
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
            conn.failure = Error::new(ErrorKind::Shutdown);
            self.lose(slot, Error::new(ErrorKind::Shutdown));
        }
    }

    /// Whether every connection has been released.
    pub(crate) fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }
}
