//! `commctl stats`: a running task's counters and latencies per peer and operation, asked
//! with a `STATS` request (`docs/wire-format.md`, section 4.11): a table, once or refreshed
//! with rates per second, the task's JSON document, or the Prometheus text format.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::time::{Duration, Instant};

use serde::Deserialize;
use starwire::Handle;

use crate::cli::StatsArgs;
use crate::exit::Failure;
use crate::ping::{client_config, fatal, start_client};
use crate::signals::{self, Watcher};
use crate::target::{self, Target};

/// The document a task answers a stats request with (version 1).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Doc {
    /// `"starwire-stats"`.
    pub format: String,
    /// Layout version.
    pub version: u32,
    /// The answering task, `job:index`.
    pub task: String,
    /// Its totals.
    pub totals: BTreeMap<String, u64>,
    /// Per peer and role.
    pub peers: Vec<PeerDoc>,
    /// Whether peers were left out.
    pub truncated: bool,
    /// The tables the task serves that keep metrics (absent from older documents).
    pub tables: Vec<TableDoc>,
}

/// One table of a [`Doc`]: its counters since it was made, and its state when asked.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct TableDoc {
    /// The table's id.
    pub table: u32,
    /// Rows it holds.
    pub rows: u64,
    /// Bytes of rows and optimizer state.
    pub data_bytes: u64,
    /// Bytes of memory it holds (slots, index, bookkeeping).
    pub memory_bytes: u64,
    /// Bytes of that memory committed.
    pub committed_bytes: u64,
    /// Entries of its index.
    pub index_capacity: u64,
    /// Pull calls.
    pub pulls: u64,
    /// Push calls.
    pub pushes: u64,
    /// Rows pulls asked for.
    pub pulled_rows: u64,
    /// Of which it had no row for.
    pub missing: u64,
    /// Of which were answered unchanged (row versions: the version held was the row's).
    pub unchanged_rows: u64,
    /// Gradient rows pushes brought.
    pub pushed_rows: u64,
    /// Of which were dropped (a row not created, or refused).
    pub dropped_pushes: u64,
    /// Rows created.
    pub created: u64,
    /// Rows loaded (checkpoint, bulk load).
    pub loaded: u64,
    /// Ids not admitted yet (seen fewer times than needed).
    pub not_admitted: u64,
    /// New rows refused (row cap, memory).
    pub refused: u64,
    /// Rows evicted for being untouched.
    pub evicted_untouched: u64,
    /// Rows evicted over the row cap.
    pub evicted_over_cap: u64,
    /// Index builds (growth).
    pub index_builds: u64,
    /// The table's clock.
    pub clock: u64,
    /// One row in this many is sampled for the hot ids.
    pub hot_sample_every: u64,
    /// `[id, sampled]` of the hottest ids, hottest first.
    pub hot: Vec<(u64, u64)>,
}

impl TableDoc {
    /// Rows evicted, for either reason.
    pub fn evicted(&self) -> u64 {
        self.evicted_untouched + self.evicted_over_cap
    }
}

/// One peer of a [`Doc`].
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct PeerDoc {
    /// `client` or `server`.
    pub role: String,
    /// The address connected to (client role).
    pub addr: Option<String>,
    /// The peer's task, `job:index`.
    pub task: Option<String>,
    /// Connections whose handshake completed.
    pub connections: u64,
    /// Connections lost.
    pub connections_lost: u64,
    /// Connect attempts after a failed one.
    pub reconnects: u64,
    /// Per operation.
    pub ops: BTreeMap<String, OpDoc>,
}

impl PeerDoc {
    /// The peer as shown: task and address, task, or address.
    pub fn name(&self) -> String {
        match (&self.task, &self.addr) {
            (Some(t), Some(a)) => format!("{t} ({a})"),
            (Some(t), None) => t.clone(),
            (None, Some(a)) => a.clone(),
            (None, None) => "?".into(),
        }
    }

    /// The `peer` label: the address, else the task.
    fn peer_label(&self) -> String {
        self.addr
            .clone()
            .or_else(|| self.task.clone())
            .unwrap_or_default()
    }

