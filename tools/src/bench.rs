//! `commctl bench`: keep N requests in flight against a server for a while; report rate,
//! bandwidth, latency percentiles and CPU time.
//!
//! Against `commctl serve` (see [`crate::serve`]): pulls ask for ids and recvs for keys
//! `t/i`, with `i` running through `0..--variables` in turn; pushes send one shared
//! tensor of `--tensor-size` bytes for each id.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use starwire::{DType, Status};
use starwire::{Error, ErrorKind, Handle, Reply, Tensor};

use crate::cli::BenchArgs;
use crate::cpu;
use crate::exit::{self, Failure};
use crate::histogram::Histogram;
use crate::jsonw::J;
use crate::ping::{client_config, fatal, fmt_ms, start_client};
use crate::serve::{recv_key, MAX_TENSORS, MAX_TENSOR_SIZE};
use crate::signals::{self, Watcher};
use crate::target;

/// Default run time.
const DEFAULT_DURATION: Duration = Duration::from_secs(5);
/// Most requests in flight.
const MAX_INFLIGHT: usize = 65_536;
/// How often the progress line is redrawn.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);

/// Most tensors in one request.
const MAX_PER_REQUEST: usize = 65_536;

/// The operations bench can drive.
const OPERATIONS: &[&str] = &["ping", "pull", "push", "recv", "fused-recv"];

/// An operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Ping,
    Pull,
    Push,
    Recv,
    FusedRecv,
}

impl Op {
    fn parse(text: &str) -> Option<Op> {
        Some(match text {
            "ping" => Op::Ping,
            "pull" => Op::Pull,
            "push" => Op::Push,
            "recv" => Op::Recv,
            "fused-recv" | "fused_recv" => Op::FusedRecv,
            _ => return None,
        })
    }

    /// Tensors in each request.
    fn per_request(self, args: &BenchArgs) -> usize {
        match self {
            Op::Ping => 0,
            Op::Recv => 1,
            _ => args.tensors,
        }
    }
}

/// What bench sends: the next request's ids or keys, and the tensor it pushes.
struct Load {
    op: Op,
    addr: SocketAddr,
    ping_size: u32,
    per_request: usize,
    variables: u64,
    next: u64,
    push: Option<Arc<Tensor>>,
}

impl Load {
    fn new(op: Op, addr: SocketAddr, args: &BenchArgs) -> Result<Load, Failure> {
        let push = match op {
            Op::Push => {
                let size = args.tensor_size;
                let t = Tensor::from_bytes(DType::U8, &[size], vec![1u8; size as usize])
                    .map_err(|e| Failure::usage(format!("--tensor-size {size}: {e}")))?;
                Some(Arc::new(t))
            }
            _ => None,
        };
        Ok(Load {
            op,
            addr,
            ping_size: args.size,
            per_request: op.per_request(args),
            variables: args.variables,
            next: 0,
            push,
        })
    }

    /// The ids of the next request.
    fn ids(&mut self) -> Vec<u64> {
        let ids = (0..self.per_request as u64)
            .map(|j| (self.next + j) % self.variables)
            .collect();
        self.next = (self.next + self.per_request as u64) % self.variables;
        ids
    }

    /// Submits the next request.
    fn submit(&mut self, h: &mut Handle, deadline: Instant) -> Result<u64, Error> {
        let deadline = Some(deadline);
        match self.op {
            Op::Ping => h.ping(self.addr, self.ping_size, deadline).map(|t| t.tag()),
            Op::Pull => {
                let ids = self.ids();
                h.pull(self.addr, ids, deadline).map(|t| t.tag())
            }
            Op::Push => {
                let t = self
                    .push
                    .clone()
                    .unwrap_or_else(|| Arc::new(Tensor::dead(DType::U8)));
                let items = self.ids().into_iter().map(|i| (i, t.clone())).collect();
                h.push(self.addr, items, deadline).map(|t| t.tag())
            }
            Op::Recv => {
                let key = recv_key(self.ids()[0]);
                h.recv(self.addr, 0, &key, deadline).map(|t| t.tag())
            }
            Op::FusedRecv => {
                let keys = self.ids().into_iter().map(recv_key).collect();
                h.recv_many(self.addr, 0, keys, deadline).map(|t| t.tag())
            }
        }
    }

