//! Send/recv rendezvous over real sockets: recv before and after publish, exactly once,
//! fused recv of 1, 100 and 10,000 tensors, streaming of ready tensors, dead tensors,
//! step abort.

mod common;
#[path = "common/frames.rs"]
mod frames;

use common::*;
use starwire::{DType, Status};
use starwire::{ErrorKind, Options, Rendezvous, Reply, Runtime, Tensor};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn serve(rv: Arc<Rendezvous>) -> Runtime {
    Runtime::start_with(
        config("ps", 2).build().unwrap(),
        Options {
            rendezvous: Some(rv),
            ..Options::listen("127.0.0.1:0".parse().unwrap())
        },
    )
    .unwrap()
}

fn bytes_of(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 31 + j * 7) as u8).collect()
}

#[test]
fn recv_completes_whether_published_before_or_after_and_exactly_once() {
    let rv = Rendezvous::new();
    let server = serve(rv.clone());
    let addr = server.local_addr().unwrap();
    let client = client(1);
    let mut h = client.handle(8);

    // Published before the request.
    let t = Tensor::from_f32(&[2], &[1.0, 2.0]).unwrap();
    rv.publish(b"before", Arc::new(t)).unwrap();
    let tag = h.recv(addr, 1, b"before", secs(10)).unwrap();
    let v = h.wait(tag).unwrap();
    assert_eq!(v[0].as_ref().unwrap().to_f32(), [1.0, 2.0]);

    // Published after the request arrived.
    let tag = h.recv(addr, 1, b"after", secs(10)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        h.poll().is_none(),
        "completed before the tensor was published"
    );
    rv.publish(b"after", Arc::new(Tensor::from_f32(&[1], &[5.0]).unwrap()))
        .unwrap();
    let v = h.wait(tag).unwrap();
    assert_eq!(v[0].as_ref().unwrap().to_f32(), [5.0]);

    // Exactly once: a second recv of a consumed key waits (and here times out).
    let tag = h
        .recv(
            addr,
            1,
            b"before",
            Some(Instant::now() + Duration::from_millis(200)),
        )
        .unwrap();
    assert_eq!(
        h.wait(tag).err().map(|e| e.kind()),
        Some(ErrorKind::Timeout)
    );
    assert_eq!(rv.ready_count(), 0);
    // Publishing twice before a recv is refused.
    rv.publish(b"twice", Arc::new(Tensor::dead(DType::F32)))
        .unwrap();
    assert!(rv
        .publish(b"twice", Arc::new(Tensor::dead(DType::F32)))
        .is_err());
}

fn fused(n: usize, sizes: &[usize]) {
    let rv = Rendezvous::new();
    let server = serve(rv.clone());
    let addr = server.local_addr().unwrap();
    let client = client(1);
    let mut h = client.handle(4);
    let keys: Vec<Vec<u8>> = (0..n)
        .map(|i| format!("step7/edge_{i}").into_bytes())
        .collect();
    // Half published before, half after the request.
    let tensor = |i: usize| {
        let len = sizes[i % sizes.len()];
        Tensor::from_bytes(DType::U8, &[len as u64], bytes_of(i, len)).unwrap()
    };
    for (i, k) in keys.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
        rv.publish(k, Arc::new(tensor(i))).unwrap();
    }
    // The connection is open (its handshake is done) before the frames are counted.
    assert!(ping_once(&client, addr, secs(10)).is_ok());
    let frames_before = client.stats().frames_out;
    let tag = h.recv_many(addr, 7, keys.clone(), secs(60)).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    for (i, k) in keys.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
        rv.publish(k, Arc::new(tensor(i))).unwrap();
    }
    let v = h.wait(tag).unwrap();
    assert_eq!(v.len(), n);
    for (i, r) in v.iter().enumerate() {
        let got = r.as_ref().unwrap();
        let want = tensor(i);
        assert_eq!(got.dims(), want.dims());
        assert!(got.bytes() == want.bytes(), "tensor {i}");
    }
    // One request for all the keys, and no other (frames are not compared: on a slow run
    // a heartbeat PING or the PONG to the server's adds one).
    let m = client.metrics();
    let peer = m.client(addr).expect("the client's metrics of the server");
    let requests = |kind| peer.op(kind).requests;
    use starwire::stats::RequestKind::{FusedRecv, Recv};
    // One key travels as a plain RECV.
    let expected = if n == 1 { (0, 1) } else { (1, 0) };
    assert_eq!((requests(FusedRecv), requests(Recv)), expected);
    assert!(client.stats().frames_out > frames_before);
}

