//! The worker's step, synchronous against pipelined, measured in the same run: two PS
//! tasks in this process (each a `PsTable` of 16 f32 with Adagrad holding half of the
//! ids, one pinned loop each), and a worker that per step pulls the rows of a batch of ids
//! drawn uniformly from the table, computes (a busy loop of a chosen length, standing for
//! the model), and pushes one gradient row per id.
//!
//! Where the threads run matters on a small machine: by default the two PS loops are
//! pinned to CPUs apart and the worker is not pinned (so its computation shares a CPU
//! with a PS loop, which cannot answer a prefetched request while the computation holds
//! that CPU); `--worker-alone` puts both PS loops on the last CPU and the worker alone on
//! the first. Waits park at once by default (`--worker-spin-us`, `--ps-spin-us`): with
//! more threads than CPUs, a spinning wait takes the CPU the thread it waits for needs.
//!
//! - `sync`: `Sharded`: pull, compute, push, each call waiting for its answers;
//! - `s=0`: `Pipeline` at staleness 0 (the same rows as `sync`; what the pipeline costs);
//! - `s=1`: the next batch prefetched after the pull, pushes not waited for;
//! - `s=1 flush`: the same, with `flush` before the prefetch (waits for the last push so
//!   that the prefetch goes out before the computation);
//! - `s=2`.
//!
//! Per configuration, the median over runs of: wall time per step and steps/s, visible
//! communication per step (time in the client's calls: what the computation could not
//! overlap), the part of it spent waiting, the time in the pull and how many of its PS
//! parts a prefetch had sent, CPU time per step of the process and of the worker's thread,
//! the ratios to `sync`, and the pushes the rows may have missed. The machine's load is
//! printed before and after; the table's size says whether it fits in the last-level
//! cache.
//!
//! `cargo bench --bench pipeline` runs the default set; `-- --help` lists the options.

use std::sync::Arc;
use std::time::{Duration, Instant};

use starwire::config::ConfigBuilder;
use starwire::rows::ps::{Init, Optimizer, PsTable};
use starwire::rows::{Partition, PipelineSettings, Tables};
use starwire::{Client, DType, Embedded, Options, Peer, Pipeline, Runtime, Sharded};

mod common;
use common::*;

const DIM: usize = 16;
const ROW_BYTES: usize = DIM * 4;
const TABLE: u32 = 1;
const TIMEOUT: Duration = Duration::from_secs(30);

