//! The loop's connections: the table they live in, which connection carries requests to
//! each peer and lane, which have output to write, and the socket operations the loop must
//! start for them.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasherDefault;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use slab::Slab;

use crate::config::Config;
use crate::error::{Error, ErrorKind, OsError};
use crate::proto::{Connection, EncoderConfig, Identity, Side};
use crate::wire::WireFeatures;

use super::budget::{Budget, ConnBudget};
use super::conn::{Conn, Phase};
use super::observer::{Observer, NO_PEER};
use super::timer::{ConnTimer, Timers};

/// What the loop must do with a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Open a socket for connection `slot` and connect it to `addr`; report the outcome
    /// with [`Session::connected`](super::Session::connected) or
    /// [`Session::connect_failed`](super::Session::connect_failed).
    Connect { slot: u32, addr: SocketAddr },
    /// Connection `slot` is closed: stop its I/O (shut the socket down) and, once no
    /// operation is in flight on it, call [`Session::release`](super::Session::release).
    Close { slot: u32 },
}

/// Connections with output to write, each listed once.
#[derive(Default)]
pub(crate) struct Dirty(Vec<u32>);

impl Dirty {
    /// Lists connection `slot` (`conn`), once.
    pub(crate) fn mark(&mut self, conn: &mut Conn, slot: u32) {
        if !conn.dirty {
            conn.dirty = true;
            self.0.push(slot);
        }
    }
}

/// The loop's connections.
pub(crate) struct Conns {
    pub slab: Slab<Conn>,
    /// The connection carrying requests to each (peer, lane).
    routes: HashMap<(SocketAddr, u32), u32, BuildHasherDefault<PeerHasher>>,
    pub dirty: Dirty,
    actions: VecDeque<Action>,
    /// Source of connection generations.
    serial: u32,
    cfg: Arc<Config>,
    /// This task's identity, sent in the handshake.
    identity: Identity,
    /// The task's receive budget, of which each connection has a part.
    budget: Arc<Budget>,
    /// Peers that refused a handshake announcing features (a release before them):
    /// connections to them announce none.
    plain_peers: HashSet<SocketAddr>,
}

impl Conns {
    pub(crate) fn new(cfg: Arc<Config>, identity: Identity, budget: Arc<Budget>) -> Conns {
        Conns {
            slab: Slab::with_capacity(64),
            routes: HashMap::default(),
            dirty: Dirty(Vec::with_capacity(64)),
            actions: VecDeque::new(),
            serial: 0,
            cfg,
            identity,
            budget,
            plain_peers: HashSet::new(),
        }
    }

    /// `peer` refused a handshake that announced features: connections to it announce
    /// none from now on.
    pub(crate) fn announce_nothing_to(&mut self, peer: SocketAddr) {
        if self.plain_peers.insert(peer) {
            log::warn!(
                "{peer} refused a handshake that announced wire features (a release before \
                 them): connecting again without; STARWIRE_WIRE_FEATURES=none avoids the \
                 refused handshake"
            );
        }
    }

    /// Whether connections to `peer` announce no feature.
    pub(crate) fn is_plain(&self, peer: SocketAddr) -> bool {
        self.plain_peers.contains(&peer)
    }

    /// The peer and lane to connect to again without features, when connection `slot`
    /// was refused for the features it announced (and its peer is known for that).
    pub(crate) fn to_connect_plainly(&self, slot: u32) -> Option<(SocketAddr, u32)> {
        let again = self.get(slot).and_then(Conn::refused_for_features)?;
        self.is_plain(again.0).then_some(again)
    }

    /// A new connection's state, on `side`, at `now`, for peer `peer` (its metrics index),
    /// announcing `features`.
    fn new_conn(
        &mut self,
        side: Side,
        phase: Phase,
        peer: u32,
        now: Instant,
        features: WireFeatures,
    ) -> Conn {
        let encoder = EncoderConfig {
            chunk_size: self.cfg.chunk_size,
            keep_bytes: usize::try_from(self.cfg.send_arena_keep).unwrap_or(usize::MAX),
            ..EncoderConfig::default()
        };
        let proto = Connection::new(
            side,
            Identity {
                features,
                ..self.identity.clone()
            },
            self.cfg.limits,
            self.cfg.recv_buffer,
            encoder,
        );
        let generation = self.next_serial();
        let budget = ConnBudget::new(&self.budget);
        Conn::new(proto, phase, generation, budget, peer, now)
    }

