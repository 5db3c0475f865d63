//! `commctl bench`: keep N requests in flight against a server for a while; report rate,
//! bandwidth, latency percentiles and CPU time.
//!
//! Against `commctl serve` (see [`crate::serve`]): pulls ask for ids and recvs for keys
//! `t/i`, with `i` running through `0..--variables` in turn; pushes send one shared
//! tensor of `--tensor-size` bytes for each id. Rows pulls and pushes name the server's
//! rows table (`--table`) and `-k` row ids each, drawn from `0..--id-range` by a fixed hash
//! of a counter ([`row_id`]); a rows push sends one block of gradient rows.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use starwire::rows::Rows;
use starwire::{DType, Status};
use starwire::{Error, ErrorKind, Handle, Reply, Tensor};

use crate::cli::BenchArgs;
use crate::cpu;
use crate::exit::{self, Failure};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::ping::{client_config, fatal, fmt_ms, start_client};
use crate::serve::{recv_key, DEFAULT_DIM, MAX_DIM, MAX_TENSORS, MAX_TENSOR_SIZE};
use crate::signals::{self, Watcher};
use crate::target;

/// Default run time.
const DEFAULT_DURATION: Duration = Duration::from_secs(5);
/// Most requests in flight.
const MAX_INFLIGHT: usize = 65_536;
/// How often the progress line is redrawn.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);
/// Longest latency told apart from longer ones: a day (more than any timeout), in ns.
const LATENCY_MAX_NS: u64 = 86_400 * 1_000_000_000;
/// Significant digits of the latency histogram: 3, within 0.1%.
const LATENCY_DIGITS: u8 = 3;

/// Most tensors in one request.
const MAX_PER_REQUEST: usize = 65_536;
/// Most rows in one rows request (starwire's default `max_rows`).
const MAX_ROWS_PER_REQUEST: usize = 1 << 20;
/// Default `--id-range`.
pub const DEFAULT_ID_RANGE: u64 = 100_000;

/// The operations bench can drive.
const OPERATIONS: &[&str] = &[
    "ping",
    "pull",
    "push",
    "recv",
    "fused-recv",
    "pull-rows",
    "push-rows",
];

/// An operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Ping,
    Pull,
    Push,
    Recv,
    FusedRecv,
    PullRows,
    PushRows,
}

/// The `k`-th row id of a run over `0..range`: splitmix64 of `k`, reduced. The same
/// sequence every run; spread over the range, so ids repeat only by chance.
pub fn row_id(k: u64, range: u64) -> u64 {
    let mut z = k.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) % range.max(1)
}

impl Op {
    fn parse(text: &str) -> Option<Op> {
        Some(match text {
            "ping" => Op::Ping,
            "pull" => Op::Pull,
            "push" => Op::Push,
            "recv" => Op::Recv,
            "fused-recv" | "fused_recv" => Op::FusedRecv,
            "pull-rows" | "pull_rows" => Op::PullRows,
            "push-rows" | "push_rows" => Op::PushRows,
            _ => return None,
        })
    }

