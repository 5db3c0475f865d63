//! Ping-pong latency and pipelined ping throughput of starwire beside a raw blocking-socket
//! ping-pong measured in the same run, plus idle CPU and the spin-budget sweep.
//!
//! `cargo bench --bench ping` runs the default set (two to six minutes on two cores: the
//! Runtime+Handle spin sweep is the slow part) and prints markdown tables. Subsets:
//! `cargo bench --bench ping -- --help`.
//!
//! Placement: the bench needs two CPUs. The client (this process) restricts itself to the
//! first allowed CPU with `sched_setaffinity` before it starts any thread; every server is a
//! child process (this binary re-executed with `--server ...`) that restricts itself to the
//! second allowed CPU before it starts its runtime. Threads inherit the set, so each side's
//! loop (started with `pin(true)`, one loop) is pinned to its side's CPU.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use starwire::{Completion, Embedded, Handle, Reply, Runtime, Stats};

mod common;
use common::*;

/// Size of the header of the raw baseline's messages (the same as a starwire frame header).
const RAW_HEADER: usize = 32;
/// Round trips before the latency is recorded.
const WARMUP: usize = 2_000;

// ----- options -----

#[derive(Clone, Debug)]
struct Opts {
    runs: usize,
    rtts: usize,
    window: Duration,
    sections: Vec<String>,
    backends: Vec<Backend>,
    quick: bool,
    /// Also the configurations left out by default for time: Embedded in the spin sweep.
    all: bool,
}

const DEFAULT_SECTIONS: &[&str] = &["idle", "main", "spin"];

const HELP: &str = "\
ping bench: starwire ping-pong vs a raw blocking socket

  cargo bench --bench ping [-- OPTIONS]

OPTIONS
  --quick             1 run, 5000 round trips, 0.3 s windows, idle 1 s
  --runs N            runs per configuration (default 5)
  --rtts N            round trips per latency measurement (default 20000)
  --secs F            length of each throughput window in seconds (default 0.5)
  --sections LIST     comma list of idle,main,spin,big,regbuf (default
                      idle,main,spin; big = latency with a 4 KiB payload; regbuf =
                      64 B pings with the receive-buffer pool off and on)
  --backends LIST     comma list of uring,epoll (default both)
  --all               also the Embedded client in the spin sweep
  --one VARIANT BACKEND POLLING INFLIGHT COUNT
                      one measurement, for strace/perf: VARIANT raw|handle|embedded,
                      POLLING on|off, prints the elapsed time
";

fn parse_opts(args: &[String]) -> Opts {
    let mut o = Opts {
        runs: 5,
        rtts: 20_000,
        window: Duration::from_millis(500),
        sections: DEFAULT_SECTIONS.iter().map(|s| s.to_string()).collect(),
        backends: vec![Backend::Uring, Backend::Epoll],
        quick: false,
        all: false,
    };
    let mut i = 0;
    let value = |i: usize| -> &str {
        args.get(i + 1)
            .unwrap_or_else(|| panic!("{} needs a value", args[i]))
    };
    while i < args.len() {
        match args[i].as_str() {
            "--quick" => {
                o.quick = true;
                o.runs = 1;
                o.rtts = 5_000;
                o.window = Duration::from_millis(300);
            }
            "--runs" => {
                o.runs = value(i).parse().expect("--runs N");
                i += 1;
            }
            "--rtts" => {
                o.rtts = value(i).parse().expect("--rtts N");
                i += 1;
            }
            "--secs" => {
                o.window = Duration::from_secs_f64(value(i).parse().expect("--secs F"));
                i += 1;
            }
            "--sections" => {
                o.sections = value(i).split(',').map(str::to_string).collect();
                i += 1;
            }
            "--backends" => {
                o.backends = value(i).split(',').map(Backend::parse).collect();
                i += 1;
            }
            "--all" => o.all = true,
            "--help" | "-h" => {
                print!("{HELP}");
                std::process::exit(0);
            }
            other => panic!("unknown option {other:?}\n{HELP}"),
        }
        i += 1;
    }
    o
}

// ----- server child process -----

impl Server {
    fn raw(cpu: usize) -> Server {
        Server::spawn(cpu, &["raw".into()])
    }

    fn starwire(cpu: usize, cfg: SwCfg) -> Server {
        let mut kind = vec!["sw".to_string()];
        kind.extend(cfg.args());
        Server::spawn(cpu, &kind)
    }

    fn stats(&mut self) -> Counters {
        writeln!(self.stdin, "S").expect("ask server stats");
        self.stdin.flush().ok();
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("server stats");
        Counters::parse(&line)
    }
}

