//! Pull and push of tensors beside raw blocking-socket implementations of the same
//! exchanges measured in the same run, and heap allocations per request.
//!
//! `cargo bench --bench transport` runs the default set (sections `small,bulk,alloc`) and
//! prints markdown tables; `-- --help` lists the options.
//!
//! - `small`: pull of 100 x 64 B tensors, 1 and 64 requests in flight.
//! - `bulk`: pull of one 4 MiB and one 64 MiB tensor, GB/s.
//! - `alloc`: heap allocations per request in steady state (ping, pull 100 x 64 B, push
//!   100 x 64 B), counted by this binary's global allocator in both processes.
//! - `sparse` (not in the default set): a sparse step of 500 tensors received from the
//!   server's rendezvous as one fused recv (`recv_many`) or as 500 separate recvs
//!   (pipelined, pipelined with `tensor_fuse(true)`, sequential), steps/s.
//! - `zerocopy` (not in the default set): pull throughput for tensors of 4 KiB–1 MiB with
//!   `Options::zero_copy_min` at never, 4, 16 and 64 KiB.
//! - `regbuf` (not in the default set): the `small` and `bulk` pulls with the receive-buffer
//!   pool off (`STARWIRE_BUF_SIZE=0`) and on (4 MiB per loop; registered as io_uring fixed
//!   buffers on io_uring), interleaved in one run.
//! - `--sites`: where those allocations come from (backtraces; build with
//!   `CARGO_PROFILE_BENCH_DEBUG=line-tables-only` for file:line).
//!
//! Placement is the ping bench's (see `docs/performance-log.md`, Method): the client (this
//! process) on the first allowed CPU, every server a child process (this binary re-executed
//! with `--server ...`) on the second, one pinned loop per side.

use std::alloc::{GlobalAlloc, Layout, System};
use std::backtrace::Backtrace;
use std::cell::Cell;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use starwire::client::Mode;
use starwire::{
    Client, Completion, Embedded, Handle, Options, Rendezvous, Reply, Runtime, Service, Stats,
    Tensor, TensorAllocator, TensorDesc, TensorMemory,
};
use starwire::{DType, Status};

mod common;
use common::*;

// ----- counting global allocator -----

/// Counts every allocation call (`alloc`, `alloc_zeroed`, `realloc`) of the process and,
/// while `TRACE` is set, records a backtrace of each.
struct CountingAlloc;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static ALLOC_BYTES: AtomicU64 = AtomicU64::new(0);
static TRACE: AtomicBool = AtomicBool::new(false);
static SITES: Mutex<Vec<Backtrace>> = Mutex::new(Vec::new());

thread_local! {
    static IN_TRACE: Cell<bool> = const { Cell::new(false) };
}

#[inline]
fn note(size: usize) {
    ALLOCS.fetch_add(1, Relaxed);
    ALLOC_BYTES.fetch_add(size as u64, Relaxed);
    if TRACE.load(Relaxed) {
        trace_site();
    }
}

#[cold]
fn trace_site() {
    let _ = IN_TRACE.try_with(|busy| {
        if busy.get() {
            return;
        }
        busy.set(true);
        let bt = Backtrace::force_capture();
        if let Ok(mut v) = SITES.lock() {
            v.push(bt);
        }
        busy.set(false);
    });
}

