//! wirebench: the same workloads over starwire, gRPC (tonic + prost) and raw blocking
//! sockets, in one invocation, with the same pinning, side by side.
//!
//! Each server runs in a child process of its own (this program with `--serve KIND`),
//! pinned to CPU 0; the clients run in this process, pinned to CPU 1. Every workload runs
//! `--runs` times for `--seconds` each; within a round the kinds take turns, so that load
//! from elsewhere falls on all of them alike. Medians are reported, with the ratios
//! starwire/gRPC, starwire/gRPC-packed and starwire/raw.
//!
//! Every run also measures the CPU time of each end, all threads of each: of the server's
//! process, and of this process (which runs nothing but the clients meanwhile), over the
//! run's load: from when its connections are up to when its last request is answered,
//! before they close (see `cpu.rs`). A second table gives the medians of the runs' CPU
//! time per request (per step for `step-*`), per row where a workload moves rows (where it
//! has a rows/s), and as CPUs busy (CPU seconds over wall seconds). The clients' CPU time
//! includes wirebench's own work a request: ids drawn, replies checked, latencies recorded.
//!
//! The kinds: `starwire`, `grpc`, `grpc-packed` (gRPC with a rows request's rows in one
//! `bytes` block rather than one `bytes` each; the rows workloads only) and `raw`.
//!
//! The rows workloads read and write one table, the same on every kind's server:
//! `--table-rows N` rows (default 65,536) held by `--table flat` (a plain array: what the
//! transport costs, and nothing else), `ps` (starwire's `PsTable`: a hash probe and a copy
//! a row pulled, a read-modify-write a row pushed) or `mem` (starwire's small `MemTable`).
//! The report says the table's size and whether it fits in the CPU's caches.

mod common;
mod cpu;
mod grpc;
#[path = "../../../examples/sparse_training/model.rs"]
mod model;
mod raw;
mod sw;

use common::*;
use starwire_tools::cpu::{caches as cpu_caches, describe_fit, fit, fmt_bytes, Fit};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

/// The same workloads over starwire, gRPC and raw sockets, side by side.
#[derive(argh::FromArgs)]
struct Args {
    /// runs of every workload (default 5); medians are reported
    #[argh(option, default = "5")]
    runs: usize,
    /// seconds per run (default 2)
    #[argh(option, default = "2.0")]
    seconds: f64,
    /// workloads to run, comma-separated (default: all; see --list)
    #[argh(option)]
    only: Option<String>,
    /// kinds to run, comma-separated (default starwire,grpc,grpc-packed,raw)
    #[argh(option)]
    kinds: Option<String>,
    /// one short run of everything, to check that it works
    #[argh(switch)]
    quick: bool,
    /// print one JSON document instead of the table
    #[argh(switch)]
    json: bool,
    /// list the workloads and exit
    #[argh(switch)]
    list: bool,
    /// internal: serve KIND on loopback and print its address
    #[argh(option)]
    serve: Option<String>,
    /// the rows workloads' table: flat (a plain array), ps (starwire's PsTable) or mem
    /// (its MemTable) (default flat)
    #[argh(option, default = "String::from(\"flat\")")]
    table: String,
    /// rows of the rows workloads' table, a power of two from 1024 to 2^31 (default 65536)
    #[argh(option, default = "TABLE_ROWS")]
    table_rows: u64,
}

impl Args {
    /// The rows workloads' table, checked.
    fn table(&self) -> Result<TableConfig, String> {
        let kind = TableKind::parse(&self.table)
            .ok_or_else(|| format!("--table {}: expected flat, ps or mem", self.table))?;
        let rows = self.table_rows;
        if !(rows.is_power_of_two() && (MIN_TABLE_ROWS..=MAX_TABLE_ROWS).contains(&rows)) {
            return Err(format!(
                "--table-rows {rows}: expected a power of two from {MIN_TABLE_ROWS} to \
                 {MAX_TABLE_ROWS}"
            ));
        }
        Ok(TableConfig { kind, rows })
    }
}