fn server_main(args: &[String]) {
    let cpu: usize = args[0].parse().expect("server cpu");
    restrict_to(cpu);
    let mut out = std::io::stdout();
    let stdin = std::io::stdin();
    match args[1].as_str() {
        "raw" => {
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
            writeln!(out, "ADDR {}", listener.local_addr().unwrap()).unwrap();
            out.flush().unwrap();
            std::thread::spawn(move || {
                for s in listener.incoming() {
                    let Ok(s) = s else { continue };
                    std::thread::spawn(move || raw_echo(s));
                }
            });
            for line in stdin.lock().lines() {
                if line.is_err() {
                    break;
                }
                let c = Counters {
                    cpu_ns: process_cpu_time().as_nanos() as u64,
                    ..Counters::default()
                };
                writeln!(out, "{}", c.line()).unwrap();
                out.flush().unwrap();
            }
        }
        "sw" => {
            let cfg = SwCfg::from_args(&args[2..]);
            let rt = Runtime::start(cfg.config("ps"), Some("127.0.0.1:0".parse().unwrap()))
                .expect("server runtime");
            writeln!(out, "ADDR {}", rt.local_addr().unwrap()).unwrap();
            out.flush().unwrap();
            for line in stdin.lock().lines() {
                if line.is_err() {
                    break;
                }
                writeln!(out, "{}", Counters::from(&rt.stats()).line()).unwrap();
                out.flush().unwrap();
            }
            rt.shutdown();
        }
        other => panic!("server kind {other:?}"),
    }
}

/// The raw blocking echo: read a 32-byte header (payload length in its first 4 bytes) and
/// the payload, write both back.
fn raw_echo(s: TcpStream) {
    s.set_nodelay(true).ok();
    let mut w = s.try_clone().expect("clone");
    let mut r = BufReader::with_capacity(1 << 16, s);
    let mut buf = vec![0u8; RAW_HEADER + (1 << 20)];
    loop {
        if r.read_exact(&mut buf[..RAW_HEADER]).is_err() {
            return;
        }
        let len = u32::from_le_bytes(buf[..4].try_into().unwrap()) as usize;
        if r.read_exact(&mut buf[RAW_HEADER..RAW_HEADER + len])
            .is_err()
        {
            return;
        }
        if w.write_all(&buf[..RAW_HEADER + len]).is_err() {
            return;
        }
    }
}

// ----- loop counters, carried across the process boundary -----

#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    busy_ns: u64,
    spin_ns: u64,
    parked_ns: u64,
    parks: u64,
    frames_in: u64,
    /// CPU time of the whole process (user + system).
    cpu_ns: u64,
}

impl From<&Stats> for Counters {
    fn from(s: &Stats) -> Counters {
        Counters {
            busy_ns: s.busy.as_nanos() as u64,
            spin_ns: s.spin.as_nanos() as u64,
            parked_ns: s.parked.as_nanos() as u64,
            parks: s.parks,
            frames_in: s.frames_in,
            cpu_ns: process_cpu_time().as_nanos() as u64,
        }
    }
}

impl Counters {
    fn line(&self) -> String {
        format!(
            "{} {} {} {} {} {}",
            self.busy_ns, self.spin_ns, self.parked_ns, self.parks, self.frames_in, self.cpu_ns
        )
    }
    fn parse(line: &str) -> Counters {
        let v: Vec<u64> = line
            .split_whitespace()
            .map(|x| x.parse().expect("counter"))
            .collect();
        Counters {
            busy_ns: v[0],
            spin_ns: v[1],
            parked_ns: v[2],
            parks: v[3],
            frames_in: v[4],
            cpu_ns: v[5],
        }
    }
    fn since(&self, before: &Counters) -> Counters {
        Counters {
            busy_ns: self.busy_ns - before.busy_ns,
            spin_ns: self.spin_ns - before.spin_ns,
            parked_ns: self.parked_ns - before.parked_ns,
            parks: self.parks - before.parks,
            frames_in: self.frames_in - before.frames_in,
            cpu_ns: self.cpu_ns - before.cpu_ns,
        }
    }
}

// ----- clients -----

/// How the client side talks to the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    /// Two blocking `TcpStream` halves, TCP_NODELAY.
    Raw,
    /// `Runtime` (one loop thread) plus a `Handle` on the caller's thread.
    Handle,
    /// `Embedded`: the caller's thread drives the loop.
    Embedded,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Raw => "raw blocking",
            Variant::Handle => "Runtime+Handle",
            Variant::Embedded => "Embedded",
        }
    }
}

trait Pinger {
    /// One round trip of `payload` bytes.
    fn round_trip(&mut self, payload: u32);
    /// Keeps `inflight` requests outstanding for `window`; returns the round trips
    /// completed in it.
    fn pipelined(&mut self, payload: u32, inflight: usize, window: Duration) -> u64;
    /// The client loop's counters, when it has a loop thread that accounts them.
    fn counters(&self) -> Option<Counters> {
        None
    }
}

struct RawClient {
    w: TcpStream,
    r: BufReader<TcpStream>,
    out: Vec<u8>,
    inn: Vec<u8>,
}

