//! The session's timers. A connection's own timers (connect retry, handshake, close
//! linger, frame head, progress, heartbeat) are set and stopped by kind in its
//! [`ConnTimers`], at most one of each; the requests' timers (deadlines, the wait for a
//! cancel's verdict, the peer's recv deadlines) are entries of their own. All come due
//! through one heap; the session never reads the clock: the loop asks
//! [`Timers::next`] when the next one is due and hands the time it read to the session.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

/// A connection's timer kinds: at most one of each is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnTimer {
    /// Connect again after a failed attempt.
    Reconnect,
    /// Connect and handshake must be done by then.
    Handshake,
    /// A connection whose protocol closed gets this long to flush its last frame.
    Close,
    /// A frame head (header and meta section) in progress must be complete by then.
    FrameHead,
    /// A connection owing bytes must have delivered some by then.
    Progress,
    /// An open connection's silence is checked: probed after `heartbeat_interval`, lost
    /// after `heartbeat_timeout`.
    Heartbeat,
}

const CONN_TIMERS: usize = 6;

impl ConnTimer {
    const ALL: [ConnTimer; CONN_TIMERS] = [
        ConnTimer::Reconnect,
        ConnTimer::Handshake,
        ConnTimer::Close,
        ConnTimer::FrameHead,
        ConnTimer::Progress,
        ConnTimer::Heartbeat,
    ];
}

/// One connection's timers, by kind.
#[derive(Debug, Default)]
pub(crate) struct ConnTimers {
    at: [Option<Instant>; CONN_TIMERS],
    /// The earliest entry of this connection in the heap not come due yet.
    scheduled: Option<Instant>,
}

impl ConnTimers {
    /// When timer `kind` is due, if set.
    pub(crate) fn get(&self, kind: ConnTimer) -> Option<Instant> {
        self.at[kind as usize]
    }

    /// Whether timer `kind` is set.
    pub(crate) fn is_set(&self, kind: ConnTimer) -> bool {
        self.get(kind).is_some()
    }

    /// Stops timer `kind` (its heap entry, if any, comes due to nothing).
    pub(crate) fn stop(&mut self, kind: ConnTimer) {
        self.at[kind as usize] = None;
    }

    /// Stops every timer: the connection starts over (a new connect attempt).
    pub(crate) fn stop_all(&mut self) {
        *self = ConnTimers::default();
    }

    /// The earliest timer set.
    fn next(&self) -> Option<Instant> {
        self.at.iter().flatten().min().copied()
    }

    /// Takes the next timer due at or before `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<ConnTimer> {
        let kind = ConnTimer::ALL
            .into_iter()
            .find(|&k| self.at[k as usize].is_some_and(|at| at <= now))?;
        self.at[kind as usize] = None;
        Some(kind)
    }
}

/// An entry of the heap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Timer {
    /// Connection `slot` (while it has `generation`) has a timer due.
    Conn { slot: u32, generation: u32 },
    /// Request `handle`'s deadline.
    Deadline(u64),
    /// A recv whose deadline passed and whose `CANCEL` was sent: failed locally if the
    /// responder's verdict has not come by now.
    CancelWait(u64),
    /// The same for one recv fused into the request `handle`.
    MemberCancelWait { handle: u64, index: u32 },
    /// The deadline of one recv fused into the request `handle`.
    Member { handle: u64, index: u32 },
    /// The deadline the peer gave its recv `handle` (its `timeout_ms`).
    ServeDeadline {
        slot: u32,
        generation: u32,
        handle: u64,
    },
}

/// Timers kept before the first sweep of entries whose object is gone.
const SWEEP_MIN: usize = 1024;

/// Timers by due time; entries whose object is gone are skipped when they come up.
pub(crate) struct Timers {
    heap: BinaryHeap<Reverse<(Instant, Timer)>>,
    /// Entry count above which [`sweep`](Self::sweep) looks at the entries.
    sweep_at: usize,
}

impl Default for Timers {
    fn default() -> Timers {
        Timers::with_capacity(0)
    }
}

impl Timers {
    pub(crate) fn with_capacity(n: usize) -> Timers {
        Timers {
            heap: BinaryHeap::with_capacity(n),
            sweep_at: SWEEP_MIN,
        }
    }

