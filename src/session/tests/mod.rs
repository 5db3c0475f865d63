//! The session in memory: a client session and a server session joined by a simulated
//! wire, with simulated time. No sockets, no threads, no clock.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use super::*;
use crate::config::Config;
use crate::rendezvous::{Delivery, DeliverySink, Rendezvous};
use crate::service::{Service, SharedService};
use crate::stats::Counters;
use crate::tensor::{HeapAllocator, Tensor};
use crate::wire::{DType, HEADER_LEN};

const PEER: &str = "127.0.0.1:7000";

/// Answers a pull of id `i` with `i` float values, each `i`; refuses id 0.
struct Table;

impl Service for Table {
    fn pull(&self, ids: &[u64], out: &mut Vec<Result<Arc<Tensor>, Status>>) {
        for &id in ids {
            if id == 0 {
                out.push(Err(Status::NotFound));
                continue;
            }
            let values = vec![id as f32; id as usize];
            out.push(Ok(Arc::new(Tensor::from_f32(&[id], &values).unwrap())));
        }
    }

    fn push(&self, items: &mut Vec<(u64, Tensor)>, statuses: &mut Vec<Status>) {
        for (id, t) in items.iter() {
            let ok = t.to_f32().iter().all(|&v| v == *id as f32);
            statuses.push(if ok {
                Status::Ok
            } else {
                Status::InvalidArgument
            });
        }
    }
}

/// Keeps what a rendezvous hands to the loop, for the test to pass on.
#[derive(Default)]
struct Posted(Mutex<Vec<Delivery>>);

impl DeliverySink for Posted {
    fn post(&self, d: Delivery) {
        self.0.lock().unwrap().push(d);
    }
}

fn session(cfg: Config, service: Option<SharedService>, rv: Option<Arc<Rendezvous>>) -> Session {
    let parts = SessionParts {
        service,
        rendezvous: rv,
        jobs: None,
        index: 0,
        allocator: Arc::new(HeapAllocator::default()),
        zero_copy_min: 16 * 1024,
        budget: super::Budget::of(&cfg),
        checkpoints: None,
        no_checkpoints: "no tables",
    };
    let counters = Arc::new(CachePadded::new(Counters::default()));
    Session::new(Arc::new(cfg), counters, parts)
}

/// A client session, a server session and the one connection between them.
struct Pair {
    client: Session,
    server: Session,
    /// The connection's slot in each.
    c: Option<u32>,
    s: Option<u32>,
    now: Instant,
    next_tag: u64,
    posted: Arc<Posted>,
    rendezvous: Arc<Rendezvous>,
    /// Bytes the client sent, kept for replaying.
    to_client: Vec<u8>,
    dirty: Vec<u32>,
}

impl Pair {
    fn new() -> Pair {
        Pair::with(Config::builder("worker", 0), Config::builder("ps", 0))
    }

    fn with(client: crate::config::ConfigBuilder, server: crate::config::ConfigBuilder) -> Pair {
        Pair::serving(client, server, Arc::new(Table))
    }

    /// A pair whose server answers with `service`.
    fn serving(
        client: crate::config::ConfigBuilder,
        server: crate::config::ConfigBuilder,
        service: SharedService,
    ) -> Pair {
        let rendezvous = Rendezvous::new();
        let posted = Arc::new(Posted::default());
        rendezvous.attach(vec![posted.clone()]);
        Pair {
            client: session(client.build().unwrap(), None, None),
            server: session(
                server.build().unwrap(),
                Some(service),
                Some(rendezvous.clone()),
            ),
            c: None,
            s: None,
            now: Instant::now(),
            next_tag: 1,
            posted,
            rendezvous,
            to_client: Vec::new(),
            dirty: Vec::new(),
        }
    }

