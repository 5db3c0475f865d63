//! Where the session records the request trace (`STARWIRE_TRACE`, see `stats/trace.rs`):
//! the times a request carries from its submitter and gathers in flight, and the loop's
//! ring they end in.
//!
//! Off, every hook is one branch on a flag that never changes. On, a request's times are
//! the turn's `now` (no clock read of its own), but its submit time, which the trainer
//! thread stamps; a record is a copy into a ring allocated at start.

use std::time::Instant;

use crate::config::Config;
use crate::error::Error;
use crate::stats::trace::{nanos, LoopTrace, Record, TraceRing, TraceShared};
use crate::stats::RequestKind;

use super::metrics::{outcome_of, PeerTable};
use super::outbox::Reply;

/// What a request brings from its submitter for the trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stamp {
    /// When the trainer thread submitted it (only read when tracing).
    pub submitted: Option<Instant>,
    /// The sharded step it is a part of; 0: none.
    pub step: u64,
}

/// The trace times of a request in flight.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Marks {
    pub submitted: Instant,
    /// The first frame of its answer decoded.
    pub answered: Option<Instant>,
    pub step: u64,
    /// Bytes its frames queued.
    pub bytes: u64,
}

impl Marks {
    /// The marks of a request the loop took at `now`.
    #[inline]
    pub(crate) fn taken(stamp: Stamp, now: Instant) -> Marks {
        Marks {
            submitted: stamp.submitted.unwrap_or(now),
            answered: None,
            step: stamp.step,
            bytes: 0,
        }
    }
}

/// The loop's trace: off, or a ring and the turn's time.
pub(crate) struct Tracer {
    ring: Option<TraceRing>,
    epoch: Instant,
    /// The current turn's time.
    now: Instant,
}

impl Tracer {
    pub(crate) fn new(cfg: &Config) -> Tracer {
        let epoch = crate::stats::trace::epoch();
        Tracer {
            ring: cfg
                .trace
                .then(|| TraceRing::with_capacity(cfg.trace_events)),
            epoch,
            now: epoch,
        }
    }

    /// Whether requests are recorded.
    #[inline]
    pub(crate) fn on(&self) -> bool {
        self.ring.is_some()
    }

    /// A new turn at `now`; hands the records over when a dump asked for them.
    #[inline(always)]
    pub(crate) fn tick(&mut self, now: Instant, shared: &TraceShared, peers: &PeerTable) {
        if self.ring.is_some() {
            self.now = now;
            if shared.wanted() {
                self.hand_over(shared, peers);
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn hand_over(&mut self, shared: &TraceShared, peers: &PeerTable) {
        if let Some(ring) = &mut self.ring {
            let (records, dropped) = ring.take();
            shared.hand_over(LoopTrace {
                records,
                dropped,
                peers: peer_names(peers),
            });
        }
    }

    /// The current turn's time.
    #[inline]
    pub(crate) fn now(&self) -> Instant {
        self.now
    }

    /// Records a request that ended at `now` with `result`: sent at `sent` (if it was),
    /// with `marks`, to the loop's peer number `peer`.
    /// Inlined: off, it is the one branch.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn ended(
        &mut self,
        now: Instant,
        tag: u64,
        kind: RequestKind,
        peer: u32,
        sent: Option<Instant>,
        marks: Option<&Marks>,
        result: &Result<Reply, Error>,
    ) {
        if self.ring.is_some() {
            self.record(now, tag, kind, peer, sent, marks, result);
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn record(
        &mut self,
        now: Instant,
        tag: u64,
        kind: RequestKind,
        peer: u32,
        sent: Option<Instant>,
        marks: Option<&Marks>,
        result: &Result<Reply, Error>,
    ) {
        let Some(ring) = &mut self.ring else {
            return;
        };
        let e = self.epoch;
        let at = |t: Option<Instant>| t.map_or(0, |t| nanos(e, t).max(1));
        let now = nanos(e, now).max(1);
        ring.push(Record {
            tag,
            step: marks.map_or(0, |m| m.step),
            submitted: marks.map_or(now, |m| nanos(e, m.submitted)),
            sent: at(sent),
            answered: at(marks.and_then(|m| m.answered)),
            completed: now,
            bytes: marks.map_or(0, |m| m.bytes),
            peer,
            kind,
            outcome: outcome_of(result),
        });
    }
}

/// The names of a loop's peers by index: task and address, as far as known.
fn peer_names(peers: &PeerTable) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(b) = peers.get(out.len() as u32) {
        let task = b.task.get().map(|(job, i)| format!("{job}:{i}"));
        out.push(match (task, b.addr) {
            (Some(t), Some(a)) => format!("{t} {a}"),
            (Some(t), None) => t,
            (None, Some(a)) => a.to_string(),
            (None, None) => "(unknown peer)".to_string(),
        });
    }
    out
}
