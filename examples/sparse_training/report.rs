//! What the run prints. Each worker sends the coordinator one `INTERVAL` line per report
//! interval ([`Interval`]), a `WORKER` summary line, a `TRAINED` line (its training time,
//! CPU time and wait for a CPU),
//! `COMM` lines (its communication per PS task, from its runtime's metrics) and, from worker
//! 0, the held-out `EVAL0` (before training) and `EVAL` lines; each PS task a `COUNTED`
//! line (the rows its table read for pulls, applied, and answered unchanged, its CPU time
//! and wait for a CPU). The coordinator prints a table row per
//! interval as soon as every worker reported it, then the summary ([`Summary`]), whose
//! figures it returns ([`Outcome`]) for `--compare`.

use crate::args::Args;
use crate::transfer::Transfer;
use starwire::cluster::TaskId;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// The run's first lines: the cluster and the model.
pub fn print_start(args: &Args, map_path: &Path) {
    let m = &args.model;
    println!(
        "sparse_training: {} PS, {} workers (processes), {}; cluster in {}",
        args.ps,
        args.workers,
        match args.steps {
            Some(n) => format!("{n} steps each"),
            None => format!("{} s", args.seconds),
        },
        map_path.display()
    );
    println!(
        "model: factorization machine, {} fields x {} values (hashed, drawn {}), rows of {} f32 \
         ({} B), batch {}, Adagrad lr {}; pulls and pushes {}",
        m.fields,
        m.vocab,
        if m.zipf > 0.0 {
            format!("with Zipf exponent {}", m.zipf)
        } else {
            "uniformly".to_string()
        },
        m.dim,
        m.row_bytes(),
        m.batch,
        m.learning_rate,
        args.transfer().describe()
    );
}

/// The header of the table of intervals.
pub fn print_header() {
    println!(
        "\n{:>6} {:>8} {:>10} {:>8} {:>8} {:>6} {:>7} {:>9} {:>9} {:>9} {:>8} {:>8} {:>9} {:>8} {:>9} {:>9}",
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
        "comp ms",
        "rows/step",
        "KB/step",
        "hits/step",
        "unchanged"
    );
}

/// What a worker did in one report interval; one line on its stdout.
#[derive(Default, Debug, Clone)]
pub struct Interval {
    pub index: u64,
    pub steps: u64,
    pub examples: u64,
    pub loss: f64,
    pub optimum: f64,
    pub auc: f64,
    pub optimum_auc: f64,
    pub pull_rpcs: u64,
    pub push_rpcs: u64,
    /// Rows received by pulls and gradient rows sent by pushes.
    pub rows_pulled: u64,
    pub rows_pushed: u64,
    /// Bytes the worker's runtime received and sent (frames, headers included).
    pub wire_bytes: u64,
    /// Pipelined: PS parts of pulls a prefetch had requested, and those requested again
    /// (their prefetched rows too stale).
    pub prefetched: u64,
    pub refetched: u64,
    /// Pipelined with a row cache: distinct rows served from it, not pulled; and distinct
    /// rows it held too old to serve that a versioned pull named and the PS answered
    /// unchanged (their bytes did not travel: not in `rows_pulled`).
    pub cache_hits: u64,
    pub rows_unchanged: u64,
    pub failed: u64,
    /// Time the steps spent in the calls that move rows (the pull, with the pipeline
    /// its prefetch of the next batch; the push; the end of training's wait for the last
    /// answers is counted as push), computing and drawing their batches, in nanoseconds.
    /// What the calls take is the communication the computation does not overlap.
    pub pull_ns: u64,
    pub push_ns: u64,
    pub compute_ns: u64,
    pub data_ns: u64,
}

impl Interval {
    /// Mean communication time per step (pull and push), in milliseconds.
    pub fn comm_ms(&self) -> f64 {
        (self.pull_ns + self.push_ns) as f64 / 1e6 / self.steps.max(1) as f64
    }

    /// Rows on the wire per step, both ways.
    pub fn rows_per_step(&self) -> f64 {
        (self.rows_pulled + self.rows_pushed) as f64 / self.steps.max(1) as f64
    }

