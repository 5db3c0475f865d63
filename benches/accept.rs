//! Connection churn: how fast a starwire server takes new connections, and its CPU per
//! connection, with io_uring direct accept (each accepted socket only in the ring's file
//! table), io_uring accepting into descriptors, and epoll.
//!
//! `cargo bench --bench accept` (about a minute on two cores). The server runs in a child
//! process (this binary re-executed with `--server ...`) restricted to one CPU, with one
//! loop; the client runs on another CPU and, per connection: connects, sends `HELLO` and a
//! `PING`, reads `HELLO_ACK` and `PONG`, and closes. Two workloads:
//! - `serial`: one connection at a time;
//! - `burst`: 64 connections opened at once, each then used and all closed.
//!
//! The configurations take turns within each round; the table gives, per configuration,
//! the median connection rate and server CPU per connection over the rounds, and the
//! median of the per-round ratios to io_uring with descriptors.
//!
//! Options: `--rounds N` (default 7), `--secs F` per window (default 1.0).

#[path = "common/mod.rs"]
mod common;

use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use starwire::Runtime;

/// One server configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Conf {
    backend: Backend,
    direct: bool,
}

impl Conf {
    fn name(self) -> &'static str {
        match (self.backend, self.direct) {
            (Backend::Uring, true) => "io_uring, direct accept",
            (Backend::Uring, false) => "io_uring, descriptors",
            (Backend::Epoll, _) => "epoll",
        }
    }
}

const CONFS: [Conf; 3] = [
    Conf {
        backend: Backend::Uring,
        direct: false,
    },
    Conf {
        backend: Backend::Uring,
        direct: true,
    },
    Conf {
        backend: Backend::Epoll,
        direct: false,
    },
];

const BURST: usize = 64;

// ----- wire: the frames a client sends (docs/wire-format.md) -----

#[path = "../tests/common/frames.rs"]
mod frames;

use frames::{frame, hello, HEADER, HELLO_ACK, PING, PONG};

/// `HELLO` of a worker with the default limits, then a `PING` of 8 bytes.
fn opening() -> Vec<u8> {
    let mut out = hello(0, b"");
    out.extend(frame(PING, 0, 0, 7, &[], b"churn..."));
    out
}

/// Reads one frame; its kind.
fn read_frame(s: &mut TcpStream, buf: &mut Vec<u8>) -> u8 {
    buf.resize(HEADER, 0);
    s.read_exact(buf).expect("frame header");
    let meta = u32::from_le_bytes(buf[24..28].try_into().unwrap()) as usize;
    let payload = u32::from_le_bytes(buf[28..32].try_into().unwrap()) as usize;
    let kind = buf[5];
    buf.resize(HEADER + meta + payload, 0);
    s.read_exact(&mut buf[HEADER..]).expect("frame body");
    kind
}

fn open(addr: SocketAddr, hello: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_nodelay(true).unwrap();
    s.write_all(hello).expect("hello");
    s
}

fn finish(mut s: TcpStream, buf: &mut Vec<u8>) {
    assert_eq!(read_frame(&mut s, buf), HELLO_ACK);
    assert_eq!(read_frame(&mut s, buf), PONG);
    drop(s);
}

/// Connections made in `window`, `burst` at a time.
fn churn(addr: SocketAddr, burst: usize, window: Duration) -> u64 {
    let hello = opening();
    let mut buf = Vec::new();
    let mut open_now = Vec::with_capacity(burst);
    let end = Instant::now() + window;
    let mut n = 0;
    while Instant::now() < end {
        open_now.extend((0..burst).map(|_| open(addr, &hello)));
        for s in open_now.drain(..) {
            finish(s, &mut buf);
        }
        n += burst as u64;
    }
    n
}

// ----- server child process -----

impl Server {
    /// The server's CPU time so far and the features its loop uses.
    fn stats(&mut self) -> (Duration, String) {
        writeln!(self.stdin, "S").expect("ask server");
        self.stdin.flush().ok();
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("server stats");
        let (ns, features) = line.trim().split_once(' ').expect("ns features");
        (
            Duration::from_nanos(ns.parse().expect("ns")),
            features.to_string(),
        )
    }
}