#[test]
fn fused_recv_of_1_tensor() {
    fused(1, &[16]);
}

#[test]
fn fused_recv_of_100_mixed_tensors() {
    fused(100, &[0, 1, 64, 4096, 65_536, 1 << 20, 5 << 20]);
}

#[test]
fn fused_recv_of_10000_tensors() {
    fused(10_000, &[0, 8, 64, 256, 4096]);
}

#[test]
fn ready_tensors_are_sent_without_waiting_for_slow_ones() {
    let rv = Rendezvous::new();
    let server = serve(rv.clone());
    let addr = server.local_addr().unwrap();
    let client = client(1);
    let mut h = client.handle(4);
    rv.publish(b"fast", Arc::new(Tensor::from_f32(&[1], &[1.0]).unwrap()))
        .unwrap();
    // The connection is open (its handshake is done) before the frames are counted.
    assert!(ping_once(&client, addr, secs(10)).is_ok());
    let in0 = client.stats().frames_in;
    let tag = h
        .recv_many(addr, 3, vec![b"fast".to_vec(), b"slow".to_vec()], secs(10))
        .unwrap();
    // The ready tensor's answer arrives while the slow one is not published.
    let start = Instant::now();
    while client.stats().frames_in < in0 + 1 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "fast tensor not streamed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(h.poll().is_none());
    rv.publish(b"slow", Arc::new(Tensor::dead(DType::F32)))
        .unwrap();
    let v = h.wait(tag).unwrap();
    assert_eq!(v[0].as_ref().unwrap().to_f32(), [1.0]);
    // Dead tensors are carried as dead.
    assert!(v[1].as_ref().unwrap().is_dead());
}

