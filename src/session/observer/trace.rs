//! Where the session records the request trace (`STARWIRE_TRACE`, see `stats/trace.rs`):
//! the times a request gathers in flight, and the loop's ring they end in.
//!
//! Off, every hook is one branch on a flag that never changes. On, a request's times are
//! the turn's `now` (no clock read of its own), but its submit time, which the trainer
//! thread stamps; a record is a copy into a ring allocated at start.

use std::time::Instant;

use crate::config::Config;
use crate::stats::trace::{nanos, LoopTrace, Record, TraceRing, TraceShared};

use super::ended::Ended;

/// The loop's trace: off, or a ring.
pub(crate) struct Tracer {
    ring: Option<TraceRing>,
    epoch: Instant,
}

impl Tracer {
    pub(crate) fn new(cfg: &Config) -> Tracer {
        Tracer {
            ring: cfg
                .trace
                .then(|| TraceRing::with_capacity(cfg.trace_events)),
            epoch: crate::stats::trace::epoch(),
        }
    }

    /// Whether requests are recorded.
    #[cfg(test)]
    pub(crate) fn on(&self) -> bool {
        self.ring.is_some()
    }

    /// Hands the records over when a dump asked for them; `names` gives the peers' names.
    #[inline(always)]
    pub(crate) fn tick(&mut self, shared: &TraceShared, names: impl FnOnce() -> Vec<String>) {
        if self.ring.is_some() && shared.wanted() {
            self.hand_over(shared, names());
        }
    }

    #[cold]
    #[inline(never)]
    fn hand_over(&mut self, shared: &TraceShared, peers: Vec<String>) {
        if let Some(ring) = &mut self.ring {
            let (records, dropped) = ring.take();
            shared.hand_over(LoopTrace {
                records,
                dropped,
                peers,
            });
        }
    }

    /// Records a request that ended at `now`. Inlined: off, it is the one branch.
    #[inline(always)]
    pub(crate) fn ended(&mut self, now: Instant, e: &Ended) {
        if self.ring.is_some() {
            self.record(now, e);
        }
    }

    #[inline(never)]
    fn record(&mut self, now: Instant, e: &Ended) {
        let Some(ring) = &mut self.ring else {
            return;
        };
        let epoch = self.epoch;
        let at = |t: Option<Instant>| t.map_or(0, |t| nanos(epoch, t).max(1));
        let now = nanos(epoch, now).max(1);
        let m = e.marks.as_ref();
        ring.push(Record {
            tag: e.tag,
            step: m.map_or(0, |m| m.step),
            submitted: m.map_or(now, |m| nanos(epoch, m.submitted)),
            sent: at(e.sent),
            answered: at(m.and_then(|m| m.answered)),
            completed: now,
            bytes: m.map_or(0, |m| m.bytes),
            peer: e.peer,
            kind: e.kind,
            outcome: e.outcome,
        });
    }
}
