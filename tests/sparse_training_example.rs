//! The README's first command, `examples/sparse_training.rs`, run briefly: PS and worker
//! processes find each other through a generated `.endpoint_map`, train over loopback, and
//! the model must learn (held-out loss below the best constant's, AUC above 0.6) with no
//! failed request. `cargo test` builds the example next to this test's binary.

use std::path::PathBuf;
use std::process::Command;

fn example() -> PathBuf {
    // target/<profile>/deps/<this test> -> target/<profile>/examples/sparse_training
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(|d| d.parent()).unwrap();
    let path = profile.join("examples").join("sparse_training");
    assert!(
        path.exists(),
        "{} is missing: run this through `cargo test`, which builds the examples",
        path.display()
    );
    path
}

fn run(extra: &[&str]) -> String {
    let out = Command::new(example())
        .args([
            "--check",
            "--seconds",
            "4",
            "--interval",
            "1",
            "--batch",
            "128",
        ])
        .args(["--eval", "8192"])
        .args(extra)
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "example failed: {}\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

/// Numbers after `label` on the line that has it.
/// A `--compare` output split into its first run, the second (from its heading `second`)
/// and the comparison.
fn compared<'a>(out: &'a str, second: &str) -> (&'a str, &'a str, &'a str) {
    let (first, rest) = out
        .split_once(second)
        .unwrap_or_else(|| panic!("two runs: {out}"));
    let (rest, comparison) = rest
        .split_once("comparison:")
        .unwrap_or_else(|| panic!("a comparison: {out}"));
    (first, rest, comparison)
}

fn numbers_after(text: &str, label: &str) -> Vec<f64> {
    let line = text.lines().find(|l| l.contains(label)).unwrap_or_else(|| {
        panic!("no line with {label:?} in:\n{text}");
    });
    let rest = &line[line.find(label).unwrap() + label.len()..];
    rest.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|w| w.parse().ok())
        .collect()
}

/// Checks a run over 2 PS tasks: enough steps, one pull and one push per PS task and step
/// (hundreds of rows per request), and a held-out loss between the optimum and the best
/// constant.
fn steps_fused_over_two_ps_tasks_and_learned(out: &str) {
    let trained = numbers_after(out, "trained");
    assert!(trained[0] >= 4.0, "too few steps: {out}");
    let requests = numbers_after(out, "requests");
    let (pulls, pushes, rows) = (requests[0], requests[1], requests[2]);
    assert_eq!(pulls, pushes, "{out}");
    assert_eq!(
        pulls,
        2.0 * trained[0],
        "a pull per PS task and step: {out}"
    );
    assert!(rows / pulls > 100.0, "rows per request: {out}");
    let held_out = numbers_after(out, "held-out");
    let (loss, optimum, constant) = (held_out[1], held_out[2], held_out[4]);
    assert!(optimum < loss && loss < constant, "{out}");
}

#[test]
fn trains_with_fused_requests_and_learns() {
    let out = run(&["--ps", "2", "--workers", "2", "--comm-breakdown"]);
    // Per-interval table rows, then the summary.
    assert!(out.contains("examples/s"), "{out}");
    steps_fused_over_two_ps_tasks_and_learned(&out);
    // Both PS tasks applied gradients.
    assert!(out.contains("ps:0:") && out.contains("ps:1:"), "{out}");
    communication_breakdown_from_the_metrics(&out);
}

/// The `--comm-breakdown` lines: per worker, PS task and operation, from the workers'
/// runtime metrics. The sharded client sends one rows pull and one rows push per PS task
/// and step, so over the workers each (PS task, operation) has a request per step.
fn communication_breakdown_from_the_metrics(out: &str) {
    assert!(out.contains("communication per PS task"), "{out}");
    let trained = numbers_after(out, "trained")[0];
    for ps in ["ps:0", "ps:1"] {
        for op in ["pull_rows", "push_rows"] {
            let label = format!(" -> {ps}: {op} ");
            let lines: Vec<&str> = out.lines().filter(|l| l.contains(&label)).collect();
            assert_eq!(lines.len(), 2, "one line per worker for {ps} {op}: {out}");
            let requests: f64 = lines.iter().map(|l| numbers_after(l, op)[0]).sum();
            assert_eq!(requests, trained, "{out}");
            for line in lines {
                assert!(line.contains(" 0 failed"), "{line}");
            }
        }
    }
}

#[test]
fn unfused_requests_carry_one_row_each() {
    let out = run(&["--unfused", "--workers", "1", "--eval", "1024"]);
    let requests = numbers_after(&out, "requests");
    let (pulls, rows) = (requests[0], requests[2]);
    assert_eq!(pulls, rows, "one row per request: {out}");
}