    /// What an answer moved: tensors and bytes, and the first failure in it.
    fn tally(&self, reply: Reply) -> (u64, u64, Option<Error>) {
        let mut tensors = 0u64;
        let mut bytes = 0u64;
        let mut failure = None;
        match (self.op, reply) {
            (Op::Ping, Reply::Pong { payload, .. }) => bytes = u64::from(payload),
            (Op::Pull, Reply::Pulled(items))
            | (Op::Recv | Op::FusedRecv, Reply::Received(items)) => {
                for item in items {
                    match item {
                        Ok(t) => {
                            tensors += 1;
                            bytes += t.byte_len() as u64;
                        }
                        Err(s) => failure = failure.or(Some(Error::new(ErrorKind::Remote(s)))),
                    }
                }
            }
            (Op::Push, Reply::Pushed(statuses)) => {
                let size = self.push.as_ref().map_or(0, |t| t.byte_len() as u64);
                for s in statuses {
                    if s == Status::Ok {
                        tensors += 1;
                        bytes += size;
                    } else {
                        failure = failure.or(Some(Error::new(ErrorKind::Remote(s))));
                    }
                }
            }
            (_, other) => {
                log::warn!("unexpected reply: {other:?}");
                failure = Some(Error::new(ErrorKind::Protocol));
            }
        }
        (tensors, bytes, failure)
    }
}

/// A `commctl serve` started by bench; stopped (SIGTERM) when dropped.
struct Spawned {
    child: Child,
    addr: SocketAddr,
}

