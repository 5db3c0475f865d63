//! Per-peer metrics recorded by the session, in memory with simulated time.

use super::*;
use crate::stats::{Metrics, Outcome, RequestKind, Side};

pub(super) fn metrics(s: &Session) -> Metrics {
    Metrics::of(&[s.counters()])
}

#[test]
fn requests_are_counted_per_peer_and_operation_on_both_sides() {
    let mut p = Pair::new();
    let peer: SocketAddr = PEER.parse().unwrap();
    // A ping that opens the connection (answered in the turn it is sent), then one
    // answered 3 ms (simulated) after it was queued.
    p.submit(RequestOp::Ping { payload: 16 }, None);
    p.drain();
    p.pump();
    p.submit(RequestOp::Ping { payload: 16 }, None);
    p.drain();
    let up = Pair::output(&mut p.client, &mut p.dirty, p.c);
    Pair::input(&mut p.server, p.s, &up, p.now);
    p.now += Duration::from_millis(3);
    p.pump();
    // Two pulls of three ids, and a push.
    for _ in 0..2 {
        p.submit(pull(&[3, 0, 1]), None);
    }
    let t = Arc::new(Tensor::from_f32(&[2], &[4.0, 4.0]).unwrap());
    p.submit(
        RequestOp::Push {
            items: vec![(4, t)],
        },
        None,
    );
    p.drain();
    p.pump();
    assert_eq!(p.completions().len(), 4 + 1);

    let m = metrics(&p.client);
    let c = m.client(peer).expect("the peer's block");
    assert_eq!((c.side, c.task.as_deref()), (Side::Client, Some("ps:0")));
    assert_eq!(c.connections, 1);
    let ping = c.op(RequestKind::Ping);
    assert_eq!((ping.requests, ping.outcome(Outcome::Ok)), (2, 2));
    assert_eq!(ping.latency.count(), 2);
    assert_eq!(ping.latency.quantile(0.5), Duration::ZERO);
    let rtt = ping.latency.quantile(1.0);
    assert_eq!(ping.latency.max(), Duration::from_millis(3));
    assert!(rtt >= Duration::from_millis(3) && rtt <= Duration::from_millis(3) * 9 / 8);
    // The ping frames: a header and 16 bytes, each way.
    assert_eq!((ping.bytes_out, ping.bytes_in), (96, 96));
    let pulls = c.op(RequestKind::Pull);
    assert_eq!((pulls.requests, pulls.outcome(Outcome::Ok)), (2, 2));
    assert_eq!((pulls.tensors, pulls.in_flight()), (6, 0));
    assert_eq!(pulls.latency.count(), 2);
    let h = &pulls.latency;
    assert!(h.quantile(0.5) <= h.quantile(0.99) && h.quantile(0.99) <= h.max());
    assert_eq!(c.op(RequestKind::Push).outcome(Outcome::Ok), 1);

    // The server counts what it served, under the worker's task name; the bytes of the
    // requests are what the client sent.
    let m = metrics(&p.server);
    let s = m.served("worker:0").expect("the served peer's block");
    assert_eq!(s.side, Side::Server);
    let served = s.op(RequestKind::Pull);
    assert_eq!((served.requests, served.outcome(Outcome::Ok)), (2, 2));
    assert_eq!(served.tensors, 6);
    assert_eq!(served.bytes_in, pulls.bytes_out);
    // Its answers are what the client received.
    assert_eq!(served.bytes_out, pulls.bytes_in);
    assert_eq!(
        s.op(RequestKind::Push).bytes_in,
        c.op(RequestKind::Push).bytes_out
    );
    assert_eq!(s.op(RequestKind::Push).latency.count(), 1);
}