#[test]
fn rows_as_tensors_take_one_fused_request_per_ps_task_and_step_and_learn() {
    let out = run(&["--per-tensor", "--ps", "2", "--workers", "1"]);
    assert!(out.contains("per tensor, fused"), "{out}");
    steps_fused_over_two_ps_tasks_and_learned(&out);
}

/// How far the pipelined run's held-out loss may be from the synchronous run's, relative:
/// the same batches, but rows up to 2 pushes stale, and in both runs the two workers'
/// pushes interleave at the PS in whatever order they arrive. With these settings the two
/// runs' losses (about 0.45, from 0.69 untrained) differed by -0.08 % to +0.20 % in three
/// runs (by up to 0.6 % over 400 steps, 1 % over 150), and synchronous runs among
/// themselves by up to 0.3 %: 2 % leaves room for that noise, not for a pipeline that loses
/// or misplaces gradients.
const PIPELINED_LOSS_TOLERANCE: f64 = 0.02;

/// `--compare --pipeline --staleness 2 --zipf 1.1` with a fixed number of steps: the job
/// runs through the synchronous rows client, then through the pipeline, with the same
/// batches. Each run trains (held-out loss below the untrained model's on the same
/// examples, and below the best constant's), every row the workers report on the wire is
/// one the PS tables counted (pulled rows read by pulls, pushed rows applied), and the
/// pipelined run's held-out loss is within [`PIPELINED_LOSS_TOLERANCE`] of the
/// synchronous run's.
#[test]
fn the_pipelined_step_trains_like_the_synchronous_one_and_its_rows_are_the_ps_tasks() {
    let steps = 300.0;
    let out = run(&[
        "--compare",
        "--pipeline",
        "--staleness",
        "2",
        "--zipf",
        "1.1",
        "--steps",
        "300",
        "--ps",
        "2",
        "--workers",
        "2",
    ]);
    let (sync, pipelined, comparison) = compared(&out, "run 2 of 2: pipelined s=2");
    assert!(sync.contains("rows as rows blocks\n"), "{sync}");
    assert!(
        pipelined.contains("(--pipeline --staleness 2)"),
        "{pipelined}"
    );
    let mut losses = Vec::new();
    for run in [sync, pipelined] {
        // Every worker ran its steps.
        assert_eq!(numbers_after(run, "trained")[0], 2.0 * steps, "{run}");
        // It trained.
        let held_out = numbers_after(run, "held-out");
        let (loss, constant) = (held_out[1], held_out[4]);
        let before = numbers_after(run, "before training: loss")[0];
        assert!(loss < before && loss < constant, "{run}");
        losses.push(loss);
        // The rows on the wire are the rows the PS tables counted.
        let c = numbers_after(run, "rows counted");
        let (pulled, training, evaluations, pushed) = (c[0], c[1], c[2], c[3]);
        let (ps_pulled, ps_applied) = (c[4], c[5]);
        assert_eq!(pulled, training + evaluations, "{run}");
        assert_eq!((pulled, pushed), (ps_pulled, ps_applied), "{run}");
        let requests = numbers_after(run, "requests");
        assert_eq!((requests[2], requests[3]), (training, pushed), "{run}");
        assert!(pushed > 100.0 * steps, "{run}");
    }
    // The pipeline requested rows ahead, and none again.
    let wire = numbers_after(pipelined, "on the wire");
    let prefetched = wire[wire.len() - 2];
    let refetched = wire[wire.len() - 1];
    assert!(prefetched > 0.0 && refetched == 0.0, "{pipelined}");
    let difference = (losses[1] - losses[0]).abs() / losses[0];
    assert!(
        difference <= PIPELINED_LOSS_TOLERANCE,
        "held-out loss {} pipelined against {} synchronous: {out}",
        losses[1],
        losses[0]
    );
    assert!(comparison.contains("held-out loss"), "{comparison}");
}

