//! One connection's state: its codec and phase, the requests waiting for it to open, the
//! tensors its output references, what the bytes being received belong to, the peer's
//! requests it is serving, and its timers. A new per-connection field is added here, in
//! [`Conn`] and [`Conn::new`], and nowhere else.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use slab::Slab;

use crate::error::{Error, ErrorKind, OsError};
use crate::proto::{CloseReason, Connection, Frame, PayloadTarget};
use crate::stats::add;
use crate::tensor::Tensor;
use crate::wire::{Body, FrameKind, Status};

use super::budget::{ConnBudget, Reservation};
use super::observer::Observer;
use super::push::Served;
use super::timer::ConnTimers;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Waiting to retry a failed connect.
    Backoff,
    /// Waiting for the connect to complete.
    Connecting,
    /// Connected, handshake in progress.
    Handshaking,
    /// Usable.
    Open,
    /// Closed: waiting for the loop to finish its operations and release it.
    Closing,
}

/// Whose request the items of a frame belong to: the peer's handles and ours are separate
/// namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Whose {
    /// One of this task's requests (an answer to it).
    Ours,
    /// One of the peer's requests (a push it sends).
    Peers,
}

impl Whose {
    /// Whose items a frame of `kind` carries.
    pub(crate) fn of(kind: FrameKind) -> Whose {
        match kind {
            FrameKind::Push | FrameKind::PushRows => Whose::Peers,
            _ => Whose::Ours,
        }
    }
}

/// What the bytes being received belong to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Inbound {
    /// No frame decoded yet.
    Idle,
    /// A frame whose inline tensors are the items of request `handle`.
    Frame { handle: u64, whose: Whose },
    /// A `CHUNK` of item `index` of request `handle`, whose bytes end at `end`.
    Chunk { handle: u64, index: u32, end: u64 },
}

/// Where payload goes: an item of a request (ours, or the peer's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Route {
    pub handle: u64,
    pub index: u32,
    pub whose: Whose,
}

/// What a connection lent to its receive in flight.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Lent {
    /// Its receive buffer.
    Buffer,
    /// The memory of the tensor `route` leads to.
    Tensor(Route),
}

/// A window in which a connection that owes bytes must deliver some of them.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Progress {
    /// When the window started; `None` while nothing is owed.
    pub since: Option<Instant>,
    /// Whether the window watches chunk bytes (chunked tensors are owed) rather than the
    /// payload of the frame being received.
    pub chunks: bool,
    /// The count of those bytes (the decoder's) when the window started.
    pub base: u64,
    /// Bytes the window needs: `PROGRESS_MIN_BYTES`, or all that was owed when less.
    pub need: u64,
}

pub(crate) struct Conn {
    pub proto: Connection,
    pub phase: Phase,
    /// Unique per connection and per connect attempt, so a timer never acts on a later
    /// connection that reuses its slot.
    pub generation: u32,
    /// `Some` for connections this task opened: the peer and lane they serve.
    pub outgoing: Option<(SocketAddr, u32)>,
    /// Connect attempts that failed (since it last opened).
    pub attempts: u32,
    /// When it was made: its first connect attempt, for an outgoing one.
    pub since: Instant,
    /// Why its last connect attempt failed, as the operating system said.
    pub connect_error: Option<OsError>,
    /// Requests waiting for the handshake (context handles).
    pub waiting: VecDeque<u64>,
    /// Whether the connection is in the session's list of connections with output.
    pub dirty: bool,
    /// What its requests get when it is closed.
    pub failure: Error,
    /// Tensors whose bytes the encoder references, by token, until written.
    pub out_tensors: Slab<Arc<Tensor>>,
    /// What the bytes being received belong to.
    pub inbound: Inbound,
    /// Chunked tensors declared and not complete, in the decoder's order: whose each is,
    /// and its length.
    pub chunks: VecDeque<(Whose, u64)>,
    /// The peer's requests being served on it.
    pub served: Served,
    pub timers: ConnTimers,
    /// When the frame head being received (partly) started to arrive.
    pub head_since: Option<Instant>,
    /// Progress of bytes the peer owes (a frame begun, chunked tensors announced).
    pub progress: Progress,
    /// When bytes last arrived (or the connection opened): for the heartbeat.
    pub last_heard: Instant,
    /// What the receive in flight writes into, lent out until it completes.
    pub lent: Option<Lent>,
    /// The encoder's arena bytes as last added to the loop's `send_arena_bytes`.
    pub arena_counted: usize,
    /// Its account of the receive budget.
    pub budget: ConnBudget,
    /// Index of its peer's metric block (`observer::NO_PEER`: none).
    pub peer: u32,
    /// Reading is paused: its peer does not read its answers, which are over the backlog.
    pub paused: bool,
    /// Answer memory charged to the receive budget, by the token of the tensor it is in,
    /// until that tensor is written.
    pub held: Vec<(u64, Reservation)>,
    /// What of its codec's counts the loop's counters have.
    pub counted: Counted,
    /// The log has said that its peer takes rows only in their tables' dtype.
    pub told_fallback: bool,
}