// SAFETY: every call is forwarded unchanged to `System`; the counting has no effect on the
// memory returned.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note(l.size());
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        note(new);
        // SAFETY: forwarded with the caller's pointer, layout and size.
        unsafe { System.realloc(p, l, new) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn allocs() -> u64 {
    ALLOCS.load(Relaxed)
}

fn start_trace() {
    SITES.lock().unwrap().clear();
    TRACE.store(true, Relaxed);
}

/// Stops tracing and returns the recorded allocation sites, grouped, most frequent first.
fn stop_trace() -> Vec<(String, usize)> {
    TRACE.store(false, Relaxed);
    let traces: Vec<Backtrace> = std::mem::take(&mut *SITES.lock().unwrap());
    let mut groups: HashMap<String, usize> = HashMap::new();
    if std::env::var_os("TRANSPORT_RAW_TRACE").is_some() {
        if let Some(bt) = traces.first() {
            eprintln!("{bt}");
        }
    }
    for bt in &traces {
        *groups.entry(site_of(&format!("{bt}"))).or_default() += 1;
    }
    let mut v: Vec<(String, usize)> = groups.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v
}

/// Condenses a backtrace to the allocating library call and the starwire (or bench) frames
/// above it.
fn site_of(bt: &str) -> String {
    // Frames: "  N: function" optionally followed by "      at file:line:col".
    let mut frames: Vec<(String, Option<String>)> = Vec::new();
    for line in bt.lines() {
        let t = line.trim();
        if let Some(at) = t.strip_prefix("at ") {
            if let Some(last) = frames.last_mut() {
                if last.1.is_none() {
                    last.1 = Some(at.trim_start_matches("./").to_string());
                }
            }
        } else if let Some((n, f)) = t.split_once(": ") {
            if n.chars().all(|c| c.is_ascii_digit()) {
                frames.push((f.to_string(), None));
            }
        }
    }
    // Ours: frames in this crate's src/ or in the benches, by file (inlined frames carry
    // short names, so names alone do not tell).
    let ours = |at: &Option<String>| {
        at.as_deref().is_some_and(|a| {
            !a.contains("/rustc/") && !a.contains(".cargo/") && !a.contains("csu/")
        })
    };
    // Skip the allocator's own frames: everything up to the last __rust_alloc* frame.
    let start = frames
        .iter()
        .rposition(|(f, _)| f.starts_with("__rust_alloc") || f.starts_with("__rust_realloc"))
        .map_or(0, |i| i + 1);
    let frames = &frames[start..];
    let Some(first) = frames.iter().position(|(_, at)| ours(at)) else {
        return frames
            .iter()
            .take(6)
            .map(|(f, _)| f.as_str())
            .collect::<Vec<_>>()
            .join(" <- ");
    };
    let short = |f: &str| f.split('<').next().unwrap_or(f).to_string();
    let callee = if first > 0 {
        short(&frames[first - 1].0)
    } else {
        "(direct)".to_string()
    };
    let chain: Vec<String> = frames[first..]
        .iter()
        .filter(|(_, at)| ours(at))
        .take(4)
        .map(|(f, at)| format!("{} {}", short(f), at.as_deref().unwrap_or("")))
        .collect();
    format!("{callee} <- {}", chain.join(" <- "))
}

// ----- options -----

#[derive(Clone, Debug)]
struct Opts {
    runs: usize,
    window: Duration,
    sections: Vec<String>,
    backends: Vec<Backend>,
    /// Requests counted per allocation measurement.
    alloc_n: usize,
    bulk_4m: usize,
    bulk_64m: usize,
    sites: bool,
    /// Window per run of the sparse section.
    sparse_window: Duration,
    /// Window per tensor size per run of the zero-copy section.
    zc_window: Duration,
    /// Size mixes of the sparse section.
    sparse_mixes: Vec<String>,
    /// Sparse section: steps the server publishes before serving (0: a producer thread).
    sparse_prefill: u64,
    /// Workloads of the zero-copy section: 1 (one tensor per request) or 2 (also 1 MiB
    /// per request).
    zc_workloads: usize,
}

const HELP: &str = "\
transport bench: pull/push vs raw blocking sockets, allocations per request

  cargo bench --bench transport [-- OPTIONS]

OPTIONS
  --quick             1 run, 0.2 s windows, fewer bulk transfers
  --runs N            runs per configuration (default 5)
  --secs F            throughput window in seconds (default 0.3)
  --sections LIST     comma list of small,bulk,alloc,sparse,zerocopy,regbuf
                      (default small,bulk,alloc)
  --sparse-secs F     window per run of the sparse section (default 1.0)
  --sparse-mix LIST   comma list of mixed,small: the sparse step's tensor sizes, 64 B-64 KiB
                      cycled or all 64 B (default both)
  --sparse-prefill N  sparse section: the server publishes N steps before it serves and
                      runs no producer; each run times steps 3..N (isolates the
                      producer's share of the server CPU)
  --zc-single         zerocopy section: only the one-tensor-per-request workload
  --zc-secs F         window per size per run of the zerocopy section (default 0.25)
  --backends LIST     comma list of uring,epoll (default both)
  --alloc-n N         requests per allocation count (default 1000)
  --one WORKLOAD VARIANT BACKEND MEM SECS
                      one configuration at 1 in flight, for perf/strace: WORKLOAD
                      small|4m|64m, VARIANT raw|embedded|handle, MEM heap|pool
  --sites             print the allocation sites of each workload (Embedded client, both
                      processes) instead of the sections; build with
                      CARGO_PROFILE_BENCH_DEBUG=line-tables-only for file:line
";

fn parse_opts(args: &[String]) -> Opts {
    let mut o = Opts {
        runs: 5,
        window: Duration::from_millis(300),
        sections: ["small", "bulk", "alloc"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        backends: vec![Backend::Uring, Backend::Epoll],
        alloc_n: 1000,
        bulk_4m: 32,
        bulk_64m: 4,
        sites: false,
        sparse_window: Duration::from_millis(1000),
        zc_window: Duration::from_millis(250),
        sparse_mixes: vec!["mixed".into(), "small".into()],
        zc_workloads: 2,
        sparse_prefill: 0,
    };
    let mut i = 0;
    let value = |i: usize| -> &str {
        args.get(i + 1)
            .unwrap_or_else(|| panic!("{} needs a value", args[i]))
    };
    while i < args.len() {
        match args[i].as_str() {
            "--quick" => {
                o.runs = 1;
                o.window = Duration::from_millis(200);
                o.bulk_4m = 8;
                o.bulk_64m = 2;
                o.alloc_n = 200;
                o.sparse_window = Duration::from_millis(300);
                o.zc_window = Duration::from_millis(100);
            }
            "--sparse-secs" => {
                o.sparse_window =
                    Duration::from_secs_f64(value(i).parse().expect("--sparse-secs F"));
                i += 1;
            }
            "--sparse-mix" => {
                o.sparse_mixes = value(i).split(',').map(str::to_string).collect();
                i += 1;
            }
            "--zc-single" => o.zc_workloads = 1,
            "--sparse-prefill" => {
                o.sparse_prefill = value(i).parse().expect("--sparse-prefill N");
                i += 1;
            }
            "--zc-secs" => {
                o.zc_window = Duration::from_secs_f64(value(i).parse().expect("--zc-secs F"));
                i += 1;
            }
            "--runs" => {
                o.runs = value(i).parse().expect("--runs N");
                i += 1;
            }
            "--secs" => {
                o.window = Duration::from_secs_f64(value(i).parse().expect("--secs F"));
                i += 1;
            }
            "--sections" => {
                o.sections = value(i).split(',').map(str::to_string).collect();
                i += 1;
            }
            "--backends" => {
                o.backends = value(i).split(',').map(Backend::parse).collect();
                i += 1;
            }
            "--alloc-n" => {
                o.alloc_n = value(i).parse().expect("--alloc-n N");
                i += 1;
            }
            "--sites" => o.sites = true,
            "--help" | "-h" => {
                print!("{HELP}");
                std::process::exit(0);
            }
            other => panic!("unknown option {other:?}\n{HELP}"),
        }
        i += 1;
    }
    o
}

// ----- the data both servers serve -----

/// Ids 0..SMALL_COUNT are 64-byte tensors (f32 x 16).
const SMALL_COUNT: u64 = 100;
const SMALL_BYTES: usize = 64;
const ID_4M: u64 = 1_000_000;
const ID_64M: u64 = 1_000_001;
const MIB: usize = 1 << 20;
/// Ids ZC_BASE + k are tensors of ZC_SIZES[k] bytes (the zero-copy threshold sweep).
const ZC_BASE: u64 = 2_000_000;
const KIB: usize = 1 << 10;
const ZC_SIZES: [usize; 5] = [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB];

fn bytes_of(id: u64) -> usize {
    match id {
        ID_4M => 4 * MIB,
        ID_64M => 64 * MIB,
        ZC_BASE..=2_000_004 => ZC_SIZES[(id - ZC_BASE) as usize],
        _ => SMALL_BYTES,
    }
}

fn contents(id: u64) -> Vec<u8> {
    (0..bytes_of(id))
        .map(|i| (i as u64).wrapping_mul(2654435761).wrapping_add(id) as u8)
        .collect()
}

fn tensor(id: u64) -> Tensor {
    let n = bytes_of(id) / 4;
    Tensor::from_bytes(DType::F32, &[n as u64], contents(id)).unwrap()
}

fn all_ids() -> Vec<u64> {
    (0..SMALL_COUNT)
        .chain([ID_4M, ID_64M])
        .chain(ZC_BASE..ZC_BASE + ZC_SIZES.len() as u64)
        .collect()
}

/// Pull reads a fixed table (no lock, no allocation); push accepts every item and drops it.
struct Table {
    small: Vec<Arc<Tensor>>,
    big: [Arc<Tensor>; 2],
    zc: Vec<Arc<Tensor>>,
}

impl Table {
    fn new() -> Table {
        Table {
            small: (0..SMALL_COUNT).map(|id| Arc::new(tensor(id))).collect(),
            big: [Arc::new(tensor(ID_4M)), Arc::new(tensor(ID_64M))],
            zc: (ZC_BASE..ZC_BASE + ZC_SIZES.len() as u64)
                .map(|id| Arc::new(tensor(id)))
                .collect(),
        }
    }
}

impl Service for Table {
    fn pull(&self, ids: &[u64], out: &mut Vec<Result<Arc<Tensor>, Status>>) {
        for &id in ids {
            out.push(match id {
                ID_4M => Ok(self.big[0].clone()),
                ID_64M => Ok(self.big[1].clone()),
                ZC_BASE..=2_000_004 => Ok(self.zc[(id - ZC_BASE) as usize].clone()),
                _ => self.small.get(id as usize).cloned().ok_or(Status::NotFound),
            });
        }
    }

    fn push(&self, items: &mut Vec<(u64, Tensor)>, statuses: &mut Vec<Status>) {
        statuses.extend(items.iter().map(|_| Status::Ok));
    }
}

// ----- raw baseline protocol -----
//
// Request: a 32-byte header (count of ids in bytes 0..4), then count x 8-byte ids.
// Reply: a 32-byte header (body length in bytes 0..8), then per id a 16-byte item header
// (id, byte length u32, status u32) and the tensor's bytes. Tensors of 16 KiB or more are
// written straight from the table (no copy), like starwire's by-reference send; smaller ones
// are copied into the reply buffer, which goes out with one write_all.

const RAW_HEADER: usize = 32;
const RAW_ITEM: usize = 16;
const RAW_DIRECT_MIN: usize = 16 * 1024;

fn raw_request(ids: &[u64]) -> Vec<u8> {
    let mut req = vec![0u8; RAW_HEADER];
    req[..4].copy_from_slice(&(ids.len() as u32).to_le_bytes());
    for id in ids {
        req.extend_from_slice(&id.to_le_bytes());
    }
    req
}

fn raw_reply_len(ids: &[u64]) -> usize {
    RAW_HEADER + ids.iter().map(|&id| RAW_ITEM + bytes_of(id)).sum::<usize>()
}

fn raw_serve(s: TcpStream, table: Arc<HashMap<u64, Vec<u8>>>) {
    s.set_nodelay(true).ok();
    let mut w = s.try_clone().expect("clone");
    let mut r = BufReader::with_capacity(1 << 16, s);
    let mut head = [0u8; RAW_HEADER];
    let mut ids: Vec<u8> = Vec::new();
    let mut out: Vec<u8> = Vec::with_capacity(1 << 16);
    loop {
        if r.read_exact(&mut head).is_err() {
            return;
        }
        let count = u32::from_le_bytes(head[..4].try_into().unwrap()) as usize;
        ids.resize(count * 8, 0);
        if r.read_exact(&mut ids).is_err() {
            return;
        }
        let body: usize = ids
            .chunks_exact(8)
            .map(|c| {
                let id = u64::from_le_bytes(c.try_into().unwrap());
                RAW_ITEM + table.get(&id).map_or(0, Vec::len)
            })
            .sum();
        out.clear();
        out.extend_from_slice(&(body as u64).to_le_bytes());
        out.resize(RAW_HEADER, 0);
        for c in ids.chunks_exact(8) {
            let id = u64::from_le_bytes(c.try_into().unwrap());
            let t = table.get(&id);
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&(t.map_or(0, Vec::len) as u32).to_le_bytes());
            out.extend_from_slice(&(if t.is_some() { 0u32 } else { 1 }).to_le_bytes());
            match t {
                Some(b) if b.len() >= RAW_DIRECT_MIN => {
                    if w.write_all(&out).is_err() || w.write_all(b).is_err() {
                        return;
                    }
                    out.clear();
                }
                Some(b) => out.extend_from_slice(b),
                None => {}
            }
        }
        if !out.is_empty() && w.write_all(&out).is_err() {
            return;
        }
    }
}

struct RawClient {
    w: TcpStream,
    r: BufReader<TcpStream>,
    req: Vec<u8>,
    reply: Vec<u8>,
    ids: Vec<u64>,
}

impl RawClient {
    fn connect(addr: SocketAddr) -> RawClient {
        let s = TcpStream::connect(addr).expect("raw connect");
        s.set_nodelay(true).unwrap();
        RawClient {
            w: s.try_clone().unwrap(),
            r: BufReader::with_capacity(1 << 16, s),
            req: Vec::new(),
            reply: Vec::new(),
            ids: Vec::new(),
        }
    }

    /// Prepares `inflight` copies of the request for `ids` and a reply buffer.
    fn prepare(&mut self, ids: &[u64], inflight: usize) {
        let one = raw_request(ids);
        self.req.clear();
        for _ in 0..inflight {
            self.req.extend_from_slice(&one);
        }
        self.reply.resize(raw_reply_len(ids), 0);
        self.ids = ids.to_vec();
    }

    /// Reads one reply into the preallocated buffer and checks its item headers.
    fn read_reply(&mut self) {
        self.r.read_exact(&mut self.reply).expect("raw reply");
        let mut at = RAW_HEADER;
        for &id in &self.ids {
            let got = u64::from_le_bytes(self.reply[at..at + 8].try_into().unwrap());
            let len = u32::from_le_bytes(self.reply[at + 8..at + 12].try_into().unwrap());
            assert!(got == id && len as usize == bytes_of(id), "raw reply item");
            at += RAW_ITEM + len as usize;
        }
    }

    /// Sends the prepared batch with one write_all, then reads every reply.
    fn batch(&mut self, inflight: usize) {
        self.w.write_all(&self.req).expect("raw request");
        for _ in 0..inflight {
            self.read_reply();
        }
    }
}

// ----- starwire clients -----

/// What a starwire request is.
#[derive(Clone)]
enum Work {
    Ping,
    Pull(Vec<u64>),
    Push(Vec<(u64, Arc<Tensor>)>),
}

impl Work {
    fn check(&self, c: &Completion) {
        match (self, &c.result) {
            (Work::Ping, Ok(Reply::Pong { .. })) => {}
            (Work::Pull(ids), Ok(Reply::Pulled(v))) if v.len() == ids.len() => {
                for (id, r) in ids.iter().zip(v) {
                    match r {
                        Ok(t) if t.byte_len() == bytes_of(*id) => {}
                        other => panic!("pull of {id}: {other:?}"),
                    }
                }
            }
            (Work::Push(items), Ok(Reply::Pushed(v))) if v.len() == items.len() => {
                assert!(v.iter().all(|s| *s == Status::Ok), "push statuses {v:?}");
            }
            (_, other) => panic!("request failed: {other:?}"),
        }
    }
}

/// A starwire client: submits requests and returns their completions.
trait SwClient {
    /// Submits `w` through the allocation-free calls (`pull_slice`, `push_slice`).
    fn submit(&mut self, w: &Work);
    /// The next completion, waiting as the loop would.
    fn next(&mut self) -> Completion;
    /// Hands a used completion back (`recycle`), so that its vectors serve the next request.
    fn recycle(&mut self, c: Completion);
    /// The next completion, checked against `w`, then recycled.
    fn next_checked(&mut self, w: &Work) {
        let c = self.next();
        w.check(&c);
        self.recycle(c);
    }
    fn stats(&self) -> Stats;
    /// Submits one recv of one key (`recv`).
    fn recv_one(&mut self, step: u64, key: &[u8]);
    /// Submits one fused recv of `keys` (`recv_many`).
    fn recv_many(&mut self, step: u64, keys: Vec<Vec<u8>>);
}

struct HandleClient {
    // Dropped before the runtime.
    h: Handle,
    rt: Runtime,
    peer: SocketAddr,
}

impl SwClient for HandleClient {
    fn submit(&mut self, w: &Work) {
        submit(&mut self.h, self.peer, w);
    }
    fn next(&mut self) -> Completion {
        self.h.wait_any().expect("a request outstanding")
    }
    fn recycle(&mut self, c: Completion) {
        self.h.recycle(c);
    }
    fn stats(&self) -> Stats {
        self.rt.stats()
    }
    fn recv_one(&mut self, step: u64, key: &[u8]) {
        let _ticket = self.h.recv(self.peer, step, key, None).expect("recv");
    }
    fn recv_many(&mut self, step: u64, keys: Vec<Vec<u8>>) {
        let _ticket = self
            .h
            .recv_many(self.peer, step, keys, None)
            .expect("recv_many");
    }
}

/// Submits `w` through the allocation-free calls, whichever mode drives the loop; its
/// completion is taken by `wait_any`.
fn submit<M: Mode>(c: &mut Client<M>, peer: SocketAddr, w: &Work) {
    let queued = match w {
        Work::Ping => c.ping(peer, 32, None).map(|t| t.tag()),
        Work::Pull(ids) => c.pull_slice(peer, ids, None).map(|t| t.tag()),
        Work::Push(items) => c.push_slice(peer, items, None).map(|t| t.tag()),
    };
    queued.expect("submit");
}

/// `Embedded`: its waits drive the loop the way `Loop::run` drives itself (see the ping
/// bench).
struct EmbeddedClient {
    e: Embedded,
    peer: SocketAddr,
}

impl SwClient for EmbeddedClient {
    fn submit(&mut self, w: &Work) {
        submit(&mut self.e, self.peer, w);
    }
    fn recycle(&mut self, c: Completion) {
        self.e.recycle(c);
    }
    fn next(&mut self) -> Completion {
        self.e.wait_any().expect("a request outstanding")
    }
    fn stats(&self) -> Stats {
        self.e.stats()
    }
    fn recv_one(&mut self, step: u64, key: &[u8]) {
        let _ticket = self.e.recv(self.peer, step, key, None).expect("recv");
    }
    fn recv_many(&mut self, step: u64, keys: Vec<Vec<u8>>) {
        let _ticket = self
            .e
            .recv_many(self.peer, step, keys, None)
            .expect("recv_many");
    }
}

/// Client-side memory for received tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mem {
    /// The default `HeapAllocator` (fresh zeroed memory per tensor).
    Heap,
    /// A pool of buffers reused across requests (what a trainer with its own buffers does).
    Pool,
}

/// Buffers handed out by `Pool` go back to it when their tensor is dropped.
#[derive(Default)]
struct Pool {
    free: Mutex<Vec<Vec<u8>>>,
}

struct Pooled {
    buf: Vec<u8>,
    pool: Arc<Pool>,
}

// SAFETY: the buffer is never resized while the value lives; `Drop` hands it back to the
// pool only when the tensor is gone.
unsafe impl TensorMemory for Pooled {
    fn bytes(&self) -> &[u8] {
        &self.buf
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        self.pool.free.lock().unwrap().push(buf);
    }
}

struct PoolAlloc(Arc<Pool>);

impl TensorAllocator for PoolAlloc {
    fn allocate(&self, d: &TensorDesc<'_>) -> Option<Box<dyn TensorMemory>> {
        let len = d.byte_len as usize;
        let buf = {
            let mut free = self.0.free.lock().unwrap();
            match free.iter().position(|b| b.len() == len) {
                Some(i) => free.swap_remove(i),
                None => vec![0u8; len],
            }
        };
        Some(Box::new(Pooled {
            buf,
            pool: self.0.clone(),
        }))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Raw,
    Handle,
    Embedded,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Raw => "raw blocking",
            Variant::Handle => "Runtime+Handle",
            Variant::Embedded => "Embedded",
        }
    }
}

