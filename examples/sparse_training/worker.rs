//! A worker task's training loop: per step it pulls the rows of its batch's distinct ids,
//! computes the loss and gradients, pushes them back and draws the next batch; with the
//! pipeline it also requests the next batch's rows before computing. It times each part
//! and reports every interval to the coordinator on its stdout (see `report.rs`). Worker 0
//! evaluates the model on held-out examples before training and after every worker has
//! finished.
//!
//! The coordinator paces the workers through their stdin: every worker says `READY` (worker
//! 0 after its first evaluation), then waits for `START <ms since the epoch>`, the moment
//! all begin (so that report intervals line up); worker 0 waits for `EVAL`, sent once every
//! worker has reported its last step, before its last evaluation.

use crate::args::Args;
use crate::cluster::resolver;
use crate::cpu::Cpu;
use crate::model::{self, Batch, Generator, ModelConfig, Scratch};
use crate::report::{comm_breakdown, Interval};
use crate::transfer::{RowsOptions, Transfer, Worker};
use crate::Res;
use starwire::cluster::TaskId;
use starwire::config::ConfigBuilder;
use starwire::stats::RequestKind;
use starwire::{Peer, Runtime, Stats};
use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Runs worker task `task`: trains for `--seconds` (or `--steps` steps), reporting an
/// `INTERVAL` line per interval, a `WORKER` summary line and a `TRAINED` line; worker 0
/// evaluates the model before (`EVAL0`) and after (`EVAL`).
pub fn run_worker(args: &Args, task: &TaskId) -> Res<ExitCode> {
    let ps_addrs: Vec<SocketAddr> = resolver(args)?
        .peers("ps")
        .map_err(|e| e.to_string())?
        .iter()
        .map(Peer::addr)
        .collect();
    let index = task.index;
    let mut out = std::io::stdout().lock();
    let mut input = std::io::stdin().lock();
    let say = |out: &mut std::io::StdoutLock, line: &str| -> Res<()> {
        writeln!(out, "{line}").map_err(|e| e.to_string())?;
        out.flush().map_err(|e| e.to_string())
    };
    if index == 0 {
        // The untrained model, through a runtime of its own so that the training
        // runtime's metrics and trace hold the training only.
        let line = evaluate_untrained(args, &ps_addrs, index)?;
        say(&mut out, &format!("EVAL0 {line}"))?;
    }
    let config = ConfigBuilder::from_env("worker", index)
        .and_then(|b| b.loops(1).trace(args.trace.is_some()).build())
        .map_err(|e| e.to_string())?;
    let rt = Runtime::start(config, None).map_err(|e| e.to_string())?;
    let cfg = &args.model;
    let options = RowsOptions {
        wire: args.wire,
        cache: args.cache,
    };
    let mut w = Worker::new(&rt, ps_addrs, cfg.dim, args.transfer(), options)?;
    say(&mut out, "READY")?;
    let start_ms = wait_for(&mut input, "START")?
        .parse::<u64>()
        .map_err(|e| format!("START: {e}"))?;
    let trained = train(args, &rt, &mut w, index, start_ms, &mut |line| {
        say(&mut out, line)
    })?;
    // This worker's summary: communication beside compute, per step.
    say(
        &mut out,
        &format!(
            "WORKER {task}: {} steps in {:.2} s; per step {}; CPU {:.3} ms (waited for one {:.3} ms)",
            trained.steps,
            trained.secs,
            trained.total.times(),
            trained.cpu.ran.as_secs_f64() * 1e3 / trained.steps.max(1) as f64,
            trained.cpu.waited.as_secs_f64() * 1e3 / trained.steps.max(1) as f64,
        ),
    )?;
    if args.comm_breakdown {
        for line in comm_breakdown(task, &rt.metrics()) {
            say(&mut out, &format!("COMM {line}"))?;
        }
    }
    // The trace covers training only: written before the evaluation's requests.
    if let Some(path) = &args.trace {
        let path = trace_path(path, index);
        rt.write_trace(&path)
            .map_err(|e| format!("writing the trace {}: {e}", path.display()))?;
        say(&mut out, &format!("TRACE {task}: {}", path.display()))?;
    }
    say(
        &mut out,
        &format!(
            "TRAINED {} {} {}",
            trained.secs,
            trained.cpu.ran.as_nanos(),
            trained.cpu.waited.as_nanos()
        ),
    )?;
    if index == 0 {
        // Every worker's pushes have been answered: the model is final.
        wait_for(&mut input, "EVAL")?;
        w.evaluate_in_f32()?;
        let line = evaluate(args, &mut w)?;
        say(&mut out, &format!("EVAL {line}"))?;
    }
    rt.shutdown();
    Ok(ExitCode::SUCCESS)
}

