//! A sparse model trained over starwire by PS and worker processes on this machine.
//!
//! ```console
//! $ cargo run --release --example sparse_training            # about a minute
//! $ cargo run --release --example sparse_training -- --help
//! ```
//!
//! The program writes a `.endpoint_map` for a cluster of `--ps` PS tasks and `--workers`
//! worker tasks on loopback, starts each task as a process of its own (this program again,
//! with `--role`), and prints what the workers report. Each task finds its data address the
//! way a real job does: from the cluster spec and the `.endpoint_map`.
//!
//! The model (`sparse_training/model.rs`) is a factorization machine over hashed
//! categorical features: one row of `--dim` f32 per feature id, sharded over the PS tasks by
//! id. Labels come from a ground-truth model of the same form, so the best reachable loss is
//! known and printed next to the reached one. Per step, a worker draws a batch, pulls the
//! rows of the batch's distinct ids, computes the gradients, and pushes one gradient row per
//! id. The PS tasks apply Adagrad as the gradients arrive.
//!
//! How rows travel is chosen on the command line:
//!
//! - by default, as embedding rows: the worker's [`Sharded`] client spreads the ids over the
//!   PS tasks and sends one `PULL_ROWS` and one `PUSH_ROWS` frame per PS task and step, each
//!   carrying its rows as one packed block (an 8-byte id and the row's bytes per row). The
//!   PS serves them from its shard of the model through the [`Table`] trait;
//! - with `--per-tensor`, as tensors: one fused `PULL` and one fused `PUSH` per PS task and
//!   step, one tensor (with its own descriptor) per row, served by `Service::pull` and
//!   `Service::push`;
//! - with `--unfused`, every row pulled and pushed by a request of its own (64 in flight),
//!   to show what fusion saves.
//!
//! Either way the PS holds the same [`Shard`] (the model's rows and their Adagrad state), so
//! the loss and AUC are those of the same model. Each worker times its steps: communication
//! (the pull and the push, from the first request to the last answer) beside compute (the
//! model's forward and backward pass) and data (drawing the batch); the coordinator prints
//! communication and compute per interval, each worker's summary line, and the means per
//! step over all workers.

#[path = "sparse_training/model.rs"]
mod model;

use model::{Batch, Generator, ModelConfig, Scratch, Shard};
use starwire::cluster::{ClusterSpec, TaskId};
use starwire::config::ConfigBuilder;
use starwire::rows::Partition;
use starwire::{Completion, Handle, Options, Peer, Resolver, Runtime, Service, Sharded};
use starwire::{DType, Status, Table, Tensor};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const USAGE: &str = "\
usage: sparse_training [OPTIONS]

Trains a factorization machine over hashed categorical features with PS and worker
processes on loopback, and compares the reached loss with the known optimum.

options:
  --ps N            PS tasks (default 1)
  --workers N       worker tasks (default 2)
  --seconds S       training time (default 50)
  --interval S      seconds between reports (default 5)
  --batch N         examples per step and worker (default 512)
  --fields N        categorical fields per example (default 16)
  --vocab N         values per field (default 300)
  --dim N           f32 per row (default 16: 64-byte rows)
  --lr X            Adagrad learning rate (default 0.05)
  --eval N          held-out examples evaluated at the end (default 100000)
  --per-tensor      pull and push rows as tensors (one fused request per PS task and
                    step, a tensor per row) instead of as packed rows blocks
  --unfused         one request per row (as tensors) instead of one per PS task and step
  --comm-breakdown  print each worker's communication per PS task and operation, from
                    its runtime's metrics (requests, failures, latency percentiles,
                    bytes and rows)
  --trace FILE      record every request of each worker and write it at the end as a
                    Chrome trace (open it in ui.perfetto.dev): worker i writes FILE
                    with .worker<i> before its extension (docs/deploying.md)
  --check           exit with status 1 unless training went well (for tests)
  --help            this text
";

/// How a worker's rows travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transfer {
    /// `PULL_ROWS` and `PUSH_ROWS` through the sharded rows client: one frame per PS task
    /// and step each way, the rows in one packed block.
    Rows,
    /// Fused `PULL` and `PUSH`: one request per PS task and step, one tensor per row.
    PerTensor,
    /// One `PULL` and one `PUSH` per row.
    Unfused,
}

impl Transfer {
    fn describe(self) -> &'static str {
        match self {
            Transfer::Rows => {
                "as rows: one PULL_ROWS and one PUSH_ROWS frame per PS task and step, \
                 one packed block of rows each"
            }
            Transfer::PerTensor => {
                "per tensor, fused: one request per PS task and step, a tensor per row"
            }
            Transfer::Unfused => "per tensor, unfused: one request per row",
        }
    }
}

/// Settings of a run, parsed from the command line (and passed on to the tasks).
#[derive(Clone, Debug)]
struct Args {
    ps: usize,
    workers: usize,
    seconds: f64,
    interval: f64,
    model: ModelConfig,
    eval: usize,
    per_tensor: bool,
    unfused: bool,
    check: bool,
    /// Print each worker's per-PS communication from its runtime's metrics.
    comm_breakdown: bool,
    /// Write each worker's request trace to this file (`.worker<i>` added).
    trace: Option<PathBuf>,
    /// Set for the tasks this program starts: `ps:0`, `worker:1`, ...
    role: Option<TaskId>,
    /// The cluster's directory (with `.endpoint_map`), for tasks.
    dir: Option<PathBuf>,
    /// Cluster spec, for tasks: `ps=HOSTS` and `worker=HOSTS` control addresses.
    ps_hosts: String,
    worker_hosts: String,
    /// Wall-clock start of training (ms since the epoch), so that workers' report
    /// intervals line up.
    start_ms: u64,
}

