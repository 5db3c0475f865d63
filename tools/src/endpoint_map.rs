//! `commctl endpoint-map`: an `.endpoint_map` for a cluster spec (usually `TF_CONFIG`), each
//! task's data address being its control address with the port a rule gives.
//!
//! The spec is read by the library ([`crate::target::spec`]: `TfConfig`, `ClusterSpec`), and
//! the map written is checked by the library's own reader ([`EndpointMap::parse`] and
//! [`Cluster::resolve`]) before it is written, so that what is written is a map every task
//! reads the same way.

use std::io::Write;
use std::path::{Path, PathBuf};

use starwire::cluster::endpoint_map::{EndpointMap, HostPort, ProblemKind, FILE_NAME};
use starwire::cluster::{Cluster, TaskId};

use crate::cli::EndpointMapArgs;
use crate::exit::{self, Failure};
use crate::target;

/// One task's entry.
struct Row {
    task: TaskId,
    control: HostPort,
    data: HostPort,
}

/// Runs `commctl endpoint-map`.
pub fn run(args: &EndpointMapArgs) -> Result<i32, Failure> {
    let opts = args.cluster_opts();
    let Some(spec) = target::spec(&opts, false)? else {
        return Err(Failure::usage(
            "no cluster spec: give --tf-config (read $TF_CONFIG), or --cluster, --ps-hosts \
             and --worker-hosts",
        ));
    };
    let rule = args.port_rule;

    let mut problems = Vec::new();
    let mut rows = Vec::with_capacity(spec.spec.len());
    for (task, control) in spec.spec.tasks() {
        // A rule never gives port 0, so `new` accepts every port it gives.
        let data = rule
            .data_port(control.port())
            .and_then(|p| HostPort::new(control.host().clone(), p).ok());
        match data {
            Some(data) => rows.push(Row {
                task,
                control: control.clone(),
                data,
            }),
            None => problems.push(format!(
                "{task} ({control}): the data port would be past 65535 ({rule})"
            )),
        }
    }
    if !problems.is_empty() {
        return Ok(report(problems));
    }

    let header = [
        format!(
            "# written by commctl endpoint-map from the {} ({rule})",
            if spec.source == starwire::cluster::ENV_TF_CONFIG {
                spec.source
            } else {
                "cluster spec of the command line"
            }
        ),
        "# control address (cluster spec) = data address (starwire)".to_owned(),
    ];
    let mut text = String::new();
    for line in &header {
        text.push_str(line);
        text.push('\n');
    }
    for r in &rows {
        text.push_str(&format!("{}={}   # {}\n", r.control, r.data, r.task));
    }

    // The library's reader checks what the rule made; a problem is told of the task on
    // its line.
    let task_on = |line: usize| line.checked_sub(header.len() + 1).and_then(|i| rows.get(i));
    let map = match EndpointMap::parse(FILE_NAME, text.as_bytes()) {
        Ok(map) => map,
        Err(found) => {
            for p in found {
                problems.push(match p.line.and_then(task_on) {
                    Some(row) => describe(row, &p.kind, &|line| {
                        task_on(line).map(|r| r.task.to_string())
                    }),
                    None => p.to_string(),
                });
            }
            return Ok(report(problems));
        }
    };
    if let Err(errors) = Cluster::resolve(&spec.spec, &map) {
        return Ok(report(errors.iter().map(|e| e.to_string()).collect()));
    }

    match &args.output {
        None => {
            let mut out = crate::out::stdout();
            out.write_all(text.as_bytes())
                .and_then(|()| out.flush())
                .map_err(|e| Failure::usage(format!("writing the map: {e}")))?;
        }
        Some(path) => {
            let path = if path.is_dir() {
                path.join(FILE_NAME)
            } else {
                path.clone()
            };
            write_replacing(&path, text.as_bytes())
                .map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
            let mut jobs: Vec<String> = Vec::new();
            for job in spec.spec.jobs() {
                let n = spec.spec.job(job).map_or(0, <[HostPort]>::len);
                jobs.push(format!("{job} {n}"));
            }
            crate::out::outln!(
                "{}: {} entr{} ({}), {rule}",
                path.display(),
                rows.len(),
                if rows.len() == 1 { "y" } else { "ies" },
                jobs.join(", ")
            );
        }
    }
    Ok(exit::OK)
}

/// A problem of the map the rule made, said of the task whose entry has it.
fn describe(row: &Row, kind: &ProblemKind, task_on: &dyn Fn(usize) -> Option<String>) -> String {
    let who = |line: usize| task_on(line).unwrap_or_else(|| format!("line {line}"));
    let what = match kind {
        ProblemKind::SharedData { other_line, .. } => format!(
            "data address {} is also the data address of {}; the rule must give tasks on \
             one host different ports (use +OFFSET)",
            row.data,
            who(*other_line)
        ),
        ProblemKind::DataIsControl { control_line, .. } => format!(
            "data address {} is the control address of {}; the rule must give another port",
            row.data,
            who(*control_line)
        ),
        other => other.to_string(),
    };
    format!("{} ({}): {what}", row.task, row.control)
}

/// Prints the problems on stderr; nothing is written. Returns the exit code.
fn report(problems: Vec<String>) -> i32 {
    for p in &problems {
        crate::out::errln!("commctl: {p}");
    }
    let n = problems.len();
    crate::out::errln!(
        "commctl: {n} problem{} found; no map written",
        if n == 1 { "" } else { "s" }
    );
    exit::FAILED
}

/// Writes `bytes` to a file beside `path` and renames it over `path`, so that a task reading
/// the map never sees half of it.
fn write_replacing(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("not a file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp.{}", std::process::id()));
    let tmp: PathBuf = path.with_file_name(tmp_name);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
