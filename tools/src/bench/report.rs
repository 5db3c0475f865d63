//! What a run measured, and its report: a table for people, JSON for scripts.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use starwire::{Error, ErrorKind, Status};

use super::load::Op;
use crate::cli::BenchArgs;
use crate::cpu::{self, Fit};
use crate::exit::Failure;
use crate::ping::fmt_ms;

/// Longest latency told apart from longer ones: a day (more than any timeout), in ns.
const LATENCY_MAX_NS: u64 = 86_400 * 1_000_000_000;
/// Significant digits of the latency histogram: 3, within 0.1%.
const LATENCY_DIGITS: u8 = 3;

/// What a run did: the operation, the f32 per row of rows requests, and for those the
/// table they worked on.
pub(super) struct Run {
    pub op: Op,
    pub dim: usize,
    pub working_set: Option<WorkingSet>,
    /// A `--versioned` pull-rows run.
    pub versioned: Option<Versioned>,
}

/// How a `--versioned` run pulled: the share of each pull's rows pushed to first, the rows
/// each push sent, and the rows whose version bench learned before the clock started.
pub(super) struct Versioned {
    pub changed: f64,
    pub rows_per_push: u64,
    pub known: u64,
}

/// The rows a rows run drew its ids from, the table's bytes for them, and where those fit
/// among the CPU's caches.
pub(super) struct WorkingSet {
    /// Ids were drawn from `0..rows`.
    pub rows: u64,
    /// Zipf's exponent, for skewed ids.
    pub zipf: Option<f64>,
    /// The table's bytes per row, and for `rows`.
    pub per_row: u64,
    pub bytes: u64,
    /// What table the bytes are reckoned for.
    pub table: String,
    pub fit: Fit,
    pub fit_text: String,
}

impl WorkingSet {
    /// `uniform` or `zipf 1.1`.
    fn draw(&self) -> String {
        match self.zipf {
            Some(s) => format!("zipf {s}"),
            None => "uniform".into(),
        }
    }
}

/// What a run measured.
pub(super) struct Outcome {
    pub ok: u64,
    pub failed: u64,
    /// Tensors, or rows for the rows operations.
    pub items: u64,
    pub bytes: u64,
    /// Rows the server did not have (pull-rows).
    pub missing: u64,
    /// Rows that came unchanged, their bytes not sent (`--versioned`).
    pub unchanged: u64,
    /// Pushes made so that rows come back changed (`--changed`), not counted in `ok`.
    pub pushes: u64,
    pub errors: Vec<(Error, u64)>,
    pub elapsed: Duration,
    pub latency: Histogram<u64>,
    pub client_cpu: Duration,
    pub server_cpu: Option<Duration>,
    /// The client loops' accounting over the run.
    pub client_loops: LoopTime,
    pub fatal: Option<Failure>,
}

/// Where loops' time went over a run (their [`Stats`](starwire::Stats) counters).
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub(super) struct LoopTime {
    busy_seconds: f64,
    spin_seconds: f64,
    parked_seconds: f64,
    parks: u64,
}

impl LoopTime {
    /// The loops' time between two snapshots of their counters.
    pub(super) fn between(before: &starwire::Stats, after: &starwire::Stats) -> LoopTime {
        let secs = |a: Duration, b: Duration| b.saturating_sub(a).as_secs_f64();
        LoopTime {
            busy_seconds: secs(before.busy, after.busy),
            spin_seconds: secs(before.spin, after.spin),
            parked_seconds: secs(before.parked, after.parked),
            parks: after.parks.saturating_sub(before.parks),
        }
    }
}

/// An empty latency histogram: 1 ns to [`LATENCY_MAX_NS`], [`LATENCY_DIGITS`] digits.
pub(super) fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_NS, LATENCY_DIGITS)
        .expect("the latency histogram's bounds are valid")
}

/// Adds a latency; one longer than [`LATENCY_MAX_NS`] counts as that.
pub(super) fn record(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
}

