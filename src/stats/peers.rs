//! Per-peer, per-operation metrics.
//!
//! A loop keeps one [`PeerBlock`] per peer it talks to, allocated when the peer is first
//! seen (a connect to a new address, a handshake from a new task) and registered with the
//! loop's [`Counters`](super::Counters) under a lock that only registration and snapshots
//! take. Requests then update their peer's block with relaxed loads and stores, as the
//! loop counters are: no lock, no allocation. A [`Metrics`] snapshot merges the blocks of
//! every loop by peer.

use core::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::histogram::{AtomicHistogram, Histogram};
use super::request_kind::{RequestKind, REQUEST_KINDS};
use super::single_writer::add;
pub use crate::wire::Side;

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Answered (items may still carry statuses of their own, e.g. `NOT_FOUND`).
    Ok = 0,
    /// Requester: the peer answered the whole request with an error. Server: answered
    /// with an error (no handler, handler failed, ...).
    Error = 1,
    /// Its deadline passed, or it was cancelled.
    Timeout = 2,
    /// Requester: the connection was lost or could not be made, or the runtime stopped.
    Unavailable = 3,
    /// Refused before it was served: too many requests in flight, or over a limit.
    Refused = 4,
}

/// Number of [`Outcome`]s.
pub const OUTCOMES: usize = 5;

impl Outcome {
    /// Every outcome, in order.
    pub const ALL: [Outcome; OUTCOMES] = [
        Outcome::Ok,
        Outcome::Error,
        Outcome::Timeout,
        Outcome::Unavailable,
        Outcome::Refused,
    ];

    /// The label used in the JSON document and by `commctl stats`.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Timeout => "timeout",
            Outcome::Unavailable => "unavailable",
            Outcome::Refused => "refused",
        }
    }
}

/// One operation's counters in a peer block.
#[derive(Default)]
pub(crate) struct OpCounters {
    pub requests: AtomicU64,
    pub outcomes: [AtomicU64; OUTCOMES],
    pub bytes_out: AtomicU64,
    pub bytes_in: AtomicU64,
    pub tensors: AtomicU64,
    pub rows: AtomicU64,
    pub latency: AtomicHistogram,
}

/// One loop's metrics of one peer. Only that loop writes it.
pub(crate) struct PeerBlock {
    pub side: Side,
    /// The address this task connects to (requester side).
    pub addr: Option<SocketAddr>,
    /// The peer's task, job and index: the first name given, by the requests to it (a
    /// named `Peer`) or by its handshake.
    pub task: OnceLock<(String, u32)>,
    pub ops: [OpCounters; REQUEST_KINDS],
    pub connections: AtomicU64,
    pub connections_lost: AtomicU64,
    pub reconnects: AtomicU64,
}

impl PeerBlock {
    pub(crate) fn new(side: Side, addr: Option<SocketAddr>) -> PeerBlock {
        PeerBlock {
            side,
            addr,
            task: OnceLock::new(),
            ops: Default::default(),
            connections: AtomicU64::new(0),
            connections_lost: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
        }
    }

    /// The counters of `kind`.
    #[inline]
    pub(crate) fn op(&self, kind: RequestKind) -> &OpCounters {
        &self.ops[kind as usize]
    }

    /// A request of `kind` with `tensors` tensors (or keys, or ids) and `rows` rows started.
    #[inline]
    pub(crate) fn started(&self, kind: RequestKind, tensors: u64, rows: u64) {
        let op = self.op(kind);
        add(&op.requests, 1);
        add(&op.tensors, tensors);
        add(&op.rows, rows);
    }

    /// A request of `kind` ended with `outcome`, after `latency` when it was answered.
    #[inline]
    pub(crate) fn ended(&self, kind: RequestKind, outcome: Outcome, latency: Option<Duration>) {
        let op = self.op(kind);
        add(&op.outcomes[outcome as usize], 1);
        if let Some(d) = latency {
            op.latency.record(d);
        }
    }

    /// The task name, `job:index`, once the handshake gave it.
    fn task_name(&self) -> Option<String> {
        self.task.get().map(|(job, index)| format!("{job}:{index}"))
    }
}

impl std::fmt::Debug for PeerBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerBlock")
            .field("side", &self.side)
            .field("addr", &self.addr)
            .field("task", &self.task.get())
            .finish_non_exhaustive()
    }
}

/// One operation's metrics with one peer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OpMetrics {
    /// Requests started (requester: submitted; server: received).
    pub requests: u64,
    /// Requests ended, by [`Outcome`] (index: `Outcome as usize`).
    pub outcomes: [u64; OUTCOMES],
    /// Bytes of request frames (requester: sent; server: answers queued at once).
    pub bytes_out: u64,
    /// Bytes of answer frames received (requester), or of request frames (server).
    pub bytes_in: u64,
    /// Tensors, keys or ids the requests carried.
    pub tensors: u64,
    /// Embedding rows the requests carried (rows pulls and pushes).
    pub rows: u64,
    /// Latency of the requests answered (requester: from the request being queued on the
    /// connection to its answer; server: from the request's frame to its answer, for
    /// answers that did not go out in the same loop turn).
    pub latency: Histogram,
}