/// A connection's codec counts as last added to the loop's counters.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Counted {
    pub frames_in: u64,
    pub frames_out: u64,
    pub pings: u64,
    pub ping_bytes: u64,
    pub blocks_allocated: u64,
}

impl Conn {
    pub(crate) fn new(
        proto: Connection,
        phase: Phase,
        generation: u32,
        budget: ConnBudget,
        peer: u32,
        now: Instant,
    ) -> Conn {
        Conn {
            proto,
            phase,
            generation,
            outgoing: None,
            attempts: 0,
            since: now,
            connect_error: None,
            waiting: VecDeque::new(),
            dirty: false,
            failure: Error::new(ErrorKind::ConnectionLost),
            out_tensors: Slab::new(),
            inbound: Inbound::Idle,
            chunks: VecDeque::new(),
            served: Served::default(),
            timers: ConnTimers::default(),
            head_since: None,
            progress: Progress::default(),
            last_heard: now,
            lent: None,
            arena_counted: 0,
            told_fallback: false,
            budget,
            peer,
            paused: false,
            held: Vec::new(),
            counted: Counted::default(),
        }
    }

    /// The peer this connection was opened to (`None` for an accepted one).
    pub(crate) fn peer_addr(&self) -> Option<SocketAddr> {
        self.outgoing.map(|(peer, _)| peer)
    }

    /// Whether it is the connection of `generation`, open and not closed by its protocol.
    pub(crate) fn is_live(&self, generation: u32) -> bool {
        self.generation == generation && self.phase == Phase::Open && !self.proto.is_closed()
    }

    /// Whether it can carry a new frame (open, and its protocol not closed).
    pub(crate) fn can_send(&self) -> bool {
        self.phase == Phase::Open && !self.proto.is_closed()
    }

    /// Drops the references the encoder no longer needs (and what was charged for them).
    pub(crate) fn release_tokens(&mut self) {
        let Conn {
            proto,
            out_tensors,
            held,
            ..
        } = self;
        proto.encoder().take_released(|t| {
            out_tensors.try_remove(t as usize);
            if !held.is_empty() {
                held.retain(|&(h, _)| h != t);
            }
        });
    }

    /// The peer and lane of an outgoing connection whose peer refused its handshake as a
    /// protocol violation although the handshake announced features: a peer of a release
    /// that has the field as reserved (`docs/wire-format.md` 4.1).
    pub(crate) fn refused_for_features(&self) -> Option<(SocketAddr, u32)> {
        let refused = matches!(
            self.proto.close_reason(),
            Some(CloseReason::Refused {
                status: Status::Protocol,
                ..
            })
        );
        let announced = !self.proto.announced().is_empty();
        (refused && announced && self.proto.peer().is_none())
            .then_some(self.outgoing)
            .flatten()
    }