/// Reads lines from the coordinator until one starts with `word`; returns the rest.
fn wait_for(input: &mut impl BufRead, word: &str) -> Res<String> {
    let mut line = String::new();
    loop {
        line.clear();
        if input.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            return Err(format!("the coordinator left before {word}"));
        }
        if let Some(rest) = line.trim().strip_prefix(word) {
            return Ok(rest.trim().to_owned());
        }
    }
}

/// What a worker's training did.
struct Trained {
    steps: u64,
    /// From the start to the last answer (every push answered).
    secs: f64,
    total: Interval,
    /// The process's CPU time in that time, and its threads' wait for a CPU.
    cpu: Cpu,
}

/// The requests of the pipeline's kinds its runtime has completed or failed: (pulls,
/// pushes).
fn rows_requests(s: &Stats) -> (u64, u64) {
    let n = |k: RequestKind| s.completed[k as usize] + s.failed[k as usize];
    (n(RequestKind::PullRows), n(RequestKind::PushRows))
}

/// Worker `index`'s training loop, from `start_ms` (ms since the epoch) on, reporting
/// through `say`. Its batches depend on its index only, whatever way the rows travel.
fn train(
    args: &Args,
    rt: &Runtime,
    w: &mut Worker,
    index: u32,
    start_ms: u64,
    say: &mut dyn FnMut(&str) -> Res<()>,
) -> Res<Trained> {
    let cfg = &args.model;
    let mut gen = Generator::with_truth_cache(cfg, 1000 + u64::from(index));
    let (mut batch, mut next) = (Batch::default(), Batch::default());
    gen.next_batch(&mut batch);
    gen.next_batch(&mut next);
    let (mut rows, mut grads, mut preds) = (Vec::new(), Vec::new(), Vec::new());
    let mut scratch = Scratch::default();
    // This interval's predictions, labels and the ground truth's predictions, for AUC.
    let (mut all_preds, mut all_labels, mut all_true) = (Vec::new(), Vec::new(), Vec::new());

    let start = UNIX_EPOCH + Duration::from_millis(start_ms);
    let since_start = || SystemTime::now().duration_since(start).unwrap_or_default();
    let interval = Duration::from_secs_f64(args.interval);
    let end = match args.steps {
        Some(_) => Duration::MAX,
        None => Duration::from_secs_f64(args.seconds),
    };
    let last_step = args.steps.unwrap_or(u64::MAX);
    let mut cur = Interval::default();
    // The whole run's counts and times, for this worker's summary.
    let mut total = Interval::default();
    let mut stats = rt.stats();
    // Every worker starts at the same moment, so that report intervals line up.
    if let Ok(wait) = start.duration_since(SystemTime::now()) {
        std::thread::sleep(wait);
    }
    let mut steps = 0u64;
    let cpu = Cpu::now();
    loop {
        let mut now = since_start();
        let index_now = (now.as_nanos() / interval.as_nanos()) as u64;
        let stop = now >= end || steps == last_step;
        if index_now != cur.index || stop {
            if stop {
                let t = Instant::now();
                w.finish(&batch.unique, &mut rows)?;
                cur.push_ns += t.elapsed().as_nanos() as u64;
                now = since_start();
            }
            cur.auc = model::auc(&all_preds, &all_labels);
            cur.optimum_auc = model::auc(&all_true, &all_labels);
            let s = rt.stats();
            cur.wire_bytes = (s.bytes_in + s.bytes_out) - (stats.bytes_in + stats.bytes_out);
            if w.is_pipelined() {
                let ((pulls, pushes), (pulls0, pushes0)) =
                    (rows_requests(&s), rows_requests(&stats));
                cur.pull_rpcs = pulls - pulls0;
                cur.push_rpcs = pushes - pushes0;
            } else {
                cur.pull_rpcs = std::mem::take(&mut w.pull_rpcs);
                cur.push_rpcs = std::mem::take(&mut w.push_rpcs);
            }
            stats = s;
            cur.rows_pulled = std::mem::take(&mut w.rows_pulled);
            cur.rows_pushed = std::mem::take(&mut w.rows_pushed);
            cur.prefetched = std::mem::take(&mut w.prefetched);
            cur.refetched = std::mem::take(&mut w.refetched);
            cur.cache_hits = std::mem::take(&mut w.cache_hits);
            cur.rows_unchanged = std::mem::take(&mut w.rows_unchanged);
            if cur.steps > 0 || stop {
                say(&cur.to_line())?;
            }
            total.add_counts(&cur);
            all_preds.clear();
            all_labels.clear();
            all_true.clear();
            cur = Interval {
                index: index_now,
                ..Interval::default()
            };
            if stop {
                return Ok(Trained {
                    steps,
                    secs: now.as_secs_f64(),
                    total,
                    cpu: Cpu::now().since(cpu),
                });
            }
        }
        let n = batch.unique.len() * cfg.dim;
        rows.resize(n, 0.0);
        grads.resize(n, 0.0);
        let pull_start = Instant::now();
        w.step_pull(&batch.unique, &mut rows)?;
        if steps + 1 < last_step {
            w.step_prefetch(&next.unique)?;
        }
        let compute_start = Instant::now();
        let loss =
            model::forward_backward(cfg, &batch, &rows, &mut grads, &mut preds, &mut scratch);
        let push_start = Instant::now();
        w.step_push(&batch.unique, &grads)?;
        let push_end = Instant::now();
        cur.steps += 1;
        cur.examples += batch.len() as u64;
        cur.loss += loss;
        cur.optimum += model::optimal_loss(&batch);
        all_preds.extend_from_slice(&preds);
        all_labels.extend_from_slice(&batch.labels);
        all_true.extend(batch.true_logits.iter().map(|&l| model::sigmoid(l)));
        // The batch after next, drawn while the pipeline's requests are in flight.
        std::mem::swap(&mut batch, &mut next);
        gen.next_batch(&mut next);
        let data_end = Instant::now();
        cur.pull_ns += (compute_start - pull_start).as_nanos() as u64;
        cur.compute_ns += (push_start - compute_start).as_nanos() as u64;
        cur.push_ns += (push_end - push_start).as_nanos() as u64;
        cur.data_ns += (data_end - push_end).as_nanos() as u64;
        steps += 1;
    }
}

/// [`evaluate`] of the model before training, through a runtime of its own and the
/// synchronous rows client.
fn evaluate_untrained(args: &Args, ps: &[SocketAddr], index: u32) -> Res<String> {
    let config = ConfigBuilder::from_env("worker", index)
        .and_then(|b| b.loops(1).build())
        .map_err(|e| e.to_string())?;
    let rt = Runtime::start(config, None).map_err(|e| e.to_string())?;
    let options = RowsOptions::default();
    let mut w = Worker::new(&rt, ps.to_vec(), args.model.dim, Transfer::Rows, options)?;
    let line = evaluate(args, &mut w);
    rt.shutdown();
    line
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

/// Loss and AUC of the model, of the ground truth and of the best constant on held-out
/// examples (a seed no worker trained on), and the rows the evaluation pulled: `examples
/// loss optimum constant auc optimum_auc rows`.
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
    w.rows_pulled = 0;
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
        "{} {} {} {} {} {} {}",
        n,
        loss / n as f64,
        optimum / n as f64,
        constant / n as f64,
        model::auc(&all_preds, &all_labels),
        model::auc(&all_true, &all_labels),
        std::mem::take(&mut w.rows_pulled)
    ))
}
