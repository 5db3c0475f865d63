//! Soak: mixed load over 400 connections for `STARWIRE_SOAK_SECS` seconds (15 by default;
//! `docs/performance.md` has a 10-minute run). The server is a process of its own, so its
//! memory and descriptors are its own: at the end its open fds, its TCP sockets and its
//! heap bytes alive (counted by a global allocator) besides its send arenas must be within
//! 1 % of their values after the warm-up (a third of the run), the send arenas within their bound, its
//! RSS within 1 % too in runs of 2 minutes or more, and no request may fail or return wrong
//! contents. Each is measured with no request in flight.
//!
//! Load: 400 connections from one client runtime (`connections_per_peer` = 400), four
//! threads keeping 16 requests each in flight, round-robin over the connections — pulls of
//! 100 × 64 B, pushes of 100 × 64 B, pings, and pulls of a 1 MiB tensor — plus connection
//! churn: another client runtime that opens 8 connections, does a few pulls and shuts down,
//! over and over.

mod common;

use common::*;
use starwire::{DType, Status};
use starwire::{Options, Reply, Runtime, Service, Tensor};
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "STARWIRE_TEST_SOAK_SERVER";
const CONNECTIONS: usize = 400;

/// Connections of the load: `STARWIRE_SOAK_CONNECTIONS`, 400 by default.
fn conns() -> usize {
    std::env::var("STARWIRE_SOAK_CONNECTIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(CONNECTIONS)
}
const ROWS: u64 = 1024;
const BIG_ID: u64 = 1 << 32;
const BIG: usize = 1 << 20;

/// Row `i` holds 64 bytes of value `i % 256`; `BIG_ID` is 1 MiB of 7s. A push is accepted
/// when each tensor's bytes equal the low byte of its id.
struct Store {
    rows: Vec<Arc<Tensor>>,
    big: Arc<Tensor>,
    pushed: AtomicU64,
}

impl Service for Store {
    fn pull(&self, ids: &[u64], out: &mut Vec<Result<Arc<Tensor>, Status>>) {
        for &id in ids {
            out.push(match id {
                BIG_ID => Ok(self.big.clone()),
                i if i < ROWS => Ok(self.rows[i as usize].clone()),
                _ => Err(Status::NotFound),
            });
        }
    }
    fn push(&self, items: &mut Vec<(u64, Tensor)>, statuses: &mut Vec<Status>) {
        for (id, t) in items.iter() {
            let ok = t.bytes().iter().all(|&b| b == *id as u8);
            statuses.push(if ok {
                Status::Ok
            } else {
                Status::InvalidArgument
            });
        }
        self.pushed.fetch_add(items.len() as u64, Ordering::Relaxed);
    }
}

#[path = "common/live_heap.rs"]
mod live_heap;

#[global_allocator]
static GLOBAL: live_heap::LiveHeap = live_heap::LiveHeap;

/// The child's entry point: the server, until killed.
#[test]
#[ignore = "entry point of the soak server process"]
fn soak_server() {
    if std::env::var(CHILD_ENV).is_err() {
        return;
    }
    let row = |i: u64| Arc::new(Tensor::from_slice(DType::U8, &[64], &[i as u8; 64]).unwrap());
    let store = Store {
        rows: (0..ROWS).map(row).collect(),
        big: Arc::new(Tensor::from_slice(DType::U8, &[BIG as u64], &vec![7u8; BIG]).unwrap()),
        pushed: AtomicU64::new(0),
    };
    let rt = Runtime::start_with(
        config("ps", 1).build().unwrap(),
        Options {
            service: Some(Arc::new(store)),
            ..Options::listen("127.0.0.1:0".parse().unwrap())
        },
    )
    .unwrap();
    println!("LISTENING {}", rt.local_addr().unwrap());
    // The parent asks for the heap bytes alive, and those of the send arenas, with a line
    // on stdin.
    for _ in std::io::stdin().lines() {
        let arenas = rt.stats().send_arena_bytes;
        println!("LIVE {} {arenas}", live_heap::live_bytes());
    }
}

/// RSS (bytes) and open descriptors of process `pid`, and the TCP sockets of the server
/// listening on `port`: those the kernel holds for it besides the listener and those in
/// TIME_WAIT. An accepted connection has a socket whether or not it has a descriptor (an
/// io_uring direct accept gives it none: it is only in the ring's file table).
fn usage(pid: u32, port: u16) -> (u64, usize, usize) {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    let mut sockets = 0;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let mut f = line.split_whitespace();
            let local = f.nth(1).unwrap_or("");
            let state = f.nth(1).unwrap_or("");
            let local_port = local
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            // 0A: LISTEN, 06: TIME_WAIT.
            if local_port == Some(port) && state != "0A" && state != "06" {
                sockets += 1;
            }
        }
    }
    (pages * 4096, fds, sockets)
}