    fn submit(&mut self, op: RequestOp, deadline: Option<Duration>) -> u64 {
        let tag = self.next_tag;
        self.next_tag += 1;
        self.client.submit_local(Request {
            op,
            peer: PEER.parse().unwrap(),
            task: None,
            lane: 0,
            deadline: deadline.map(|d| self.now + d),
            tag,
            spare: Spare::default(),
            trace: Default::default(),
        });
        tag
    }

    /// Runs the client's drain pass and carries out its socket actions: a connect is
    /// accepted by the server at once.
    fn drain(&mut self) {
        self.client.drain_requests(self.now);
        self.actions();
    }

    fn actions(&mut self) {
        while let Some(a) = self.client.poll_action() {
            match a {
                Action::Connect { slot, addr } => {
                    assert_eq!(addr, PEER.parse::<SocketAddr>().unwrap());
                    self.c = Some(slot);
                    self.s = Some(self.server.adopt(self.now));
                    self.client.connected(slot);
                }
                Action::Close { slot } => {
                    drop(self.client.release(slot));
                    self.c = None;
                }
            }
        }
        while let Some(a) = self.server.poll_action() {
            match a {
                Action::Close { slot } => {
                    drop(self.server.release(slot));
                    self.s = None;
                }
                Action::Connect { .. } => panic!("the server connected somewhere"),
            }
        }
    }

    /// Everything `from` has to send on `slot`, as the wire would carry it.
    fn output(from: &mut Session, dirty: &mut Vec<u32>, slot: Option<u32>) -> Vec<u8> {
        let mut out = Vec::new();
        from.take_dirty(dirty);
        let Some(slot) = slot else {
            return out;
        };
        loop {
            let mut sink = Collect::default();
            from.transmit(slot, 1 << 20, &mut sink);
            for (block, buf) in sink.blocks.drain(..) {
                from.restore_block(slot, block, buf);
            }
            if sink.bytes.is_empty() {
                return out;
            }
            let now = from.last_now;
            from.sent(slot, sink.bytes.len(), now);
            out.extend_from_slice(&sink.bytes);
        }
    }

    /// Feeds `bytes` to `to`'s connection `slot` where it asks for them.
    fn input(to: &mut Session, slot: Option<u32>, bytes: &[u8], now: Instant) {
        Pair::input_some(to, slot, bytes, now);
    }

    /// Feeds `bytes` to `to`'s connection `slot` while it asks for them; returns how many it
    /// took (a connection that stops reading leaves the rest, as a socket would keep them).
    fn input_some(to: &mut Session, slot: Option<u32>, bytes: &[u8], now: Instant) -> usize {
        let Some(slot) = slot else {
            return 0;
        };
        let mut taken = 0;
        while taken < bytes.len() {
            let Some(RecvPlace {
                mut mem,
                start,
                len,
                ..
            }) = to.lend_recv(slot)
            else {
                break;
            };
            let n = len.min(bytes.len() - taken);
            loan_bytes(&mut mem)[start..start + n].copy_from_slice(&bytes[taken..taken + n]);
            to.received(slot, mem, n, now);
            taken += n;
        }
        taken
    }

    /// Moves bytes both ways until neither side has anything to say.
    fn pump(&mut self) {
        loop {
            let up = Pair::output(&mut self.client, &mut self.dirty, self.c);
            Pair::input(&mut self.server, self.s, &up, self.now);
            self.actions();
            let posted: Vec<Delivery> = std::mem::take(&mut *self.posted.0.lock().unwrap());
            for d in posted {
                self.server.deliver_recv(d);
            }
            let down = Pair::output(&mut self.server, &mut self.dirty, self.s);
            self.to_client.extend_from_slice(&down);
            Pair::input(&mut self.client, self.c, &down, self.now);
            self.actions();
            if up.is_empty() && down.is_empty() {
                return;
            }
        }
    }