fn sw_client(variant: Variant, cfg: SwCfg, mem: Mem, peer: SocketAddr) -> Box<dyn SwClient> {
    sw_client_with(variant, cfg, mem, peer, ClientExtra::default())
}

/// Client settings beyond `SwCfg` and `Mem` (the sparse and zero-copy sections).
#[derive(Clone, Copy, Debug)]
struct ClientExtra {
    /// `Options::zero_copy_min` (`None`: the default).
    zero_copy_min: Option<u64>,
    /// `Config::tensor_fuse`.
    tensor_fuse: bool,
    /// `Runtime::handle` capacity.
    handle_capacity: usize,
}

impl Default for ClientExtra {
    fn default() -> Self {
        ClientExtra {
            zero_copy_min: None,
            tensor_fuse: false,
            handle_capacity: 64,
        }
    }
}

fn sw_client_with(
    variant: Variant,
    cfg: SwCfg,
    mem: Mem,
    peer: SocketAddr,
    extra: ClientExtra,
) -> Box<dyn SwClient> {
    let options = Options {
        allocator: match mem {
            Mem::Heap => None,
            Mem::Pool => Some(Arc::new(PoolAlloc(Arc::new(Pool::default())))),
        },
        zero_copy_min: extra.zero_copy_min,
        ..Options::default()
    };
    let config = cfg
        .builder("worker")
        .tensor_fuse(extra.tensor_fuse)
        .build()
        .expect("config");
    match variant {
        Variant::Handle => {
            let rt = Runtime::start_with(config, options).expect("client runtime");
            let h = rt.handle(extra.handle_capacity);
            Box::new(HandleClient { h, rt, peer })
        }
        Variant::Embedded => Box::new(EmbeddedClient {
            e: Embedded::with_options(config, options).expect("embedded client"),
            peer,
        }),
        Variant::Raw => unreachable!("raw has its own client"),
    }
}

/// One request at a time for `window`; returns (requests, p50 µs).
fn sw_serial(c: &mut dyn SwClient, w: &Work, window: Duration) -> (u64, f64) {
    let mut lat = Vec::with_capacity(1 << 16);
    let end = Instant::now() + window;
    while Instant::now() < end {
        let t = Instant::now();
        c.submit(w);
        let done = c.next();
        lat.push(t.elapsed().as_nanos() as u64);
        w.check(&done);
        c.recycle(done);
    }
    (lat.len() as u64, p50_us(lat))
}

