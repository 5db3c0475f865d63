//! io_uring zero-copy send (`IORING_OP_SEND_ZC`) against plain `IORING_OP_SEND` for large
//! payloads over one loopback TCP connection: throughput and CPU time of each end.
//!
//! `cargo bench --bench send_zc` measures payloads of 16 KiB, 64 KiB, 256 KiB, 1 MiB and
//! 4 MiB with 1 and 4 sends in flight, 5 runs of 1.5 s per configuration, and prints one
//! markdown table of medians; `-- --help` lists the options.
//!
//! Setup of one measurement: a fresh TCP connection over 127.0.0.1 (both ends
//! `TCP_NODELAY`, as starwire's sockets; default buffer sizes). The receiver, a thread pinned
//! to the second allowed CPU, reads with blocking `read` into a 4 MiB buffer and counts bytes
//! until end of stream. The sender, a thread pinned to the first allowed CPU, drives its own
//! io_uring and sends one payload buffer over and over, as K "slots" (K = sends in flight):
//! each slot sends the whole payload as one message, continuing from the offset after a
//! short send, and starts its next message when the previous one is done. For `SendZc` a
//! message is done only when every notification CQE of its sends has arrived, the point
//! from which a real sender may reuse or free the buffer; the continuation of a short send
//! is issued at once (it covers other bytes). All slots point into the same unmodified
//! buffer, so the bytes of concurrent sends may interleave on the stream; the receiver only
//! counts them.
//!
//! Sends are made with `IORING_SEND_ZC_REPORT_USAGE`, so each notification says whether the
//! kernel ended up copying the data instead of sending the user pages
//! (`IORING_NOTIF_USAGE_ZC_COPIED`): the "zc notifs copied" column.
//!
//! What is measured: after a 0.2 s warm-up on the connection, the sender raises a flag and
//! the window starts; it ends when the sender has stopped submitting (after `--secs`) and
//! every completion and notification has arrived (sender), and at end of stream
//! (receiver). Throughput is the receiver's bytes over the receiver's window (from its first
//! read that sees the flag to end of stream), in GB/s (10^9 bytes/s). CPU is each thread's
//! own CPU time (`CLOCK_THREAD_CPUTIME_ID`) over its window divided by its bytes, in ns per
//! KiB. Softirq work done while a thread runs is charged to that thread unless the kernel
//! accounts IRQ time separately (`CONFIG_IRQ_TIME_ACCOUNTING`); on loopback the TCP receive
//! processing of a segment mostly runs in the softirq raised by the sender's transmit, so on
//! such kernels it lands in the sender's column. Softirq work the kernel defers to the
//! `ksoftirqd` thread of either CPU is in neither thread's column: the "ksoftirqd" column
//! gives the CPU time of `ksoftirqd/<sender CPU>` and `ksoftirqd/<receiver CPU>`
//! (`/proc/<pid>/schedstat`) over the sender's window per KiB sent. Work of io-wq workers or
//! done on an idle CPU is in no column.
//!
//! Rounds: in each round every size and in-flight count is measured in both modes, the mode
//! that goes first alternating from round to round, so background load falls on both alike.

use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring, Probe};

mod common;
use common::*;

/// `IORING_SEND_ZC_REPORT_USAGE` (linux/io_uring.h, 6.2): a `SendZc` flag asking the
/// notification CQE to report whether the data was copied.
const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
/// `IORING_NOTIF_USAGE_ZC_COPIED`: set in a notification's result when the kernel copied.
const NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;

/// The receiver's read buffer.
const RECV_BUF: usize = 4 << 20;
const DEFAULT_SIZES_KIB: &[usize] = &[16, 64, 256, 1024, 4096];
const DEFAULT_INFLIGHT: &[usize] = &[1, 4];

const HELP: &str = "\
send_zc bench: io_uring SendZc vs Send on loopback TCP, large payloads

  cargo bench --bench send_zc [-- OPTIONS]