impl RawClient {
    fn connect(addr: SocketAddr) -> RawClient {
        let s = TcpStream::connect(addr).expect("raw connect");
        s.set_nodelay(true).unwrap();
        RawClient {
            w: s.try_clone().unwrap(),
            r: BufReader::with_capacity(1 << 16, s),
            out: Vec::new(),
            inn: Vec::new(),
        }
    }

    fn fill(&mut self, payload: u32, count: usize) {
        let one = RAW_HEADER + payload as usize;
        self.out.clear();
        for _ in 0..count {
            let at = self.out.len();
            self.out.resize(at + one, 0);
            self.out[at..at + 4].copy_from_slice(&payload.to_le_bytes());
        }
        self.inn.resize(one * count, 0);
    }
}

impl Pinger for RawClient {
    fn round_trip(&mut self, payload: u32) {
        if self.out.len() != RAW_HEADER + payload as usize {
            self.fill(payload, 1);
        }
        self.w.write_all(&self.out).unwrap();
        self.r.read_exact(&mut self.inn).unwrap();
    }

    fn pipelined(&mut self, payload: u32, inflight: usize, window: Duration) -> u64 {
        self.fill(payload, inflight);
        let end = Instant::now() + window;
        let mut done = 0;
        while Instant::now() < end {
            // Write the whole batch, then read the whole batch back.
            self.w.write_all(&self.out).unwrap();
            self.r.read_exact(&mut self.inn).unwrap();
            done += inflight as u64;
        }
        self.out.clear();
        done
    }
}

struct HandleClient {
    // Dropped before the runtime.
    h: Handle,
    rt: Runtime,
    peer: SocketAddr,
}

fn expect_pong(c: &Completion, payload: u32) {
    match c.result {
        Ok(Reply::Pong { payload: p, .. }) if p == payload => {}
        ref other => panic!("ping failed: {other:?}"),
    }
}

impl Pinger for HandleClient {
    fn round_trip(&mut self, payload: u32) {
        let t = self.h.ping(self.peer, payload, None).expect("submit");
        let c = self.h.wait_tag(t.tag()).expect("outstanding");
        expect_pong(&c, payload);
    }

    fn pipelined(&mut self, payload: u32, inflight: usize, window: Duration) -> u64 {
        for _ in 0..inflight {
            let _ticket = self.h.ping(self.peer, payload, None).expect("submit");
        }
        let end = Instant::now() + window;
        let mut done = 0;
        loop {
            let c = self.h.wait_any().expect("outstanding");
            expect_pong(&c, payload);
            if Instant::now() >= end {
                break;
            }
            done += 1;
            let _ticket = self.h.ping(self.peer, payload, None).expect("submit");
        }
        while self.h.outstanding() > 0 {
            expect_pong(&self.h.wait_any().expect("outstanding"), payload);
        }
        done
    }

    fn counters(&self) -> Option<Counters> {
        Some(Counters::from(&self.rt.stats()))
    }
}

/// `Embedded`: its waits drive the loop the way the loop thread drives itself (with
/// polling on, never blocking; with polling off, spinning for the spin budget, then
/// blocking in the kernel).
struct EmbeddedClient {
    e: Embedded,
    peer: SocketAddr,
}

impl EmbeddedClient {
    fn next(&mut self) -> Completion {
        self.e.wait_any().expect("a ping outstanding")
    }
}

impl Pinger for EmbeddedClient {
    fn round_trip(&mut self, payload: u32) {
        let _ticket = self.e.ping(self.peer, payload, None).expect("submit");
        let c = self.next();
        expect_pong(&c, payload);
    }

    fn pipelined(&mut self, payload: u32, inflight: usize, window: Duration) -> u64 {
        for _ in 0..inflight {
            let _ticket = self.e.ping(self.peer, payload, None).expect("submit");
        }
        let end = Instant::now() + window;
        let mut done = 0;
        let mut outstanding = inflight;
        loop {
            let c = self.next();
            expect_pong(&c, payload);
            outstanding -= 1;
            if Instant::now() >= end {
                break;
            }
            done += 1;
            let _ticket = self.e.ping(self.peer, payload, None).expect("submit");
            outstanding += 1;
        }
        while outstanding > 0 {
            expect_pong(&self.next(), payload);
            outstanding -= 1;
        }
        done
    }
}

fn client(variant: Variant, cfg: SwCfg, peer: SocketAddr) -> Box<dyn Pinger> {
    match variant {
        Variant::Raw => Box::new(RawClient::connect(peer)),
        Variant::Handle => {
            let rt = Runtime::start(cfg.config("worker"), None).expect("client runtime");
            let h = rt.handle(64);
            Box::new(HandleClient { h, rt, peer })
        }
        Variant::Embedded => Box::new(EmbeddedClient {
            e: Embedded::new(cfg.config("worker"), None).expect("embedded client"),
            peer,
        }),
    }
}

// ----- one measurement session -----