    /// Moves what the server has to say to the client (and nothing the other way).
    fn pump_server_only(&mut self) {
        let down = Pair::output(&mut self.server, &mut self.dirty, self.s);
        self.to_client.extend_from_slice(&down);
        Pair::input(&mut self.client, self.c, &down, self.now);
        self.actions();
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
        self.client.handle_timeout(self.now);
        self.server.handle_timeout(self.now);
        self.actions();
    }

    fn completions(&mut self) -> Vec<Completion> {
        std::iter::from_fn(|| self.client.take_local()).collect()
    }

    fn publish(&self, key: &[u8], v: f32) {
        let t = Tensor::from_f32(&[1], &[v]).unwrap();
        self.rendezvous.publish(key, Arc::new(t)).unwrap();
    }
}

fn recv(step: u64, key: &[u8]) -> RequestOp {
    RequestOp::Recv {
        step,
        keys: vec![key.to_vec()],
    }
}

fn pull(ids: &[u64]) -> RequestOp {
    RequestOp::Pull {
        ids: ids.to_vec(),
        alloc: None,
    }
}

fn received_values(c: &Completion) -> Vec<f32> {
    match &c.result {
        Ok(Reply::Received(v)) => v
            .iter()
            .flat_map(|t| t.as_ref().unwrap().to_f32())
            .collect(),
        other => panic!("not a recv answer: {other:?}"),
    }
}

#[test]
fn a_ping_measures_simulated_time() {
    let mut p = Pair::new();
    // The first ping goes out when the handshake completes, and is answered at once.
    p.submit(RequestOp::Ping { payload: 0 }, None);
    p.drain();
    p.pump();
    assert_eq!(p.completions().len(), 1);
    // The second goes up now; its answer comes back 3 ms later.
    let tag = p.submit(RequestOp::Ping { payload: 16 }, None);
    p.drain();
    let up = Pair::output(&mut p.client, &mut p.dirty, p.c);
    Pair::input(&mut p.server, p.s, &up, p.now);
    p.now += Duration::from_millis(3);
    p.pump();
    let done = p.completions();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].tag, tag);
    let want = Reply::Pong {
        rtt: Duration::from_millis(3),
        payload: 16,
    };
    assert_eq!(done[0].result, Ok(want));
}

#[test]
fn a_late_answer_to_a_request_given_up_is_dropped_while_its_slot_serves_another() {
    let mut p = Pair::new();
    p.submit(RequestOp::Ping { payload: 0 }, None);
    p.drain();
    p.pump();
    assert_eq!(p.completions().len(), 1, "the connection is open");
    // A ping reaches the server, whose answer is held back past the ping's deadline.
    p.submit(
        RequestOp::Ping { payload: 8 },
        Some(Duration::from_millis(5)),
    );
    p.drain();
    let up = Pair::output(&mut p.client, &mut p.dirty, p.c);
    Pair::input(&mut p.server, p.s, &up, p.now);
    let late = Pair::output(&mut p.server, &mut p.dirty, p.s);
    assert!(!late.is_empty());
    p.advance(Duration::from_millis(10));
    let done = p.completions();
    assert_eq!(done.len(), 1);
    assert_eq!(
        done[0].result.as_ref().err().map(|e| e.kind()),
        Some(ErrorKind::Timeout)
    );
    // Another ping takes the freed request slot (another generation) and is in flight when
    // the late answer comes: the late one is recognised as given up, not taken for it.
    let tag = p.submit(RequestOp::Ping { payload: 24 }, None);
    p.drain();
    Pair::input(&mut p.client, p.c, &late, p.now);
    assert!(
        p.completions().is_empty(),
        "the late answer completes nothing"
    );
    p.pump();
    let done = p.completions();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].tag, tag);
    assert!(
        matches!(done[0].result, Ok(Reply::Pong { payload: 24, .. })),
        "{:?}",
        done[0].result
    );
    assert!(p.c.is_some(), "the same connection");
}