    /// Kilobytes on the wire per step, both ways.
    pub fn kb_per_step(&self) -> f64 {
        self.wire_bytes as f64 / 1e3 / self.steps.max(1) as f64
    }

    /// Mean compute time per step, in milliseconds.
    pub fn compute_ms(&self) -> f64 {
        self.compute_ns as f64 / 1e6 / self.steps.max(1) as f64
    }

    /// Adds the counts and times of `other` (not its loss and AUC).
    pub fn add_counts(&mut self, other: &Interval) {
        self.steps += other.steps;
        self.examples += other.examples;
        self.pull_rpcs += other.pull_rpcs;
        self.push_rpcs += other.push_rpcs;
        self.rows_pulled += other.rows_pulled;
        self.rows_pushed += other.rows_pushed;
        self.wire_bytes += other.wire_bytes;
        self.prefetched += other.prefetched;
        self.refetched += other.refetched;
        self.cache_hits += other.cache_hits;
        self.rows_unchanged += other.rows_unchanged;
        self.failed += other.failed;
        self.pull_ns += other.pull_ns;
        self.push_ns += other.push_ns;
        self.compute_ns += other.compute_ns;
        self.data_ns += other.data_ns;
    }

    /// One line of times per step: communication (pull, push), compute and data, in ms.
    pub fn times(&self) -> String {
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

    pub fn to_line(&self) -> String {
        format!(
            "INTERVAL {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}",
            self.index,
            self.steps,
            self.examples,
            self.loss,
            self.optimum,
            self.auc,
            self.optimum_auc,
            self.pull_rpcs,
            self.push_rpcs,
            self.rows_pulled,
            self.rows_pushed,
            self.wire_bytes,
            self.prefetched,
            self.refetched,
            self.failed,
            self.pull_ns,
            self.push_ns,
            self.compute_ns,
            self.data_ns,
            self.cache_hits,
            self.rows_unchanged
        )
    }

    pub fn from_line(line: &str) -> Option<Interval> {
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
            rows_pulled: n()? as u64,
            rows_pushed: n()? as u64,
            wire_bytes: n()? as u64,
            prefetched: n()? as u64,
            refetched: n()? as u64,
            failed: n()? as u64,
            pull_ns: n()? as u64,
            push_ns: n()? as u64,
            compute_ns: n()? as u64,
            data_ns: n()? as u64,
            cache_hits: n()? as u64,
            rows_unchanged: n()? as u64,
        })
    }
}

/// What the coordinator gathers from the tasks' output, for the table and the summary.
#[derive(Default)]
pub struct Summary {
    /// Intervals some workers have reported, by index.
    pending: BTreeMap<u64, Vec<Interval>>,
    /// Worker 0's `EVAL0` and `EVAL` lines.
    eval0: Option<String>,
    eval: Option<String>,
    /// The sums of every interval printed.
    totals: Interval,
    /// The last interval every worker reported.
    last: Option<Interval>,
    /// `WORKER` lines, with the worker's index.
    worker_lines: Vec<(usize, String)>,
    /// The longest training time a worker reported, seconds.
    trained_secs: f64,
    /// The workers' CPU time while training and their wait for a CPU, nanoseconds.
    worker_cpu: [f64; 2],
    /// `COMM` lines.
    comm_lines: Vec<String>,
    /// What the PS tasks printed when they stopped.
    pub ps_lines: Vec<String>,
    /// Tasks that did not exit cleanly.
    pub failed: Vec<String>,
}

