//! The request trace recorded by the session, in memory with simulated time: the times a
//! record holds are the submitter's and the turns' as they were (not made ordered).

use super::*;
use crate::stats::trace::{epoch, nanos, Record};
use crate::stats::{Outcome, RequestKind};

/// The client's records, taken as a dump takes them (on its next drain pass).
fn records(p: &mut Pair) -> Option<(Vec<Record>, u64)> {
    p.client.counters().trace.ask();
    p.client.drain_requests(p.now);
    p.client
        .counters()
        .trace
        .take()
        .map(|t| (t.records, t.dropped))
}

fn traced() -> Pair {
    Pair::with(
        Config::builder("worker", 0).trace(true).trace_events(8),
        Config::builder("ps", 0),
    )
}

#[test]
fn a_record_holds_the_submit_send_answer_and_completion_times() {
    let mut p = traced();
    // Open the connection.
    p.submit(RequestOp::Ping { payload: 0 }, None);
    p.drain();
    p.pump();
    p.completions();
    records(&mut p).unwrap();

    // Submitted 5 µs before the turn that takes it; answered 3 ms after it was sent.
    p.now += Duration::from_millis(1);
    let sent_at = p.now;
    let submitted = sent_at - Duration::from_micros(5);
    p.client.submit_local(Request {
        op: pull(&[3, 0]),
        peer: PEER.parse().unwrap(),
        task: None,
        lane: 0,
        deadline: None,
        tag: 77,
        spare: Spare::default(),
        trace: Stamp {
            submitted: Some(submitted),
            step: 9,
        },
    });
    p.drain();
    let up = Pair::output(&mut p.client, &mut p.dirty, p.c);
    Pair::input(&mut p.server, p.s, &up, p.now);
    p.now += Duration::from_millis(3);
    p.pump();
    assert_eq!(p.completions().len(), 1);

    let (records, dropped) = records(&mut p).unwrap();
    assert_eq!((records.len(), dropped), (1, 0));
    let r = records[0];
    let e = epoch();
    assert_eq!((r.tag, r.step, r.kind), (77, 9, RequestKind::Pull));
    assert_eq!(r.outcome, Outcome::Ok);
    assert_eq!(r.submitted, nanos(e, submitted));
    assert_eq!(r.sent, nanos(e, sent_at));
    assert_eq!(r.answered, nanos(e, p.now));
    assert_eq!(r.completed, nanos(e, p.now));
    assert!(r.bytes > 0);
}

#[test]
fn a_request_that_fails_unsent_has_no_send_or_answer_time() {
    let mut p = traced();
    // Nobody accepts: the connect fails for good.
    p.client.submit_local(Request {
        op: RequestOp::Ping { payload: 0 },
        peer: PEER.parse().unwrap(),
        task: None,
        lane: 0,
        deadline: Some(p.now + Duration::from_millis(2)),
        tag: 5,
        spare: Spare::default(),
        trace: Stamp::default(),
    });
    p.client.drain_requests(p.now);
    p.now += Duration::from_millis(5);
    p.client.handle_timeout(p.now);
    let (records, _) = records(&mut p).unwrap();
    assert_eq!(records.len(), 1);
    let r = records[0];
    assert_eq!((r.tag, r.outcome), (5, Outcome::Timeout));
    assert_eq!((r.sent, r.answered), (0, 0));
}

#[test]
fn with_the_trace_off_a_dump_gets_nothing() {
    let mut p = Pair::new();
    p.submit(RequestOp::Ping { payload: 0 }, None);
    p.drain();
    p.pump();
    assert_eq!(p.completions().len(), 1);
    assert!(records(&mut p).is_none());
    assert!(!p.client.observer.tracing());
}

/// `PROBE_N` pull round trips through a pair in memory, traced when `PROBE_TRACE=1` (the
/// submitter's clock read included): for counting the trace's instructions per request
/// under callgrind, at two values of `PROBE_N` (`docs/performance.md`, "Trace: cost").
#[test]
#[ignore]
fn probe_pulls() {
    let n: usize = std::env::var("PROBE_N").map_or(1000, |v| v.parse().unwrap());
    let on = std::env::var("PROBE_TRACE").is_ok_and(|v| v == "1");
    let mut p = Pair::with(
        Config::builder("worker", 0).trace(on),
        Config::builder("ps", 0),
    );
    for i in 0..n {
        let submitted = on.then(Instant::now);
        p.client.submit_local(Request {
            op: pull(&[3]),
            peer: PEER.parse().unwrap(),
            task: None,
            lane: 0,
            deadline: None,
            tag: i as u64,
            spare: Spare::default(),
            trace: Stamp { submitted, step: 0 },
        });
        p.drain();
        p.pump();
        assert_eq!(p.completions().len(), 1);
    }
}