OPTIONS
  --runs N          rounds; each configuration's figures are medians (default 5)
  --secs F          measured window per run in seconds (default 1.5)
  --warmup F        warm-up before each window in seconds (default 0.2)
  --sizes LIST      comma list of payload sizes in KiB (default 16,64,256,1024,4096)
  --inflight LIST   comma list of sends in flight (default 1,4)
";

#[derive(Clone, Debug)]
struct Opts {
    runs: usize,
    window: Duration,
    warmup: Duration,
    sizes: Vec<usize>,
    inflight: Vec<usize>,
}

/// Prints `msg` and ends the process: used for failed system calls, so that no unwinding
/// runs while the kernel may still reference a buffer.
fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("send_zc: {msg}");
    std::process::exit(1)
}

fn parse_list(s: &str, what: &str) -> Vec<usize> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse()
                .unwrap_or_else(|_| fail(format!("{what}: {x:?} is not a number")))
        })
        .collect()
}

fn parse_opts(args: &[String]) -> Opts {
    let mut o = Opts {
        runs: 5,
        window: Duration::from_millis(1500),
        warmup: Duration::from_millis(200),
        sizes: DEFAULT_SIZES_KIB.iter().map(|k| k << 10).collect(),
        inflight: DEFAULT_INFLIGHT.to_vec(),
    };
    let mut i = 0;
    let value = |i: usize| -> &str {
        args.get(i + 1)
            .map(String::as_str)
            .unwrap_or_else(|| fail(format!("{} needs a value\n{HELP}", args[i])))
    };
    let secs = |s: &str, what: &str| -> Duration {
        s.parse::<f64>()
            .ok()
            .filter(|f| f.is_finite() && *f >= 0.0)
            .map(Duration::from_secs_f64)
            .unwrap_or_else(|| fail(format!("{what}: {s:?} is not a number of seconds")))
    };
    while i < args.len() {
        match args[i].as_str() {
            "--runs" => {
                o.runs = parse_list(value(i), "--runs")[0].max(1);
                i += 1;
            }
            "--secs" => {
                o.window = secs(value(i), "--secs");
                i += 1;
            }
            "--warmup" => {
                o.warmup = secs(value(i), "--warmup");
                i += 1;
            }
            "--sizes" => {
                o.sizes = parse_list(value(i), "--sizes")
                    .into_iter()
                    .map(|k| k << 10)
                    .collect();
                i += 1;
            }
            "--inflight" => {
                o.inflight = parse_list(value(i), "--inflight");
                i += 1;
            }
            "--help" | "-h" => {
                print!("{HELP}");
                std::process::exit(0);
            }
            other => fail(format!("unknown option {other:?}\n{HELP}")),
        }
        i += 1;
    }
    if o.sizes.iter().any(|&s| s == 0 || s > u32::MAX as usize) {
        fail("--sizes: every size must be at least 1 KiB and below 4 GiB");
    }
    if o.inflight.iter().any(|&k| k == 0 || k > 16) {
        fail("--inflight: every count must be 1 to 16");
    }
    o
}

// ----- measurement -----

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Plain,
    Zc,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Plain => "Send",
            Mode::Zc => "SendZc",
        }
    }
}

/// CPU time of the calling thread so far.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes into `ts`, a timespec owned by this frame.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        fail(format!(
            "clock_gettime(CLOCK_THREAD_CPUTIME_ID): {}",
            io::Error::last_os_error()
        ));
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// One end's bytes, CPU time and wall time over its window.
#[derive(Clone, Copy, Debug, Default)]
struct Window {
    bytes: u64,
    cpu: Duration,
    wall: Duration,
}

impl Window {
    fn ns_per_kib(&self) -> f64 {
        if self.bytes == 0 {
            return f64::NAN;
        }
        self.cpu.as_nanos() as f64 / (self.bytes as f64 / 1024.0)
    }
}

/// The `ksoftirqd` threads of the sender's and the receiver's CPU.
struct Softirqd {
    /// `/proc/<pid>/schedstat` of each, when found.
    schedstat: [Option<String>; 2],
}