fn raise_fd_limit() {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) == 0 && rl.rlim_cur < 4096 {
            rl.rlim_cur = rl.rlim_max.min(4096);
            libc::setrlimit(libc::RLIMIT_NOFILE, &rl);
        }
    }
}

/// Checks one answer; returns a description of what was wrong.
fn check(kind: u64, result: &Result<Reply, starwire::Error>, ids: &[u64]) -> Option<String> {
    match (kind, result) {
        (0, Ok(Reply::Pulled(t))) => {
            let bad = t.len() != ids.len()
                || t.iter()
                    .zip(ids)
                    .any(|(t, &id)| !t.as_ref().is_ok_and(|t| t.bytes() == [id as u8; 64]));
            bad.then(|| "pull: wrong contents".to_string())
        }
        (1, Ok(Reply::Pushed(st))) if st.iter().all(|s| *s == Status::Ok) => None,
        (2, Ok(Reply::Pong { .. })) => None,
        (3, Ok(Reply::Pulled(t))) => {
            let ok = t.len() == 1
                && t[0]
                    .as_ref()
                    .is_ok_and(|t| t.bytes().len() == BIG && t.bytes()[BIG - 1] == 7);
            (!ok).then(|| "big pull: wrong contents".to_string())
        }
        (_, other) => Some(format!("{other:?}")),
    }
}

