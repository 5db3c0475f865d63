//! The request trace over real sockets: pulls and pushes as complete events with ordered
//! phases, a sharded step enclosing its per-PS parts, a tiny ring that stays bounded and
//! counts what it dropped, and nothing recorded with tracing off. The documents are read
//! back with a small JSON reader of this file's own.

mod common;

use common::*;
use starwire::rows::Partition;
use starwire::rows::{Init, MemTable, Optimizer, Tables};
use starwire::{DType, Embedded, Options, Peer, Runtime, Service, Sharded, Status, Tensor};
use std::collections::BTreeMap;
use std::sync::Arc;

// ----- a small JSON reader -----

#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(BTreeMap<String, Json>),
}

impl Json {
    fn get(&self, key: &str) -> &Json {
        match self {
            Json::Obj(m) => m.get(key).unwrap_or(&Json::Null),
            _ => &Json::Null,
        }
    }
    fn num(&self) -> f64 {
        match self {
            Json::Num(n) => *n,
            other => panic!("not a number: {other:?}"),
        }
    }
    fn str(&self) -> &str {
        match self {
            Json::Str(s) => s,
            other => panic!("not a string: {other:?}"),
        }
    }
    fn arr(&self) -> &[Json] {
        match self {
            Json::Arr(a) => a,
            other => panic!("not an array: {other:?}"),
        }
    }
}

struct Reader<'a> {
    s: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn ws(&mut self) {
        while self.at < self.s.len() && self.s[self.at].is_ascii_whitespace() {
            self.at += 1;
        }
    }
    fn eat(&mut self, c: u8) {
        self.ws();
        assert_eq!(
            self.s.get(self.at),
            Some(&c),
            "expected {} at {}",
            c as char,
            self.at
        );
        self.at += 1;
    }
    fn peek(&mut self) -> u8 {
        self.ws();
        *self.s.get(self.at).expect("unexpected end")
    }
    fn string(&mut self) -> String {
        self.eat(b'"');
        let mut out = String::new();
        loop {
            let c = self.s[self.at];
            self.at += 1;
            match c {
                b'"' => return out,
                b'\\' => {
                    let e = self.s[self.at];
                    self.at += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'u' => {
                            let hex = std::str::from_utf8(&self.s[self.at..self.at + 4]).unwrap();
                            self.at += 4;
                            out.push(
                                char::from_u32(u32::from_str_radix(hex, 16).unwrap()).unwrap(),
                            );
                        }
                        _ => panic!("bad escape at {}", self.at),
                    }
                }
                c if c < 0x20 => panic!("raw control character at {}", self.at),
                _ => {
                    // Copy the whole UTF-8 sequence.
                    let start = self.at - 1;
                    let mut end = self.at;
                    while end < self.s.len() && (self.s[end] & 0xc0) == 0x80 {
                        end += 1;
                    }
                    out.push_str(std::str::from_utf8(&self.s[start..end]).unwrap());
                    self.at = end;
                }
            }
        }
    }
    fn value(&mut self) -> Json {
        match self.peek() {
            b'{' => {
                self.eat(b'{');
                let mut m = BTreeMap::new();
                if self.peek() == b'}' {
                    self.eat(b'}');
                    return Json::Obj(m);
                }
                loop {
                    let k = self.string();
                    self.eat(b':');
                    let v = self.value();
                    assert!(m.insert(k, v).is_none(), "duplicate key");
                    if self.peek() == b',' {
                        self.eat(b',');
                    } else {
                        self.eat(b'}');
                        return Json::Obj(m);
                    }
                }
            }
            b'[' => {
                self.eat(b'[');
                let mut a = Vec::new();
                if self.peek() == b']' {
                    self.eat(b']');
                    return Json::Arr(a);
                }
                loop {
                    a.push(self.value());
                    if self.peek() == b',' {
                        self.eat(b',');
                    } else {
                        self.eat(b']');
                        return Json::Arr(a);
                    }
                }
            }
            b'"' => Json::Str(self.string()),
            b't' => self.word("true", Json::Bool(true)),
            b'f' => self.word("false", Json::Bool(false)),
            b'n' => self.word("null", Json::Null),
            _ => {
                let start = self.at;
                while self.at < self.s.len() && b"+-0123456789.eE".contains(&self.s[self.at]) {
                    self.at += 1;
                }
                let text = std::str::from_utf8(&self.s[start..self.at]).unwrap();
                Json::Num(
                    text.parse()
                        .unwrap_or_else(|_| panic!("bad number {text:?}")),
                )
            }
        }
    }
    fn word(&mut self, w: &str, v: Json) -> Json {
        assert!(self.s[self.at..].starts_with(w.as_bytes()));
        self.at += w.len();
        v
    }
}

fn parse(text: &str) -> Json {
    let mut r = Reader {
        s: text.as_bytes(),
        at: 0,
    };
    let v = r.value();
    r.ws();
    assert_eq!(r.at, text.len(), "trailing bytes");
    v
}