impl OpMetrics {
    /// Requests of `outcome`.
    pub fn outcome(&self, outcome: Outcome) -> u64 {
        self.outcomes[outcome as usize]
    }

    /// Requests started and not ended yet.
    pub fn in_flight(&self) -> u64 {
        self.requests
            .saturating_sub(self.outcomes.iter().sum::<u64>())
    }

    fn add(&mut self, c: &OpCounters) {
        let l = |a: &AtomicU64| a.load(Relaxed);
        self.requests += l(&c.requests);
        for (o, a) in self.outcomes.iter_mut().zip(&c.outcomes) {
            *o += l(a);
        }
        self.bytes_out += l(&c.bytes_out);
        self.bytes_in += l(&c.bytes_in);
        self.tensors += l(&c.tensors);
        self.rows += l(&c.rows);
        c.latency.merge_into(&mut self.latency);
    }

    fn merge(&mut self, o: &OpMetrics) {
        self.requests += o.requests;
        for (a, b) in self.outcomes.iter_mut().zip(o.outcomes) {
            *a += b;
        }
        self.bytes_out += o.bytes_out;
        self.bytes_in += o.bytes_in;
        self.tensors += o.tensors;
        self.rows += o.rows;
        self.latency.merge(&o.latency);
    }
}

/// Metrics of one peer, in one side, over every loop.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerMetrics {
    /// Whose requests are counted.
    pub side: Side,
    /// The peer's address (requester side: the address connected to).
    pub addr: Option<SocketAddr>,
    /// The peer's task, `job:index`: as the requests to it named it (a
    /// [`Peer`](crate::Peer) resolved from a task name), or as its handshake did; `None`
    /// while neither has.
    pub task: Option<String>,
    /// Connections opened (requester) or accepted (server) whose handshake completed.
    pub connections: u64,
    /// Connections lost or closed for an error.
    pub connections_lost: u64,
    /// Connect attempts after a failed one.
    pub reconnects: u64,
    /// Per operation (index: [`RequestKind`]` as usize`).
    pub ops: Vec<OpMetrics>,
}

impl PeerMetrics {
    /// The metrics of `kind`.
    pub fn op(&self, kind: RequestKind) -> &OpMetrics {
        &self.ops[kind as usize]
    }

    /// The peer as shown to people: its task name, else its address.
    pub fn name(&self) -> String {
        match (&self.task, self.addr) {
            (Some(t), _) => t.clone(),
            (None, Some(a)) => a.to_string(),
            (None, None) => "?".to_string(),
        }
    }

    fn of(b: &PeerBlock) -> PeerMetrics {
        let mut ops = vec![OpMetrics::default(); REQUEST_KINDS];
        for (m, c) in ops.iter_mut().zip(&b.ops) {
            m.add(c);
        }
        PeerMetrics {
            side: b.side,
            addr: b.addr,
            task: b.task_name(),
            connections: b.connections.load(Relaxed),
            connections_lost: b.connections_lost.load(Relaxed),
            reconnects: b.reconnects.load(Relaxed),
            ops,
        }
    }

    fn merge(&mut self, o: PeerMetrics) {
        self.task = self.task.take().or(o.task);
        self.connections += o.connections;
        self.connections_lost += o.connections_lost;
        self.reconnects += o.reconnects;
        for (a, b) in self.ops.iter_mut().zip(&o.ops) {
            a.merge(b);
        }
    }
}

/// Per-peer, per-operation metrics of a runtime: every loop's blocks merged by peer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    /// One entry per (side, peer): requesters by address, served peers by task.
    pub peers: Vec<PeerMetrics>,
}

impl Metrics {
    /// Merges `blocks` (of one loop or of several) by peer.
    pub(super) fn merged(blocks: impl IntoIterator<Item = Arc<PeerBlock>>) -> Metrics {
        // Requesters' blocks are the same peer by address; served ones by task (an
        // accepted connection's address is the peer's ephemeral port).
        let mut index: HashMap<(Side, Option<SocketAddr>, Option<String>), usize> = HashMap::new();
        let mut m = Metrics::default();
        for b in blocks {
            let p = PeerMetrics::of(&b);
            let key = match p.side {
                Side::Client => (p.side, p.addr, None),
                Side::Server => (p.side, None, p.task.clone()),
            };
            match index.get(&key) {
                Some(&i) => m.peers[i].merge(p),
                None => {
                    index.insert(key, m.peers.len());
                    m.peers.push(p);
                }
            }
        }
        m.peers
            .sort_by(|a, b| (a.side, &a.task, a.addr).cmp(&(b.side, &b.task, b.addr)));
        m
    }

    /// The peers of `side`.
    pub fn side(&self, side: Side) -> impl Iterator<Item = &PeerMetrics> {
        self.peers.iter().filter(move |p| p.side == side)
    }

    /// The metrics of requests this task sent to `addr`.
    pub fn client(&self, addr: SocketAddr) -> Option<&PeerMetrics> {
        self.side(Side::Client).find(|p| p.addr == Some(addr))
    }

    /// The metrics of requests task `task` (`job:index`) sent to this one.
    pub fn served(&self, task: &str) -> Option<&PeerMetrics> {
        self.side(Side::Server)
            .find(|p| p.task.as_deref() == Some(task))
    }
}