fn workloads(table_rows: u64) -> Vec<Workload> {
    let w = |name: &str, op, inflight, connections, rows| Workload {
        name: name.into(),
        op,
        inflight,
        connections,
        rows,
        table_rows,
    };
    vec![
        w("ping-1", Op::Ping, 1, 1, 0),
        w("ping-64", Op::Ping, 64, 1, 0),
        w("pull-1", Op::Pull, 1, 1, IDS),
        w("pull-64", Op::Pull, 64, 1, IDS),
        w("push-64", Op::Push, 64, 1, IDS),
        w("pull-4m", Op::PullBig, 1, 1, 0),
        w("step-1", Op::Step, 1, 1, 0),
        w("step-4", Op::Step, 4, 1, 0),
        w("scale-8", Op::Pull, 400, 8, IDS),
        w("scale-400", Op::Pull, 400, 400, IDS),
        w("rows-pull-100", Op::RowsPull, 64, 1, 100),
        w("rows-pull-1000", Op::RowsPull, 8, 1, 1_000),
        w("rows-push-100", Op::RowsPush, 64, 1, 100),
        w("rows-push-1000", Op::RowsPush, 8, 1, 1_000),
    ]
}

fn describe(w: &Workload) -> String {
    let what = match w.op {
        Op::Ping => format!("ping of {PING_BYTES} B"),
        Op::Pull => format!("pull of {IDS} x {ROW_BYTES} B"),
        Op::Push => format!("push of {IDS} x {ROW_BYTES} B"),
        Op::PullBig => "pull of one 4 MiB tensor".into(),
        Op::Step => format!(
            "training step (sparse_training model), {} worker(s)",
            w.inflight
        ),
        Op::RowsPull => format!(
            "pull of {} rows x {ROW_BYTES} B, distinct ids sampled from {}",
            w.rows, w.table_rows
        ),
        Op::RowsPush => format!(
            "push of {} rows x {ROW_BYTES} B (f32 gradients, applied), distinct ids sampled from {}",
            w.rows, w.table_rows
        ),
    };
    if w.op == Op::Step {
        what
    } else {
        format!(
            "{what}, {} in flight over {} connection(s)",
            w.inflight, w.connections
        )
    }
}

/// Raw sockets keep one request in flight per connection: the scale workloads, which
/// compare connection counts at the same load, are run for starwire and gRPC only.
/// `grpc-packed` differs from `grpc` in the rows workloads only.
fn applies(w: &Workload, kind: Kind) -> bool {
    match kind {
        Kind::Raw => !w.name.starts_with("scale"),
        Kind::GrpcPacked => matches!(w.op, Op::RowsPull | Op::RowsPush),
        Kind::Starwire | Kind::Grpc => true,
    }
}

/// The connections `kind` runs `w` over: raw sockets open one per request in flight.
fn connections(w: &Workload, kind: Kind) -> usize {
    if kind == Kind::Raw {
        w.inflight
    } else {
        w.connections
    }
}

/// What the output says of the CPU times.
const CPU_WINDOW: &str = "srv: the server's process, cli: this process (nothing but the clients runs in it meanwhile); CPU time of all threads of each, ended ones included, over a run's load: from when its connections are up to when its last request is answered (setting up and closing left out); cli includes wirebench's own work a request (ids drawn, replies checked, latencies recorded)";

/// What the output says of the raw kind's requests in flight.
const RAW_INFLIGHT: &str = "raw: one request at a time per connection, so N in flight is N connections, each with a blocking client thread and a server thread; starwire and gRPC keep their N in flight on the workload's connection(s)";