// ----- the trace's events -----

/// A complete event: its name, category, track, start and end (µs), and args.
#[derive(Debug, Clone)]
struct Slice {
    name: String,
    cat: String,
    tid: u64,
    ts: f64,
    end: f64,
    args: Json,
}

fn slices(doc: &Json) -> Vec<Slice> {
    doc.get("traceEvents")
        .arr()
        .iter()
        .filter(|e| e.get("ph").str() == "X")
        .map(|e| {
            let ts = e.get("ts").num();
            Slice {
                name: e.get("name").str().to_string(),
                cat: e.get("cat").str().to_string(),
                tid: e.get("tid").num() as u64,
                ts,
                end: ts + e.get("dur").num(),
                args: e.get("args").clone(),
            }
        })
        .collect()
}

/// Checks each request's three phases: on its track, one after the other, from its start
/// to its end. Returns the requests.
fn requests_with_phases(all: &[Slice]) -> Vec<Slice> {
    let requests: Vec<Slice> = all.iter().filter(|s| s.cat == "request").cloned().collect();
    let phases: Vec<&Slice> = all.iter().filter(|s| s.cat == "phase").collect();
    assert_eq!(phases.len(), 3 * requests.len());
    // The writer puts each request's phases right after it.
    let mut phases = phases.into_iter();
    for r in &requests {
        let p: Vec<&Slice> = (0..3).map(|_| phases.next().unwrap()).collect();
        let names: Vec<&str> = p.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["queued", "wire+peer", "delivering"]);
        assert!(p.iter().all(|s| s.tid == r.tid));
        // submitted <= sent <= answered <= completed, with µs at 3 decimals.
        let eps = 0.0015;
        assert!((p[0].ts - r.ts).abs() < eps);
        assert!((p[1].ts - p[0].end).abs() < eps && (p[2].ts - p[1].end).abs() < eps);
        assert!((p[2].end - r.end).abs() < eps);
        assert!(p.iter().all(|s| s.end >= s.ts));
    }
    requests
}

struct Table;

impl Service for Table {
    fn pull(&self, ids: &[u64], out: &mut Vec<Result<Arc<Tensor>, Status>>) {
        for &id in ids {
            let t = Tensor::from_slice(DType::U8, &[64], &[id as u8; 64]).unwrap();
            out.push(Ok(Arc::new(t)));
        }
    }

    fn push(&self, items: &mut Vec<(u64, Tensor)>, statuses: &mut Vec<Status>) {
        statuses.extend(items.iter().map(|_| Status::Ok));
    }
}

fn ps() -> Runtime {
    Runtime::start_with(
        config("ps", 1).build().unwrap(),
        Options {
            service: Some(Arc::new(Table)),
            ..Options::listen("127.0.0.1:0".parse().unwrap())
        },
    )
    .expect("the PS starts")
}

#[test]
fn pulls_and_pushes_are_complete_events_with_ordered_phases() {
    const N: usize = 25;
    let ps = ps();
    let addr = ps.local_addr().unwrap();
    let worker = Runtime::start(config("worker", 2).trace(true).build().unwrap(), None).unwrap();
    let mut h = worker.handle(16);
    for i in 0..N as u64 {
        let t = h.pull(addr, vec![i, i + 1], secs(30)).unwrap();
        assert_eq!(h.wait(t).unwrap().len(), 2);
        let grad = Arc::new(Tensor::from_slice(DType::U8, &[64], &[1; 64]).unwrap());
        let t = h.push(addr, vec![(i, grad)], secs(30)).unwrap();
        assert_eq!(h.wait(t).unwrap(), [Status::Ok]);
    }
    let path = std::env::temp_dir().join(format!("starwire-trace-{}.json", std::process::id()));
    worker.write_trace(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).ok();
    let doc = parse(&text);
    assert_eq!(doc.get("displayTimeUnit").str(), "ns");
    assert_eq!(doc.get("otherData").get("records").num() as usize, 2 * N);
    assert_eq!(doc.get("otherData").get("dropped").num(), 0.0);
    let requests = requests_with_phases(&slices(&doc));
    for kind in ["pull", "push"] {
        let of: Vec<&Slice> = requests.iter().filter(|r| r.name == kind).collect();
        assert_eq!(of.len(), N, "{kind}");
        for r in of {
            assert_eq!(r.args.get("outcome").str(), "ok");
            assert_eq!(r.args.get("sent"), &Json::Bool(true));
            assert_eq!(r.args.get("answered"), &Json::Bool(true));
            assert!(r.args.get("bytes").num() > 0.0);
        }
    }
    // The peer's track is named by its task and address.
    let names: Vec<&str> = doc
        .get("traceEvents")
        .arr()
        .iter()
        .filter(|e| e.get("name").str() == "thread_name")
        .map(|e| e.get("args").get("name").str())
        .collect();
    assert!(
        names.iter().any(|n| n.contains(&addr.to_string())),
        "{names:?}"
    );
    // Sequential requests never overlap: one lane for the peer.
    assert!(requests.iter().all(|r| r.tid == requests[0].tid));
    // A dump takes the records: the next one starts empty.
    let again = parse(&worker.trace_json());
    assert_eq!(again.get("otherData").get("records").num(), 0.0);
}

