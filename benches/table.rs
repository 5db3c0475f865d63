//! The PS table in one process, one pinned thread: `PsTable` against the old `MemTable`
//! measured in the same run, per pulled and pushed row (Adagrad), 1,000 random ids per call,
//! at tables of 100 k, 4 M and 16 M rows of 16 f32 (64 B) after a warm-up that creates
//! every row; row-versioned pulls (`Table::pull_versioned`) holding no row and holding
//! every row unchanged; memory per row against the bytes of rows and optimizer state; and a
//! checkpoint of the largest table, its speed and the longest call a concurrent puller sees
//! during it.
//!
//! `cargo bench --bench table` runs the default set; `-- --help` lists the options. Every
//! figure says its table size and whether the rows and their state fit in the last-level
//! cache. This is the table alone: the targets are for the whole PS (wire and
//! table), so these figures show what the table leaves of them.

use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use starwire::rows::ps::{Init, Optimizer, PsTable};
use starwire::rows::MemTable;
use starwire::{Status, Table};

mod common;
use common::*;

const DIM: usize = 16;
const ROW_BYTES: usize = DIM * 4;
/// Bytes of a row and its Adagrad state: what memory is compared with.
const DATA_BYTES: usize = 2 * ROW_BYTES;
const IDS_PER_CALL: usize = 1000;
const LR: f32 = 0.05;
const INITIAL_ACCUMULATOR: f32 = 0.1;

struct Args {
    rows: Vec<u64>,
    runs: usize,
    calls: usize,
    old: bool,
    checkpoint: bool,
    dir: PathBuf,
    capacity: bool,
}

fn usage() -> ! {
    eprintln!(
        "cargo bench --bench table -- [--rows N,N,..] [--runs R] [--calls C] [--no-old] \
         [--no-checkpoint] [--dir PATH] [--no-capacity] [--quick]\n\
         \n\
         --rows         table sizes (default 100000,4000000,16000000)\n\
         --runs         timed runs per figure, the median reported (default 7)\n\
         --calls        calls of 1,000 ids per run (default 300)\n\
         --no-old       skip the old MemTable\n\
         --no-checkpoint  skip the checkpoint of the largest table\n\
         --dir          where the checkpoint goes (default: the system temp directory)\n\
         --no-capacity  build PsTable without the rows expected (it grows from empty)\n\
         --quick        --rows 100000,1000000 --runs 3 --calls 50: a check that it runs"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        rows: vec![100_000, 4_000_000, 16_000_000],
        runs: 7,
        calls: 300,
        old: true,
        checkpoint: true,
        dir: std::env::temp_dir(),
        capacity: true,
    };
    let argv = bench_args();
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().cloned().unwrap_or_else(|| usage());
        match arg.as_str() {
            "--rows" => {
                a.rows = value()
                    .split(',')
                    .map(|n| n.parse().unwrap_or_else(|_| usage()))
                    .collect()
            }
            "--runs" => a.runs = value().parse().unwrap_or_else(|_| usage()),
            "--calls" => a.calls = value().parse().unwrap_or_else(|_| usage()),
            "--no-old" => a.old = false,
            "--no-checkpoint" => a.checkpoint = false,
            "--dir" => a.dir = PathBuf::from(value()),
            "--no-capacity" => a.capacity = false,
            "--quick" => {
                a.rows = vec![100_000, 1_000_000];
                a.runs = 3;
                a.calls = 50;
            }
            _ => usage(),
        }
    }
    a
}

/// Resident memory of the process (`VmRSS`), bytes.
fn rss() -> u64 {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The last-level cache of CPU 0, bytes (0 when unknown).
fn llc_bytes() -> u64 {
    (0..8)
        .filter_map(|i| {
            let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
            let size = fs::read_to_string(format!("{dir}/size")).ok()?;
            let size = size.trim();
            let (n, unit) = size.split_at(size.len() - 1);
            let n: u64 = n.parse().ok()?;
            Some(match unit {
                "K" => n << 10,
                "M" => n << 20,
                _ => n,
            })
        })
        .max()
        .unwrap_or(0)
}

/// `calls` batches of 1,000 ids drawn uniformly from `0..rows` (xorshift, fixed seed).
fn random_batches(rows: u64, calls: usize, seed: u64) -> Vec<Vec<u64>> {
    let mut x = seed | 1;
    (0..calls)
        .map(|_| {
            (0..IDS_PER_CALL)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % rows
                })
                .collect()
        })
        .collect()
}