/// What one run of one configuration measured.
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    p50_us: f64,
    p99_us: f64,
    rate1: f64,
    rate64: f64,
    /// Per round trip of the latency phase: server, then client loop counters.
    server: PerRt,
    client: Option<PerRt>,
    /// The same for the 64-in-flight phase.
    server64: PerRt,
    client64: Option<PerRt>,
    /// Client process CPU µs per round trip in the 64-in-flight phase.
    client_cpu64: f64,
    /// Client process CPU µs per round trip.
    client_cpu: f64,
    /// Voluntary context switches of the calling thread per round trip.
    caller_sleeps: f64,
    mean_us: f64,
}

/// Loop time per round trip, in µs, and parks per round trip.
#[derive(Clone, Copy, Debug, Default)]
struct PerRt {
    busy: f64,
    spin: f64,
    parked: f64,
    parks: f64,
    /// Process CPU time per round trip.
    cpu: f64,
}

impl PerRt {
    fn of(c: Counters, rtts: usize) -> PerRt {
        let n = rtts as f64;
        PerRt {
            busy: c.busy_ns as f64 / 1e3 / n,
            spin: c.spin_ns as f64 / 1e3 / n,
            parked: c.parked_ns as f64 / 1e3 / n,
            parks: c.parks as f64 / n,
            cpu: c.cpu_ns as f64 / 1e3 / n,
        }
    }
}

struct Measure {
    latency: bool,
    rate1: bool,
    rate64: bool,
}

fn session(
    o: &Opts,
    cpus: (usize, usize),
    variant: Variant,
    cfg: SwCfg,
    payload: u32,
    what: &Measure,
) -> Sample {
    let mut server = match variant {
        Variant::Raw => Server::raw(cpus.1),
        _ => Server::starwire(cpus.1, cfg),
    };
    let mut c = client(variant, cfg, server.addr);
    let mut s = Sample::default();
    for _ in 0..WARMUP {
        c.round_trip(payload);
    }
    if what.latency {
        let mut lat = Vec::with_capacity(o.rtts);
        let s0 = server.stats();
        let c0 = c.counters();
        let (cpu0, sleeps0) = (process_cpu_time(), thread_sleeps());
        for _ in 0..o.rtts {
            let t = Instant::now();
            c.round_trip(payload);
            lat.push(t.elapsed().as_nanos() as u64);
        }
        let (cpu1, sleeps1) = (process_cpu_time(), thread_sleeps());
        let s1 = server.stats();
        s.client_cpu = (cpu1 - cpu0).as_secs_f64() * 1e6 / o.rtts as f64;
        s.caller_sleeps = (sleeps1 - sleeps0) as f64 / o.rtts as f64;
        s.mean_us = lat.iter().sum::<u64>() as f64 / lat.len() as f64 / 1e3;
        s.server = PerRt::of(s1.since(&s0), o.rtts);
        s.client = c
            .counters()
            .zip(c0)
            .map(|(c1, c0)| PerRt::of(c1.since(&c0), o.rtts));
        lat.sort_unstable();
        let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)] as f64 / 1e3;
        s.p50_us = pct(0.50);
        s.p99_us = pct(0.99);
    }
    if what.rate1 {
        s.rate1 = c.pipelined(payload, 1, o.window) as f64 / o.window.as_secs_f64();
    }
    if what.rate64 {
        let s0 = server.stats();
        let c0 = c.counters();
        let cpu0 = process_cpu_time();
        let n = c.pipelined(payload, 64, o.window);
        let (s1, c1, cpu1) = (server.stats(), c.counters(), process_cpu_time());
        s.rate64 = n as f64 / o.window.as_secs_f64();
        // The counters also cover the 64 sent before the window and drained after it.
        let all = usize::try_from(n + 64).unwrap_or(usize::MAX);
        s.server64 = PerRt::of(s1.since(&s0), all);
        s.client64 = c1.zip(c0).map(|(c1, c0)| PerRt::of(c1.since(&c0), all));
        s.client_cpu64 = (cpu1 - cpu0).as_secs_f64() * 1e6 / all as f64;
    }
    drop(c);
    server.stop();
    s
}

fn med(samples: &[Sample], f: impl Fn(&Sample) -> f64) -> f64 {
    median(samples.iter().map(f).collect())
}

// ----- sections -----

/// One row of a table: a configuration and its runs.
struct Row {
    variant: Variant,
    cfg: SwCfg,
    samples: Vec<Sample>,
}

