//! The JSON document of a stats answer (`docs/wire-format.md`, section 4.11): written by
//! hand (the core has no serde), bounded in size.

use std::fmt::Write;

use super::peers::{Metrics, OpMetrics, Outcome, PeerMetrics};
use super::{RequestKind, Stats, TableMetrics};

/// Version of the document's layout.
pub const STATS_FORMAT_VERSION: u32 = 1;
/// Most peers in one document; more are left out and `truncated` is true.
pub const MAX_PEERS_IN_DOCUMENT: usize = 4096;

/// Writes `s` as a JSON string (quoted, escaped).
fn string(out: &mut String, s: &str) {
    super::trace::json_str(out, s);
}

fn opt_string(out: &mut String, s: Option<&str>) {
    match s {
        Some(s) => string(out, s),
        None => out.push_str("null"),
    }
}

fn op(out: &mut String, m: &OpMetrics) {
    let _ = write!(
        out,
        "{{\"requests\":{},\"in_flight\":{},\"outcomes\":{{",
        m.requests,
        m.in_flight()
    );
    for (i, o) in Outcome::ALL.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(out, "{sep}\"{}\":{}", o.name(), m.outcome(*o));
    }
    let h = &m.latency;
    let ns = |d: std::time::Duration| d.as_nanos() as u64;
    let _ = write!(
        out,
        "}},\"bytes_out\":{},\"bytes_in\":{},\"tensors\":{},\"rows\":{},\
         \"latency\":{{\"count\":{},\"sum_ns\":{},\"max_ns\":{},\"p50_ns\":{},\"p90_ns\":{},\
         \"p99_ns\":{},\"buckets\":[",
        m.bytes_out,
        m.bytes_in,
        m.tensors,
        m.rows,
        h.count(),
        ns(h.sum()),
        ns(h.max()),
        ns(h.quantile(0.5)),
        ns(h.quantile(0.9)),
        ns(h.quantile(0.99)),
    );
    for (i, (le, c)) in h.buckets().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(out, "{sep}[{le},{c}]");
    }
    out.push_str("]}}");
}

fn peer(out: &mut String, p: &PeerMetrics) {
    let _ = write!(out, "{{\"role\":\"{}\",\"addr\":", p.side.name());
    opt_string(out, p.addr.map(|a| a.to_string()).as_deref());
    out.push_str(",\"task\":");
    opt_string(out, p.task.as_deref());
    let _ = write!(
        out,
        ",\"connections\":{},\"connections_lost\":{},\"reconnects\":{},\"ops\":{{",
        p.connections, p.connections_lost, p.reconnects
    );
    let mut first = true;
    for kind in RequestKind::ALL {
        let m = p.op(kind);
        if *m == OpMetrics::default() {
            continue;
        }
        if !first {
            out.push(',');
        }
        first = false;
        let _ = write!(out, "\"{}\":", kind.name());
        op(out, m);
    }
    out.push_str("}}");
}

fn table(out: &mut String, id: u32, m: &TableMetrics) {
    let _ = write!(
        out,
        "{{\"table\":{id},\"rows\":{},\"data_bytes\":{},\"memory_bytes\":{},\
         \"committed_bytes\":{},\"index_capacity\":{},\"pulls\":{},\"pushes\":{},\
         \"pulled_rows\":{},\"missing\":{},\"unchanged_rows\":{},\"pushed_rows\":{},\"dropped_pushes\":{},\
         \"created\":{},\"loaded\":{},\"not_admitted\":{},\"refused\":{},\
         \"evicted_untouched\":{},\"evicted_over_cap\":{},\"index_builds\":{},\"clock\":{},\
         \"hot_sample_every\":{},\"hot\":[",
        m.rows,
        m.data_bytes,
        m.memory_bytes,
        m.committed_bytes,
        m.index_capacity,
        m.pulls,
        m.pushes,
        m.pulled_rows,
        m.missing,
        m.unchanged_rows,
        m.pushed_rows,
        m.dropped_pushes,
        m.created,
        m.loaded,
        m.not_admitted,
        m.refused,
        m.evicted_untouched,
        m.evicted_over_cap,
        m.index_builds,
        m.clock,
        m.hot_sample_every,
    );
    for (i, h) in m.hot.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(out, "{sep}[{},{}]", h.id, h.sampled);
    }
    out.push_str("]}");
}

impl Metrics {
    /// The stats document of task `task` (`job:index`) with these metrics and totals:
    /// what a stats request is answered with (`docs/wire-format.md`, section 4.11).
    pub fn to_json(&self, task: &str, totals: &Stats) -> String {
        self.to_json_with_tables(task, totals, &[])
    }

    /// [`to_json`](Self::to_json) with the metrics of the tables the task serves (their
    /// number, and what their [`Table::metrics`](crate::Table::metrics) returned), under
    /// `tables`.
    pub fn to_json_with_tables(
        &self,
        task: &str,
        totals: &Stats,
        tables: &[(u32, TableMetrics)],
    ) -> String {
        let mut out = String::with_capacity(1024 + 512 * self.peers.len());
        let _ = write!(
            out,
            "{{\"format\":\"starwire-stats\",\"version\":{STATS_FORMAT_VERSION},\"task\":"
        );
        string(&mut out, task);
        let t = totals;
        let _ = write!(
            out,
            ",\"totals\":{{\"frames_in\":{},\"frames_out\":{},\"bytes_in\":{},\"bytes_out\":{},\
             \"connections_accepted\":{},\"connections_opened\":{},\"connections_lost\":{},\
             \"connections_closed\":{},\"reconnects\":{},\"busy_ns\":{},\"spin_ns\":{},\"parked_ns\":{},\"parks\":{},\
             \"send_arena_bytes\":{},\"send_blocks_allocated\":{},\"recv_ring_exhausted\":{}}},\
             \"peers\":[",
            t.frames_in,
            t.frames_out,
            t.bytes_in,
            t.bytes_out,
            t.connections_accepted,
            t.connections_opened,
            t.connections_lost,
            t.connections_closed,
            t.reconnects,
            t.busy.as_nanos() as u64,
            t.spin.as_nanos() as u64,
            t.parked.as_nanos() as u64,
            t.parks,
            t.send_arena_bytes,
            t.send_blocks_allocated,
            t.recv_ring_exhausted,
        );
        for (i, p) in self.peers.iter().take(MAX_PEERS_IN_DOCUMENT).enumerate() {
            if i > 0 {
                out.push(',');
            }
            peer(&mut out, p);
        }
        let truncated = self.peers.len() > MAX_PEERS_IN_DOCUMENT;
        let _ = write!(out, "],\"truncated\":{truncated},\"tables\":[");
        for (i, (id, m)) in tables.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            table(&mut out, *id, m);
        }
        out.push_str("]}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped() {
        let mut s = String::new();
        string(&mut s, "a\"b\\c\n");
        assert_eq!(s, r#""a\"b\\c\n""#);
        let mut s = String::new();
        string(&mut s, "\u{1}\t");
        assert_eq!(s, r#""\u0001\t""#);
    }

    #[test]
    fn an_empty_document_is_complete() {
        let doc = Metrics::default().to_json("ps:0", &Stats::default());
        assert!(doc.starts_with(r#"{"format":"starwire-stats","version":1,"task":"ps:0""#));
        assert!(
            doc.ends_with(r#""peers":[],"truncated":false,"tables":[]}"#),
            "{doc}"
        );
    }
}