fn server_main(args: &[String]) {
    let cpu: usize = args[0].parse().expect("server cpu");
    restrict_to(cpu);
    let cfg = SwCfg {
        backend: Backend::parse(&args[1]),
        polling: false,
        spin: Duration::from_micros(50),
    };
    let config = cfg
        .builder("ps")
        .uring_direct_accept(args[2] == "on")
        .build()
        .expect("config");
    let rt = Runtime::start(config, Some("127.0.0.1:0".parse().unwrap())).expect("server");
    let features = rt.report().features().to_string();
    let mut out = std::io::stdout();
    writeln!(out, "ADDR {}", rt.local_addr().unwrap()).unwrap();
    out.flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        if line.is_err() {
            break;
        }
        let ns = process_cpu_time().as_nanos();
        writeln!(out, "{ns} {features}").unwrap();
        out.flush().unwrap();
    }
    rt.shutdown();
}

// ----- main -----

fn main() {
    let args = bench_args();
    if args.first().map(String::as_str) == Some("--server") {
        return server_main(&args[1..]);
    }
    let mut rounds = 7;
    let mut window = Duration::from_secs(1);
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--rounds" => rounds = args[i + 1].parse().expect("--rounds N"),
            "--secs" => window = Duration::from_secs_f64(args[i + 1].parse().expect("--secs F")),
            other => panic!("unknown option {other:?} (--rounds N, --secs F)"),
        }
        i += 2;
    }
    let allowed = allowed_cpus();
    assert!(allowed.len() >= 2, "needs two CPUs, has {allowed:?}");
    let (server_cpu, client_cpu) = (allowed[0], allowed[1]);
    println!("load average at start: {}", loadavg());
    restrict_to(client_cpu);

    let mut servers: Vec<Server> = (CONFS.iter())
        .map(|c| {
            let args = [c.backend.name().to_string(), on_off(c.direct).to_string()];
            Server::spawn(server_cpu, &args)
        })
        .collect();
    for (c, s) in CONFS.iter().zip(servers.iter_mut()) {
        let (_, features) = s.stats();
        println!("{}: {features}", c.name());
        if c.backend == Backend::Uring {
            assert_eq!(features.contains("direct accept"), c.direct, "{features}");
        }
    }
    for (workload, burst) in [("serial", 1), ("burst", BURST)] {
        // [conf][round]: (connections per second, server CPU per connection in µs)
        let mut got = vec![Vec::new(); CONFS.len()];
        for _ in 0..3 {
            for s in &servers {
                churn(s.addr, burst, Duration::from_millis(100)); // warm-up
            }
        }
        for round in 0..rounds {
            for k in 0..CONFS.len() {
                // Alternate the order per round.
                let k = if round % 2 == 0 {
                    k
                } else {
                    CONFS.len() - 1 - k
                };
                let s = &mut servers[k];
                let (cpu0, _) = s.stats();
                let start = Instant::now();
                let n = churn(s.addr, burst, window);
                let secs = start.elapsed().as_secs_f64();
                let (cpu1, _) = s.stats();
                let cpu_us = (cpu1 - cpu0).as_secs_f64() * 1e6 / n as f64;
                got[k].push((n as f64 / secs, cpu_us));
            }
        }
        println!();
        println!("workload {workload} ({burst} at a time), {rounds} rounds of {window:?}:");
        println!();
        println!("| server | connections/s | server CPU per connection | rate / descriptors | CPU / descriptors |");
        println!("|---|---:|---:|---:|---:|");
        for (k, c) in CONFS.iter().enumerate() {
            let rate = median(got[k].iter().map(|g| g.0).collect());
            let cpu = median(got[k].iter().map(|g| g.1).collect());
            let rate_ratio = median((0..rounds).map(|r| got[k][r].0 / got[0][r].0).collect());
            let cpu_ratio = median((0..rounds).map(|r| got[k][r].1 / got[0][r].1).collect());
            println!(
                "| {} | {:.0} | {:.1} µs | {:.3}x | {:.3}x |",
                c.name(),
                rate,
                cpu,
                rate_ratio,
                cpu_ratio
            );
        }
    }
    println!();
    println!("load average at end: {}", loadavg());
    for s in servers {
        s.stop();
    }
}