    /// The role as shown: `sent` (requests the task sent) or `served`.
    fn role_shown(&self) -> &'static str {
        if self.role == "server" {
            "served"
        } else {
            "sent"
        }
    }
}

/// One operation of a [`PeerDoc`].
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct OpDoc {
    /// Requests started.
    pub requests: u64,
    /// Started and not ended.
    pub in_flight: u64,
    /// Ended, by outcome.
    pub outcomes: BTreeMap<String, u64>,
    /// Bytes sent.
    pub bytes_out: u64,
    /// Bytes received.
    pub bytes_in: u64,
    /// Tensors, keys or ids.
    pub tensors: u64,
    /// Embedding rows.
    pub rows: u64,
    /// Latency.
    pub latency: Latency,
}

/// The latency histogram of an [`OpDoc`].
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Latency {
    /// Values.
    pub count: u64,
    /// Their sum.
    pub sum_ns: u64,
    /// The largest.
    pub max_ns: u64,
    /// Median.
    pub p50_ns: u64,
    /// 90th percentile.
    pub p90_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// `[upper_ns, count]` of the buckets holding values.
    pub buckets: Vec<(u64, u64)>,
}

/// The outcomes, in the order of the document.
pub const OUTCOMES: [&str; 5] = ["ok", "error", "timeout", "unavailable", "refused"];

/// Parses a stats document.
pub fn parse(text: &str) -> Result<Doc, String> {
    let doc: Doc = serde_json::from_str(text).map_err(|e| format!("bad stats document: {e}"))?;
    if doc.format != "starwire-stats" {
        return Err(format!("not a stats document (format {:?})", doc.format));
    }
    Ok(doc)
}

/// Asks `target` for its document.
fn fetch(h: &mut Handle, target: &Target, timeout: Duration) -> Result<String, Failure> {
    let deadline = Some(Instant::now() + timeout);
    h.remote_stats(target.addr, deadline)
        .and_then(|t| t.wait(h))
        .map_err(|e| fatal(&e, &target.label, target.addr, timeout))
}

/// Runs `commctl stats`.
pub fn run(args: &StatsArgs) -> Result<i32, Failure> {
    if args.json && args.prometheus {
        return Err(Failure::usage(
            "give either --json or --prometheus, not both",
        ));
    }
    let signals = signals::take()?;
    let target = target::resolve(&args.target, &args.cluster_opts())?;
    let timeout = Duration::from_secs_f64(args.timeout);
    let interval = Duration::from_secs_f64(args.interval);
    let rt = start_client(client_config("stats", 1, 1, 0)?)?;
    let watcher = Watcher::start(signals, std::thread::current());
    let mut h = rt.handle(4);
    let mut out = crate::out::stdout();
    // Screen codes only for a terminal, never into a file or a pipe.
    let clear_screen = crate::out::is_terminal();
    let mut previous: Option<(Instant, Doc)> = None;
    loop {
        let text = fetch(&mut h, &target, timeout)?;
        let at = Instant::now();
        let doc = parse(&text).map_err(|m| Failure {
            code: crate::exit::TRANSPORT,
            message: format!("{}: {m}", target.label),
        })?;
        let shown = if args.json {
            format!("{}\n", text.trim_end())
        } else if args.prometheus {
            prometheus(&doc)
        } else {
            let rates = previous
                .as_ref()
                .map(|(t, d)| (d, at.saturating_duration_since(*t)));
            table(&doc, &target.label, rates)
        };
        if args.watch && !args.json && !args.prometheus {
            if clear_screen {
                // Clear the screen and go home, as watch(1) does.
                let _ = write!(out, "\x1b[H\x1b[2J");
            } else if previous.is_some() {
                // Into a file or a pipe: the tables one after the other.
                let _ = writeln!(out);
            }
        }
        let _ = out.write_all(shown.as_bytes());
        let _ = out.flush();
        // Once, or until nobody reads (`commctl stats --watch ... | head`).
        if !args.watch || crate::out::closed() {
            return Ok(crate::exit::OK);
        }
        previous = Some((at, doc));
        let until = Instant::now() + interval;
        while Instant::now() < until {
            if watcher.stopped() {
                return Ok(crate::exit::OK);
            }
            std::thread::park_timeout(until.saturating_duration_since(Instant::now()));
        }
        if watcher.stopped() {
            return Ok(crate::exit::OK);
        }
    }
}

