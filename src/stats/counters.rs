//! One loop's counters (with its peers' metric blocks), the link between the loops of a
//! runtime, and the sum of every loop's counters.

use core::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use crossbeam_utils::CachePadded;

use super::peers::{Metrics, PeerBlock};
use super::request_kind::REQUEST_KINDS;
use super::trace;

/// One loop's counters.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub frames_in: AtomicU64,
    pub frames_out: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub completed: [AtomicU64; REQUEST_KINDS],
    pub failed: [AtomicU64; REQUEST_KINDS],
    pub connections_accepted: AtomicU64,
    pub connections_opened: AtomicU64,
    pub connections_lost: AtomicU64,
    pub connections_closed: AtomicU64,
    pub connections_refused: AtomicU64,
    pub reconnects: AtomicU64,
    pub payload_direct: AtomicU64,
    pub payload_copied: AtomicU64,
    pub buf_pool_bytes: AtomicU64,
    pub buf_registered_bytes: AtomicU64,
    pub fixed_reads: AtomicU64,
    pub recv_ring_bytes: AtomicU64,
    pub recv_ring_exhausted: AtomicU64,
    pub reads: AtomicU64,
    pub busy_ns: AtomicU64,
    pub spin_ns: AtomicU64,
    pub parked_ns: AtomicU64,
    pub parks: AtomicU64,
    pub progress_timeouts: AtomicU64,
    pub heartbeats_sent: AtomicU64,
    pub heartbeat_losses: AtomicU64,
    /// A gauge: bytes of the loop's connections' send arenas.
    pub send_arena_bytes: AtomicU64,
    /// Blocks the loop's connections' send arenas allocated.
    pub send_blocks_allocated: AtomicU64,
    /// The loop's per-peer metric blocks.
    pub peers: PeerRegistry,
    /// Where the loop hands its request trace over to a dump.
    pub trace: trace::TraceShared,
}

/// The blocks of one loop, for snapshots; and the other loops of the same runtime, so that
/// a loop answering a stats request can see them all.
#[derive(Debug, Default)]
pub(crate) struct PeerRegistry {
    blocks: Mutex<Vec<Arc<PeerBlock>>>,
    siblings: OnceLock<Vec<Weak<CachePadded<Counters>>>>,
}

impl PeerRegistry {
    /// Adds a new peer's block (when the peer is first seen: not on the request path).
    pub(crate) fn register(&self, block: Arc<PeerBlock>) {
        self.blocks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(block);
    }