impl Args {
    fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
        let mut a = Args {
            ps: 1,
            workers: 2,
            seconds: 50.0,
            interval: 5.0,
            model: ModelConfig::default(),
            eval: 100_000,
            per_tensor: false,
            unfused: false,
            check: false,
            comm_breakdown: false,
            trace: None,
            role: None,
            dir: None,
            ps_hosts: String::new(),
            worker_hosts: String::new(),
            start_ms: 0,
        };
        while let Some(flag) = argv.next() {
            let mut value = || argv.next().ok_or_else(|| format!("{flag} needs a value"));
            fn num<T: std::str::FromStr>(flag: &str, v: String) -> Result<T, String> {
                v.parse()
                    .map_err(|_| format!("{flag}: not a valid number: {v:?}"))
            }
            match flag.as_str() {
                "--ps" => a.ps = num(&flag, value()?)?,
                "--workers" => a.workers = num(&flag, value()?)?,
                "--seconds" => a.seconds = num(&flag, value()?)?,
                "--interval" => a.interval = num(&flag, value()?)?,
                "--batch" => a.model.batch = num(&flag, value()?)?,
                "--fields" => a.model.fields = num(&flag, value()?)?,
                "--vocab" => a.model.vocab = num(&flag, value()?)?,
                "--dim" => a.model.dim = num(&flag, value()?)?,
                "--lr" => a.model.learning_rate = num(&flag, value()?)?,
                "--eval" => a.eval = num(&flag, value()?)?,
                "--per-tensor" => a.per_tensor = true,
                "--unfused" => a.unfused = true,
                "--check" => a.check = true,
                "--comm-breakdown" => a.comm_breakdown = true,
                "--trace" => a.trace = Some(PathBuf::from(value()?)),
                "--role" => {
                    let v = value()?;
                    a.role = Some(TaskId::parse(&v).map_err(|e| format!("--role {v}: {e}"))?);
                }
                "--dir" => a.dir = Some(PathBuf::from(value()?)),
                "--ps-hosts" => a.ps_hosts = value()?,
                "--worker-hosts" => a.worker_hosts = value()?,
                "--start-ms" => a.start_ms = num(&flag, value()?)?,
                "--help" | "-h" => return Err(String::new()),
                other => return Err(format!("unknown option {other:?}")),
            }
        }
        let m = &a.model;
        if a.ps == 0 || a.workers == 0 || m.batch == 0 || m.fields == 0 || m.vocab == 0 {
            return Err("--ps, --workers, --batch, --fields and --vocab must be at least 1".into());
        }
        if m.dim == 0 || m.dim > 1024 {
            return Err("--dim must be between 1 and 1024".into());
        }
        if !(a.seconds > 0.0 && a.interval > 0.0) {
            return Err("--seconds and --interval must be positive".into());
        }
        Ok(a)
    }

    /// The options a task is started with: the run's settings, then its own.
    fn task_args(&self, task: &TaskId, dir: &Path) -> Vec<String> {
        let m = &self.model;
        let mut v: Vec<String> = [
            ("--ps", self.ps.to_string()),
            ("--workers", self.workers.to_string()),
            ("--seconds", self.seconds.to_string()),
            ("--interval", self.interval.to_string()),
            ("--batch", m.batch.to_string()),
            ("--fields", m.fields.to_string()),
            ("--vocab", m.vocab.to_string()),
            ("--dim", m.dim.to_string()),
            ("--lr", m.learning_rate.to_string()),
            ("--eval", self.eval.to_string()),
            ("--role", task.to_string()),
            ("--dir", dir.display().to_string()),
            ("--ps-hosts", self.ps_hosts.clone()),
            ("--worker-hosts", self.worker_hosts.clone()),
            ("--start-ms", self.start_ms.to_string()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_string(), v])
        .collect();
        if self.per_tensor {
            v.push("--per-tensor".into());
        }
        if self.unfused {
            v.push("--unfused".into());
        }
        if self.comm_breakdown {
            v.push("--comm-breakdown".into());
        }
        if let Some(t) = &self.trace {
            v.push("--trace".into());
            v.push(t.display().to_string());
        }
        v
    }

    /// How rows travel: `--unfused` is per tensor too.
    fn transfer(&self) -> Transfer {
        if self.unfused {
            Transfer::Unfused
        } else if self.per_tensor {
            Transfer::PerTensor
        } else {
            Transfer::Rows
        }
    }
}

fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("sparse_training: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match &args.role {
        None => coordinate(args.clone()),
        Some(task) if task.job == "ps" => run_ps(&args, task),
        Some(task) => run_worker(&args, task),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            let who = args
                .role
                .as_ref()
                .map_or("sparse_training".into(), |t| t.to_string());
            eprintln!("{who}: {e}");
            ExitCode::FAILURE
        }
    }
}

type Res<T> = Result<T, String>;