fn run_rows(
    o: &Opts,
    cpus: (usize, usize),
    configs: &[(Variant, SwCfg)],
    payload: u32,
    what: &Measure,
) -> Vec<Row> {
    let mut rows: Vec<Row> = configs
        .iter()
        .map(|&(variant, cfg)| Row {
            variant,
            cfg,
            samples: Vec::new(),
        })
        .collect();
    // Rounds interleave the configurations, so drift on a noisy machine spreads over all.
    for run in 0..o.runs {
        for row in rows.iter_mut() {
            let t = Instant::now();
            let s = session(o, cpus, row.variant, row.cfg, payload, what);
            eprintln!(
                "run {}/{} {:<15} {} polling {:<3} spin {:>3}µs {}B: p50 {:.1}µs p99 {:.1}µs 1-inflight {:.0}/s 64-inflight {:.0}/s ({:.1}s)",
                run + 1,
                o.runs,
                row.variant.name(),
                row.cfg.backend.name(),
                on_off(row.cfg.polling),
                row.cfg.spin.as_micros(),
                payload,
                s.p50_us,
                s.p99_us,
                s.rate1,
                s.rate64,
                t.elapsed().as_secs_f64()
            );
            row.samples.push(s);
        }
    }
    rows
}

fn config_label(row: &Row) -> String {
    match row.variant {
        Variant::Raw => "raw blocking".into(),
        v => format!(
            "{} {} polling {}",
            v.name(),
            row.cfg.backend.name(),
            on_off(row.cfg.polling)
        ),
    }
}

fn main_section(o: &Opts, cpus: (usize, usize), payload: u32, rates: bool) {
    let spin = starwire::config::DEFAULT_SPIN;
    let mut configs = vec![(
        Variant::Raw,
        SwCfg {
            backend: Backend::Uring,
            polling: false,
            spin,
        },
    )];
    for &backend in &o.backends {
        for polling in [false, true] {
            for variant in [Variant::Embedded, Variant::Handle] {
                configs.push((
                    variant,
                    SwCfg {
                        backend,
                        polling,
                        spin,
                    },
                ));
            }
        }
    }
    let what = Measure {
        latency: true,
        rate1: rates,
        rate64: rates,
    };
    let rows = run_rows(o, cpus, &configs, payload, &what);
    let raw = &rows[0].samples;
    let (raw_p50, raw_p99, raw_r1, raw_r64) = (
        med(raw, |s| s.p50_us),
        med(raw, |s| s.p99_us),
        med(raw, |s| s.rate1),
        med(raw, |s| s.rate64),
    );

    println!(
        "\n### Ping-pong latency, {payload}-byte payload (median of {} runs, {} round trips each)\n",
        o.runs, o.rtts
    );
    println!("| configuration | p50 µs | p99 µs | mean µs | p50 / raw | target | p99 / raw |");
    println!("|---|---:|---:|---:|---:|---|---:|");
    for row in &rows {
        let p50 = med(&row.samples, |s| s.p50_us);
        let p99 = med(&row.samples, |s| s.p99_us);
        let target = match row.variant {
            Variant::Raw => "—".to_string(),
            _ if row.cfg.polling => format!("≤ 1.00x: {}", verdict(p50 / raw_p50 <= 1.0)),
            _ => format!("≤ 1.25x: {}", verdict(p50 / raw_p50 <= 1.25)),
        };
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.2}x | {} | {:.2}x |",
            config_label(row),
            p50,
            p99,
            med(&row.samples, |s| s.mean_us),
            p50 / raw_p50,
            target,
            p99 / raw_p99
        );
    }

    if rates {
        println!(
            "\n### Ping throughput, {payload}-byte payload (median of {} runs, {:.1} s windows)\n",
            o.runs,
            o.window.as_secs_f64()
        );
        println!(
            "Target: 64-in-flight rate ≥ 2x the raw blocking socket's 1-in-flight rate ({raw_r1:.0}/s).\n"
        );
        println!("| configuration | 1 in flight /s | vs raw 1 | 64 in flight /s | vs raw 1 (target ≥ 2x) | vs raw 64 |");
        println!("|---|---:|---:|---:|---|---:|");
        for row in &rows {
            let r1 = med(&row.samples, |s| s.rate1);
            let r64 = med(&row.samples, |s| s.rate64);
            let target = match row.variant {
                Variant::Raw => format!("{:.2}x", r64 / raw_r1),
                _ => format!("{:.2}x: {}", r64 / raw_r1, verdict(r64 / raw_r1 >= 2.0)),
            };
            println!(
                "| {} | {:.0} | {:.2}x | {:.0} | {} | {:.2}x |",
                config_label(row),
                r1,
                r1 / raw_r1,
                r64,
                target,
                r64 / raw_r64
            );
        }
    }

    time_table(o, &rows, payload, Phase::Latency);
    if rates {
        time_table(o, &rows, payload, Phase::Inflight64);
    }
}

/// A measured phase of a session.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// 1 in flight, round trips timed one by one.
    Latency,
    /// 64 in flight for the rate window.
    Inflight64,
}

