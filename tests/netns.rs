//! Several hosts on one machine: network namespaces joined by veth pairs, a starwire server
//! in one and clients in others, each a process of its own (this test binary again, run
//! with `ip netns exec`). The link to one client is cut and restored: its requests fail by
//! their deadline while it is down and succeed again once it is back, and the other client
//! never notices. With `tc netem` (when the kernel has it), delay and loss on a link.
//!
//! Needs root and iproute2 (`ip`, `tc`); each test prints why it is skipped otherwise.
//! Namespace names carry the process id, and a guard deletes them even when a test fails.

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const SERVER_ENV: &str = "STARWIRE_TEST_NETNS_SERVER";
const CLIENT_ENV: &str = "STARWIRE_TEST_NETNS_CLIENT";
const SILENT_CLIENT_ENV: &str = "STARWIRE_TEST_NETNS_SILENT_CLIENT";
/// Heartbeat of the client without deadlines: probe after 200 ms of silence, lost after 1 s.
const BEAT: Duration = Duration::from_millis(200);
const SILENCE: Duration = Duration::from_secs(1);
/// Deadline of each of the clients' pings.
const DEADLINE: Duration = Duration::from_millis(500);

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Namespaces (and, with them, their veth ends), deleted on drop.
struct Hosts {
    names: Vec<String>,
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = ip(&["netns", "del", n]);
        }
    }
}

/// Why these tests cannot run here, if they cannot.
fn unavailable(tag: &str) -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("`ip` (iproute2) is not installed".into());
    }
    let probe = format!("sw{}{tag}probe", std::process::id());
    if let Err(e) = ip(&["netns", "add", &probe]) {
        return Some(format!("cannot create a network namespace: {e}"));
    }
    let _ = ip(&["netns", "del", &probe]);
    None
}

/// A server host `s` and client hosts `c1..=cN`, each client joined to the server by a
/// veth pair on its own /24: client i is 10.77.i.2, the server 10.77.i.1 on that link.
fn hosts(tag: &str, clients: usize) -> Result<Hosts, String> {
    let pid = std::process::id();
    let server = format!("sw{pid}{tag}s");
    let mut h = Hosts {
        names: vec![server.clone()],
    };
    ip(&["netns", "add", &server])?;
    ip(&["-n", &server, "link", "set", "lo", "up"])?;
    for i in 1..=clients {
        let ns = format!("sw{pid}{tag}c{i}");
        ip(&["netns", "add", &ns])?;
        h.names.push(ns.clone());
        let (a, b) = (format!("sw{pid}{tag}s{i}"), format!("sw{pid}{tag}c{i}"));
        ip(&["link", "add", &a, "type", "veth", "peer", "name", &b])?;
        ip(&["link", "set", &a, "netns", &server])?;
        ip(&["link", "set", &b, "netns", &ns])?;
        ip(&[
            "-n",
            &server,
            "addr",
            "add",
            &format!("10.77.{i}.1/24"),
            "dev",
            &a,
        ])?;
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("10.77.{i}.2/24"),
            "dev",
            &b,
        ])?;
        ip(&["-n", &server, "link", "set", &a, "up"])?;
        ip(&["-n", &ns, "link", "set", &b, "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
    }
    Ok(h)
}

/// The hosts of a test, or `None` (with the reason printed) where they cannot be made.
fn hosts_or_skip(tag: &str, clients: usize) -> Option<Hosts> {
    if let Some(why) = unavailable(tag) {
        eprintln!("skipped: {why}");
        return None;
    }
    Some(hosts(tag, clients).expect("namespaces"))
}

/// The server end of client `i`'s link.
fn server_link(h: &Hosts, i: usize) -> (String, String) {
    (h.names[0].clone(), format!("{}{i}", h.names[0]))
}

/// Runs this test binary's `child` test in namespace `ns` with `env`.
fn spawn_in(ns: &str, child: &str, env: (&str, String)) -> Child {
    Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            child,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(env.0, env.1)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn a host process")
}

/// Kills the host processes on drop.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Child: a server listening on all of its namespace's addresses.
#[test]
#[ignore = "entry point of a host process"]
fn netns_server() {
    let Ok(port) = std::env::var(SERVER_ENV) else {
        return;
    };
    let rt = starwire::Runtime::start(
        config("ps", 1).build().unwrap(),
        Some(format!("0.0.0.0:{port}").parse().unwrap()),
    )
    .unwrap();
    println!("LISTENING {}", rt.local_addr().unwrap());
    std::thread::sleep(Duration::from_secs(60));
}