impl Softirqd {
    fn find(cpus: (usize, usize)) -> Softirqd {
        let names = [
            format!("ksoftirqd/{}", cpus.0),
            format!("ksoftirqd/{}", cpus.1),
        ];
        let mut schedstat = [None, None];
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let pid = entry.file_name();
            let Some(pid) = pid
                .to_str()
                .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
            else {
                continue;
            };
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            for (k, name) in names.iter().enumerate() {
                if comm.trim() == name {
                    schedstat[k] = Some(format!("/proc/{pid}/schedstat"));
                }
            }
        }
        Softirqd { schedstat }
    }

    /// Nanoseconds each thread has run so far (the first field of schedstat).
    fn read(&self) -> [Option<u64>; 2] {
        self.schedstat.clone().map(|path| {
            std::fs::read_to_string(path?)
                .ok()?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct TxCounts {
    /// Send SQEs submitted in the window and after it.
    sends: u64,
    /// Of those, sends that moved fewer bytes than asked.
    shorts: u64,
    notifs: u64,
    /// Notifications with `IORING_NOTIF_USAGE_ZC_COPIED`.
    copied: u64,
    /// CPU time of the ksoftirqd threads of the sender's and the receiver's CPU over the
    /// sender's window.
    softirqd_ns: [Option<u64>; 2],
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    gbps: f64,
    tx_ns_kib: f64,
    rx_ns_kib: f64,
    /// ksoftirqd of the sender's and of the receiver's CPU, per KiB sent.
    softirqd_ns_kib: [f64; 2],
    counts: TxCounts,
}

/// Reads until end of stream; returns the window from the first read that finds
/// `measuring` set.
fn receiver(listener: TcpListener, cpu: usize, measuring: &AtomicBool) -> Window {
    restrict_to(cpu);
    let (mut s, _) = listener
        .accept()
        .unwrap_or_else(|e| fail(format!("accept: {e}")));
    s.set_nodelay(true).ok();
    // Written once so that its pages are mapped before the window.
    let mut buf = vec![1u8; RECV_BUF];
    let mut total = 0u64;
    let mut start: Option<(u64, Duration, Instant)> = None;
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => fail(format!("receiver read: {e}")),
        };
        total += n as u64;
        if start.is_none() && measuring.load(Ordering::Acquire) {
            start = Some((total, thread_cpu(), Instant::now()));
        }
    }
    let (cpu1, t1) = (thread_cpu(), Instant::now());
    let (b0, cpu0, t0) = start.unwrap_or((total, cpu1, t1));
    Window {
        bytes: total - b0,
        cpu: cpu1 - cpu0,
        wall: t1 - t0,
    }
}

/// One message in progress: a send of the whole payload, continued after short sends.
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    /// Bytes of the current message sent so far.
    off: usize,
    /// A send SQE of this slot has not completed.
    in_flight: bool,
    /// Notification CQEs announced (`IORING_CQE_F_MORE`) and not yet received. Signed so
    /// that the count stays right whichever of a send's two CQEs is reaped first.
    notifs: i32,
}

impl Slot {
    fn idle(&self) -> bool {
        !self.in_flight && self.notifs == 0
    }
}

/// Queues a send of `payload[off..]` for slot `slot`.
fn push_send(
    ring: &mut IoUring,
    fd: types::Fd,
    payload: &[u8],
    off: usize,
    mode: Mode,
    slot: usize,
) {
    let rest = &payload[off..];
    // `rest.len()` fits: sizes are checked to be below 4 GiB.
    let (ptr, len) = (rest.as_ptr(), rest.len() as u32);
    let entry: squeue::Entry = match mode {
        Mode::Plain => opcode::Send::new(fd, ptr, len).build(),
        Mode::Zc => opcode::SendZc::new(fd, ptr, len)
            .zc_flags(SEND_ZC_REPORT_USAGE)
            .build(),
    }
    .user_data(slot as u64);
    // SAFETY: the entry references `payload[off..]`, which the caller borrows for the whole
    // sender run: it is neither moved, written nor freed until `sender` returns, and
    // `sender` returns only after the completion of every send it queued and, for SendZc,
    // every notification they announced (or ends the process on an error). The socket `fd`
    // stays open for as long too.
    if unsafe { ring.submission().push(&entry) }.is_err() {
        fail("submission queue full");
    }
}