/// How the job's tasks find each other's data addresses, as a real job does: the cluster
/// spec (control addresses) resolved through the `.endpoint_map` in `--dir`.
fn resolver(args: &Args) -> Res<Resolver> {
    let dir = args.dir.as_ref().ok_or("--dir is missing")?;
    let mut spec = ClusterSpec::new();
    for (job, hosts) in [("ps", &args.ps_hosts), ("worker", &args.worker_hosts)] {
        spec.add_job(job, hosts)
            .map_err(|e| format!("cluster spec ({job}): {e:?}"))?;
    }
    Resolver::for_spec(&spec)
        .load_map(Some(dir))
        .map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------------------
// PS task

/// The table the PS tasks serve the model's rows as.
const TABLE: u32 = 1;

/// A PS task's shard of the model, served both ways: as tensors by id (`Service::pull` and
/// `Service::push`) and as table [`TABLE`] of embedding rows (the [`Table`] it is). Each PS
/// runs one event loop, so the lock is never contended: it only makes the shard `Sync` as
/// `Service` requires.
struct Ps {
    shard: Mutex<Shard>,
    dim: usize,
    /// `[dim]`: the shape of a row.
    row_dims: [u64; 1],
    pulled: std::sync::atomic::AtomicU64,
    pushed: std::sync::atomic::AtomicU64,
}

/// Reads little-endian f32s from `bytes` into `out`.
fn f32s_from_le(bytes: &[u8], out: &mut [f32]) {
    for (v, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// Writes `values` into `bytes` as little-endian f32s.
fn f32s_to_le(values: &[f32], bytes: &mut [u8]) {
    for (b, v) in bytes.chunks_exact_mut(4).zip(values) {
        b.copy_from_slice(&v.to_le_bytes());
    }
}

/// The shard as a table of rows of `dim` f32: a pull reads the rows (a row never updated
/// reads as its initial value, so none is missing), a push applies Adagrad to each.
impl Table for Ps {
    fn dtype(&self) -> DType {
        DType::F32
    }

    fn row_dims(&self) -> &[u64] {
        &self.row_dims
    }

    fn pull(&self, ids: &[u64], out: &mut [u8], _missing: &mut Vec<u32>) -> Status {
        let row_bytes = self.dim * 4;
        if out.len() != ids.len() * row_bytes {
            return Status::InvalidArgument;
        }
        let shard = self.shard.lock().unwrap();
        let mut row = [0f32; 1024];
        let row = &mut row[..self.dim];
        for (&id, dst) in ids.iter().zip(out.chunks_exact_mut(row_bytes)) {
            shard.read(id, row);
            f32s_to_le(row, dst);
        }
        self.pulled
            .fetch_add(ids.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Status::Ok
    }

    fn push(&self, ids: &[u64], grads: &[u8]) -> Status {
        let row_bytes = self.dim * 4;
        if grads.len() != ids.len() * row_bytes {
            return Status::InvalidArgument;
        }
        let mut shard = self.shard.lock().unwrap();
        let mut grad = [0f32; 1024];
        let grad = &mut grad[..self.dim];
        for (&id, g) in ids.iter().zip(grads.chunks_exact(row_bytes)) {
            f32s_from_le(g, grad);
            shard.apply(id, grad);
        }
        self.pushed
            .fetch_add(ids.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Status::Ok
    }
}

impl Service for Ps {
    fn table(&self, table: u32) -> Option<&dyn Table> {
        (table == TABLE).then_some(self as &dyn Table)
    }

    fn pull(&self, ids: &[u64], out: &mut Vec<Result<Arc<Tensor>, Status>>) {
        let shard = self.shard.lock().unwrap();
        let mut row = [0f32; 1024];
        let row = &mut row[..self.dim];
        for &id in ids {
            shard.read(id, row);
            let tensor = Tensor::from_f32(&[self.dim as u64], row).expect("row shape");
            out.push(Ok(Arc::new(tensor)));
        }
        let n = ids.len() as u64;
        self.pulled
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    fn push(&self, items: &mut Vec<(u64, Tensor)>, statuses: &mut Vec<Status>) {
        let mut shard = self.shard.lock().unwrap();
        let mut grad = [0f32; 1024];
        for (id, t) in items.iter() {
            if t.dtype() != DType::F32 || t.byte_len() != self.dim * 4 {
                statuses.push(Status::InvalidArgument);
                continue;
            }
            let grad = &mut grad[..self.dim];
            f32s_from_le(t.bytes(), grad);
            shard.apply(*id, grad);
            statuses.push(Status::Ok);
        }
        let n = items.len() as u64;
        self.pushed
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
}

fn run_ps(args: &Args, task: &TaskId) -> Res<ExitCode> {
    let addr = resolver(args)?
        .resolve_task(task)
        .map_err(|e| e.to_string())?
        .addr();
    let config = ConfigBuilder::from_env("ps", task.index)
        .and_then(|b| b.loops(1).build())
        .map_err(|e| e.to_string())?;
    let ps = Arc::new(Ps {
        shard: Mutex::new(Shard::new(&args.model)),
        dim: args.model.dim,
        row_dims: [args.model.dim as u64],
        pulled: Default::default(),
        pushed: Default::default(),
    });
    let service: Arc<dyn Service> = ps.clone();
    let options = Options {
        service: Some(service),
        ..Options::listen(addr)
    };
    let rt = Runtime::start_with(config, options).map_err(|e| format!("listen on {addr}: {e}"))?;
    println!("READY");
    // Serve until the coordinator closes our stdin.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    let stats = rt.stats();
    rt.shutdown();
    let rows = ps.shard.lock().unwrap().len();
    use std::sync::atomic::Ordering::Relaxed;
    println!(
        "ps:{}: {} rows stored, {} rows read by pulls, {} gradient rows applied; \
         {} bytes in, {} out",
        task.index,
        rows,
        ps.pulled.load(Relaxed),
        ps.pushed.load(Relaxed),
        stats.bytes_in,
        stats.bytes_out
    );
    Ok(ExitCode::SUCCESS)
}

// ---------------------------------------------------------------------------------------
// Worker task

/// What a worker did in one report interval; one line on its stdout.
#[derive(Default, Debug, Clone)]
struct Interval {
    index: u64,
    steps: u64,
    examples: u64,
    loss: f64,
    optimum: f64,
    auc: f64,
    optimum_auc: f64,
    pull_rpcs: u64,
    push_rpcs: u64,
    rows: u64,
    failed: u64,
    /// Time the steps spent pulling, pushing, computing and drawing their batches, in
    /// nanoseconds.
    pull_ns: u64,
    push_ns: u64,
    compute_ns: u64,
    data_ns: u64,
}

impl Interval {
    /// Mean communication time per step (pull and push), in milliseconds.
    fn comm_ms(&self) -> f64 {
        (self.pull_ns + self.push_ns) as f64 / 1e6 / self.steps.max(1) as f64
    }

    /// Mean compute time per step, in milliseconds.
    fn compute_ms(&self) -> f64 {
        self.compute_ns as f64 / 1e6 / self.steps.max(1) as f64
    }

    /// Adds the counts and times of `other` (not its loss and AUC).
    fn add_counts(&mut self, other: &Interval) {
        self.steps += other.steps;
        self.examples += other.examples;
        self.pull_rpcs += other.pull_rpcs;
        self.push_rpcs += other.push_rpcs;
        self.rows += other.rows;
        self.failed += other.failed;
        self.pull_ns += other.pull_ns;
        self.push_ns += other.push_ns;
        self.compute_ns += other.compute_ns;
        self.data_ns += other.data_ns;
    }

    /// One line of times per step: communication (pull, push), compute and data, in ms.
    fn times(&self) -> String {
        let steps = self.steps.max(1) as f64;
        let ms = |ns: u64| ns as f64 / 1e6 / steps;
        format!(
            "communication {:.3} ms (pull {:.3}, push {:.3}), compute {:.3} ms, data {:.3} ms",
            self.comm_ms(),
            ms(self.pull_ns),
            ms(self.push_ns),
            self.compute_ms(),
            ms(self.data_ns)
        )
    }

    fn to_line(&self) -> String {
        format!(
            "INTERVAL {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}",
            self.index,
            self.steps,
            self.examples,
            self.loss,
            self.optimum,
            self.auc,
            self.optimum_auc,
            self.pull_rpcs,
            self.push_rpcs,
            self.rows,
            self.failed,
            self.pull_ns,
            self.push_ns,
            self.compute_ns,
            self.data_ns
        )
    }

    fn from_line(line: &str) -> Option<Interval> {
        let mut f = line.strip_prefix("INTERVAL ")?.split(' ');
        let mut n = || f.next()?.parse::<f64>().ok();
        Some(Interval {
            index: n()? as u64,
            steps: n()? as u64,
            examples: n()? as u64,
            loss: n()?,
            optimum: n()?,
            auc: n()?,
            optimum_auc: n()?,
            pull_rpcs: n()? as u64,
            push_rpcs: n()? as u64,
            rows: n()? as u64,
            failed: n()? as u64,
            pull_ns: n()? as u64,
            push_ns: n()? as u64,
            compute_ns: n()? as u64,
            data_ns: n()? as u64,
        })
    }
}

/// A worker's connection to the PS tasks, and the buffers its steps reuse.
struct Worker {
    handle: Handle,
    ps: Vec<SocketAddr>,
    dim: usize,
    transfer: Transfer,
    /// The rows client (`Transfer::Rows`): the model's table over the PS tasks.
    sharded: Sharded,
    /// A step's rows or gradients as little-endian bytes (`Transfer::Rows`).
    bytes: Vec<u8>,
    /// Per PS task: the ids it owns in this batch, and their positions in `batch.unique`.
    ids: Vec<Vec<u64>>,
    positions: Vec<Vec<u32>>,
    /// Per PS task: the gradient tensors pushed last step, reused once the push is done.
    grads: Vec<Vec<(u64, Arc<Tensor>)>>,
    pull_rpcs: u64,
    push_rpcs: u64,
}

const DEADLINE: Duration = Duration::from_secs(10);
const UNFUSED_WINDOW: usize = 64;

/// The PS requests a rows step sent (one per PS task that owns some of the ids), or the
/// first PS task's part that failed.
fn rows_step(report: &starwire::StepReport, what: &str) -> Res<u64> {
    if let Some((s, e)) = report.first_error() {
        return Err(format!("{what} rows, ps:{s}: {e}"));
    }
    if report.missing > 0 {
        return Err(format!("{what} rows: {} rows missing", report.missing));
    }
    Ok(report
        .shards
        .iter()
        .filter(|r| matches!(r, Ok(n) if *n > 0))
        .count() as u64)
}

impl Worker {
    /// Pulls the rows of `unique` into `rows` (`dim` f32 each, in `unique` order).
    fn pull(&mut self, unique: &[u64], rows: &mut [f32]) -> Res<()> {
        if self.transfer == Transfer::Rows {
            return self.pull_rows(unique, rows);
        }
        for (s, (ids, pos)) in self.ids.iter_mut().zip(&mut self.positions).enumerate() {
            ids.clear();
            pos.clear();
            for (i, &id) in unique.iter().enumerate() {
                if model::shard_of(id, self.ps.len()) == s {
                    ids.push(id);
                    pos.push(i as u32);
                }
            }
        }
        let deadline = Some(Instant::now() + DEADLINE);
        if self.transfer == Transfer::Unfused {
            return self.pull_unfused(unique, rows, deadline);
        }
        let mut tags = [0u64; 64];
        for (s, ids) in self.ids.iter().enumerate() {
            tags[s] = self
                .handle
                .pull_slice(self.ps[s], ids, deadline)
                .map_err(|e| format!("pull: {e}"))?
                .tag();
            self.pull_rpcs += 1;
        }
        for (s, &tag) in tags.iter().enumerate().take(self.ps.len()) {
            let done = self
                .handle
                .wait_tag(tag)
                .map_err(|e| format!("wait: {e}"))?;
            // Borrowed, so the completion's vectors go back to the handle for the next step.
            let tensors = done
                .pulled()
                .map_err(|e| format!("pull from ps:{s}: {e}"))?;
            for (t, &at) in tensors.iter().zip(&self.positions[s]) {
                let t = t.as_ref().map_err(|st| format!("pull: row {st:?}"))?;
                copy_row(t, &mut rows[at as usize * self.dim..][..self.dim])?;
            }
            self.handle.recycle(done);
        }
        Ok(())
    }

    /// The rows client's pull: one `PULL_ROWS` per PS task, all in flight at once, each
    /// answered with one block that lands in `bytes` in the order of `unique`.
    fn pull_rows(&mut self, unique: &[u64], rows: &mut [f32]) -> Res<()> {
        self.bytes.resize(rows.len() * 4, 0);
        let deadline = Some(Instant::now() + DEADLINE);
        let report = self
            .sharded
            .pull(&mut self.handle, unique, &mut self.bytes, deadline)
            .map_err(|e| format!("pull rows: {e}"))?;
        self.pull_rpcs += rows_step(report, "pull")?;
        f32s_from_le(&self.bytes, rows);
        Ok(())
    }

    /// The rows client's push: one `PUSH_ROWS` per PS task with its ids' gradient rows.
    fn push_rows(&mut self, unique: &[u64], grads: &[f32]) -> Res<()> {
        self.bytes.resize(grads.len() * 4, 0);
        f32s_to_le(grads, &mut self.bytes);
        let deadline = Some(Instant::now() + DEADLINE);
        let report = self
            .sharded
            .push(&mut self.handle, unique, &self.bytes, deadline)
            .map_err(|e| format!("push rows: {e}"))?;
        self.push_rpcs += rows_step(report, "push")?;
        Ok(())
    }

    fn pull_unfused(
        &mut self,
        unique: &[u64],
        rows: &mut [f32],
        deadline: Option<Instant>,
    ) -> Res<()> {
        let mut next = 0;
        let mut inflight = std::collections::HashMap::new();
        while next < unique.len() || !inflight.is_empty() {
            while next < unique.len() && inflight.len() < UNFUSED_WINDOW {
                let id = unique[next];
                let peer = self.ps[model::shard_of(id, self.ps.len())];
                let ticket = self.handle.pull_slice(peer, &[id], deadline);
                inflight.insert(ticket.map_err(|e| format!("pull: {e}"))?.tag(), next);
                self.pull_rpcs += 1;
                next += 1;
            }
            let done = self.handle.wait_any().map_err(|e| format!("wait: {e}"))?;
            let at = inflight
                .remove(&done.tag)
                .ok_or("completion of an unknown request")?;
            match done.pulled().map_err(|e| format!("pull: {e}"))? {
                [t] => {
                    let t = t.as_ref().map_err(|st| format!("pull: row {st:?}"))?;
                    copy_row(t, &mut rows[at * self.dim..][..self.dim])?;
                }
                other => return Err(format!("pull of one row: {} answers", other.len())),
            }
            self.handle.recycle(done);
        }
        Ok(())
    }

    /// Pushes the gradient rows `grads` (`dim` f32 each, in `unique` order).
    fn push(&mut self, unique: &[u64], grads: &[f32]) -> Res<()> {
        if self.transfer == Transfer::Rows {
            return self.push_rows(unique, grads);
        }
        let deadline = Some(Instant::now() + DEADLINE);
        let dim = self.dim;
        // Fill the gradient tensors, reusing last step's where the runtime let go of them.
        for (s, pos) in self.positions.iter().enumerate() {
            let items = &mut self.grads[s];
            items.truncate(pos.len());
            for (n, &at) in pos.iter().enumerate() {
                let values = &grads[at as usize * dim..][..dim];
                let id = unique[at as usize];
                if n == items.len() {
                    items.push((
                        id,
                        Arc::new(Tensor::zeros(DType::F32, &[dim as u64]).unwrap()),
                    ));
                }
                let item = &mut items[n];
                item.0 = id;
                if Arc::get_mut(&mut item.1).is_none() {
                    item.1 = Arc::new(Tensor::zeros(DType::F32, &[dim as u64]).unwrap());
                }
                let bytes = Arc::get_mut(&mut item.1).unwrap().bytes_mut();
                for (b, v) in bytes.chunks_exact_mut(4).zip(values) {
                    b.copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        if self.transfer == Transfer::Unfused {
            return self.push_unfused(deadline);
        }
        let mut tags = [0u64; 64];
        for (s, tag) in tags.iter_mut().enumerate().take(self.ps.len()) {
            *tag = self
                .handle
                .push_slice(self.ps[s], &self.grads[s], deadline)
                .map_err(|e| format!("push: {e}"))?
                .tag();
            self.push_rpcs += 1;
        }
        for (s, &tag) in tags.iter().enumerate().take(self.ps.len()) {
            let done = self
                .handle
                .wait_tag(tag)
                .map_err(|e| format!("wait: {e}"))?;
            check_pushed(&done, s)?;
            self.handle.recycle(done);
        }
        Ok(())
    }

    fn push_unfused(&mut self, deadline: Option<Instant>) -> Res<()> {
        let mut inflight = 0;
        for s in 0..self.ps.len() {
            for n in 0..self.grads[s].len() {
                if inflight == UNFUSED_WINDOW {
                    let done = self.handle.wait_any().map_err(|e| format!("wait: {e}"))?;
                    check_pushed(&done, s)?;
                    self.handle.recycle(done);
                    inflight -= 1;
                }
                let item = std::slice::from_ref(&self.grads[s][n]);
                // Its completion is taken by `wait_any`, in whatever order they finish.
                let queued = self.handle.push_slice(self.ps[s], item, deadline);
                let _ticket = queued.map_err(|e| format!("push: {e}"))?;
                self.push_rpcs += 1;
                inflight += 1;
            }
        }
        for _ in 0..inflight {
            let done = self.handle.wait_any().map_err(|e| format!("wait: {e}"))?;
            check_pushed(&done, 0)?;
            self.handle.recycle(done);
        }
        Ok(())
    }
}

fn copy_row(t: &Tensor, out: &mut [f32]) -> Res<()> {
    if t.dtype() != DType::F32 || t.byte_len() != out.len() * 4 {
        return Err(format!(
            "pull: a row of {} bytes, {:?}",
            t.byte_len(),
            t.dtype()
        ));
    }
    for (v, b) in out.iter_mut().zip(t.bytes().chunks_exact(4)) {
        *v = f32::from_le_bytes(b.try_into().unwrap());
    }
    Ok(())
}

fn check_pushed(done: &Completion, s: usize) -> Res<()> {
    match done.pushed() {
        Ok(st) if st.iter().all(|s| *s == Status::Ok) => Ok(()),
        Ok(st) => Err(format!("push to ps:{s}: {st:?}")),
        Err(e) => Err(format!("push to ps:{s}: {e}")),
    }
}

fn run_worker(args: &Args, task: &TaskId) -> Res<ExitCode> {
    let ps_addrs: Vec<SocketAddr> = resolver(args)?
        .peers("ps")
        .map_err(|e| e.to_string())?
        .iter()
        .map(Peer::addr)
        .collect();
    if ps_addrs.len() > 64 {
        return Err("at most 64 PS tasks".into());
    }
    let index = task.index;
    let config = ConfigBuilder::from_env("worker", index)
        .and_then(|b| b.loops(1).trace(args.trace.is_some()).build())
        .map_err(|e| e.to_string())?;
    let rt = Runtime::start(config, None).map_err(|e| e.to_string())?;
    let cfg = &args.model;
    let shards = ps_addrs.len();
    let peers = ps_addrs.iter().map(|&a| Peer::from(a)).collect();
    let sharded = Sharded::new(peers, Partition::Hash, TABLE, DType::F32, &[cfg.dim as u64])
        .map_err(|e| e.to_string())?;
    let mut w = Worker {
        handle: rt.handle(UNFUSED_WINDOW.max(shards) * 2),
        ps: ps_addrs,
        dim: cfg.dim,
        transfer: args.transfer(),
        sharded,
        bytes: Vec::new(),
        ids: vec![Vec::new(); shards],
        positions: vec![Vec::new(); shards],
        grads: vec![Vec::new(); shards],
        pull_rpcs: 0,
        push_rpcs: 0,
    };
    let mut gen = Generator::with_truth_cache(cfg, 1000 + index as u64);
    let mut batch = Batch::default();
    let (mut rows, mut grads, mut preds) = (Vec::new(), Vec::new(), Vec::new());
    let mut scratch = Scratch::default();
    // This interval's predictions, labels and the ground truth's predictions, for AUC.
    let (mut all_preds, mut all_labels, mut all_true) = (Vec::new(), Vec::new(), Vec::new());

    let start = UNIX_EPOCH + Duration::from_millis(args.start_ms);
    let since_start = || SystemTime::now().duration_since(start).unwrap_or_default();
    let interval = Duration::from_secs_f64(args.interval);
    let end = Duration::from_secs_f64(args.seconds);
    let mut cur = Interval::default();
    // The whole run's counts and times, for this worker's summary.
    let mut total = Interval::default();
    let mut out = std::io::stdout().lock();
    // Every worker starts at the same moment, so that report intervals line up.
    if let Ok(wait) = start.duration_since(SystemTime::now()) {
        std::thread::sleep(wait);
    }
    loop {
        let now = since_start();
        let index_now = (now.as_nanos() / interval.as_nanos()) as u64;
        if index_now != cur.index || now >= end {
            cur.auc = model::auc(&all_preds, &all_labels);
            cur.optimum_auc = model::auc(&all_true, &all_labels);
            cur.pull_rpcs = std::mem::take(&mut w.pull_rpcs);
            cur.push_rpcs = std::mem::take(&mut w.push_rpcs);
            if cur.steps > 0 {
                writeln!(out, "{}", cur.to_line()).map_err(|e| e.to_string())?;
                out.flush().map_err(|e| e.to_string())?;
            }
            total.add_counts(&cur);
            all_preds.clear();
            all_labels.clear();
            all_true.clear();
            cur = Interval {
                index: index_now,
                ..Interval::default()
            };
            if now >= end {
                break;
            }
        }
        let data_start = Instant::now();
        gen.next_batch(&mut batch);
        let n = batch.unique.len() * cfg.dim;
        rows.resize(n, 0.0);
        grads.resize(n, 0.0);
        let pull_start = Instant::now();
        w.pull(&batch.unique, &mut rows)?;
        let compute_start = Instant::now();
        let loss =
            model::forward_backward(cfg, &batch, &rows, &mut grads, &mut preds, &mut scratch);
        let push_start = Instant::now();
        w.push(&batch.unique, &grads)?;
        let push_end = Instant::now();
        cur.pull_ns += (compute_start - pull_start).as_nanos() as u64;
        cur.compute_ns += (push_start - compute_start).as_nanos() as u64;
        cur.push_ns += (push_end - push_start).as_nanos() as u64;
        cur.data_ns += (pull_start - data_start).as_nanos() as u64;
        cur.steps += 1;
        cur.examples += batch.len() as u64;
        cur.loss += loss;
        cur.optimum += model::optimal_loss(&batch);
        cur.rows += batch.unique.len() as u64;
        all_preds.extend_from_slice(&preds);
        all_labels.extend_from_slice(&batch.labels);
        all_true.extend(batch.true_logits.iter().map(|&l| model::sigmoid(l)));
    }
    // This worker's summary: communication beside compute, per step.
    writeln!(
        out,
        "WORKER {task}: {} steps; per step {}",
        total.steps,
        total.times()
    )
    .map_err(|e| e.to_string())?;
    if args.comm_breakdown {
        for line in comm_breakdown(task, &rt.metrics()) {
            writeln!(out, "COMM {line}").map_err(|e| e.to_string())?;
        }
    }
    // The trace covers training only: written before the evaluation's requests.
    if let Some(path) = &args.trace {
        let path = trace_path(path, index);
        rt.write_trace(&path)
            .map_err(|e| format!("writing the trace {}: {e}", path.display()))?;
        writeln!(out, "TRACE {task}: {}", path.display()).map_err(|e| e.to_string())?;
    }
    out.flush().map_err(|e| e.to_string())?;
    if index == 0 {
        let line = evaluate(args, &mut w)?;
        writeln!(out, "{line}").map_err(|e| e.to_string())?;
    }
    rt.shutdown();
    Ok(ExitCode::SUCCESS)
}

/// Where worker `index` writes its trace: `FILE` with `.worker<index>` before its extension.
fn trace_path(file: &Path, index: u32) -> PathBuf {
    let stem = file
        .file_stem()
        .map_or_else(Default::default, |s| s.to_string_lossy());
    let name = match file.extension() {
        Some(ext) => format!("{stem}.worker{index}.{}", ext.to_string_lossy()),
        None => format!("{stem}.worker{index}"),
    };
    file.with_file_name(name)
}

/// This worker's communication with each PS task, per operation, from its runtime's
/// per-peer metrics: one line each.
fn comm_breakdown(task: &TaskId, m: &starwire::stats::Metrics) -> Vec<String> {
    use starwire::stats::{Outcome, RequestKind, Side};
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut lines = Vec::new();
    for p in m.side(Side::Client) {
        for kind in RequestKind::ALL {
            let op = p.op(kind);
            if op.requests == 0 {
                continue;
            }
            let l = &op.latency;
            lines.push(format!(
                "{task} -> {}: {:<9} {:>6} requests, {} failed, latency p50 {:.2} ms p90 {:.2} \
                 ms p99 {:.2} ms max {:.2} ms, {:.1} MB out, {:.1} MB in, {} rows",
                p.name(),
                kind.name(),
                op.requests,
                op.requests - op.outcome(Outcome::Ok) - op.in_flight(),
                ms(l.quantile(0.5)),
                ms(l.quantile(0.9)),
                ms(l.quantile(0.99)),
                ms(l.max()),
                op.bytes_out as f64 / 1e6,
                op.bytes_in as f64 / 1e6,
                op.rows,
            ));
        }
    }
    lines
}

/// Loss and AUC of the trained model, of the ground truth and of the best constant on
/// held-out examples (a seed no worker trained on): `EVAL examples loss optimum constant auc
/// optimum_auc`.
fn evaluate(args: &Args, w: &mut Worker) -> Res<String> {
    let cfg = ModelConfig {
        batch: 4096,
        ..args.model.clone()
    };
    let mut gen = Generator::with_truth_cache(&cfg, 1);
    let mut batch = Batch::default();
    let (mut rows, mut grads, mut preds) = (Vec::new(), Vec::new(), Vec::new());
    let mut scratch = Scratch::default();
    let (mut loss, mut optimum, mut n) = (0.0, 0.0, 0usize);
    let (mut all_preds, mut all_labels, mut all_true) = (Vec::new(), Vec::new(), Vec::new());
    while n < args.eval {
        gen.next_batch(&mut batch);
        let k = batch.unique.len() * cfg.dim;
        rows.resize(k, 0.0);
        grads.resize(k, 0.0);
        w.pull(&batch.unique, &mut rows)?;
        loss += model::forward_backward(&cfg, &batch, &rows, &mut grads, &mut preds, &mut scratch);
        optimum += model::optimal_loss(&batch);
        n += batch.len();
        all_preds.extend_from_slice(&preds);
        all_labels.extend_from_slice(&batch.labels);
        all_true.extend(batch.true_logits.iter().map(|&l| model::sigmoid(l)));
    }
    let rate = all_labels.iter().sum::<f32>() / n as f32;
    let logit = (rate / (1.0 - rate)).ln();
    let constant: f64 = all_labels.iter().map(|&y| model::log_loss(logit, y)).sum();
    Ok(format!(
        "EVAL {} {} {} {} {} {}",
        n,
        loss / n as f64,
        optimum / n as f64,
        constant / n as f64,
        model::auc(&all_preds, &all_labels),
        model::auc(&all_true, &all_labels)
    ))
}

// ---------------------------------------------------------------------------------------
// Coordinator

/// A free port on loopback, kept bound in `held` until the caller lets go of them all, so
/// that no two calls give the same port.
fn free_port(held: &mut Vec<TcpListener>) -> Res<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    let port = l.local_addr().map_err(|e| e.to_string())?.port();
    held.push(l);
    Ok(port)
}

/// Started tasks; killed if the coordinator returns early.
struct Tasks(Vec<(String, Child)>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn coordinate(mut args: Args) -> Res<ExitCode> {
    let dir = std::env::temp_dir().join(format!("sparse_training.{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // Control addresses name the tasks in the cluster spec; the map gives their data
    // (starwire) addresses.
    let mut map = String::from("# generated by sparse_training: control = data\n");
    let mut held = Vec::new();
    let mut hosts = |n: usize| -> Res<String> {
        let mut list = Vec::new();
        for _ in 0..n {
            let (control, data) = (free_port(&mut held)?, free_port(&mut held)?);
            map.push_str(&format!("127.0.0.1:{control}=127.0.0.1:{data}\n"));
            list.push(format!("127.0.0.1:{control}"));
        }
        Ok(list.join(","))
    };
    args.ps_hosts = hosts(args.ps)?;
    args.worker_hosts = hosts(args.workers)?;
    // Free again for the tasks to bind.
    drop(held);
    let map_path = dir.join(".endpoint_map");
    std::fs::write(&map_path, &map).map_err(|e| format!("{}: {e}", map_path.display()))?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let m = &args.model;
    println!(
        "sparse_training: {} PS, {} workers (processes), {} s; cluster in {}",
        args.ps,
        args.workers,
        args.seconds,
        map_path.display()
    );
    println!(
        "model: factorization machine, {} fields x {} values (hashed), rows of {} f32 ({} B), \
         batch {}, Adagrad lr {}; pulls and pushes {}",
        m.fields,
        m.vocab,
        m.dim,
        m.row_bytes(),
        m.batch,
        m.learning_rate,
        args.transfer().describe()
    );

    let mut tasks = Tasks(Vec::new());
    let spawn = |task: TaskId, args: &Args| -> Res<Child> {
        Command::new(&exe)
            .args(args.task_args(&task, &dir))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("start {task}: {e}"))
    };
    for i in 0..args.ps {
        let task = TaskId::new("ps", i as u32);
        let mut child = spawn(task.clone(), &args)?;
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).map_err(|e| e.to_string())?;
        if line.trim() != "READY" {
            let _ = child.kill();
            return Err(format!("{task} did not start"));
        }
        child.stdout = Some(out.into_inner());
        tasks.0.push((task.to_string(), child));
    }
    args.start_ms = (SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
        + Duration::from_millis(200))
    .as_millis() as u64;
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    let mut workers = Vec::new();
    for i in 0..args.workers {
        let task = TaskId::new("worker", i as u32);
        let mut child = spawn(task.clone(), &args)?;
        let out = child.stdout.take().unwrap();
        let tx = tx.clone();
        workers.push(std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send((i, line)).is_err() {
                    break;
                }
            }
        }));
        tasks.0.push((task.to_string(), child));
    }
    drop(tx);

    println!(
        "\n{:>6} {:>8} {:>10} {:>8} {:>8} {:>6} {:>7} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "time",
        "steps/s",
        "examples/s",
        "loss",
        "optimum",
        "AUC",
        "opt AUC",
        "pull RPCs",
        "push RPCs",
        "rows/RPC",
        "comm ms",
        "comp ms"
    );
    let mut pending: std::collections::BTreeMap<u64, Vec<Interval>> = Default::default();
    let mut eval = None;
    let mut totals = Interval::default();
    let mut last: Option<Interval> = None;
    let mut worker_lines = Vec::new();
    let mut comm_lines = Vec::new();
    for (worker, line) in rx {
        if let Some(iv) = Interval::from_line(&line) {
            let index = iv.index;
            let group = pending.entry(index).or_default();
            group.push(iv);
            if group.len() == args.workers {
                let group = pending.remove(&index).unwrap();
                let row = report(&group, &args);
                totals.add_counts(&row);
                last = Some(row);
            }
        } else if let Some(rest) = line.strip_prefix("EVAL ") {
            eval = Some(rest.to_owned());
        } else if let Some(rest) = line.strip_prefix("WORKER ") {
            worker_lines.push((worker, rest.to_owned()));
        } else if let Some(rest) = line.strip_prefix("COMM ") {
            comm_lines.push(rest.to_owned());
        } else {
            println!("{line}");
        }
    }
    // Any interval not every worker reported (the last one can be cut short).
    for group in pending.values() {
        let row = report(group, &args);
        totals.add_counts(&row);
    }
    for t in workers {
        let _ = t.join();
    }
    let mut failed = Vec::new();
    let mut ps_lines = Vec::new();
    for (name, child) in &mut tasks.0 {
        if name.starts_with("worker") {
            let status = child.wait().map_err(|e| e.to_string())?;
            if !status.success() {
                failed.push(format!("{name} exited with {status}"));
            }
        }
    }
    for (name, child) in &mut tasks.0 {
        if name.starts_with("ps") {
            drop(child.stdin.take()); // the PS stops when its stdin closes
            let mut s = String::new();
            if let Some(mut out) = child.stdout.take() {
                let _ = out.read_to_string(&mut s);
            }
            ps_lines.extend(s.lines().map(str::to_owned));
            let status = child.wait().map_err(|e| e.to_string())?;
            if !status.success() {
                failed.push(format!("{name} exited with {status}"));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);

    println!("\nsummary");
    let secs = args.seconds;
    println!(
        "  trained        {} steps, {} examples in {:.0} s: {:.0} steps/s, {:.0} examples/s",
        totals.steps,
        totals.examples,
        secs,
        totals.steps as f64 / secs,
        totals.examples as f64 / secs
    );
    let rpcs = totals.pull_rpcs + totals.push_rpcs;
    println!(
        "  requests       {} pulls and {} pushes moving {} rows each way ({:.1} rows per request; \
         {} requests had every row been its own)",
        totals.pull_rpcs,
        totals.push_rpcs,
        totals.rows,
        2.0 * totals.rows as f64 / rpcs.max(1) as f64,
        2 * totals.rows
    );
    for line in &ps_lines {
        println!("  {line}");
    }
    worker_lines.sort();
    for (_, line) in &worker_lines {
        println!("  {line}");
    }
    if !comm_lines.is_empty() {
        comm_lines.sort();
        println!("\ncommunication per PS task (the workers' runtime metrics)");
        for line in &comm_lines {
            println!("  {line}");
        }
    }
    println!(
        "  per step       {}: means over the {} steps of all workers, rows {}",
        totals.times(),
        totals.steps,
        match args.transfer() {
            Transfer::Rows => "as rows blocks",
            Transfer::PerTensor => "as tensors (--per-tensor)",
            Transfer::Unfused => "as tensors, one request each (--unfused)",
        }
    );
    if let Some(row) = &last {
        println!(
            "  last interval  loss {:.4}, optimum {:.4} (gap {:.4}); AUC {:.4}, optimum {:.4}",
            row.loss,
            row.optimum,
            row.loss - row.optimum,
            row.auc,
            row.optimum_auc
        );
    }
    let mut ok = failed.is_empty();
    for f in &failed {
        println!("  FAILED: {f}");
    }
    match eval.as_deref().map(parse_eval) {
        Some(Some([n, loss, optimum, constant, auc, optimum_auc])) => {
            let share = (constant - loss) / (constant - optimum);
            println!(
                "  held-out       {n:.0} examples: loss {loss:.4}, optimum {optimum:.4} (gap {:.4}), \
                 best constant {constant:.4}; AUC {auc:.4}, optimum {optimum_auc:.4}",
                loss - optimum
            );
            println!(
                "  the model reached {:.1} % of the loss reduction the ground truth achieves over \
                 the best constant",
                100.0 * share
            );
            if args.check && !(loss < constant && auc > 0.6) {
                println!("  CHECK FAILED: the model did not learn (loss not below the constant's)");
                ok = false;
            }
        }
        _ => {
            println!("  held-out evaluation missing");
            ok = false;
        }
    }
    if args.check && totals.steps == 0 {
        ok = false;
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn parse_eval(s: &str) -> Option<[f64; 6]> {
    let v: Vec<f64> = s.split(' ').filter_map(|x| x.parse().ok()).collect();
    v.try_into().ok()
}

/// Prints one interval, summed over workers, and returns the sums (loss and AUC as
/// example-weighted means).
fn report(group: &[Interval], args: &Args) -> Interval {
    let mut s = Interval {
        index: group[0].index,
        ..Interval::default()
    };
    for iv in group {
        s.add_counts(iv);
        s.loss += iv.loss;
        s.optimum += iv.optimum;
        s.auc += iv.auc * iv.examples as f64;
        s.optimum_auc += iv.optimum_auc * iv.examples as f64;
    }
    let n = s.examples.max(1) as f64;
    (s.loss, s.optimum, s.auc, s.optimum_auc) =
        (s.loss / n, s.optimum / n, s.auc / n, s.optimum_auc / n);
    let secs = args.interval;
    println!(
        "{:>5.0}s {:>8.0} {:>10.0} {:>8.4} {:>8.4} {:>6.4} {:>7.4} {:>9} {:>9} {:>9.1} {:>8.3} \
         {:>8.3}",
        (s.index + 1) as f64 * secs,
        s.steps as f64 / secs,
        s.examples as f64 / secs,
        s.loss,
        s.optimum,
        s.auc,
        s.optimum_auc,
        s.pull_rpcs,
        s.push_rpcs,
        2.0 * s.rows as f64 / (s.pull_rpcs + s.push_rpcs).max(1) as f64,
        s.comm_ms(),
        s.compute_ms()
    );
    s
}
