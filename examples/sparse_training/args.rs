//! The command line: the run's settings, and the options the coordinator passes on to each
//! task it starts (the same settings plus the task's role and the cluster's whereabouts).

use crate::model::ModelConfig;
use crate::transfer::Transfer;
use starwire::cluster::TaskId;
use starwire::DType;
use std::path::{Path, PathBuf};

pub const USAGE: &str = "\
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
  --steps N         train N steps per worker instead of for --seconds (the same
                    batches whatever the transport, for comparing runs)
  --eval N          held-out examples evaluated before and after training
                    (default 100000)
  --zipf S          draw each field's values with Zipf exponent S: value k of a field
                    has weight 1/(k+1)^S, so a few ids are hot and most are rare; 0 is
                    a uniform draw (default 1.1)
  --per-tensor      pull and push rows as tensors (one fused request per PS task and
                    step, a tensor per row) instead of as packed rows blocks
  --unfused         one request per row (as tensors) instead of one per PS task and step
  --pipeline        the pipelined rows client: the next batch's rows are requested
                    while this one computes, pushes are not waited for
  --staleness N     with --pipeline: the rows a step uses may miss at most N of the
                    worker's own latest pushes (default 1; 0 = each pull waits for the
                    last push, the rows of the synchronous step)
  --cache BYTES     with --pipeline: a row cache of BYTES (a number, or with K, M or
                    G: 8M = 8 MiB) on each worker; a row it holds that misses at most
                    --staleness of the worker's own pushes is served from it, not
                    pulled; those it holds too old are named in the pull with their
                    versions and sent only if changed (f32 rows) (0, the default:
                    no cache)
  --wire DTYPE      how rows travel: f32 (the default, the table's dtype), bf16 or
                    f16 (pulls and pushes; the tables stay f32; the held-out
                    evaluation pulls f32)
  --compare         run the job twice, the synchronous rows client first and then as
                    the other options say, and print the two side by side
  --comm-breakdown  print each worker's communication per PS task and operation, from
                    its runtime's metrics (requests, failures, latency percentiles,
                    bytes and rows)
  --trace FILE      record every request of each worker and write it at the end as a
                    Chrome trace (open it in ui.perfetto.dev): worker i writes FILE
                    with .worker<i> before its extension (docs/deploying.md)
  --check           exit with status 1 unless training went well (for tests)
  --help            this text
";

/// Settings of a run, parsed from the command line (and passed on to the tasks).
#[derive(Clone, Debug)]
pub struct Args {
    pub ps: usize,
    pub workers: usize,
    pub seconds: f64,
    pub interval: f64,
    pub model: ModelConfig,
    pub eval: usize,
    /// Train this many steps per worker rather than for `seconds`.
    pub steps: Option<u64>,
    pub per_tensor: bool,
    pub unfused: bool,
    /// Through the pipelined rows client, with this staleness bound.
    pub pipeline: bool,
    pub staleness: u32,
    /// With the pipeline: the bytes of each worker's row cache (0: none).
    pub cache: usize,
    /// The dtype rows travel as, when not the table's f32.
    pub wire: Option<DType>,
    /// Run the synchronous rows client first, then these settings, and compare.
    pub compare: bool,
    pub check: bool,
    /// Print each worker's per-PS communication from its runtime's metrics.
    pub comm_breakdown: bool,
    /// Write each worker's request trace to this file (`.worker<i>` added).
    pub trace: Option<PathBuf>,
    /// Set for the tasks this program starts: `ps:0`, `worker:1`, ...
    pub role: Option<TaskId>,
    /// The cluster's directory (with `.endpoint_map`), for tasks.
    pub dir: Option<PathBuf>,
    /// Cluster spec, for tasks: `ps=HOSTS` and `worker=HOSTS` control addresses.
    pub ps_hosts: String,
    pub worker_hosts: String,
}