/// Sends `payload` over and over on a new connection to `addr` with `inflight` messages in
/// flight; returns its window and counters.
#[allow(clippy::too_many_arguments)]
fn sender(
    addr: SocketAddr,
    cpu: usize,
    payload: &[u8],
    inflight: usize,
    mode: Mode,
    warmup: Duration,
    window: Duration,
    measuring: &AtomicBool,
    softirqd: &Softirqd,
) -> (Window, TxCounts) {
    restrict_to(cpu);
    let stream = TcpStream::connect(addr).unwrap_or_else(|e| fail(format!("connect: {e}")));
    stream.set_nodelay(true).ok();
    let fd = types::Fd(stream.as_raw_fd());
    let mut ring = IoUring::new(64).unwrap_or_else(|e| fail(format!("io_uring setup: {e}")));
    let len = payload.len();
    let mut slots = vec![Slot::default(); inflight];
    let mut counts = TxCounts::default();
    let mut bytes = 0u64;
    let mut cqes: Vec<(u64, i32, u32)> = Vec::with_capacity(64);

    let t_start = Instant::now();
    let (warm_end, deadline) = (t_start + warmup, t_start + warmup + window);
    let mut start: Option<(u64, Duration, Instant)> = None;
    let mut softirqd0 = [None, None];
    for (i, slot) in slots.iter_mut().enumerate() {
        push_send(&mut ring, fd, payload, 0, mode, i);
        slot.in_flight = true;
        counts.sends += 1;
    }
    let mut stopping = false;
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => fail(format!("io_uring_enter: {e}")),
        }
        let now = Instant::now();
        if start.is_none() && now >= warm_end {
            start = Some((bytes, thread_cpu(), now));
            softirqd0 = softirqd.read();
            measuring.store(true, Ordering::Release);
        }
        stopping |= now >= deadline;
        cqes.clear();
        cqes.extend(
            ring.completion()
                .map(|c| (c.user_data(), c.result(), c.flags())),
        );
        for &(ud, res, flags) in &cqes {
            let i = ud as usize;
            let slot = &mut slots[i];
            if cqueue::notif(flags) {
                slot.notifs -= 1;
                counts.notifs += 1;
                if res as u32 & NOTIF_USAGE_ZC_COPIED != 0 {
                    counts.copied += 1;
                }
            } else {
                slot.in_flight = false;
                if cqueue::more(flags) {
                    slot.notifs += 1;
                }
                if res < 0 {
                    fail(format!(
                        "{} of {len} bytes: {}",
                        mode.name(),
                        io::Error::from_raw_os_error(-res)
                    ));
                }
                bytes += res as u64;
                slot.off += res as usize;
                if slot.off < len {
                    counts.shorts += 1;
                    if !stopping {
                        push_send(&mut ring, fd, payload, slot.off, mode, i);
                        slot.in_flight = true;
                        counts.sends += 1;
                    }
                }
            }
            if !stopping && slot.idle() && slot.off == len {
                slot.off = 0;
                push_send(&mut ring, fd, payload, 0, mode, i);
                slot.in_flight = true;
                counts.sends += 1;
            }
        }
        if stopping && slots.iter().all(Slot::idle) {
            break;
        }
    }
    let (cpu1, t1) = (thread_cpu(), Instant::now());
    let softirqd1 = softirqd.read();
    for k in 0..2 {
        counts.softirqd_ns[k] = match (softirqd0[k], softirqd1[k]) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
    }
    // Every send has completed and every notification arrived: nothing references
    // `payload` any more.
    drop(ring);
    stream.shutdown(Shutdown::Write).ok();
    drop(stream);
    let (b0, cpu0, t0) = start.unwrap_or((bytes, cpu1, t1));
    let w = Window {
        bytes: bytes - b0,
        cpu: cpu1 - cpu0,
        wall: t1 - t0,
    };
    (w, counts)
}