#[test]
fn a_pull_gets_each_id_or_its_status() {
    let mut p = Pair::new();
    p.submit(pull(&[3, 0, 1]), None);
    p.drain();
    p.pump();
    let done = p.completions();
    let Ok(Reply::Pulled(items)) = &done[0].result else {
        panic!("{done:?}");
    };
    assert_eq!(items.len(), 3);
    assert_eq!(items[0].as_ref().unwrap().to_f32(), vec![3.0; 3]);
    assert_eq!(items[1].as_ref().unwrap_err(), &Status::NotFound);
    assert_eq!(items[2].as_ref().unwrap().to_f32(), vec![1.0]);
}

#[test]
fn large_tensors_arrive_in_chunks_in_place_and_intact() {
    // 64 KiB chunks; tensors of 300 KB and 200 KB interleave their chunks on the wire.
    let mut p = Pair::with(
        Config::builder("worker", 0),
        Config::builder("ps", 0).chunk_size(64 << 10),
    );
    p.submit(pull(&[75_000, 50_000, 2]), None);
    p.drain();
    p.pump();
    let done = p.completions();
    let Ok(Reply::Pulled(items)) = &done[0].result else {
        panic!("{done:?}");
    };
    for (item, id) in items.iter().zip([75_000u64, 50_000, 2]) {
        let values = item.as_ref().unwrap().to_f32();
        assert_eq!(values.len(), id as usize);
        assert!(values.iter().all(|&v| v == id as f32));
    }
    // Of the 500,008 payload bytes, at most one chunk's worth was read ahead into the
    // receive buffer and copied; the rest went straight into the tensors.
    let copied = p
        .client
        .counters()
        .payload_copied
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(copied <= 64 << 10, "{copied} payload bytes copied");
}

#[test]
fn recvs_of_one_pass_go_out_as_one_frame_and_complete_one_by_one() {
    let mut p = Pair::with(
        Config::builder("worker", 0).tensor_fuse(true),
        Config::builder("ps", 0),
    );
    p.publish(b"a", 1.0);
    p.publish(b"c", 3.0);
    let (a, b, c) = (
        p.submit(recv(7, b"a"), None),
        p.submit(recv(7, b"b"), None),
        p.submit(recv(7, b"c"), None),
    );
    p.drain();
    p.pump();
    // The HELLO, then one request frame carried all three keys.
    let frames_in = p
        .server
        .counters()
        .frames_in
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(frames_in, 2);
    // The two published keys are answered without waiting for the third.
    let done = p.completions();
    let tags: Vec<u64> = done.iter().map(|c| c.tag).collect();
    assert_eq!(tags, vec![a, c]);
    assert_eq!(received_values(&done[0]), vec![1.0]);
    assert_eq!(received_values(&done[1]), vec![3.0]);
    p.publish(b"b", 2.0);
    p.pump();
    let done = p.completions();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].tag, b);
    assert_eq!(received_values(&done[0]), vec![2.0]);
}

#[test]
fn a_recv_past_its_deadline_is_dropped_by_the_responder_and_a_later_tensor_stays() {
    let mut p = Pair::new();
    let slow = p.submit(recv(1, b"late"), Some(Duration::from_millis(10)));
    p.drain();
    p.pump();
    assert!(p.completions().is_empty());
    p.advance(Duration::from_millis(9));
    p.pump();
    assert!(p.completions().is_empty());
    // Both ends reach the deadline: the server drops its waiter and says so, the client
    // asks it to (CANCEL); the verdict fails the recv.
    p.advance(Duration::from_millis(1));
    p.pump();
    let done = p.completions();
    assert_eq!(done.len(), 1);
    assert_eq!(
        (done[0].tag, done[0].result.clone_err()),
        (slow, Some(ErrorKind::Timeout))
    );
    // Published afterwards, the tensor is not consumed by the recv given up: it waits for
    // the next one.
    p.publish(b"late", 1.0);
    p.pump();
    assert!(p.completions().is_empty());
    assert_eq!(p.rendezvous.ready_count(), 1);
    let again = p.submit(recv(1, b"late"), None);
    p.drain();
    p.pump();
    let done = p.completions();
    assert_eq!(done[0].tag, again);
    assert_eq!(received_values(&done[0]), [1.0]);
}

