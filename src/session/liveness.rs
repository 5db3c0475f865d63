//! Keeping connections honest and alive: the frame-head and progress timers (a peer that
//! stalls in the middle of what it sends is closed), the heartbeat (a silent peer is
//! probed, then declared lost), and closing with an `ERROR` that says why. The timers'
//! handlers are in `timer.rs`.

use std::time::Instant;

use super::conn::{mark_dirty, Phase};
use super::timer::Timer;
use super::Session;
use crate::error::Error;
use crate::wire::Status;

impl Session {
    /// Starts the frame-head timer when a frame's header or meta section has begun to
    /// arrive and is not complete (`STARWIRE_FRAME_TIMEOUT_MS`): a peer that stalls or
    /// trickles bytes there is disconnected instead of holding the connection forever.
    pub(super) fn watch_frame_head(&mut self, slot: u32, now: Instant) {
        let Some(conn) = self.conns.get_mut(slot as usize) else {
            return;
        };
        let in_head = conn.phase != Phase::Closing && conn.proto.decoder().in_frame_head();
        if !in_head {
            conn.head_since = None;
            return;
        }
        conn.head_since.get_or_insert(now);
        if !conn.head_timer {
            // One timer per connection, however many frame heads arrive in pieces: when it
            // fires early for a later head, it is set again for that head's deadline.
            conn.head_timer = true;
            let timer = Timer::FrameHead {
                slot,
                generation: conn.generation,
            };
            self.timers.push(now + self.cfg.frame_timeout, timer);
        }
    }

    /// Counts `n` bytes toward the progress of what connection `slot` owes (a frame begun,
    /// chunked tensors announced), and starts the `Progress` timer when something is owed
    /// (`STARWIRE_PROGRESS_TIMEOUT_MS`): a peer that stops or trickles in the middle of
    /// what it sends is disconnected instead of holding memory and the connection forever.
    pub(super) fn watch_progress(&mut self, slot: u32, n: u64, now: Instant) {
        let Some(conn) = self.conns.get_mut(slot as usize) else {
            return;
        };
        if conn.phase == Phase::Closing || conn.proto.is_closed() {
            return;
        }
        let decoder = conn.proto.decoder();
        let owed = !decoder.is_idle() || decoder.chunks_pending() > 0;
        let p = &mut conn.progress;
        if !owed {
            p.since = None;
            return;
        }
        match p.since {
            Some(_) => p.bytes += n,
            None => {
                p.since = Some(now);
                p.bytes = 0;
            }
        }
        if !p.timer {
            p.timer = true;
            let timer = Timer::Progress {
                slot,
                generation: conn.generation,
            };
            self.timers.push(now + self.cfg.progress_timeout, timer);
        }
    }

    /// Sends an `ERROR` (`status`, `reason`) on connection `slot` and closes it once that
    /// is written (or after `STARWIRE_CLOSE_LINGER_MS`); its requests fail with `failure`.
    pub(super) fn close_with_error(
        &mut self,
        slot: u32,
        status: Status,
        reason: &'static str,
        failure: Error,
        now: Instant,
    ) {
        let Some(conn) = self.conns.get_mut(slot as usize) else {
            return;
        };
        if conn.phase == Phase::Closing || conn.proto.is_closed() {
            return;
        }
        conn.proto.abort(status, reason);
        self.linger_then_close(slot, failure, now);
    }

    /// Connection `slot`, whose protocol has closed with an `ERROR` queued, fails its
    /// requests with `failure` once it is released; the `ERROR` may go out first, but not
    /// for long (`STARWIRE_CLOSE_LINGER_MS`): a peer that does not read must not keep the
    /// connection. No new request goes out behind the `ERROR`.
    pub(super) fn linger_then_close(&mut self, slot: u32, failure: Error, now: Instant) {
        let Some(conn) = self.conns.get_mut(slot as usize) else {
            return;
        };
        conn.failure = failure;
        mark_dirty(&mut self.dirty, conn, slot);
        let generation = conn.generation;
        self.timers.push(
            now + self.cfg.close_linger,
            Timer::Close { slot, generation },
        );
        self.unroute(slot);
    }

    /// Starts the heartbeat of connection `slot`, just opened (off when the interval is 0).
    pub(super) fn start_heartbeat(&mut self, slot: u32, now: Instant) {
        let interval = self.cfg.heartbeat_interval;
        let Some(conn) = self.conns.get_mut(slot as usize) else {
            return;
        };
        if interval.is_zero() || conn.heartbeat_timer {
            return;
        }
        conn.heartbeat_timer = true;
        conn.last_heard = now;
        let timer = Timer::Heartbeat {
            slot,
            generation: conn.generation,
        };
        let first = interval.min(self.cfg.heartbeat_timeout);
        self.timers.push(now + first, timer);
    }
}