/// A run's figures, from its summary: what `--compare` sets side by side.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub ok: bool,
    pub steps: u64,
    pub steps_per_s: f64,
    /// Time per step in the calls that move rows, ms: pull, push, both.
    pub pull_ms: f64,
    pub push_ms: f64,
    pub comm_ms: f64,
    pub compute_ms: f64,
    pub rows_per_step: f64,
    pub kb_per_step: f64,
    /// Rows received by pulls and sent by pushes per step, rows the row cache served
    /// per step, rows a versioned pull had answered unchanged per step, and bytes on the
    /// wire per row moved (frames both ways over rows both ways: row bytes, ids and
    /// headers).
    pub rows_pulled_per_step: f64,
    pub rows_pushed_per_step: f64,
    pub cache_hits_per_step: f64,
    pub rows_unchanged_per_step: f64,
    pub bytes_per_row: f64,
    /// CPU per step, ms: the workers' processes, the PS tasks' (over the whole run,
    /// evaluations included), and the time the threads of all of them waited for a CPU.
    pub worker_cpu_ms: f64,
    pub ps_cpu_ms: f64,
    pub cpu_wait_ms: f64,
    /// Held-out loss and AUC after training, and the loss before.
    pub loss: f64,
    pub auc: f64,
    pub initial_loss: f64,
    pub optimum: f64,
}

/// Numbers of a worker's `EVAL0` or `EVAL` line: examples, loss, optimum, best constant,
/// AUC, optimum AUC, rows pulled.
fn parse_eval(s: &str) -> Option<[f64; 7]> {
    let v: Vec<f64> = s.split(' ').filter_map(|x| x.parse().ok()).collect();
    v.try_into().ok()
}

impl Summary {
    /// Takes one line of worker `worker`'s output; prints a table row when every worker
    /// has reported its interval, and passes on lines it does not know.
    pub fn line(&mut self, args: &Args, worker: usize, line: &str) {
        if let Some(iv) = Interval::from_line(line) {
            let index = iv.index;
            let group = self.pending.entry(index).or_default();
            group.push(iv);
            if group.len() == args.workers {
                let group = self.pending.remove(&index).unwrap();
                let row = report(&group, args);
                self.totals.add_counts(&row);
                self.last = Some(row);
            }
        } else if let Some(rest) = line.strip_prefix("EVAL0 ") {
            self.eval0 = Some(rest.to_owned());
        } else if let Some(rest) = line.strip_prefix("EVAL ") {
            self.eval = Some(rest.to_owned());
        } else if let Some(rest) = line.strip_prefix("WORKER ") {
            self.worker_lines.push((worker, rest.to_owned()));
        } else if let Some(rest) = line.strip_prefix("TRAINED ") {
            let v: Vec<f64> = rest.split(' ').filter_map(|x| x.parse().ok()).collect();
            if let [secs, ran, waited] = v[..] {
                self.trained_secs = self.trained_secs.max(secs);
                self.worker_cpu[0] += ran;
                self.worker_cpu[1] += waited;
            }
        } else if let Some(rest) = line.strip_prefix("COMM ") {
            self.comm_lines.push(rest.to_owned());
        } else if line != "READY" {
            println!("{line}");
        }
    }

    /// Prints the intervals not every worker reported (the last one can be cut short).
    pub fn flush(&mut self, args: &Args) {
        for group in std::mem::take(&mut self.pending).values() {
            let row = report(group, args);
            self.totals.add_counts(&row);
        }
    }

    /// What the PS tasks counted (`COUNTED pulled applied unchanged ran waited` lines):
    /// rows read by pulls, gradient rows applied, rows of pulls answered unchanged (read,
    /// their bytes not sent), CPU time and wait for a CPU (nanoseconds).
    fn ps_counted(&self) -> [u64; 5] {
        let mut sum = [0; 5];
        for line in &self.ps_lines {
            if let Some(rest) = line.strip_prefix("COUNTED ") {
                let v: Vec<u64> = rest.split(' ').filter_map(|x| x.parse().ok()).collect();
                if v.len() == 5 {
                    sum.iter_mut().zip(v).for_each(|(s, v)| *s += v);
                }
            }
        }
        sum
    }