#[test]
fn failures_are_counted_by_outcome() {
    let mut p = Pair::new();
    let peer: SocketAddr = PEER.parse().unwrap();
    // A recv that is never published: timed out (the responder confirms the cancel).
    p.submit(recv(1, b"never"), Some(Duration::from_millis(10)));
    p.drain();
    p.pump();
    p.advance(Duration::from_millis(20));
    p.pump();
    // A recv lost with its connection.
    p.submit(recv(1, b"lost"), None);
    p.drain();
    p.pump();
    let c = p.c.unwrap();
    p.client.lose(c, Error::new(ErrorKind::ConnectionLost));
    p.actions();
    let done = p.completions();
    assert_eq!(done.len(), 2);

    let m = metrics(&p.client);
    let b = m.client(peer).unwrap();
    let recvs = b.op(RequestKind::Recv);
    assert_eq!(recvs.requests, 2);
    assert_eq!(recvs.outcome(Outcome::Timeout), 1);
    assert_eq!(recvs.outcome(Outcome::Unavailable), 1);
    assert_eq!(recvs.in_flight(), 0);
    // Only answered requests have a latency.
    assert_eq!(recvs.latency.count(), 0);
    assert_eq!(b.connections_lost, 1);
    let m = metrics(&p.server);
    let served = m.served("worker:0").unwrap().op(RequestKind::Recv);
    assert_eq!(served.requests, 2);
    assert_eq!(served.outcome(Outcome::Timeout), 1);
}