    /// Drops the entries `live` says are of objects gone (requests answered, connections
    /// closed), when entries outnumber twice those kept at the last sweep: they stay in
    /// the heap until they come up, so without this a long deadline on many short
    /// requests would grow it. Amortized O(1) per entry.
    pub(crate) fn sweep(&mut self, live: impl FnMut(&Timer) -> bool) {
        if self.heap.len() <= self.sweep_at {
            return;
        }
        self.retain(live);
        self.sweep_at = 2 * self.heap.len() + SWEEP_MIN;
    }

    /// Adds a request's timer.
    pub(crate) fn add(&mut self, at: Instant, timer: Timer) {
        self.heap.push(Reverse((at, timer)));
    }

    /// Sets timer `kind` of connection `slot` (of `generation`, whose timers are `t`) to
    /// come due at `at`, replacing the one set before.
    pub(crate) fn set(
        &mut self,
        t: &mut ConnTimers,
        slot: u32,
        generation: u32,
        kind: ConnTimer,
        at: Instant,
    ) {
        t.at[kind as usize] = Some(at);
        self.schedule(t, slot, generation);
    }

    /// Makes sure the connection's earliest timer has a heap entry (after `set`, or once
    /// its due timers were handled).
    pub(crate) fn schedule(&mut self, t: &mut ConnTimers, slot: u32, generation: u32) {
        let Some(next) = t.next() else {
            return;
        };
        if t.scheduled.map_or(true, |s| next < s) {
            t.scheduled = Some(next);
            self.add(next, Timer::Conn { slot, generation });
        }
    }

    /// The connection's heap entry due at `at` came up.
    pub(crate) fn came_due(t: &mut ConnTimers, at: Instant) {
        if t.scheduled == Some(at) {
            t.scheduled = None;
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }

    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&Timer) -> bool) {
        self.heap.retain(|Reverse((_, t))| keep(t));
    }

    /// When the next timer is due.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _))| *at)
    }

    /// The next timer due at or before `now`, and when it was due.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<(Instant, Timer)> {
        match self.heap.peek() {
            Some(Reverse((at, _))) if *at <= now => self.heap.pop().map(|Reverse(e)| e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Fires what is due at `now` for connection (3, 9), as the session does.
    fn fire(heap: &mut Timers, t: &mut ConnTimers, now: Instant) -> Vec<ConnTimer> {
        let mut fired = Vec::new();
        while let Some((at, timer)) = heap.pop_due(now) {
            assert_eq!(
                timer,
                Timer::Conn {
                    slot: 3,
                    generation: 9
                }
            );
            Timers::came_due(t, at);
            while let Some(kind) = t.pop_due(now) {
                fired.push(kind);
            }
            heap.schedule(t, 3, 9);
        }
        fired
    }

    #[test]
    fn a_connection_keeps_one_timer_of_each_kind_set_and_stopped_by_kind() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let (mut heap, mut t) = (Timers::default(), ConnTimers::default());
        heap.set(&mut t, 3, 9, ConnTimer::Heartbeat, ms(100));
        heap.set(&mut t, 3, 9, ConnTimer::Progress, ms(50));
        // Later than the earliest: no entry of its own.
        heap.set(&mut t, 3, 9, ConnTimer::FrameHead, ms(70));
        assert_eq!(heap.len(), 2);
        // Set again: replaced, not added.
        heap.set(&mut t, 3, 9, ConnTimer::Progress, ms(60));
        assert_eq!(t.get(ConnTimer::Progress), Some(ms(60)));
        t.stop(ConnTimer::FrameHead);
        assert!(!t.is_set(ConnTimer::FrameHead));

        assert_eq!(fire(&mut heap, &mut t, ms(55)), []);
        assert_eq!(heap.next(), Some(ms(60)), "the next timer has an entry");
        assert_eq!(fire(&mut heap, &mut t, ms(60)), [ConnTimer::Progress]);
        assert_eq!(
            fire(&mut heap, &mut t, ms(99)),
            [],
            "the frame head was stopped"
        );
        assert_eq!(fire(&mut heap, &mut t, ms(100)), [ConnTimer::Heartbeat]);
        assert_eq!(heap.next(), None, "nothing set, nothing left");

        // Stopped all (a new connect attempt): nothing fires.
        heap.set(&mut t, 3, 9, ConnTimer::Handshake, ms(200));
        t.stop_all();
        assert_eq!(fire(&mut heap, &mut t, ms(300)), []);
    }
}
