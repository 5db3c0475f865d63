//! Sans-IO connection: handshake, connection-level errors and ping answering on top of the
//! decoder and encoder. Requests and answers after the handshake are handed to the caller.

use super::{Decoder, EncodeError, Encoder, EncoderConfig, Error, Event, NextRead};
use crate::wire::{Body, FrameKind, HelloRepr, Limits, Side, Status, WireFeatures, HEADER_LEN};
use arrayvec::ArrayVec;
use core::fmt;
use std::borrow::Cow;

/// This task's identity and the handshake policy.
#[derive(Debug, Clone)]
pub struct Identity {
    /// Cluster both ends must share.
    pub cluster_id: u64,
    /// This task's job name (1-64 bytes of `[A-Za-z0-9_-]`).
    pub job: ArrayVec<u8, 64>,
    /// This task's index.
    pub task_index: u32,
    /// Token sent in `HELLO` and required from clients when set.
    pub token: Option<ArrayVec<u8, 64>>,
    /// The optional features this task announces (4.1). A server announces them only to a
    /// client that announced some.
    pub features: WireFeatures,
}

/// The peer's identity, known once the handshake completes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// Peer's job name.
    pub job: ArrayVec<u8, 64>,
    /// Peer's task index.
    pub task_index: u32,
    /// Every limit the peer announced for what it receives.
    pub limits: Limits,
    /// The optional features the peer announced, as it sent them.
    pub features: WireFeatures,
}

impl PeerInfo {
    /// The job name as text (lossy).
    pub fn job_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.job)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    AwaitHello,
    AwaitAck,
    Open,
    Closed,
}

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// The peer broke the protocol (we told it so with an `ERROR` frame).
    Protocol(Error),
    /// The peer refused us with a connection-level `ERROR`.
    Refused {
        /// The peer's status.
        status: Status,
        /// The peer's message.
        message: String,
    },
    /// We refused the peer's handshake (we told it with an `ERROR` frame).
    Rejected {
        /// Status sent.
        status: Status,
        /// Why.
        reason: Cow<'static, str>,
    },
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CloseReason::Protocol(e) => write!(f, "protocol violation: {e}"),
            CloseReason::Refused { status, message } => {
                write!(f, "refused by peer ({status:?}): {message}")
            }
            CloseReason::Rejected { status, reason } => {
                write!(f, "rejected the peer ({status:?}): {reason}")
            }
        }
    }
}

/// What the connection hands to its owner.
#[derive(Debug)]
pub enum ConnEvent<'a> {
    /// The handshake completed.
    Opened,
    /// A request, or an answer to one of ours, after the handshake. `PING`s are answered
    /// by the connection itself and never appear here.
    Frame(super::Frame<'a>),
    /// Payload of the last frame handed out.
    Payload {
        /// Where the bytes belong.
        target: super::PayloadTarget,
        /// Offset in the target.
        offset: u64,
        /// The bytes.
        data: &'a [u8],
    },
    /// The last frame handed out is complete.
    FrameEnd(crate::wire::HeaderRepr),
}

/// What the connection's owner wants after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Go on decoding.
    Continue,
    /// Finish the frame being decoded, then stop: the bytes after it stay buffered until
    /// the next [`Connection::process`].
    Pause,
}

/// One connection's protocol state.
#[derive(Debug)]
pub struct Connection {
    state: State,
    decoder: Decoder,
    encoder: Encoder,
    identity: Identity,
    peer: Option<PeerInfo>,
    closed: Option<CloseReason>,
    /// Payload of the ping being received, echoed when it is complete.
    ping: Vec<u8>,
    ping_handle: Option<u64>,
    /// `PING`s answered so far, and their bytes (header and payload).
    pings: u64,
    ping_bytes: u64,
}

impl Connection {
    /// A connection for `side`. A client queues its `HELLO` at once.
    pub fn new(
        side: Side,
        identity: Identity,
        limits: Limits,
        recv_buffer: usize,
        encoder: EncoderConfig,
    ) -> Connection {
        // Until the peer announces its max_frame, send no frame above the protocol minimum.
        let encoder = Encoder::new(EncoderConfig {
            max_frame: Limits::MIN_FRAME,
            ..encoder
        });
        let mut conn = Connection {
            state: match side {
                Side::Client => State::AwaitAck,
                Side::Server => State::AwaitHello,
            },
            decoder: Decoder::new(limits, recv_buffer),
            encoder,
            identity,
            peer: None,
            closed: None,
            ping: Vec::new(),
            ping_handle: None,
            pings: 0,
            ping_bytes: 0,
        };
        if side == Side::Client {
            let hello = conn.hello(false, conn.identity.features);
            if let Err(e) = conn.encoder.hello(&hello.as_repr(), false) {
                log::error!("cannot encode hello: {e}");
            }
        }
        conn
    }

