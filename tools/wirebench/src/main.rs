//! wirebench: the same workloads over starwire, gRPC (tonic + prost) and raw blocking
//! sockets, in one invocation, with the same pinning, side by side.
//!
//! Each server runs in a child process of its own (this program with `--serve KIND`),
//! pinned to CPU 0; the clients run in this process, pinned to CPU 1. Every workload runs
//! `--runs` times for `--seconds` each; within a round the kinds take turns, so that load
//! from elsewhere falls on all of them alike. Medians are reported, with the ratios
//! starwire/gRPC and starwire/raw.

mod common;
mod grpc;
#[path = "../../../examples/sparse_training/model.rs"]
mod model;
mod raw;
mod sw;

use common::*;
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
    /// kinds to run, comma-separated (default starwire,grpc,raw)
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
}

fn workloads() -> Vec<Workload> {
    let w = |name: &str, op, inflight, connections| Workload {
        name: name.into(),
        op,
        inflight,
        connections,
    };
    vec![
        w("ping-1", Op::Ping, 1, 1),
        w("ping-64", Op::Ping, 64, 1),
        w("pull-1", Op::Pull, 1, 1),
        w("pull-64", Op::Pull, 64, 1),
        w("push-64", Op::Push, 64, 1),
        w("pull-4m", Op::PullBig, 1, 1),
        w("step-1", Op::Step, 1, 1),
        w("step-4", Op::Step, 4, 1),
        w("scale-8", Op::Pull, 400, 8),
        w("scale-400", Op::Pull, 400, 400),
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
fn applies(w: &Workload, kind: Kind) -> bool {
    !(kind == Kind::Raw && w.name.starts_with("scale"))
}

fn main() -> ExitCode {
    let args: Args = argh::from_env();
    if let Some(kind) = &args.serve {
        return serve_child(kind);
    }
    if args.list {
        for w in workloads() {
            println!("{:<10} {}", w.name, describe(&w));
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

fn serve_child(kind: &str) -> ExitCode {
    pin(0);
    raise_fd_limit();
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let result = match Kind::parse(kind) {
        Some(Kind::Starwire) => sw::serve(addr).map(|(rt, a)| {
            std::mem::forget(rt);
            a
        }),
        Some(Kind::Grpc) => grpc::serve(addr),
        Some(Kind::Raw) => raw::serve(addr),
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
    fn start(kind: Kind) -> Result<Server, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut child = Command::new(exe)
            .args(["--serve", kind.name()])
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
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_one(kind: Kind, w: &Workload, addr: SocketAddr, time: Duration) -> Result<Sample, String> {
    match kind {
        Kind::Starwire => sw::run(w, addr, time),
        Kind::Grpc => grpc::run(w, addr, time),
        Kind::Raw => raw::run(w, addr, time),
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
}

impl Summary {
    fn rate(&self) -> f64 {
        median(self.rates.clone())
    }
    fn p50(&self) -> f64 {
        median(self.p50_ms.clone())
    }
    fn p99(&self) -> f64 {
        median(self.p99_ms.clone())
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
    let all = workloads();
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
        None => vec![Kind::Starwire, Kind::Grpc, Kind::Raw],
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
            let server = Server::start(kind)?;
            for (wi, w) in chosen.iter().enumerate() {
                if !applies(w, kind) {
                    continue;
                }
                eprint!(
                    "\rround {}/{runs}: {:<10} {:<9}",
                    round + 1,
                    w.name,
                    kind.name()
                );
                let s = run_one(kind, w, server.addr, time)
                    .map_err(|e| format!("{} over {}: {e}", w.name, kind.name()))?;
                let r = &mut results[wi][ki];
                r.rates.push(s.rate());
                r.p50_ms.push(s.latency.quantile(0.5).as_secs_f64() * 1e3);
                r.p99_ms.push(s.latency.quantile(0.99).as_secs_f64() * 1e3);
                r.failed += s.failed;
            }
            drop(server);
        }
    }
    if progress {
        eprintln!("\r{:60}", "");
    }
    let failed: u64 = results.iter().flatten().map(|s| s.failed).sum();
    if args.json {
        print_json(&chosen, &kinds, &results, runs, seconds);
    } else {
        print_table(&chosen, &kinds, &results, runs, seconds);
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

fn print_table(
    chosen: &[Workload],
    kinds: &[Kind],
    results: &[Vec<Summary>],
    runs: usize,
    seconds: f64,
) {
    println!("wirebench: {runs} run(s) of {seconds} s per workload and kind; medians; server on CPU 0, clients on CPU 1");
    println!();
    println!(
        "{:<10} {:<9} {:>12} {:>9} {:>9} {:>7}   {:>9} {:>9} {:>9}",
        "workload",
        "kind",
        "rate /s",
        "p50 ms",
        "p99 ms",
        "failed",
        "sw/grpc",
        "sw/raw",
        "p50 sw/grpc"
    );
    for (wi, w) in chosen.iter().enumerate() {
        for (ki, kind) in kinds.iter().enumerate() {
            if !applies(w, *kind) {
                continue;
            }
            let s = &results[wi][ki];
            let mut line = format!(
                "{:<10} {:<9} {:>12.0} {:>9.3} {:>9.3} {:>7}",
                w.name,
                kind.name(),
                s.rate(),
                s.p50(),
                s.p99(),
                s.failed
            );
            if *kind == Kind::Starwire {
                let fmt = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.2}x"));
                line += &format!(
                    "   {:>9} {:>9} {:>9}",
                    fmt(ratio(
                        &results[wi],
                        kinds,
                        Kind::Starwire,
                        Kind::Grpc,
                        Summary::rate
                    )),
                    fmt(ratio(
                        &results[wi],
                        kinds,
                        Kind::Starwire,
                        Kind::Raw,
                        Summary::rate
                    )),
                    fmt(ratio(
                        &results[wi],
                        kinds,
                        Kind::Starwire,
                        Kind::Grpc,
                        Summary::p50
                    )),
                );
            }
            println!("{line}");
        }
    }
    println!();
    for w in chosen {
        println!("  {:<10} {}", w.name, describe(w));
    }
    // Scale: 400 connections against 8, at the same load.
    let find = |name: &str| chosen.iter().position(|w| w.name == name);
    if let (Some(a), Some(b)) = (find("scale-400"), find("scale-8")) {
        println!();
        for (ki, kind) in kinds.iter().enumerate() {
            if *kind == Kind::Raw {
                continue;
            }
            let (x, y) = (results[a][ki].rate(), results[b][ki].rate());
            println!(
                "  scale {:<9} 400 connections: {:.2}x the throughput at 8",
                kind.name(),
                x / y
            );
        }
    }
}

fn print_json(
    chosen: &[Workload],
    kinds: &[Kind],
    results: &[Vec<Summary>],
    runs: usize,
    seconds: f64,
) {
    let list = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.6}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let opt = |r: Option<f64>| r.map_or("null".to_string(), |r| format!("{r:.4}"));
    let mut items = Vec::new();
    for (wi, w) in chosen.iter().enumerate() {
        for (ki, kind) in kinds.iter().enumerate() {
            if !applies(w, *kind) {
                continue;
            }
            let s = &results[wi][ki];
            items.push(format!(
                "{{\"workload\":\"{}\",\"kind\":\"{}\",\"inflight\":{},\"connections\":{},\"rate\":{:.3},\"p50_ms\":{:.6},\"p99_ms\":{:.6},\"failed\":{},\"rates\":[{}]}}",
                w.name, kind.name(), w.inflight, w.connections, s.rate(), s.p50(), s.p99(), s.failed, list(&s.rates)
            ));
        }
        items.push(format!(
            "{{\"workload\":\"{}\",\"ratios\":{{\"starwire_grpc\":{},\"starwire_raw\":{},\"p50_starwire_grpc\":{}}}}}",
            w.name,
            opt(ratio(&results[wi], kinds, Kind::Starwire, Kind::Grpc, Summary::rate)),
            opt(ratio(&results[wi], kinds, Kind::Starwire, Kind::Raw, Summary::rate)),
            opt(ratio(&results[wi], kinds, Kind::Starwire, Kind::Grpc, Summary::p50)),
        ));
    }
    println!(
        "{{\"runs\":{runs},\"seconds\":{seconds},\"results\":[{}]}}",
        items.join(",")
    );
}
