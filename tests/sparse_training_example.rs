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