    /// The task's receive budget.
    #[cfg(test)]
    pub(crate) fn budget(&self) -> &Budget {
        &self.budget
    }

    /// A new generation, unique among this loop's connections and connect attempts.
    pub(crate) fn next_serial(&mut self) -> u32 {
        self.serial = self.serial.wrapping_add(1);
        self.serial
    }

    /// Connection `slot`.
    #[inline]
    pub(crate) fn get(&self, slot: u32) -> Option<&Conn> {
        self.slab.get(slot as usize)
    }

    /// Connection `slot`.
    #[inline]
    pub(crate) fn get_mut(&mut self, slot: u32) -> Option<&mut Conn> {
        self.slab.get_mut(slot as usize)
    }

    /// Connection `slot` if it is the one a timer or an answer was meant for (same
    /// `generation`) and not closing.
    pub(crate) fn of_generation(&mut self, slot: u32, generation: u32) -> Option<&mut Conn> {
        self.slab
            .get_mut(slot as usize)
            .filter(|c| c.generation == generation && c.phase != Phase::Closing)
    }

    /// The peer connection `slot` was opened to, named in its requests' errors.
    pub(crate) fn peer_addr(&self, slot: u32) -> Option<SocketAddr> {
        self.get(slot).and_then(Conn::peer_addr)
    }

    /// The connection carrying requests to `(peer, lane)`, if there is one.
    pub(crate) fn route(&self, peer: SocketAddr, lane: u32) -> Option<u32> {
        self.routes.get(&(peer, lane)).copied()
    }

    /// Adds `conn`; an outgoing one carries the requests to its peer and lane from now on.
    pub(crate) fn insert(&mut self, conn: Conn) -> u32 {
        let key = conn.outgoing;
        let slot = self.slab.insert(conn) as u32;
        if let Some(key) = key {
            self.routes.insert(key, slot);
        }
        slot
    }

    /// Takes `slot` out of the routing table: later requests to its peer and lane open a
    /// new connection.
    pub(crate) fn unroute(&mut self, slot: u32) {
        if let Some(key) = self.get(slot).and_then(|c| c.outgoing) {
            if self.routes.get(&key) == Some(&slot) {
                self.routes.remove(&key);
            }
        }
    }

    /// Lists connection `slot` as having output.
    pub(crate) fn mark_dirty(&mut self, slot: u32) {
        if let Some(conn) = self.slab.get_mut(slot as usize) {
            self.dirty.mark(conn, slot);
        }
    }

    /// Moves the connections with output into `out` (emptied first).
    pub(crate) fn take_dirty(&mut self, out: &mut Vec<u32>) {
        out.clear();
        std::mem::swap(&mut self.dirty.0, out);
        for &slot in out.iter() {
            if let Some(c) = self.slab.get_mut(slot as usize) {
                c.dirty = false;
            }
        }
    }

    /// Asks the loop to start a socket operation.
    pub(crate) fn act(&mut self, action: Action) {
        self.actions.push_back(action);
    }

    /// The next socket operation the loop must start, if any.
    pub(crate) fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// The connection carrying requests to `(peer, lane)`, opened now (to be connected by
    /// the loop) if there is none; `index` is the peer's metrics index.
    pub(crate) fn outgoing(
        &mut self,
        peer: SocketAddr,
        lane: u32,
        index: impl FnOnce() -> u32,
        timers: &mut Timers,
        now: Instant,
    ) -> u32 {
        if let Some(slot) = self.route(peer, lane) {
            return slot;
        }
        let features = match self.is_plain(peer) {
            true => WireFeatures::NONE,
            false => self.identity.features,
        };
        let conn = Conn {
            outgoing: Some((peer, lane)),
            ..self.new_conn(Side::Client, Phase::Backoff, index(), now, features)
        };
        let slot = self.insert(conn);
        self.connect(slot, timers, now);
        slot
    }

    /// Asks the loop to connect `slot`; connect and handshake share one time limit.
    pub(crate) fn connect(&mut self, slot: u32, timers: &mut Timers, now: Instant) {
        let Some(conn) = self.slab.get_mut(slot as usize) else {
            return;
        };
        let Some((addr, _)) = conn.outgoing else {
            return;
        };
        conn.phase = Phase::Connecting;
        let at = now + self.cfg.handshake_timeout;
        let generation = conn.generation;
        timers.set(&mut conn.timers, slot, generation, ConnTimer::Handshake, at);
        self.act(Action::Connect { slot, addr });
    }

