//! A server in another process, stopped and killed with requests in flight.

mod common;

use common::*;
use starwire::Error;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
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
            start.elapsed() < Duration::from_secs(5),
            "child did not stop"
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
    let tags: Vec<u64> = (0..20)
        .map(|_| h.ping(addr, 64, secs(30)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let killed = Instant::now();
    signal(&child, libc::SIGKILL);
    child.wait().unwrap();
    for t in tags {
        assert_eq!(h.wait(t).result, Err(Error::ConnectionLost));
    }
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(2), "failing took {took:?}");

    // A server restarted on the same address is reconnected to.
    let (mut again, addr2) = spawn_server(&addr.to_string());
    assert_eq!(addr2, addr);
    let start = Instant::now();
    while ping_once(&client, addr, secs(10)).is_err() {
        assert!(start.elapsed() < Duration::from_secs(5), "no reconnect");
        std::thread::sleep(Duration::from_millis(20));
    }
    again.kill().ok();
    again.wait().ok();
}
