//! The observer: what the session records of the requests it sends and serves — per-peer
//! metrics (`stats::PeerBlock`, by the index each connection keeps), the loop's counters
//! and the request trace. Fed values ([`Ended`], bytes and items of frames); it imports
//! only the session's data types.

mod ended;
mod peers;
mod trace;

pub(crate) use ended::{Ended, Marks};
pub(crate) use peers::{PeerTable, NO_PEER};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use crate::config::Config;
use crate::error::{Error, ErrorKind};
use crate::proto::Frame;
use crate::stats::{add, Counters, Metrics, Outcome, RequestKind, Stats, TableMetrics};
use crate::wire::{Body, FrameKind, HEADER_LEN};

use super::reply::Reply;
use trace::Tracer;

impl Outcome {
    /// How a request that ended with `result` counts.
    pub(crate) fn of(result: &Result<Reply, Error>) -> Outcome {
        match result {
            Ok(_) => Outcome::Ok,
            Err(e) => match e.kind() {
                ErrorKind::Remote(_) => Outcome::Error,
                ErrorKind::Timeout => Outcome::Timeout,
                ErrorKind::Backpressure | ErrorKind::InvalidArgument => Outcome::Refused,
                _ => Outcome::Unavailable,
            },
        }
    }
}

/// Metrics, counters and trace of one loop.
pub(crate) struct Observer {
    counters: Arc<CachePadded<Counters>>,
    peers: PeerTable,
    trace: Tracer,
}

impl Observer {
    pub(crate) fn new(cfg: &Config, counters: Arc<CachePadded<Counters>>) -> Observer {
        Observer {
            counters,
            peers: PeerTable::default(),
            trace: Tracer::new(cfg),
        }
    }

    /// The loop's counters.
    #[inline]
    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Whether requests are traced.
    #[cfg(test)]
    pub(crate) fn tracing(&self) -> bool {
        self.trace.on()
    }

    /// A new turn of the loop: hands the trace over when a dump asked for it.
    #[inline]
    pub(crate) fn tick(&mut self) {
        let peers = &self.peers;
        self.trace.tick(&self.counters.trace, || peers.names());
    }

    /// The index of the block of requests sent to `addr`, made when it is first seen;
    /// `task`, the name a request gave the peer (`job:index`), names the block until a
    /// handshake does.
    pub(crate) fn client_peer(&mut self, addr: SocketAddr, task: Option<&str>) -> u32 {
        let i = self.peers.client(&self.counters, addr);
        let parsed = task
            .and_then(|t| t.rsplit_once(':'))
            .and_then(|(job, index)| Some((job, index.parse::<u32>().ok()?)));
        if let (Some((job, index)), Some(b)) = (parsed, self.peers.get(i)) {
            if b.task.get().is_none() {
                b.task.set((job.to_string(), index)).ok();
            }
        }
        i
    }

    /// `e`, naming the task of `peer` (its block's: from the handshake, or the name a
    /// request gave it) when it names none yet.
    pub(crate) fn named(&self, peer: u32, e: Error) -> Error {
        if e.task().is_some() {
            return e;
        }
        match self.peers.get(peer).and_then(|b| b.task.get()) {
            Some((job, index)) => e.with_task(format!("{job}:{index}")),
            None => e,
        }
    }

    /// The index of the block of requests sent to `addr` ([`NO_PEER`] if none).
    pub(crate) fn peer_of(&self, addr: Option<SocketAddr>) -> u32 {
        self.peers.index_of(addr)
    }

    /// A connection completed its handshake with task `job:index`: an accepted one
    /// (`peer` is [`NO_PEER`]) is given the block of requests served to that task. Returns
    /// the connection's peer index.
    pub(crate) fn opened(&mut self, peer: u32, accepted: bool, job: &str, index: u32) -> u32 {
        let peer = if accepted {
            self.peers.server(&self.counters, job, index)
        } else {
            peer
        };
        if let Some(b) = self.peers.get(peer) {
            b.task.set((job.to_string(), index)).ok();
            add(&b.connections, 1);
        }
        peer
    }

    /// A request of this task ended: counted and traced.
    #[inline]
    pub(crate) fn ended(&mut self, now: Instant, e: &Ended) {
        self.counted(e.kind, e.outcome, e.peer, e.latency);
        self.traced(now, e);
    }

    /// A request of this task of `kind`, to `peer`, ended with `outcome`, answered after
    /// `latency` when its peer answered it: the loop's counters and the peer's metrics.
    #[inline]
    pub(crate) fn counted(
        &mut self,
        kind: RequestKind,
        outcome: Outcome,
        peer: u32,
        latency: Option<Duration>,
    ) {
        let counter = if outcome == Outcome::Ok {
            &self.counters.completed[kind as usize]
        } else {
            &self.counters.failed[kind as usize]
        };
        add(counter, 1);
        if let Some(b) = self.peers.get(peer) {
            let answered = matches!(outcome, Outcome::Ok | Outcome::Error);
            b.ended(kind, outcome, latency.filter(|_| answered));
        }
    }

