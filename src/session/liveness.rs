//! Keeping connections honest and alive: a peer that stalls in the middle of a frame head
//! or of bytes it owes is closed (`STARWIRE_FRAME_TIMEOUT_MS`,
//! `STARWIRE_PROGRESS_TIMEOUT_MS`), and a silent peer is probed, then declared lost (the
//! heartbeat). Each watch is one of the connection's timers; its verdict goes back to the
//! session, which acts on it.

use std::time::{Duration, Instant};

use super::conn::{Conn, Phase, Progress};
use super::timer::{ConnTimer, Timers};

/// Bytes a connection that owes bytes must deliver in each `progress_timeout` window (or
/// finish what it owed): far below any working link, far above a trickle.
pub(crate) const PROGRESS_MIN_BYTES: u64 = 4096;

/// The handle of heartbeat `PING`s: generation 0, so it never names a request; their
/// `PONG`s are recognised by it and dropped.
pub(crate) const HEARTBEAT_HANDLE: u64 = crate::ctx::CtxKey::internal(1).to_raw();

/// The limits a connection is watched against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub frame_timeout: Duration,
    pub progress_timeout: Duration,
    pub heartbeat_interval: Duration,
    pub heartbeat_timeout: Duration,
    /// Answer bytes an accepted connection may have queued before it stops being read.
    pub answer_backlog: u64,
}

/// What a watch found when its timer came due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// All is well (the watch goes on, or is over).
    Fine,
    /// A heartbeat `PING` was queued: the connection has output.
    Probed,
    /// The peer stalled in the middle of what it sends: close it, saying why.
    Stalled(&'static str),
    /// The peer has been silent for the heartbeat timeout: it is lost.
    Silent(Duration),
}

impl Conn {
    /// After bytes arrived: the frame-head timer runs while a frame's header or meta
    /// section has begun to arrive and is not complete, so that a peer that stalls or
    /// trickles bytes there is closed instead of holding the connection forever.
    pub(crate) fn watch_frame_head(
        &mut self,
        slot: u32,
        timers: &mut Timers,
        l: &Limits,
        now: Instant,
    ) {
        // A connection not read (its answers piled up) is not stalling.
        let in_head =
            self.phase != Phase::Closing && !self.paused && self.proto.decoder().in_frame_head();
        if !in_head {
            self.head_since = None;
            self.timers.stop(ConnTimer::FrameHead);
            return;
        }
        if self.head_since.is_none() {
            self.head_since = Some(now);
            let at = now + l.frame_timeout;
            timers.set(
                &mut self.timers,
                slot,
                self.generation,
                ConnTimer::FrameHead,
                at,
            );
        }
    }

    /// The frame-head timer came due.
    pub(crate) fn frame_head_due(
        &mut self,
        slot: u32,
        timers: &mut Timers,
        l: &Limits,
        now: Instant,
    ) -> Verdict {
        let Some(since) = self.head_since else {
            return Verdict::Fine;
        };
        if since + l.frame_timeout > now {
            let at = since + l.frame_timeout;
            timers.set(
                &mut self.timers,
                slot,
                self.generation,
                ConnTimer::FrameHead,
                at,
            );
            return Verdict::Fine;
        }
        log::warn!(
            "connection {slot}: a frame's header and meta section did not arrive within {:?} \
             (STARWIRE_FRAME_TIMEOUT_MS); closing",
            l.frame_timeout
        );
        Verdict::Stalled("frame header and meta section not complete in time")
    }

    /// After bytes were decoded: while the connection owes bytes — the rest of chunked
    /// tensors it declared, or of the payload of the frame being received — the progress
    /// timer runs, and in each window at least [`PROGRESS_MIN_BYTES`] of what is owed (or
    /// all of it, when less is owed) must arrive: chunk bytes while chunked tensors are
    /// owed (whatever else the connection sends meanwhile: pings, small requests), else
    /// the frame's own payload. A peer that stops or trickles in the middle of what it owes
    /// is closed instead of holding memory and the connection forever.
    pub(crate) fn watch_progress(
        &mut self,
        slot: u32,
        timers: &mut Timers,
        l: &Limits,
        now: Instant,
    ) {
        if self.phase == Phase::Closing || self.proto.is_closed() {
            return;
        }
        let owed = self.proto.decoder().owed();
        if self.paused || (owed.chunked == 0 && owed.frame == 0) {
            self.progress.since = None;
            self.timers.stop(ConnTimer::Progress);
            return;
        }
        if self.progress.since.is_none() {
            self.new_window(now);
        }
        if !self.timers.is_set(ConnTimer::Progress) {
            let at = now + l.progress_timeout;
            timers.set(
                &mut self.timers,
                slot,
                self.generation,
                ConnTimer::Progress,
                at,
            );
        }
    }

