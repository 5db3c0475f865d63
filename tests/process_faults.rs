//! A server in another process, stopped and killed with requests in flight; a client in
//! another process killed in the middle of a large push.

mod common;

use common::*;
use starwire::tensor::{TensorAllocator, TensorDesc, TensorMemory};
use starwire::{DType, Status};
use starwire::{ErrorKind, Service, Tensor};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "STARWIRE_TEST_CHILD_SERVER";

/// The child's entry point, not a test of its own: a server that prints its address and
/// waits to be killed. Started by the tests below with `--ignored`.
#[test]
#[ignore = "entry point of the child server process"]
fn child_server() {
    let Ok(addr) = std::env::var(CHILD_ENV) else {
        return;
    };
    let rt = starwire::Runtime::start(
        config("ps", 1).build().unwrap(),
        Some(addr.parse().unwrap()),
    )
    .expect("child server starts");
    println!("LISTENING {}", rt.local_addr().unwrap());
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn spawn_server(addr: &str) -> (Child, SocketAddr) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_server",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, addr)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn child server");
    let out = child.stdout.take().unwrap();
    for line in BufReader::new(out).lines() {
        let line = line.unwrap();
        // The test harness may print its own text first on the same line.
        if let Some((_, a)) = line.split_once("LISTENING ") {
            return (child, a.trim().parse().unwrap());
        }
    }
    child.kill().ok();
    child.wait().ok();
    panic!("child server printed no address");
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    assert_eq!(rc, 0);
}