#[test]
fn a_tensor_taken_as_the_deadline_passes_is_delivered_or_put_back_never_lost() {
    for deliver_first in [false, true] {
        let mut p = Pair::new();
        let tag = p.submit(recv(1, b"k"), Some(Duration::from_millis(10)));
        p.drain();
        p.pump();
        // The client's deadline passes first (its CANCEL is queued, not yet sent); the
        // tensor is published at that moment, so the server's waiter takes it.
        p.now += Duration::from_millis(10);
        p.client.handle_timeout(p.now);
        p.publish(b"k", 7.0);
        if deliver_first {
            // The server answers with the tensor before the CANCEL reaches it.
            let posted: Vec<Delivery> = std::mem::take(&mut *p.posted.0.lock().unwrap());
            for d in posted {
                p.server.deliver_recv(d);
            }
        }
        p.pump();
        let done = p.completions();
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].tag, tag);
        if deliver_first {
            // Late, but delivered.
            assert_eq!(received_values(&done[0]), [7.0]);
            assert_eq!(p.rendezvous.ready_count(), 0);
        } else {
            // Cancelled first: the tensor went back to the rendezvous.
            assert_eq!(done[0].result.clone_err(), Some(ErrorKind::Timeout));
            assert_eq!(p.rendezvous.ready_count(), 1);
        }
    }
}

#[test]
fn fused_recvs_keep_their_own_deadlines() {
    let mut p = Pair::with(
        Config::builder("worker", 0).tensor_fuse(true),
        Config::builder("ps", 0),
    );
    p.publish(b"x", 5.0);
    let quick = p.submit(recv(2, b"never"), Some(Duration::from_millis(5)));
    let ready = p.submit(recv(2, b"x"), Some(Duration::from_millis(50)));
    p.drain();
    p.pump();
    let frames_in = p
        .server
        .counters()
        .frames_in
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(frames_in, 2, "the HELLO; the two recvs went out fused");
    let done = p.completions();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].tag, ready);
    // The quick one's deadline: its item is cancelled alone, and fails once the server
    // confirms.
    p.advance(Duration::from_millis(5));
    p.pump();
    let done = p.completions();
    assert_eq!(done.len(), 1);
    assert_eq!(
        (done[0].tag, done[0].result.clone_err()),
        (quick, Some(ErrorKind::Timeout))
    );
    // The server holds no waiter for it any more: a tensor published now stays.
    p.publish(b"never", 1.0);
    p.pump();
    assert_eq!(p.rendezvous.ready_count(), 1);
}

#[test]
fn a_responder_that_never_confirms_a_cancel_fails_the_recv_after_the_wait() {
    let mut p = Pair::new();
    let tag = p.submit(recv(1, b"k"), Some(Duration::from_millis(10)));
    p.drain();
    p.pump();
    // From now on the server's bytes are lost.
    p.advance(Duration::from_millis(10));
    let _ = Pair::output(&mut p.client, &mut p.dirty, p.c);
    assert!(p.completions().is_empty(), "the verdict is awaited");
    p.advance(requests::deadline::CANCEL_WAIT - Duration::from_millis(1));
    assert!(p.completions().is_empty());
    p.advance(Duration::from_millis(1));
    let done = p.completions();
    assert_eq!(
        (done[0].tag, done[0].result.clone_err()),
        (tag, Some(ErrorKind::Timeout))
    );
}

