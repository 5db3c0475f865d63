//! The request trace (`STARWIRE_TRACE`): per request, when it was submitted, sent,
//! answered and completed, kept by each loop in a ring of plain records and written as a
//! Chrome trace (JSON that Perfetto and `chrome://tracing` open).
//!
//! Each loop is the only writer of its [`TraceRing`], preallocated at start when tracing is on
//! (`STARWIRE_TRACE_EVENTS` records); when it is full the **oldest** record is overwritten
//! and counted as dropped, so a trace always holds the latest requests. A dump asks each
//! loop for its ring through [`TraceShared`]: the loop sees the request on its next turn
//! and hands the ring over under a mutex only the dump and that hand-over take, never the
//! request path.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::{Outcome, RequestKind};

/// The instant trace times count from: the first use in this process, so that the times
/// of every loop (and of every runtime in the process) are on one axis.
pub(crate) fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds from [`epoch`] to `t` (0 for a time before it).
#[inline]
pub(crate) fn nanos(epoch: Instant, t: Instant) -> u64 {
    t.saturating_duration_since(epoch).as_nanos() as u64
}

/// One finished request. Times are nanoseconds since [`epoch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    /// The submitter's tag.
    pub tag: u64,
    /// The sharded step the request is a part of; 0: none.
    pub step: u64,
    /// Submitted (by the trainer thread; the loop's time when it took the request if the
    /// request carries no time of its own).
    pub submitted: u64,
    /// Its frame queued on the connection (0: never sent).
    pub sent: u64,
    /// The first frame of its answer decoded (0: never answered).
    pub answered: u64,
    /// Its completion handed to the submitter.
    pub completed: u64,
    /// Bytes its frames queued on the connection (0: never sent).
    pub bytes: u64,
    /// The loop's index of the peer (names are handed over with the ring).
    pub peer: u32,
    pub kind: RequestKind,
    pub outcome: Outcome,
}

/// A loop's records: a fixed-capacity ring that overwrites its oldest record when full.
#[derive(Debug)]
pub(crate) struct TraceRing {
    records: Vec<Record>,
    capacity: usize,
    /// Where the next record goes once the ring is full.
    next: usize,
    dropped: u64,
}

impl TraceRing {
    /// A ring of `capacity` records, allocated now.
    pub(crate) fn with_capacity(capacity: usize) -> TraceRing {
        let capacity = capacity.max(1);
        TraceRing {
            records: Vec::with_capacity(capacity),
            capacity,
            next: 0,
            dropped: 0,
        }
    }

    /// Adds `r`; when full, it replaces the oldest record (which counts as dropped).
    #[inline]
    pub(crate) fn push(&mut self, r: Record) {
        if self.records.len() < self.capacity {
            self.records.push(r);
        } else {
            self.records[self.next] = r;
            self.next = (self.next + 1) % self.capacity;
            self.dropped += 1;
        }
    }

    /// The records, oldest first, and the count dropped; the ring starts again empty with
    /// memory of its own (allocated here, at dump time).
    pub(crate) fn take(&mut self) -> (Vec<Record>, u64) {
        let mut records = std::mem::replace(&mut self.records, Vec::with_capacity(self.capacity));
        records.rotate_left(self.next);
        let dropped = std::mem::take(&mut self.dropped);
        self.next = 0;
        (records, dropped)
    }
}

/// One loop's part of a trace.
#[derive(Debug, Default)]
pub(crate) struct LoopTrace {
    pub records: Vec<Record>,
    /// Records overwritten before this dump.
    pub dropped: u64,
    /// Names of the peers by [`Record::peer`].
    pub peers: Vec<String>,
}

/// What a dump and a loop share: the request to hand the ring over and the hand-over.
#[derive(Debug, Default)]
pub(crate) struct TraceShared {
    wanted: AtomicBool,
    handed: Mutex<Option<LoopTrace>>,
}

impl TraceShared {
    /// Asks the loop for its records (it answers on its next turn).
    pub(crate) fn ask(&self) {
        self.wanted.store(true, Ordering::Release);
    }

    /// Whether a dump waits for this loop's records.
    #[inline]
    pub(crate) fn wanted(&self) -> bool {
        self.wanted.load(Ordering::Relaxed)
    }

    /// The loop's answer to [`ask`](Self::ask).
    pub(crate) fn hand_over(&self, part: LoopTrace) {
        let mut h = self.handed.lock().unwrap_or_else(|p| p.into_inner());
        *h = Some(part);
        self.wanted.store(false, Ordering::Release);
    }

