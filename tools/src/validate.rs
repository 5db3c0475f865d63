//! `commctl validate`: every problem of an endpoint map and a cluster spec, at once.

use std::io::Write;

use starwire::cluster::endpoint_map::EndpointMap;
use starwire::cluster::{Cluster, ClusterError};

use serde::Serialize;

use crate::cli::ValidateArgs;
use crate::exit::{self, Failure};
use crate::target::{self, SpecError};

/// One problem, wherever it is; in the JSON report, `{"source", "line", "message"}` with
/// `line` `null` when the problem is not on a line.
#[derive(Serialize)]
struct Finding {
    source: String,
    line: Option<usize>,
    message: String,
}

impl Finding {
    fn text(&self) -> String {
        match self.line {
            Some(l) => format!("{}:{l}: {}", self.source, self.message),
            None => format!("{}: {}", self.source, self.message),
        }
    }
}

/// The JSON report.
#[derive(Serialize)]
struct Report<'a> {
    valid: bool,
    endpoint_map: MapReport<'a>,
    /// `null` without a cluster spec.
    cluster: Option<ClusterReport<'a>>,
    problems: &'a [Finding],
}

#[derive(Serialize)]
struct MapReport<'a> {
    path: &'a str,
    entries: usize,
}

#[derive(Serialize)]
struct ClusterReport<'a> {
    source: &'a str,
    /// The task `TF_CONFIG` names, `null` without one.
    task: Option<String>,
    /// Every task with both addresses; empty when the spec does not resolve.
    tasks: Vec<TaskReport>,
}

#[derive(Serialize)]
struct TaskReport {
    task: String,
    control: String,
    data: String,
}

fn cluster_findings(source: &str, errors: Vec<ClusterError>) -> impl Iterator<Item = Finding> {
    let source = source.to_owned();
    errors.into_iter().map(move |e| Finding {
        source: source.clone(),
        line: None,
        message: e.to_string(),
    })
}

/// Runs `commctl validate`.
pub fn run(args: &ValidateArgs) -> Result<i32, Failure> {
    let opts = args.cluster_opts();
    let path = target::map_path(&opts);
    let shown = path.display().to_string();
    let (map, problems) = match EndpointMap::load_lenient(&path) {
        Ok(r) => r,
        Err(e) => {
            return Err(Failure::usage(format!("{e}{}", target::map_hint(&opts))));
        }
    };
    let mut findings: Vec<Finding> = problems
        .into_iter()
        .map(|p| Finding {
            source: p.source,
            line: p.line,
            message: p.kind.to_string(),
        })
        .collect();
    let spec = match target::spec(&opts, false) {
        Ok(s) => s,
        Err(SpecError::Usage(m)) => return Err(Failure::usage(m)),
        Err(SpecError::Invalid { source, errors }) => {
            findings.extend(cluster_findings(source, errors));
            None
        }
    };
    let mut cluster = None;
    if let Some(s) = &spec {
        match Cluster::resolve(&s.spec, &map) {
            Ok(c) => cluster = Some(c),
            Err(mut errors) => {
                // A task whose line was left out for a problem of its own: that line's
                // problem is reported already, once.
                errors.retain(|e| {
                    !matches!(e, ClusterError::MissingEntry { control, .. }
                        if map.rejected_line(control).is_some())
                });
                findings.extend(cluster_findings(s.source, errors));
            }
        }
    }
    let valid = findings.is_empty();
    let mut out = crate::out::stdout();
    let r = if args.json {
        let report = Report {
            valid,
            endpoint_map: MapReport {
                path: &shown,
                entries: map.len(),
            },
            cluster: spec.as_ref().map(|s| ClusterReport {
                source: s.source,
                task: s.task.as_ref().map(|t| t.to_string()),
                tasks: cluster.as_ref().map_or_else(Vec::new, |c| {
                    c.tasks()
                        .iter()
                        .map(|t| TaskReport {
                            task: t.id.to_string(),
                            control: t.control.to_string(),
                            data: t.data.to_string(),
                        })
                        .collect()
                }),
            }),
            problems: &findings,
        };
        let text = serde_json::to_string(&report).expect("the report serializes");
        writeln!(out, "{text}")
    } else {
        write_text(
            &mut out,
            &shown,
            &map,
            spec.as_ref(),
            cluster.as_ref(),
            &findings,
        )
    };
    if let Err(e) = r {
        return Err(Failure::usage(format!("writing the report: {e}")));
    }
    Ok(if valid { exit::OK } else { exit::FAILED })
}

fn write_text(
    out: &mut impl Write,
    shown: &str,
    map: &EndpointMap,
    spec: Option<&target::Spec>,
    cluster: Option<&Cluster>,
    findings: &[Finding],
) -> std::io::Result<()> {
    if !findings.is_empty() {
        for f in findings {
            writeln!(out, "{}", f.text())?;
        }
        let n = findings.len();
        writeln!(out, "{n} problem{} found", if n == 1 { "" } else { "s" })?;
        return Ok(());
    }
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    writeln!(
        out,
        "{shown}: OK, {} entr{}",
        map.len(),
        if map.len() == 1 { "y" } else { "ies" }
    )?;
    if let (Some(s), Some(c)) = (spec, cluster) {
        let n = c.tasks().len();
        writeln!(
            out,
            "cluster from {}: OK, {n} task{}, every one mapped",
            s.source,
            plural(n)
        )?;
        let w_task = c
            .tasks()
            .iter()
            .map(|t| t.id.to_string().len())
            .max()
            .unwrap_or(0);
        let w_ctl = c
            .tasks()
            .iter()
            .map(|t| t.control.to_string().len())
            .max()
            .unwrap_or(0);
        let w_task = w_task.max(4);
        let w_ctl = w_ctl.max(7);
        writeln!(out, "  {:w_task$}  {:w_ctl$}  data", "task", "control")?;
        for t in c.tasks() {
            let me = if s.task.as_ref() == Some(&t.id) {
                "  (this task)"
            } else {
                ""
            };
            writeln!(
                out,
                "  {:w_task$}  {:w_ctl$}  {}{me}",
                t.id.to_string(),
                t.control.to_string(),
                t.data
            )?;
        }
    }
    Ok(())
}
