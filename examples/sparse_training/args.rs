//! The command line: the run's settings, and the options the coordinator passes on to each
//! task it starts (the same settings plus the task's role and the cluster's whereabouts).

use crate::model::ModelConfig;
use crate::transfer::Transfer;
use starwire::cluster::TaskId;
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

/// Settings of a run, parsed from the command line (and passed on to the tasks).
#[derive(Clone, Debug)]
pub struct Args {
    pub ps: usize,
    pub workers: usize,
    pub seconds: f64,
    pub interval: f64,
    pub model: ModelConfig,
    pub eval: usize,
    pub per_tensor: bool,
    pub unfused: bool,
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
    /// Wall-clock start of training (ms since the epoch), so that workers' report
    /// intervals line up.
    pub start_ms: u64,
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
    pub fn transfer(&self) -> Transfer {
        if self.unfused {
            Transfer::Unfused
        } else if self.per_tensor {
            Transfer::PerTensor
        } else {
            Transfer::Rows
        }
    }
}