/// The loops' accounting per round trip of one phase, a row per configuration.
fn time_table(o: &Opts, rows: &[Row], payload: u32, phase: Phase) {
    let of = |s: &Sample| match phase {
        Phase::Latency => (s.server, s.client, s.client_cpu),
        Phase::Inflight64 => (s.server64, s.client64, s.client_cpu64),
    };
    let name = match phase {
        Phase::Latency => "latency phase",
        Phase::Inflight64 => "64 in flight",
    };
    println!(
        "\n### Where the time goes, {name}, {payload}-byte payload (median of {} runs; µs of loop time per round trip)\n",
        o.runs
    );
    println!("Loop time is wall-clock time as the loop accounts it (time it was preempted counts too); CPU is process user+system time; caller sleeps are voluntary context switches of the thread that waits for the pong (latency phase only).\n");
    println!("| configuration | server busy | server spin | server parked | server parks/RT | server CPU | client busy | client spin | client parked | client parks/RT | client CPU | caller sleeps/RT |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        let sm = |f: fn(&PerRt) -> f64| med(&row.samples, |s| f(&of(s).0));
        let client = |s: &Sample| of(s).1;
        let cm = |f: fn(&PerRt) -> f64| {
            if row.samples.iter().all(|s| client(s).is_some()) {
                format!("{:.2}", med(&row.samples, |s| f(&client(s).unwrap())))
            } else {
                "—".into()
            }
        };
        let client_cpu = med(&row.samples, |s| of(s).2);
        let sleeps = match phase {
            Phase::Latency => format!("{:.3}", med(&row.samples, |s| s.caller_sleeps)),
            Phase::Inflight64 => "—".into(),
        };
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.3} | {:.2} | {} | {} | {} | {} | {:.2} | {} |",
            config_label(row),
            sm(|p| p.busy),
            sm(|p| p.spin),
            sm(|p| p.parked),
            sm(|p| p.parks),
            sm(|p| p.cpu),
            cm(|p| p.busy),
            cm(|p| p.spin),
            cm(|p| p.parked),
            cm(|p| p.parks),
            client_cpu,
            sleeps,
        );
    }
}

fn spin_section(o: &Opts, cpus: (usize, usize)) {
    let spins = [0u64, 10, 50, 200];
    let mut configs = vec![(
        Variant::Raw,
        SwCfg {
            backend: Backend::Uring,
            polling: false,
            spin: Duration::ZERO,
        },
    )];
    for &backend in &o.backends {
        for variant in [Variant::Handle, Variant::Embedded] {
            if variant == Variant::Embedded && !o.all {
                continue;
            }
            for us in spins {
                configs.push((
                    variant,
                    SwCfg {
                        backend,
                        polling: false,
                        spin: Duration::from_micros(us),
                    },
                ));
            }
        }
    }
    let what = Measure {
        latency: true,
        rate1: false,
        rate64: false,
    };
    let rows = run_rows(o, cpus, &configs, 32, &what);
    let raw_p50 = med(&rows[0].samples, |s| s.p50_us);
    println!(
        "\n### Spin budget (STARWIRE_SPIN_US, both ends), polling off, 1 in flight, 32 B (median of {} runs)\n",
        o.runs
    );
    println!("raw blocking p50 in the same runs: {raw_p50:.1} µs\n");
    println!("| client | backend | spin µs | p50 µs | p99 µs | mean µs | p50 / raw | server parks/RT | client loop parks/RT | caller sleeps/RT | server CPU µs/RT | client CPU µs/RT |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows.iter().filter(|r| r.variant != Variant::Raw) {
        let p50 = med(&row.samples, |s| s.p50_us);
        let client_parks = if row.samples.iter().all(|s| s.client.is_some()) {
            format!("{:.3}", med(&row.samples, |s| s.client.unwrap().parks))
        } else {
            "—".into()
        };
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.2}x | {:.3} | {} | {:.3} | {:.1} | {:.1} |",
            row.variant.name(),
            row.cfg.backend.name(),
            row.cfg.spin.as_micros(),
            p50,
            med(&row.samples, |s| s.p99_us),
            med(&row.samples, |s| s.mean_us),
            p50 / raw_p50,
            med(&row.samples, |s| s.server.parks),
            client_parks,
            med(&row.samples, |s| s.caller_sleeps),
            med(&row.samples, |s| s.server.cpu),
            med(&row.samples, |s| s.client_cpu),
        );
    }
}