    fn blocks(&self) -> Vec<Arc<PeerBlock>> {
        self.blocks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Tells every loop of a runtime about the others (before the loops start).
    pub(crate) fn link(loops: &[Arc<CachePadded<Counters>>]) {
        let all: Vec<_> = loops.iter().map(Arc::downgrade).collect();
        for l in loops {
            l.peers.siblings.set(all.clone()).ok();
        }
    }

    /// Runs `f` with every loop of this loop's runtime (`this` alone when it was not
    /// linked, as an embedded loop).
    pub(crate) fn with_loops<R>(&self, this: &Counters, f: impl FnOnce(&[&Counters]) -> R) -> R {
        match self.siblings.get() {
            Some(all) => {
                let strong: Vec<_> = all.iter().filter_map(Weak::upgrade).collect();
                let refs: Vec<&Counters> = strong.iter().map(|c| &***c).collect();
                f(&refs)
            }
            None => f(&[this]),
        }
    }
}

impl Metrics {
    /// Merges the peer blocks of `loops` by peer.
    pub(crate) fn of(loops: &[&Counters]) -> Metrics {
        Metrics::merged(loops.iter().flat_map(|l| l.peers.blocks()))
    }
}

/// A sum of every loop's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Frames received.
    pub frames_in: u64,
    /// Frames sent (counted when queued).
    pub frames_out: u64,
    /// Bytes received.
    pub bytes_in: u64,
    /// Bytes sent.
    pub bytes_out: u64,
    /// Requests completed successfully, by [`RequestKind`](super::RequestKind).
    pub completed: [u64; REQUEST_KINDS],
    /// Requests failed, by [`RequestKind`](super::RequestKind).
    pub failed: [u64; REQUEST_KINDS],
    /// Connections accepted.
    pub connections_accepted: u64,
    /// Outgoing connections that completed their handshake.
    pub connections_opened: u64,
    /// Connections lost or closed for an error: the peer vanished (heartbeat), closed in
    /// the middle of an exchange, broke the protocol, or the task shut down.
    pub connections_lost: u64,
    /// Connections their peer closed cleanly: between frames, with nothing in flight.
    pub connections_closed: u64,
    /// Connections closed as soon as they were accepted, at the `max_connections` limit.
    pub connections_refused: u64,
    /// Connect attempts after a failed one.
    pub reconnects: u64,
    /// Tensor payload bytes received straight into their destination.
    pub payload_direct: u64,
    /// Tensor payload bytes copied out of a receive buffer.
    pub payload_copied: u64,
    /// Bytes of the loops' receive-buffer pools (`STARWIRE_BUF_SIZE`, rounded down to
    /// whole receive buffers).
    pub buf_pool_bytes: u64,
    /// Bytes of those pools registered with io_uring as fixed buffers: equal to
    /// `buf_pool_bytes` when registered, 0 on epoll or when registration was refused
    /// (the reason is logged).
    pub buf_registered_bytes: u64,
    /// Receives into a registered buffer (`READ_FIXED`); part of `reads`.
    pub fixed_reads: u64,
    /// Bytes of the loops' io_uring rings of provided buffers, which multishot receives
    /// take data from (`STARWIRE_URING_RECV_BUFS`; 0 on epoll or without them).
    pub recv_ring_bytes: u64,
    /// Times a receive found a loop's ring of provided buffers (nearly) empty and read on
    /// its own instead, or a multishot receive ended for that. A count that keeps rising
    /// asks for more buffers (`STARWIRE_URING_RECV_BUFS`).
    pub recv_ring_exhausted: u64,
    /// Receives started on connections: into a receive buffer or straight into a tensor.
    pub reads: u64,
    /// Time loops spent doing work. `busy`, `spin`, `parked` and `parks` are the loop
    /// threads' accounting: an [`Embedded`](crate::Embedded) client's loop runs inside its
    /// caller's waits and leaves them at zero. A loop adds a turn's time when the turn ends
    /// and a park's when it wakes, so a park under way is not counted yet.
    pub busy: Duration,
    /// Time loops spent spinning with nothing to do.
    pub spin: Duration,
    /// Time loops spent parked in the kernel.
    pub parked: Duration,
    /// Times loops parked.
    pub parks: u64,
    /// Chunked tensors refused (failed with `RESOURCE_EXHAUSTED`) because the receive budget
    /// of their connection or of the task was spent (`STARWIRE_RECV_BUDGET`,
    /// `STARWIRE_CONN_RECV_BUDGET`).
    pub budget_refused: u64,
    /// Bytes of the receive budget reserved now, for chunked tensors being received.
    pub recv_reserved: u64,
    /// Connections closed because a frame or chunked tensor they owed made no progress
    /// (`STARWIRE_FRAME_TIMEOUT_MS`, `STARWIRE_PROGRESS_TIMEOUT_MS`).
    pub progress_timeouts: u64,
    /// Heartbeat pings sent on idle connections.
    pub heartbeats_sent: u64,
    /// Connections declared lost after a silence (`STARWIRE_HEARTBEAT_TIMEOUT_MS`).
    pub heartbeat_losses: u64,
    /// Bytes held now by the connections' send arenas, the blocks frames are encoded into:
    /// blocks in use, out with a write, or idle and kept for the next frames. With nothing
    /// queued a connection holds the block it writes into, two idle ones, and up to what its
    /// recent output needed at once within `STARWIRE_SEND_ARENA_KEEP` (1 MiB by default);
    /// while output waits for the socket, what that output needs.
    pub send_arena_bytes: u64,
    /// Blocks the connections' send arenas allocated (two per connection when it opens):
    /// after warm-up a steady load allocates none, so a count that keeps growing under a
    /// steady load says the arenas give back blocks they need again.
    pub send_blocks_allocated: u64,
}

impl Stats {
    /// Adds a receive budget's bytes reserved now and reservations refused so far.
    pub(crate) fn add_budget(&mut self, reserved: u64, refused: u64) {
        self.recv_reserved += reserved;
        self.budget_refused += refused;
    }

    pub(crate) fn add_loop(&mut self, c: &Counters) {
        let l = |a: &AtomicU64| a.load(Relaxed);
        self.frames_in += l(&c.frames_in);
        self.frames_out += l(&c.frames_out);
        self.bytes_in += l(&c.bytes_in);
        self.bytes_out += l(&c.bytes_out);
        for k in 0..REQUEST_KINDS {
            self.completed[k] += l(&c.completed[k]);
            self.failed[k] += l(&c.failed[k]);
        }
        self.connections_accepted += l(&c.connections_accepted);
        self.connections_opened += l(&c.connections_opened);
        self.connections_lost += l(&c.connections_lost);
        self.connections_closed += l(&c.connections_closed);
        self.connections_refused += l(&c.connections_refused);
        self.reconnects += l(&c.reconnects);
        self.payload_direct += l(&c.payload_direct);
        self.payload_copied += l(&c.payload_copied);
        self.buf_pool_bytes += l(&c.buf_pool_bytes);
        self.buf_registered_bytes += l(&c.buf_registered_bytes);
        self.fixed_reads += l(&c.fixed_reads);
        self.recv_ring_bytes += l(&c.recv_ring_bytes);
        self.recv_ring_exhausted += l(&c.recv_ring_exhausted);
        self.reads += l(&c.reads);
        self.busy += Duration::from_nanos(l(&c.busy_ns));
        self.spin += Duration::from_nanos(l(&c.spin_ns));
        self.parked += Duration::from_nanos(l(&c.parked_ns));
        self.parks += l(&c.parks);
        self.progress_timeouts += l(&c.progress_timeouts);
        self.heartbeats_sent += l(&c.heartbeats_sent);
        self.heartbeat_losses += l(&c.heartbeat_losses);
        self.send_arena_bytes = self.send_arena_bytes.wrapping_add(l(&c.send_arena_bytes));
        self.send_blocks_allocated += l(&c.send_blocks_allocated);
    }
}