#[test]
fn a_duplicate_answer_closes_the_connection_and_fails_what_is_in_flight() {
    let mut p = Pair::new();
    p.submit(pull(&[1]), None);
    p.drain();
    p.pump();
    assert_eq!(p.completions().len(), 1);
    // A recv stays in flight while the server's last frame arrives a second time.
    let waiting = p.submit(recv(1, b"pending"), None);
    p.drain();
    p.pump();
    let replay = {
        // The last frame the server sent: the pull's answer (it follows the handshake).
        let hello_ack_len = p.to_client.len() - last_frame_len(&p.to_client);
        p.to_client[hello_ack_len..].to_vec()
    };
    Pair::input(&mut p.client, p.c, &replay, p.now);
    // The client answers with an ERROR frame and closes once it is written.
    p.pump();
    let done = p.completions();
    assert_eq!(done.len(), 1);
    assert_eq!(
        (done[0].tag, done[0].result.clone_err()),
        (waiting, Some(ErrorKind::Protocol))
    );
    assert!(p.c.is_none(), "the client closed the connection");
}

/// The length of the last frame in `stream` (frames are walked by their headers).
fn last_frame_len(stream: &[u8]) -> usize {
    let mut at = 0;
    let mut last = 0;
    while at < stream.len() {
        let h = crate::wire::Header::new_checked(&stream[at..]).unwrap();
        let len = HEADER_LEN + h.meta_len() as usize + h.payload_len() as usize;
        last = len;
        at += len;
    }
    last
}

#[test]
fn losing_the_peer_fails_requests_in_flight_and_waiting() {
    let mut p = Pair::new();
    let sent = p.submit(recv(1, b"k"), None);
    p.drain();
    p.pump();
    // A second request queued behind a connection that is then lost.
    let c = p.c.unwrap();
    p.client.lose(c, Error::new(ErrorKind::ConnectionLost));
    let queued = p.submit(RequestOp::Ping { payload: 0 }, None);
    p.client.drain_requests(p.now);
    // The close is carried out (release) only now: until then the memory of the
    // request's answer may still be in use by a receive.
    assert!(p.completions().is_empty());
    let mut actions = Vec::new();
    while let Some(a) = p.client.poll_action() {
        actions.push(a);
    }
    assert_eq!(actions[0], Action::Close { slot: c });
    drop(p.client.release(c));
    let done = p.completions();
    assert_eq!(done.len(), 1);
    assert_eq!(
        (done[0].tag, done[0].result.clone_err()),
        (sent, Some(ErrorKind::ConnectionLost))
    );
    // The ping went to a new connection.
    assert!(matches!(actions[1], Action::Connect { .. }));
    assert!(queued > sent);
}

#[test]
fn a_refused_handshake_fails_requests_with_the_peer_s_status() {
    let mut p = Pair::with(
        Config::builder("worker", 0).cluster_id(1),
        Config::builder("ps", 0).cluster_id(2),
    );
    let tag = p.submit(RequestOp::Ping { payload: 0 }, None);
    p.drain();
    p.pump();
    // The server has queued its ERROR and closes after it is written; the client closes
    // on reading it.
    p.advance(Duration::from_secs(2));
    p.pump();
    let done = p.completions();
    assert_eq!(done.len(), 1);
    assert_eq!(
        (done[0].tag, done[0].result.clone_err()),
        (tag, Some(ErrorKind::Refused(Status::ClusterMismatch)))
    );
    // The error names the peer and says what it said.
    let e = done[0].result.as_ref().unwrap_err();
    assert_eq!(e.peer(), Some(PEER.parse().unwrap()));
    let said = e.remote_message().unwrap();
    assert!(said.contains("cluster id differs"), "{said}");
}

fn error_statuses(bytes: &[u8]) -> Vec<Status> {
    let mut d = crate::proto::Decoder::new(crate::wire::Limits::default(), 1 << 20);
    let mut out = Vec::new();
    let mut rest = bytes;
    loop {
        let n = d.feed(rest);
        rest = &rest[n..];
        let mut progressed = false;
        while let Ok(Some(ev)) = d.poll() {
            progressed = true;
            if let crate::proto::Event::Frame(f) = ev {
                if f.header.kind == crate::wire::FrameKind::Error {
                    out.push(f.header.status);
                }
            }
        }
        if rest.is_empty() || (!progressed && n == 0) {
            return out;
        }
    }
}

