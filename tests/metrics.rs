//! Per-peer metrics over real sockets: what a worker's runtime records of the requests it
//! sent, what the PS records of the ones it served, merged over loops and lanes; the
//! stats request; an embedded loop's metrics.

mod common;

use common::*;
use starwire::stats::{Outcome, RequestKind, Side};
use starwire::{DType, Embedded, ErrorKind, Options, Runtime, Service, Status, Tensor};
use std::sync::Arc;

/// Variable `i` holds 64 bytes; pushes of 64 bytes are accepted.
struct Table;

impl Service for Table {
    fn pull(&self, ids: &[u64], out: &mut Vec<Result<Arc<Tensor>, Status>>) {
        for &id in ids {
            let t = Tensor::from_slice(DType::U8, &[64], &[id as u8; 64]).unwrap();
            out.push(Ok(Arc::new(t)));
        }
    }

    fn push(&self, items: &mut Vec<(u64, Tensor)>, statuses: &mut Vec<Status>) {
        for (_, t) in items.iter() {
            statuses.push(if t.byte_len() == 64 {
                Status::Ok
            } else {
                Status::InvalidArgument
            });
        }
    }
}

fn ps(loops: usize, builder: starwire::ConfigBuilder) -> Runtime {
    Runtime::start_with(
        builder.loops(loops).build().unwrap(),
        Options {
            service: Some(Arc::new(Table)),
            ..Options::listen("127.0.0.1:0".parse().unwrap())
        },
    )
    .expect("the PS starts")
}

#[test]
fn requests_are_counted_per_peer_on_both_sides_over_loops_and_lanes() {
    const PULLS: u64 = 40;
    const PUSHES: u64 = 10;
    let ps = ps(2, config("ps", 2));
    let addr = ps.local_addr().unwrap();
    // Two loops and two connections to the PS: the blocks of both lanes are merged.
    let worker = Runtime::start(
        config("worker", 2).connections_per_peer(2).build().unwrap(),
        None,
    )
    .unwrap();
    let mut h = worker.handle(64);
    for i in 0..PULLS {
        let pulled = h.pull(addr, vec![i, i + 1, i + 2], secs(30)).unwrap();
        assert_eq!(h.wait(pulled).unwrap().len(), 3);
    }
    for i in 0..PUSHES {
        let t = Arc::new(Tensor::from_slice(DType::U8, &[64], &[1; 64]).unwrap());
        let pushed = h.push(addr, vec![(i, t)], secs(30)).unwrap();
        assert_eq!(h.wait(pushed).unwrap(), [Status::Ok]);
    }

    let m = worker.metrics();
    assert_eq!(m.side(Side::Client).count(), 1, "{m:?}");
    let sent = m.client(addr).expect("the PS's block");
    assert_eq!(sent.task.as_deref(), Some("ps:0"));
    assert_eq!(sent.connections, 2, "one per lane");
    let pulls = sent.op(RequestKind::Pull);
    assert_eq!(pulls.requests, PULLS);
    assert_eq!(pulls.outcome(Outcome::Ok), PULLS);
    assert_eq!((pulls.tensors, pulls.in_flight()), (3 * PULLS, 0));
    let h50 = pulls.latency.quantile(0.5);
    assert_eq!(pulls.latency.count(), PULLS);
    assert!(h50 > std::time::Duration::ZERO);
    assert!(h50 <= pulls.latency.quantile(0.99));
    assert!(pulls.latency.quantile(0.99) <= pulls.latency.max());
    let pushes = sent.op(RequestKind::Push);
    assert_eq!(
        (pushes.requests, pushes.outcome(Outcome::Ok)),
        (PUSHES, PUSHES)
    );
    // Each pull answer brings three 64-byte tensors.
    assert!(pulls.bytes_in > PULLS * 3 * 64);

    // The PS saw the same requests and the same bytes, under the worker's task name.
    let m = ps.metrics();
    let served = m.served("worker:0").expect("the worker's block");
    assert_eq!(served.connections, 2);
    let p = served.op(RequestKind::Pull);
    assert_eq!(
        (p.requests, p.outcome(Outcome::Ok), p.tensors),
        (PULLS, PULLS, 3 * PULLS)
    );
    assert_eq!(p.bytes_in, pulls.bytes_out);
    assert_eq!(p.bytes_out, pulls.bytes_in);
    let q = served.op(RequestKind::Push);
    assert_eq!((q.requests, q.outcome(Outcome::Ok)), (PUSHES, PUSHES));
    assert_eq!(q.bytes_in, pushes.bytes_out);
    assert_eq!(q.latency.count(), PUSHES);

    // The same, asked over the wire.
    let t = h.remote_stats(addr, secs(30)).unwrap();
    let doc = h.wait(t).unwrap();
    assert!(doc.contains(r#""task":"ps:0""#), "{doc}");
    let want = format!(r#""pull":{{"requests":{PULLS},"in_flight":0"#);
    assert!(doc.contains(&want), "{doc}");
    assert!(ps
        .metrics_json()
        .contains(r#""role":"server","addr":null,"task":"worker:0""#));
}

#[test]
fn a_task_with_the_stats_endpoint_off_refuses_stats_and_counts_the_refusal() {
    let ps = ps(1, config("ps", 1).stats_endpoint(false));
    let addr = ps.local_addr().unwrap();
    let worker = client(1);
    let mut h = worker.handle(8);
    let t = h.remote_stats(addr, secs(30)).unwrap();
    let e = h.wait(t).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Remote(Status::Unimplemented));
    let m = worker.metrics();
    let stats = m.client(addr).unwrap().op(RequestKind::Stats);
    assert_eq!((stats.requests, stats.outcome(Outcome::Error)), (1, 1));
}

#[test]
fn an_unreachable_peer_counts_reconnects_and_unavailable_requests() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let worker = Runtime::start(
        config("worker", 1)
            .connect_retries(2)
            .connect_backoff(std::time::Duration::from_millis(1))
            .build()
            .unwrap(),
        None,
    )
    .unwrap();
    let mut h = worker.handle(8);
    let t = h.ping(dead, 0, secs(30)).unwrap();
    assert_eq!(h.wait(t).unwrap_err().kind(), ErrorKind::ConnectFailed);
    let m = worker.metrics();
    let b = m.client(dead).unwrap();
    assert_eq!(b.reconnects, 2);
    assert_eq!(b.task, None, "no handshake named it");
    let ping = b.op(RequestKind::Ping);
    assert_eq!((ping.requests, ping.outcome(Outcome::Unavailable)), (1, 1));
    assert_eq!(ping.latency.count(), 0);
}

#[test]
fn an_embedded_loop_has_the_same_metrics() {
    let ps = ps(1, config("ps", 1));
    let addr = ps.local_addr().unwrap();
    let mut e = Embedded::new(config("worker", 1).build().unwrap(), None).unwrap();
    for _ in 0..5 {
        let t = e.ping(addr, 8, secs(30)).unwrap();
        e.wait(t).unwrap();
    }
    let t = e.remote_stats(addr, secs(30)).unwrap();
    assert!(e.wait(t).unwrap().contains(r#""role":"server""#));
    let m = e.metrics();
    let b = m.client(addr).unwrap();
    let ping = b.op(RequestKind::Ping);
    assert_eq!((ping.requests, ping.latency.count()), (5, 5));
    assert_eq!((ping.bytes_out, ping.bytes_in), (5 * 40, 5 * 40));
    assert_eq!(b.op(RequestKind::Stats).outcome(Outcome::Ok), 1);
}
