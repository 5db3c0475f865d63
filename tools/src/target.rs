//! From command-line options to addresses: the cluster spec, the endpoint map, and a
//! TARGET that is `host:port` or `job:index`.

use std::net::SocketAddr;
use std::path::PathBuf;

use starwire::cluster::endpoint_map::{EndpointMap, HostPort, LoadError, ENV_PATH};
use starwire::cluster::{ClusterError, ClusterSpec, TaskId, TfConfig, ENV_TF_CONFIG};
use starwire::cluster::{ResolveError, Resolver};

use crate::cli::ClusterOpts;
use crate::exit::Failure;

/// A cluster spec and where it came from.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The spec.
    pub spec: ClusterSpec,
    /// `cluster spec` (from the options) or `TF_CONFIG`, for messages.
    pub source: &'static str,
    /// The task `TF_CONFIG` names, if any.
    pub task: Option<TaskId>,
}

/// The spec from the options, with every problem found. `implicit_tf_config`: read
/// `TF_CONFIG` when set, also without `--tf-config`, if no list is given.
pub fn spec(opts: &ClusterOpts, implicit_tf_config: bool) -> Result<Option<Spec>, SpecError> {
    if opts.has_lists() {
        if opts.tf_config {
            return Err(SpecError::Usage(
                "give either --tf-config or --cluster/--ps-hosts/--worker-hosts, not both".into(),
            ));
        }
        let mut spec = ClusterSpec::new();
        let mut errors = Vec::new();
        for job in &opts.cluster {
            if let Err(e) = spec.add_job_spec(job) {
                errors.extend(e);
            }
        }
        if let Some(h) = &opts.ps_hosts {
            if let Err(e) = spec.add_job("ps", h) {
                errors.extend(e);
            }
        }
        if let Some(h) = &opts.worker_hosts {
            if let Err(e) = spec.add_job("worker", h) {
                errors.extend(e);
            }
        }
        if let Err(e) = spec.check() {
            errors.extend(e);
        }
        if !errors.is_empty() {
            return Err(SpecError::Invalid {
                source: "cluster spec",
                errors,
            });
        }
        return Ok(Some(Spec {
            spec,
            source: "cluster spec",
            task: None,
        }));
    }
    if !opts.tf_config && !implicit_tf_config {
        return Ok(None);
    }
    match TfConfig::from_env() {
        Ok(Some(tf)) => Ok(Some(Spec {
            spec: tf.cluster,
            source: ENV_TF_CONFIG,
            task: tf.task,
        })),
        Ok(None) if opts.tf_config => Err(SpecError::Usage(format!(
            "--tf-config: {ENV_TF_CONFIG} is not set"
        ))),
        Ok(None) => Ok(None),
        Err(errors) => Err(SpecError::Invalid {
            source: ENV_TF_CONFIG,
            errors,
        }),
    }
}

/// Why there is no spec.
#[derive(Debug)]
pub enum SpecError {
    /// Contradicting options, or a missing variable.
    Usage(String),
    /// The spec has problems.
    Invalid {
        /// `cluster spec` or `TF_CONFIG`.
        source: &'static str,
        /// Every one.
        errors: Vec<ClusterError>,
    },
}

impl From<SpecError> for Failure {
    fn from(e: SpecError) -> Failure {
        match e {
            SpecError::Usage(m) => Failure::usage(m),
            SpecError::Invalid { source, errors } => {
                let lines: Vec<String> = errors.iter().map(|e| format!("{source}: {e}")).collect();
                Failure::usage(lines.join("\ncommctl: "))
            }
        }
    }
}

/// Where the endpoint map is: the option, else the environment, else the current folder.
pub fn map_path(opts: &ClusterOpts) -> PathBuf {
    EndpointMap::locate(opts.endpoint_map.as_deref())
}