/// `--compare --pipeline --staleness 4 --cache 1M --wire bf16`: the pipelined run serves
/// hot rows from its row cache, so fewer rows are pulled over the wire than by the
/// synchronous run of the same batches; rows travel as bf16, so fewer bytes per row; every
/// row on the wire is one the PS tables counted; and the model trains as the synchronous
/// run's does (the cache's rows may miss up to 4 pushes, bf16 rounds them: the same
/// tolerance as above).
#[test]
fn the_cached_bf16_step_pulls_fewer_rows_and_bytes_and_trains() {
    let out = run(&[
        "--compare",
        "--pipeline",
        "--staleness",
        "4",
        "--cache",
        "1M",
        "--wire",
        "bf16",
        "--zipf",
        "1.1",
        "--steps",
        "300",
        "--workers",
        "2",
    ]);
    let (sync, cached, comparison) = compared(&out, "run 2 of 2: pipelined s=4 cache 1M bf16");
    let mut losses = Vec::new();
    for run in [sync, cached] {
        let held_out = numbers_after(run, "held-out");
        let (loss, constant) = (held_out[1], held_out[4]);
        assert!(loss < constant, "{run}");
        losses.push(loss);
        let c = numbers_after(run, "rows counted");
        assert_eq!((c[0], c[3]), (c[4], c[5]), "{run}");
        // Rows answered unchanged, by the workers' count and the PS tables'.
        assert_eq!(c[6], c[7], "{run}");
    }
    assert!(
        cached.contains("rows per step served by the row cache"),
        "{cached}"
    );
    assert!(cached.contains("answered unchanged"), "{cached}");
    // Figures of the comparison: synchronous, cached, ratio.
    let served = numbers_after(comparison, "served by the row cache");
    assert!(served[0] == 0.0 && served[1] > 0.0, "{comparison}");
    // A count per step for each run (the synchronous client has no cache: none).
    let unchanged = numbers_after(comparison, "rows/step answered unchanged");
    assert!(unchanged.len() >= 2 && unchanged[0] == 0.0, "{comparison}");
    let pulled = numbers_after(comparison, "    pulled ");
    assert!(pulled[1] < pulled[0], "{comparison}");
    let pushed = numbers_after(comparison, "    pushed ");
    assert_eq!(pushed[0], pushed[1], "{comparison}");
    let per_row = numbers_after(comparison, "bytes on the wire per row moved");
    assert!(per_row[1] < 0.7 * per_row[0], "{comparison}");
    let difference = (losses[1] - losses[0]).abs() / losses[0];
    assert!(difference <= PIPELINED_LOSS_TOLERANCE, "{out}");
}

/// `--compare --pipeline --staleness 0 --cache 1M`: at staleness 0 the row cache serves
/// nothing without asking; it names the rows it holds in the pull with their versions, and
/// the PS sends only the rows pushed since. Here every worker pushes a gradient row for
/// every row it pulled, so by the time a worker asks for a row again its own push has
/// changed it: none comes back unchanged, and the pipelined run pulls over the wire exactly
/// the rows the synchronous run of the same batches pulls. The workers' count of rows
/// answered unchanged is the PS table's, and the model trains as the synchronous run's does.
#[test]
fn at_staleness_0_the_cache_refreshes_every_row_it_holds_and_pulls_the_changed_ones() {
    let out = run(&[
        "--compare",
        "--pipeline",
        "--staleness",
        "0",
        "--cache",
        "1M",
        "--zipf",
        "1.1",
        "--steps",
        "300",
        "--workers",
        "2",
    ]);
    let (sync, cached, comparison) = compared(&out, "run 2 of 2: pipelined s=0 cache 1M");
    let mut losses = Vec::new();
    let mut counted = Vec::new();
    for run in [sync, cached] {
        let held_out = numbers_after(run, "held-out");
        let (loss, constant) = (held_out[1], held_out[4]);
        assert!(loss < constant, "{run}");
        losses.push(loss);
        // Workers: pulled (training, evaluations), pushed; PS tables: sent, applied;
        // answered unchanged: workers, PS tables.
        let c = numbers_after(run, "rows counted");
        assert_eq!((c[0], c[3], c[6]), (c[4], c[5], c[7]), "{run}");
        counted.push(c);
    }
    // Training rows pulled over the wire, and rows answered unchanged: the same as the
    // synchronous run's, and none.
    assert_eq!(counted[1][1], counted[0][1], "{out}");
    assert_eq!((counted[0][6], counted[1][6]), (0.0, 0.0), "{out}");
    // Figures of the comparison: synchronous, cached, ratio.
    let served = numbers_after(comparison, "served by the row cache");
    assert_eq!((served[0], served[1]), (0.0, 0.0), "{comparison}");
    let per_step = numbers_after(comparison, "rows/step answered unchanged");
    assert_eq!((per_step[0], per_step[1]), (0.0, 0.0), "{comparison}");
    let difference = (losses[1] - losses[0]).abs() / losses[0];
    assert!(difference <= PIPELINED_LOSS_TOLERANCE, "{out}");
}
