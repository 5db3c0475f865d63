//! What a request to a peer that cannot be reached, or that dies, fails with, over real
//! sockets (on the backend `STARWIRE_BACKEND` picks; CI runs this once per backend): the
//! kind, the operating system's reason, the attempts, and the peer named by its task.

mod common;

use common::*;
use starwire::cluster::endpoint_map::EndpointMap;
use starwire::cluster::{ClusterSpec, Resolver};
use starwire::{Embedded, ErrorKind, Peer, Runtime};
use std::io::{BufRead, BufReader, ErrorKind as IoKind};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// An address where nothing listens: a port the kernel gave a listener that is closed
/// again, so a connect to it is refused.
fn closed_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// A resolver whose cluster has `ps:0` at an unused control address and `ps:1` whose data
/// address is `ps1`.
fn cluster_with_ps1_at(ps1: SocketAddr) -> Resolver {
    let mut spec = ClusterSpec::new();
    spec.add_job("ps", "10.9.9.1:2222,10.9.9.2:2222").unwrap();
    let map = format!("10.9.9.1:2222=10.9.9.1:5555\n10.9.9.2:2222={ps1}\n");
    Resolver::from_spec(&spec, &EndpointMap::parse("map", map.as_bytes()).unwrap())
}

/// A worker runtime that retries a failed connect `retries` times after `backoff`.
fn worker(retries: u32, backoff: Duration) -> Runtime {
    let cfg = config("worker", 1)
        .connect_retries(retries)
        .connect_backoff(backoff)
        .build()
        .unwrap();
    Runtime::start(cfg, None).unwrap()
}

#[test]
fn a_closed_port_fails_with_the_refusal_the_attempts_and_the_task_name() {
    let dead = closed_port();
    let ps1 = cluster_with_ps1_at(dead).resolve("ps:1").unwrap();
    assert_eq!((ps1.addr(), ps1.task()), (dead, Some("ps:1")));
    let rt = worker(2, Duration::from_millis(1));
    let mut h = rt.handle(8);
    let t = h.ping(ps1, 0, None).unwrap();
    let e = h.wait(t).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectFailed);
    assert_eq!(
        e.os_error().map(|o| o.kind()),
        Some(IoKind::ConnectionRefused)
    );
    assert_eq!(e.connect_attempts(), Some(3));
    assert_eq!((e.peer(), e.task()), (Some(dead), Some("ps:1")));
    let text = e.to_string();
    let want = format!("could not connect to ps:1 ({dead}) after 3 attempts over ");
    assert!(text.starts_with(&want), "{text}");
    assert!(text.ends_with(": connection refused"), "{text}");
    // The metrics name the peer by the same task, though no handshake ever did.
    let m = rt.metrics();
    assert_eq!(m.client(dead).unwrap().task.as_deref(), Some("ps:1"));

    // The same address given as an address, with no cluster: named by the address only.
    let t = h.ping(closed_port(), 0, None).unwrap();
    let e = h.wait(t).unwrap_err();
    assert_eq!((e.kind(), e.task()), (ErrorKind::ConnectFailed, None));
    assert!(e.to_string().ends_with(": connection refused"), "{e}");
    // An address the cluster has a task at is that task.
    let by_addr = cluster_with_ps1_at(dead)
        .resolve(&dead.to_string())
        .unwrap();
    let t = h.ping(by_addr, 0, None).unwrap();
    assert_eq!(h.wait(t).unwrap_err().task(), Some("ps:1"));
}

#[test]
fn an_embedded_loop_says_the_same() {
    let dead = closed_port();
    let ps1 = cluster_with_ps1_at(dead).resolve("ps:1").unwrap();
    let cfg = config("worker", 1)
        .connect_retries(1)
        .connect_backoff(Duration::from_millis(1))
        .build()
        .unwrap();
    let mut e = Embedded::new(cfg, None).unwrap();
    let t = e.ping(ps1, 0, None).unwrap();
    let err = e.wait(t).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectFailed);
    assert_eq!(
        err.os_error().map(|o| o.kind()),
        Some(IoKind::ConnectionRefused)
    );
    assert_eq!(
        (err.task(), err.connect_attempts()),
        (Some("ps:1"), Some(2))
    );
    assert!(err
        .to_string()
        .starts_with(&format!("could not connect to ps:1 ({dead})")));
}