struct Args {
    rows: u64,
    batch: usize,
    compute: Duration,
    steps: usize,
    warmup: usize,
    runs: usize,
    handle: bool,
    worker_spin: Duration,
    ps_spin: Duration,
    /// Both PS loops on the last CPU and the worker pinned to the first, rather than one
    /// PS loop per CPU and the worker unpinned.
    worker_alone: bool,
    variants: Vec<Variant>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Variant {
    Sync,
    Pipelined { staleness: u32, flush: bool },
}

impl Variant {
    fn name(self) -> String {
        match self {
            Variant::Sync => "sync".into(),
            Variant::Pipelined { staleness, flush } => {
                format!("s={staleness}{}", if flush { " flush" } else { "" })
            }
        }
    }
}

fn usage() -> ! {
    eprintln!(
        "cargo bench --bench pipeline -- [--rows N] [--batch B] [--compute-us C] [--steps S] \
         [--warmup W] [--runs R] [--handle] [--worker-alone] [--worker-spin-us U] \
         [--ps-spin-us U] [--quick]\n\
         \n\
         --rows        ids in the table, half on each PS (default 1000000)\n\
         --batch       ids pulled and pushed per step (default 1024)\n\
         --compute-us  the busy loop standing for the model, per step (default 200)\n\
         --steps       timed steps per run and configuration (default 2000)\n\
         --warmup      steps before each timed run (default 200)\n\
         --runs        runs, configurations interleaved; medians reported (default 5)\n\
         --handle      the worker uses a Handle (its loop on a thread of its own) rather\n\
         \x20             than an Embedded client (its loop run by its own thread)\n\
         --worker-spin-us, --ps-spin-us\n\
         \x20             how long a wait spins before it parks (default 0 for both: on\n\
         \x20             two CPUs a spinning loop takes the CPU another thread needs)\n\
         --worker-alone  both PS loops on the last CPU, the worker pinned to the first\n\
         \x20             (default: one PS loop per CPU, the worker unpinned)\n\
         --quick       --rows 200000 --steps 300 --warmup 50 --runs 3: a check that it runs"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        rows: 1_000_000,
        batch: 1024,
        compute: Duration::from_micros(200),
        steps: 2000,
        warmup: 200,
        runs: 5,
        handle: false,
        worker_spin: Duration::ZERO,
        ps_spin: Duration::ZERO,
        worker_alone: false,
        variants: vec![
            Variant::Sync,
            Variant::Pipelined {
                staleness: 0,
                flush: false,
            },
            Variant::Pipelined {
                staleness: 1,
                flush: false,
            },
            Variant::Pipelined {
                staleness: 1,
                flush: true,
            },
            Variant::Pipelined {
                staleness: 2,
                flush: false,
            },
        ],
    };
    let argv = bench_args();
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().cloned().unwrap_or_else(|| usage());
        let mut num = || value().parse::<u64>().unwrap_or_else(|_| usage());
        match arg.as_str() {
            "--rows" => a.rows = num(),
            "--batch" => a.batch = num() as usize,
            "--compute-us" => a.compute = Duration::from_micros(num()),
            "--steps" => a.steps = num() as usize,
            "--warmup" => a.warmup = num() as usize,
            "--runs" => a.runs = num() as usize,
            "--handle" => a.handle = true,
            "--worker-alone" => a.worker_alone = true,
            "--worker-spin-us" => a.worker_spin = Duration::from_micros(num()),
            "--ps-spin-us" => a.ps_spin = Duration::from_micros(num()),
            "--quick" => {
                a.rows = 200_000;
                a.steps = 300;
                a.warmup = 50;
                a.runs = 3;
            }
            _ => usage(),
        }
    }
    if a.rows == 0 || a.batch == 0 || a.steps == 0 || a.runs == 0 {
        usage();
    }
    a
}