    /// Starts a progress window at `now`, on what the connection owes now.
    fn new_window(&mut self, now: Instant) {
        let decoder = self.proto.decoder();
        let owed = decoder.owed();
        let chunks = owed.chunked > 0;
        let (base, owed) = match chunks {
            true => (decoder.chunk_bytes_in(), owed.chunked),
            false => (decoder.frame_bytes_in(), owed.frame),
        };
        self.progress = Progress {
            since: Some(now),
            chunks,
            base,
            need: owed.min(PROGRESS_MIN_BYTES),
        };
    }

    /// The progress timer came due: the connection is closed if it owed bytes for a whole
    /// window and delivered fewer of them than the window needs.
    pub(crate) fn progress_due(
        &mut self,
        slot: u32,
        timers: &mut Timers,
        l: &Limits,
        now: Instant,
    ) -> Verdict {
        let timeout = l.progress_timeout;
        let Some(since) = self.progress.since else {
            return Verdict::Fine; // nothing owed any more
        };
        if since + timeout > now {
            let at = since + timeout;
            timers.set(
                &mut self.timers,
                slot,
                self.generation,
                ConnTimer::Progress,
                at,
            );
            return Verdict::Fine;
        }
        let decoder = self.proto.decoder();
        let count = match self.progress.chunks {
            true => decoder.chunk_bytes_in(),
            false => decoder.frame_bytes_in(),
        };
        let got = count - self.progress.base;
        if got < self.progress.need {
            let what = if self.progress.chunks {
                "chunked tensors"
            } else {
                "a frame's payload"
            };
            log::warn!(
                "connection {slot}: the peer owes bytes of {what} and sent {got} of them in \
                 {timeout:?}, {} needed (STARWIRE_PROGRESS_TIMEOUT_MS); closing",
                self.progress.need
            );
            return Verdict::Stalled("no progress on a frame or chunked tensor in time");
        }
        // Enough arrived: a new window, on what is owed now.
        self.new_window(now);
        timers.set(
            &mut self.timers,
            slot,
            self.generation,
            ConnTimer::Progress,
            now + timeout,
        );
        Verdict::Fine
    }

    /// Starts the heartbeat of the connection, just opened (off when the interval is 0).
    pub(crate) fn start_heartbeat(
        &mut self,
        slot: u32,
        timers: &mut Timers,
        l: &Limits,
        now: Instant,
    ) {
        if l.heartbeat_interval.is_zero() || self.timers.is_set(ConnTimer::Heartbeat) {
            return;
        }
        self.last_heard = now;
        let first = l.heartbeat_interval.min(l.heartbeat_timeout);
        timers.set(
            &mut self.timers,
            slot,
            self.generation,
            ConnTimer::Heartbeat,
            now + first,
        );
    }

    /// The heartbeat timer came due: the connection is probed when it has been silent for
    /// an interval, declared lost when silent for the timeout.
    pub(crate) fn heartbeat_due(
        &mut self,
        slot: u32,
        timers: &mut Timers,
        l: &Limits,
        now: Instant,
    ) -> Verdict {
        if self.phase != Phase::Open {
            return Verdict::Fine;
        }
        if self.paused {
            // Not read because its answers piled up: its silence is ours.
            self.last_heard = now;
            let at = now + l.heartbeat_interval;
            timers.set(
                &mut self.timers,
                slot,
                self.generation,
                ConnTimer::Heartbeat,
                at,
            );
            return Verdict::Fine;
        }
        let silent = now.saturating_duration_since(self.last_heard);
        if silent >= l.heartbeat_timeout {
            log::warn!(
                "connection {slot}: nothing received for {silent:?} \
                 (STARWIRE_HEARTBEAT_TIMEOUT_MS); the peer is lost"
            );
            return Verdict::Silent(silent);
        }
        let (next, verdict) = if silent >= l.heartbeat_interval {
            let probed = self.proto.encoder().ping(HEARTBEAT_HANDLE, &[]).is_ok();
            let verdict = if probed {
                Verdict::Probed
            } else {
                Verdict::Fine
            };
            (now + l.heartbeat_interval, verdict)
        } else {
            (self.last_heard + l.heartbeat_interval, Verdict::Fine)
        };
        let at = next.min(self.last_heard + l.heartbeat_timeout);
        timers.set(
            &mut self.timers,
            slot,
            self.generation,
            ConnTimer::Heartbeat,
            at,
        );
        verdict
    }
}