/// Gradient rows for a call: small values that vary by position.
fn gradients() -> Vec<u8> {
    (0..IDS_PER_CALL * DIM)
        .flat_map(|i| (((i % 7) as f32 - 3.0) * 0.01).to_le_bytes())
        .collect()
}

/// Creates rows `0..rows` with pulls of 1,000 ids, then pushes once to each.
fn warm_up(t: &dyn Table, rows: u64) {
    let mut out = vec![0u8; IDS_PER_CALL * ROW_BYTES];
    let mut missing = Vec::with_capacity(IDS_PER_CALL);
    let grads = gradients();
    let ids: Vec<u64> = (0..rows).collect();
    for batch in ids.chunks(IDS_PER_CALL) {
        let n = batch.len();
        assert_eq!(
            t.pull(batch, &mut out[..n * ROW_BYTES], &mut missing),
            Status::Ok
        );
        assert!(missing.is_empty(), "the warm-up creates every row");
        assert_eq!(t.push(batch, &grads[..n * ROW_BYTES]), Status::Ok);
    }
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Per row of one run: CPU nanoseconds of this thread, and wall nanoseconds. On a busy
/// machine the wall time includes time the thread did not run; the CPU time does not
/// (it is what the "PS CPU per row" counts).
#[derive(Clone, Copy)]
struct PerRow {
    cpu: f64,
    wall: f64,
}

fn timed(rows: usize, mut f: impl FnMut()) -> PerRow {
    let (cpu, wall) = (thread_cpu(), Instant::now());
    f();
    let n = rows as f64;
    PerRow {
        cpu: (thread_cpu() - cpu).as_nanos() as f64 / n,
        wall: wall.elapsed().as_nanos() as f64 / n,
    }
}

/// One run of pulls over `batches`.
fn pull_run(t: &dyn Table, batches: &[Vec<u64>]) -> PerRow {
    let mut out = vec![0u8; IDS_PER_CALL * ROW_BYTES];
    let mut missing = Vec::with_capacity(IDS_PER_CALL);
    let per_row = timed(batches.len() * IDS_PER_CALL, || {
        for ids in batches {
            t.pull(ids, &mut out, &mut missing);
        }
    });
    assert!(missing.is_empty());
    std::hint::black_box(&out);
    per_row
}

/// One run of versioned pulls over `batches`, holding `held` (per batch, a version per id;
/// the current ones: every row unchanged, or zeros: every row sent).
fn versioned_run(t: &dyn Table, batches: &[Vec<u64>], held: &[Vec<u64>]) -> PerRow {
    let mut out = vec![0u8; IDS_PER_CALL * ROW_BYTES];
    let mut versions = vec![0u64; IDS_PER_CALL];
    let mut missing = Vec::with_capacity(IDS_PER_CALL);
    let per_row = timed(batches.len() * IDS_PER_CALL, || {
        for (ids, held) in batches.iter().zip(held) {
            t.pull_versioned(ids, held, &mut out, &mut versions, &mut missing);
        }
    });
    assert!(missing.is_empty());
    std::hint::black_box(&out);
    per_row
}

/// The current version of every id of `batches`.
fn versions_of(t: &dyn Table, batches: &[Vec<u64>]) -> Vec<Vec<u64>> {
    let mut out = vec![0u8; IDS_PER_CALL * ROW_BYTES];
    let mut missing = Vec::new();
    batches
        .iter()
        .map(|ids| {
            let mut v = vec![0u64; ids.len()];
            t.pull_versioned(ids, &vec![0; ids.len()], &mut out, &mut v, &mut missing);
            v
        })
        .collect()
}

/// One run of pushes over `batches`.
fn push_run(t: &dyn Table, batches: &[Vec<u64>], grads: &[u8]) -> PerRow {
    timed(batches.len() * IDS_PER_CALL, || {
        for ids in batches {
            t.push(ids, grads);
        }
    })
}

/// Medians of runs.
fn medians(runs: &[PerRow]) -> PerRow {
    PerRow {
        cpu: median(runs.iter().map(|r| r.cpu).collect()),
        wall: median(runs.iter().map(|r| r.wall).collect()),
    }
}

/// One table's figures at one size.
struct Figures {
    pull: PerRow,
    push: PerRow,
    /// Resident bytes the table added, per row.
    rss_per_row: f64,
    /// The table's own count of the bytes it uses, per row (PsTable only).
    used_per_row: Option<f64>,
}

fn build_new(rows: u64, capacity: bool) -> PsTable {
    let mut b = PsTable::builder(DIM)
        .init(Init::Uniform {
            scale: 0.05,
            seed: 1,
        })
        .optimizer(Optimizer::Adagrad {
            lr: LR,
            initial_accumulator: INITIAL_ACCUMULATOR,
        })
        .hot_sample_every(128);
    if capacity {
        b = b.capacity(rows);
    }
    b.build().expect("PsTable")
}

fn build_old() -> MemTable {
    MemTable::new(
        DIM,
        starwire::rows::Init::Uniform {
            scale: 0.05,
            seed: 1,
        },
        starwire::rows::Optimizer::Adagrad {
            lr: LR,
            initial_accumulator: INITIAL_ACCUMULATOR,
        },
    )
}

fn main() {
    let args = parse_args();
    let cpus = allowed_cpus();
    restrict_to(cpus[0]);
    let llc = llc_bytes();
    println!(
        "# PS table, one thread pinned to CPU {}: {DIM} f32 per row ({ROW_BYTES} B), Adagrad, \
         {IDS_PER_CALL} random ids per call, median of {} runs of {} calls; load average {}",
        cpus[0],
        args.runs,
        args.calls,
        loadavg()
    );
    println!(
        "# last-level cache {} MiB; rows and state {DATA_BYTES} B per row; THP mode {}",
        llc >> 20,
        fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default()
            .trim()
    );
    println!();
    println!(
        "| rows | rows + state | in cache | table | pull ns/row CPU (wall) | push ns/row CPU \
         (wall) | resident B/row | used B/row | memory / (rows + state) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let grads = gradients();
    let mut largest: Option<PsTable> = None;
    for (i, &rows) in args.rows.iter().enumerate() {
        let data = rows * DATA_BYTES as u64;
        let in_cache = if data <= llc { "yes" } else { "no" };

        let before = rss();
        let new = build_new(rows, args.capacity);
        warm_up(&new, rows);
        let new_rss = rss().saturating_sub(before) as f64 / rows as f64;
        let report = new.report();
        let huge = new.huge_page_bytes().unwrap_or(0);
        let metrics = new.metrics();
        let old = args.old.then(|| {
            let before = rss();
            let old = build_old();
            warm_up(&old, rows);
            (old, rss().saturating_sub(before) as f64 / rows as f64)
        });

        // Runs alternate between the tables, each on batches of its own draw.
        let (mut new_pull, mut new_push, mut old_pull, mut old_push) =
            (vec![], vec![], vec![], vec![]);
        let (mut held_none, mut held_all) = (vec![], vec![]);
        for run in 0..args.runs {
            let batches = random_batches(rows, args.calls, 0x9e37 + run as u64 * 7919);
            new_pull.push(pull_run(&new, &batches));
            new_push.push(push_run(&new, &batches, &grads));
            // Row versions: a pull holding no row (every row sent, with its version) and
            // one holding every row at its version (none sent).
            let zeros: Vec<Vec<u64>> = batches.iter().map(|b| vec![0; b.len()]).collect();
            held_none.push(versioned_run(&new, &batches, &zeros));
            let current = versions_of(&new, &batches);
            held_all.push(versioned_run(&new, &batches, &current));
            if let Some((old, _)) = &old {
                old_pull.push(pull_run(old, &batches));
                old_push.push(push_run(old, &batches, &grads));
            }
        }
        let figures = Figures {
            pull: medians(&new_pull),
            push: medians(&new_push),
            rss_per_row: new_rss,
            used_per_row: Some(metrics.memory_bytes as f64 / rows as f64),
        };
        print_row(rows, data, in_cache, "PsTable", &figures);
        let (none, all) = (medians(&held_none), medians(&held_all));
        println!(
            "| {rows} | | | PsTable versioned pull: held none / all unchanged | {:.1} ({:.1}) / \
             {:.1} ({:.1}) | | | | |",
            none.cpu, none.wall, all.cpu, all.wall
        );
        if let Some((_, old_rss)) = &old {
            let old_figures = Figures {
                pull: medians(&old_pull),
                push: medians(&old_push),
                rss_per_row: *old_rss,
                used_per_row: None,
            };
            print_row(rows, data, in_cache, "MemTable (old)", &old_figures);
            println!(
                "| {rows} | | | new / old | {:.2}x ({:.2}x) | {:.2}x ({:.2}x) | {:.2}x | | |",
                figures.pull.cpu / old_figures.pull.cpu,
                figures.pull.wall / old_figures.pull.wall,
                figures.push.cpu / old_figures.push.cpu,
                figures.push.wall / old_figures.push.wall,
                figures.rss_per_row / old_figures.rss_per_row,
            );
        }
        drop(old);
        eprintln!(
            "# {rows} rows: {report}; {} MiB of slots on huge pages; index {} entries, {} \
             builds",
            huge >> 20,
            metrics.index_capacity,
            metrics.index_builds
        );
        if i + 1 == args.rows.len() {
            largest = Some(new);
        }
    }
    println!();
    println!(
        "Targets for the whole PS (issue 28), for reference: per pulled row <= 60 ns and per \
         pushed row <= 120 ns at 4 M rows; memory at 16 M rows <= 1.15x rows + state."
    );
    if let (true, Some(table)) = (args.checkpoint, largest) {
        checkpoint(&table, &args, &cpus);
    }
}

fn print_row(rows: u64, data: u64, in_cache: &str, name: &str, f: &Figures) {
    println!(
        "| {rows} | {} MiB | {in_cache} | {name} | {:.1} ({:.1}) | {:.1} ({:.1}) | {:.1} | {} | \
         {:.3}x |",
        data >> 20,
        f.pull.cpu,
        f.pull.wall,
        f.push.cpu,
        f.push.wall,
        f.rss_per_row,
        f.used_per_row
            .map_or_else(|| "-".to_string(), |u| format!("{u:.1}")),
        f.rss_per_row / DATA_BYTES as f64,
    );
}

/// Saves `table` while a puller on another CPU (if there is one) pulls 1,000 random ids per
/// call; prints the save's speed and the puller's longest call during it and without it.
fn checkpoint(table: &PsTable, args: &Args, cpus: &[usize]) {
    let rows = table.len();
    let dir = args
        .dir
        .join(format!("starwire-table-bench-{}", std::process::id()));
    let batches = random_batches(rows, 1000, 0x5eed);
    let puller_cpu = cpus.get(1).copied().unwrap_or(cpus[0]);
    let longest_call = |stop: &AtomicBool| {
        restrict_to(puller_cpu);
        let mut out = vec![0u8; IDS_PER_CALL * ROW_BYTES];
        let mut missing = Vec::new();
        let (mut longest, mut calls) = (Duration::ZERO, 0u64);
        while !stop.load(Ordering::Relaxed) {
            let ids = &batches[calls as usize % batches.len()];
            let t = Instant::now();
            table.pull(ids, &mut out, &mut missing);
            longest = longest.max(t.elapsed());
            calls += 1;
        }
        (longest, calls)
    };
    // Without a save: the puller's longest call over a second.
    let stop = AtomicBool::new(false);
    let (quiet, quiet_calls) = std::thread::scope(|s| {
        let puller = s.spawn(|| longest_call(&stop));
        std::thread::sleep(Duration::from_secs(1));
        stop.store(true, Ordering::Relaxed);
        puller.join().unwrap()
    });
    let stop = AtomicBool::new(false);
    let (saved, (during, calls)) = std::thread::scope(|s| {
        let puller = s.spawn(|| longest_call(&stop));
        std::thread::sleep(Duration::from_millis(100));
        let saved = table.save(&dir);
        stop.store(true, Ordering::Relaxed);
        (saved, puller.join().unwrap())
    });
    let saved = saved.expect("checkpoint");
    println!();
    println!(
        "Checkpoint of {rows} rows ({} MiB) to {} ({}): {:.2} GB/s ({:.2} s; {:.2} s in writes, \
         {:.2} s in fsync; the rest reading rows and checksums); the disk's direct-I/O \
         sequential write is about 1.5 GB/s on this machine class (target: at least that, or \
         say what binds).",
        saved.bytes >> 20,
        dir.display(),
        if saved.direct_io {
            "direct I/O"
        } else {
            "through the page cache"
        },
        saved.gb_per_s(),
        saved.elapsed.as_secs_f64(),
        saved.writing.as_secs_f64(),
        saved.syncing.as_secs_f64(),
    );
    println!(
        "A puller on CPU {puller_cpu} (the save on CPU {}): longest call {:.2} ms during the \
         save ({calls} calls), {:.2} ms without one ({quiet_calls} calls); target <= 10 ms.",
        cpus[0],
        during.as_secs_f64() * 1e3,
        quiet.as_secs_f64() * 1e3,
    );
    let _ = fs::remove_dir_all(&dir);
}