    /// Whether it moves rows of a table.
    fn rows(self) -> bool {
        matches!(self, Op::PullRows | Op::PushRows)
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
    /// Rows requests: the table, the shape of a row, the id range and the ids drawn so far.
    table: u32,
    row_dims: [u64; 1],
    id_range: u64,
    drawn: u64,
    /// The next rows request's ids, and a push's gradient rows (the same every request,
    /// sent from this tensor's memory by every request in flight).
    row_ids: Vec<u64>,
    grads: Arc<Tensor>,
}

/// What one answer moved: tensors or rows, their bytes, the rows the server did not have,
/// and the first failure in it.
#[derive(Debug, Default)]
struct Tally {
    items: u64,
    bytes: u64,
    missing: u64,
    failure: Option<Error>,
}

impl Load {
    fn new(op: Op, addr: SocketAddr, args: &BenchArgs, dim: usize) -> Result<Load, Failure> {
        let push = match op {
            Op::Push => {
                let size = args.tensor_size;
                let t = Tensor::from_bytes(DType::U8, &[size], vec![1u8; size as usize])
                    .map_err(|e| Failure::usage(format!("--tensor-size {size}: {e}")))?;
                Some(Arc::new(t))
            }
            _ => None,
        };
        let per_request = op.per_request(args);
        // Small gradients, so that rows stay small however long the run.
        let grads: Vec<u8> = match op {
            Op::PushRows => (0..per_request * dim)
                .flat_map(|i| (1e-3 * ((i % 7) as f32 - 3.0)).to_le_bytes())
                .collect(),
            _ => Vec::new(),
        };
        let grads = Arc::new(
            Tensor::from_bytes(DType::U8, &[grads.len() as u64], grads)
                .map_err(|e| Failure::usage(format!("gradients: {e}")))?,
        );
        Ok(Load {
            op,
            addr,
            ping_size: args.size,
            per_request,
            variables: args.variables,
            next: 0,
            push,
            table: args.table,
            row_dims: [dim as u64],
            id_range: args.id_range,
            drawn: 0,
            row_ids: Vec::with_capacity(if op.rows() { per_request } else { 0 }),
            grads,
        })
    }

    /// Bytes of one row.
    fn row_bytes(&self) -> u64 {
        self.row_dims[0] * 4
    }

    /// Draws the next rows request's ids into `row_ids`.
    fn draw_rows(&mut self) {
        self.row_ids.clear();
        for _ in 0..self.per_request {
            self.row_ids.push(row_id(self.drawn, self.id_range));
            self.drawn += 1;
        }
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
            Op::PullRows => {
                self.draw_rows();
                let rows = Rows::new(self.table, DType::F32, &self.row_dims, &self.row_ids);
                h.pull_rows(self.addr, &[rows], deadline).map(|t| t.tag())
            }
            Op::PushRows => {
                self.draw_rows();
                let rows = Rows::new(self.table, DType::F32, &self.row_dims, &self.row_ids);
                h.push_rows_shared(self.addr, &[(rows, self.grads.clone())], deadline)
                    .map(|t| t.tag())
            }
        }
    }

    /// What an answer moved.
    fn tally(&self, reply: &Reply) -> Tally {
        let mut t = Tally::default();
        let remote = |s: Status| Some(Error::new(ErrorKind::Remote(s)));
        match (self.op, reply) {
            (Op::Ping, Reply::Pong { payload, .. }) => t.bytes = u64::from(*payload),
            (Op::Pull, Reply::Pulled(items))
            | (Op::Recv | Op::FusedRecv, Reply::Received(items)) => {
                for item in items {
                    match item {
                        Ok(tensor) => {
                            t.items += 1;
                            t.bytes += tensor.byte_len() as u64;
                        }
                        Err(s) => t.failure = t.failure.or(remote(*s)),
                    }
                }
            }
            (Op::Push, Reply::Pushed(statuses)) => {
                let size = self.push.as_ref().map_or(0, |t| t.byte_len() as u64);
                for &s in statuses {
                    if s == Status::Ok {
                        t.items += 1;
                        t.bytes += size;
                    } else {
                        t.failure = t.failure.or(remote(s));
                    }
                }
            }
            (Op::PullRows, Reply::Rows(rows)) => match rows.block(0) {
                Ok(block) if rows.len() == 1 => {
                    t.items = self.per_request as u64;
                    t.bytes = block.byte_len() as u64;
                    t.missing = rows.missing(0).len() as u64;
                }
                Ok(_) => t.failure = Some(Error::new(ErrorKind::Protocol)),
                Err(s) => t.failure = remote(s),
            },
            (Op::PushRows, Reply::Pushed(statuses)) => match statuses[..] {
                [Status::Ok] => {
                    t.items = self.per_request as u64;
                    t.bytes = self.per_request as u64 * self.row_bytes();
                }
                [s] => t.failure = remote(s),
                _ => t.failure = Some(Error::new(ErrorKind::Protocol)),
            },
            (_, other) => {
                log::warn!("unexpected reply: {other:?}");
                t.failure = Some(Error::new(ErrorKind::Protocol));
            }
        }
        t
    }
}