    fn hello(&self, ack: bool, features: WireFeatures) -> OwnedHello {
        OwnedHello {
            features,
            cluster_id: self.identity.cluster_id,
            task_index: self.identity.task_index,
            limits: *self.decoder.limits(),
            job: self.identity.job.clone(),
            token: if ack {
                ArrayVec::new()
            } else {
                self.identity.token.clone().unwrap_or_default()
            },
        }
    }

    /// `PING`s answered so far (each with its `PONG`), and the bytes of those frames.
    pub fn pings(&self) -> (u64, u64) {
        (self.pings, self.ping_bytes)
    }

    /// Whether the handshake completed and the connection is usable.
    pub fn is_open(&self) -> bool {
        self.state == State::Open
    }

    /// Whether the connection has ended (after flushing what is queued, close the socket).
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Why the connection ended.
    pub fn close_reason(&self) -> Option<&CloseReason> {
        self.closed.as_ref()
    }

    /// The peer, once the handshake completed.
    pub fn peer(&self) -> Option<&PeerInfo> {
        self.peer.as_ref()
    }

    /// The optional features this connection uses: those both ends announced (none before
    /// the handshake completed).
    pub fn features(&self) -> WireFeatures {
        self.decoder.features()
    }

    /// The optional features this end announces (or, a client, announced in its `HELLO`).
    pub fn announced(&self) -> WireFeatures {
        self.identity.features
    }

    /// The decoder (for the I/O layer: buffers, direct placement, counters).
    pub fn decoder(&mut self) -> &mut Decoder {
        &mut self.decoder
    }

    /// Where the next bytes from the socket go.
    pub fn next_read(&self) -> NextRead {
        self.decoder.next_read()
    }

    /// The encoder (to queue requests and answers, and to write its output).
    pub fn encoder(&mut self) -> &mut Encoder {
        &mut self.encoder
    }

    /// Closes the connection locally with a connection-level `ERROR` carrying `status`
    /// (e.g. the loop is shutting down).
    pub fn abort(&mut self, status: Status, reason: impl Into<Cow<'static, str>>) {
        let reason = CloseReason::Rejected {
            status,
            reason: reason.into(),
        };
        close(
            &mut self.state,
            &mut self.closed,
            &mut self.encoder,
            reason,
            Some(status),
        );
    }