/// Keeps `inflight` requests outstanding for `window`; returns the requests completed in it.
fn sw_pipelined(c: &mut dyn SwClient, w: &Work, inflight: usize, window: Duration) -> u64 {
    for _ in 0..inflight {
        c.submit(w);
    }
    let end = Instant::now() + window;
    let mut done = 0;
    let mut outstanding = inflight;
    loop {
        c.next_checked(w);
        outstanding -= 1;
        if Instant::now() >= end {
            break;
        }
        done += 1;
        c.submit(w);
        outstanding += 1;
    }
    while outstanding > 0 {
        c.next_checked(w);
        outstanding -= 1;
    }
    done
}

fn p50_us(mut lat: Vec<u64>) -> f64 {
    if lat.is_empty() {
        return f64::NAN;
    }
    lat.sort_unstable();
    lat[lat.len() / 2] as f64 / 1e3
}

// ----- server child process -----

/// What the server reports on `A`.
#[derive(Clone, Copy, Debug, Default)]
struct ServerCounts {
    allocs: u64,
    cpu_ns: u64,
    /// The server loop's busy time (0 for the raw server).
    busy_ns: u64,
}

impl Server {
    fn new(cpu: usize, variant: Variant, cfg: SwCfg) -> Server {
        match variant {
            Variant::Raw => Server::spawn(cpu, &["raw".into()]),
            _ => {
                let mut kind = vec!["sw".to_string()];
                kind.extend(cfg.args());
                Server::spawn(cpu, &kind)
            }
        }
    }

    fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").expect("ask server");
        self.stdin.flush().ok();
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("server answer");
        line
    }

    fn counts(&mut self) -> ServerCounts {
        let line = self.ask("A");
        let v: Vec<u64> = line
            .split_whitespace()
            .map(|x| x.parse().expect("counter"))
            .collect();
        ServerCounts {
            allocs: v[0],
            cpu_ns: v[1],
            busy_ns: v[2],
        }
    }
}

fn server_main(args: &[String]) {
    let cpu: usize = args[0].parse().expect("server cpu");
    restrict_to(cpu);
    let mut out = std::io::stdout();
    let stdin = std::io::stdin();
    let mut rt: Option<Runtime> = None;
    match args[1].as_str() {
        "raw" => {
            let table: Arc<HashMap<u64, Vec<u8>>> =
                Arc::new(all_ids().into_iter().map(|id| (id, contents(id))).collect());
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
            writeln!(out, "ADDR {}", listener.local_addr().unwrap()).unwrap();
            std::thread::spawn(move || {
                for s in listener.incoming() {
                    let Ok(s) = s else { continue };
                    let table = table.clone();
                    std::thread::spawn(move || raw_serve(s, table));
                }
            });
        }
        "sw" => {
            let cfg = SwCfg::from_args(&args[2..]);
            let server = Runtime::start_with(
                cfg.config("ps"),
                Options {
                    service: Some(Arc::new(Table::new())),
                    ..Options::listen("127.0.0.1:0".parse().unwrap())
                },
            )
            .expect("server runtime");
            writeln!(out, "ADDR {}", server.local_addr().unwrap()).unwrap();
            rt = Some(server);
        }
        "rv" => {
            // The sparse-step server: a rendezvous kept filled by a producer thread, or
            // (prefill > 0) filled with that many steps before it starts serving.
            let sizes = sparse_sizes(&args[2]);
            let prefill: u64 = args[3].parse().expect("prefill steps");
            let cfg = SwCfg::from_args(&args[4..]);
            let rv = Rendezvous::new();
            let server = Runtime::start_with(
                cfg.config("ps"),
                Options {
                    rendezvous: Some(rv.clone()),
                    ..Options::listen("127.0.0.1:0".parse().unwrap())
                },
            )
            .expect("server runtime");
            writeln!(out, "ADDR {}", server.local_addr().unwrap()).unwrap();
            rt = Some(server);
            if prefill > 0 {
                let tensors = sparse_tensors(sizes);
                for step in 0..prefill {
                    sparse_publish(&rv, &tensors, step);
                }
            } else {
                std::thread::spawn(move || sparse_producer(&rv, sizes));
            }
        }
        other => panic!("server kind {other:?}"),
    }
    out.flush().unwrap();
    // One line buffer for all commands, so that reading a command does not allocate.
    let mut line = String::with_capacity(64);
    let mut input = stdin.lock();
    loop {
        line.clear();
        match input.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        match line.trim() {
            "A" => {
                // Read the counter before formatting: the answer itself allocates.
                let n = allocs();
                let busy = rt.as_ref().map_or(0, |r| r.stats().busy.as_nanos());
                writeln!(out, "{} {} {}", n, process_cpu_time().as_nanos(), busy).unwrap();
            }
            "T" => {
                start_trace();
                writeln!(out, "OK").unwrap();
            }
            "U" => {
                let sites = stop_trace();
                print_sites("server", &sites);
                writeln!(out, "OK").unwrap();
            }
            other => panic!("server command {other:?}"),
        }
        out.flush().unwrap();
    }
}

fn print_sites(who: &str, sites: &[(String, usize)]) {
    for (site, n) in sites {
        eprintln!("{who} {n:>6}  {site}");
    }
}

// ----- sections -----

fn small_ids() -> Vec<u64> {
    (0..SMALL_COUNT).collect()
}

fn push_items() -> Vec<(u64, Arc<Tensor>)> {
    (0..SMALL_COUNT)
        .map(|id| (id, Arc::new(tensor(id))))
        .collect()
}

/// One configuration of a table.
#[derive(Clone, Copy, Debug)]
struct Conf {
    variant: Variant,
    cfg: SwCfg,
    mem: Mem,
}

impl Conf {
    fn label(&self) -> String {
        match self.variant {
            Variant::Raw => "raw blocking".into(),
            v => {
                let mut s = format!("{} {}", v.name(), self.cfg.backend.name());
                if self.cfg.polling {
                    s.push_str(" polling on");
                }
                if self.mem == Mem::Pool {
                    s.push_str(" (pooled buffers)");
                }
                s
            }
        }
    }
}

fn default_cfg(backend: Backend) -> SwCfg {
    SwCfg {
        backend,
        polling: false,
        spin: starwire::config::DEFAULT_SPIN,
    }
}

fn configs(o: &Opts, mems: &[Mem]) -> Vec<Conf> {
    let mut v = vec![Conf {
        variant: Variant::Raw,
        cfg: default_cfg(Backend::Uring),
        mem: Mem::Heap,
    }];
    for &backend in &o.backends {
        for variant in [Variant::Embedded, Variant::Handle] {
            for &mem in mems {
                v.push(Conf {
                    variant,
                    cfg: default_cfg(backend),
                    mem,
                });
            }
        }
    }
    v
}

/// Runs `f` for every configuration, `o.runs` times, interleaved (run 1 of every
/// configuration, then run 2, ...), so drift in the machine's load spreads over all.
fn interleaved<S>(
    o: &Opts,
    confs: &[Conf],
    mut f: impl FnMut(&Conf) -> S,
    show: impl Fn(&S) -> String,
) -> Vec<Vec<S>> {
    let mut rows: Vec<Vec<S>> = confs.iter().map(|_| Vec::new()).collect();
    for run in 0..o.runs {
        for (conf, row) in confs.iter().zip(rows.iter_mut()) {
            let t = Instant::now();
            let s = f(conf);
            eprintln!(
                "run {}/{} {:<40} {} ({:.1}s)",
                run + 1,
                o.runs,
                conf.label(),
                show(&s),
                t.elapsed().as_secs_f64()
            );
            row.push(s);
        }
    }
    rows
}

fn med<S>(v: &[S], f: impl Fn(&S) -> f64) -> f64 {
    median(v.iter().map(f).collect())
}

#[derive(Clone, Copy, Debug, Default)]
struct SmallSample {
    rate1: f64,
    p50: f64,
    rate64: f64,
    client_cpu1: f64,
    server_cpu1: f64,
    server_busy1: f64,
}

fn small_session(o: &Opts, cpus: (usize, usize), conf: &Conf) -> SmallSample {
    let mut server = Server::new(cpus.1, conf.variant, conf.cfg);
    let ids = small_ids();
    let secs = o.window.as_secs_f64();
    let mut s = SmallSample::default();
    if conf.variant == Variant::Raw {
        let mut c = RawClient::connect(server.addr);
        c.prepare(&ids, 1);
        for _ in 0..300 {
            c.batch(1);
        }
        let mut lat = Vec::with_capacity(1 << 16);
        let (s0, cpu0) = (server.counts(), process_cpu_time());
        let end = Instant::now() + o.window;
        while Instant::now() < end {
            let t = Instant::now();
            c.batch(1);
            lat.push(t.elapsed().as_nanos() as u64);
        }
        let (s1, cpu1) = (server.counts(), process_cpu_time());
        let n = lat.len() as f64;
        s.rate1 = n / secs;
        s.client_cpu1 = (cpu1 - cpu0).as_secs_f64() * 1e6 / n;
        s.server_cpu1 = (s1.cpu_ns - s0.cpu_ns) as f64 / 1e3 / n;
        s.server_busy1 = f64::NAN;
        s.p50 = p50_us(lat);
        c.prepare(&ids, 64);
        let end = Instant::now() + o.window;
        let mut done = 0u64;
        while Instant::now() < end {
            c.batch(64);
            done += 64;
        }
        s.rate64 = done as f64 / secs;
    } else {
        let mut c = sw_client(conf.variant, conf.cfg, conf.mem, server.addr);
        let w = Work::Pull(ids);
        for _ in 0..300 {
            c.submit(&w);
            c.next_checked(&w);
        }
        let (s0, cpu0) = (server.counts(), process_cpu_time());
        let (n, p50) = sw_serial(c.as_mut(), &w, o.window);
        let (s1, cpu1) = (server.counts(), process_cpu_time());
        let n = n as f64;
        s.rate1 = n / secs;
        s.p50 = p50;
        s.client_cpu1 = (cpu1 - cpu0).as_secs_f64() * 1e6 / n;
        s.server_cpu1 = (s1.cpu_ns - s0.cpu_ns) as f64 / 1e3 / n;
        s.server_busy1 = (s1.busy_ns - s0.busy_ns) as f64 / 1e3 / n;
        s.rate64 = sw_pipelined(c.as_mut(), &w, 64, o.window) as f64 / secs;
    }
    server.stop();
    s
}

