//! What a peer can make a server hold, in memory: answers it does not read stop the
//! server from reading its requests; waiting recvs are bounded by the bytes of their keys;
//! a closed connection's waiters leave the rendezvous a batch per turn; the limits a
//! requester announced bind the answers it gets.

use super::*;
use crate::rows::{Init, MemTable, Optimizer, Tables};
use crate::stats::{Metrics, RequestKind};
use crate::wire::Limits;

/// A service of one table, 1: rows of 16 floats (64 bytes), created at zero by a pull.
fn rows_service() -> SharedService {
    let table = MemTable::new(16, Init::Zeros, Optimizer::Sgd { lr: 1.0 });
    Arc::new(Tables::new().with(1, Arc::new(table)))
}

fn pull_rows(table: u32, dim: u64, ids: Vec<u64>) -> RequestOp {
    let spec = RowsSpec::of(&Rows::new(table, DType::F32, &[dim], &ids)).unwrap();
    RequestOp::PullRows {
        held: Vec::new(),
        tables: vec![spec],
        ids,
        alloc: None,
    }
}

/// Requests of `kind` the server received.
fn served(p: &Pair, kind: RequestKind) -> u64 {
    let m = Metrics::of(&[p.server.counters()]);
    m.peers.iter().map(|peer| peer.op(kind).requests).sum()
}

/// Opens the pair's connection.
fn open(p: &mut Pair) {
    p.submit(RequestOp::Ping { payload: 0 }, None);
    p.drain();
    p.pump();
    assert_eq!(p.completions().len(), 1);
}

#[test]
fn a_peer_that_reads_no_answers_stops_being_read_until_they_drain() {
    let backlog = 64 << 10;
    let mut p = Pair::serving(
        Config::builder("worker", 0),
        Config::builder("ps", 0).answer_backlog(backlog),
        rows_service(),
    );
    open(&mut p);
    // Ten pulls of 2,048 rows of 64 bytes: 128 KiB answers each, requests of 16 KiB.
    for i in 0..10u64 {
        p.submit(pull_rows(1, 16, (i * 2048..(i + 1) * 2048).collect()), None);
    }
    p.drain();
    let up = Pair::output(&mut p.client, &mut p.dirty, p.c);
    assert!(up.len() > (10 * 16) << 10);
    // The server takes requests only until its unread answers pass the backlog.
    let mut taken = Pair::input_some(&mut p.server, p.s, &up, p.now);
    assert!(taken < up.len(), "the rest stays with the sender");
    let s = p.s.unwrap();
    let conn = p.server.conns.get_mut(s).unwrap();
    assert!(conn.paused, "not read any more");
    let queued = conn.answer_bytes();
    assert!(
        queued >= backlog && queued < backlog + (130 << 10),
        "the backlog and one answer at most: {queued}"
    );
    assert_eq!(served(&p, RequestKind::PullRows), 1);
    assert!(p.server.lend_recv(s).is_none(), "no receive while paused");
    // The peer reads: the server resumes, takes the rest, and answers every request.
    for _ in 0..100 {
        p.pump();
        taken += Pair::input_some(&mut p.server, p.s, &up[taken..], p.now);
        if taken == up.len() {
            break;
        }
    }
    p.pump();
    let done = p.completions();
    assert_eq!(done.len(), 10);
    assert!(done.iter().all(|c| matches!(c.result, Ok(Reply::Rows(_)))));
    assert_eq!(served(&p, RequestKind::PullRows), 10);
    assert!(!p.server.conns.get(s).unwrap().paused);
}

#[test]
fn waiting_recvs_are_bounded_by_the_bytes_of_their_keys() {
    let mut p = Pair::with(
        Config::builder("worker", 0),
        Config::builder("ps", 0)
            .recv_budget(4 << 20)
            .conn_recv_budget(1 << 20),
    );
    open(&mut p);
    let keys = |n: usize, len: usize, tag: &str| -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| format!("{tag}{i:0len$}").into_bytes())
            .collect()
    };
    // 3,000 keys of 200 bytes: about 1.4 MB to hold while they wait, over the
    // connection's 1 MiB.
    let big = RequestOp::Recv {
        step: 1,
        keys: keys(3000, 199, "b"),
    };
    p.submit(big, None);
    // 100 keys fit.
    let small = p.submit(
        RequestOp::Recv {
            step: 1,
            keys: keys(100, 19, "s"),
        },
        None,
    );
    p.drain();
    p.pump();
    let done = p.completions();
    assert_eq!(done.len(), 1, "the small one waits");
    assert_eq!(
        done[0].result.as_ref().map_err(|e| e.kind()).err(),
        Some(ErrorKind::Remote(Status::ResourceExhausted))
    );
    assert!(
        p.server.conns.budget().used() > 0,
        "the waiting recv is charged"
    );
    for k in keys(100, 19, "s") {
        p.publish(&k, 1.0);
    }
    p.pump();
    let done = p.completions();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].tag, small);
    assert!(done[0].result.is_ok());
    assert_eq!(
        p.server.conns.budget().used(),
        0,
        "given back once answered"
    );
}