/// A `commctl serve` started by bench; stopped (SIGTERM) when dropped.
struct Spawned {
    child: Child,
    addr: SocketAddr,
}

impl Spawned {
    fn start(args: &BenchArgs, dim: usize) -> Result<Spawned, Failure> {
        let exe = std::env::current_exe()
            .map_err(|e| Failure::usage(format!("cannot find the commctl binary: {e}")))?;
        let mut child = Command::new(exe)
            .args(["serve", "--listen", "127.0.0.1:0", "--loops"])
            .arg(args.server_loops.to_string())
            .arg("--tensors")
            .arg(args.variables.to_string())
            .arg("--tensor-size")
            .arg(args.tensor_size.to_string())
            .arg("--table")
            .arg(args.table.to_string())
            .arg("--dim")
            .arg(dim.to_string())
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
    /// Tensors, or rows for the rows operations.
    items: u64,
    bytes: u64,
    /// Rows the server did not have (pull-rows).
    missing: u64,
    errors: Vec<(Error, u64)>,
    elapsed: Duration,
    latency: Histogram<u64>,
    client_cpu: Duration,
    server_cpu: Option<Duration>,
    /// The client loops' accounting over the run.
    client_loops: LoopTime,
    fatal: Option<Failure>,
}

/// Where loops' time went over a run (their [`Stats`](starwire::Stats) counters).
#[derive(Debug, Default, Clone, Copy, Serialize)]
struct LoopTime {
    busy_seconds: f64,
    spin_seconds: f64,
    parked_seconds: f64,
    parks: u64,
}

impl LoopTime {
    /// The loops' time between two snapshots of their counters.
    fn between(before: &starwire::Stats, after: &starwire::Stats) -> LoopTime {
        let secs = |a: Duration, b: Duration| b.saturating_sub(a).as_secs_f64();
        LoopTime {
            busy_seconds: secs(before.busy, after.busy),
            spin_seconds: secs(before.spin, after.spin),
            parked_seconds: secs(before.parked, after.parked),
            parks: after.parks.saturating_sub(before.parks),
        }
    }
}

/// The operation, and the f32 per row of rows requests (and of the server bench starts).
fn check_args(args: &BenchArgs) -> Result<(Op, usize), Failure> {
    let Some(op) = Op::parse(&args.operation) else {
        return Err(Failure::usage(format!(
            "-o {}: unknown operation (supported: {})",
            args.operation,
            OPERATIONS.join(", ")
        )));
    };
    if op.rows() {
        if !(1..=MAX_ROWS_PER_REQUEST).contains(&args.tensors) {
            return Err(Failure::usage(format!(
                "-k {}: expected 1 to {MAX_ROWS_PER_REQUEST} rows per request",
                args.tensors
            )));
        }
    } else if !(1..=MAX_PER_REQUEST).contains(&args.tensors) {
        return Err(Failure::usage(format!(
            "-k {}: expected 1 to {MAX_PER_REQUEST} tensors per request",
            args.tensors
        )));
    }
    let dim = match (args.dim, args.row_bytes) {
        (Some(_), Some(_)) => {
            return Err(Failure::usage(
                "--dim and --row-bytes say the same thing: give one",
            ))
        }
        (Some(d), None) => d,
        (None, Some(b)) if b % 4 == 0 => usize::try_from(b / 4).unwrap_or(usize::MAX),
        (None, Some(b)) => {
            return Err(Failure::usage(format!(
                "--row-bytes {b}: rows are f32, expected a multiple of 4"
            )))
        }
        (None, None) => DEFAULT_DIM,
    };
    if !(1..=MAX_DIM).contains(&dim) {
        return Err(Failure::usage(format!(
            "rows of {dim} f32: expected 1 to {MAX_DIM} (--dim, or --row-bytes 4 to {})",
            MAX_DIM * 4
        )));
    }
    if args.id_range == 0 {
        return Err(Failure::usage("--id-range 0: expected at least 1 id"));
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
    Ok((op, dim))
}

/// Runs `commctl bench`.
pub fn run(args: &BenchArgs) -> Result<i32, Failure> {
    let (op, dim) = check_args(args)?;
    let signals = signals::take()?;
    let timeout = Duration::from_secs_f64(args.timeout);
    let (spawned, label, addr) = match &args.target {
        Some(t) => {
            let t = target::resolve(t, &args.cluster_opts())?;
            (None, t.label, t.addr)
        }
        None => {
            let s = Spawned::start(args, dim)?;
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
    let watcher = Watcher::start(signals, std::thread::current());
    let mut h = rt.handle(args.inflight.max(args.connections));
    let mut load = Load::new(op, addr, args, dim)?;

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
    let loops0 = rt.stats();
    let server0 = server_pid.and_then(cpu::of_pid);
    let start = Instant::now();
    let end = duration.map(|d| start + d);
    let mut inflight: HashMap<u64, Instant> = HashMap::with_capacity(args.inflight * 2);
    let mut submitted = 0u64;
    let mut o = Outcome {
        ok: 0,
        failed: 0,
        items: 0,
        bytes: 0,
        missing: 0,
        errors: Vec::new(),
        elapsed: Duration::ZERO,
        latency: latency_histogram(),
        client_cpu: Duration::ZERO,
        server_cpu: None,
        client_loops: LoopTime::default(),
        fatal: None,
    };
    let mut last_draw = start;
    let mut last_ok = 0u64;
    let mut last_bytes = 0u64;
    let mut window = latency_histogram();
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
        let failure = match &c.result {
            Ok(reply) => {
                let t = load.tally(reply);
                o.items += t.items;
                o.bytes += t.bytes;
                o.missing += t.missing;
                t.failure
            }
            Err(e) => Some(e.clone()),
        };
        // Its vectors serve the next requests: a steady run allocates only what answers
        // bring in.
        h.recycle(c);
        match failure {
            None => {
                o.ok += 1;
                record(&mut o.latency, done - sent);
                if progress {
                    record(&mut window, done - sent);
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
                fmt_ms(quantile(&window, 0.5)),
                fmt_ms(quantile(&window, 0.99)),
                o.failed
            );
            last_draw = done;
            last_ok = o.ok;
            last_bytes = o.bytes;
            window.reset();
        }
    }
    o.elapsed = start.elapsed();
    o.client_cpu = cpu::own().saturating_sub(cpu0);
    o.client_loops = LoopTime::between(&loops0, &rt.stats());
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
        json(args, (op, dim), &label, &o) + "\n"
    } else {
        table(args, (op, dim), &label, &server_note, &o)
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

/// An empty latency histogram: 1 ns to [`LATENCY_MAX_NS`], [`LATENCY_DIGITS`] digits.
fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_NS, LATENCY_DIGITS)
        .expect("the latency histogram's bounds are valid")
}

/// Adds a latency; one longer than [`LATENCY_MAX_NS`] counts as that.
fn record(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
}

/// The `q` quantile (0 to 1) of the latencies; zero when there are none.
fn quantile(h: &Histogram<u64>, q: f64) -> Duration {
    Duration::from_nanos(h.value_at_quantile(q))
}

fn rate(o: &Outcome) -> f64 {
    o.ok as f64 / o.elapsed.as_secs_f64().max(1e-9)
}

fn gbps(o: &Outcome) -> f64 {
    o.bytes as f64 / o.elapsed.as_secs_f64().max(1e-9) / 1e9
}

fn item_rate(o: &Outcome) -> f64 {
    o.items as f64 / o.elapsed.as_secs_f64().max(1e-9)
}

/// CPU nanoseconds per row (or tensor) moved; `None` when nothing moved.
fn ns_per_item(cpu: Duration, o: &Outcome) -> Option<f64> {
    (o.items > 0).then(|| cpu.as_secs_f64() * 1e9 / o.items as f64)
}

fn pct_of_wall(cpu: Duration, o: &Outcome) -> f64 {
    cpu.as_secs_f64() * 100.0 / o.elapsed.as_secs_f64().max(1e-9)
}

fn table(
    args: &BenchArgs,
    (op, dim): (Op, usize),
    label: &str,
    server_note: &str,
    o: &Outcome,
) -> String {
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
        Op::PullRows | Op::PushRows => format!(
            "{} of {} B per request (table {}, ids in 0..{})",
            plural(args.tensors, "row"),
            dim * 4,
            args.table,
            args.id_range
        ),
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
            (Op::PullRows | Op::PushRows, ErrorKind::Remote(Status::NotFound)) => {
                " (--table must be one the server serves)"
            }
            (Op::PullRows | Op::PushRows, ErrorKind::Remote(Status::InvalidArgument)) => {
                " (--dim or --row-bytes must fit the server's table)"
            }
            _ => "",
        };
        row("", format!("{n} x {e}{hint}"));
    }
    row("rate", format!("{:.0} req/s", rate(o)));
    let dir = if matches!(op, Op::Push | Op::PushRows) {
        "sent"
    } else {
        "received"
    };
    if op == Op::Ping {
        row("payload", format!("{:.3} GB/s each way", gbps(o)));
    } else if op.rows() {
        let missing = if o.missing > 0 {
            format!(" ({} missing: read as zeros)", o.missing)
        } else {
            String::new()
        };
        row(
            "rows",
            format!(
                "{} in all, {:.0} rows/s, {} B{missing}",
                o.items,
                item_rate(o),
                o.bytes
            ),
        );
        row(
            "bandwidth",
            format!("{:.3} GB/s of row bytes {dir}", gbps(o)),
        );
    } else {
        row(
            "tensors",
            format!(
                "{} in all, {:.0} tensors/s, {} B",
                o.items,
                item_rate(o),
                o.bytes
            ),
        );
        row(
            "bandwidth",
            format!("{:.3} GB/s of tensor bytes {dir}", gbps(o)),
        );
    }
    // Rows operations: CPU time per row too.
    let per_row = |cpu: Duration| match ns_per_item(cpu, o) {
        Some(ns) if op.rows() => format!("; {ns:.0} ns per row"),
        _ => String::new(),
    };
    let l = &o.latency;
    row(
        "latency",
        format!(
            "p50 {} ms, p99 {} ms, p999 {} ms, max {} ms",
            fmt_ms(quantile(l, 0.5)),
            fmt_ms(quantile(l, 0.99)),
            fmt_ms(quantile(l, 0.999)),
            fmt_ms(Duration::from_nanos(l.max()))
        ),
    );
    row(
        "client CPU",
        format!(
            "{:.2} s ({:.0}% of one CPU{})",
            o.client_cpu.as_secs_f64(),
            pct_of_wall(o.client_cpu, o),
            per_row(o.client_cpu)
        ),
    );
    row(
        "server CPU",
        match o.server_cpu {
            Some(c) => format!(
                "{:.2} s ({:.0}% of one CPU{})",
                c.as_secs_f64(),
                pct_of_wall(c, o),
                per_row(c)
            ),
            None => "unknown (give --server-pid)".into(),
        },
    );
    let t = o.client_loops;
    row(
        "loop time",
        format!(
            "client loops: busy {:.2} s, idle awake {:.2} s, parked {:.2} s, {} parks",
            t.busy_seconds, t.spin_seconds, t.parked_seconds, t.parks
        ),
    );
    s
}

/// The JSON report. Rows operations have `table`, `rows_per_request`, `row_bytes`,
/// `id_range`, `rows`, `missing`, `rows_per_second` and CPU nanoseconds per row where the
/// tensor operations have their `tensors...` members; pings have neither. Members in this
/// order; the ones a report does not have are left out.
#[derive(Serialize)]
struct Report<'a> {
    operation: &'a str,
    target: &'a str,
    server_started_by_bench: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    table: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rows_per_request: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    row_bytes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id_range: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_bytes: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tensors_per_request: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tensor_bytes: Option<u64>,
    inflight: usize,
    connections: usize,
    client_loops: usize,
    seconds: f64,
    ok: u64,
    failed: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    rows: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    missing: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tensors: Option<u64>,
    bytes: u64,
    errors: Vec<ErrorCount>,
    requests_per_second: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    rows_per_second: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tensors_per_second: Option<f64>,
    gigabytes_per_second: f64,
    latency_ms: LatencyMs,
    client_cpu_seconds: f64,
    /// `null` when unknown.
    server_cpu_seconds: Option<f64>,
    /// Rows operations only; `null` when nothing moved.
    #[serde(skip_serializing_if = "Option::is_none")]
    client_cpu_ns_per_row: Option<Option<u64>>,
    /// Rows operations only; `null` when unknown or nothing moved.
    #[serde(skip_serializing_if = "Option::is_none")]
    server_cpu_ns_per_row: Option<Option<u64>>,
    /// The client loops' time: working, idle awake, parked, and their parks.
    client_loop_time: LoopTime,
}