#[test]
fn mixed_load_over_400_connections_keeps_memory_and_descriptors_flat() {
    let soak_secs: u64 = std::env::var("STARWIRE_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let warmup = Duration::from_secs((soak_secs / 3).max(3));
    let total = Duration::from_secs(soak_secs).max(warmup + Duration::from_secs(3));
    raise_fd_limit();

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "soak_server",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the server");
    let mut ask = child.stdin.take().unwrap();
    let mut answers = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let addr: SocketAddr = loop {
        line.clear();
        assert!(answers.read_line(&mut line).unwrap() > 0, "server ended");
        if let Some((_, a)) = line.split_once("LISTENING ") {
            break a.trim().parse().unwrap();
        }
    };
    // The server's heap bytes alive, and those of its send arenas.
    let mut live = move || -> (u64, u64) {
        writeln!(ask).unwrap();
        loop {
            line.clear();
            assert!(answers.read_line(&mut line).unwrap() > 0, "server ended");
            if let Some((_, n)) = line.split_once("LIVE ") {
                let (heap, arenas) = n.trim().split_once(' ').unwrap();
                return (heap.parse().unwrap(), arenas.parse().unwrap());
            }
        }
    };
    let pid = child.id();

    let cfg = config("worker", 2)
        .connections_per_peer(conns())
        .build()
        .unwrap();
    let rt = Arc::new(Runtime::start(cfg, None).unwrap());
    // Open all 400 connections first: one ping per lane.
    {
        let mut h = rt.handle(conns());
        let tags: Vec<_> = (0..conns())
            .map(|_| h.ping(addr, 8, secs(30)).unwrap())
            .collect();
        for t in tags {
            assert!(h.wait(t).is_ok());
        }
    }

    let stop = Arc::new(AtomicBool::new(false));
    // Set to measure with no request in flight: the workers finish theirs and wait,
    // counted in `paused`.
    let pause = Arc::new(AtomicBool::new(false));
    let paused = Arc::new(AtomicU64::new(0));
    let ops = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    // Held while churn connections are open; taken to measure with none open.
    let churn_gate = Arc::new(Mutex::new(()));
    let mut threads = Vec::new();
    for w in 0..4u64 {
        let (rt, stop, ops, errors) = (rt.clone(), stop.clone(), ops.clone(), errors.clone());
        let (pause, paused) = (pause.clone(), paused.clone());
        threads.push(std::thread::spawn(move || {
            let mut h = rt.handle(32);
            let mut inflight = std::collections::HashMap::new();
            let mut n = w * 1_000_003;
            let items: Vec<(u64, Arc<Tensor>)> = (0..100u64)
                .map(|i| {
                    (
                        i,
                        Arc::new(Tensor::from_slice(DType::U8, &[64], &[i as u8; 64]).unwrap()),
                    )
                })
                .collect();
            let mut ids = Vec::with_capacity(100);
            loop {
                while !stop.load(Ordering::Relaxed)
                    && !pause.load(Ordering::Relaxed)
                    && inflight.len() < 16
                {
                    // Mostly small pulls and pushes, some pings, a big pull now and then.
                    let kind = match n % 20 {
                        0 => 3,
                        1..=3 => 2,
                        4..=10 => 1,
                        _ => 0,
                    };
                    ids.clear();
                    ids.extend((0..100).map(|i| (n * 7 + i) % ROWS));
                    let tag = match kind {
                        0 => h.pull_slice(addr, &ids, secs(30)).map(|t| t.tag()),
                        1 => h.push_slice(addr, &items, secs(30)).map(|t| t.tag()),
                        2 => h.ping(addr, 64, secs(30)).map(|t| t.tag()),
                        _ => h.pull_slice(addr, &[BIG_ID], secs(30)).map(|t| t.tag()),
                    }
                    .unwrap();
                    inflight.insert(tag, (kind, ids.clone()));
                    n += 1;
                }
                if inflight.is_empty() {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    if pause.load(Ordering::Relaxed) {
                        paused.fetch_add(1, Ordering::SeqCst);
                        while pause.load(Ordering::SeqCst) && !stop.load(Ordering::Relaxed) {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        paused.fetch_sub(1, Ordering::SeqCst);
                    }
                    continue;
                }
                let done = h.wait_any().unwrap();
                let (kind, ids) = inflight.remove(&done.tag).unwrap();
                if let Some(e) = check(kind, &done.result, &ids) {
                    errors.lock().unwrap().push(e);
                }
                h.recycle(done);
                ops.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let churned = Arc::new(AtomicU64::new(0));
    {
        let (stop, errors, gate, churned) = (
            stop.clone(),
            errors.clone(),
            churn_gate.clone(),
            churned.clone(),
        );
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _open = gate.lock().unwrap();
                let cfg = config("worker", 1).connections_per_peer(8).build().unwrap();
                let c = Runtime::start(cfg, None).unwrap();
                let mut h = c.handle(16);
                let ids: Vec<u64> = (0..100).collect();
                let tags: Vec<_> = (0..16)
                    .map(|_| h.pull_slice(addr, &ids, secs(30)).unwrap())
                    .collect();
                for t in tags {
                    if let Some(e) = check(0, &h.wait_tag(t.tag()).unwrap().result, &ids) {
                        errors.lock().unwrap().push(format!("churn: {e}"));
                    }
                }
                c.shutdown();
                churned.fetch_add(1, Ordering::Relaxed);
                drop(_open);
                std::thread::sleep(Duration::from_millis(50));
            }
        }));
    }

    // Measured with no request in flight (the workers wait) and no churn connection open:
    // the server has its 400 connections (and its own descriptors); wait for it to have
    // closed the last churn client's.
    let mut measure = || {
        pause.store(true, Ordering::SeqCst);
        let start = Instant::now();
        while paused.load(Ordering::SeqCst) < 4 {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "workers still have requests in flight after 60 s"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let _quiet = churn_gate.lock().unwrap();
        let start = Instant::now();
        let m = loop {
            let (rss, fds, socks) = usage(pid, addr.port());
            let (_, fds2, socks2) = {
                std::thread::sleep(Duration::from_millis(100));
                usage(pid, addr.port())
            };
            if (fds, socks) == (fds2, socks2) || start.elapsed() > Duration::from_secs(5) {
                break (rss, fds2, socks2, live());
            }
        };
        pause.store(false, Ordering::SeqCst);
        m
    };
    let started = Instant::now();
    std::thread::sleep(warmup);
    let (rss0, fds0, socks0, (live0, arenas0)) = measure();
    let ops0 = ops.load(Ordering::Relaxed);
    // Samples along the way (ten), printed so that a long run documents its course.
    let window = total.saturating_sub(started.elapsed());
    for _ in 1..10 {
        std::thread::sleep(window / 10);
        let (rss, fds, socks, (heap, arenas)) = measure();
        eprintln!(
            "  {:>5.0} s: RSS {} KiB, heap {} KiB ({} KiB in send arenas), fds {fds}, \
             sockets {socks}, {} requests",
            started.elapsed().as_secs_f64(),
            rss >> 10,
            heap >> 10,
            arenas >> 10,
            ops.load(Ordering::Relaxed) - ops0
        );
    }
    std::thread::sleep(total.saturating_sub(started.elapsed()));
    let (rss1, fds1, socks1, (live1, arenas1)) = measure();
    let ops1 = ops.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    child.kill().ok();
    child.wait().ok();

    let errors = errors.lock().unwrap();
    eprintln!(
        "soak {soak_secs} s over {} connections: {} requests ({} after warm-up), {} churn \
         clients, {} errors; server RSS {} KiB after warm-up, {} KiB at the end ({:+.2} %); \
         heap {} KiB -> {} KiB, of which send arenas {} KiB -> {} KiB; fds {fds0} -> {fds1}; \
         server sockets {socks0} -> {socks1}",
        conns(),
        ops1,
        ops1 - ops0,
        churned.load(Ordering::Relaxed),
        errors.len(),
        rss0 >> 10,
        rss1 >> 10,
        100.0 * (rss1 as f64 - rss0 as f64) / rss0 as f64,
        live0 >> 10,
        live1 >> 10,
        arenas0 >> 10,
        arenas1 >> 10,
    );
    assert!(
        errors.is_empty(),
        "{} errors, first: {:?}",
        errors.len(),
        errors.first()
    );
    assert!(ops1 > ops0, "no progress after the warm-up");
    // Its connections' sockets are counted whether they have descriptors or not; a socket
    // the server fails to close stays in CLOSE_WAIT and is counted too.
    assert!(
        socks0 >= conns(),
        "the server has {socks0} sockets, fewer than its connections"
    );
    assert!(
        socks1.abs_diff(socks0) * 100 <= socks0,
        "sockets {socks0} -> {socks1}"
    );
    assert!(
        fds1.abs_diff(fds0) * 100 <= fds0.max(100),
        "fds {fds0} -> {fds1}"
    );
    // The send arenas keep idle blocks for the next frames (`Stats::send_arena_bytes`): per
    // connection with nothing queued, the block it writes into and two idle ones of 128 KiB,
    // or more, as much as its recent output needed, up to `STARWIRE_SEND_ARENA_KEEP`. Which
    // connections have met a burst that needed them by a given time is chance, so they are
    // held to that bound, and the rest of the heap to 1 %.
    let per_conn = (3 * (128 << 10)).max(starwire::config::DEFAULT_SEND_ARENA_KEEP);
    let arena_bound = conns() as u64 * per_conn;
    for a in [arenas0, arenas1] {
        assert!(
            a <= arena_bound,
            "send arenas hold {a} bytes over {} connections",
            conns()
        );
    }
    let (rest0, rest1) = (live0 - arenas0, live1 - arenas1);
    assert!(
        rest1.abs_diff(rest0) * 100 <= rest0,
        "heap besides the send arenas {rest0} -> {rest1} (with them {live0} -> {live1})"
    );
    // RSS keeps rising through the first minute or two, while each of the 400 connections
    // first meets its largest burst and reserved capacity is touched for the first time
    // (the heap count above, which is exact, moves far less); from then on it is flat (run
    // K1 in docs/performance.md: +0.03 % from 200 s to 600 s). So it is held to 1 % in runs
    // long enough for a warm-up past that phase, and printed in the short ones.
    if soak_secs >= 120 {
        assert!(rss1.abs_diff(rss0) * 100 <= rss0, "RSS {rss0} -> {rss1}");
    }
}
