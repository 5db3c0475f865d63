//! What a peer can make a server hold, over real loopback sockets: a peer that asks and
//! never reads its answers, one that leaves recvs waiting on keys never published, and one
//! that holds the receive budget with a tensor it stopped sending while it goes on talking.
//! In each, a healthy client pings the server all along, and the server's heap (bytes alive
//! in the process, counted by a global allocator) is measured against what the peer sent.
//! Tests run one at a time (they share the process's memory). Both backends: CI runs this
//! file once per `STARWIRE_BACKEND`.

mod common;
#[path = "common/frames.rs"]
mod frames;
#[path = "common/live_heap.rs"]
mod live_heap;

#[global_allocator]
static GLOBAL: live_heap::LiveHeap = live_heap::LiveHeap;

use common::*;
use frames::*;
use starwire::rows::{Init, MemTable, Optimizer, Tables};
use starwire::{DType, Limits, Options, Rendezvous, Runtime, Status, Tensor};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A PS with table 1 (rows of 16 floats that a pull does not create: unknown rows are
/// reported missing and read as zeros) and a rendezvous; 64 MiB of receive budget per
/// connection, 128 MiB for the task.
fn ps(cfg: starwire::config::ConfigBuilder) -> (Runtime, SocketAddr, Arc<Rendezvous>) {
    let table = MemTable::new(16, Init::Missing, Optimizer::Sgd { lr: 1.0 });
    let rv = Rendezvous::new();
    let options = Options {
        service: Some(Arc::new(Tables::new().with(1, Arc::new(table)))),
        rendezvous: Some(rv.clone()),
        ..Options::listen("127.0.0.1:0".parse().unwrap())
    };
    let cfg = cfg.recv_budget(128 * MIB).conn_recv_budget(64 * MIB);
    let rt = Runtime::start_with(cfg.build().unwrap(), options).unwrap();
    let addr = rt.local_addr().unwrap();
    (rt, addr, rv)
}

/// A client pinging the server every millisecond in a thread of its own, keeping each
/// round trip's time.
struct Pinger {
    stop: Arc<AtomicBool>,
    rtts: Arc<Mutex<Vec<(Instant, Duration)>>>,
    thread: Option<std::thread::JoinHandle<Vec<String>>>,
}

impl Pinger {
    fn start(addr: SocketAddr) -> Pinger {
        let stop = Arc::new(AtomicBool::new(false));
        let rtts = Arc::new(Mutex::new(Vec::new()));
        let (stop2, rtts2) = (stop.clone(), rtts.clone());
        let thread = std::thread::spawn(move || {
            let rt = Runtime::start(config("worker", 1).build().unwrap(), None).unwrap();
            let mut h = rt.handle(4);
            let mut errors = Vec::new();
            while !stop2.load(Ordering::Relaxed) {
                let start = Instant::now();
                match h.ping(addr, 32, secs(30)).and_then(|t| h.wait(t)) {
                    Ok(_) => rtts2.lock().unwrap().push((start, start.elapsed())),
                    Err(e) => errors.push(e.to_string()),
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            rt.shutdown();
            errors
        });
        let p = Pinger {
            stop,
            rtts,
            thread: Some(thread),
        };
        while p.rtts.lock().unwrap().len() < 20 {
            std::thread::sleep(Duration::from_millis(5));
        }
        p
    }

    /// The round trips that started at or after `since`.
    fn since(&self, since: Instant) -> Vec<Duration> {
        let rtts = self.rtts.lock().unwrap();
        rtts.iter()
            .filter(|(at, _)| *at >= since)
            .map(|&(_, d)| d)
            .collect()
    }

    /// Stops; fails on any error the client saw.
    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        let errors = self.thread.take().unwrap().join().unwrap();
        assert!(
            errors.is_empty(),
            "the healthy client saw errors: {errors:?}"
        );
        self.rtts.lock().unwrap().len()
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Memory of the process: heap bytes alive (the global allocator's count) and resident
/// bytes (which also see memory mapped outside the heap: large tensors' blocks). Polled
/// until the heap settles (a few samples alike), as the server's loop takes the bytes a
/// peer sent at its own pace.
fn settled() -> (i64, i64) {
    let mut last = live_heap::live_bytes() as i64;
    let mut same = 0;
    let start = Instant::now();
    while same < 10 && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
        let now = live_heap::live_bytes() as i64;
        if (now - last).abs() < (256 << 10) {
            same += 1;
        } else {
            same = 0;
        }
        last = now;
    }
    (last, resident_bytes() as i64)
}

/// Requests of `kind` the server received.
fn served(rt: &Runtime, kind: starwire::stats::RequestKind) -> u64 {
    let m = rt.metrics();
    m.side(starwire::stats::Side::Server)
        .map(|p| p.op(kind).requests)
        .sum()
}

/// A `PULL_ROWS` of table 1 for `n` ids (rows of 16 floats).
fn pull_rows_frame(handle: u64, first: u64, n: u64) -> Vec<u8> {
    let mut meta = Vec::with_capacity(8 + 40 + 8 * n as usize);
    meta.extend_from_slice(&1u32.to_le_bytes());
    meta.extend_from_slice(&0u32.to_le_bytes());
    meta.extend_from_slice(&tensor_meta(DType::F32, &[n, 16], n * 64));
    for id in first..first + n {
        meta.extend_from_slice(&id.to_le_bytes());
    }
    frame(12, 0, 1, handle, &meta, &[])
}

/// Writes the frames `frame(0)`, `frame(1)`, ... (made one at a time, so the writer holds
/// one) from a thread of its own: the server may stop reading them. The connection stays
/// open until `done` is set.
fn write_and_hold(
    mut s: TcpStream,
    frame: impl Fn(u64) -> Option<Vec<u8>> + Send + 'static,
    done: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        s.set_write_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut sent = 0;
        let mut i = 0;
        'frames: while let Some(bytes) = frame(i) {
            let mut at = 0;
            while at < bytes.len() {
                if done.load(Ordering::Relaxed) {
                    break 'frames;
                }
                match s.write(&bytes[at..]) {
                    Ok(n) => at += n,
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(_) => break 'frames,
                }
            }
            sent += bytes.len() as u64;
            i += 1;
        }
        while !done.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
        sent
    })
}

/// Waits until the server has no connection open but the pinger's.
fn wait_one_open(rt: &Runtime) {
    let start = Instant::now();
    loop {
        let s = rt.stats();
        if s.connections_accepted - s.connections_lost - s.connections_closed == 1 {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{s:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_peer_that_reads_no_rows_answers_holds_the_server_to_what_it_sent() {
    let _serial = serial();
    let (rt, addr, _rv) = ps(config("ps", 1));
    let pinger = Pinger::start(addr);
    let (heap0, rss0) = settled();
    // Eight pulls of 1,048,576 rows: 64 MiB sent, 512 MiB of answers asked for (each a
    // block of 64 MiB and a report of 4 MiB of missing rows). The peer reads none of them.
    let frame = |i: u64| (i < 8).then(|| pull_rows_frame(i + 1, i << 20, 1 << 20));
    let sent = 8 * frame(0).unwrap().len() as i64;
    let done = Arc::new(AtomicBool::new(false));
    let writer = write_and_hold(raw_open(addr), frame, done.clone());
    let attack = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    let (heap1, rss1) = settled();
    let (heap, rss) = (heap1 - heap0, rss1 - rss0);
    // The server holds at most what it took of what was sent: the frame it is decoding and
    // the table's copy of its ids (two frames of 16 MiB at most), the answer backlog (16
    // MiB) and the connection's part of the receive budget (64 MiB); the writer holds one
    // frame of its own.
    let bound = 3 * 16 * MIB as i64 + 16 * MIB as i64 + 64 * MIB as i64;
    eprintln!("sent {sent} bytes; the process holds {heap} more heap, {rss} more resident (bound {bound})");
    assert!(
        heap < bound && rss < bound,
        "heap {heap}, resident {rss}, bound {bound}"
    );
    let answered = served(&rt, starwire::stats::RequestKind::PullRows);
    assert!(
        answered < 8,
        "the server stopped reading after {answered} pulls"
    );
    let during = pinger.since(attack);
    done.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    wait_one_open(&rt);
    let after = settled().0 - heap0;
    eprintln!(
        "after the close, {after} bytes more than before; {} pings meanwhile",
        during.len()
    );
    assert!(after < 4 * MIB as i64, "freed with the connection: {after}");
    assert!(during.len() > 10, "the other client went on pinging");
    pinger.finish();
    rt.shutdown();
}

#[test]
fn a_peer_that_reads_no_stats_answers_holds_the_server_to_what_it_sent() {
    let _serial = serial();
    let (rt, addr, _rv) = ps(config("ps", 1));
    let pinger = Pinger::start(addr);
    let (heap0, rss0) = settled();
    // 100,000 STATS requests (3.2 MB); each answer is a document of a few KB.
    let frame = |i: u64| (i < 100_000).then(|| header(15, 0, 0, i + 1, 0, 0));
    let sent = 100_000 * HEADER as i64;
    let done = Arc::new(AtomicBool::new(false));
    let writer = write_and_hold(raw_open(addr), frame, done.clone());
    std::thread::sleep(Duration::from_millis(500));
    let (heap1, rss1) = settled();
    let (heap, rss) = (heap1 - heap0, rss1 - rss0);
    // The answer backlog (16 MiB), one answer over it, and what was sent, with as much again
    // for the rest of the process (the writer's and the pinger's buffers, the decoder's, the
    // allocator's rounding), which varies by a few MiB from run to run. Without the backlog
    // the 100,000 answers of a few KB each would be hundreds of MB.
    let bound = sent + 2 * 16 * MIB as i64;
    eprintln!("sent {sent} bytes; the process holds {heap} more heap, {rss} more resident (bound {bound})");
    assert!(
        heap < bound && rss < bound,
        "heap {heap}, resident {rss}, bound {bound}"
    );
    let answered = served(&rt, starwire::stats::RequestKind::Stats);
    assert!(
        answered < 100_000,
        "the server stopped reading after {answered}"
    );
    done.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    wait_one_open(&rt);
    let after = settled().0 - heap0;
    eprintln!("after the close, {after} bytes more than before");
    assert!(after < 4 * MIB as i64, "freed with the connection: {after}");
    pinger.finish();
    rt.shutdown();
}

#[test]
fn recvs_left_waiting_are_bounded_by_the_bytes_of_their_keys_and_go_without_a_stall() {
    let _serial = serial();
    let (rt, addr, rv) = ps(config("ps", 1));
    let pinger = Pinger::start(addr);
    let (heap0, _) = settled();
    // 48 FUSED_RECVs of 65,536 distinct 128-byte keys never published (384 MiB sent).
    let mut s = raw_open(addr);
    let mut refused = 0;
    for r in 0..48u64 {
        let mut meta = Vec::with_capacity(8 + 130 * 65_536);
        meta.extend_from_slice(&1u64.to_le_bytes());
        for k in 0..65_536u64 {
            meta.extend_from_slice(&128u16.to_le_bytes());
            meta.extend_from_slice(format!("{r:04}/{k:0123}").as_bytes());
        }
        s.write_all(&frame(6, 0, 65_536, r + 1, &meta, &[]))
            .unwrap();
        // Refusals come back at once, as ERRORs for the requests.
        s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
        while let Ok((kind, status, ..)) = read_frame(&mut s) {
            if kind == ERROR && status == 6 {
                refused += 1;
            }
        }
    }
    // Every recv is decoded and either waits or is refused before anything is measured.
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let waiting_recvs = |rv: &Rendezvous| rv.waiting_count() / 65_536;
    while refused + waiting_recvs(&rv) < 48 {
        match read_frame(&mut s) {
            Ok((kind, status, ..)) if kind == ERROR && status == 6 => refused += 1,
            Ok(_) => {}
            Err(e) => panic!("{e} after {refused} refusals"),
        }
    }
    let waiting = rv.waiting_count();
    let heap = settled().0 - heap0;
    eprintln!("{waiting} keys waiting, {refused} recvs refused; the process holds {heap} more");
    assert!(waiting > 0 && waiting < 48 * 65_536, "{waiting}");
    // What the keys cost is bounded by the connection's part of the budget (64 MiB).
    assert!(heap < 64 * MIB as i64 + 16 * MIB as i64, "heap {heap}");
    // The close: the other client's pings while the waiters are taken out.
    std::thread::sleep(Duration::from_millis(200));
    let quiet = median(pinger.since(Instant::now() - Duration::from_millis(200)));
    let closed = Instant::now();
    drop(s);
    while rv.waiting_count() > 0 {
        assert!(closed.elapsed() < Duration::from_secs(30), "waiters left");
        std::thread::sleep(Duration::from_micros(200));
    }
    let forgetting = closed.elapsed();
    wait_one_open(&rt);
    std::thread::sleep(Duration::from_millis(50));
    let around = pinger.since(closed);
    let worst = *around.iter().max().unwrap();
    eprintln!(
        "closed with {waiting} keys waiting, forgotten in {forgetting:?}: {} pings meanwhile, \
         worst {worst:?}, median before {quiet:?}",
        around.len()
    );
    // The waiters are taken out a batch per loop turn, pings answered in between: no ping
    // waits for all of them (a loop that took them all at once would hold a ping for the
    // whole of it).
    assert!(around.len() >= 3, "pings went on: {}", around.len());
    assert!(
        worst < forgetting / 3 + quiet * 5,
        "worst ping {worst:?}, all waiters out in {forgetting:?}"
    );
    assert_eq!(
        rt.stats().recv_reserved,
        0,
        "what the keys were charged is given back"
    );
    pinger.finish();
    rt.shutdown();
}

#[test]
fn a_tensor_left_unsent_is_closed_at_the_progress_timeout_whatever_else_its_peer_sends() {
    let _serial = serial();
    let (rt, addr, _rv) = ps(config("ps", 1).progress_timeout(Duration::from_millis(500)));
    let pinger = Pinger::start(addr);
    // Two peers each declare a 64 MiB chunked push (the task's whole 128 MiB budget), send
    // one byte of it, then an 8 KiB ping every 100 ms.
    let mut starved = Vec::new();
    for i in 0..2u64 {
        let mut s = raw_open(addr);
        let mut bytes = push_frame(10 + i, &[(1, chunked_meta(64 * MIB))], &[]);
        bytes.extend_from_slice(&chunk_frame(10 + i, 0, 0, &[7]));
        s.write_all(&bytes).unwrap();
        starved.push(s);
    }
    let start = Instant::now();
    let ping = frame(PING, 0, 0, 99, &[], &vec![0u8; 8192]);
    let mut open = [true, true];
    while open.iter().any(|&o| o) {
        assert!(start.elapsed() < Duration::from_secs(30), "still open");
        for (s, open) in starved.iter_mut().zip(open.iter_mut()) {
            if *open && s.write_all(&ping).is_err() {
                *open = false;
            }
            s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
            loop {
                match read_frame(s) {
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        *open = false;
                        break;
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = start.elapsed();
    eprintln!("both closed after {took:?} (progress timeout 500 ms), pinging all along");
    wait_one_open(&rt);
    assert_eq!(rt.stats().progress_timeouts, 2);
    assert_eq!(rt.stats().recv_reserved, 0);
    // Another peer's chunked push now fits.
    let client = Runtime::start(
        config("worker", 1).chunk_size(4 << 10).build().unwrap(),
        None,
    )
    .unwrap();
    let mut h = client.handle(4);
    let t = Arc::new(Tensor::from_slice(DType::U8, &[16384], &[1u8; 16384]).unwrap());
    let p = h.push(addr, vec![(1, t)], secs(10)).unwrap();
    let statuses = h.wait(p).unwrap();
    assert_eq!(statuses.len(), 1, "answered: {statuses:?}");
    assert_ne!(statuses[0], Status::ResourceExhausted);
    client.shutdown();
    pinger.finish();
    rt.shutdown();
}

#[test]
fn answers_keep_to_the_limits_their_requester_announced() {
    let _serial = serial();
    let (rt, addr, rv) = ps(config("ps", 1));
    let limits = Limits {
        max_tensors: 1,
        max_tensor_bytes: 1000,
        max_rows: 2,
        ..Limits::default()
    };
    let client = Runtime::start(config("worker", 1).limits(limits).build().unwrap(), None).unwrap();
    let mut h = client.handle(4);
    // Ten keys, one tensor of 4,096 bytes among them: ten RESPONSE frames of one entry,
    // the large one refused alone.
    let keys: Vec<Vec<u8>> = (0..10).map(|i| format!("key{i}").into_bytes()).collect();
    for (i, k) in keys.iter().enumerate() {
        let n = if i == 3 { 4096 } else { 8 };
        rv.publish(
            k,
            Arc::new(Tensor::from_slice(DType::U8, &[n], &vec![i as u8; n as usize]).unwrap()),
        )
        .unwrap();
    }
    let t = h.recv_many(addr, 1, keys, secs(10)).unwrap();
    let got = h.wait(t).unwrap();
    for (i, r) in got.iter().enumerate() {
        match i {
            3 => assert_eq!(r.as_ref().err(), Some(&Status::ResourceExhausted)),
            _ => assert_eq!(r.as_ref().unwrap().bytes(), [i as u8; 8]),
        }
    }
    // Rows: a report of three missing rows is over the requester's max_rows of 2.
    let t = h
        .pull_rows(
            addr,
            &[starwire::rows::Rows::new(1, DType::F32, &[16], &[1, 2, 3])],
            secs(10),
        )
        .unwrap();
    let rows = h.wait(t).unwrap();
    assert_eq!(rows.block(0).err(), Some(Status::ResourceExhausted));
    let t = h
        .pull_rows(
            addr,
            &[starwire::rows::Rows::new(1, DType::F32, &[4], &[1, 2])],
            secs(10),
        )
        .unwrap();
    // Table 1 holds rows of 16 floats: asked for 4, refused for its shape, with the words.
    let e = h.wait(t).unwrap_err();
    assert_eq!(
        e.kind(),
        starwire::ErrorKind::Remote(Status::InvalidArgument)
    );
    assert!(
        e.remote_message().unwrap_or_default().contains("f32 [16]"),
        "{e}"
    );
    assert_eq!(
        client.stats().connections_lost,
        0,
        "the connection never broke"
    );
    client.shutdown();
    rt.shutdown();
}
