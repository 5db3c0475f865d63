//! `--compare`: the same job run twice in one invocation, through the synchronous rows
//! client first and then as the command line says (usually `--pipeline`), with the same
//! seeds and so the same batches; the two runs' figures side by side, with their ratios.

use crate::args::Args;
use crate::cluster;
use crate::report::Outcome;
use crate::Res;
use std::process::ExitCode;

/// Runs the job once, or with `--compare` twice and the comparison.
pub fn run(args: Args) -> Res<ExitCode> {
    if !args.compare {
        return Ok(exit(cluster::coordinate(args)?.ok));
    }
    let sync = args.synchronous();
    let names = [sync.name(), args.name()];
    println!("run 1 of 2: {}\n", names[0]);
    let a = cluster::coordinate(sync)?;
    println!("\nrun 2 of 2: {}\n", names[1]);
    let b = cluster::coordinate(args.clone())?;
    print(&args, &names, &a, &b);
    Ok(exit(a.ok && b.ok))
}

fn exit(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The two runs side by side: `b / a` for rates and times, the relative difference for
/// the loss and AUC.
fn print(args: &Args, names: &[String; 2], a: &Outcome, b: &Outcome) {
    let m = &args.model;
    let length = match args.steps {
        Some(n) => format!("{n} steps per worker"),
        None => format!("{} s", args.seconds),
    };
    let zipf = if m.zipf > 0.0 {
        format!("Zipf {}", m.zipf)
    } else {
        "uniform".to_string()
    };
    println!(
        "\ncomparison: the same job ({} PS, {} workers, batch {}, {} fields x {} values drawn \
         {zipf}, {length}, the same batches)",
        args.ps, args.workers, m.batch, m.fields, m.vocab
    );
    println!(
        "  {:<36} {:>14} {:>16} {:>10}",
        "figure", names[0], names[1], "ratio"
    );
    let ratio = |x: f64, y: f64| {
        if x > 0.0 {
            format!("{:.2}x", y / x)
        } else {
            "-".into()
        }
    };
    let rows: [(&str, f64, f64, usize); 16] = [
        ("steps/s", a.steps_per_s, b.steps_per_s, 1),
        ("communication ms/step (visible)", a.comm_ms, b.comm_ms, 3),
        ("  pull (and prefetch) ms/step", a.pull_ms, b.pull_ms, 3),
        ("  push ms/step", a.push_ms, b.push_ms, 3),
        ("compute ms/step", a.compute_ms, b.compute_ms, 3),
        ("CPU ms/step, workers", a.worker_cpu_ms, b.worker_cpu_ms, 3),
        ("CPU ms/step, PS tasks", a.ps_cpu_ms, b.ps_cpu_ms, 3),
        (
            "waiting for a CPU ms/step, all",
            a.cpu_wait_ms,
            b.cpu_wait_ms,
            3,
        ),
        ("rows/step on the wire", a.rows_per_step, b.rows_per_step, 1),
        (
            "  pulled",
            a.rows_pulled_per_step,
            b.rows_pulled_per_step,
            1,
        ),
        (
            "  pushed",
            a.rows_pushed_per_step,
            b.rows_pushed_per_step,
            1,
        ),
        (
            "rows/step served by the row cache",
            a.cache_hits_per_step,
            b.cache_hits_per_step,
            1,
        ),
        (
            "rows/step answered unchanged",
            a.rows_unchanged_per_step,
            b.rows_unchanged_per_step,
            1,
        ),
        ("KB/step on the wire", a.kb_per_step, b.kb_per_step, 1),
        (
            "bytes on the wire per row moved",
            a.bytes_per_row,
            b.bytes_per_row,
            1,
        ),
        ("steps", a.steps as f64, b.steps as f64, 0),
    ];
    for (label, x, y, digits) in rows {
        println!(
            "  {label:<36} {x:>14.digits$} {y:>16.digits$} {:>10}",
            ratio(x, y)
        );
    }
    let diff = |x: f64, y: f64| format!("{:+.3} %", 100.0 * (y - x) / x);
    println!(
        "  {:<36} {:>14.4} {:>16.4} {:>10}",
        "held-out loss",
        a.loss,
        b.loss,
        diff(a.loss, b.loss)
    );
    println!(
        "  {:<36} {:>14.4} {:>16.4} {:>10}",
        "held-out AUC",
        a.auc,
        b.auc,
        diff(a.auc, b.auc)
    );
    println!(
        "  {:<36} {:>14.4} {:>16.4}",
        "loss before training", a.initial_loss, b.initial_loss
    );
    println!(
        "  {:<36} {:>14.4} {:>16.4}",
        "ground truth's loss", a.optimum, b.optimum
    );
}