    /// The connect of `slot` succeeded: the handshake starts.
    pub(crate) fn connected(&mut self, slot: u32) {
        let Some(conn) = self.slab.get_mut(slot as usize) else {
            return;
        };
        if conn.phase != Phase::Connecting {
            return;
        }
        conn.phase = Phase::Handshaking;
        self.mark_dirty(slot);
    }

    /// A connect attempt of `slot` failed for `why` (the loop has closed its socket):
    /// retried after a backoff when `retry` and attempts are left (retry `n`, from 0, waits
    /// [`Config::connect_delay`]`(n)`), else given up: what waits fails with
    /// `CONNECT_FAILED`, naming the attempts and the last reason, when the loop releases it.
    pub(crate) fn connect_failed(
        &mut self,
        slot: u32,
        retry: bool,
        why: OsError,
        timers: &mut Timers,
        observer: &Observer,
        now: Instant,
    ) {
        let serial = self.next_serial();
        let Some(conn) = self.slab.get_mut(slot as usize) else {
            return;
        };
        if conn.phase == Phase::Closing {
            return;
        }
        conn.attempts += 1;
        conn.connect_error = Some(why);
        let peer = conn.peer_addr();
        if conn.attempts <= self.cfg.connect_retries && retry {
            let delay = self.cfg.connect_delay(conn.attempts - 1);
            conn.phase = Phase::Backoff;
            // A new attempt: the timers of the last one are void.
            conn.generation = serial;
            conn.timers.stop_all();
            observer.reconnect(conn.peer);
            log::debug!(
                "connect to {peer:?} failed: {why} (attempt {}); retrying in {delay:?}",
                conn.attempts
            );
            let at = now + delay;
            timers.set(&mut conn.timers, slot, serial, ConnTimer::Reconnect, at);
        } else {
            self.give_up(slot, observer, now);
        }
    }

    /// The connect and handshake of `slot` did not complete within `handshake_timeout`: a
    /// connect the peer never answered is given up (`CONNECT_FAILED`, timed out; another
    /// attempt would wait as long again), a handshake the peer never finished loses the
    /// connection.
    pub(crate) fn handshake_due(&mut self, slot: u32, observer: &Observer, now: Instant) {
        let Some(conn) = self.slab.get_mut(slot as usize) else {
            return;
        };
        match conn.phase {
            Phase::Connecting => {
                conn.attempts += 1;
                conn.connect_error = Some(OsError::TIMED_OUT);
                self.give_up(slot, observer, now);
            }
            Phase::Handshaking => {
                log::warn!("connection {slot}: handshake timed out");
                let why = "the handshake did not complete within handshake_timeout \
                           (STARWIRE_HANDSHAKE_TIMEOUT_MS)";
                let mut e = Error::new(ErrorKind::ConnectionLost).with_message(why);
                if let Some(peer) = conn.peer_addr() {
                    e = e.with_peer(peer);
                }
                self.lose(slot, e, observer);
            }
            _ => {}
        }
    }

    /// Gives up connecting `slot`: what waits for it fails with `CONNECT_FAILED`, naming the
    /// peer, the attempts made and the last reason.
    fn give_up(&mut self, slot: u32, observer: &Observer, now: Instant) {
        let Some(conn) = self.slab.get_mut(slot as usize) else {
            return;
        };
        let over = now.saturating_duration_since(conn.since);
        let mut e =
            Error::new(ErrorKind::ConnectFailed).with_connect_attempts(conn.attempts, Some(over));
        if let Some(why) = conn.connect_error {
            e = e.with_os_error(why);
        }
        if let Some(peer) = conn.peer_addr() {
            e = e.with_peer(peer);
        }
        conn.failure = observer.named(conn.peer, e);
        log::warn!("giving up: {}", conn.failure);
        self.close(slot);
    }