#[test]
fn a_sharded_step_encloses_its_per_ps_parts() {
    let rts: Vec<Runtime> = (0..3)
        .map(|_| {
            let table = Arc::new(MemTable::new(4, Init::Zeros, Optimizer::Sgd { lr: 1.0 }));
            let options = Options {
                service: Some(Arc::new(Tables::new().with(3, table))),
                ..Options::listen("127.0.0.1:0".parse().unwrap())
            };
            Runtime::start_with(config("ps", 1).build().unwrap(), options).unwrap()
        })
        .collect();
    let peers: Vec<Peer> = rts
        .iter()
        .map(|r| Peer::from(r.local_addr().unwrap()))
        .collect();
    let worker = Runtime::start(config("worker", 2).trace(true).build().unwrap(), None).unwrap();
    let mut h = worker.handle(16);
    let mut sharded = Sharded::new(peers, Partition::Mod, 3, DType::F32, &[4]).unwrap();
    let ids = [0u64, 1, 2, 3, 4, 5, 1];
    let mut out = vec![0u8; ids.len() * 16];
    for _ in 0..2 {
        let report = sharded.pull(&mut h, &ids, &mut out, secs(30)).unwrap();
        assert!(report.is_ok(), "{report:?}");
    }
    let grads = vec![0u8; ids.len() * 16];
    let report = sharded.push(&mut h, &ids, &grads, secs(30)).unwrap();
    assert!(report.is_ok(), "{report:?}");
    // A request outside any step.
    let t = h.ping(rts[0].local_addr().unwrap(), 8, secs(30)).unwrap();
    h.wait(t).unwrap();

    let doc = parse(&worker.trace_json());
    let all = slices(&doc);
    let requests = requests_with_phases(&all);
    let steps: Vec<&Slice> = all.iter().filter(|s| s.cat == "step").collect();
    assert_eq!(steps.len(), 3);
    for step in &steps {
        let id = step.args.get("step").num();
        assert_eq!(step.args.get("parts").num(), 3.0);
        let parts: Vec<&Slice> = requests
            .iter()
            .filter(|r| r.args.get("step").num() == id)
            .collect();
        assert_eq!(parts.len(), 3, "one part per PS");
        // Each part on its own PS's track, inside the step.
        let mut tids: Vec<u64> = parts.iter().map(|p| p.tid).collect();
        tids.sort_unstable();
        tids.dedup();
        assert_eq!(tids.len(), 3);
        assert!(tids.iter().all(|&t| t != step.tid));
        for p in parts {
            assert!(p.ts >= step.ts - 0.0015 && p.end <= step.end + 0.0015);
        }
    }
    let kinds: Vec<&str> = requests.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "pull_rows").count(), 6);
    assert_eq!(kinds.iter().filter(|k| **k == "push_rows").count(), 3);
    let ping = requests.iter().find(|r| r.name == "ping").unwrap();
    assert_eq!(ping.args.get("step").num(), 0.0);
}

#[test]
fn a_tiny_ring_stays_bounded_and_counts_what_it_dropped() {
    let ps = ps();
    let addr = ps.local_addr().unwrap();
    let cfg = config("worker", 1)
        .trace(true)
        .trace_events(4)
        .build()
        .unwrap();
    let mut e = Embedded::new(cfg, None).unwrap();
    let mut tags = Vec::new();
    for _ in 0..10 {
        let t = e.ping(addr, 8, secs(30)).unwrap();
        tags.push(t.tag());
        e.wait(t).unwrap();
    }
    let doc = parse(&e.trace_json());
    assert_eq!(doc.get("otherData").get("records").num(), 4.0);
    assert_eq!(doc.get("otherData").get("dropped").num(), 6.0);
    let requests = requests_with_phases(&slices(&doc));
    // The newest are kept.
    let kept: Vec<u64> = requests
        .iter()
        .map(|r| r.args.get("tag").num() as u64)
        .collect();
    assert_eq!(kept, tags[6..]);
}

#[test]
fn with_tracing_off_nothing_is_recorded() {
    let ps = ps();
    let addr = ps.local_addr().unwrap();
    let worker = Runtime::start(config("worker", 1).trace(false).build().unwrap(), None).unwrap();
    assert!(ping_once(&worker, addr, secs(30)).is_ok());
    let doc = parse(&worker.trace_json());
    assert_eq!(doc.get("otherData").get("records").num(), 0.0);
    assert!(slices(&doc).is_empty());
    let path = std::env::temp_dir().join(format!("starwire-off-{}.json", std::process::id()));
    assert!(worker.write_trace(&path).is_err());
    assert!(!path.exists());
}