    /// A request of this task ended: its record in the trace (when tracing).
    #[inline]
    pub(crate) fn traced(&mut self, now: Instant, e: &Ended) {
        self.trace.ended(now, e);
    }

    /// A request of `kind` carrying `tensors` and `rows` started towards (or from) `peer`.
    #[inline]
    pub(crate) fn started(&self, peer: u32, kind: RequestKind, tensors: u64, rows: u64) {
        if let Some(b) = self.peers.get(peer) {
            b.started(kind, tensors, rows);
        }
    }

    /// A request `peer` sent this task ended with `outcome`, after `took` when answered.
    #[inline]
    pub(crate) fn served(
        &self,
        peer: u32,
        kind: RequestKind,
        outcome: Outcome,
        took: Option<Duration>,
    ) {
        if let Some(b) = self.peers.get(peer) {
            b.ended(kind, outcome, took);
        }
    }

    /// The bytes queued since `before` (`after` now) on a connection to `peer` are the
    /// answer to a served request of frame kind `kind`.
    #[inline]
    pub(crate) fn answer_out(&self, peer: u32, kind: FrameKind, before: u64, after: u64) {
        if let Some(kind) = served_kind(kind) {
            self.bytes_out(peer, kind, after.saturating_sub(before));
        }
    }

    /// The peer `peer` sent `n` `PING`s of `bytes` bytes in all, each answered with its
    /// `PONG` of the same size: served `ping`s.
    pub(crate) fn served_pings(&self, peer: u32, n: u64, bytes: u64) {
        if let Some(b) = self.peers.get(peer) {
            let op = b.op(RequestKind::Ping);
            for _ in 0..n {
                b.started(RequestKind::Ping, 0, 0);
                b.ended(RequestKind::Ping, Outcome::Ok, None);
            }
            add(&op.bytes_in, bytes);
            add(&op.bytes_out, bytes);
        }
    }

    /// A frame of a request of `kind` (ours, or the peer's) arrived from `peer`: its bytes,
    /// and for the peer's request its items.
    pub(crate) fn frame_in(&self, peer: u32, kind: Option<RequestKind>, f: &Frame<'_>) {
        let (Some(kind), Some(b)) = (kind, self.peers.get(peer)) else {
            return;
        };
        let h = &f.header;
        let request = !matches!(
            h.kind,
            FrameKind::Pong | FrameKind::Error | FrameKind::Response | FrameKind::Chunk
        );
        if request && kind != RequestKind::Stats {
            let (tensors, rows) = match f.body {
                Body::PullRows(t) | Body::PushRows(t) => {
                    (t.len() as u64, t.map(|t| t.len() as u64).sum())
                }
                _ => (u64::from(h.count), 0),
            };
            b.started(kind, tensors, rows);
        }
        let len = HEADER_LEN as u64 + u64::from(h.meta_len) + u64::from(h.payload_len);
        add(&b.op(kind).bytes_in, len);
    }

    /// `n` bytes of frames of a request of `kind` were queued for `peer`.
    #[inline]
    pub(crate) fn bytes_out(&self, peer: u32, kind: RequestKind, n: u64) {
        if let Some(b) = self.peers.get(peer) {
            add(&b.op(kind).bytes_out, n);
        }
    }

    /// A connection to `peer` was reconnected after a failed attempt.
    pub(crate) fn reconnect(&self, peer: u32) {
        add(&self.counters.reconnects, 1);
        if let Some(b) = self.peers.get(peer) {
            add(&b.reconnects, 1);
        }
    }

    /// A connection to `peer` was lost (or closed for an error).
    pub(crate) fn lost(&self, peer: u32) {
        add(&self.counters.connections_lost, 1);
        if let Some(b) = self.peers.get(peer) {
            add(&b.connections_lost, 1);
        }
    }

    /// A peer closed a connection cleanly.
    pub(crate) fn closed(&self) {
        add(&self.counters.connections_closed, 1);
    }

    /// The stats document of this task (`task`, `job:index`), with the totals of every
    /// loop of its runtime.
    pub(crate) fn stats_document(&self, task: &str, tables: &[(u32, TableMetrics)]) -> String {
        let counters: &Counters = &self.counters;
        counters.peers.with_loops(counters, |loops| {
            let mut totals = Stats::default();
            for l in loops {
                totals.add_loop(l);
            }
            Metrics::of(loops).to_json_with_tables(task, &totals, tables)
        })
    }
}

/// The request kind served metrics count a frame of `kind` under.
pub(crate) fn served_kind(kind: FrameKind) -> Option<RequestKind> {
    Some(match kind {
        FrameKind::Recv => RequestKind::Recv,
        FrameKind::FusedRecv => RequestKind::FusedRecv,
        FrameKind::Pull => RequestKind::Pull,
        FrameKind::Push => RequestKind::Push,
        FrameKind::PullRows => RequestKind::PullRows,
        FrameKind::PushRows => RequestKind::PushRows,
        FrameKind::Stats => RequestKind::Stats,
        FrameKind::Checkpoint => RequestKind::Checkpoint,
        _ => return None,
    })
}
