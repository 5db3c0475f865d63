//! Connecting, in memory with simulated time: the session's decision after each failed
//! attempt (retry after the configured delay, or give up), the operating system's reason
//! carried into the error, a deadline that passes while connecting, a connect the peer
//! never answers, and the task name errors give the peer.

use super::*;
use crate::error::OsError;

const REFUSED: OsError = OsError::from_raw_os_error(nix::libc::ECONNREFUSED);
const UNREACHABLE: OsError = OsError::from_raw_os_error(nix::libc::EHOSTUNREACH);

fn request(tag: u64, task: Option<&'static str>, deadline: Option<Instant>) -> Request {
    Request {
        op: RequestOp::Ping { payload: 0 },
        peer: PEER.parse().unwrap(),
        task,
        lane: 0,
        deadline,
        tag,
        spare: Spare::default(),
        trace: Default::default(),
    }
}

/// The slot of the connect the session asks for now (panics if none).
fn connect_asked(s: &mut Session) -> u32 {
    match s.poll_action() {
        Some(Action::Connect { slot, addr }) => {
            assert_eq!(addr, PEER.parse::<SocketAddr>().unwrap());
            slot
        }
        other => panic!("no connect asked for: {other:?}"),
    }
}

#[test]
fn connects_are_retried_after_the_configured_delays_then_given_up_with_the_reason() {
    let cfg = Config::builder("worker", 0)
        .connect_retries(2)
        .connect_backoff(Duration::from_millis(100))
        .build()
        .unwrap();
    // Retry n waits connect_delay(n): 100 ms, then 200 ms.
    let delays = [cfg.connect_delay(0), cfg.connect_delay(1)];
    assert_eq!(
        delays,
        [Duration::from_millis(100), Duration::from_millis(200)]
    );
    let mut s = session(cfg, None, None);
    let start = Instant::now();
    s.submit_local(request(9, Some("ps:1"), None));
    s.drain_requests(start);
    let slot = connect_asked(&mut s);
    let mut t = start;
    let mut attempts = 1;
    let mut waited = Vec::new();
    loop {
        // The first attempt finds no route, the others are refused.
        let why = if attempts == 1 { UNREACHABLE } else { REFUSED };
        s.connect_failed(slot, why, t);
        if let Some(Action::Close { slot: closed }) = s.poll_action() {
            assert_eq!(closed, slot);
            break;
        }
        // Nothing happens before the backoff is over.
        let due = s.poll_timeout().unwrap();
        s.handle_timeout(due - Duration::from_nanos(1));
        assert_eq!(s.poll_action(), None);
        waited.push(due - t);
        t = due;
        s.handle_timeout(t);
        assert_eq!(connect_asked(&mut s), slot);
        attempts += 1;
    }
    assert_eq!(attempts, 3);
    assert_eq!(waited, delays);
    // Nothing fails before the loop has released the connection.
    assert!(s.take_local().is_none());
    drop(s.release(slot));
    let done = s.take_local().unwrap();
    assert_eq!(done.tag, 9);
    let e = done.result.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectFailed);
    // The last attempt's reason, not the first's.
    assert_eq!(e.os_error(), Some(REFUSED));
    assert_eq!(e.connect_attempts(), Some(3));
    assert_eq!(e.task(), Some("ps:1"));
    assert_eq!(e.peer(), Some(PEER.parse().unwrap()));
    assert_eq!(
        e.to_string(),
        "could not connect to ps:1 (127.0.0.1:7000) after 3 attempts over 300 ms: \
         connection refused"
    );
}