/// Child: pings the server every 50 ms with a 500 ms deadline and prints each outcome:
/// `OK <rtt µs>` or `ERR <error> <ms from submit to failure>`.
#[test]
#[ignore = "entry point of a host process"]
fn netns_client() {
    let Ok(server) = std::env::var(CLIENT_ENV) else {
        return;
    };
    let server: SocketAddr = server.parse().unwrap();
    let rt = client(1);
    let mut h = rt.handle(4);
    loop {
        let t0 = Instant::now();
        let tag = h.ping(server, 64, Some(t0 + DEADLINE)).unwrap();
        match h.wait(tag) {
            Ok(rtt) => println!("OK {}", rtt.as_micros()),
            Err(e) => println!("ERR {:?} {}", e.kind(), t0.elapsed().as_millis()),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Child: like `netns_client`, but its pings have no deadline: only the heartbeat
/// (`BEAT`, `SILENCE`) can end one that is never answered.
#[test]
#[ignore = "entry point of a host process"]
fn netns_silent_client() {
    let Ok(server) = std::env::var(SILENT_CLIENT_ENV) else {
        return;
    };
    let server: SocketAddr = server.parse().unwrap();
    let cfg = config("worker", 1)
        .heartbeat_interval(BEAT)
        .heartbeat_timeout(SILENCE)
        .connect_retries(0)
        .build()
        .unwrap();
    let rt = starwire::Runtime::start(cfg, None).unwrap();
    let mut h = rt.handle(4);
    loop {
        let t0 = Instant::now();
        let tag = h.ping(server, 64, None).unwrap();
        match h.wait(tag) {
            Ok(rtt) => println!("OK {}", rtt.as_micros()),
            Err(e) => println!("ERR {:?} {}", e.kind(), t0.elapsed().as_millis()),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One line a client printed, with when the parent read it.
struct Outcome {
    at: Instant,
    ok: bool,
    /// Round trip (ok) or time to failure (error), in ms.
    ms: f64,
    text: String,
}

/// Collects a client's lines on a channel.
fn outcomes(child: &mut Child) -> mpsc::Receiver<Outcome> {
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let at = Instant::now();
            let words: Vec<&str> = line.split_whitespace().collect();
            let o = match words.as_slice() {
                ["OK", us] => Outcome {
                    at,
                    ok: true,
                    ms: us.parse::<f64>().unwrap_or(0.0) / 1000.0,
                    text: line.clone(),
                },
                ["ERR", _, ms] => Outcome {
                    at,
                    ok: false,
                    ms: ms.parse().unwrap_or(f64::MAX),
                    text: line.clone(),
                },
                _ => continue, // the test harness's own lines
            };
            if tx.send(o).is_err() {
                return;
            }
        }
    });
    rx
}

fn start_server(h: &Hosts) -> (Child, u16) {
    let mut server = spawn_in(&h.names[0], "netns_server", (SERVER_ENV, "0".into()));
    let out = server.stdout.take().unwrap();
    let port = BufReader::new(out)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| {
            l.split_once("LISTENING ")
                .map(|(_, a)| a.trim().parse::<SocketAddr>().unwrap().port())
        })
        .expect("server address");
    (server, port)
}

fn drain(rx: &mpsc::Receiver<Outcome>, until: Instant) -> Vec<Outcome> {
    let mut v = Vec::new();
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        if let Ok(o) = rx.recv_timeout(left) {
            v.push(o);
        }
    }
    v
}

/// Whether a client process got five pings through: waits for them however long its
/// start takes on a loaded machine (up to 30 s), then stops taking outcomes.
fn warmed_up(rx: &mpsc::Receiver<Outcome>) -> bool {
    let until = Instant::now() + Duration::from_secs(30);
    let mut ok = 0;
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(o) if o.ok => ok += 1,
            Ok(_) => {}
            Err(_) => break,
        }
        if ok == 5 {
            return true;
        }
    }
    false
}

#[test]
fn a_partitioned_client_fails_by_deadline_and_recovers_while_another_is_untouched() {
    let Some(h) = hosts_or_skip("p", 2) else {
        return;
    };
    let (server, port) = start_server(&h);
    let mut procs = Procs(vec![server]);
    let mut c1 = spawn_in(
        &h.names[1],
        "netns_client",
        (CLIENT_ENV, format!("10.77.1.1:{port}")),
    );
    let mut c2 = spawn_in(
        &h.names[2],
        "netns_client",
        (CLIENT_ENV, format!("10.77.2.1:{port}")),
    );
    let (rx1, rx2) = (outcomes(&mut c1), outcomes(&mut c2));
    procs.0.push(c1);
    procs.0.push(c2);

    // Both reach the server.
    assert!(warmed_up(&rx1), "client 1 never got through");

    // Cut client 1's link for 2.5 s.
    let (ns, link) = server_link(&h, 1);
    ip(&["-n", &ns, "link", "set", &link, "down"]).unwrap();
    let cut = Instant::now();
    let during = drain(&rx1, cut + Duration::from_millis(2500));
    ip(&["-n", &ns, "link", "set", &link, "up"]).unwrap();
    let restored = Instant::now();
    let after = drain(&rx1, restored + Duration::from_secs(5));
    let other: Vec<Outcome> = rx2.try_iter().collect();

    // While cut (after the first deadline has passed), every ping fails, each by its
    // deadline: not earlier than it, and not much later.
    let settled: Vec<&Outcome> = during
        .iter()
        .filter(|o| o.at > cut + DEADLINE + Duration::from_millis(100))
        .collect();
    assert!(settled.len() >= 2, "too few outcomes while cut");
    for o in &settled {
        assert!(!o.ok, "a ping got through a cut link: {}", o.text);
        // By its deadline: a timeout, not before the deadline (no upper bound on the wall
        // clock: a loaded machine may be late).
        assert!(
            o.text.contains("Timeout") && o.ms >= DEADLINE.as_millis() as f64 - 1.0,
            "failed after {} ms, the deadline is {DEADLINE:?}: {}",
            o.ms,
            o.text
        );
    }
    // Once the link is back, pings succeed again.
    let first_ok = after.iter().find(|o| o.ok).map(|o| o.at - restored);
    let recovered = first_ok.expect("no ping succeeded within 5 s of the link returning");
    let tail = &after[after.len().saturating_sub(5)..];
    assert!(
        tail.iter().all(|o| o.ok),
        "not recovered: {:?}",
        tail.iter().map(|o| &o.text).collect::<Vec<_>>()
    );
    // The other client never failed.
    let failures: Vec<&String> = other.iter().filter(|o| !o.ok).map(|o| &o.text).collect();
    assert!(
        other.len() > 40 && failures.is_empty(),
        "client 2: {failures:?}"
    );
    eprintln!(
        "cut: {} pings failed by deadline ({:.0}-{:.0} ms); first success {recovered:?} after \
         the link returned; the other client: {} pings, 0 failed",
        settled.len(),
        settled.iter().map(|o| o.ms).fold(f64::MAX, f64::min),
        settled.iter().map(|o| o.ms).fold(0.0, f64::max),
        other.len()
    );
}

