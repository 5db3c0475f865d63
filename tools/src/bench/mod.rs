//! `commctl bench`: keep N requests in flight against a server for a while; report rate,
//! bandwidth, latency percentiles and CPU time.
//!
//! Against `commctl serve` (see [`crate::serve`]): pulls ask for ids and recvs for keys
//! `t/i`, with `i` running through `0..--variables` in turn; pushes send one shared
//! tensor of `--tensor-size` bytes for each id. Rows pulls and pushes name the server's
//! rows table (`--table`) and `-k` row ids each, drawn from `0..--rows` by a fixed hash of
//! a counter ([`row_id`]), or Zipf-distributed (`--zipf S`); a rows push sends one block of
//! gradient rows. The report's header gives the working set: the table's bytes for
//! `--rows` rows, against the CPU's caches. `--versioned` rows pulls hold each row's
//! version (learned by pulling every row once before the clock starts), so unchanged rows
//! come back without their bytes; `--changed F` pushes to that share of each pull's rows
//! just before it (`versions.rs`).

mod ids;
mod load;
mod report;
mod spawned;
mod versions;

pub use ids::row_id;

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use starwire::ErrorKind;

use self::ids::Ids;
use self::load::{Load, Op, OPERATIONS};
use self::report::{json, latency_histogram, quantile, record, table, LoopTime, Outcome};
use self::report::{Run, Versioned, WorkingSet};
use self::spawned::Spawned;
use self::versions::MAX_VERSIONED_ROWS;
use crate::cli::BenchArgs;
use crate::cpu;
use crate::exit::{self, Failure};
use crate::ping::{client_config, fatal, fmt_ms, start_client};
use crate::serve::{MAX_TENSORS, MAX_TENSOR_SIZE};
use crate::signals::{self, Watcher};
use crate::table::{TableSpec, DEFAULT_DIM, DEFAULT_ROWS, MAX_DIM, MAX_ROWS};
use crate::target;

/// Default run time.
const DEFAULT_DURATION: Duration = Duration::from_secs(5);
/// Most requests in flight.
const MAX_INFLIGHT: usize = 65_536;
/// How often the progress line is redrawn.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);
/// Most tensors in one request.
const MAX_PER_REQUEST: usize = 65_536;
/// Most rows in one rows request (starwire's default `max_rows`).
const MAX_ROWS_PER_REQUEST: usize = 1 << 20;