#[test]
fn a_closed_connection_s_waiters_leave_the_rendezvous_a_batch_per_turn() {
    let mut p = Pair::new();
    open(&mut p);
    let keys: Vec<Vec<u8>> = (0..10_000).map(|i| format!("k{i}").into_bytes()).collect();
    p.submit(RequestOp::Recv { step: 1, keys }, None);
    p.drain();
    p.pump();
    assert_eq!(p.rendezvous.waiting_count(), 10_000);
    assert!(p.server.conns.budget().used() > 0);
    // The client goes away; the server releases the connection.
    let s = p.s.unwrap();
    p.server.peer_closed(s);
    p.actions();
    assert_eq!(
        p.rendezvous.waiting_count(),
        10_000,
        "nothing taken out at once"
    );
    assert_eq!(
        p.server.poll_timeout(),
        Some(p.server.last_now),
        "no parking meanwhile"
    );
    let mut left = vec![p.rendezvous.waiting_count()];
    while p.rendezvous.waiting_count() > 0 {
        p.server.handle_timeout(p.now);
        left.push(p.rendezvous.waiting_count());
        assert!(left.len() < 10, "{left:?}");
    }
    assert_eq!(left, [10_000, 10_000 - 4096, 10_000 - 2 * 4096, 0]);
    assert_eq!(
        p.server.conns.budget().used(),
        0,
        "given back once forgotten"
    );
    // A key published now waits for the next recv.
    p.publish(b"k7", 7.0);
    assert_eq!(p.rendezvous.ready_count(), 1);
}

#[test]
fn answers_keep_to_the_limits_their_requester_announced() {
    let limits = Limits {
        max_tensors: 1,
        max_tensor_bytes: 16,
        ..Limits::default()
    };
    let mut p = Pair::with(
        Config::builder("worker", 0).limits(limits),
        Config::builder("ps", 0),
    );
    open(&mut p);
    // Five ids: five RESPONSE frames of one entry each; id 5 holds 20 bytes, over the
    // requester's 16: RESOURCE_EXHAUSTED for it alone (ids 1-4 hold 4-16 bytes).
    let ids: Vec<u64> = (1..=5).collect();
    p.submit(pull(&ids), None);
    p.drain();
    p.pump();
    let done = p.completions();
    let Ok(Reply::Pulled(items)) = &done[0].result else {
        panic!("{:?}", done[0].result);
    };
    for (id, item) in ids.iter().zip(items) {
        match id {
            5 => assert_eq!(item.as_ref().err(), Some(&Status::ResourceExhausted)),
            _ => assert_eq!(
                item.as_ref().unwrap().to_f32(),
                vec![*id as f32; *id as usize]
            ),
        }
    }
    // The connection goes on.
    p.submit(RequestOp::Ping { payload: 0 }, None);
    p.drain();
    p.pump();
    assert!(p.completions()[0].result.is_ok());
}

#[test]
fn a_report_of_missing_rows_over_the_requester_s_limit_fails_its_table_alone() {
    let limits = Limits {
        max_rows: 2,
        ..Limits::default()
    };
    let table = MemTable::new(4, Init::Missing, Optimizer::Sgd { lr: 1.0 });
    let service: SharedService = Arc::new(Tables::new().with(1, Arc::new(table)));
    let mut p = Pair::serving(
        Config::builder("worker", 0).limits(limits),
        Config::builder("ps", 0),
        service,
    );
    open(&mut p);
    let spec = |ids: &[u64]| RowsSpec::of(&Rows::new(1, DType::F32, &[4], ids)).unwrap();
    p.submit(
        RequestOp::PullRows {
            held: Vec::new(),
            tables: vec![spec(&[1]), spec(&[2, 3, 4])],
            ids: vec![1, 2, 3, 4],
            alloc: None,
        },
        None,
    );
    p.drain();
    p.pump();
    let done = p.completions();
    let Ok(Reply::Rows(rows)) = &done[0].result else {
        panic!("{:?}", done[0].result);
    };
    assert_eq!(rows.missing(0), [0], "a report of one row fits");
    assert_eq!(
        rows.block(1).err(),
        Some(Status::ResourceExhausted),
        "three would not"
    );
}