#[test]
fn a_link_cut_without_a_reset_is_found_by_the_heartbeat() {
    let Some(h) = hosts_or_skip("h", 1) else {
        return;
    };
    let (server, port) = start_server(&h);
    let mut procs = Procs(vec![server]);
    let mut c = spawn_in(
        &h.names[1],
        "netns_silent_client",
        (SILENT_CLIENT_ENV, format!("10.77.1.1:{port}")),
    );
    let rx = outcomes(&mut c);
    procs.0.push(c);
    assert!(warmed_up(&rx), "never got through");
    // The link goes down: no reset, no FIN, the ping in flight is simply never answered.
    let (ns, link) = server_link(&h, 1);
    ip(&["-n", &ns, "link", "set", &link, "down"]).unwrap();
    let cut = Instant::now();
    let during = drain(&rx, cut + Duration::from_secs(4));
    ip(&["-n", &ns, "link", "set", &link, "up"]).unwrap();
    let restored = Instant::now();
    let after = drain(&rx, restored + Duration::from_secs(8));
    // The first failure is the heartbeat's, about `SILENCE` after the last answer; pings
    // submitted while cut may first finish, the one in flight cannot.
    let first = during
        .iter()
        .find(|o| !o.ok)
        .expect("a ping without deadline waited through a cut link");
    assert!(
        first.text.contains("ConnectionLost"),
        "the first failure: {}",
        first.text
    );
    let found_after = first.at - cut;
    assert!(
        found_after >= SILENCE - BEAT && found_after < Duration::from_secs(4),
        "found after {found_after:?}"
    );
    let first_ok = after.iter().find(|o| o.ok).map(|o| o.at - restored);
    let recovered = first_ok.expect("no ping succeeded within 8 s of the link returning");
    eprintln!(
        "heartbeat: a link cut without a reset found after {found_after:?} (silence limit \
         {SILENCE:?}, probes every {BEAT:?}): {}; first success {recovered:?} after the \
         link returned",
        first.text
    );
}

#[test]
fn delay_and_loss_on_a_link() {
    let Some(h) = hosts_or_skip("d", 1) else {
        return;
    };
    let (ns, link) = server_link(&h, 1);
    let netem = Command::new("ip")
        .args([
            "netns", "exec", &ns, "tc", "qdisc", "add", "dev", &link, "root", "netem",
        ])
        .args(["delay", "20ms", "loss", "2%"])
        .output();
    match netem {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            let why = String::from_utf8_lossy(&o.stderr);
            eprintln!("skipped: tc netem is not available here ({})", why.trim());
            return;
        }
        Err(e) => {
            eprintln!("skipped: tc (iproute2) is not installed ({e})");
            return;
        }
    }
    let (server, port) = start_server(&h);
    let mut procs = Procs(vec![server]);
    let mut c1 = spawn_in(
        &h.names[1],
        "netns_client",
        (CLIENT_ENV, format!("10.77.1.1:{port}")),
    );
    let rx = outcomes(&mut c1);
    procs.0.push(c1);
    let seen = drain(&rx, Instant::now() + Duration::from_secs(4));
    let ok: Vec<f64> = seen.iter().filter(|o| o.ok).map(|o| o.ms).collect();
    // 20 ms one way on the server's side of the link: every round trip is at least that.
    assert!(ok.len() >= 20, "too few pings got through: {}", ok.len());
    assert!(
        ok.iter().all(|&ms| ms >= 19.0),
        "a round trip under the delay: {ok:?}"
    );
    eprintln!(
        "{} pings, {} failed; rtt min {:.1} ms",
        seen.len(),
        seen.len() - ok.len(),
        ok.iter().cloned().fold(f64::MAX, f64::min)
    );
}