    /// Prints the summary; the outcome says whether the run went well (every task
    /// exited cleanly, the evaluations came, and with `--check` the model learned and the
    /// rows the workers moved are the rows the PS tasks counted).
    pub fn print(mut self, args: &Args) -> Outcome {
        let totals = &self.totals;
        println!("\nsummary");
        let secs = self.trained_secs.max(1e-9);
        println!(
            "  trained        {} steps, {} examples in {:.1} s: {:.0} steps/s, {:.0} examples/s",
            totals.steps,
            totals.examples,
            secs,
            totals.steps as f64 / secs,
            totals.examples as f64 / secs
        );
        let rpcs = totals.pull_rpcs + totals.push_rpcs;
        let rows = totals.rows_pulled + totals.rows_pushed;
        println!(
            "  requests       {} pulls and {} pushes moving {} rows in and {} out ({:.1} rows per \
             request; {} requests had every row been its own)",
            totals.pull_rpcs,
            totals.push_rpcs,
            totals.rows_pulled,
            totals.rows_pushed,
            rows as f64 / rpcs.max(1) as f64,
            rows
        );
        for line in self.ps_lines.iter().filter(|l| !l.starts_with("COUNTED ")) {
            println!("  {line}");
        }
        self.worker_lines.sort();
        for (_, line) in &self.worker_lines {
            println!("  {line}");
        }
        if !self.comm_lines.is_empty() {
            self.comm_lines.sort();
            println!("\ncommunication per PS task (the workers' runtime metrics)");
            for line in &self.comm_lines {
                println!("  {line}");
            }
        }
        println!(
            "  per step       {}: means over the {} steps of all workers, rows {}",
            totals.times(),
            totals.steps,
            match args.transfer() {
                Transfer::Rows => "as rows blocks".to_string(),
                Transfer::PerTensor => "as tensors (--per-tensor)".to_string(),
                Transfer::Unfused => "as tensors, one request each (--unfused)".to_string(),
                Transfer::Pipelined { staleness } => {
                    format!("as rows blocks, pipelined (--pipeline --staleness {staleness})")
                }
            }
        );
        println!(
            "  on the wire    per step {:.1} rows ({:.1} pulled, {:.1} pushed), {:.1} KB \
             (frames both ways){}",
            totals.rows_per_step(),
            totals.rows_pulled as f64 / totals.steps.max(1) as f64,
            totals.rows_pushed as f64 / totals.steps.max(1) as f64,
            totals.kb_per_step(),
            if args.pipeline {
                format!(
                    "; pull parts: {} requested ahead by a prefetch, {} requested again{}",
                    totals.prefetched,
                    totals.refetched,
                    if args.cache > 0 {
                        format!(
                            "; {:.1} rows per step served by the row cache, {:.1} named by a \
                             versioned pull and answered unchanged",
                            totals.cache_hits as f64 / totals.steps.max(1) as f64,
                            totals.rows_unchanged as f64 / totals.steps.max(1) as f64
                        )
                    } else {
                        String::new()
                    }
                )
            } else {
                String::new()
            }
        );
        if let Some(row) = &self.last {
            println!(
                "  last interval  loss {:.4}, optimum {:.4} (gap {:.4}); AUC {:.4}, optimum {:.4}",
                row.loss,
                row.optimum,
                row.loss - row.optimum,
                row.auc,
                row.optimum_auc
            );
        }
        let [.., ps_ran, ps_waited] = self.ps_counted();
        let per_step = |ns: f64| ns / 1e6 / totals.steps.max(1) as f64;
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        println!(
            "  CPU per step   workers {:.3} ms, PS tasks {:.3} ms (their whole run); every task's \
             threads waited {:.3} ms for a CPU ({cpus} CPUs)",
            per_step(self.worker_cpu[0]),
            per_step(ps_ran as f64),
            per_step(self.worker_cpu[1] + ps_waited as f64),
        );
        let mut out = Outcome {
            worker_cpu_ms: per_step(self.worker_cpu[0]),
            ps_cpu_ms: per_step(ps_ran as f64),
            cpu_wait_ms: per_step(self.worker_cpu[1] + ps_waited as f64),
            ok: self.failed.is_empty(),
            steps: totals.steps,
            steps_per_s: totals.steps as f64 / secs,
            pull_ms: totals.pull_ns as f64 / 1e6 / totals.steps.max(1) as f64,
            push_ms: totals.push_ns as f64 / 1e6 / totals.steps.max(1) as f64,
            comm_ms: totals.comm_ms(),
            compute_ms: totals.compute_ms(),
            rows_per_step: totals.rows_per_step(),
            kb_per_step: totals.kb_per_step(),
            rows_pulled_per_step: totals.rows_pulled as f64 / totals.steps.max(1) as f64,
            rows_pushed_per_step: totals.rows_pushed as f64 / totals.steps.max(1) as f64,
            cache_hits_per_step: totals.cache_hits as f64 / totals.steps.max(1) as f64,
            rows_unchanged_per_step: totals.rows_unchanged as f64 / totals.steps.max(1) as f64,
            bytes_per_row: totals.wire_bytes as f64
                / (totals.rows_pulled + totals.rows_pushed).max(1) as f64,
            ..Outcome::default()
        };
        for f in &self.failed {
            println!("  FAILED: {f}");
        }
        let eval0 = self.eval0.as_deref().and_then(parse_eval);
        let eval = self.eval.as_deref().and_then(parse_eval);
        let (Some(e0), Some([n, loss, optimum, constant, auc, optimum_auc, eval_rows])) =
            (eval0, eval)
        else {
            println!("  held-out evaluation missing");
            out.ok = false;
            return out;
        };
        (out.loss, out.auc, out.initial_loss, out.optimum) = (loss, auc, e0[1], optimum);
        let share = (constant - loss) / (constant - optimum);
        println!(
            "  held-out       {n:.0} examples: loss {loss:.4}, optimum {optimum:.4} (gap {:.4}), \
             best constant {constant:.4}; AUC {auc:.4}, optimum {optimum_auc:.4}",
            loss - optimum
        );
        println!(
            "  before         the same examples before training: loss {:.4}, AUC {:.4}",
            e0[1], e0[4]
        );
        println!(
            "  the model reached {:.1} % of the loss reduction the ground truth achieves over \
             the best constant",
            100.0 * share
        );
        // A row a versioned pull named and the PS answered unchanged was read by the PS
        // but not sent: the rows sent are those read less those.
        let [ps_read, ps_applied, ps_unchanged, ..] = self.ps_counted();
        let ps_sent = ps_read.saturating_sub(ps_unchanged);
        let pulled = totals.rows_pulled + e0[6] as u64 + eval_rows as u64;
        let rows_agree = ps_sent == pulled
            && ps_applied == totals.rows_pushed
            && ps_unchanged == totals.rows_unchanged;
        println!(
            "  rows counted   workers: {pulled} pulled ({} training, {} evaluations), {} pushed; \
             PS tables: {ps_sent} sent by pulls, {ps_applied} applied; answered unchanged: \
             workers {}, PS tables {ps_unchanged}: {}",
            totals.rows_pulled,
            e0[6] as u64 + eval_rows as u64,
            totals.rows_pushed,
            totals.rows_unchanged,
            if rows_agree { "the same" } else { "DIFFERENT" }
        );
        if args.check && !(loss < constant && auc > 0.6 && loss < e0[1]) {
            println!("  CHECK FAILED: the model did not learn (loss not below the constant's)");
            out.ok = false;
        }
        if args.check && !rows_agree {
            println!(
                "  CHECK FAILED: the rows the workers moved are not those the PS tasks counted"
            );
            out.ok = false;
        }
        if args.check && totals.steps == 0 {
            out.ok = false;
        }
        out
    }
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
         {:>8.3} {:>9.1} {:>8.1} {:>9.1} {:>9.1}",
        (s.index + 1) as f64 * secs,
        s.steps as f64 / secs,
        s.examples as f64 / secs,
        s.loss,
        s.optimum,
        s.auc,
        s.optimum_auc,
        s.pull_rpcs,
        s.push_rpcs,
        (s.rows_pulled + s.rows_pushed) as f64 / (s.pull_rpcs + s.push_rpcs).max(1) as f64,
        s.comm_ms(),
        s.compute_ms(),
        s.rows_per_step(),
        s.kb_per_step(),
        s.cache_hits as f64 / s.steps.max(1) as f64,
        s.rows_unchanged as f64 / s.steps.max(1) as f64
    );
    s
}

/// This worker's communication with each PS task, per operation, from its runtime's
/// per-peer metrics: one line each.
pub fn comm_breakdown(task: &TaskId, m: &starwire::stats::Metrics) -> Vec<String> {
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