impl Args {
    pub fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
        let mut a = Args {
            ps: 1,
            workers: 2,
            seconds: 50.0,
            interval: 5.0,
            model: ModelConfig::default(),
            eval: 100_000,
            steps: None,
            per_tensor: false,
            unfused: false,
            pipeline: false,
            staleness: 1,
            cache: 0,
            wire: None,
            compare: false,
            check: false,
            comm_breakdown: false,
            trace: None,
            role: None,
            dir: None,
            ps_hosts: String::new(),
            worker_hosts: String::new(),
        };
        let mut staleness = None;
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
                "--steps" => a.steps = Some(num(&flag, value()?)?),
                "--zipf" => a.model.zipf = num(&flag, value()?)?,
                "--per-tensor" => a.per_tensor = true,
                "--unfused" => a.unfused = true,
                "--pipeline" => a.pipeline = true,
                "--staleness" => staleness = Some(num(&flag, value()?)?),
                "--cache" => a.cache = bytes(&flag, &value()?)?,
                "--wire" => a.wire = wire_dtype(&value()?)?,
                "--compare" => a.compare = true,
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
        if a.steps == Some(0) {
            return Err("--steps must be at least 1".into());
        }
        if !(m.zipf >= 0.0 && m.zipf.is_finite()) {
            return Err(format!(
                "--zipf {}: the exponent must be 0 (uniform) or more",
                m.zipf
            ));
        }
        if a.pipeline && (a.per_tensor || a.unfused) {
            return Err("--pipeline moves rows blocks: not with --per-tensor or --unfused".into());
        }
        if a.cache > 0 && !a.pipeline {
            return Err("--cache needs --pipeline (the pipelined rows client keeps it)".into());
        }
        if a.wire.is_some() && (a.per_tensor || a.unfused) {
            return Err(
                "--wire is how rows blocks travel: not with --per-tensor or --unfused".into(),
            );
        }
        match staleness {
            Some(_) if !a.pipeline => return Err("--staleness needs --pipeline".into()),
            Some(s) => a.staleness = s,
            None => {}
        }
        Ok(a)
    }

    /// The options a task is started with: the run's settings, then its own.
    pub fn task_args(&self, task: &TaskId, dir: &Path) -> Vec<String> {
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
            ("--zipf", m.zipf.to_string()),
            ("--role", task.to_string()),
            ("--dir", dir.display().to_string()),
            ("--ps-hosts", self.ps_hosts.clone()),
            ("--worker-hosts", self.worker_hosts.clone()),
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
        if let Some(n) = self.steps {
            v.extend(["--steps".into(), n.to_string()]);
        }
        if self.pipeline {
            v.extend(["--pipeline".into(), "--staleness".into()]);
            v.push(self.staleness.to_string());
        }
        if self.cache > 0 {
            v.extend(["--cache".into(), self.cache.to_string()]);
        }
        if let Some(w) = self.wire {
            v.extend(["--wire".into(), w.name().to_string()]);
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

    /// The run `--compare` measures first: the same job through the synchronous rows
    /// client.
    pub fn synchronous(&self) -> Args {
        Args {
            per_tensor: false,
            unfused: false,
            pipeline: false,
            staleness: 1,
            cache: 0,
            wire: None,
            compare: false,
            ..self.clone()
        }
    }

    /// The run's short name, for the comparison's columns: the transfer, the cache and
    /// the wire dtype.
    pub fn name(&self) -> String {
        let mut name = self.transfer().name();
        if self.cache > 0 {
            name += &format!(" cache {}", show_bytes(self.cache));
        }
        if let Some(w) = self.wire {
            name += &format!(" {}", w.name());
        }
        name
    }

    /// How rows travel: `--unfused` is per tensor too.
    pub fn transfer(&self) -> Transfer {
        if self.pipeline {
            Transfer::Pipelined {
                staleness: self.staleness,
            }
        } else if self.unfused {
            Transfer::Unfused
        } else if self.per_tensor {
            Transfer::PerTensor
        } else {
            Transfer::Rows
        }
    }
}

/// A byte count: a number, or one with a K, M or G suffix (binary: 8M = 8 MiB).
fn bytes(flag: &str, v: &str) -> Result<usize, String> {
    let (digits, unit) = match v.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&v[..i], c.to_ascii_uppercase()),
        _ => (v, 'B'),
    };
    let shift = match unit {
        'B' => 0,
        'K' => 10,
        'M' => 20,
        'G' => 30,
        _ => return Err(format!("{flag} {v}: the unit must be K, M or G")),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("{flag} {v}: not a byte count (e.g. 8M, 65536)"))
}

/// `n` bytes as the command line writes them: 8M, 512K, 1000.
pub fn show_bytes(n: usize) -> String {
    for (unit, shift) in [("G", 30), ("M", 20), ("K", 10)] {
        if n >= 1 << shift && n % (1 << shift) == 0 {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

/// `--wire`'s dtype: `None` for f32, the table's.
fn wire_dtype(v: &str) -> Result<Option<DType>, String> {
    match v {
        "f32" => Ok(None),
        "bf16" => Ok(Some(DType::BF16)),
        "f16" => Ok(Some(DType::F16)),
        other => Err(format!("--wire {other}: f32, bf16 or f16")),
    }
}