    /// The error of a request on `slot` whose deadline passed: a timeout naming the peer
    /// and, while the connection is still being made, the connect attempts that failed so
    /// far and why the last one did.
    pub(crate) fn timeout(&self, slot: u32) -> Error {
        let mut e = Error::new(ErrorKind::Timeout);
        let Some(conn) = self.get(slot) else {
            return e;
        };
        if let Some(peer) = conn.peer_addr() {
            e = e.with_peer(peer);
        }
        let connecting = matches!(
            conn.phase,
            Phase::Backoff | Phase::Connecting | Phase::Handshaking
        );
        if connecting && conn.outgoing.is_some() {
            e = e.with_connect_attempts(conn.attempts, None);
            if let Some(why) = conn.connect_error {
                e = e.with_os_error(why);
            }
        }
        e
    }

    /// Adds a connection the loop accepted: its handshake must complete in time.
    pub(crate) fn adopt(&mut self, timers: &mut Timers, now: Instant) -> u32 {
        let features = self.identity.features;
        let conn = self.new_conn(Side::Server, Phase::Handshaking, NO_PEER, now, features);
        let generation = conn.generation;
        let slot = self.insert(conn);
        let at = now + self.cfg.handshake_timeout;
        if let Some(conn) = self.slab.get_mut(slot as usize) {
            timers.set(&mut conn.timers, slot, generation, ConnTimer::Handshake, at);
        }
        slot
    }

    /// Closes connection `slot` for `why`: its requests fail once the loop releases it.
    pub(crate) fn lose(&mut self, slot: u32, why: Error, observer: &Observer) {
        let Some(conn) = self.slab.get_mut(slot as usize) else {
            return;
        };
        if conn.phase == Phase::Closing {
            return;
        }
        observer.lost(conn.peer);
        // A reason the protocol found (a refusal, a violation) outranks what the socket
        // said afterwards (usually the peer closing it).
        if !conn.proto.is_closed() {
            conn.failure = why;
        }
        self.close(slot);
    }

    /// Connection `slot`, whose protocol has closed with an `ERROR` queued, fails its
    /// requests with `failure` once it is released; the `ERROR` may go out first, but not
    /// for long (`STARWIRE_CLOSE_LINGER_MS`): a peer that does not read must not keep the
    /// connection. No new request goes out behind the `ERROR`.
    pub(crate) fn linger(&mut self, slot: u32, failure: Error, timers: &mut Timers, now: Instant) {
        let Some(conn) = self.slab.get_mut(slot as usize) else {
            return;
        };
        conn.failure = failure;
        let at = now + self.cfg.close_linger;
        let generation = conn.generation;
        timers.set(&mut conn.timers, slot, generation, ConnTimer::Close, at);
        self.mark_dirty(slot);
        self.unroute(slot);
    }

    /// The peer closed connection `slot` (its stream ended). A close between frames, with
    /// nothing owed and no request of this task on it (`ours` says whether there is one), is
    /// a clean close; otherwise the connection is lost (counted in `connections_lost`), and
    /// what is in flight on it fails with `CONNECTION_LOST`.
    pub(crate) fn peer_closed(
        &mut self,
        slot: u32,
        ours: impl Fn(&Conn) -> bool,
        observer: &Observer,
    ) {
        let Some(conn) = self.get_mut(slot) else {
            return;
        };
        let decoder = conn.proto.decoder();
        let between_frames = decoder.is_idle() && decoder.chunks_pending() == 0;
        let why = Error::new(ErrorKind::ConnectionLost);
        if between_frames && conn.phase != Phase::Closing && !ours(conn) {
            log::debug!("connection {slot}: peer closed the connection");
            conn.failure = why;
            observer.closed();
            return self.close(slot);
        }
        log::debug!("connection {slot}: peer closed the connection in the middle of an exchange");
        self.lose(slot, why, observer);
    }

    /// Marks `slot` closed and asks the loop to close its socket; later requests to its
    /// peer open a new connection.
    pub(crate) fn close(&mut self, slot: u32) {
        if let Some(c) = self.get_mut(slot) {
            c.phase = Phase::Closing;
        }
        self.unroute(slot);
        self.act(Action::Close { slot });
    }
}

/// Hashes the (peer, lane) keys of the routing table, looked up once per request. The
/// keys are addresses this task's own trainer names, never bytes from the network, so a
/// fast multiplicative hash is enough (std's SipHash cost more than the rest of routing a
/// request).
#[derive(Default)]
pub(crate) struct PeerHasher(u64);

impl std::hash::Hasher for PeerHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u8(b);
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.write_u64(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}