/// Bytes in B, kB, MB or GB (powers of 1000).
pub fn fmt_bytes(n: f64) -> String {
    let units = ["B", "kB", "MB", "GB", "TB"];
    let mut v = n;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < units.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0}{}", units[u])
    } else {
        format!("{v:.1}{}", units[u])
    }
}

/// A latency in ns shown in µs, ms or s; `-` when nothing was measured (`count` 0).
pub fn fmt_ns(ns: u64, count: u64) -> String {
    let us = ns as f64 / 1000.0;
    if count == 0 {
        "-".into()
    } else if us < 1000.0 {
        format!("{us:.1}µs")
    } else if us < 1_000_000.0 {
        format!("{:.2}ms", us / 1000.0)
    } else {
        format!("{:.2}s", us / 1_000_000.0)
    }
}

/// The human table; with `rates` (the previous document and the time since), per-second
/// rates of requests and bytes.
pub fn table(doc: &Doc, label: &str, rates: Option<(&Doc, Duration)>) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "stats of {label}: task {}", doc.task);
    let t = |k: &str| doc.totals.get(k).copied().unwrap_or(0);
    // The totals' definitions (docs/wire-format.md, 4.11), in words.
    let _ = writeln!(
        s,
        "frames received {}, sent {}; bytes received {}, sent {}",
        t("frames_in"),
        t("frames_out"),
        fmt_bytes(t("bytes_in") as f64),
        fmt_bytes(t("bytes_out") as f64),
    );
    let _ = writeln!(
        s,
        "connections accepted {}, opened {} (handshake completed), lost or closed for an \
         error {}; send arenas hold {} now, {} blocks allocated; receive ring nearly empty \
         {} times",
        t("connections_accepted"),
        t("connections_opened"),
        t("connections_lost"),
        fmt_bytes(t("send_arena_bytes") as f64),
        t("send_blocks_allocated"),
        t("recv_ring_exhausted"),
    );
    let mut header = format!(
        "\n{:<6} {:<28} {:<10} {:>9} {:>5} {:>9} {:>5} {:>5} {:>5} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "ROLE", "PEER", "OP", "REQS", "INFL", "OK", "ERR", "TMO", "UNAV", "REF", "OUT", "IN",
        "p50", "p90", "p99", "max"
    );
    if rates.is_some() {
        let _ = write!(header, " {:>9} {:>10} {:>10}", "REQ/s", "OUT/s", "IN/s");
    }
    s.push_str(header.trim_end());
    s.push('\n');
    for p in &doc.peers {
        for (op, m) in &p.ops {
            let o = |k: &str| m.outcomes.get(k).copied().unwrap_or(0);
            let mut line = format!(
                "{:<6} {:<28} {:<10} {:>9} {:>5} {:>9} {:>5} {:>5} {:>5} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
                p.role_shown(),
                p.name(),
                op,
                m.requests,
                m.in_flight,
                o("ok"),
                o("error"),
                o("timeout"),
                o("unavailable"),
                o("refused"),
                fmt_bytes(m.bytes_out as f64),
                fmt_bytes(m.bytes_in as f64),
                fmt_ns(m.latency.p50_ns, m.latency.count),
                fmt_ns(m.latency.p90_ns, m.latency.count),
                fmt_ns(m.latency.p99_ns, m.latency.count),
                fmt_ns(m.latency.max_ns, m.latency.count),
            );
            if let Some((prev, dt)) = rates {
                let before = prev
                    .peers
                    .iter()
                    .find(|q| q.role == p.role && q.addr == p.addr && q.task == p.task)
                    .and_then(|q| q.ops.get(op));
                let secs = dt.as_secs_f64().max(1e-9);
                let rate = |now: u64, then: Option<u64>| {
                    now.saturating_sub(then.unwrap_or(0)) as f64 / secs
                };
                let _ = write!(
                    line,
                    " {:>9.1} {:>8}/s {:>8}/s",
                    rate(m.requests, before.map(|b| b.requests)),
                    fmt_bytes(rate(m.bytes_out, before.map(|b| b.bytes_out))),
                    fmt_bytes(rate(m.bytes_in, before.map(|b| b.bytes_in))),
                );
            }
            s.push_str(&line);
            s.push('\n');
        }
    }
    if doc.truncated {
        s.push_str("(more peers than the document holds; some are left out)\n");
    }
    tables(&mut s, doc, rates);
    s
}

