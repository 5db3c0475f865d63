//! From command-line options to addresses: the cluster spec, the endpoint map, and a
//! TARGET that is `host:port` or `job:index`.

use std::net::SocketAddr;
use std::path::PathBuf;

use starwire::cluster::{ClusterError, ClusterSpec, TaskId, TfConfig, ENV_TF_CONFIG};
use starwire::endpoint_map::{EndpointMap, HostPort, LoadError, ENV_PATH};

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

/// Resolves `text`: `job:index` (or `/job:x/task:n`) through the cluster spec and the
/// endpoint map when a spec names that job, else `host:port`.
pub fn resolve(text: &str, opts: &ClusterOpts) -> Result<Target, Failure> {
    let as_task = TaskId::parse(text).ok();
    let explicit_task = text.starts_with("/job:");
    let spec = if as_task.is_some() {
        spec(opts, true)?
    } else {
        None
    };
    if let Some(task) = &as_task {
        let named = spec
            .as_ref()
            .is_some_and(|s| s.spec.job(&task.job).is_some());
        if named || explicit_task {
            return resolve_task(task, spec.as_ref(), opts);
        }
    }
    let hp = match HostPort::parse(text) {
        Ok(hp) => hp,
        Err(e) if as_task.is_some() => {
            return Err(Failure::usage(format!(
                "{text}: not a host:port ({e}), and no cluster spec has a job {:?} \
                 (give --cluster, --ps-hosts or --worker-hosts, or set {ENV_TF_CONFIG})",
                as_task.map(|t| t.job).unwrap_or_default()
            )))
        }
        Err(e) => {
            return Err(Failure::usage(format!(
                "{text}: {e} (expected HOST:PORT or JOB:INDEX)"
            )))
        }
    };
    let addr = lookup(&hp)?;
    let label = if hp.host().ip().is_some() {
        hp.to_string()
    } else {
        format!("{hp} ({addr})")
    };
    Ok(Target {
        label,
        addr,
        task: None,
    })
}

fn lookup(hp: &HostPort) -> Result<SocketAddr, Failure> {
    hp.resolve().map_err(|e| Failure {
        code: crate::exit::UNREACHABLE,
        message: format!("{hp}: cannot resolve the host name: {e}"),
    })
}

/// The data address of `task`.
pub fn resolve_task(
    task: &TaskId,
    spec: Option<&Spec>,
    opts: &ClusterOpts,
) -> Result<Target, Failure> {
    let Some(spec) = spec else {
        return Err(Failure::usage(format!(
            "{task}: no cluster spec (give --cluster, --ps-hosts or --worker-hosts, or set \
             {ENV_TF_CONFIG})"
        )));
    };
    let Some(control) = spec.spec.control_addr(task) else {
        let why = match spec.spec.job(&task.job) {
            Some(tasks) => format!("job {} has {} task(s)", task.job, tasks.len()),
            None => format!("no job {:?}", task.job),
        };
        return Err(Failure::usage(format!(
            "{task} is not in the cluster spec from {} ({why})",
            spec.source
        )));
    };
    let map = load_map(opts)?;
    let Some(data) = map.data_addr(control) else {
        return Err(Failure::usage(format!(
            "{task} ({control}) has no entry in {}",
            map.source()
        )));
    };
    let addr = lookup(data)?;
    Ok(Target {
        label: format!("{task} ({addr})"),
        addr,
        task: Some(task.clone()),
    })
}