/// Loads the endpoint map, or fails with its problems.
pub fn load_map(opts: &ClusterOpts) -> Result<EndpointMap, Failure> {
    let path = map_path(opts);
    EndpointMap::load(&path).map_err(|e| match e {
        LoadError::Io { .. } => Failure::usage(format!("{e}{}", map_hint(opts))),
        LoadError::Invalid(problems) => {
            let mut m = format!(
                "{} has {} problem{} (commctl validate lists them):",
                path.display(),
                problems.len(),
                if problems.len() == 1 { "" } else { "s" }
            );
            for p in problems.iter().take(5) {
                m.push_str(&format!("\n  {p}"));
            }
            Failure::usage(m)
        }
    })
}

/// A hint for a map that cannot be read from where it was looked for by default.
pub fn map_hint(opts: &ClusterOpts) -> String {
    if opts.endpoint_map.is_some() {
        String::new()
    } else if std::env::var_os(ENV_PATH).is_some_and(|v| !v.is_empty()) {
        format!(" (found through {ENV_PATH})")
    } else {
        format!(" (give its path, or set {ENV_PATH} to its folder)")
    }
}

/// A resolved TARGET.
#[derive(Debug, Clone)]
pub struct Target {
    /// How to call it in output: `127.0.0.1:5555`, or `ps:0 (10.0.0.1:5555)`.
    pub label: String,
    /// Where to connect.
    pub addr: SocketAddr,
    /// The task, when given as `job:index`.
    pub task: Option<TaskId>,
}

/// The library's resolver over `spec`, with the endpoint map loaded only when `needs_map`
/// (a task the spec has): a `host:port` target resolves without a map on disk.
fn resolver(
    spec: Option<&Spec>,
    opts: &ClusterOpts,
    needs_map: impl FnOnce(&Resolver) -> bool,
) -> Result<Resolver, Failure> {
    let Some(spec) = spec else {
        return Ok(Resolver::addresses_only());
    };
    // "cluster spec from cluster spec" would say nothing.
    let source = if spec.source == ENV_TF_CONFIG {
        ENV_TF_CONFIG
    } else {
        "the command line"
    };
    let r = Resolver::for_spec(&spec.spec).with_source(source);
    if needs_map(&r) {
        Ok(r.with_map(&load_map(opts)?))
    } else {
        Ok(r)
    }
}

/// How a failed resolution ends commctl: a name that does not resolve is "unreachable",
/// everything else a usage error.
fn failure(e: ResolveError) -> Failure {
    match e {
        ResolveError::Unresolvable { .. } => Failure {
            code: crate::exit::UNREACHABLE,
            message: e.to_string(),
        },
        ResolveError::NoClusterSpec { .. } => Failure::usage(format!(
            "{e} (give --cluster, --ps-hosts or --worker-hosts, or set {ENV_TF_CONFIG})"
        )),
        _ => Failure::usage(e.to_string()),
    }
}

/// Resolves `text`: `job:index` (or `/job:x/task:n`) through the cluster spec and the
/// endpoint map when a spec names that job, else `host:port`.
pub fn resolve(text: &str, opts: &ClusterOpts) -> Result<Target, Failure> {
    // The options' spec is read only for a text that may be a task name, so that a
    // broken TF_CONFIG does not stop `commctl ping 10.0.0.1:5555`.
    let spec = if TaskId::parse(text).is_ok() {
        spec(opts, true)?
    } else {
        None
    };
    let resolver = resolver(spec.as_ref(), opts, |r| r.task(text).is_some())?;
    let addr = resolver.resolve(text).map_err(failure)?.addr();
    let task = resolver.task(text);
    let label = match (&task, HostPort::parse(text)) {
        (Some(t), _) => format!("{t} ({addr})"),
        (None, Ok(hp)) if hp.host().ip().is_none() => format!("{hp} ({addr})"),
        (None, Ok(hp)) => hp.to_string(),
        (None, Err(_)) => addr.to_string(),
    };
    Ok(Target { label, addr, task })
}

/// The data address of `task`.
pub fn resolve_task(
    task: &TaskId,
    spec: Option<&Spec>,
    opts: &ClusterOpts,
) -> Result<Target, Failure> {
    let resolver = resolver(spec, opts, |r| r.task(&task.to_string()).is_some())?;
    let addr = resolver.resolve_task(task).map_err(failure)?.addr();
    Ok(Target {
        label: format!("{task} ({addr})"),
        addr,
        task: Some(task.clone()),
    })
}