#[test]
fn a_pushed_tensor_reaches_the_service() {
    let mut p = Pair::new();
    let good = Arc::new(Tensor::from_f32(&[2], &[4.0, 4.0]).unwrap());
    let bad = Arc::new(Tensor::from_f32(&[1], &[1.0]).unwrap());
    let big = Arc::new(Tensor::zeros(DType::F32, &[40_000]).unwrap());
    let items = vec![(4, good), (5, bad), (0, big)];
    p.submit(RequestOp::Push { items }, None);
    p.drain();
    p.pump();
    let done = p.completions();
    let want = vec![Status::Ok, Status::InvalidArgument, Status::Ok];
    assert_eq!(done[0].result, Ok(Reply::Pushed(want)));
}

#[test]
fn requests_over_max_served_fail_alone() {
    let mut p = Pair::with(
        Config::builder("worker", 0),
        Config::builder("ps", 0).max_served(2),
    );
    let waiting: Vec<u64> = (0..3)
        .map(|i| p.submit(recv(1, format!("k{i}").as_bytes()), None))
        .collect();
    p.drain();
    p.pump();
    // Two recvs wait on the server; the third is refused, and only it fails.
    let done = p.completions();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].tag, waiting[2]);
    let refused = Some(ErrorKind::Remote(Status::ResourceExhausted));
    assert_eq!(done[0].result.clone_err(), refused);
    p.publish(b"k0", 0.0);
    p.publish(b"k1", 1.0);
    p.pump();
    let tags: Vec<u64> = p.completions().iter().map(|c| c.tag).collect();
    assert_eq!(tags, waiting[..2]);
}

/// Memory from here counts its drops.
struct Counting(Arc<std::sync::atomic::AtomicUsize>);

impl crate::tensor::TensorAllocator for Counting {
    fn allocate(
        &self,
        desc: &crate::tensor::TensorDesc<'_>,
    ) -> Option<Box<dyn crate::tensor::TensorMemory>> {
        Some(Box::new(crate::tensor::DropCounted {
            buf: vec![0; desc.byte_len as usize],
            drops: self.0.clone(),
        }))
    }
}

#[test]
fn a_tensor_being_received_in_place_outlives_its_request_s_deadline() {
    let drops = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut p = Pair::new();
    let op = RequestOp::Pull {
        ids: vec![75_000],
        alloc: Some(Arc::new(Counting(drops.clone()))),
    };
    let tag = p.submit(op, Some(Duration::from_millis(10)));
    p.drain();
    // Handshake both ways, then the pull goes up and its 300 KB answer is produced.
    for _ in 0..2 {
        let up = Pair::output(&mut p.client, &mut p.dirty, p.c);
        Pair::input(&mut p.server, p.s, &up, p.now);
        let down = Pair::output(&mut p.server, &mut p.dirty, p.s);
        p.to_client = down;
        if p.to_client.len() > 300_000 {
            break;
        }
        let down = std::mem::take(&mut p.to_client);
        Pair::input(&mut p.client, p.c, &down, p.now);
    }
    let answer = std::mem::take(&mut p.to_client);
    assert!(answer.len() > 300_000);
    // Feed the answer until the client asks for payload straight into the tensor; the
    // receive is then "in the kernel".
    let c = p.c.unwrap();
    let mut at = 0;
    let (loan, direct_len) = loop {
        match p.client.lend_recv(c) {
            Some(RecvPlace {
                mem: RecvLoan::Buffer(mut b),
                start,
                len,
                ..
            }) => {
                let n = len.min(answer.len() - at);
                b[start..start + n].copy_from_slice(&answer[at..at + n]);
                p.client.received(c, RecvLoan::Buffer(b), n, p.now);
                at += n;
            }
            Some(RecvPlace { mem, len, .. }) => break (mem, len),
            None => panic!("no receive target"),
        }
    };
    assert!(direct_len > 16 << 10);
    // While the memory is lent, the tensor has none, and no second receive is lent out.
    assert!(p.client.lend_recv(c).is_none());
    // The deadline passes: the request fails now, but its tensor's memory stays lent (not
    // dropped) until the receive writing into it completes.
    p.advance(Duration::from_millis(10));
    let done = p.completions();
    assert_eq!(
        (done[0].tag, done[0].result.clone_err()),
        (tag, Some(ErrorKind::Timeout))
    );
    assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 0);
    p.client.received(c, loan, 4096, p.now);
    assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// The memory a loan writes into.