/// Hot ids shown per table.
const HOT_SHOWN: usize = 5;

/// The tables' lines of the human table: per table its rows and memory, calls and rows
/// pulled and pushed, rows missing, answered unchanged, created and evicted, and its hottest
/// ids; with
/// `rates`, rows pulled and pushed per second.
fn tables(s: &mut String, doc: &Doc, rates: Option<(&Doc, Duration)>) {
    if doc.tables.is_empty() {
        return;
    }
    let mut header = format!(
        "\n{:>6} {:>11} {:>9} {:>9} {:>9} {:>11} {:>11} {:>9} {:>9} {:>9} {:>9}",
        "TABLE",
        "ROWS",
        "MEMORY",
        "PULLS",
        "PUSHES",
        "ROWS PULLED",
        "ROWS PUSHED",
        "MISSING",
        "UNCHANGED",
        "CREATED",
        "EVICTED"
    );
    if rates.is_some() {
        let _ = write!(header, " {:>11} {:>11}", "PULLED/s", "PUSHED/s");
    }
    let _ = write!(header, "  HOT IDS (sampled)");
    s.push_str(&header);
    s.push('\n');
    for t in &doc.tables {
        let _ = write!(
            s,
            "{:>6} {:>11} {:>9} {:>9} {:>9} {:>11} {:>11} {:>9} {:>9} {:>9} {:>9}",
            t.table,
            t.rows,
            fmt_bytes(t.memory_bytes as f64),
            t.pulls,
            t.pushes,
            t.pulled_rows,
            t.pushed_rows,
            t.missing,
            t.unchanged_rows,
            t.created,
            t.evicted()
        );
        if let Some((prev, dt)) = rates {
            let before = prev.tables.iter().find(|p| p.table == t.table);
            let secs = dt.as_secs_f64().max(1e-9);
            let rate =
                |now: u64, then: Option<u64>| now.saturating_sub(then.unwrap_or(0)) as f64 / secs;
            let _ = write!(
                s,
                " {:>11.0} {:>11.0}",
                rate(t.pulled_rows, before.map(|b| b.pulled_rows)),
                rate(t.pushed_rows, before.map(|b| b.pushed_rows)),
            );
        }
        s.push_str("  ");
        if t.hot.is_empty() {
            s.push('-');
        }
        for (i, (id, sampled)) in t.hot.iter().take(HOT_SHOWN).enumerate() {
            let sep = if i == 0 { "" } else { " " };
            let _ = write!(s, "{sep}{id} ({sampled})");
        }
        s.push('\n');
    }
}

/// A label value escaped for the Prometheus text format.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Upper bounds of the exported histogram buckets: powers of two nanoseconds, 2^10 (about
/// 1 µs) to 2^36 (about 69 s). The document's buckets end at `2^k - 1` ns, so each bound
/// counts exactly the values below it.
const LE_POWERS: std::ops::RangeInclusive<u32> = 10..=36;