#[test]
fn aborting_a_step_fails_its_pending_recvs() {
    let rv = Rendezvous::new();
    let server = serve(rv.clone());
    let addr = server.local_addr().unwrap();
    let client = client(1);
    let mut h = client.handle(4);
    rv.publish(b"k1", Arc::new(Tensor::from_f32(&[1], &[1.0]).unwrap()))
        .unwrap();
    let tag = h
        .recv_many(addr, 9, vec![b"k1".to_vec(), b"k2".to_vec()], secs(10))
        .unwrap();
    let other = h.recv(addr, 10, b"k3", secs(10)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    rv.abort_step(9);
    let v = h.wait(tag).unwrap();
    assert!(v[0].is_ok());
    assert_eq!(v[1].as_ref().unwrap_err(), &Status::Aborted);
    // Another step is untouched.
    rv.publish(b"k3", Arc::new(Tensor::dead(DType::U8)))
        .unwrap();
    assert!(h.wait(other).unwrap()[0].is_ok());
}

#[test]
fn recv_from_a_task_without_rendezvous_is_unimplemented() {
    let server = server(1);
    let client = client(1);
    let mut h = client.handle(4);
    let tag = h
        .recv(server.local_addr().unwrap(), 1, b"k", secs(10))
        .unwrap();
    assert_eq!(
        h.wait(tag).err().map(|e| e.kind()),
        Some(ErrorKind::Remote(Status::Unimplemented))
    );
}

fn fused_frames(fuse: bool) -> u64 {
    let rv = Rendezvous::new();
    let server = serve(rv.clone());
    let addr = server.local_addr().unwrap();
    for i in 0..50u32 {
        let t = Tensor::from_bytes(DType::U8, &[4], i.to_le_bytes().to_vec()).unwrap();
        rv.publish(format!("k{i}").as_bytes(), Arc::new(t)).unwrap();
    }
    let mut client =
        starwire::Embedded::new(config("worker", 1).tensor_fuse(fuse).build().unwrap(), None)
            .unwrap();
    // The connection is open (its handshake is done) before the frames are counted.
    let t = client.ping(addr, 0, secs(10)).unwrap();
    client.wait(t).unwrap();
    let before = client.stats().frames_out;
    // 50 separate recvs, issued together: they reach the loop in one drain pass.
    let tickets: Vec<_> = (0..50)
        .map(|i| {
            let key = format!("k{i}").into_bytes();
            client.recv_many(addr, 4, vec![key], secs(10)).unwrap()
        })
        .collect();
    // Waited in order; the completions of the others that arrive meanwhile are kept.
    for (i, t) in tickets.into_iter().enumerate() {
        let v = client.wait(t).unwrap();
        assert_eq!(v.len(), 1, "each recv gets its own entry");
        assert_eq!(v[0].as_ref().unwrap().bytes(), (i as u32).to_le_bytes());
    }
    client.stats().frames_out - before
}

#[test]
fn recvs_issued_together_leave_as_one_frame_with_fusion_on() {
    assert_eq!(fused_frames(true), 1);
    assert_eq!(fused_frames(false), 50);
}

#[test]
fn timed_out_requests_free_their_slots_and_late_answers_are_ignored() {
    let rv = Rendezvous::new();
    let server = serve(rv.clone());
    let addr = server.local_addr().unwrap();
    let client =
        Runtime::start(config("worker", 1).max_inflight(16).build().unwrap(), None).unwrap();
    let mut h = client.handle(64);
    // More timed-out requests than the loop has request slots.
    for i in 0..40 {
        let key = format!("never-{i}");
        let deadline = Some(Instant::now() + Duration::from_millis(20));
        let tag = h.recv(addr, 1, key.as_bytes(), deadline).unwrap();
        assert_eq!(
            h.wait(tag).err().map(|e| e.kind()),
            Some(ErrorKind::Timeout),
            "request {i}"
        );
    }
    // A key published after the requester gave up is not consumed by the recv given up
    // (the responder dropped its waiter): it stays for the next recv.
    rv.publish(b"never-39", Arc::new(Tensor::dead(DType::U8)))
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(rv.ready_count(), 1);
    assert!(ping_once(&client, addr, secs(10)).is_ok());
    assert_eq!(client.stats().connections_lost, 0);
    let tag = h.recv(addr, 1, b"never-39", secs(10)).unwrap();
    assert!(h.wait(tag).unwrap()[0].as_ref().unwrap().is_dead());
}

#[test]
fn fused_recvs_keep_their_own_deadlines() {
    let rv = Rendezvous::new();
    let server = serve(rv.clone());
    let addr = server.local_addr().unwrap();
    let mut client =
        starwire::Embedded::new(config("worker", 1).tensor_fuse(true).build().unwrap(), None)
            .unwrap();
    // The connection is open (its handshake is done) before the frames are counted.
    let t = client.ping(addr, 0, secs(10)).unwrap();
    client.wait(t).unwrap();
    let before = client.stats().frames_out;
    let short = Some(Instant::now() + Duration::from_millis(100));
    let a = client
        .recv_many(addr, 2, vec![b"late".to_vec()], short)
        .unwrap()
        .tag();
    let b = client
        .recv_many(addr, 2, vec![b"later".to_vec()], None)
        .unwrap()
        .tag();
    let start = Instant::now();
    let mut results = std::collections::HashMap::new();
    let mut published = false;
    while results.len() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "stuck: {:?}",
            results.keys()
        );
        client.drive(Some(Duration::from_millis(5)));
        while let Some(c) = client.poll() {
            results.insert(c.tag, (Instant::now(), c.result));
        }
        // The key of the recv without deadline appears only once the other has ended:
        // each ended by its own terms, in this order.
        if !published && results.contains_key(&a) {
            assert!(
                !results.contains_key(&b),
                "b ended before its key was published"
            );
            rv.publish(b"later", Arc::new(Tensor::dead(DType::F32)))
                .unwrap();
            published = true;
        }
    }
    let (at_a, ra) = &results[&a];
    assert_eq!(ra.as_ref().map_err(|e| e.kind()), Err(ErrorKind::Timeout));
    assert!(Some(*at_a) >= short, "a timed out before its deadline");
    let (at_b, rb) = &results[&b];
    assert!(
        matches!(rb, Ok(Reply::Received(v)) if v[0].is_ok()),
        "{rb:?}"
    );
    assert!(at_b >= at_a);
    // The two recvs went out as one frame, and the first one's item was cancelled alone
    // when its deadline passed (a CANCEL).
    assert_eq!(
        client.stats().frames_out - before,
        2,
        "the two recvs were fused"
    );
}