fn measure(
    o: &Opts,
    cpus: (usize, usize),
    payload: &[u8],
    inflight: usize,
    mode: Mode,
    softirqd: &Softirqd,
) -> Sample {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| fail(format!("bind: {e}")));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| fail(format!("local_addr: {e}")));
    let measuring = AtomicBool::new(false);
    let (rx, (tx, counts)) = std::thread::scope(|s| {
        let rx = s.spawn(|| receiver(listener, cpus.1, &measuring));
        let tx = s.spawn(|| {
            sender(
                addr, cpus.0, payload, inflight, mode, o.warmup, o.window, &measuring, softirqd,
            )
        });
        let tx = tx.join().unwrap_or_else(|_| fail("sender thread panicked"));
        let rx = rx
            .join()
            .unwrap_or_else(|_| fail("receiver thread panicked"));
        (rx, tx)
    });
    if tx.wall.is_zero() || rx.wall.is_zero() {
        fail("empty measurement window: is --secs 0?");
    }
    let kib = tx.bytes as f64 / 1024.0;
    Sample {
        gbps: rx.bytes as f64 / rx.wall.as_secs_f64() / 1e9,
        tx_ns_kib: tx.ns_per_kib(),
        rx_ns_kib: rx.ns_per_kib(),
        softirqd_ns_kib: counts
            .softirqd_ns
            .map(|ns| ns.map_or(f64::NAN, |ns| ns as f64 / kib)),
        counts,
    }
}

// ----- report -----

fn size_label(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes % (1 << 20) == 0 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

/// Whether this kernel's io_uring supports `IORING_OP_SEND_ZC`, or why it cannot be told.
fn probe_send_zc() -> Result<bool, String> {
    let ring = IoUring::new(8).map_err(|e| format!("io_uring setup: {e}"))?;
    let mut probe = Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|e| format!("IORING_REGISTER_PROBE: {e}"))?;
    Ok(probe.is_supported(opcode::SendZc::CODE))
}