/// Idle CPU: runs in a child process allowed on both CPUs; prints one table row.
fn idle_main(args: &[String]) {
    let cpus: Vec<usize> = args[0].split(',').map(|c| c.parse().unwrap()).collect();
    let cfg = SwCfg::from_args(&args[1..4]);
    let secs: f64 = args[4].parse().unwrap();
    // Server loop pinned to the second CPU, client loop to the first.
    restrict_to(cpus[1]);
    let server = Runtime::start(cfg.config("ps"), Some("127.0.0.1:0".parse().unwrap()))
        .expect("server runtime");
    restrict_to(cpus[0]);
    let client = Runtime::start(cfg.config("worker"), None).expect("client runtime");
    restrict_to_set(&cpus);
    let peer = server.local_addr().unwrap();
    let mut h = client.handle(8);
    let t = h.ping(peer, 32, None).unwrap();
    expect_pong(&h.wait_tag(t.tag()).unwrap(), 32);
    std::thread::sleep(Duration::from_millis(200));
    let (cpu0, wall0) = (process_cpu_time(), Instant::now());
    let (s0, c0) = (
        Counters::from(&server.stats()),
        Counters::from(&client.stats()),
    );
    std::thread::sleep(Duration::from_secs_f64(secs));
    let (cpu1, wall1) = (process_cpu_time(), Instant::now());
    let (s1, c1) = (
        Counters::from(&server.stats()),
        Counters::from(&client.stats()),
    );
    let wall = (wall1 - wall0).as_secs_f64();
    let pct = (cpu1 - cpu0).as_secs_f64() / wall * 100.0;
    let (ds, dc) = (s1.since(&s0), c1.since(&c0));
    println!(
        "| {} | {} | {} | {:.1} s | {:.2} % | {:.2} % | {} | {} | {:.0} % | {:.0} % | {:.0} % | {:.0} % |",
        cfg.backend.name(),
        on_off(cfg.polling),
        cfg.spin.as_micros(),
        wall,
        pct,
        pct / 2.0,
        ds.parks,
        dc.parks,
        ds.parked_ns as f64 / 1e9 / wall * 100.0,
        dc.parked_ns as f64 / 1e9 / wall * 100.0,
        ds.spin_ns as f64 / 1e9 / wall * 100.0,
        dc.spin_ns as f64 / 1e9 / wall * 100.0,
    );
    drop(h);
    client.shutdown();
    server.shutdown();
}