/// The document in the Prometheus text exposition format (version 0.0.4).
pub fn prometheus(doc: &Doc) -> String {
    let mut s = String::new();
    let family = |s: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    let base = |p: &PeerDoc| {
        format!(
            "role=\"{}\",peer=\"{}\",task=\"{}\"",
            label(&p.role),
            label(&p.peer_label()),
            label(p.task.as_deref().unwrap_or(""))
        )
    };
    family(&mut s, "starwire_info", "gauge", "The answering task.");
    let _ = writeln!(
        s,
        "starwire_info{{responder=\"{}\",version=\"{}\"}} 1",
        label(&doc.task),
        doc.version
    );
    let per_op = |s: &mut String, name: &str, f: &dyn Fn(&OpDoc) -> u64| {
        for p in &doc.peers {
            for (op, m) in &p.ops {
                let _ = writeln!(s, "{name}{{{},op=\"{}\"}} {}", base(p), label(op), f(m));
            }
        }
    };
    family(
        &mut s,
        "starwire_requests_total",
        "counter",
        "Requests ended, by outcome.",
    );
    for p in &doc.peers {
        for (op, m) in &p.ops {
            for o in OUTCOMES {
                let n = m.outcomes.get(o).copied().unwrap_or(0);
                let _ = writeln!(
                    s,
                    "starwire_requests_total{{{},op=\"{}\",status=\"{o}\"}} {n}",
                    base(p),
                    label(op)
                );
            }
        }
    }
    family(
        &mut s,
        "starwire_requests_started_total",
        "counter",
        "Requests started.",
    );
    per_op(&mut s, "starwire_requests_started_total", &|m| m.requests);
    family(
        &mut s,
        "starwire_requests_in_flight",
        "gauge",
        "Requests started and not ended.",
    );
    per_op(&mut s, "starwire_requests_in_flight", &|m| m.in_flight);
    family(
        &mut s,
        "starwire_sent_bytes_total",
        "counter",
        "Bytes of frames sent.",
    );
    per_op(&mut s, "starwire_sent_bytes_total", &|m| m.bytes_out);
    family(
        &mut s,
        "starwire_received_bytes_total",
        "counter",
        "Bytes of frames received.",
    );
    per_op(&mut s, "starwire_received_bytes_total", &|m| m.bytes_in);
    family(
        &mut s,
        "starwire_tensors_total",
        "counter",
        "Tensors, keys or ids carried.",
    );
    per_op(&mut s, "starwire_tensors_total", &|m| m.tensors);
    family(
        &mut s,
        "starwire_rows_total",
        "counter",
        "Embedding rows carried.",
    );
    per_op(&mut s, "starwire_rows_total", &|m| m.rows);
    family(
        &mut s,
        "starwire_request_duration_seconds",
        "histogram",
        "Latency of answered requests.",
    );
    for p in &doc.peers {
        for (op, m) in &p.ops {
            let labels = format!("{},op=\"{}\"", base(p), label(op));
            for k in LE_POWERS {
                let le_ns = 1u64 << k;
                let below: u64 = m
                    .latency
                    .buckets
                    .iter()
                    .filter(|(upper, _)| *upper < le_ns)
                    .map(|(_, c)| c)
                    .sum();
                let le = le_ns as f64 / 1e9;
                let _ = writeln!(
                    s,
                    "starwire_request_duration_seconds_bucket{{{labels},le=\"{le}\"}} {below}"
                );
            }
            let l = &m.latency;
            let _ = writeln!(
                s,
                "starwire_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}\n\
                 starwire_request_duration_seconds_sum{{{labels}}} {}\n\
                 starwire_request_duration_seconds_count{{{labels}}} {}",
                l.count,
                l.sum_ns as f64 / 1e9,
                l.count
            );
        }
    }
    let per_peer = |s: &mut String, name: &str, f: &dyn Fn(&PeerDoc) -> u64| {
        for p in &doc.peers {
            let _ = writeln!(s, "{name}{{{}}} {}", base(p), f(p));
        }
    };
    family(
        &mut s,
        "starwire_connections_total",
        "counter",
        "Connections opened or accepted.",
    );
    per_peer(&mut s, "starwire_connections_total", &|p| p.connections);
    family(
        &mut s,
        "starwire_connections_lost_total",
        "counter",
        "Connections lost.",
    );
    per_peer(&mut s, "starwire_connections_lost_total", &|p| {
        p.connections_lost
    });
    family(
        &mut s,
        "starwire_reconnects_total",
        "counter",
        "Connect attempts after a failure.",
    );
    per_peer(&mut s, "starwire_reconnects_total", &|p| p.reconnects);
    if !doc.tables.is_empty() {
        table_families(&mut s, doc);
    }
    s
}