/// A `RECV` or `FUSED_RECV` frame of `keys` (docs/wire-format.md 4.2) with `timeout_ms`.
fn recv_frame(handle: u64, keys: &[&[u8]], timeout_ms: u32) -> Vec<u8> {
    let mut meta = 7u64.to_le_bytes().to_vec();
    for k in keys {
        meta.extend_from_slice(&(k.len() as u16).to_le_bytes());
        meta.extend_from_slice(k);
    }
    let kind = if keys.len() == 1 { 5 } else { 6 };
    let mut f = frames::frame(kind, 0, keys.len() as u32, handle, &meta, &[]);
    f[8..12].copy_from_slice(&timeout_ms.to_le_bytes());
    f
}

/// A `CANCEL` of `items` of request `handle` (4.10).
fn cancel_frame(handle: u64, items: &[u32]) -> Vec<u8> {
    let meta: Vec<u8> = items.iter().flat_map(|i| i.to_le_bytes()).collect();
    frames::frame(14, 0, items.len() as u32, handle, &meta, &[])
}

/// The first entry of a `RESPONSE`'s meta section: item index and status.
fn first_entry(meta: &[u8]) -> (u32, u16) {
    let index = u32::from_le_bytes(meta[0..4].try_into().unwrap());
    (index, u16::from_le_bytes([meta[4], meta[5]]))
}

#[test]
fn deadlines_and_cancels_on_the_wire_end_recvs_without_consuming_later_tensors() {
    use std::io::Write;
    const RESPONSE: u8 = 9;
    const END: u16 = 1;
    const CANCELLED: u16 = 3;
    const DEADLINE_EXCEEDED: u16 = 4;
    let rv = Rendezvous::new();
    let server = serve(rv.clone());
    let addr = server.local_addr().unwrap();
    let mut s = frames::raw_open(addr);
    let flags = |f: &[u8]| u16::from_le_bytes([f[6], f[7]]);
    let read = |s: &mut std::net::TcpStream| frames::read_raw(s).unwrap();
    let status = |f: &[u8]| u16::from_le_bytes([f[8], f[9]]);
    let handle = |f: &[u8]| u64::from_le_bytes(f[16..24].try_into().unwrap());

    // A recv that carries 200 ms: the responder gives up on it itself.
    let sent = Instant::now();
    s.write_all(&recv_frame(7, &[b"k1"], 200)).unwrap();
    let f = read(&mut s);
    let took = sent.elapsed();
    assert_eq!(
        (f[5], status(&f), handle(&f)),
        (frames::ERROR, DEADLINE_EXCEEDED, 7)
    );
    assert!(
        took >= Duration::from_millis(200),
        "answered after {took:?}"
    );

    // A recv without deadline, cancelled: confirmed with CANCELLED.
    s.write_all(&recv_frame(9, &[b"k2"], 0)).unwrap();
    s.write_all(&cancel_frame(9, &[])).unwrap();
    let f = read(&mut s);
    assert_eq!(
        (f[5], status(&f), handle(&f)),
        (frames::ERROR, CANCELLED, 9)
    );

    // A fused recv of two keys with its second item cancelled: that item is answered
    // CANCELLED alone, the first still gets its tensor (with END).
    s.write_all(&recv_frame(11, &[b"k3", b"k4"], 0)).unwrap();
    s.write_all(&cancel_frame(11, &[1])).unwrap();
    let f = read(&mut s);
    assert_eq!((f[5], handle(&f), flags(&f) & END), (RESPONSE, 11, 0));
    assert_eq!(first_entry(&f[32..]), (1, CANCELLED));
    rv.publish(b"k3", Arc::new(Tensor::dead(DType::U8)))
        .unwrap();
    let f = read(&mut s);
    assert_eq!((f[5], handle(&f), flags(&f) & END), (RESPONSE, 11, END));
    assert_eq!(first_entry(&f[32..]), (0, 0));

    // A cancel of a request that is not waiting (answered already, or never seen) is
    // ignored, and the connection goes on.
    s.write_all(&cancel_frame(11, &[])).unwrap();
    s.write_all(&cancel_frame(12345, &[0])).unwrap();
    s.write_all(&frames::frame(frames::PING, 0, 0, 13, &[], b"hi"))
        .unwrap();
    let f = read(&mut s);
    assert_eq!((f[5], handle(&f)), (frames::PONG, 13));

    // None of the keys given up was consumed: published now, they all stay.
    for k in [b"k1", b"k2", b"k4"] {
        rv.publish(k, Arc::new(Tensor::dead(DType::U8))).unwrap();
    }
    assert_eq!(rv.ready_count(), 3);
    server.shutdown();
}