fn loan_bytes(m: &mut RecvLoan) -> &mut [u8] {
    match m {
        RecvLoan::Buffer(b) => b,
        RecvLoan::Tensor(t) => t.bytes_mut(),
    }
}

/// A writer that copies everything it is given and keeps the blocks lent to it.
#[derive(Default)]
struct Collect {
    bytes: Vec<u8>,
    blocks: Vec<(u32, Box<[u8]>)>,
}

impl SendSink for Collect {
    fn has_room(&self) -> bool {
        true
    }

    fn bytes(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn block(&mut self, block: u32, buf: Box<[u8]>, start: usize, len: usize) {
        self.bytes.extend_from_slice(&buf[start..start + len]);
        self.blocks.push((block, buf));
    }

    fn in_block(&mut self, block: u32, start: usize, len: usize) {
        let (_, buf) = self.blocks.iter().find(|(b, _)| *b == block).expect("lent");
        self.bytes.extend_from_slice(&buf[start..start + len]);
    }

    fn tensor(&mut self, tensor: Arc<Tensor>, start: usize, len: usize) {
        self.bytes
            .extend_from_slice(&tensor.bytes()[start..start + len]);
    }
}

trait CloneErr {
    /// The kind of the error, if the request failed.
    fn clone_err(&self) -> Option<ErrorKind>;
}

impl CloneErr for Result<Reply, Error> {
    fn clone_err(&self) -> Option<ErrorKind> {
        self.as_ref().err().map(Error::kind)
    }
}

#[test]
fn a_chunked_tensor_over_the_connection_budget_fails_alone() {
    let mut p = Pair::with(
        Config::builder("worker", 0).chunk_size(64 << 10),
        Config::builder("ps", 0)
            .recv_budget(4 << 20)
            .conn_recv_budget(1 << 20),
    );
    // 2 MiB (over the connection's 1 MiB) and 512 KiB (fits) in one push.
    let small = Arc::new(Tensor::from_f32(&[1], &[1.0]).unwrap());
    let t = |n: usize, v: f32| Arc::new(Tensor::from_f32(&[n as u64], &vec![v; n]).unwrap());
    let items = vec![(2, t(1 << 19, 2.0)), (3, t(1 << 17, 3.0)), (1, small)];
    p.submit(RequestOp::Push { items }, None);
    p.drain();
    p.pump();
    let done = p.completions();
    let Ok(Reply::Pushed(st)) = &done[0].result else {
        panic!("{:?}", done[0].result);
    };
    assert_eq!(st[..], [Status::ResourceExhausted, Status::Ok, Status::Ok]);
    assert_eq!(p.server.conns.budget().used(), 0, "nothing stays reserved");
    assert_eq!(p.server.conns.budget().refused(), 1);
    // The connection goes on.
    p.submit(RequestOp::Ping { payload: 0 }, None);
    p.drain();
    p.pump();
    assert!(p.completions()[0].result.is_ok());
}

mod backpressure;
mod checkpoint;
mod connect;
mod liveness;
mod metrics;
mod recv_ahead;
mod row_formats;
mod row_versions;
mod rows;
mod trace;