/// A family of the tables' metrics: its name, type, help, and its value of a table.
type TableFamily = (
    &'static str,
    &'static str,
    &'static str,
    fn(&TableDoc) -> u64,
);

/// The tables' metrics in the Prometheus text format, labelled `table`.
fn table_families(s: &mut String, doc: &Doc) {
    let families: [TableFamily; 10] = [
        (
            "starwire_table_rows",
            "gauge",
            "Rows the table holds.",
            |t| t.rows,
        ),
        (
            "starwire_table_memory_bytes",
            "gauge",
            "Bytes of memory the table holds.",
            |t| t.memory_bytes,
        ),
        (
            "starwire_table_pulled_rows_total",
            "counter",
            "Rows pulls asked the table for.",
            |t| t.pulled_rows,
        ),
        (
            "starwire_table_missing_rows_total",
            "counter",
            "Rows pulled that the table had no row for.",
            |t| t.missing,
        ),
        (
            "starwire_table_unchanged_rows_total",
            "counter",
            "Rows pulled with the version held: answered unchanged, not sent.",
            |t| t.unchanged_rows,
        ),
        (
            "starwire_table_pushed_rows_total",
            "counter",
            "Gradient rows pushed to the table.",
            |t| t.pushed_rows,
        ),
        (
            "starwire_table_dropped_pushes_total",
            "counter",
            "Gradient rows the table dropped.",
            |t| t.dropped_pushes,
        ),
        (
            "starwire_table_created_rows_total",
            "counter",
            "Rows the table created.",
            |t| t.created,
        ),
        (
            "starwire_table_refused_rows_total",
            "counter",
            "New rows the table refused (row cap, memory).",
            |t| t.refused,
        ),
        (
            "starwire_table_evicted_rows_total",
            "counter",
            "Rows the table evicted.",
            |t| t.evicted(),
        ),
    ];
    for (name, kind, help, value) in families {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for t in &doc.tables {
            let _ = writeln!(
                s,
                "{name}{{responder=\"{}\",table=\"{}\"}} {}",
                label(&doc.task),
                t.table,
                value(t)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"{"format":"starwire-stats","version":1,"task":"ps:0",
        "totals":{"frames_in":3,"frames_out":3,"bytes_in":100,"bytes_out":200},
        "peers":[{"role":"server","addr":null,"task":"worker:0","connections":1,
        "connections_lost":0,"reconnects":0,"ops":{"pull":{"requests":3,"in_flight":0,
        "outcomes":{"ok":2,"error":1,"timeout":0,"unavailable":0,"refused":0},
        "bytes_out":10,"bytes_in":20,"tensors":3,"rows":0,"latency":{"count":2,
        "sum_ns":3000,"max_ns":2000,"p50_ns":1000,"p90_ns":2000,"p99_ns":2000,
        "buckets":[[1023,1],[2047,1]]}}}}],"truncated":false}"#;

    #[test]
    fn a_document_is_shown_as_a_table_with_rates() {
        let doc = parse(DOC).unwrap();
        let t = table(&doc, "ps:0", None);
        assert!(t.contains("served worker:0"), "{t}");
        assert!(t.contains("pull"), "{t}");
        let again = table(&doc, "ps:0", Some((&doc, Duration::from_secs(1))));
        assert!(again.contains("REQ/s"), "{again}");
        assert!(parse(r#"{"format":"x"}"#).is_err());
    }

    /// [`DOC`] with a table.
    fn with_table() -> String {
        DOC.replace(
            r#""truncated":false}"#,
            r#""truncated":false,"tables":[{"table":7,"rows":1200,"data_bytes":76800,
            "memory_bytes":3000000,"committed_bytes":2097152,"index_capacity":2048,
            "pulls":10,"pushes":4,"pulled_rows":5000,"missing":30,"unchanged_rows":700,"pushed_rows":800,
            "dropped_pushes":0,"created":1200,"loaded":0,"not_admitted":0,"refused":0,
            "evicted_untouched":2,"evicted_over_cap":3,"index_builds":1,"clock":0,
            "hot_sample_every":128,"hot":[[42,9],[7,5],[1,4],[2,3],[3,2],[4,1]]}]}"#,
        )
    }

    #[test]
    fn tables_are_shown_with_their_rows_calls_and_hot_ids() {
        let doc = parse(&with_table()).unwrap();
        let t = table(&doc, "ps:0", None);
        let header = t.lines().find(|l| l.contains("ROWS PULLED")).expect(&t);
        assert!(header.ends_with("HOT IDS (sampled)"), "{header}");
        let line = t.lines().last().unwrap();
        let cells: Vec<&str> = line.split_whitespace().collect();
        // Table, rows, memory, pulls, pushes, rows pulled, pushed, missing, unchanged,
        // created, evicted (2 + 3), then five hot ids of six, hottest first.
        assert_eq!(
            cells[..11],
            ["7", "1200", "3.0MB", "10", "4", "5000", "800", "30", "700", "1200", "5"],
            "{line}"
        );
        assert!(line.ends_with("42 (9) 7 (5) 1 (4) 2 (3) 3 (2)"), "{line}");
        // With rates: the rows per second since the previous document.
        let mut before = doc.clone();
        before.tables[0].pulled_rows = 1000;
        before.tables[0].pushed_rows = 0;
        let t = table(&doc, "ps:0", Some((&before, Duration::from_secs(2))));
        let line = t.lines().last().unwrap();
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cells[11..14], ["2000", "400", "42"], "{line}");
        // A document without tables shows none.
        assert!(!table(&parse(DOC).unwrap(), "ps:0", None).contains("ROWS PULLED"));
        // Prometheus: one family per counter, labelled by table.
        let p = prometheus(&doc);
        assert!(
            p.contains("starwire_table_pulled_rows_total{responder=\"ps:0\",table=\"7\"} 5000\n"),
            "{p}"
        );
        assert!(p.contains("starwire_table_evicted_rows_total{responder=\"ps:0\",table=\"7\"} 5\n"));
        assert!(
            p.contains("starwire_table_unchanged_rows_total{responder=\"ps:0\",table=\"7\"} 700\n")
        );
    }

    #[test]
    fn the_header_says_what_each_total_counts() {
        let t = table(&parse(DOC).unwrap(), "ps:0", None);
        assert!(
            t.contains("frames received 3, sent 3; bytes received 100B, sent 200B\n"),
            "{t}"
        );
        assert!(
            t.contains(
                "accepted 0, opened 0 (handshake completed), lost or closed for an error 0;"
            ),
            "{t}"
        );
    }

    #[test]
    fn prometheus_output_follows_the_exposition_format() {
        let doc = parse(DOC).unwrap();
        let p = prometheus(&doc);
        let labels = r#"role="server",peer="worker:0",task="worker:0",op="pull""#;
        assert!(p.contains(&format!(
            r#"starwire_requests_total{{{labels},status="ok"}} 2"#
        )));
        assert!(p.contains(&format!(
            r#"starwire_requests_total{{{labels},status="error"}} 1"#
        )));
        // Cumulative buckets: 1 value below 1.024 µs, 2 below 2.048 µs and above.
        let bucket =
            |le: &str| format!("starwire_request_duration_seconds_bucket{{{labels},le=\"{le}\"}}");
        assert!(p.contains(&format!("{} 1\n", bucket("0.000001024"))), "{p}");
        assert!(p.contains(&format!("{} 2\n", bucket("0.000002048"))), "{p}");
        assert!(p.contains(&format!("{} 2\n", bucket("+Inf"))));
        assert!(p.contains(&format!(
            "starwire_request_duration_seconds_count{{{labels}}} 2\n"
        )));
        // Every sample line belongs to a family announced before it, once.
        let mut announced = Vec::new();
        for line in p.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap();
                assert!(!announced.contains(&name.to_string()), "{name} twice");
                announced.push(name.to_string());
            } else if !line.starts_with('#') {
                let name = line.split('{').next().unwrap();
                let family = announced.last().unwrap();
                assert!(name.starts_with(family.as_str()), "{line} after {family}");
                let value = line.rsplit(' ').next().unwrap();
                assert!(value.parse::<f64>().is_ok(), "{line}");
            }
        }
    }
}
