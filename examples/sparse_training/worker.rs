//! A worker task's training loop: per step it draws a batch, pulls the rows of its
//! distinct ids, computes the loss and gradients, and pushes them back; it times each part
//! and reports every interval to the coordinator on its stdout (see `report.rs`). Worker 0
//! then evaluates the trained model on held-out examples.

use crate::args::Args;
use crate::cluster::resolver;
use crate::model::{self, Batch, Generator, ModelConfig, Scratch};
use crate::report::{comm_breakdown, Interval};
use crate::transfer::Worker;
use crate::Res;
use starwire::cluster::TaskId;
use starwire::config::ConfigBuilder;
use starwire::{Peer, Runtime};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Runs worker task `task`: trains until `--seconds` have passed, reporting an `INTERVAL`
/// line per interval and a `WORKER` summary line; worker 0 then evaluates the model.
pub fn run_worker(args: &Args, task: &TaskId) -> Res<ExitCode> {
    let ps_addrs: Vec<SocketAddr> = resolver(args)?
        .peers("ps")
        .map_err(|e| e.to_string())?
        .iter()
        .map(Peer::addr)
        .collect();
    let index = task.index;
    let config = ConfigBuilder::from_env("worker", index)
        .and_then(|b| b.loops(1).trace(args.trace.is_some()).build())
        .map_err(|e| e.to_string())?;
    let rt = Runtime::start(config, None).map_err(|e| e.to_string())?;
    let cfg = &args.model;
    let mut w = Worker::new(&rt, ps_addrs, cfg.dim, args.transfer())?;
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