#[test]
fn a_stats_request_is_answered_with_the_responder_s_document() {
    let mut p = Pair::new();
    p.submit(pull(&[1]), None);
    p.submit(RequestOp::Stats, None);
    p.drain();
    p.pump();
    let mut done = p.completions();
    let doc = done.pop().unwrap().into_stats_document().unwrap();
    assert!(doc.starts_with(r#"{"format":"starwire-stats","version":1,"task":"ps:0""#));
    // The server had served the pull when it answered.
    assert!(
        doc.contains(r#""role":"server","addr":null,"task":"worker:0""#),
        "{doc}"
    );
    assert!(
        doc.contains(r#""pull":{"requests":1,"in_flight":0"#),
        "{doc}"
    );
    let m = metrics(&p.client);
    let stats = m
        .client(PEER.parse().unwrap())
        .unwrap()
        .op(RequestKind::Stats);
    assert_eq!((stats.requests, stats.outcome(Outcome::Ok)), (1, 1));
    assert_eq!(stats.bytes_out, 32);
    assert!(stats.bytes_in > doc.len() as u64);
}

#[test]
fn a_disabled_stats_endpoint_refuses_with_unimplemented() {
    let mut p = Pair::with(
        Config::builder("worker", 0),
        Config::builder("ps", 0).stats_endpoint(false),
    );
    p.submit(RequestOp::Stats, None);
    p.drain();
    p.pump();
    let done = p.completions();
    assert_eq!(
        done[0].result.clone_err(),
        Some(ErrorKind::Remote(Status::Unimplemented))
    );
    let m = metrics(&p.client);
    let stats = m
        .client(PEER.parse().unwrap())
        .unwrap()
        .op(RequestKind::Stats);
    assert_eq!(stats.outcome(Outcome::Error), 1);
    let m = metrics(&p.server);
    let served = m.served("worker:0").unwrap().op(RequestKind::Stats);
    assert_eq!((served.requests, served.outcome(Outcome::Error)), (1, 1));
}

/// The loop's `send_arena_bytes`, read as `Stats` sums it.
fn arena_gauge(s: &Session) -> u64 {
    let mut st = crate::stats::Stats::default();
    st.add_loop(s.counters());
    st.send_arena_bytes
}

#[test]
fn send_arena_bytes_follow_the_encoders_and_return_to_zero_when_the_connection_goes() {
    let mut p = Pair::new();
    p.submit(RequestOp::Ping { payload: 16 }, None);
    p.drain();
    p.pump();
    let server_blocks = |p: &mut Pair| {
        let s = p.s.unwrap() as usize;
        p.server
            .conns
            .get_mut(s as u32)
            .unwrap()
            .proto
            .encoder()
            .arena_bytes() as u64
    };
    let held = server_blocks(&mut p);
    assert!(held > 0, "an encoder starts with its blocks");
    assert_eq!(arena_gauge(&p.server), held);
    // A burst of answers larger than a block (24 pulls of 64 tensors copied into the
    // arena, 260 KB), sent in one go: more blocks while they wait, and the gauge follows
    // each way.
    let ids: Vec<u64> = (1..=64).collect();
    for _ in 0..24 {
        p.submit(pull(&ids), None);
    }
    p.drain();
    let up = Pair::output(&mut p.client, &mut p.dirty, p.c);
    Pair::input(&mut p.server, p.s, &up, p.now);
    let queued = server_blocks(&mut p);
    p.server.take_dirty(&mut p.dirty);
    let s = p.s.unwrap();
    let mut sink = Collect::default();
    p.server.transmit(s, 1 << 30, &mut sink);
    assert_eq!(
        arena_gauge(&p.server),
        queued,
        "counted once output is handed out"
    );
    assert!(queued > held, "answers of 260 KB took more blocks");
    for (block, buf) in sink.blocks.drain(..) {
        p.server.restore_block(s, block, buf);
    }
    p.server.sent(s, sink.bytes.len(), p.now);
    Pair::input(&mut p.client, p.c, &sink.bytes, p.now);
    let after = server_blocks(&mut p);
    assert_eq!(arena_gauge(&p.server), after, "and once it is written");
    p.pump();
    assert_eq!(p.completions().len(), 25);
    // The connection goes: its blocks leave the gauge.
    p.server.lose(s, Error::new(ErrorKind::ConnectionLost));
    p.actions();
    assert_eq!(p.s, None);
    assert_eq!(arena_gauge(&p.server), 0);
}

/// The loop's `send_blocks_allocated`, read as `Stats` sums it.
fn blocks_allocated(s: &Session) -> u64 {
    let mut st = crate::stats::Stats::default();
    st.add_loop(s.counters());
    st.send_blocks_allocated
}

#[test]
fn a_steady_load_of_bursts_allocates_send_blocks_only_while_warming_up() {
    let mut p = Pair::new();
    p.submit(RequestOp::Ping { payload: 16 }, None);
    p.drain();
    p.pump();
    assert_eq!(p.completions().len(), 1, "the ping");
    let ids: Vec<u64> = (1..=64).collect();
    // Rounds of 64 pulls of 64 tensors copied into the arena (700 KB of answers, more
    // than the block written into and the two idle ones), each sent in one go.
    let round = |p: &mut Pair| {
        for _ in 0..64 {
            p.submit(pull(&ids), None);
        }
        p.drain();
        let up = Pair::output(&mut p.client, &mut p.dirty, p.c);
        Pair::input(&mut p.server, p.s, &up, p.now);
        p.server.take_dirty(&mut p.dirty);
        let s = p.s.unwrap();
        let mut sink = Collect::default();
        p.server.transmit(s, 1 << 30, &mut sink);
        for (block, buf) in sink.blocks.drain(..) {
            p.server.restore_block(s, block, buf);
        }
        p.server.sent(s, sink.bytes.len(), p.now);
        Pair::input(&mut p.client, p.c, &sink.bytes, p.now);
        p.pump();
        assert_eq!(p.completions().len(), 64);
    };
    for _ in 0..3 {
        round(&mut p);
    }
    let warm = blocks_allocated(&p.server);
    let s = p.s.unwrap();
    let encoder = p.server.conns.get_mut(s).unwrap().proto.encoder();
    assert_eq!(
        warm,
        encoder.blocks_allocated(),
        "the counter is the encoder's"
    );
    assert!(
        warm > 2,
        "the answers took more than the first two blocks: {warm}"
    );
    for _ in 0..50 {
        round(&mut p);
    }
    assert_eq!(
        blocks_allocated(&p.server),
        warm,
        "none allocated in steady state"
    );
}