    /// The records handed over, if they have been.
    pub(crate) fn take(&self) -> Option<LoopTrace> {
        self.handed.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Asks and waits up to `patience` for the answer; `wake` rings the loop's doorbell.
    pub(crate) fn collect(&self, patience: Duration, wake: impl Fn()) -> Option<LoopTrace> {
        self.ask();
        wake();
        let start = Instant::now();
        loop {
            if let Some(t) = self.take() {
                return Some(t);
            }
            if start.elapsed() > patience {
                self.wanted.store(false, Ordering::Release);
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
            wake();
        }
    }
}

/// What a trace file's events are made from.
pub(crate) struct TraceInput<'a> {
    /// The task (`worker:0`): the trace's process.
    pub task: &'a str,
    pub loops: &'a [LoopTrace],
    /// Loops that did not hand their records over in time.
    pub missing_loops: usize,
}

/// A request's four times, made non-decreasing: the loop reads the clock once per turn,
/// so a trainer's submit time may be later than the turn's time the loop sent it at.
fn ordered(r: &Record) -> [u64; 4] {
    let submitted = r.submitted;
    let sent = if r.sent == 0 { r.completed } else { r.sent };
    let answered = if r.answered == 0 {
        r.completed
    } else {
        r.answered
    };
    let sent = sent.max(submitted);
    let answered = answered.max(sent);
    let completed = r.completed.max(answered);
    [submitted, sent, answered, completed]
}

/// Assigns each interval a lane so that intervals on one lane never overlap (a track of
/// a trace viewer nests slices by time: overlapping ones on one track would misnest).
/// `spans` are (start, end) sorted by start; returns each one's lane.
fn lanes(spans: &[(u64, u64)]) -> (Vec<u32>, u32) {
    let mut ends: Vec<u64> = Vec::new();
    let mut out = Vec::with_capacity(spans.len());
    for &(start, end) in spans {
        let lane = match ends.iter().position(|&e| e <= start) {
            Some(l) => l,
            None => {
                ends.push(0);
                ends.len() - 1
            }
        };
        ends[lane] = end;
        out.push(lane as u32);
    }
    (out, ends.len() as u32)
}

/// Appends `s` as a JSON string.
pub(crate) fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Nanoseconds as microseconds with three decimals (the trace format's unit).
fn micros(out: &mut String, ns: u64) {
    let _ = write!(out, "{}.{:03}", ns / 1000, ns % 1000);
}

/// Track (thread) id of the steps' lanes; peers' lanes follow.
const STEP_TID: u32 = 1;

/// The Chrome trace document (`{"traceEvents": [...]}`) of `input`.
///
/// Per request a complete event (`"ph":"X"`) named by its kind, from submitted to
/// completed, on a track of its peer (several lanes per peer when requests overlap), with
/// three child slices: `queued` (submitted to sent), `wire+peer` (sent to the first frame
/// of the answer) and `delivering` (answer to completion). Per sharded step a slice
/// (`pull_rows step`, `push_rows step`) from its first part's submission to its last
/// part's completion, on the `steps` tracks; its parts carry its id in `args.step`.
pub(crate) fn chrome_json(input: &TraceInput<'_>) -> String {
    // (peer name, record) for every record, and the peers' names in order of appearance.
    let mut names: Vec<&str> = Vec::new();
    let mut all: Vec<(u32, [u64; 4], &Record)> = Vec::new();
    let mut dropped = 0;
    for l in input.loops {
        dropped += l.dropped;
        for r in &l.records {
            let name = l.peers.get(r.peer as usize).map_or("(unknown peer)", |s| s);
            let i = match names.iter().position(|n| *n == name) {
                Some(i) => i,
                None => {
                    names.push(name);
                    names.len() - 1
                }
            };
            all.push((i as u32, ordered(r), r));
        }
    }
    all.sort_by_key(|(peer, t, _)| (*peer, t[0]));
    let mut out = String::with_capacity(256 + all.len() * 400);
    out.push_str("{\"displayTimeUnit\":\"ns\",\"otherData\":{\"task\":");
    json_str(&mut out, input.task);
    let _ = write!(
        out,
        ",\"records\":{},\"dropped\":{},\"missing_loops\":{}}},\"traceEvents\":[",
        all.len(),
        dropped,
        input.missing_loops
    );
    let mut first = true;
    let mut event = |out: &mut String| {
        if !first {
            out.push_str(",\n");
        }
        first = false;
    };
    event(&mut out);
    out.push_str("{\"ph\":\"M\",\"pid\":1,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":");
    json_str(&mut out, input.task);
    out.push_str("}}");
    let thread_name = |out: &mut String, tid: u32, name: &str, lane: u32| {
        let _ = write!(
            out,
            "{{\"ph\":\"M\",\"pid\":1,\"tid\":{tid},\"name\":\"thread_name\",\"args\":{{\"name\":"
        );
        json_str(out, &format!("{name} #{lane}"));
        let _ = write!(out, "}}}},\n{{\"ph\":\"M\",\"pid\":1,\"tid\":{tid},\"name\":\"thread_sort_index\",\"args\":{{\"sort_index\":{tid}}}}}");
    };

    // Steps: from the first part's submission to the last part's completion.
    // (start, end, step, parts, kind of its parts)
    let mut steps: Vec<(u64, u64, u64, u32, &str)> = Vec::new();
    let mut by_step: Vec<(u64, u64, u64, &str)> = all
        .iter()
        .filter(|(_, _, r)| r.step != 0)
        .map(|(_, t, r)| (r.step, t[0], t[3], r.kind.name()))
        .collect();
    by_step.sort_unstable();
    for (step, start, end, kind) in by_step {
        match steps.last_mut() {
            Some(s) if s.2 == step => {
                s.0 = s.0.min(start);
                s.1 = s.1.max(end);
                s.3 += 1;
            }
            _ => steps.push((start, end, step, 1, kind)),
        }
    }
    steps.sort_unstable();
    let spans: Vec<(u64, u64)> = steps.iter().map(|s| (s.0, s.1)).collect();
    let (step_lanes, n_step_lanes) = lanes(&spans);
    for lane in 0..n_step_lanes {
        event(&mut out);
        thread_name(&mut out, STEP_TID + lane, "steps", lane);
    }
    for (s, lane) in steps.iter().zip(&step_lanes) {
        event(&mut out);
        let _ = write!(
            out,
            "{{\"ph\":\"X\",\"cat\":\"step\",\"name\":\"{} step\",\"pid\":1,\"tid\":{},\"ts\":",
            s.4,
            STEP_TID + lane
        );
        micros(&mut out, s.0);
        out.push_str(",\"dur\":");
        micros(&mut out, s.1 - s.0);
        let _ = write!(out, ",\"args\":{{\"step\":{},\"parts\":{}}}}}", s.2, s.3);
    }

    // Requests, per peer on lanes of their own.
    let mut tid = STEP_TID + n_step_lanes.max(1);
    let mut at = 0;
    while at < all.len() {
        let peer = all[at].0;
        let end = at + all[at..].iter().take_while(|(p, _, _)| *p == peer).count();
        let group = &all[at..end];
        let spans: Vec<(u64, u64)> = group.iter().map(|(_, t, _)| (t[0], t[3])).collect();
        let (lane_of, n_lanes) = lanes(&spans);
        for lane in 0..n_lanes {
            event(&mut out);
            thread_name(&mut out, tid + lane, names[peer as usize], lane);
        }
        for ((_, t, r), lane) in group.iter().zip(&lane_of) {
            let track = tid + lane;
            event(&mut out);
            let _ = write!(
                out,
                "{{\"ph\":\"X\",\"cat\":\"request\",\"name\":\"{}\",\"pid\":1,\"tid\":{track},\"ts\":",
                r.kind.name()
            );
            micros(&mut out, t[0]);
            out.push_str(",\"dur\":");
            micros(&mut out, t[3] - t[0]);
            let _ = write!(
                out,
                ",\"args\":{{\"tag\":{},\"step\":{},\"bytes\":{},\"outcome\":\"{}\",\"sent\":{},\"answered\":{}}}}}",
                r.tag,
                r.step,
                r.bytes,
                r.outcome.name(),
                r.sent != 0,
                r.answered != 0
            );
            for (i, part) in ["queued", "wire+peer", "delivering"].iter().enumerate() {
                event(&mut out);
                let _ = write!(
                    out,
                    "{{\"ph\":\"X\",\"cat\":\"phase\",\"name\":\"{part}\",\"pid\":1,\"tid\":{track},\"ts\":"
                );
                micros(&mut out, t[i]);
                out.push_str(",\"dur\":");
                micros(&mut out, t[i + 1] - t[i]);
                out.push('}');
            }
        }
        tid += n_lanes;
        at = end;
    }
    out.push_str("\n]}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(tag: u64, t: [u64; 4]) -> Record {
        Record {
            tag,
            step: 0,
            submitted: t[0],
            sent: t[1],
            answered: t[2],
            completed: t[3],
            bytes: 10,
            peer: 0,
            kind: RequestKind::Pull,
            outcome: Outcome::Ok,
        }
    }

    #[test]
    fn a_full_ring_overwrites_its_oldest_and_counts_them() {
        let mut ring = TraceRing::with_capacity(3);
        for tag in 0..5 {
            ring.push(rec(tag, [1, 2, 3, 4]));
        }
        let (records, dropped) = ring.take();
        assert_eq!(dropped, 2);
        let tags: Vec<u64> = records.iter().map(|r| r.tag).collect();
        assert_eq!(tags, [2, 3, 4]);
        assert_eq!(ring.take().0.len(), 0);
    }

    #[test]
    fn overlapping_requests_go_on_separate_lanes() {
        let (l, n) = lanes(&[(0, 10), (5, 12), (10, 20), (13, 14)]);
        assert_eq!(l, [0, 1, 0, 1]);
        assert_eq!(n, 2);
    }

    #[test]
    fn a_record_is_64_bytes() {
        assert_eq!(std::mem::size_of::<Record>(), 64);
    }

    #[test]
    fn times_are_made_non_decreasing_and_strings_escaped() {
        assert_eq!(ordered(&rec(0, [5, 4, 0, 9])), [5, 5, 9, 9]);
        let mut s = String::new();
        json_str(&mut s, "a\"b\\c\n\u{1}");
        assert_eq!(s, r#""a\"b\\c\n\u0001""#);
    }
}
