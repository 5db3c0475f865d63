//! What the run prints. Each worker sends the coordinator one `INTERVAL` line per report
//! interval ([`Interval`]), a `WORKER` summary line, `COMM` lines (its communication per PS
//! task, from its runtime's metrics) and, from worker 0, the held-out `EVAL` line; the
//! coordinator prints a table row per interval as soon as every worker reported it, then
//! the summary ([`Summary`]).

use crate::args::Args;
use crate::transfer::Transfer;
use starwire::cluster::TaskId;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

/// The run's first lines: the cluster and the model.
pub fn print_start(args: &Args, map_path: &Path) {
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
}

/// The header of the table of intervals.
pub fn print_header() {
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
    pub rows: u64,
    pub failed: u64,
    /// Time the steps spent pulling, pushing, computing and drawing their batches, in
    /// nanoseconds.
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
        self.rows += other.rows;
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
            rows: n()? as u64,
            failed: n()? as u64,
            pull_ns: n()? as u64,
            push_ns: n()? as u64,
            compute_ns: n()? as u64,
            data_ns: n()? as u64,
        })
    }
}

/// What the coordinator gathers from the tasks' output, for the table and the summary.
#[derive(Default)]
pub struct Summary {
    /// Intervals some workers have reported, by index.
    pending: BTreeMap<u64, Vec<Interval>>,
    /// Worker 0's `EVAL` line.
    eval: Option<String>,
    /// The sums of every interval printed.
    totals: Interval,
    /// The last interval every worker reported.
    last: Option<Interval>,
    /// `WORKER` lines, with the worker's index.
    worker_lines: Vec<(usize, String)>,
    /// `COMM` lines.
    comm_lines: Vec<String>,
    /// What the PS tasks printed when they stopped.
    pub ps_lines: Vec<String>,
    /// Tasks that did not exit cleanly.
    pub failed: Vec<String>,
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
        } else if let Some(rest) = line.strip_prefix("EVAL ") {
            self.eval = Some(rest.to_owned());
        } else if let Some(rest) = line.strip_prefix("WORKER ") {
            self.worker_lines.push((worker, rest.to_owned()));
        } else if let Some(rest) = line.strip_prefix("COMM ") {
            self.comm_lines.push(rest.to_owned());
        } else {
            println!("{line}");
        }
    }

    /// Prints the intervals not every worker reported (the last one can be cut short).
    pub fn flush(&mut self, args: &Args) {
        for group in self.pending.values() {
            let row = report(group, args);
            self.totals.add_counts(&row);
        }
    }

    /// Prints the summary; the exit code says whether the run went well (every task
    /// exited cleanly, the evaluation came, and with `--check` the model learned).
    pub fn print(mut self, args: &Args) -> ExitCode {
        let totals = &self.totals;
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
        for line in &self.ps_lines {
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
                Transfer::Rows => "as rows blocks",
                Transfer::PerTensor => "as tensors (--per-tensor)",
                Transfer::Unfused => "as tensors, one request each (--unfused)",
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
        let mut ok = self.failed.is_empty();
        for f in &self.failed {
            println!("  FAILED: {f}");
        }
        match self.eval.as_deref().map(parse_eval) {
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
                    println!(
                        "  CHECK FAILED: the model did not learn (loss not below the constant's)"
                    );
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
        if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }
}

/// The six numbers of a worker's `EVAL` line.
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