fn small_section(o: &Opts, cpus: (usize, usize)) {
    let confs = configs(o, &[Mem::Heap, Mem::Pool]);
    let rows = interleaved(
        o,
        &confs,
        |c| small_session(o, cpus, c),
        |s| {
            format!(
                "1-inflight {:.0}/s p50 {:.1}µs 64-inflight {:.0}/s",
                s.rate1, s.p50, s.rate64
            )
        },
    );
    let raw = &rows[0];
    let (raw1, raw64) = (med(raw, |s| s.rate1), med(raw, |s| s.rate64));
    println!(
        "\n### Pull of 100 x 64 B tensors (median of {} runs, {:.1} s windows)\n",
        o.runs,
        o.window.as_secs_f64()
    );
    println!("Targets: 1 in flight ≥ 1.0x raw (1 in flight); 64 in flight ≥ 1.5x raw (64 pipelined). CPU is process user+system µs per request in the 1-in-flight window (spinning included); server loop busy is the server loop's `Stats.busy` per request (work only).\n");
    println!("| configuration | p50 µs | 1 in flight /s | vs raw (target ≥ 1.0x) | 64 in flight /s | vs raw 64 (target ≥ 1.5x) | client CPU µs/req | server CPU µs/req | server loop busy µs/req |");
    println!("|---|---:|---:|---|---:|---|---:|---:|---:|");
    for (conf, row) in confs.iter().zip(&rows) {
        let (r1, r64) = (med(row, |s| s.rate1), med(row, |s| s.rate64));
        let (t1, t64) = match conf.variant {
            Variant::Raw => ("1.00x".to_string(), "1.00x".to_string()),
            _ => (
                format!("{:.2}x: {}", r1 / raw1, verdict(r1 / raw1 >= 1.0)),
                format!("{:.2}x: {}", r64 / raw64, verdict(r64 / raw64 >= 1.5)),
            ),
        };
        println!(
            "| {} | {:.1} | {:.0} | {} | {:.0} | {} | {:.1} | {:.1} | {} |",
            conf.label(),
            med(row, |s| s.p50),
            r1,
            t1,
            r64,
            t64,
            med(row, |s| s.client_cpu1),
            med(row, |s| s.server_cpu1),
            match conf.variant {
                Variant::Raw => "—".to_string(),
                _ => format!("{:.1}", med(row, |s| s.server_busy1)),
            },
        );
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct BulkSample {
    /// GB/s (1e9 bytes per second) for the 4 MiB and the 64 MiB tensor.
    gbps: [f64; 2],
    /// Client and server CPU ms per transfer.
    client_ms: [f64; 2],
    server_ms: [f64; 2],
    /// Fraction of received payload bytes that landed in place (starwire only).
    direct: [f64; 2],
}

fn bulk_session(o: &Opts, cpus: (usize, usize), conf: &Conf) -> BulkSample {
    let mut server = Server::new(cpus.1, conf.variant, conf.cfg);
    let mut s = BulkSample::default();
    let mut raw = (conf.variant == Variant::Raw).then(|| RawClient::connect(server.addr));
    let mut sw = (conf.variant != Variant::Raw)
        .then(|| sw_client(conf.variant, conf.cfg, conf.mem, server.addr));
    for (k, (id, count)) in [(ID_4M, o.bulk_4m), (ID_64M, o.bulk_64m)]
        .into_iter()
        .enumerate()
    {
        let w = Work::Pull(vec![id]);
        if let Some(c) = raw.as_mut() {
            c.prepare(&[id], 1);
        }
        let one = |raw: &mut Option<RawClient>, sw: &mut Option<Box<dyn SwClient>>| {
            if let Some(c) = raw.as_mut() {
                c.batch(1);
            } else {
                let c = sw.as_mut().unwrap();
                c.submit(&w);
                c.next_checked(&w);
            }
        };
        // Warm-up: connection, pool buffers, page cache of the server's memory.
        for _ in 0..2 {
            one(&mut raw, &mut sw);
        }
        let st0 = sw.as_ref().map(|c| c.stats());
        let (s0, cpu0, t0) = (server.counts(), process_cpu_time(), Instant::now());
        for _ in 0..count {
            one(&mut raw, &mut sw);
        }
        let el = t0.elapsed().as_secs_f64();
        let (s1, cpu1) = (server.counts(), process_cpu_time());
        let n = count as f64;
        s.gbps[k] = (bytes_of(id) * count) as f64 / el / 1e9;
        s.client_ms[k] = (cpu1 - cpu0).as_secs_f64() * 1e3 / n;
        s.server_ms[k] = (s1.cpu_ns - s0.cpu_ns) as f64 / 1e6 / n;
        if let (Some(st0), Some(c)) = (st0, sw.as_ref()) {
            let st1 = c.stats();
            let d = (st1.payload_direct - st0.payload_direct) as f64;
            let cp = (st1.payload_copied - st0.payload_copied) as f64;
            s.direct[k] = d / (d + cp);
        }
    }
    drop(sw);
    drop(raw);
    server.stop();
    s
}

fn bulk_section(o: &Opts, cpus: (usize, usize)) {
    let confs = configs(o, &[Mem::Heap, Mem::Pool]);
    let rows = interleaved(
        o,
        &confs,
        |c| bulk_session(o, cpus, c),
        |s| format!("4 MiB {:.2} GB/s, 64 MiB {:.2} GB/s", s.gbps[0], s.gbps[1]),
    );
    let raw = &rows[0];
    let raw_g = [med(raw, |s| s.gbps[0]), med(raw, |s| s.gbps[1])];
    println!(
        "\n### Bulk pull, one tensor per request (median of {} runs; {} x 4 MiB and {} x 64 MiB per run, 1 in flight)\n",
        o.runs, o.bulk_4m, o.bulk_64m
    );
    println!("Target: ≥ 0.9x the raw socket's GB/s (1 GB = 1e9 bytes). CPU is process user+system ms per transfer; \"in place\" is payload_direct / (payload_direct + payload_copied) on the client.\n");
    println!("| configuration | 4 MiB GB/s | vs raw (≥ 0.9x) | client / server CPU ms | in place | 64 MiB GB/s | vs raw (≥ 0.9x) | client / server CPU ms | in place |");
    println!("|---|---:|---|---:|---:|---:|---|---:|---:|");
    for (conf, row) in confs.iter().zip(&rows) {
        let mut cells = Vec::new();
        for (k, raw_gk) in raw_g.iter().enumerate() {
            let g = med(row, |s| s.gbps[k]);
            cells.push(format!("{g:.2}"));
            cells.push(match conf.variant {
                Variant::Raw => "1.00x".into(),
                _ => format!("{:.2}x: {}", g / raw_gk, verdict(g / raw_gk >= 0.9)),
            });
            cells.push(format!(
                "{:.2} / {:.2}",
                med(row, |s| s.client_ms[k]),
                med(row, |s| s.server_ms[k])
            ));
            cells.push(match conf.variant {
                Variant::Raw => "—".into(),
                _ => format!("{:.1} %", med(row, |s| s.direct[k]) * 100.0),
            });
        }
        println!("| {} | {} |", conf.label(), cells.join(" | "));
    }
}

/// Allocation calls per request, client and server, for each workload.
#[derive(Clone, Copy, Debug, Default)]
struct AllocSample {
    client: [f64; 3],
    server: [f64; 3],
}

const WORKLOADS: [&str; 3] = ["ping 32 B", "pull 100 x 64 B", "push 100 x 64 B"];

fn workloads() -> [Work; 3] {
    [
        Work::Ping,
        Work::Pull(small_ids()),
        Work::Push(push_items()),
    ]
}

fn alloc_session(o: &Opts, cpus: (usize, usize), conf: &Conf) -> AllocSample {
    let mut server = Server::new(cpus.1, conf.variant, conf.cfg);
    let mut s = AllocSample::default();
    let n = o.alloc_n;
    if conf.variant == Variant::Raw {
        // Only the pull exchange exists raw: a check of the counter (expected 0 and 0).
        let mut c = RawClient::connect(server.addr);
        c.prepare(&small_ids(), 1);
        for _ in 0..300 {
            c.batch(1);
        }
        let (s0, c0) = (server.counts(), allocs());
        for _ in 0..n {
            c.batch(1);
        }
        let c1 = allocs();
        let s1 = server.counts();
        s.client = [f64::NAN, (c1 - c0) as f64 / n as f64, f64::NAN];
        s.server = [
            f64::NAN,
            (s1.allocs - s0.allocs) as f64 / n as f64,
            f64::NAN,
        ];
    } else {
        let mut c = sw_client(conf.variant, conf.cfg, conf.mem, server.addr);
        for (k, w) in workloads().iter().enumerate() {
            for _ in 0..300 {
                c.submit(w);
                c.next_checked(w);
            }
            let s0 = server.counts();
            let c0 = allocs();
            for _ in 0..n {
                c.submit(w);
                let done = c.next();
                w.check(&done);
                c.recycle(done);
            }
            let c1 = allocs();
            let s1 = server.counts();
            s.client[k] = (c1 - c0) as f64 / n as f64;
            s.server[k] = (s1.allocs - s0.allocs) as f64 / n as f64;
        }
    }
    server.stop();
    s
}

fn alloc_section(o: &Opts, cpus: (usize, usize)) {
    let confs = configs(o, &[Mem::Heap]);
    let rows = interleaved(
        o,
        &confs,
        |c| alloc_session(o, cpus, c),
        |s| format!("client {:?} server {:?}", s.client, s.server),
    );
    println!(
        "\n### Heap allocations per request in steady state (median of {} runs × {} requests after 300 warm-up, 1 in flight)\n",
        o.runs, o.alloc_n
    );
    println!("Allocation calls (alloc, alloc_zeroed, realloc) counted by the bench's global allocator in each whole process. Target: 0. The client submits with the allocation-free calls (`pull_slice`, `push_slice`) and hands each completion back (`recycle`).\n");
    println!("| configuration | ping client | ping server | pull client | pull server | push client | push server |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let cell = |v: f64| {
        if v.is_nan() {
            "—".to_string()
        } else {
            format!("{v:.2}")
        }
    };
    for (conf, row) in confs.iter().zip(&rows) {
        let mut cells = Vec::new();
        for k in 0..3 {
            cells.push(cell(med(row, |s| s.client[k])));
            cells.push(cell(med(row, |s| s.server[k])));
        }
        println!("| {} | {} |", conf.label(), cells.join(" | "));
    }
}

// ----- sparse step: one fused recv vs separate recvs -----

/// Keys per step, their sizes (cycled by key index) and how many steps the producer keeps
/// published ahead of the client.
const SPARSE_KEYS: usize = 500;
const SPARSE_MIXED: [usize; 6] = [64, 256, 1024, 4096, 16384, 65536];

/// The tensor sizes of a sparse mix, cycled by key index: `mixed` (64 B–64 KiB, the
/// issue's) or `small` (all 64 B: per-request cost only).
fn sparse_sizes(mix: &str) -> &'static [usize] {
    match mix {
        "mixed" => &SPARSE_MIXED,
        "small" => &[64],
        m => panic!("sparse mix {m:?}: expected mixed or small"),
    }
}
const SPARSE_AHEAD: usize = 4;

fn sparse_key(step: u64, i: usize) -> Vec<u8> {
    format!("s{step}/t{i}").into_bytes()
}

fn sparse_step_bytes(sizes: &[usize]) -> usize {
    (0..SPARSE_KEYS).map(|i| sizes[i % sizes.len()]).sum()
}

/// Server side: publishes step s's keys `s{s}/t{i}`, keeping at most `SPARSE_AHEAD` steps
/// of published, not yet received tensors.
fn sparse_producer(rv: &Rendezvous, sizes: &[usize]) {
    let tensors = sparse_tensors(sizes);
    for step in 0u64.. {
        while rv.ready_count() > (SPARSE_AHEAD - 1) * SPARSE_KEYS {
            std::thread::sleep(Duration::from_micros(50));
        }
        sparse_publish(rv, &tensors, step);
    }
}

/// Publishes the keys of `step`.
fn sparse_publish(rv: &Rendezvous, tensors: &[Arc<Tensor>], step: u64) {
    for i in 0..SPARSE_KEYS {
        rv.publish(&sparse_key(step, i), tensors[i % tensors.len()].clone())
            .expect("publish");
    }
}

/// One tensor per size, shared by every key of that size.
fn sparse_tensors(sizes: &[usize]) -> Vec<Arc<Tensor>> {
    sizes
        .iter()
        .map(|&b| {
            let bytes = (0..b).map(|i| i as u8).collect();
            Arc::new(Tensor::from_bytes(DType::F32, &[(b / 4) as u64], bytes).unwrap())
        })
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SparseMode {
    /// One `recv_many` of the step's 500 keys.
    Fused,
    /// 500 single-key recvs all submitted, then 500 completions waited for.
    Pipelined,
    /// The same with `tensor_fuse(true)` on the client.
    PipelinedAutoFuse,
    /// 500 single-key recvs one at a time.
    Sequential,
}

impl SparseMode {
    fn name(self) -> &'static str {
        match self {
            SparseMode::Fused => "fused: 1 recv_many of 500 keys",
            SparseMode::Pipelined => "500 separate recvs, pipelined",
            SparseMode::PipelinedAutoFuse => "500 separate recvs, pipelined, tensor_fuse(true)",
            SparseMode::Sequential => "500 separate recvs, sequential",
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct SparseSample {
    steps_per_s: f64,
    client_cpu_us: f64,
    server_cpu_us: f64,
    server_busy_us: f64,
    client_busy_us: f64,
}

/// Checks a recv completion; returns its received bytes.
fn recv_bytes(c: &Completion, expect: Option<&[usize]>) -> usize {
    match &c.result {
        Ok(Reply::Received(v)) => {
            if let Some(e) = expect {
                assert_eq!(v.len(), e.len(), "recv results");
            }
            v.iter()
                .enumerate()
                .map(|(k, r)| match r {
                    Ok(t) => {
                        if let Some(e) = expect {
                            assert_eq!(t.byte_len(), e[k], "recv of key {k}");
                        }
                        t.byte_len()
                    }
                    Err(st) => panic!("recv of key {k}: {st:?}"),
                })
                .sum()
        }
        other => panic!("recv failed: {other:?}"),
    }
}

fn sparse_step(c: &mut dyn SwClient, mode: SparseMode, step: u64, sizes: &[usize]) {
    let total = match mode {
        SparseMode::Fused => {
            let keys = (0..SPARSE_KEYS).map(|i| sparse_key(step, i)).collect();
            c.recv_many(step, keys);
            recv_bytes(&c.next(), Some(sizes))
        }
        SparseMode::Pipelined | SparseMode::PipelinedAutoFuse => {
            for i in 0..SPARSE_KEYS {
                c.recv_one(step, &sparse_key(step, i));
            }
            (0..SPARSE_KEYS).map(|_| recv_bytes(&c.next(), None)).sum()
        }
        SparseMode::Sequential => (0..SPARSE_KEYS)
            .map(|i| {
                c.recv_one(step, &sparse_key(step, i));
                recv_bytes(&c.next(), Some(&sizes[i..i + 1]))
            })
            .sum(),
    };
    assert_eq!(total, sizes.iter().sum::<usize>(), "bytes of step {step}");
}

#[derive(Clone, Copy, Debug)]
struct SparseConf {
    variant: Variant,
    cfg: SwCfg,
    mode: SparseMode,
    mix: &'static str,
}

fn sparse_session(o: &Opts, cpus: (usize, usize), conf: &SparseConf) -> SparseSample {
    let mut kind = vec![
        "rv".to_string(),
        conf.mix.to_string(),
        o.sparse_prefill.to_string(),
    ];
    kind.extend(conf.cfg.args());
    let mut server = Server::spawn(cpus.1, &kind);
    let extra = ClientExtra {
        tensor_fuse: conf.mode == SparseMode::PipelinedAutoFuse,
        handle_capacity: 1024,
        ..ClientExtra::default()
    };
    let mut c = sw_client_with(conf.variant, conf.cfg, Mem::Heap, server.addr, extra);
    let sizes: Vec<usize> = (0..SPARSE_KEYS)
        .map(|i| sparse_sizes(conf.mix)[i % sparse_sizes(conf.mix).len()])
        .collect();
    let mut step = 0u64;
    for _ in 0..3 {
        sparse_step(c.as_mut(), conf.mode, step, &sizes);
        step += 1;
    }
    let st0 = c.stats();
    let (s0, cpu0, t0) = (server.counts(), process_cpu_time(), Instant::now());
    let mut n = 0u64;
    // Prefilled: exactly the published steps; otherwise the window.
    while if o.sparse_prefill > 0 {
        step < o.sparse_prefill
    } else {
        t0.elapsed() < o.sparse_window
    } {
        sparse_step(c.as_mut(), conf.mode, step, &sizes);
        step += 1;
        n += 1;
    }
    let el = t0.elapsed().as_secs_f64();
    let (s1, cpu1) = (server.counts(), process_cpu_time());
    let st1 = c.stats();
    drop(c);
    server.stop();
    let n = n as f64;
    SparseSample {
        client_busy_us: (st1.busy - st0.busy).as_secs_f64() * 1e6 / n,
        steps_per_s: n / el,
        client_cpu_us: (cpu1 - cpu0).as_secs_f64() * 1e6 / n,
        server_cpu_us: (s1.cpu_ns - s0.cpu_ns) as f64 / 1e3 / n,
        server_busy_us: (s1.busy_ns - s0.busy_ns) as f64 / 1e3 / n,
    }
}

fn sparse_section(o: &Opts, cpus: (usize, usize)) {
    let modes = [
        SparseMode::Fused,
        SparseMode::Pipelined,
        SparseMode::PipelinedAutoFuse,
        SparseMode::Sequential,
    ];
    let mut confs = Vec::new();
    for mix in &o.sparse_mixes {
        let mix: &'static str = if mix == "small" { "small" } else { "mixed" };
        for &backend in &o.backends {
            for variant in [Variant::Embedded, Variant::Handle] {
                for mode in modes {
                    confs.push(SparseConf {
                        variant,
                        cfg: default_cfg(backend),
                        mode,
                        mix,
                    });
                }
            }
        }
    }
    let label = |c: &SparseConf| {
        format!(
            "{} {}: {}",
            c.variant.name(),
            c.cfg.backend.name(),
            c.mode.name()
        )
    };
    let mut rows: Vec<Vec<SparseSample>> = confs.iter().map(|_| Vec::new()).collect();
    for run in 0..o.runs {
        for (conf, row) in confs.iter().zip(rows.iter_mut()) {
            let s = sparse_session(o, cpus, conf);
            eprintln!(
                "run {}/{} {} {:<68} {:.1} steps/s",
                run + 1,
                o.runs,
                conf.mix,
                label(conf),
                s.steps_per_s
            );
            row.push(s);
        }
    }
    let mut last_mix = "";
    for (k, (conf, row)) in confs.iter().zip(&rows).enumerate() {
        let sizes = sparse_sizes(conf.mix);
        let mb = sparse_step_bytes(sizes) as f64 / 1e6;
        if conf.mix != last_mix {
            last_mix = conf.mix;
            println!(
                "\n### Sparse step, {} mix: {SPARSE_KEYS} tensors of {:?} B cycled ({:.3} MB per step), one fused recv vs separate recvs (median of {} runs, {})\n",
                conf.mix,
                sizes,
                mb,
                o.runs,
                if o.sparse_prefill > 0 {
                    format!(
                        "{} steps prefilled by the server, steps 3..{} timed, no producer thread",
                        o.sparse_prefill, o.sparse_prefill
                    )
                } else {
                    format!("{:.1} s windows", o.sparse_window.as_secs_f64())
                }
            );
            println!("Target: fused ≥ 5x the steps/s of 500 separate recvs (pipelined). \"fused / this\" is the fused row's steps/s over this row's (same client and backend). CPU is process user+system µs per step; loop busy is that end's loop `Stats.busy` per step (work only). Unless prefilled, the server's producer thread (publishing, ≤ {SPARSE_AHEAD} steps ahead) shares the server CPU.\n");
            println!("| configuration | steps/s | GB/s | fused / this | client CPU µs/step | client loop busy µs/step | server CPU µs/step | server loop busy µs/step |");
            println!("|---|---:|---:|---|---:|---:|---:|---:|");
        }
        let fused_row = &rows[k - modes.iter().position(|&m| m == conf.mode).unwrap()];
        let fused = med(fused_row, |s| s.steps_per_s);
        let r = med(row, |s| s.steps_per_s);
        let ratio = fused / r;
        let cell = match conf.mode {
            SparseMode::Fused => "1.00x".to_string(),
            SparseMode::Pipelined => format!("{ratio:.2}x: {}", verdict(ratio >= 5.0)),
            _ => format!("{ratio:.2}x"),
        };
        println!(
            "| {} | {:.1} | {:.3} | {} | {:.0} | {} | {:.0} | {:.0} |",
            label(conf),
            r,
            r * mb / 1e3,
            cell,
            med(row, |s| s.client_cpu_us),
            // Embedded keeps no busy time (the caller drives its loop).
            match conf.variant {
                Variant::Embedded => "—".to_string(),
                _ => format!("{:.0}", med(row, |s| s.client_busy_us)),
            },
            med(row, |s| s.server_cpu_us),
            med(row, |s| s.server_busy_us),
        );
    }
}

// ----- zero-copy threshold sweep -----

#[derive(Clone, Copy, Debug, Default)]
struct ZcSample {
    /// Per workload (0: one tensor per request; 1: 1 MiB of such tensors per request) and
    /// size in ZC_SIZES: requests per second, fraction received in place.
    rate: [[f64; 5]; 2],
    direct: [[f64; 5]; 2],
}

const ZC_THRESHOLDS: [u64; 4] = [u64::MAX, 4 * 1024, 16 * 1024, 64 * 1024];

fn zc_name(x: u64) -> String {
    match x {
        u64::MAX => "never (u64::MAX)".into(),
        x => format!("{} KiB", x / 1024),
    }
}

fn size_name(b: usize) -> String {
    if b >= MIB {
        format!("{} MiB", b / MIB)
    } else {
        format!("{} KiB", b / KIB)
    }
}

/// Tensors per request of workload `w` for size index `k`.
fn zc_count(w: usize, k: usize) -> usize {
    if w == 0 {
        1
    } else {
        (MIB / ZC_SIZES[k]).max(1)
    }
}

fn zc_session(o: &Opts, cpus: (usize, usize), conf: &ZcConf) -> ZcSample {
    let server = Server::new(cpus.1, Variant::Embedded, conf.cfg);
    let extra = ClientExtra {
        zero_copy_min: Some(conf.x),
        ..ClientExtra::default()
    };
    let mut c = sw_client_with(conf.variant, conf.cfg, conf.mem, server.addr, extra);
    let mut s = ZcSample::default();
    for w in 0..o.zc_workloads {
        for k in 0..ZC_SIZES.len() {
            let work = Work::Pull(vec![ZC_BASE + k as u64; zc_count(w, k)]);
            for _ in 0..30 {
                c.submit(&work);
                c.next_checked(&work);
            }
            let st0 = c.stats();
            let t0 = Instant::now();
            let (n, _) = sw_serial(c.as_mut(), &work, o.zc_window);
            s.rate[w][k] = n as f64 / t0.elapsed().as_secs_f64();
            let st1 = c.stats();
            let d = (st1.payload_direct - st0.payload_direct) as f64;
            let cp = (st1.payload_copied - st0.payload_copied) as f64;
            s.direct[w][k] = d / (d + cp);
        }
    }
    drop(c);
    server.stop();
    s
}

#[derive(Clone, Copy, Debug)]
struct ZcConf {
    variant: Variant,
    cfg: SwCfg,
    mem: Mem,
    x: u64,
}

fn zerocopy_section(o: &Opts, cpus: (usize, usize)) {
    let mut confs = Vec::new();
    for &backend in &o.backends {
        for mem in [Mem::Heap, Mem::Pool] {
            for x in ZC_THRESHOLDS {
                confs.push(ZcConf {
                    variant: Variant::Embedded,
                    cfg: default_cfg(backend),
                    mem,
                    x,
                });
            }
        }
    }
    let label = |c: &ZcConf| {
        format!(
            "{} {}{}, zero_copy_min {}",
            c.variant.name(),
            c.cfg.backend.name(),
            if c.mem == Mem::Pool {
                " (pooled buffers)"
            } else {
                ""
            },
            zc_name(c.x)
        )
    };
    let mut rows: Vec<Vec<ZcSample>> = confs.iter().map(|_| Vec::new()).collect();
    for run in 0..o.runs {
        for (conf, row) in confs.iter().zip(rows.iter_mut()) {
            let t = Instant::now();
            let s = zc_session(o, cpus, conf);
            eprintln!(
                "run {}/{} {:<60} {:?} ({:.1}s)",
                run + 1,
                o.runs,
                label(conf),
                s.rate.map(|w| w.map(|r| r.round())),
                t.elapsed().as_secs_f64()
            );
            row.push(s);
        }
    }
    for w in 0..o.zc_workloads {
        println!(
            "\n### Zero-copy threshold sweep, {}, 1 in flight (median of {} runs, {:.2} s per size)\n",
            if w == 0 {
                "pull of one tensor per request"
            } else {
                "pull of 1 MiB per request in tensors of the column's size (256 x 4 KiB ... 1 x 1 MiB)"
            },
            o.runs,
            o.zc_window.as_secs_f64()
        );
        println!("Each cell: GB/s (1e9 bytes/s of tensor contents) / ratio to `never` (u64::MAX: always copied) of the same client and memory / share of payload received in place (`payload_direct`).\n");
        println!(
            "| configuration | {} |",
            ZC_SIZES.map(size_name).join(" | ")
        );
        println!("|---|{}", "---:|".repeat(ZC_SIZES.len()));
        for (k, (conf, row)) in confs.iter().zip(&rows).enumerate() {
            let never_row = &rows[k - ZC_THRESHOLDS.iter().position(|&x| x == conf.x).unwrap()];
            let cells: Vec<String> = (0..ZC_SIZES.len())
                .map(|j| {
                    let r = med(row, |s| s.rate[w][j]);
                    let never = med(never_row, |s| s.rate[w][j]);
                    let bytes = (ZC_SIZES[j] * zc_count(w, j)) as f64;
                    format!(
                        "{:.2} / {:.2}x / {:.0} %",
                        r * bytes / 1e9,
                        r / never,
                        med(row, |s| s.direct[w][j]) * 100.0
                    )
                })
                .collect();
            println!("| {} | {} |", label(conf), cells.join(" | "));
        }
    }
}

/// `--sites`: allocation sites per request of each workload, Embedded client, both ends.
fn sites_main(o: &Opts, cpus: (usize, usize)) {
    const TRACED: usize = 4;
    for &backend in &o.backends {
        let cfg = default_cfg(backend);
        let mut server = Server::new(cpus.1, Variant::Embedded, cfg);
        let mut c = sw_client(Variant::Embedded, cfg, Mem::Heap, server.addr);
        for (k, w) in workloads().iter().enumerate() {
            for _ in 0..300 {
                c.submit(w);
                c.next_checked(w);
            }
            eprintln!(
                "\n== {} {}: allocation sites over {TRACED} requests (count = total) ==",
                WORKLOADS[k],
                backend.name()
            );
            assert!(server.ask("T").starts_with("OK"));
            start_trace();
            for _ in 0..TRACED {
                c.submit(w);
                let done = c.next();
                w.check(&done);
                c.recycle(done);
            }
            let sites = stop_trace();
            assert!(server.ask("U").starts_with("OK"));
            print_sites("client", &sites);
        }
        drop(c);
        server.stop();
    }
}

/// `--one WORKLOAD VARIANT BACKEND MEM SECS`: one configuration, 1 in flight, for
/// perf/strace. WORKLOAD small|4m|64m, VARIANT raw|embedded|handle, MEM heap|pool.
fn one_main(args: &[String], cpus: (usize, usize)) {
    let ids = match args[0].as_str() {
        "small" => small_ids(),
        "4m" => vec![ID_4M],
        "64m" => vec![ID_64M],
        w => panic!("workload {w:?}"),
    };
    let variant = match args[1].as_str() {
        "raw" => Variant::Raw,
        "embedded" => Variant::Embedded,
        "handle" => Variant::Handle,
        v => panic!("variant {v:?}"),
    };
    let cfg = default_cfg(Backend::parse(&args[2]));
    let mem = if args[3] == "pool" {
        Mem::Pool
    } else {
        Mem::Heap
    };
    let window = Duration::from_secs_f64(args[4].parse().expect("seconds"));
    let server = Server::new(cpus.1, variant, cfg);
    let n = if variant == Variant::Raw {
        let mut c = RawClient::connect(server.addr);
        c.prepare(&ids, 1);
        let end = Instant::now() + window;
        let mut n = 0u64;
        while Instant::now() < end {
            c.batch(1);
            n += 1;
        }
        n
    } else {
        let mut c = sw_client(variant, cfg, mem, server.addr);
        sw_serial(c.as_mut(), &Work::Pull(ids), window).0
    };
    eprintln!(
        "{} {:?}: {n} requests in {:.1} s",
        args.join(" "),
        variant,
        window.as_secs_f64()
    );
    server.stop();
}

// ----- regbuf: the receive-buffer pool off and on -----

/// Pool sizes compared: off, and 64 receive buffers of 64 KiB per loop.
const REGBUF_POOLS: [u64; 2] = [0, 4 << 20];

/// Sets `STARWIRE_BUF_SIZE`, which the client's config (`ConfigBuilder::from_env`) and the
/// server child (which inherits the environment) read. Called between sessions, when no
/// runtime of this process is running.
fn set_buf_size(bytes: u64) {
    std::env::set_var(starwire::config::ENV_BUF_SIZE, bytes.to_string());
}

fn regbuf_section(o: &Opts, cpus: (usize, usize)) {
    let saved = std::env::var_os(starwire::config::ENV_BUF_SIZE);
    let mut confs = vec![(
        Conf {
            variant: Variant::Raw,
            cfg: default_cfg(Backend::Uring),
            mem: Mem::Heap,
        },
        0,
    )];
    for &backend in &o.backends {
        for pool in REGBUF_POOLS {
            let conf = Conf {
                variant: Variant::Handle,
                cfg: default_cfg(backend),
                mem: Mem::Heap,
            };
            confs.push((conf, pool));
        }
    }
    let mut rows: Vec<Vec<(SmallSample, BulkSample)>> = confs.iter().map(|_| Vec::new()).collect();
    for run in 0..o.runs {
        for ((conf, pool), row) in confs.iter().zip(rows.iter_mut()) {
            set_buf_size(*pool);
            let t = Instant::now();
            let small = small_session(o, cpus, conf);
            let bulk = bulk_session(o, cpus, conf);
            eprintln!(
                "run {}/{} {:<28} pool {:>7}: 100x64B 1-inflight {:.0}/s 64-inflight {:.0}/s, 4 MiB {:.2} GB/s, 64 MiB {:.2} GB/s ({:.1}s)",
                run + 1,
                o.runs,
                conf.label(),
                pool,
                small.rate1,
                small.rate64,
                bulk.gbps[0],
                bulk.gbps[1],
                t.elapsed().as_secs_f64()
            );
            row.push((small, bulk));
        }
    }
    match saved {
        Some(v) => std::env::set_var(starwire::config::ENV_BUF_SIZE, v),
        None => std::env::remove_var(starwire::config::ENV_BUF_SIZE),
    }
    println!(
        "\n### Receive-buffer pool off and on: pull 100 x 64 B and single 4 MiB / 64 MiB tensors (median of {} runs, {:.1} s windows; {} x 4 MiB, {} x 64 MiB per run)\n",
        o.runs,
        o.window.as_secs_f64(),
        o.bulk_4m,
        o.bulk_64m
    );
    println!("\"vs off\" is the ratio to the same backend with the pool off, same run. On io_uring a pool is registered (fixed buffers, `READ_FIXED`); on epoll it is the same memory, unregistered.\n");
    println!("| configuration | STARWIRE_BUF_SIZE | 100x64B 1 in flight /s | vs off | 64 in flight /s | vs off | 4 MiB GB/s | vs off | 64 MiB GB/s | vs off | 64 MiB in place |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut off = [0.0f64; 4];
    for ((conf, pool), row) in confs.iter().zip(&rows) {
        let v = [
            median(row.iter().map(|r| r.0.rate1).collect()),
            median(row.iter().map(|r| r.0.rate64).collect()),
            median(row.iter().map(|r| r.1.gbps[0]).collect()),
            median(row.iter().map(|r| r.1.gbps[1]).collect()),
        ];
        if *pool == 0 {
            off = v;
        }
        let ratio = |k: usize| match (conf.variant, *pool) {
            (Variant::Raw, _) | (_, 0) => "—".to_string(),
            _ => format!("{:.2}x", v[k] / off[k]),
        };
        let in_place = match conf.variant {
            Variant::Raw => "—".to_string(),
            _ => format!(
                "{:.1} %",
                median(row.iter().map(|r| r.1.direct[1]).collect()) * 100.0
            ),
        };
        println!(
            "| {} | {} | {:.0} | {} | {:.0} | {} | {:.2} | {} | {:.2} | {} | {} |",
            conf.label(),
            pool,
            v[0],
            ratio(0),
            v[1],
            ratio(1),
            v[2],
            ratio(2),
            v[3],
            ratio(3),
            in_place
        );
    }
}

fn main() {
    let args = bench_args();
    if args.first().map(String::as_str) == Some("--server") {
        return server_main(&args[1..]);
    }
    let allowed = allowed_cpus();
    assert!(
        allowed.len() >= 2,
        "the transport bench needs two CPUs, this process may use {allowed:?}"
    );
    let cpus = (allowed[0], allowed[1]);
    if args.first().map(String::as_str) == Some("--one") {
        restrict_to(cpus.0);
        return one_main(&args[1..], cpus);
    }
    let o = parse_opts(&args);
    restrict_to(cpus.0);
    let start = Instant::now();
    if o.sites {
        return sites_main(&o, cpus);
    }
    println!("load average at start: {}", loadavg());
    println!(
        "client on CPU {}, servers on CPU {}; {} runs per configuration, interleaved; polling off, spin {} µs",
        cpus.0,
        cpus.1,
        o.runs,
        starwire::config::DEFAULT_SPIN.as_micros()
    );
    for section in &o.sections {
        match section.as_str() {
            "small" => small_section(&o, cpus),
            "bulk" => bulk_section(&o, cpus),
            "alloc" => alloc_section(&o, cpus),
            "sparse" => sparse_section(&o, cpus),
            "zerocopy" => zerocopy_section(&o, cpus),
            "regbuf" => regbuf_section(&o, cpus),
            other => panic!("unknown section {other:?}"),
        }
    }
    println!("\nload average at end: {}", loadavg());
    eprintln!("total {:.1} s", start.elapsed().as_secs_f64());
}