/// The `q` quantile (0 to 1) of the latencies; zero when there are none.
pub(super) fn quantile(h: &Histogram<u64>, q: f64) -> Duration {
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

pub(super) fn table(
    args: &BenchArgs,
    run: &Run,
    label: &str,
    server_note: &str,
    o: &Outcome,
) -> String {
    let (op, dim) = (run.op, run.dim);
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
        Op::PullRows | Op::PushRows => {
            let (rows, draw) = run
                .working_set
                .as_ref()
                .map_or((0, String::new()), |w| (w.rows, w.draw()));
            let versioned = match &run.versioned {
                Some(v) => format!(
                    ", versioned, {:.0} % of each pull's rows pushed to just before it",
                    v.changed * 100.0
                ),
                None => String::new(),
            };
            format!(
                "{} of {} B per request (table {}, ids in 0..{rows}, {draw}){versioned}",
                plural(args.tensors, "row"),
                dim * 4,
                args.table,
            )
        }
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
    if let Some(w) = &run.working_set {
        row(
            "working set",
            format!(
                "{} rows, {} as {} ({} B a row): {}{}",
                w.rows,
                cpu::fmt_bytes(w.bytes),
                w.table,
                w.per_row,
                w.fit_text,
                if w.zipf.is_some() {
                    "; with skewed ids most requests touch far fewer rows"
                } else {
                    ""
                }
            ),
        );
    }
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
    if o.ok == 0 {
        // Rates, latencies and CPU shares of nothing would be numbers without a meaning.
        row(
            "result",
            "no request succeeded: no rate, latency or CPU figures".into(),
        );
        return s;
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
        if let Some(v) = &run.versioned {
            let sent = o.items.saturating_sub(o.unchanged);
            let none = if v.known == 0 {
                "; the target gave no row a version, so every row is sent"
            } else {
                ""
            };
            row(
                "versions",
                format!(
                    "{} rows came unchanged (not sent), {sent} sent ({:.1} % of the rows \
                     pulled); {} pushes of {} rows between pulls{none}",
                    o.unchanged,
                    sent as f64 * 100.0 / o.items.max(1) as f64,
                    o.pushes,
                    v.rows_per_push
                ),
            );
        }
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
/// `id_range` and `table_rows` (both the rows ids are drawn from), `zipf` (`null` for
/// uniform ids), `working_set_bytes`, `fits_in` (`l2`, `llc`, `memory` or `unknown`),
/// `rows`, `missing`, `rows_per_second` and CPU nanoseconds per row where the tensor
/// operations have their `tensors...` members; pings have neither. `--versioned` runs
/// also have `changed_fraction`, `rows_with_versions` (learned before the clock started),
/// `rows_unchanged`, `rows_sent` and `pushes` (of `rows_per_push` rows each). Members in
/// this order; the ones a report does not have are left out. `latency_ms` is `null` when no
/// request succeeded.
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
    table_rows: Option<u64>,
    /// Rows operations only; `null` for uniform ids.
    #[serde(skip_serializing_if = "Option::is_none")]
    zipf: Option<Option<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    working_set_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fits_in: Option<&'static str>,
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
    changed_fraction: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rows_with_versions: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rows_unchanged: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rows_sent: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pushes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rows_per_push: Option<u64>,
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
    /// `null` when no request succeeded (nothing was measured).
    latency_ms: Option<LatencyMs>,
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

pub(super) fn json(args: &BenchArgs, run: &Run, label: &str, o: &Outcome) -> String {
    let (op, dim) = (run.op, run.dim);
    let ws = run.working_set.as_ref();
    let v = run.versioned.as_ref();
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
        id_range: ws.map(|w| w.rows),
        table_rows: ws.map(|w| w.rows),
        zipf: ws.map(|w| w.zipf),
        working_set_bytes: ws.map(|w| w.bytes),
        fits_in: ws.map(|w| w.fit.name()),
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
        changed_fraction: v.map(|v| v.changed),
        rows_with_versions: v.map(|v| v.known),
        rows_unchanged: v.map(|_| o.unchanged),
        rows_sent: v.map(|_| o.items.saturating_sub(o.unchanged)),
        pushes: v.map(|_| o.pushes),
        rows_per_push: v.map(|v| v.rows_per_push),
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
        latency_ms: (o.ok > 0).then(|| LatencyMs {
            min: ms(l.min() as f64),
            mean: ms(l.mean()),
            p50: ms(l.value_at_quantile(0.5) as f64),
            p99: ms(l.value_at_quantile(0.99) as f64),
            p999: ms(l.value_at_quantile(0.999) as f64),
            max: ms(l.max() as f64),
        }),
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