fn idle_section(o: &Opts, cpus: &[usize]) {
    let secs = if o.quick { 1.0 } else { 3.0 };
    println!("\n### Idle CPU: one server and one client runtime (1 loop each, pinned to different CPUs), connected, idle {secs} s\n");
    println!("Parked time is added to the counters when a park ends, so a loop parked through the whole window shows 0 parks and 0 % parked.\n");
    println!("| backend | polling | spin µs | wall | process CPU (% of one core) | per loop | server parks | client parks | server parked % | client parked % | server spin % | client spin % |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let exe = std::env::current_exe().expect("current_exe");
    let list = format!("{},{}", cpus[0], cpus[1]);
    for &backend in &o.backends {
        for polling in [false, true] {
            let cfg = SwCfg {
                backend,
                polling,
                spin: starwire::config::DEFAULT_SPIN,
            };
            let out = Command::new(&exe)
                .arg("--idle")
                .arg(&list)
                .args(cfg.args())
                .arg(secs.to_string())
                .stderr(Stdio::inherit())
                .output()
                .expect("idle child");
            print!("{}", String::from_utf8_lossy(&out.stdout));
        }
    }
}

/// `--one`: a single measurement for strace/perf.
fn one_main(args: &[String], cpus: (usize, usize)) {
    let variant = match args[0].as_str() {
        "raw" => Variant::Raw,
        "handle" => Variant::Handle,
        "embedded" => Variant::Embedded,
        v => panic!("variant {v:?}"),
    };
    let cfg = SwCfg {
        backend: Backend::parse(&args[1]),
        polling: args[2] == "on",
        spin: starwire::config::DEFAULT_SPIN,
    };
    let inflight: usize = args[3].parse().unwrap();
    let count: u64 = args[4].parse().unwrap();
    let server = match variant {
        Variant::Raw => Server::raw(cpus.1),
        _ => Server::starwire(cpus.1, cfg),
    };
    let mut c = client(variant, cfg, server.addr);
    c.round_trip(32);
    let t = Instant::now();
    if inflight == 1 {
        for _ in 0..count {
            c.round_trip(32);
        }
    } else {
        // A window long enough for about `count` round trips is not known in advance:
        // run fixed windows until `count` is reached.
        let mut done = 0;
        while done < count {
            done += c.pipelined(32, inflight, Duration::from_millis(100));
        }
    }
    let el = t.elapsed();
    eprintln!(
        "{} {} polling {} inflight {inflight}: {count} round trips in {:.3} s",
        variant.name(),
        cfg.backend.name(),
        on_off(cfg.polling),
        el.as_secs_f64()
    );
    drop(c);
    server.stop();
}

// ----- regbuf: the receive-buffer pool off and on -----

/// Pool sizes compared: off, and 64 receive buffers of 64 KiB per loop.
const REGBUF_POOLS: [u64; 2] = [0, 4 << 20];

/// 64 B pings with `STARWIRE_BUF_SIZE` at 0 and at 4 MiB (registered as io_uring fixed
/// buffers on io_uring, plain memory on epoll), interleaved, beside the raw socket.
fn regbuf_section(o: &Opts, cpus: (usize, usize)) {
    const PAYLOAD: u32 = 64;
    let name = starwire::config::ENV_BUF_SIZE;
    let saved = std::env::var_os(name);
    let cfg = |backend| SwCfg {
        backend,
        polling: false,
        spin: starwire::config::DEFAULT_SPIN,
    };
    let mut rows: Vec<(Variant, SwCfg, u64, Vec<Sample>)> =
        vec![(Variant::Raw, cfg(Backend::Uring), 0, Vec::new())];
    for &backend in &o.backends {
        for variant in [Variant::Embedded, Variant::Handle] {
            for pool in REGBUF_POOLS {
                rows.push((variant, cfg(backend), pool, Vec::new()));
            }
        }
    }
    let what = Measure {
        latency: true,
        rate1: true,
        rate64: true,
    };
    for run in 0..o.runs {
        for (variant, cfg, pool, samples) in rows.iter_mut() {
            // Read by the client's `ConfigBuilder::from_env` and inherited by the server
            // child; set between sessions, when no runtime of this process is running.
            std::env::set_var(name, pool.to_string());
            let t = Instant::now();
            let s = session(o, cpus, *variant, *cfg, PAYLOAD, &what);
            eprintln!(
                "run {}/{} {:<15} {} pool {:>7}: p50 {:.1}µs 1-inflight {:.0}/s 64-inflight {:.0}/s ({:.1}s)",
                run + 1,
                o.runs,
                variant.name(),
                cfg.backend.name(),
                pool,
                s.p50_us,
                s.rate1,
                s.rate64,
                t.elapsed().as_secs_f64()
            );
            samples.push(s);
        }
    }
    match saved {
        Some(v) => std::env::set_var(name, v),
        None => std::env::remove_var(name),
    }
    println!(
        "\n### 64 B ping, receive-buffer pool off and on (median of {} runs; {} round trips, {:.1} s windows)\n",
        o.runs,
        o.rtts,
        o.window.as_secs_f64()
    );
    println!("\"vs off\" is the ratio to the same client and backend with the pool off, same run (for p50, lower is better). On io_uring a pool is registered (fixed buffers, `READ_FIXED`); on epoll it is the same memory, unregistered.\n");
    println!("| configuration | STARWIRE_BUF_SIZE | p50 µs | vs off | 1 in flight /s | vs off | 64 in flight /s | vs off | server loop busy µs/rt |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut off = [0.0f64; 3];
    for (variant, cfg, pool, samples) in &rows {
        let v = [
            med(samples, |s| s.p50_us),
            med(samples, |s| s.rate1),
            med(samples, |s| s.rate64),
        ];
        if *pool == 0 {
            off = v;
        }
        let ratio = |k: usize| match (variant, *pool) {
            (Variant::Raw, _) | (_, 0) => "—".to_string(),
            _ => format!("{:.2}x", v[k] / off[k]),
        };
        let label = match variant {
            Variant::Raw => "raw blocking".to_string(),
            v => format!("{} {}", v.name(), cfg.backend.name()),
        };
        println!(
            "| {} | {} | {:.1} | {} | {:.0} | {} | {:.0} | {} | {} |",
            label,
            pool,
            v[0],
            ratio(0),
            v[1],
            ratio(1),
            v[2],
            ratio(2),
            match variant {
                Variant::Raw => "—".to_string(),
                _ => format!("{:.1}", med(samples, |s| s.server.busy)),
            }
        );
    }
}

fn main() {
    let args = bench_args();
    match args.first().map(String::as_str) {
        Some("--server") => return server_main(&args[1..]),
        Some("--idle") => return idle_main(&args[1..]),
        _ => {}
    }
    let allowed = allowed_cpus();
    assert!(
        allowed.len() >= 2,
        "the ping bench needs two CPUs, this process may use {allowed:?}"
    );
    let cpus = (allowed[0], allowed[1]);
    if args.first().map(String::as_str) == Some("--one") {
        restrict_to(cpus.0);
        return one_main(&args[1..], cpus);
    }
    let o = parse_opts(&args);
    let start = Instant::now();
    println!("load average at start: {}", loadavg());
    if o.sections.iter().any(|s| s == "idle") {
        // Before the client restricts itself: the idle child needs both CPUs.
        idle_section(&o, &allowed);
    }
    restrict_to(cpus.0);
    println!(
        "\nclient on CPU {}, servers on CPU {}; {} runs per configuration, interleaved",
        cpus.0, cpus.1, o.runs
    );
    for section in &o.sections {
        match section.as_str() {
            "main" => main_section(&o, cpus, 32, true),
            "big" => main_section(&o, cpus, 4096, false),
            "spin" => spin_section(&o, cpus),
            "regbuf" => regbuf_section(&o, cpus),
            "idle" => {}
            other => panic!("unknown section {other:?}"),
        }
    }
    println!("\nload average at end: {}", loadavg());
    eprintln!("total {:.1} s", start.elapsed().as_secs_f64());
}