#[test]
fn a_deadline_while_retrying_is_a_timeout_that_names_the_refusal() {
    let dead = closed_port();
    let ps1 = cluster_with_ps1_at(dead).resolve("ps:1").unwrap();
    // The first attempt is refused, and the next waits 60 s: any later request with a
    // deadline meets the connection while it is being retried.
    let rt = worker(1_000, Duration::from_secs(60));
    let mut h = rt.handle(8);
    let first = h.ping(ps1, 0, None).unwrap();
    let start = Instant::now();
    while rt.stats().reconnects == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no attempt failed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let t = h
        .ping(ps1, 0, Some(Instant::now() + Duration::from_millis(50)))
        .unwrap();
    let e = h.wait(t).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert_eq!(
        e.os_error().map(|o| o.kind()),
        Some(IoKind::ConnectionRefused)
    );
    assert_eq!(e.connect_attempts(), Some(1));
    assert_eq!(
        e.to_string(),
        format!(
            "deadline exceeded while connecting to ps:1 ({dead}): connection refused (attempt 1)"
        )
    );
    // The request with no deadline is still waiting for the connection.
    assert_eq!(h.outstanding(), 1);
    drop(first);
}

const CHILD_ENV: &str = "STARWIRE_TEST_CONNECT_ERRORS_CHILD";

/// The child's entry point, not a test of its own: task ps:1 listening, printing its
/// address, until it is killed. Started by the test below with `--ignored`.
#[test]
#[ignore = "entry point of the child server process"]
fn child_ps1() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let cfg = starwire::ConfigBuilder::from_env("ps", 1)
        .unwrap()
        .loops(1)
        .build()
        .unwrap();
    let rt = Runtime::start(cfg, Some("127.0.0.1:0".parse().unwrap())).unwrap();
    println!("LISTENING {}", rt.local_addr().unwrap());
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn spawn_ps1() -> (Child, SocketAddr) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_ps1",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the child server");
    let out = child.stdout.take().unwrap();
    for line in BufReader::new(out).lines() {
        if let Some((_, a)) = line.unwrap().split_once("LISTENING ") {
            return (child, a.trim().parse().unwrap());
        }
    }
    child.kill().ok();
    child.wait().ok();
    panic!("the child server printed no address");
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    assert_eq!(rc, 0);
}

/// Waits until every thread of `child` has stopped: kill(2) only queues the SIGSTOP, and a
/// loop thread running on another core answers what reaches it until it takes the signal.
fn stopped(child: &Child) {
    let mut status = 0;
    // SAFETY: waitpid(2) on our own child's pid with a valid status pointer; WUNTRACED
    // reports the group stop, which the kernel signals once the last thread has stopped.
    let rc = unsafe { libc::waitpid(child.id() as libc::pid_t, &mut status, libc::WUNTRACED) };
    assert_eq!(rc, child.id() as libc::pid_t);
    assert!(
        libc::WIFSTOPPED(status),
        "the child did not stop: {status:#x}"
    );
}

/// Kills the child server when the test ends, however it ends.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

/// Bytes of pings the worker has queued on its connections to `addr`.
fn ping_bytes_out(rt: &Runtime, addr: SocketAddr) -> u64 {
    let m = rt.metrics();
    m.client(addr)
        .map_or(0, |p| p.op(starwire::stats::RequestKind::Ping).bytes_out)
}

#[test]
fn a_peer_killed_mid_connection_is_named_by_the_task_its_handshake_gave() {
    let (child, addr) = spawn_ps1();
    let mut child = Reaped(child);
    let rt = worker(0, Duration::from_millis(1));
    let mut h = rt.handle(8);
    // Addressed by address only: the handshake names it ps:1.
    let t = h.ping(Peer::new(addr), 0, secs(30)).unwrap();
    h.wait(t).unwrap();
    // Stopped, so that the next ping stays unanswered; then killed.
    signal(&child.0, libc::SIGSTOP);
    stopped(&child.0);
    let before = ping_bytes_out(&rt, addr);
    let t = h.ping(addr, 64, secs(30)).unwrap();
    let start = Instant::now();
    // On the connection before the kill, so that it fails as lost, not as a connect that
    // failed.
    while ping_bytes_out(&rt, addr) == before {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the ping was not sent"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    signal(&child.0, libc::SIGKILL);
    child.0.wait().unwrap();
    let e = h.wait(t).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionLost);
    assert_eq!((e.peer(), e.task()), (Some(addr), Some("ps:1")));
    let text = e.to_string();
    assert!(
        text.starts_with(&format!("connection to ps:1 ({addr}) lost")),
        "{text}"
    );
    // The next request finds nothing listening, and says so, still naming ps:1.
    let t = h.ping(addr, 0, secs(30)).unwrap();
    let e = h.wait(t).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectFailed);
    assert_eq!(e.task(), Some("ps:1"));
    assert_eq!(
        e.os_error().map(|o| o.kind()),
        Some(IoKind::ConnectionRefused)
    );
}