fn main() {
    let args = bench_args();
    let o = parse_opts(&args);
    let allowed = allowed_cpus();
    if allowed.len() < 2 {
        fail(format!(
            "the send_zc bench needs two CPUs, this process may use {allowed:?}"
        ));
    }
    let cpus = (allowed[0], allowed[1]);
    let softirqd = Softirqd::find(cpus);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!("load average at start: {}", loadavg());
    println!("kernel {}", kernel.trim());
    let zc = match probe_send_zc() {
        Ok(true) => true,
        Ok(false) => {
            println!("IORING_OP_SEND_ZC is NOT supported by this kernel: measuring Send only");
            false
        }
        Err(e) => {
            println!("could not probe IORING_OP_SEND_ZC ({e}): measuring Send only");
            false
        }
    };
    let modes: Vec<Mode> = if zc {
        vec![Mode::Plain, Mode::Zc]
    } else {
        vec![Mode::Plain]
    };
    println!(
        "sender on CPU {}, receiver on CPU {}; {} rounds of {:.1} s windows after {:.1} s warm-up, modes alternating",
        cpus.0,
        cpus.1,
        o.runs,
        o.window.as_secs_f64(),
        o.warmup.as_secs_f64()
    );

    let start = Instant::now();
    let payloads: Vec<Vec<u8>> = o
        .sizes
        .iter()
        .map(|&n| (0..n).map(|i| (i * 131 + 7) as u8).collect())
        .collect();
    // samples[size][inflight][mode]
    let mut samples =
        vec![vec![vec![Vec::<Sample>::new(); modes.len()]; o.inflight.len()]; o.sizes.len()];
    for run in 0..o.runs {
        for (si, payload) in payloads.iter().enumerate() {
            for (ki, &k) in o.inflight.iter().enumerate() {
                for step in 0..modes.len() {
                    let mi = (step + run) % modes.len();
                    let mode = modes[mi];
                    let s = measure(&o, cpus, payload, k, mode, &softirqd);
                    let c = s.counts;
                    eprintln!(
                        "run {}/{} {:>7} x{} {:<6}: {:.2} GB/s, sender {:.1} ns/KiB, receiver {:.1} ns/KiB, ksoftirqd {:.1} / {:.1} ns/KiB, {} sends, {} short, {} notifs ({} copied)",
                        run + 1,
                        o.runs,
                        size_label(payload.len()),
                        k,
                        mode.name(),
                        s.gbps,
                        s.tx_ns_kib,
                        s.rx_ns_kib,
                        s.softirqd_ns_kib[0],
                        s.softirqd_ns_kib[1],
                        c.sends,
                        c.shorts,
                        c.notifs,
                        c.copied
                    );
                    samples[si][ki][mi].push(s);
                }
            }
        }
    }

    println!(
        "\n### SendZc vs Send, loopback TCP, one connection (median of {} runs, {:.1} s each)\n",
        o.runs,
        o.window.as_secs_f64()
    );
    println!("GB/s = 10^9 bytes/s at the receiver. CPU = thread CPU time (CLOCK_THREAD_CPUTIME_ID) of each end per KiB it moved. Ratios are zc/plain of the medians (GB/s: above 1 is better; sender CPU: below 1 is better). \"ksoftirqd\": CPU time of ksoftirqd on the sender's / the receiver's CPU per KiB sent, in neither thread's column. \"zc notifs copied\": notifications that reported IORING_NOTIF_USAGE_ZC_COPIED, over all runs.\n");
    println!("| size | in flight | mode | GB/s | sender ns/KiB | receiver ns/KiB | zc/plain GB/s | zc/plain sender CPU | ksoftirqd ns/KiB (sender / receiver CPU) | short sends | zc notifs copied |");
    println!("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let med = |v: &[Sample], f: fn(&Sample) -> f64| median(v.iter().map(f).collect());
    for (si, &size) in o.sizes.iter().enumerate() {
        for (ki, &k) in o.inflight.iter().enumerate() {
            let plain = &samples[si][ki][0];
            let (p_gbps, p_tx) = (med(plain, |s| s.gbps), med(plain, |s| s.tx_ns_kib));
            for (mi, mode) in modes.iter().enumerate() {
                let v = &samples[si][ki][mi];
                let (gbps, tx) = (med(v, |s| s.gbps), med(v, |s| s.tx_ns_kib));
                let sends: u64 = v.iter().map(|s| s.counts.sends).sum();
                let shorts: u64 = v.iter().map(|s| s.counts.shorts).sum();
                let (ratio_gbps, ratio_tx, copied) = match mode {
                    Mode::Plain => ("—".to_string(), "—".to_string(), "—".to_string()),
                    Mode::Zc => {
                        let notifs: u64 = v.iter().map(|s| s.counts.notifs).sum();
                        let copied: u64 = v.iter().map(|s| s.counts.copied).sum();
                        (
                            format!("{:.2}x", gbps / p_gbps),
                            format!("{:.2}x", tx / p_tx),
                            format!("{copied} / {notifs}"),
                        )
                    }
                };
                println!(
                    "| {} | {} | {} | {:.2} | {:.1} | {:.1} | {} | {} | {:.1} / {:.1} | {:.1} % | {} |",
                    size_label(size),
                    k,
                    mode.name(),
                    gbps,
                    tx,
                    med(v, |s| s.rx_ns_kib),
                    ratio_gbps,
                    ratio_tx,
                    med(v, |s| s.softirqd_ns_kib[0]),
                    med(v, |s| s.softirqd_ns_kib[1]),
                    shorts as f64 / sends.max(1) as f64 * 100.0,
                    copied
                );
            }
        }
    }
    println!("\nload average at end: {}", loadavg());
    eprintln!("total {:.1} s", start.elapsed().as_secs_f64());
}