/// The operation, the f32 per row of rows requests (and of the server bench starts), and
/// the rows their ids are drawn from.
fn check_args(args: &BenchArgs) -> Result<(Op, usize, u64), Failure> {
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
    let rows = match (args.rows, args.id_range) {
        (Some(_), Some(_)) => {
            return Err(Failure::usage(
                "--rows and --id-range say the same thing: give one",
            ))
        }
        (Some(n), None) | (None, Some(n)) => n,
        (None, None) => DEFAULT_ROWS,
    };
    if !(1..=MAX_ROWS).contains(&rows) {
        let flag = if args.rows.is_some() {
            "--rows"
        } else {
            "--id-range"
        };
        return Err(Failure::usage(format!(
            "{flag} {rows}: expected 1 to {MAX_ROWS} rows"
        )));
    }
    if let Some(s) = args.zipf {
        if !(s.is_finite() && s > 0.0) {
            return Err(Failure::usage(format!(
                "--zipf {s}: expected an exponent more than 0 (leave --zipf out for uniform ids)"
            )));
        }
    }
    if args.versioned && op != Op::PullRows {
        return Err(Failure::usage(format!(
            "--versioned: pulls of rows only (-o pull-rows, not {})",
            args.operation
        )));
    }
    if args.versioned && rows > MAX_VERSIONED_ROWS {
        return Err(Failure::usage(format!(
            "--versioned --rows {rows}: bench holds a version of each row; expected at most \
             {MAX_VERSIONED_ROWS} rows"
        )));
    }
    match args.changed {
        Some(_) if !args.versioned => {
            return Err(Failure::usage(
                "--changed: the share of rows a --versioned pull finds changed; give --versioned",
            ))
        }
        Some(f) if !(0.0..=1.0).contains(&f) => {
            return Err(Failure::usage(format!(
                "--changed {f}: expected a share of the rows from 0 to 1"
            )))
        }
        _ => {}
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
    Ok((op, dim, rows))
}

/// The table the rows requests work on, as the server bench starts has it (or as
/// `--table-kind`, `--stored` and `--optimizer` say the target's is), and where `rows` of
/// it fit among the CPU's caches.
fn working_set(args: &BenchArgs, dim: usize, rows: u64) -> WorkingSet {
    let spec = TableSpec {
        id: args.table,
        kind: args.table_kind,
        dim,
        stored: args.stored,
        optimizer: args.optimizer,
        rows,
        ..TableSpec::default()
    };
    let per_row = spec.bytes_per_row();
    let bytes = per_row.saturating_mul(rows);
    let caches = cpu::caches();
    WorkingSet {
        rows,
        zipf: args.zipf,
        per_row,
        bytes,
        table: format!(
            "a {} of {} rows with {}",
            spec.kind,
            crate::table::float_name(spec.stored),
            spec.optimizer
        ),
        fit: cpu::fit(bytes, &caches),
        fit_text: cpu::describe_fit(bytes, &caches),
    }
}

/// Runs `commctl bench`.
pub fn run(args: &BenchArgs) -> Result<i32, Failure> {
    let (op, dim, rows) = check_args(args)?;
    let signals = signals::take()?;
    let timeout = Duration::from_secs_f64(args.timeout);
    let (spawned, label, addr) = match &args.target {
        Some(t) => {
            let t = target::resolve(t, &args.cluster_opts())?;
            (None, t.label, t.addr)
        }
        None => {
            let s = Spawned::start(args, dim, rows)?;
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
    let cfg = client_config("bench", args.loops, args.connections, 2)?;
    let rt = start_client(cfg)?;
    let watcher = Watcher::start(signals, std::thread::current());
    // A --changed push goes out before each pull: room for both.
    let pushes = args.changed.is_some_and(|f| f > 0.0);
    let mut h = rt.handle(args.inflight.max(args.connections) * if pushes { 2 } else { 1 });
    let mut load = Load::new(op, addr, args, dim, Ids::new(rows, args.zipf))?;

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

    let versioned = match args.versioned {
        true => Some(Versioned {
            changed: args.changed.unwrap_or(0.0),
            rows_per_push: load.rows_per_push(),
            known: load
                .learn_versions(&mut h, timeout)
                .map_err(|e| fatal(&e, &label, addr, timeout))?,
        }),
        false => None,
    };

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
        unchanged: 0,
        pushes: 0,
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
        if inflight.is_empty() && load.pushes_in_flight() == 0 {
            if stopping || o.fatal.is_some() {
                break;
            }
            continue;
        }
        // Something is in flight, so this waits (an empty table cannot get here).
        let Ok(c) = h.wait_any() else { break };
        let done = Instant::now();
        if let Some(failure) = load.push_outcome(c.tag, &c.result) {
            // A push --changed made: counted apart from the pulls it serves, but a failed
            // one fails the run as a failed pull would.
            h.recycle(c);
            match failure {
                None => o.pushes += 1,
                Some(e) => {
                    o.failed += 1;
                    match o.errors.iter_mut().find(|(k, _)| *k == e) {
                        Some((_, n)) => *n += 1,
                        None => o.errors.push((e, 1)),
                    }
                }
            }
            continue;
        }
        let Some(sent) = inflight.remove(&c.tag) else {
            continue;
        };
        let failure = match &c.result {
            Ok(reply) => {
                let t = load.tally(c.tag, reply);
                o.items += t.items;
                o.bytes += t.bytes;
                o.missing += t.missing;
                o.unchanged += t.unchanged;
                t.failure
            }
            Err(e) => {
                load.failed(c.tag);
                Some(e.clone())
            }
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
            crate::out::err!(
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
        crate::out::err!("\r\x1b[2K");
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

    let mut out = crate::out::stdout();
    let run = Run {
        op,
        dim,
        working_set: op.rows().then(|| working_set(args, dim, rows)),
        versioned,
    };
    let text = if args.json {
        json(args, &run, &label, &o) + "\n"
    } else {
        table(args, &run, &label, &server_note, &o)
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