impl Spawned {
    fn start(args: &BenchArgs) -> Result<Spawned, Failure> {
        let exe = std::env::current_exe()
            .map_err(|e| Failure::usage(format!("cannot find the commctl binary: {e}")))?;
        let mut child = Command::new(exe)
            .args(["serve", "--listen", "127.0.0.1:0", "--loops"])
            .arg(args.server_loops.to_string())
            .arg("--tensors")
            .arg(args.variables.to_string())
            .arg("--tensor-size")
            .arg(args.tensor_size.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Failure::usage(format!("cannot start commctl serve: {e}")))?;
        let mut line = String::new();
        if let Some(stdout) = child.stdout.take() {
            let _ = BufReader::new(stdout).read_line(&mut line);
        }
        let addr = line
            .strip_prefix("listening on ")
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|a| a.parse::<SocketAddr>().ok());
        match addr {
            Some(addr) => {
                // Drain stderr so the server never blocks on it.
                if let Some(mut err) = child.stderr.take() {
                    let _ = std::thread::Builder::new()
                        .name("commctl-serve-stderr".into())
                        .spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
                }
                Ok(Spawned { child, addr })
            }
            None => {
                let mut why = String::new();
                if let Some(err) = child.stderr.take() {
                    let _ = err.take(4096).read_to_string(&mut why);
                }
                let _ = child.kill();
                let _ = child.wait();
                Err(Failure::usage(format!(
                    "the server did not start: {}",
                    why.trim().trim_start_matches("commctl: ")
                )))
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

/// What a run measured.
struct Outcome {
    ok: u64,
    failed: u64,
    tensors: u64,
    bytes: u64,
    errors: Vec<(Error, u64)>,
    elapsed: Duration,
    latency: Histogram,
    client_cpu: Duration,
    server_cpu: Option<Duration>,
    fatal: Option<Failure>,
}

fn check_args(args: &BenchArgs) -> Result<Op, Failure> {
    let Some(op) = Op::parse(&args.operation) else {
        return Err(Failure::usage(format!(
            "-o {}: unknown operation (supported: {})",
            args.operation,
            OPERATIONS.join(", ")
        )));
    };
    if !(1..=MAX_PER_REQUEST).contains(&args.tensors) {
        return Err(Failure::usage(format!(
            "-k {}: expected 1 to {MAX_PER_REQUEST} tensors per request",
            args.tensors
        )));
    }
    if op == Op::Recv && args.tensors != 1 {
        return Err(Failure::usage(format!(
            "-k {}: a recv asks for one key; use -o fused-recv for several per request",
            args.tensors
        )));
    }
    if !(1..=MAX_TENSORS).contains(&args.variables) {
        return Err(Failure::usage(format!(
            "--variables {}: expected 1 to {MAX_TENSORS}",
            args.variables
        )));
    }
    if args.tensor_size > MAX_TENSOR_SIZE {
        return Err(Failure::usage(format!(
            "--tensor-size {}: expected at most {MAX_TENSOR_SIZE} bytes",
            args.tensor_size
        )));
    }
    if !(1..=MAX_INFLIGHT).contains(&args.inflight) {
        return Err(Failure::usage(format!(
            "-p {}: expected 1 to {MAX_INFLIGHT} requests in flight",
            args.inflight
        )));
    }
    if !(1..=4096).contains(&args.connections) {
        return Err(Failure::usage(format!(
            "-C {}: expected 1 to 4096 connections",
            args.connections
        )));
    }
    for (flag, n) in [
        ("--loops", args.loops),
        ("--server-loops", args.server_loops),
    ] {
        if !(1..=1024).contains(&n) {
            return Err(Failure::usage(format!(
                "{flag} {n}: expected 1 to 1024 loops"
            )));
        }
    }
    if args.requests == Some(0) {
        return Err(Failure::usage("-n: expected at least 1 request"));
    }
    if args.target.is_some() && args.server_loops != 1 {
        return Err(Failure::usage(
            "--server-loops applies only to the server bench starts (no TARGET)",
        ));
    }
    Ok(op)
}

/// Runs `commctl bench`.
pub fn run(args: &BenchArgs) -> Result<i32, Failure> {
    let op = check_args(args)?;
    signals::block()?;
    let timeout = Duration::from_secs_f64(args.timeout);
    let (spawned, label, addr) = match &args.target {
        Some(t) => {
            let t = target::resolve(t, &args.cluster_opts())?;
            (None, t.label, t.addr)
        }
        None => {
            let s = Spawned::start(args)?;
            let addr = s.addr;
            (Some(s), addr.to_string(), addr)
        }
    };
    let server_pid = args.server_pid.or(spawned.as_ref().map(Spawned::pid));
    if let Some(pid) = args.server_pid {
        if cpu::of_pid(pid).is_none() {
            return Err(Failure::usage(format!(
                "--server-pid {pid}: cannot read /proc/{pid}/stat"
            )));
        }
    }
    let cfg = client_config(args.loops, args.connections, 2)?;
    let rt = start_client(cfg)?;
    let watcher = Watcher::start(std::thread::current());
    let mut h = rt.handle(args.inflight.max(args.connections));
    let mut load = Load::new(op, addr, args)?;

    // Open every connection before the clock starts: one ping per lane.
    for _ in 0..args.connections {
        let tag = h
            .ping(addr, args.size, Some(Instant::now() + timeout))
            .map_err(|e| fatal(&e, &label, addr, timeout))?;
        if let Err(e) = h.wait(tag) {
            return Err(match e.kind() {
                ErrorKind::InvalidArgument => Failure::usage(format!(
                    "-s {}: the payload is too large for a ping",
                    args.size
                )),
                _ => fatal(&e, &label, addr, timeout),
            });
        }
    }

    let duration = match (args.duration, args.requests) {
        (None, None) => Some(DEFAULT_DURATION),
        (d, _) => d,
    };
    let progress = std::io::stderr().is_terminal();
    let cpu0 = cpu::own();
    let server0 = server_pid.and_then(cpu::of_pid);
    let start = Instant::now();
    let end = duration.map(|d| start + d);
    let mut inflight: HashMap<u64, Instant> = HashMap::with_capacity(args.inflight * 2);
    let mut submitted = 0u64;
    let mut o = Outcome {
        ok: 0,
        failed: 0,
        tensors: 0,
        bytes: 0,
        errors: Vec::new(),
        elapsed: Duration::ZERO,
        latency: Histogram::default(),
        client_cpu: Duration::ZERO,
        server_cpu: None,
        fatal: None,
    };
    let mut last_draw = start;
    let mut last_ok = 0u64;
    let mut last_bytes = 0u64;
    let mut window = Histogram::default();
    loop {
        let now = Instant::now();
        let stopping = o.fatal.is_some()
            || watcher.stopped()
            || end.is_some_and(|e| now >= e)
            || args.requests.is_some_and(|n| submitted >= n);
        if !stopping {
            while inflight.len() < args.inflight && args.requests.map_or(true, |n| submitted < n) {
                match load.submit(&mut h, now + timeout) {
                    Ok(tag) => {
                        inflight.insert(tag, Instant::now());
                        submitted += 1;
                    }
                    Err(e) if e.kind() == ErrorKind::Backpressure => break,
                    Err(e) => {
                        o.fatal = Some(fatal(&e, &label, addr, timeout));
                        break;
                    }
                }
            }
        }
        if inflight.is_empty() {
            if stopping || o.fatal.is_some() {
                break;
            }
            continue;
        }
        // Something is in flight, so this waits (an empty table cannot get here).
        let Ok(c) = h.wait_any() else { break };
        let done = Instant::now();
        let Some(sent) = inflight.remove(&c.tag) else {
            continue;
        };
        let failure = match c.result {
            Ok(reply) => {
                let (tensors, bytes, failure) = load.tally(reply);
                o.tensors += tensors;
                o.bytes += bytes;
                failure
            }
            Err(e) => Some(e),
        };
        match failure {
            None => {
                o.ok += 1;
                o.latency.record(done - sent);
                if progress {
                    window.record(done - sent);
                }
            }
            Some(e) => {
                o.failed += 1;
                match o.errors.iter_mut().find(|(k, _)| *k == e) {
                    Some((_, n)) => *n += 1,
                    None => o.errors.push((e.clone(), 1)),
                }
                if matches!(e.kind(), ErrorKind::ConnectFailed | ErrorKind::Refused(_))
                    && o.fatal.is_none()
                {
                    o.fatal = Some(fatal(&e, &label, addr, timeout));
                }
            }
        }
        if progress && done - last_draw >= PROGRESS_EVERY {
            let secs = (done - last_draw).as_secs_f64();
            eprint!(
                "\r\x1b[2K[{:5.1} s] {:>10.0} req/s  {:>7.3} GB/s  p50 {} ms  p99 {} ms  \
                 failed {}",
                (done - start).as_secs_f64(),
                (o.ok - last_ok) as f64 / secs,
                (o.bytes - last_bytes) as f64 / secs / 1e9,
                fmt_ms(window.quantile(0.5)),
                fmt_ms(window.quantile(0.99)),
                o.failed
            );
            last_draw = done;
            last_ok = o.ok;
            last_bytes = o.bytes;
            window = Histogram::default();
        }
    }
    o.elapsed = start.elapsed();
    o.client_cpu = cpu::own().saturating_sub(cpu0);
    o.server_cpu = match (server0, server_pid.and_then(cpu::of_pid)) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    if progress {
        eprint!("\r\x1b[2K");
    }
    drop(h);
    rt.shutdown();
    let server_note = if spawned.is_some() {
        format!(
            "started by bench, {} loop{}",
            args.server_loops,
            if args.server_loops == 1 { "" } else { "s" }
        )
    } else {
        String::new()
    };
    drop(spawned);

    let mut out = std::io::stdout().lock();
    let text = if args.json {
        json(args, op, &label, &o).render() + "\n"
    } else {
        table(args, op, &label, &server_note, &o)
    };
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
    if let Some(f) = o.fatal {
        return Err(f);
    }
    Ok(if o.failed == 0 {
        exit::OK
    } else if o.ok > 0 {
        exit::FAILED
    } else {
        // An error status from the server is an answer: the transport works.
        o.errors
            .first()
            .map_or(exit::FAILED, |(e, _)| match e.kind() {
                ErrorKind::Remote(_) => exit::FAILED,
                _ => exit::code_of(e),
            })
    })
}

fn rate(o: &Outcome) -> f64 {
    o.ok as f64 / o.elapsed.as_secs_f64().max(1e-9)
}

fn gbps(o: &Outcome) -> f64 {
    o.bytes as f64 / o.elapsed.as_secs_f64().max(1e-9) / 1e9
}

fn tensor_rate(o: &Outcome) -> f64 {
    o.tensors as f64 / o.elapsed.as_secs_f64().max(1e-9)
}

fn pct_of_wall(cpu: Duration, o: &Outcome) -> f64 {
    cpu.as_secs_f64() * 100.0 / o.elapsed.as_secs_f64().max(1e-9)
}

fn table(args: &BenchArgs, op: Op, label: &str, server_note: &str, o: &Outcome) -> String {
    let plural = |n: usize, w: &str| format!("{n} {w}{}", if n == 1 { "" } else { "s" });
    let what = match op {
        Op::Ping => format!("{} B payload", args.size),
        Op::Push => format!(
            "{} of {} B per request",
            plural(args.tensors, "tensor"),
            args.tensor_size
        ),
        Op::Recv => "1 key per request".to_owned(),
        Op::Pull => format!("{} per request", plural(args.tensors, "id")),
        Op::FusedRecv => format!("{} per request", plural(args.tensors, "key")),
    };
    let mut s = format!(
        "{} to {label}{}: {what}, {} in flight, {}, {}\n\n",
        args.operation,
        if server_note.is_empty() {
            String::new()
        } else {
            format!(" ({server_note})")
        },
        args.inflight,
        plural(args.connections, "connection"),
        plural(args.loops, "client loop"),
    );
    let mut row = |k: &str, v: String| s.push_str(&format!("  {k:<12} {v}\n"));
    row(
        "requests",
        format!(
            "{} ok, {} failed, in {:.2} s",
            o.ok,
            o.failed,
            o.elapsed.as_secs_f64()
        ),
    );
    for (e, n) in &o.errors {
        let hint = match (op, e.kind()) {
            (Op::Pull | Op::Push, ErrorKind::Remote(Status::NotFound)) => {
                " (ids past the server's --tensors? see --variables)"
            }
            (Op::Push, ErrorKind::Remote(Status::InvalidArgument)) => {
                " (--tensor-size must be the server's)"
            }
            _ => "",
        };
        row("", format!("{n} x {e}{hint}"));
    }
    row("rate", format!("{:.0} req/s", rate(o)));
    if op == Op::Ping {
        row("payload", format!("{:.3} GB/s each way", gbps(o)));
    } else {
        row(
            "tensors",
            format!(
                "{} in all, {:.0} tensors/s, {} B",
                o.tensors,
                tensor_rate(o),
                o.bytes
            ),
        );
        let dir = if op == Op::Push { "sent" } else { "received" };
        row(
            "bandwidth",
            format!("{:.3} GB/s of tensor bytes {dir}", gbps(o)),
        );
    }
    let l = &o.latency;
    row(
        "latency",
        format!(
            "p50 {} ms, p99 {} ms, p999 {} ms, max {} ms",
            fmt_ms(l.quantile(0.5)),
            fmt_ms(l.quantile(0.99)),
            fmt_ms(l.quantile(0.999)),
            fmt_ms(l.max())
        ),
    );
    row(
        "client CPU",
        format!(
            "{:.2} s ({:.0}% of one CPU)",
            o.client_cpu.as_secs_f64(),
            pct_of_wall(o.client_cpu, o)
        ),
    );
    row(
        "server CPU",
        match o.server_cpu {
            Some(c) => format!(
                "{:.2} s ({:.0}% of one CPU)",
                c.as_secs_f64(),
                pct_of_wall(c, o)
            ),
            None => "unknown (give --server-pid)".into(),
        },
    );
    s
}

fn json(args: &BenchArgs, op: Op, label: &str, o: &Outcome) -> J {
    // Nanosecond precision is all there is; more digits are float noise.
    let r6 = |x: f64| J::Num((x * 1e6).round() / 1e6);
    let ms = |d: Duration| r6(d.as_secs_f64() * 1000.0);
    let l = &o.latency;
    J::Obj(vec![
        ("operation", J::s(&args.operation)),
        ("target", J::s(label)),
        ("server_started_by_bench", J::Bool(args.target.is_none())),
        ("payload_bytes", J::Int(i64::from(args.size))),
        ("tensors_per_request", J::Int(op.per_request(args) as i64)),
        ("tensor_bytes", J::Int(args.tensor_size as i64)),
        ("inflight", J::Int(args.inflight as i64)),
        ("connections", J::Int(args.connections as i64)),
        ("client_loops", J::Int(args.loops as i64)),
        ("seconds", r6(o.elapsed.as_secs_f64())),
        ("ok", J::Int(o.ok as i64)),
        ("failed", J::Int(o.failed as i64)),
        ("tensors", J::Int(o.tensors as i64)),
        ("bytes", J::Int(o.bytes as i64)),
        (
            "errors",
            J::Arr(
                o.errors
                    .iter()
                    .map(|(e, n)| {
                        J::Obj(vec![
                            ("error", J::s(e.to_string())),
                            ("count", J::Int(*n as i64)),
                        ])
                    })
                    .collect(),
            ),
        ),
        (
            "requests_per_second",
            J::Num((rate(o) * 10.0).round() / 10.0),
        ),
        (
            "tensors_per_second",
            J::Num((tensor_rate(o) * 10.0).round() / 10.0),
        ),
        ("gigabytes_per_second", r6(gbps(o))),
        (
            "latency_ms",
            J::Obj(vec![
                ("min", ms(l.min())),
                ("mean", ms(l.mean())),
                ("p50", ms(l.quantile(0.5))),
                ("p99", ms(l.quantile(0.99))),
                ("p999", ms(l.quantile(0.999))),
                ("max", ms(l.max())),
            ]),
        ),
        ("client_cpu_seconds", r6(o.client_cpu.as_secs_f64())),
        (
            "server_cpu_seconds",
            o.server_cpu.map_or(J::Null, |c| r6(c.as_secs_f64())),
        ),
    ])
}