/// The last-level cache of CPU 0, bytes (0 when unknown).
fn llc_bytes() -> u64 {
    (0..8)
        .filter_map(|i| {
            let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
            let size = std::fs::read_to_string(format!("{dir}/size")).ok()?;
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

/// A PS task on `cpu`: its loop pinned there, a `PsTable` for `rows` rows.
fn ps(cpu: usize, rows: u64, spin: Duration) -> (Runtime, Arc<PsTable>) {
    restrict_to(cpu);
    let table = Arc::new(
        PsTable::builder(DIM)
            .table_id(TABLE)
            .init(Init::Uniform {
                scale: 0.05,
                seed: 1,
            })
            .optimizer(Optimizer::Adagrad {
                lr: 0.05,
                initial_accumulator: 0.1,
            })
            .capacity(rows)
            .build()
            .expect("PsTable"),
    );
    let config = ConfigBuilder::from_env("ps", 0)
        .expect("environment")
        .loops(1)
        .pin(true)
        .spin(spin)
        .build()
        .expect("config");
    let options = Options {
        service: Some(Arc::new(Tables::new().with(TABLE, table.clone()))),
        ..Options::listen("127.0.0.1:0".parse().unwrap())
    };
    let rt = Runtime::start_with(config, options).expect("PS starts");
    (rt, table)
}

/// Batch ids: a xorshift over `0..rows`.
struct Ids {
    x: u64,
    rows: u64,
}

impl Ids {
    fn fill(&mut self, out: &mut [u64]) {
        for id in out {
            self.x ^= self.x << 13;
            self.x ^= self.x >> 7;
            self.x ^= self.x << 17;
            *id = self.x % self.rows;
        }
    }
}

/// The model's step, simulated: a busy loop of `d` (no `pause`: a hypervisor may trap it).
fn compute(d: Duration) {
    let start = Instant::now();
    let mut x = 1u64;
    while start.elapsed() < d {
        for _ in 0..64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}

/// One run's figures.
#[derive(Clone, Copy, Default)]
struct Run {
    /// Wall time per step, µs.
    step: f64,
    /// Time in the client's calls per step, µs.
    visible: f64,
    /// Of which waiting for answers, µs (the pipeline reports it; `sync` waits throughout).
    waited: f64,
    /// CPU time of the process per step, µs, and of the worker's thread.
    cpu: f64,
    worker_cpu: f64,
    /// Rows the pipeline's steps may have missed, per step (its report's `may_miss`).
    may_miss: f64,
    /// Time in the pull per step, µs, and the PS parts of a pull sent ahead by a prefetch.
    pull: f64,
    prefetched: f64,
}

/// The worker's state across runs of one variant.
enum Worker {
    Sync(Box<Sharded>),
    Pipe(Box<Pipeline>),
}

struct Bench<M: starwire::client::Mode> {
    client: Client<M>,
    args: Args,
    grads: Vec<u8>,
    rows: Vec<u8>,
}

impl<M: starwire::client::Mode> Bench<M> {
    /// `n` steps of `w`; returns the run's figures when `timed`.
    fn steps(&mut self, w: &mut Worker, v: Variant, ids: &mut Ids, n: usize) -> Run {
        let b = self.args.batch;
        let (mut cur, mut next) = (vec![0u64; b], vec![0u64; b]);
        ids.fill(&mut cur);
        let (cpu0, wcpu0, t0) = (process_cpu_time(), thread_cpu(), Instant::now());
        let (mut visible, mut waited, mut may_miss) = (Duration::ZERO, Duration::ZERO, 0u64);
        let (mut pull, mut prefetched) = (Duration::ZERO, 0usize);
        let c = &mut self.client;
        match (w, v) {
            (Worker::Sync(s), _) => {
                for _ in 0..n {
                    let t = Instant::now();
                    let r = s
                        .pull(c, &cur, &mut self.rows, Some(t + TIMEOUT))
                        .expect("pull");
                    assert!(r.is_ok() && r.missing == 0, "{r:?}");
                    visible += t.elapsed();
                    pull += t.elapsed();
                    compute(self.args.compute);
                    let t = Instant::now();
                    let r = s
                        .push(c, &cur, &self.grads, Some(t + TIMEOUT))
                        .expect("push");
                    assert!(r.is_ok(), "{r:?}");
                    visible += t.elapsed();
                    ids.fill(&mut cur);
                }
            }
            (Worker::Pipe(p), Variant::Pipelined { flush, .. }) => {
                p.prefetch(c, &cur).expect("prefetch");
                for _ in 0..n {
                    let r = p.pull(c, &cur, &mut self.rows).expect("pull");
                    assert_eq!(r.missing, 0);
                    pull += r.visible;
                    prefetched += r.prefetched;
                    ids.fill(&mut next);
                    if flush {
                        p.flush(c).expect("flush");
                    }
                    p.prefetch(c, &next).expect("prefetch");
                    compute(self.args.compute);
                    let r = p.push(c, &cur, &self.grads).expect("push");
                    visible += r.visible;
                    waited += r.waited;
                    may_miss += r.may_miss;
                    std::mem::swap(&mut cur, &mut next);
                }
                p.flush(c).expect("flush");
            }
            (Worker::Pipe(_), Variant::Sync) => unreachable!("a pipeline runs a pipelined variant"),
        }
        let wall = t0.elapsed();
        let per = |d: Duration| d.as_nanos() as f64 / 1e3 / n as f64;
        Run {
            step: per(wall),
            visible: per(visible),
            waited: per(waited),
            cpu: per(process_cpu_time() - cpu0),
            worker_cpu: per(thread_cpu() - wcpu0),
            may_miss: may_miss as f64 / n as f64,
            pull: per(pull),
            prefetched: prefetched as f64 / n as f64,
        }
    }
}

fn worker_for(v: Variant, peers: &[Peer]) -> Worker {
    match v {
        Variant::Sync => Worker::Sync(Box::new(
            Sharded::new(
                peers.to_vec(),
                Partition::Mod,
                TABLE,
                DType::F32,
                &[DIM as u64],
            )
            .expect("Sharded"),
        )),
        Variant::Pipelined { staleness, .. } => {
            let settings = PipelineSettings::default()
                .staleness(staleness)
                .max_pushes_in_flight(2)
                .timeout(Some(TIMEOUT));
            Worker::Pipe(Box::new(
                Pipeline::new(
                    peers.to_vec(),
                    Partition::Mod,
                    TABLE,
                    DType::F32,
                    &[DIM as u64],
                    settings,
                )
                .expect("Pipeline"),
            ))
        }
    }
}

fn run<M: starwire::client::Mode>(client: Client<M>, args: Args, peers: Vec<Peer>) {
    let b = args.batch;
    let grads: Vec<u8> = (0..b * DIM)
        .flat_map(|i| (((i % 7) as f32 - 3.0) * 1e-3).to_le_bytes())
        .collect();
    let mut bench = Bench {
        client,
        rows: vec![0u8; b * ROW_BYTES],
        grads,
        args,
    };
    // Every row created before anything is timed (a PsTable creates a row on its first
    // pull), by the synchronous client in batches.
    let mut warm = Sharded::new(
        peers.clone(),
        Partition::Mod,
        TABLE,
        DType::F32,
        &[DIM as u64],
    )
    .unwrap();
    let all: Vec<u64> = (0..bench.args.rows).collect();
    for chunk in all.chunks(8192) {
        let mut out = vec![0u8; chunk.len() * ROW_BYTES];
        let deadline = Some(Instant::now() + TIMEOUT);
        let r = warm
            .pull(&mut bench.client, chunk, &mut out, deadline)
            .expect("warm-up pull");
        assert!(r.is_ok(), "{r:?}");
    }
    let variants = bench.args.variants.clone();
    let mut workers: Vec<Worker> = variants.iter().map(|&v| worker_for(v, &peers)).collect();
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); variants.len()];
    let load_before = loadavg();
    for r in 0..bench.args.runs {
        for (i, &v) in variants.iter().enumerate() {
            // The same batches for every variant of a run.
            let mut ids = Ids {
                x: 0x9e37_79b9_7f4a_7c15 ^ (r as u64 + 1),
                rows: bench.args.rows,
            };
            let (warmup, steps) = (bench.args.warmup, bench.args.steps);
            bench.steps(&mut workers[i], v, &mut ids, warmup);
            let fig = bench.steps(&mut workers[i], v, &mut ids, steps);
            eprintln!(
                "run {r} {:>10}: {:7.1} µs/step, visible {:7.1} µs",
                v.name(),
                fig.step,
                fig.visible
            );
            runs[i].push(fig);
        }
    }
    let load_after = loadavg();
    let med = |i: usize, f: fn(&Run) -> f64| median(runs[i].iter().map(f).collect());
    let sync_step = med(0, |r| r.step);
    let sync_visible = med(0, |r| r.visible);
    println!();
    println!(
        "| variant | µs/step | steps/s | x sync | visible µs/step | x sync | waited µs/step | \
         in pull | parts prefetched | CPU µs/step (process) | worker thread | may miss |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (i, v) in variants.iter().enumerate() {
        let step = med(i, |r| r.step);
        let visible = med(i, |r| r.visible);
        let waited = match v {
            Variant::Sync => "-".to_string(),
            _ => format!("{:.1}", med(i, |r| r.waited)),
        };
        println!(
            "| {} | {:.1} | {:.0} | {:.2} | {:.1} | {:.2} | {} | {:.1} | {:.2} | {:.1} | {:.1} | \
             {:.2} |",
            v.name(),
            step,
            1e6 / step,
            sync_step / step,
            visible,
            visible / sync_visible,
            waited,
            med(i, |r| r.pull),
            med(i, |r| r.prefetched),
            med(i, |r| r.cpu),
            med(i, |r| r.worker_cpu),
            med(i, |r| r.may_miss),
        );
    }
    println!();
    println!("load average before: {load_before}; after: {load_after}");
    println!(
        "x sync: steps/s as a multiple of sync's; visible communication as a fraction of \
         sync's. CPU per step: the whole process (both PS tasks and the worker) and the \
         worker's thread (with an Embedded client its loop runs there)."
    );
}

fn main() {
    let args = parse_args();
    let cpus = allowed_cpus();
    let llc = llc_bytes();
    // A PsTable row of 16 f32 with Adagrad: 136 B of slot, about 10 B of index.
    let table_bytes = args.rows * 146;
    println!(
        "# pipelined worker step: {} rows of {ROW_BYTES} B (16 f32, Adagrad) over 2 PS tasks, \
         about {} MiB of table against a last-level cache of {} MiB: {}",
        args.rows,
        table_bytes >> 20,
        llc >> 20,
        if table_bytes <= llc {
            "fits in cache"
        } else {
            "does not fit in cache"
        }
    );
    println!(
        "# batch {} ids (uniform), compute {} µs per step, {} steps x {} runs after {} \
         warm-up steps; worker: {}; CPUs allowed: {:?}; load average {}",
        args.batch,
        args.compute.as_micros(),
        args.steps,
        args.runs,
        args.warmup,
        if args.handle {
            "Handle (a loop thread)"
        } else {
            "Embedded (its loop on its own thread)"
        },
        cpus,
        loadavg()
    );
    let last = cpus[cpus.len() - 1];
    let (ps0_cpu, ps1_cpu) = if args.worker_alone {
        (last, last)
    } else {
        (cpus[0], *cpus.get(1).unwrap_or(&cpus[0]))
    };
    let (ps0, t0) = ps(ps0_cpu, args.rows / 2 + 1, args.ps_spin);
    let (ps1, t1) = ps(ps1_cpu, args.rows / 2 + 1, args.ps_spin);
    let worker_at = if args.worker_alone {
        restrict_to(cpus[0]);
        if args.handle {
            format!(
                "the worker on CPU {}, its loop thread on CPU {last}",
                cpus[0]
            )
        } else {
            format!("the worker on CPU {}", cpus[0])
        }
    } else {
        restrict_to_set(&cpus);
        "the worker unpinned".to_string()
    };
    println!(
        "# PS 0 loop on CPU {ps0_cpu}, PS 1 loop on CPU {ps1_cpu}, {worker_at}; waits spin \
         {} µs (worker), {} µs (PS) before they park; table: {}",
        args.worker_spin.as_micros(),
        args.ps_spin.as_micros(),
        t0.report()
    );
    let peers = vec![
        Peer::from(ps0.local_addr().unwrap()),
        Peer::from(ps1.local_addr().unwrap()),
    ];
    let worker = ConfigBuilder::from_env("worker", 0)
        .expect("environment")
        .loops(1)
        .spin(args.worker_spin)
        .build()
        .expect("config");
    if args.handle {
        // The loop thread takes the affinity of the thread that starts it.
        if args.worker_alone {
            restrict_to(last);
        }
        let rt = Runtime::start(worker, None).expect("worker");
        if args.worker_alone {
            restrict_to(cpus[0]);
        }
        let h = rt.handle(64);
        run(h, args, peers);
        rt.shutdown();
    } else {
        let e = Embedded::new(worker, None).expect("worker");
        run(e, args, peers);
    }
    let rows = t0.metrics().rows + t1.metrics().rows;
    println!("# rows in the tables at the end: {rows}");
    ps0.shutdown();
    ps1.shutdown();
}