fn main() -> ExitCode {
    let args: Args = argh::from_env();
    let table = match args.table() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("wirebench: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(kind) = &args.serve {
        return serve_child(kind, table);
    }
    if args.list {
        for w in workloads(table.rows) {
            println!("{:<14} {}", w.name, describe(&w));
        }
        return ExitCode::SUCCESS;
    }
    match coordinate(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("wirebench: {e}");
            ExitCode::from(2)
        }
    }
}

fn serve_child(kind: &str, table: TableConfig) -> ExitCode {
    pin(0);
    raise_fd_limit();
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let result = match Kind::parse(kind) {
        Some(Kind::Starwire) => sw::serve(addr, table).map(|(rt, a)| {
            std::mem::forget(rt);
            a
        }),
        Some(Kind::Grpc | Kind::GrpcPacked) => grpc::serve(addr, table),
        Some(Kind::Raw) => raw::serve(addr, table),
        None => Err(format!("unknown kind {kind:?}")),
    };
    match result {
        Ok(a) => {
            println!("LISTENING {a}");
            // Serve until the parent closes our stdin (or kills us).
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("wirebench --serve {kind}: {e}");
            ExitCode::from(2)
        }
    }
}

fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard.min(65536), hard);
    }
}

struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    fn start(kind: Kind, table: TableConfig) -> Result<Server, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut child = Command::new(exe)
            .args(["--serve", kind.name(), "--table", table.kind.name()])
            .args(["--table-rows", &table.rows.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("start the {} server: {e}", kind.name()))?;
        let mut line = String::new();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let _ = out.read_line(&mut line);
        match line.trim().strip_prefix("LISTENING ").map(str::parse) {
            Some(Ok(addr)) => Ok(Server { child, addr }),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!("the {} server did not start", kind.name()))
            }
        }
    }

    /// The server's process id.
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One run, its load's CPU time measured on `meter`; `None` if `kind` does not support
/// `w` (yet).
fn run_one(
    kind: Kind,
    w: &Workload,
    addr: SocketAddr,
    time: Duration,
    meter: &cpu::Meter,
) -> Result<Option<Sample>, String> {
    match kind {
        Kind::Starwire => sw::run(w, addr, time, meter),
        Kind::Grpc => grpc::run(w, addr, time, false, meter).map(Some),
        Kind::GrpcPacked => grpc::run(w, addr, time, true, meter).map(Some),
        Kind::Raw => raw::run(w, addr, time, meter).map(Some),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Medians of one workload over one kind.
#[derive(Clone, Default)]
struct Summary {
    rates: Vec<f64>,
    p50_ms: Vec<f64>,
    p99_ms: Vec<f64>,
    failed: u64,
    /// The kind does not support the workload (yet).
    unsupported: bool,
    /// CPU microseconds a request (a step for `step-*`) of each run: of the server's
    /// process, of this one (the clients').
    srv_us: Vec<f64>,
    cli_us: Vec<f64>,
    /// CPUs busy on average in each run (CPU seconds over wall seconds): server, clients.
    srv_cpus: Vec<f64>,
    cli_cpus: Vec<f64>,
    /// Some CPU time was read in clock ticks rather than nanoseconds.
    ticks: bool,
}

impl Summary {
    fn rate(&self) -> f64 {
        median(self.rates.clone())
    }
    /// Rows per second, where the workload moves rows.
    fn rows_rate(&self, w: &Workload) -> f64 {
        if w.rows > 0 {
            self.rate() * w.rows as f64
        } else {
            f64::NAN
        }
    }
    fn p50(&self) -> f64 {
        median(self.p50_ms.clone())
    }
    fn p99(&self) -> f64 {
        median(self.p99_ms.clone())
    }
    /// Adds a run's CPU times: `ops` requests (or steps) over `spent`.
    fn add_cpu(&mut self, spent: &cpu::Spent, ops: u64) {
        let per_op = |cpu: f64| {
            if ops > 0 {
                cpu * 1e6 / ops as f64
            } else {
                f64::NAN
            }
        };
        self.srv_us.push(per_op(spent.server));
        self.cli_us.push(per_op(spent.client));
        self.srv_cpus.push(spent.server / spent.wall);
        self.cli_cpus.push(spent.client / spent.wall);
        self.ticks |= spent.ticks;
    }
    /// Median server CPU µs a request.
    fn srv_us(&self) -> f64 {
        median(self.srv_us.clone())
    }
    /// Median client CPU µs a request.
    fn cli_us(&self) -> f64 {
        median(self.cli_us.clone())
    }
    /// Median CPUs busy in the server.
    fn srv_cpus(&self) -> f64 {
        median(self.srv_cpus.clone())
    }
    /// Median CPUs busy in the clients.
    fn cli_cpus(&self) -> f64 {
        median(self.cli_cpus.clone())
    }
    /// Median server CPU ns a row, where the workload moves rows.
    fn srv_ns_row(&self, w: &Workload) -> f64 {
        per_row(self.srv_us(), w)
    }
    /// Median client CPU ns a row, where the workload moves rows.
    fn cli_ns_row(&self, w: &Workload) -> f64 {
        per_row(self.cli_us(), w)
    }
}

/// CPU µs a request as ns a row of `w`'s requests (NaN if they carry no rows). The rows a
/// request are the same in every run, so that this of the median is the median of the
/// runs' ns a row.
fn per_row(us: f64, w: &Workload) -> f64 {
    if w.rows > 0 {
        us * 1e3 / w.rows as f64
    } else {
        f64::NAN
    }
}

fn coordinate(args: &Args) -> Result<bool, String> {
    pin(1);
    raise_fd_limit();
    let (runs, seconds) = if args.quick {
        (1, 0.3)
    } else {
        (args.runs.max(1), args.seconds)
    };
    let time = Duration::from_secs_f64(seconds);
    let table = args.table()?;
    let all = workloads(table.rows);
    let chosen: Vec<Workload> = match &args.only {
        None => all,
        Some(list) => {
            let names: Vec<&str> = list.split(',').collect();
            for n in &names {
                if !all.iter().any(|w| w.name == *n) {
                    return Err(format!("--only: unknown workload {n:?} (see --list)"));
                }
            }
            all.into_iter()
                .filter(|w| names.contains(&w.name.as_str()))
                .collect()
        }
    };
    let kinds: Vec<Kind> = match &args.kinds {
        None => Kind::ALL.to_vec(),
        Some(list) => list
            .split(',')
            .map(|k| Kind::parse(k).ok_or_else(|| format!("--kinds: unknown kind {k:?}")))
            .collect::<Result<_, _>>()?,
    };
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut results = vec![vec![Summary::default(); kinds.len()]; chosen.len()];
    for round in 0..runs {
        for k in 0..kinds.len() {
            // The kinds take turns, starting with a different one each round.
            let ki = (k + round) % kinds.len();
            let kind = kinds[ki];
            if !chosen.iter().any(|w| applies(w, kind)) {
                continue;
            }
            let server = Server::start(kind, table)?;
            for (wi, w) in chosen.iter().enumerate() {
                if !applies(w, kind) {
                    continue;
                }
                eprint!(
                    "\rround {}/{runs}: {:<14} {:<11}",
                    round + 1,
                    w.name,
                    kind.name()
                );
                let meter = cpu::Meter::new(server.pid());
                let s = run_one(kind, w, server.addr, time, &meter)
                    .map_err(|e| format!("{} over {}: {e}", w.name, kind.name()))?;
                let spent = meter.spent();
                let r = &mut results[wi][ki];
                let Some(s) = s else {
                    r.unsupported = true;
                    continue;
                };
                r.rates.push(s.rate());
                r.p50_ms.push(s.latency.quantile(0.5).as_secs_f64() * 1e3);
                r.p99_ms.push(s.latency.quantile(0.99).as_secs_f64() * 1e3);
                r.failed += s.failed;
                r.add_cpu(&spent, s.ops);
            }
            drop(server);
        }
    }
    if progress {
        eprintln!("\r{:60}", "");
    }
    let failed: u64 = results.iter().flatten().map(|s| s.failed).sum();
    let rows_run = chosen
        .iter()
        .any(|w| matches!(w.op, Op::RowsPull | Op::RowsPush));
    let table = rows_run.then(|| TableLine::of(table));
    if args.json {
        print_json(&chosen, &kinds, &results, (runs, seconds), table.as_ref());
    } else {
        print_table(&chosen, &kinds, &results, (runs, seconds), table.as_ref());
    }
    Ok(failed == 0)
}

fn ratio(
    results: &[Summary],
    kinds: &[Kind],
    a: Kind,
    b: Kind,
    f: fn(&Summary) -> f64,
) -> Option<f64> {
    let ia = kinds.iter().position(|&k| k == a)?;
    let ib = kinds.iter().position(|&k| k == b)?;
    let (x, y) = (f(&results[ia]), f(&results[ib]));
    (x.is_finite() && y.is_finite() && y > 0.0).then(|| x / y)
}

/// A ratio as the table shows it.
fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or("-".to_string(), |r| format!("{r:.2}x"))
}

/// A number as the table shows it, `-` if there is none.
fn fmt_num(x: f64, decimals: usize) -> String {
    if x.is_finite() {
        format!("{x:.decimals$}")
    } else {
        "-".into()
    }
}

/// starwire's rate over each other kind's, and its p50 over gRPC's.
fn ratios(results: &[Summary], kinds: &[Kind]) -> [Option<f64>; 4] {
    let r = |b, f| ratio(results, kinds, Kind::Starwire, b, f);
    [
        r(Kind::Grpc, Summary::rate),
        r(Kind::GrpcPacked, Summary::rate),
        r(Kind::Raw, Summary::rate),
        r(Kind::Grpc, Summary::p50),
    ]
}

/// The rows workloads' table, for the report: its kind and rows, its bytes, and where
/// they fit among the CPU's caches.
struct TableLine {
    table: TableConfig,
    bytes: u64,
    fit: Fit,
    fit_text: String,
}

impl TableLine {
    fn of(table: TableConfig) -> TableLine {
        let caches = cpu_caches();
        let bytes = table.bytes();
        TableLine {
            table,
            bytes,
            fit: fit(bytes, &caches),
            fit_text: describe_fit(bytes, &caches),
        }
    }
}

fn print_table(
    chosen: &[Workload],
    kinds: &[Kind],
    results: &[Vec<Summary>],
    (runs, seconds): (usize, f64),
    table: Option<&TableLine>,
) {
    println!("wirebench: {runs} run(s) of {seconds} s per workload and kind; medians; server on CPU 0, clients on CPU 1");
    if let Some(t) = table {
        println!(
            "rows table: {} rows x {ROW_BYTES} B, {} (`--table {}`), {}: {}",
            t.table.rows,
            match t.table.kind {
                TableKind::Flat => "a plain array",
                TableKind::Ps => "starwire's PsTable",
                TableKind::Mem => "starwire's MemTable",
            },
            t.table.kind.name(),
            fmt_bytes(t.bytes),
            t.fit_text
        );
    }
    println!();
    println!(
        "{:<14} {:<11} {:>11} {:>12} {:>9} {:>9} {:>7}   {:>8} {:>15} {:>8} {:>12}",
        "workload",
        "kind",
        "rate /s",
        "rows /s",
        "p50 ms",
        "p99 ms",
        "failed",
        "sw/grpc",
        "sw/grpc-packed",
        "sw/raw",
        "p50 sw/grpc"
    );
    for (wi, w) in chosen.iter().enumerate() {
        for (ki, kind) in kinds.iter().enumerate() {
            if !applies(w, *kind) {
                continue;
            }
            let s = &results[wi][ki];
            if s.unsupported {
                println!(
                    "{:<14} {:<11} {:>11} {:>12} {:>9} {:>9} {:>7}   not supported",
                    w.name,
                    kind.name(),
                    "-",
                    "-",
                    "-",
                    "-",
                    "-"
                );
                continue;
            }
            let mut line = format!(
                "{:<14} {:<11} {:>11} {:>12} {:>9} {:>9} {:>7}",
                w.name,
                kind.name(),
                fmt_num(s.rate(), 0),
                fmt_num(s.rows_rate(w), 0),
                fmt_num(s.p50(), 3),
                fmt_num(s.p99(), 3),
                s.failed
            );
            if *kind == Kind::Starwire {
                let [grpc, packed, raw, p50] = ratios(&results[wi], kinds).map(fmt_ratio);
                line += &format!("   {grpc:>8} {packed:>15} {raw:>8} {p50:>12}");
            }
            println!("{line}");
        }
    }
    println!();
    print_cpu_table(chosen, kinds, results);
    println!();
    println!("  rate: requests/s (steps/s for step-*); rows: rate x rows a request");
    println!("  {CPU_WINDOW}");
    println!("  µs/req: CPU µs a request (a step for step-*); ns/row: CPU ns a row, where there is a rows /s; cpus: CPU seconds over wall seconds (1.00: one CPU busy throughout)");
    if results.iter().flatten().any(|s| s.ticks) {
        println!("  some CPU times were read from /proc/<pid>/stat, in clock ticks (the CPU-time clocks could not be read): coarse");
    }
    for w in chosen {
        println!("  {:<14} {}", w.name, describe(w));
    }
    if chosen.iter().any(|w| applies(w, Kind::GrpcPacked)) {
        println!("  rows-*: grpc sends one `bytes` per row, grpc-packed one `bytes` block of all the rows (both: ids as packed `repeated uint64`); raw sends them packed");
    }
    if kinds.contains(&Kind::Raw) {
        println!("  {RAW_INFLIGHT}");
    }
    // Scale: 400 connections against 8, at the same load.
    let find = |name: &str| chosen.iter().position(|w| w.name == name);
    if let (Some(a), Some(b)) = (find("scale-400"), find("scale-8")) {
        println!();
        for (ki, kind) in kinds.iter().enumerate() {
            if !applies(&chosen[a], *kind) || results[a][ki].unsupported {
                continue;
            }
            let (x, y) = (results[a][ki].rate(), results[b][ki].rate());
            println!(
                "  scale {:<11} 400 connections: {:.2}x the throughput at 8",
                kind.name(),
                x / y
            );
        }
    }
}

/// The second table: CPU time per request, per row and as CPUs busy, for each end.
fn print_cpu_table(chosen: &[Workload], kinds: &[Kind], results: &[Vec<Summary>]) {
    println!("CPU per end, medians: srv = server, cli = clients");
    println!(
        "{:<14} {:<11} {:>11} {:>11} {:>11} {:>11} {:>9} {:>9}",
        "workload",
        "kind",
        "srv µs/req",
        "cli µs/req",
        "srv ns/row",
        "cli ns/row",
        "srv cpus",
        "cli cpus"
    );
    for (wi, w) in chosen.iter().enumerate() {
        for (ki, kind) in kinds.iter().enumerate() {
            let s = &results[wi][ki];
            if !applies(w, *kind) || s.unsupported {
                continue;
            }
            println!(
                "{:<14} {:<11} {:>11} {:>11} {:>11} {:>11} {:>9} {:>9}",
                w.name,
                kind.name(),
                fmt_num(s.srv_us(), 2),
                fmt_num(s.cli_us(), 2),
                fmt_num(s.srv_ns_row(w), 1),
                fmt_num(s.cli_ns_row(w), 1),
                fmt_num(s.srv_cpus(), 2),
                fmt_num(s.cli_cpus(), 2)
            );
        }
    }
}

fn print_json(
    chosen: &[Workload],
    kinds: &[Kind],
    results: &[Vec<Summary>],
    (runs, seconds): (usize, f64),
    table: Option<&TableLine>,
) {
    let num = json_num;
    let list = |v: &[f64]| json_list(v, 6);
    let opt = |r: Option<f64>| r.map_or("null".to_string(), |r| format!("{r:.4}"));
    let mut items = Vec::new();
    for (wi, w) in chosen.iter().enumerate() {
        for (ki, kind) in kinds.iter().enumerate() {
            if !applies(w, *kind) {
                continue;
            }
            let s = &results[wi][ki];
            items.push(format!(
                "{{\"workload\":\"{}\",\"kind\":\"{}\",\"inflight\":{},\"connections\":{},\"rows_per_request\":{},\"supported\":{},\"rate\":{},\"rows_rate\":{},\"p50_ms\":{},\"p99_ms\":{},\"failed\":{},\"rates\":[{}],{}}}",
                w.name,
                kind.name(),
                w.inflight,
                connections(w, *kind),
                w.rows,
                !s.unsupported,
                num(s.rate(), 3),
                num(s.rows_rate(w), 3),
                num(s.p50(), 6),
                num(s.p99(), 6),
                s.failed,
                list(&s.rates),
                json_cpu(s, w)
            ));
        }
        let [grpc, packed, raw, p50] = ratios(&results[wi], kinds).map(opt);
        items.push(format!(
            "{{\"workload\":\"{}\",\"ratios\":{{\"starwire_grpc\":{grpc},\"starwire_grpc_packed\":{packed},\"starwire_raw\":{raw},\"p50_starwire_grpc\":{p50}}}}}",
            w.name,
        ));
    }
    let table = table.map_or("null".to_string(), |t| {
        format!(
            "{{\"kind\":\"{}\",\"rows\":{},\"row_bytes\":{ROW_BYTES},\"bytes\":{},\"fits_in\":\"{}\"}}",
            t.table.kind.name(),
            t.table.rows,
            t.bytes,
            t.fit.name()
        )
    });
    println!(
        "{{\"runs\":{runs},\"seconds\":{seconds},\"table\":{table},\"raw_inflight\":\"{RAW_INFLIGHT}\",\"cpu\":\"{CPU_WINDOW}\",\"results\":[{}]}}",
        items.join(",")
    );
}

/// A number as JSON has it: JSON has no NaN, a missing number is null.
fn json_num(x: f64, decimals: usize) -> String {
    if x.is_finite() {
        format!("{x:.decimals$}")
    } else {
        "null".into()
    }
}

/// Numbers as the elements of a JSON list (without brackets).
fn json_list(v: &[f64], decimals: usize) -> String {
    v.iter()
        .map(|&x| json_num(x, decimals))
        .collect::<Vec<_>>()
        .join(",")
}

/// The CPU fields of a JSON result (without braces): medians, and every run's.
fn json_cpu(s: &Summary, w: &Workload) -> String {
    let num = json_num;
    let list = |v: &[f64]| json_list(v, 4);
    format!(
        "\"srv_us_per_req\":{},\"cli_us_per_req\":{},\"srv_ns_per_row\":{},\"cli_ns_per_row\":{},\"srv_cpus\":{},\"cli_cpus\":{},\"cpu_in_ticks\":{},\"srv_us_per_req_runs\":[{}],\"cli_us_per_req_runs\":[{}],\"srv_cpus_runs\":[{}],\"cli_cpus_runs\":[{}]",
        num(s.srv_us(), 4),
        num(s.cli_us(), 4),
        num(s.srv_ns_row(w), 3),
        num(s.cli_ns_row(w), 3),
        num(s.srv_cpus(), 4),
        num(s.cli_cpus(), 4),
        s.ticks,
        list(&s.srv_us),
        list(&s.cli_us),
        list(&s.srv_cpus),
        list(&s.cli_cpus)
    )
}