/// One kind of failure and how often it happened.
#[derive(Serialize)]
struct ErrorCount {
    error: String,
    count: u64,
}

/// Latency percentiles, in milliseconds.
#[derive(Serialize)]
struct LatencyMs {
    min: f64,
    mean: f64,
    p50: f64,
    p99: f64,
    p999: f64,
    max: f64,
}

fn json(args: &BenchArgs, (op, dim): (Op, usize), label: &str, o: &Outcome) -> String {
    // Nanosecond precision is all there is; more digits are float noise.
    let r6 = |x: f64| (x * 1e6).round() / 1e6;
    let r1 = |x: f64| (x * 10.0).round() / 10.0;
    let ms = |ns: f64| r6(ns / 1e6);
    let l = &o.latency;
    let rows = op.rows();
    // Pings carry no tensors: their reports have no tensor members.
    let tensors = !rows && op != Op::Ping;
    let per_row = |cpu: Option<Duration>| {
        rows.then(|| {
            cpu.and_then(|c| ns_per_item(c, o))
                .map(|ns| ns.round() as u64)
        })
    };
    let report = Report {
        operation: &args.operation,
        target: label,
        server_started_by_bench: args.target.is_none(),
        table: rows.then_some(args.table),
        rows_per_request: rows.then(|| op.per_request(args)),
        row_bytes: rows.then_some(dim * 4),
        id_range: rows.then_some(args.id_range),
        payload_bytes: (!rows).then_some(args.size),
        tensors_per_request: tensors.then(|| op.per_request(args)),
        tensor_bytes: tensors.then_some(args.tensor_size),
        inflight: args.inflight,
        connections: args.connections,
        client_loops: args.loops,
        seconds: r6(o.elapsed.as_secs_f64()),
        ok: o.ok,
        failed: o.failed,
        rows: rows.then_some(o.items),
        missing: rows.then_some(o.missing),
        tensors: tensors.then_some(o.items),
        bytes: o.bytes,
        errors: o
            .errors
            .iter()
            .map(|(e, n)| ErrorCount {
                error: e.to_string(),
                count: *n,
            })
            .collect(),
        requests_per_second: r1(rate(o)),
        rows_per_second: rows.then(|| r1(item_rate(o))),
        tensors_per_second: tensors.then(|| r1(item_rate(o))),
        gigabytes_per_second: r6(gbps(o)),
        latency_ms: LatencyMs {
            min: ms(l.min() as f64),
            mean: ms(l.mean()),
            p50: ms(l.value_at_quantile(0.5) as f64),
            p99: ms(l.value_at_quantile(0.99) as f64),
            p999: ms(l.value_at_quantile(0.999) as f64),
            max: ms(l.max() as f64),
        },
        client_cpu_seconds: r6(o.client_cpu.as_secs_f64()),
        server_cpu_seconds: o.server_cpu.map(|c| r6(c.as_secs_f64())),
        client_cpu_ns_per_row: per_row(Some(o.client_cpu)),
        server_cpu_ns_per_row: per_row(o.server_cpu),
        client_loop_time: LoopTime {
            busy_seconds: r6(o.client_loops.busy_seconds),
            spin_seconds: r6(o.client_loops.spin_seconds),
            parked_seconds: r6(o.client_loops.parked_seconds),
            parks: o.client_loops.parks,
        },
    };
    serde_json::to_string(&report).expect("the report serializes")
}