    /// What its requests fail with, its protocol having closed: the peer's refusal, or the
    /// violation this task found (a protocol error, whichever side opened it).
    pub(crate) fn close_failure(&self) -> Error {
        match self.proto.close_reason() {
            Some(CloseReason::Refused { status, message }) => {
                Error::new(ErrorKind::Refused(*status)).with_message(message.as_str())
            }
            Some(CloseReason::Rejected {
                status: Status::Protocol,
                reason,
            }) => Error::new(ErrorKind::Protocol).with_message(&**reason),
            Some(CloseReason::Rejected { status, .. }) if self.outgoing.is_some() => {
                Error::new(ErrorKind::Refused(*status))
            }
            _ => Error::new(ErrorKind::Protocol),
        }
    }

    /// Adds the frames its codec decoded since the last call to the loop's `frames_in`, and
    /// the `PING`s it answered to its peer's metrics (a served `ping`).
    pub(crate) fn count_frames_in(&mut self, observer: &Observer) {
        let frames = self.proto.decoder().frames_in();
        add(
            &observer.counters().frames_in,
            frames - self.counted.frames_in,
        );
        self.counted.frames_in = frames;
        let (pings, bytes) = self.proto.pings();
        if pings != self.counted.pings {
            let (n, b) = (pings - self.counted.pings, bytes - self.counted.ping_bytes);
            observer.served_pings(self.peer, n, b);
            (self.counted.pings, self.counted.ping_bytes) = (pings, bytes);
        }
    }

    /// Bytes its queued answers hold: what the encoder copied and the answer memory
    /// charged to the budget ([`held`](Self::held)); tensors an answer references (a
    /// service's, the rendezvous') are not the connection's memory.
    pub(crate) fn answer_bytes(&mut self) -> u64 {
        answer_bytes(self.proto.encoder(), &self.held)
    }

    /// Where payload for `target` goes.
    pub(crate) fn route(&self, target: PayloadTarget) -> Option<Route> {
        route(target, self.inbound, &self.chunks)
    }
}

/// See [`Conn::answer_bytes`].
pub(crate) fn answer_bytes(enc: &crate::proto::Encoder, held: &[(u64, Reservation)]) -> u64 {
    enc.copied_bytes() + held.iter().map(|(_, r)| r.bytes()).sum::<u64>()
}

/// Frame `f` was decoded: what its bytes belong to, and the chunked tensors it declares
/// (mirroring the decoder's queue of them: it keeps every one it accepted, whatever is
/// done with the frame), noting whose they are.
pub(crate) fn receiving(inbound: &mut Inbound, chunks: &mut VecDeque<(Whose, u64)>, f: &Frame<'_>) {
    let (handle, whose) = (f.header.handle, Whose::of(f.header.kind));
    *inbound = match f.body {
        Body::Chunk(c) => Inbound::Chunk {
            handle,
            index: c.index,
            end: c.offset + f.header.payload_len as u64,
        },
        _ => Inbound::Frame { handle, whose },
    };
    for t in f.body.tensors().filter(|t| t.meta.chunked) {
        chunks.push_back((whose, t.meta.byte_len));
    }
}

/// Where payload for `target` goes: the current frame's item (inline tensors), or the
/// oldest incomplete chunked tensor's (chunks, whose `chunks` lists).
pub(crate) fn route(
    target: PayloadTarget,
    inbound: Inbound,
    chunks: &VecDeque<(Whose, u64)>,
) -> Option<Route> {
    match (target, inbound) {
        (PayloadTarget::Tensor { index }, Inbound::Frame { handle, whose }) => Some(Route {
            handle,
            index,
            whose,
        }),
        (PayloadTarget::Chunk { handle, index }, _) => Some(Route {
            handle,
            index,
            whose: chunks.front()?.0,
        }),
        _ => None,
    }
}