    /// Decodes everything buffered. Handshake, pings and connection-level errors are
    /// handled here; every other event (requests and answers after the handshake, their
    /// payload, their end) is passed to `on_event` together with the encoder, so answers
    /// can be queued at once. Returns whether anything was decoded. When the connection
    /// closes, [`close_reason`](Self::close_reason) says why.
    pub fn process(&mut self, mut on_event: impl FnMut(ConnEvent<'_>, &mut Encoder) -> Flow) -> bool {
        let mut progress = false;
        let mut pause = false;
        while self.state != State::Closed {
            if pause && self.decoder.at_frame_start() {
                break;
            }
            let ev = match self.decoder.poll() {
                Ok(Some(ev)) => ev,
                Ok(None) => break,
                Err(e) => {
                    let status = e.status();
                    close(
                        &mut self.state,
                        &mut self.closed,
                        &mut self.encoder,
                        CloseReason::Protocol(e),
                        Some(status),
                    );
                    break;
                }
            };
            progress = true;
            let open = self.state == State::Open;
            match ev {
                Event::Frame(f) => match (f.header.kind, f.body) {
                    (FrameKind::Hello | FrameKind::HelloAck, Body::Hello(h) | Body::HelloAck(h)) if !open => {
                        let (kind, hello) = (f.header.kind, OwnedHello::from_repr(&h));
                        if self.handshake(kind, hello) {
                            pause |= on_event(ConnEvent::Opened, &mut self.encoder) == Flow::Pause;
                        }
                    }
                    (FrameKind::Error, Body::Error(e)) if f.header.handle == 0 => {
                        let reason = CloseReason::Refused {
                            status: f.header.status,
                            message: String::from_utf8_lossy(e.message).into_owned(),
                        };
                        close(
                            &mut self.state,
                            &mut self.closed,
                            &mut self.encoder,
                            reason,
                            None,
                        );
                    }
                    _ if !open || matches!(f.header.kind, FrameKind::Hello | FrameKind::HelloAck) => {
                        let reason = CloseReason::Rejected {
                            status: Status::Protocol,
                            reason: Cow::Borrowed(if open {
                                "second handshake"
                            } else {
                                "frame before the handshake"
                            }),
                        };
                        close(
                            &mut self.state,
                            &mut self.closed,
                            &mut self.encoder,
                            reason,
                            Some(Status::Protocol),
                        );
                    }
                    (FrameKind::Ping, _) => {
                        self.ping.clear();
                        self.ping_handle = Some(f.header.handle);
                        self.pings += 1;
                        self.ping_bytes += (HEADER_LEN + f.header.payload_len as usize) as u64;
                    }
                    _ => pause |= on_event(ConnEvent::Frame(f), &mut self.encoder) == Flow::Pause,
                },
                Event::Payload { data, .. } if self.ping_handle.is_some() => {
                    self.ping.extend_from_slice(data);
                }
                Event::Payload {
                    target,
                    offset,
                    data,
                } => {
                    let ev = ConnEvent::Payload {
                        target,
                        offset,
                        data,
                    };
                    pause |= on_event(ev, &mut self.encoder) == Flow::Pause;
                }
                Event::FrameEnd(h) => match self.ping_handle.take() {
                    Some(handle) => {
                        if let Err(e) = self.encoder.pong(handle, &self.ping) {
                            // The ping fit our max_frame but its echo does not fit the peer's.
                            log::debug!("cannot answer ping: {e}");
                            let _ = self.encoder.error(
                                handle,
                                Status::ResourceExhausted,
                                "pong too large",
                            );
                        }
                    }
                    None if matches!(h.kind, FrameKind::Hello | FrameKind::HelloAck | FrameKind::Error) => {}
                    None => pause |= on_event(ConnEvent::FrameEnd(h), &mut self.encoder) == Flow::Pause,
                },
            }
        }
        progress
    }

    /// Checks the peer's hello; answers it on the server side. Returns whether the
    /// connection is now open.
    fn handshake(&mut self, kind: FrameKind, hello: OwnedHello) -> bool {
        let expected = match self.state {
            State::AwaitHello => FrameKind::Hello,
            _ => FrameKind::HelloAck,
        };
        let refusal = if kind != expected {
            Some((Status::Protocol, "unexpected handshake frame"))
        } else if hello.cluster_id != self.identity.cluster_id {
            Some((Status::ClusterMismatch, "cluster id differs"))
        } else if kind == FrameKind::Hello
            && self
                .identity
                .token
                .as_ref()
                .is_some_and(|want| !constant_time_eq(want, &hello.token))
        {
            Some((Status::Unauthenticated, "cluster token missing or wrong"))
        } else {
            None
        };
        if let Some((status, reason)) = refusal {
            // A client that dislikes the HELLO_ACK just leaves; a server tells the client,
            // also when the client's first frame is a HELLO_ACK.
            let tell = (expected == FrameKind::Hello).then_some(status);
            let reason = CloseReason::Rejected {
                status,
                reason: reason.into(),
            };
            close(
                &mut self.state,
                &mut self.closed,
                &mut self.encoder,
                reason,
                tell,
            );
            return false;
        }
        if kind == FrameKind::Hello {
            // A client that announced no feature may be of an earlier release, which
            // rejects a HELLO_ACK whose `features` are not zero: it is told none.
            let ours = if hello.features.is_empty() {
                WireFeatures::NONE
            } else {
                self.identity.features
            };
            let ack = self.hello(true, ours);
            if let Err(e) = self.encoder.hello(&ack.as_repr(), true) {
                log::error!("cannot encode hello ack: {e}");
            }
        }
        let used = self.identity.features.negotiate(hello.features);
        self.decoder.set_features(used);
        self.encoder.set_features(used);
        self.encoder.set_peer_limits(Limits {
            max_frame: hello.limits.max_frame.min(Limits::MAX_FRAME),
            ..hello.limits
        });
        self.peer = Some(PeerInfo {
            job: hello.job,
            task_index: hello.task_index,
            limits: hello.limits,
            features: hello.features,
        });
        self.state = State::Open;
        true
    }

    /// Queues an error answer to the peer's request `handle`.
    pub fn answer_error(
        &mut self,
        handle: u64,
        status: Status,
        message: &str,
    ) -> Result<(), EncodeError> {
        self.encoder.error(handle, status, message)
    }
}

/// Ends the connection for `reason`, queueing a connection-level `ERROR` for the peer
/// where `status` is given. Works on fields so it can run while the decoder is borrowed.
fn close(
    state: &mut State,
    closed: &mut Option<CloseReason>,
    encoder: &mut Encoder,
    reason: CloseReason,
    status: Option<Status>,
) {
    if *state == State::Closed {
        return;
    }
    // The owner logs the reason (`close_reason`), with what it knows of the connection.
    if let Some(status) = status {
        let message = reason.to_string();
        if let Err(e) = encoder.error(0, status, &message) {
            log::debug!("cannot encode connection error: {e}");
        }
    }
    *state = State::Closed;
    *closed = Some(reason);
}

/// Compares without an early exit, so the time taken does not reveal where the first
/// difference is (the length may leak; tokens are at most 64 bytes).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | ((a.len() ^ b.len()) >> 8) as u8;
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0xff);
    }
    diff == 0
}