/// Waits until the kernel reports the child stopped (SIGSTOP is delivered asynchronously).
fn wait_stopped(child: &Child) {
    let path = format!("/proc/{}/stat", child.id());
    let start = Instant::now();
    loop {
        let stat = std::fs::read_to_string(&path).unwrap();
        // The state follows the parenthesized command name.
        let state = stat.rsplit_once(") ").map(|(_, rest)| rest.as_bytes()[0]);
        if state == Some(b'T') {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "child did not stop"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits until `client` has queued at least `bytes` bytes of requests of `kind` on its
/// connections to `peer`: a request counts once it is on a connection, so one lost after
/// that fails as lost (`ConnectionLost`), never as a connect that failed.
fn wait_sent(
    client: &starwire::Runtime,
    peer: SocketAddr,
    kind: starwire::stats::RequestKind,
    bytes: u64,
) {
    let start = Instant::now();
    while client
        .metrics()
        .client(peer)
        .map_or(0, |p| p.op(kind).bytes_out)
        < bytes
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the requests were not sent"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn killed_server_fails_requests_in_flight_and_a_restarted_one_is_reached() {
    let (mut child, addr) = spawn_server("127.0.0.1:0");
    let client = client(1);
    assert!(ping_once(&client, addr, secs(10)).is_ok());

    // Stop the server so requests stay unanswered, then kill it.
    signal(&child, libc::SIGSTOP);
    wait_stopped(&child);
    let mut h = client.handle(64);
    let tags: Vec<_> = (0..20)
        .map(|_| h.ping(addr, 64, secs(30)).unwrap())
        .collect();
    // All 20 are on the connection (after the first ping's 48 bytes, 20 frames of 96)
    // before the server dies, so each fails as lost, whatever the machine's load.
    wait_sent(
        &client,
        addr,
        starwire::stats::RequestKind::Ping,
        48 + 20 * 96,
    );
    let killed = Instant::now();
    signal(&child, libc::SIGKILL);
    child.wait().unwrap();
    for t in tags {
        assert_eq!(
            h.wait(t).err().map(|e| e.kind()),
            Some(ErrorKind::ConnectionLost)
        );
    }
    let took = killed.elapsed();
    // Failed by the loss (`ConnectionLost`, where the deadline gives `Timeout`), and so
    // before the requests' own 30 s deadline.
    assert!(took < Duration::from_secs(30), "failing took {took:?}");

    // A server restarted on the same address is reconnected to.
    let (mut again, addr2) = spawn_server(&addr.to_string());
    assert_eq!(addr2, addr);
    let start = Instant::now();
    while ping_once(&client, addr, secs(10)).is_err() {
        assert!(start.elapsed() < Duration::from_secs(30), "no reconnect");
        std::thread::sleep(Duration::from_millis(20));
    }
    again.kill().ok();
    again.wait().ok();
}

const CHILD_CLIENT_ENV: &str = "STARWIRE_TEST_CHILD_CLIENT";
const BIG: usize = 256 << 20;

/// The child's entry point, not a test of its own: a task that listens (with a rendezvous
/// where nothing is ever published), prints its address, and pushes a 256 MiB tensor to the
/// server named by the environment over and over until it is killed.
#[test]
#[ignore = "entry point of the child client process"]
fn child_client() {
    let Ok(server) = std::env::var(CHILD_CLIENT_ENV) else {
        return;
    };
    let server: SocketAddr = server.parse().unwrap();
    let rt = starwire::Runtime::start_with(
        config("worker", 1).build().unwrap(),
        starwire::Options {
            rendezvous: Some(starwire::Rendezvous::new()),
            ..starwire::Options::listen("127.0.0.1:0".parse().unwrap())
        },
    )
    .expect("child starts");
    println!("LISTENING {}", rt.local_addr().unwrap());
    let big = Arc::new(Tensor::zeros(DType::U8, &[BIG as u64]).unwrap());
    let mut h = rt.handle(4);
    loop {
        let t = h.push(server, vec![(1, big.clone())], secs(120)).unwrap();
        let _ = h.wait(t);
    }
}

/// Accepts every push.
struct Sink;

impl Service for Sink {
    fn push(&self, items: &mut Vec<(u64, Tensor)>, statuses: &mut Vec<Status>) {
        statuses.extend(items.iter().map(|_| Status::Ok));
    }
}

/// Tensor memory that counts the bytes alive.
struct Tracked {
    bytes: Vec<u8>,
    live: Arc<AtomicI64>,
}

// SAFETY: the vector is never resized, moved out or freed while the value lives, so both
// methods always return the same memory of the same length.
unsafe impl TensorMemory for Tracked {
    fn bytes(&self) -> &[u8] {
        &self.bytes
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.live
            .fetch_sub(self.bytes.len() as i64, Ordering::SeqCst);
    }
}

struct TrackingAllocator(Arc<AtomicI64>);

impl TensorAllocator for TrackingAllocator {
    fn allocate(&self, d: &TensorDesc<'_>) -> Option<Box<dyn TensorMemory>> {
        self.0.fetch_add(d.byte_len as i64, Ordering::SeqCst);
        Some(Box::new(Tracked {
            bytes: vec![0; d.byte_len as usize],
            live: self.0.clone(),
        }))
    }
}

#[test]
fn killed_client_mid_transfer_fails_requests_towards_it_and_frees_what_it_sent() {
    // Bytes of tensors the server received (or is receiving) that are still alive.
    let live = Arc::new(AtomicI64::new(0));
    let server = starwire::Runtime::start_with(
        config("ps", 1).build().unwrap(),
        starwire::Options {
            service: Some(Arc::new(Sink)),
            allocator: Some(Arc::new(TrackingAllocator(live.clone()))),
            ..starwire::Options::listen("127.0.0.1:0".parse().unwrap())
        },
    )
    .unwrap();
    let server_addr = server.local_addr().unwrap();

    // Another client of the server keeps pinging it through the whole test.
    let stop = Arc::new(AtomicBool::new(false));
    let pinged = Arc::new(AtomicI64::new(0));
    let bystander = {
        let (stop, pinged) = (stop.clone(), pinged.clone());
        std::thread::spawn(move || {
            let c = client(1);
            let mut errors = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if let Err(e) = ping_once(&c, server_addr, secs(5)) {
                    errors.push(e);
                }
                pinged.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(5));
            }
            errors
        })
    };

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_client",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_CLIENT_ENV, server_addr.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn child client");
    let out = child.stdout.take().unwrap();
    let child_addr: SocketAddr = BufReader::new(out)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| {
            l.split_once("LISTENING ")
                .map(|(_, a)| a.trim().parse().unwrap())
        })
        .expect("child address");

    // This process also has a request in flight towards the child: a recv of a key the
    // child never publishes.
    let cl = client(1);
    assert!(ping_once(&cl, child_addr, secs(10)).is_ok());
    let mut h = cl.handle(4);
    let recv = h.recv(child_addr, 1, b"never", secs(30)).unwrap();
    // The recv is on the connection before the child dies (queued on it: its bytes are
    // counted), so its loss is a lost connection whatever the machine's load: a request
    // not yet sent when its peer dies meets a refused connect instead (`ConnectFailed`).
    wait_sent(&cl, child_addr, starwire::stats::RequestKind::Recv, 1);

    // Kill the child while the server holds a partly received 256 MiB tensor.
    let start = Instant::now();
    while !(server.stats().bytes_in > 16 << 20 && live.load(Ordering::SeqCst) > 0) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the push did not start"
        );
        std::hint::spin_loop();
    }
    let during = live.load(Ordering::SeqCst);
    let killed = Instant::now();
    signal(&child, libc::SIGKILL);
    child.wait().unwrap();

    // The recv towards the dead child fails at once, not at its deadline.
    assert_eq!(
        h.wait(recv).err().map(|e| e.kind()),
        Some(ErrorKind::ConnectionLost)
    );
    let took = killed.elapsed();
    // Failed by the loss (`ConnectionLost`, where the deadline gives `Timeout`), and so
    // before the requests' own 30 s deadline.
    assert!(took < Duration::from_secs(30), "failing took {took:?}");

    // The server closes the child's connection and drops the half-received tensor.
    let start = Instant::now();
    loop {
        let s = server.stats();
        if s.connections_accepted - s.connections_lost - s.connections_closed == 1 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "connection not closed: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    while live.load(Ordering::SeqCst) != 0 {
        let l = live.load(Ordering::SeqCst);
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{l} bytes of tensors still alive"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!("{during} tensor bytes alive at the kill, 0 after; the recv failed after {took:?}");

    // The bystander pinged before the kill and goes on after the cleanup.
    let at_cleanup = pinged.load(Ordering::SeqCst);
    while pinged.load(Ordering::SeqCst) < at_cleanup + 10 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the bystander stalled"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    let errors = bystander.join().unwrap();
    let pings = pinged.load(Ordering::SeqCst);
    assert!(
        at_cleanup > 0 && errors.is_empty(),
        "{pings} pings, errors {errors:?}"
    );
    cl.shutdown();
    server.shutdown();
}