#[test]
fn a_deadline_while_connecting_is_a_timeout_naming_the_last_failed_attempt() {
    let cfg = Config::builder("worker", 0)
        .connect_retries(8)
        .connect_backoff(Duration::from_millis(100));
    let mut s = session(cfg.build().unwrap(), None, None);
    let start = Instant::now();
    let deadline = start + Duration::from_millis(250);
    s.submit_local(request(4, Some("ps:1"), Some(deadline)));
    s.drain_requests(start);
    let slot = connect_asked(&mut s);
    s.connect_failed(slot, UNREACHABLE, start);
    // Attempt 2 at 100 ms, refused; attempt 3 would be at 300 ms.
    let t = s.poll_timeout().unwrap();
    assert_eq!(t - start, Duration::from_millis(100));
    s.handle_timeout(t);
    assert_eq!(connect_asked(&mut s), slot);
    s.connect_failed(slot, REFUSED, t);
    assert_eq!(s.poll_timeout(), Some(deadline));
    s.handle_timeout(deadline);
    let done = s.take_local().expect("failed at its deadline");
    let e = done.result.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert_eq!(e.os_error(), Some(REFUSED));
    assert_eq!(e.connect_attempts(), Some(2));
    assert_eq!(
        e.to_string(),
        "deadline exceeded while connecting to ps:1 (127.0.0.1:7000): connection refused \
         (attempt 2)"
    );
    // The connection goes on with its retries; a later request waits for it.
    let next = s.poll_timeout().unwrap();
    assert_eq!(next - start, Duration::from_millis(300));
}

#[test]
fn a_deadline_before_any_attempt_failed_says_it_was_connecting() {
    let mut s = session(Config::builder("worker", 0).build().unwrap(), None, None);
    let start = Instant::now();
    let deadline = start + Duration::from_millis(50);
    s.submit_local(request(5, None, Some(deadline)));
    s.drain_requests(start);
    connect_asked(&mut s);
    s.handle_timeout(deadline);
    let e = s.take_local().unwrap().result.unwrap_err();
    assert_eq!(
        (e.kind(), e.os_error(), e.connect_attempts()),
        (ErrorKind::Timeout, None, Some(0))
    );
    assert_eq!(
        e.to_string(),
        "deadline exceeded while connecting to 127.0.0.1:7000"
    );
}

#[test]
fn a_connect_the_peer_never_answers_is_given_up_as_timed_out() {
    let cfg = Config::builder("worker", 0)
        .connect_retries(8)
        .handshake_timeout(Duration::from_secs(1));
    let mut s = session(cfg.build().unwrap(), None, None);
    let start = Instant::now();
    s.submit_local(request(6, Some("ps:3"), None));
    s.drain_requests(start);
    let slot = connect_asked(&mut s);
    // No answer from the connect: at handshake_timeout, given up (not retried).
    s.handle_timeout(start + Duration::from_millis(999));
    assert_eq!(s.poll_action(), None);
    s.handle_timeout(start + Duration::from_secs(1));
    assert_eq!(s.poll_action(), Some(Action::Close { slot }));
    drop(s.release(slot));
    let e = s.take_local().unwrap().result.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectFailed);
    assert_eq!(
        e.os_error().map(OsError::kind),
        Some(std::io::ErrorKind::TimedOut)
    );
    assert_eq!(
        e.to_string(),
        "could not connect to ps:3 (127.0.0.1:7000) after 1 attempt: connection timed out"
    );
}

#[test]
fn a_lost_connection_names_the_task_its_handshake_gave() {
    let mut p = Pair::new();
    let sent = p.submit(recv(1, b"k"), None);
    p.drain();
    p.pump();
    // The request was addressed by address only; the handshake named the peer ps:0.
    let c = p.c.unwrap();
    p.client.peer_closed(c);
    assert_eq!(p.client.poll_action(), Some(Action::Close { slot: c }));
    drop(p.client.release(c));
    let done = p.completions();
    assert_eq!(done[0].tag, sent);
    let e = done[0].result.as_ref().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionLost);
    assert_eq!(e.task(), Some("ps:0"));
    assert_eq!(e.to_string(), "connection to ps:0 (127.0.0.1:7000) lost");
}

#[test]
fn errors_to_a_peer_no_one_named_keep_the_address() {
    let cfg = Config::builder("worker", 0).connect_retries(0);
    let mut s = session(cfg.build().unwrap(), None, None);
    let start = Instant::now();
    s.submit_local(request(7, None, None));
    s.drain_requests(start);
    let slot = connect_asked(&mut s);
    s.connect_failed(slot, REFUSED, start + Duration::from_millis(3));
    assert_eq!(s.poll_action(), Some(Action::Close { slot }));
    drop(s.release(slot));
    let e = s.take_local().unwrap().result.unwrap_err();
    assert_eq!(e.task(), None);
    assert_eq!(
        e.to_string(),
        "could not connect to 127.0.0.1:7000 after 1 attempt: connection refused"
    );
}