#[derive(Debug, Clone)]
struct OwnedHello {
    features: WireFeatures,
    cluster_id: u64,
    task_index: u32,
    limits: Limits,
    job: ArrayVec<u8, 64>,
    token: ArrayVec<u8, 64>,
}

impl OwnedHello {
    fn from_repr(h: &HelloRepr<'_>) -> Self {
        // Lengths were checked by the parser (at most 64 each).
        let mut job = ArrayVec::new();
        job.try_extend_from_slice(h.job).ok();
        let mut token = ArrayVec::new();
        token.try_extend_from_slice(h.token).ok();
        OwnedHello {
            features: h.features,
            cluster_id: h.cluster_id,
            task_index: h.task_index,
            limits: h.limits,
            job,
            token,
        }
    }

    fn as_repr(&self) -> HelloRepr<'_> {
        HelloRepr {
            cluster_id: self.cluster_id,
            task_index: self.task_index,
            limits: self.limits,
            job: &self.job,
            token: &self.token,
            features: self.features,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{PayloadTarget, Piece};
    use crate::wire::Status;

    fn identity(cluster_id: u64, job: &str, token: Option<&str>) -> Identity {
        let mut j = ArrayVec::new();
        j.try_extend_from_slice(job.as_bytes()).unwrap();
        Identity {
            cluster_id,
            job: j,
            task_index: 3,
            token: token.map(|t| {
                let mut v = ArrayVec::new();
                v.try_extend_from_slice(t.as_bytes()).unwrap();
                v
            }),
            features: WireFeatures::ALL,
        }
    }

    fn conn(side: Side, id: Identity) -> Connection {
        Connection::new(side, id, Limits::default(), 4096, EncoderConfig::default())
    }

    /// Moves everything `from` has queued into `to`'s decoder.
    fn transfer(from: &mut Connection, to: &mut Connection) {
        let enc = from.encoder();
        enc.fill(u64::MAX);
        let mut bytes = Vec::new();
        for p in enc.pieces() {
            match p {
                Piece::Bytes(b) => bytes.extend_from_slice(b),
                Piece::Tensor { .. } => panic!("no tensors in these tests"),
            }
        }
        let n = bytes.len() as u64;
        enc.advance(n);
        let mut at = 0;
        while at < bytes.len() {
            at += to.decoder().feed(&bytes[at..]);
            to.process(|_, _| Flow::Continue);
        }
    }

    #[derive(Debug, PartialEq)]
    enum Seen {
        Opened,
        Frame(FrameKind, u64),
        Payload(PayloadTarget, Vec<u8>),
        End(FrameKind),
    }

    fn events(c: &mut Connection) -> Vec<Seen> {
        let mut seen = Vec::new();
        c.process(|ev, _| {
            seen.push(match ev {
                ConnEvent::Opened => Seen::Opened,
                ConnEvent::Frame(f) => Seen::Frame(f.header.kind, f.header.handle),
                ConnEvent::Payload { target, data, .. } => Seen::Payload(target, data.to_vec()),
                ConnEvent::FrameEnd(h) => Seen::End(h.kind),
            });
            Flow::Continue
        });
        seen
    }

    /// Feeds what `from` has queued into `to` and returns what `to` reports.
    fn deliver(from: &mut Connection, to: &mut Connection) -> Vec<Seen> {
        let enc = from.encoder();
        enc.fill(u64::MAX);
        let bytes: Vec<u8> = enc
            .pieces()
            .flat_map(|p| match p {
                Piece::Bytes(b) => b.to_vec(),
                Piece::Tensor { .. } => Vec::new(),
            })
            .collect();
        enc.advance(bytes.len() as u64);
        to.decoder().feed(&bytes);
        events(to)
    }

    #[test]
    fn handshake_then_ping_is_answered_by_the_server() {
        let mut client = conn(Side::Client, identity(7, "worker", Some("s3cret")));
        let mut server = conn(Side::Server, identity(7, "ps", Some("s3cret")));
        assert_eq!(deliver(&mut client, &mut server), [Seen::Opened]);
        assert!(server.is_open());
        assert_eq!(server.peer().unwrap().job_str(), "worker");
        assert_eq!(deliver(&mut server, &mut client), [Seen::Opened]);
        assert_eq!(client.peer().unwrap().job_str(), "ps");

        client.encoder().ping(0x1_0000_0001, b"payload").unwrap();
        // The server answers the ping itself: its owner sees nothing.
        assert_eq!(deliver(&mut client, &mut server), []);
        assert_eq!(
            deliver(&mut server, &mut client),
            [
                Seen::Frame(FrameKind::Pong, 0x1_0000_0001),
                Seen::Payload(PayloadTarget::Opaque, b"payload".to_vec()),
                Seen::End(FrameKind::Pong),
            ]
        );
    }

    #[test]
    fn cluster_mismatch_is_refused_on_both_sides() {
        let mut client = conn(Side::Client, identity(1, "worker", None));
        let mut server = conn(Side::Server, identity(2, "ps", None));
        assert_eq!(deliver(&mut client, &mut server), []);
        assert!(server.is_closed());
        assert!(matches!(
            server.close_reason(),
            Some(CloseReason::Rejected {
                status: Status::ClusterMismatch,
                ..
            })
        ));
        assert_eq!(deliver(&mut server, &mut client), []);
        assert!(matches!(
            client.close_reason(),
            Some(CloseReason::Refused {
                status: Status::ClusterMismatch,
                message
            }) if message.contains("cluster")
        ));
    }

    #[test]
    fn wrong_or_missing_token_is_unauthenticated() {
        for token in [None, Some("wrong!"), Some("s3cre"), Some("s3cret!")] {
            let mut client = conn(Side::Client, identity(7, "worker", token));
            let mut server = conn(Side::Server, identity(7, "ps", Some("s3cret")));
            deliver(&mut client, &mut server);
            assert!(matches!(
                server.close_reason(),
                Some(CloseReason::Rejected {
                    status: Status::Unauthenticated,
                    ..
                })
            ));
            deliver(&mut server, &mut client);
            assert!(matches!(
                client.close_reason(),
                Some(CloseReason::Refused {
                    status: Status::Unauthenticated,
                    ..
                })
            ));
        }
    }

    #[test]
    fn frames_before_the_handshake_are_rejected() {
        // A "client" that skips HELLO and sends a ping.
        let mut rogue = conn(Side::Server, identity(7, "worker", None));
        rogue.encoder().ping(1, b"x").unwrap();
        let mut server = conn(Side::Server, identity(7, "ps", None));
        transfer(&mut rogue, &mut server);
        assert!(matches!(
            server.close_reason(),
            Some(CloseReason::Rejected {
                status: Status::Protocol,
                reason: std::borrow::Cow::Borrowed("frame before the handshake")
            })
        ));
    }

    #[test]
    fn a_second_hello_is_rejected() {
        let mut client = conn(Side::Client, identity(7, "worker", None));
        let mut server = conn(Side::Server, identity(7, "ps", None));
        deliver(&mut client, &mut server);
        deliver(&mut server, &mut client);
        let again = client.hello(false, WireFeatures::NONE);
        client.encoder().hello(&again.as_repr(), false).unwrap();
        deliver(&mut client, &mut server);
        assert!(matches!(
            server.close_reason(),
            Some(CloseReason::Rejected {
                reason: std::borrow::Cow::Borrowed("second handshake"),
                ..
            })
        ));
    }

    #[test]
    fn garbage_closes_with_a_protocol_error_frame() {
        let mut server = conn(Side::Server, identity(7, "ps", None));
        server
            .decoder()
            .feed(b"GET / HTTP/1.1\r\nHost: example.org\r\n\r\n");
        events(&mut server);
        assert!(matches!(
            server.close_reason(),
            Some(CloseReason::Protocol(Error::Wire(
                crate::wire::Error::BadMagic
            )))
        ));
        // The ERROR frame for the peer is queued.
        assert!(server.encoder().ready_bytes() > 0);
    }

    #[test]
    fn constant_time_eq_compares_exactly() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(constant_time_eq(b"", b""));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(!constant_time_eq(b"", b"a"));
        let a = [0u8; 256];
        let mut b = [0u8; 256];
        assert!(constant_time_eq(&a, &b));
        b[0] = 0; // lengths differing by 256 must not look equal
        assert!(!constant_time_eq(&a, &b[..0]));
    }
}
