//! Connections kept honest and alive, in memory with simulated time: a stalled frame head,
//! a payload that stops, the heartbeat.

use super::*;

#[test]
fn a_stalled_frame_head_closes_the_connection_after_the_frame_timeout() {
    let mut p = Pair::with(
        Config::builder("worker", 0),
        Config::builder("ps", 0).frame_timeout(Duration::from_secs(1)),
    );
    p.submit(RequestOp::Ping { payload: 0 }, None);
    p.drain();
    p.pump();
    assert_eq!(p.completions().len(), 1);
    // Ten bytes of a header, then nothing.
    let s = p.s;
    Pair::input(&mut p.server, s, &[0x53; 10], p.now);
    p.advance(Duration::from_millis(999));
    p.pump();
    assert!(p.s.is_some());
    p.advance(Duration::from_millis(1));
    // The server says why (an ERROR) and closes once that is written.
    p.pump();
    assert!(p.s.is_none(), "the server closed the stalled connection");
    assert_eq!(error_statuses(&p.to_client), [Status::DeadlineExceeded]);
}

/// The statuses of the `ERROR` frames in `bytes` (whole frames, as one side sent them).
#[test]
fn a_frame_whose_payload_stops_is_closed_after_the_progress_timeout_not_before() {
    let mut p = Pair::with(
        Config::builder("worker", 0).chunk_size(64 << 10),
        Config::builder("ps", 0).progress_timeout(Duration::from_secs(2)),
    );
    p.submit(RequestOp::Ping { payload: 0 }, None);
    p.drain();
    p.pump();
    p.completions();
    // A push of 1 MiB in 64 KiB chunks, of which the server gets the bytes below.
    let values = vec![1.0f32; 1 << 18];
    let t = Arc::new(Tensor::from_f32(&[1 << 18], &values).unwrap());
    p.submit(
        RequestOp::Push {
            items: vec![(1, t)],
        },
        None,
    );
    p.drain();
    let up = Pair::output(&mut p.client, &mut p.dirty, p.c);
    let s = p.s;
    // 5 KB per second for 4 s: each 2 s window gets more than 4 KiB, so it stays open.
    let mut at = 0;
    for _ in 0..4 {
        Pair::input(&mut p.server, s, &up[at..at + 5000], p.now);
        at += 5000;
        p.advance(Duration::from_secs(1));
        assert!(p.s.is_some(), "closed at {at} bytes");
    }
    // Then 1 KB per second: the next window that ends short closes it.
    let mut seconds = 0;
    while p.s.is_some() {
        Pair::input(&mut p.server, s, &up[at..at + 1000], p.now);
        at += 1000;
        p.advance(Duration::from_secs(1));
        p.pump_server_only();
        seconds += 1;
        assert!(seconds <= 4, "still open after {seconds} s of trickling");
    }
    assert!(seconds >= 1);
    assert_eq!(error_statuses(&p.to_client), [Status::DeadlineExceeded]);
    let progress_timeouts = p
        .server
        .counters()
        .progress_timeouts
        .load(Ordering::Relaxed);
    assert_eq!(progress_timeouts, 1);
}

#[test]
fn heartbeats_probe_a_silent_peer_and_declare_it_lost_after_the_timeout() {
    let mut p = Pair::with(
        Config::builder("worker", 0)
            .heartbeat_interval(Duration::from_secs(1))
            .heartbeat_timeout(Duration::from_secs(3)),
        Config::builder("ps", 0).heartbeat_interval(Duration::ZERO),
    );
    p.submit(RequestOp::Ping { payload: 0 }, None);
    p.drain();
    p.pump();
    p.completions();
    // While the server answers, the probes keep the connection: six seconds, six probes.
    for _ in 0..6 {
        p.advance(Duration::from_secs(1));
        p.pump();
    }
    assert!(p.c.is_some());
    let sent = |p: &Pair| p.client.counters().heartbeats_sent.load(Ordering::Relaxed);
    assert_eq!(sent(&p), 6);
    // A request without deadline, and from now on the server's bytes are lost.
    let tag = p.submit(RequestOp::Ping { payload: 0 }, None);
    p.drain();
    let _ = Pair::output(&mut p.client, &mut p.dirty, p.c);
    p.advance(Duration::from_secs(1));
    p.advance(Duration::from_secs(1));
    assert!(p.c.is_some(), "lost only after the timeout");
    assert!(p.completions().is_empty());
    p.advance(Duration::from_secs(1));
    let done = p.completions();
    assert_eq!(done.len(), 1);
    assert_eq!(
        (done[0].tag, done[0].result.clone_err()),
        (tag, Some(ErrorKind::ConnectionLost))
    );
    assert_eq!(sent(&p), 8, "two more probes in the silence");
    let losses = p.client.counters().heartbeat_losses.load(Ordering::Relaxed);
    assert_eq!(losses, 1);
}
