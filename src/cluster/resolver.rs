//! Turning a target text (a task name or an address) into a [`Peer`]; see the `cluster`
//! module's documentation.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::str::FromStr;

use super::endpoint_map::{AddrError, EndpointMap, HostPort, LoadError};
use super::peer::Peer;
use super::spec::{Cluster, ClusterError, ClusterSpec, TaskId, TfConfig, ENV_TF_CONFIG};

impl Peer {
    /// The peer at a `host:port` text (`10.0.0.1:5555`, `[::1]:5555`, `ps-0.svc:5555`),
    /// a host name looked up through the system resolver. Task names need a cluster: see
    /// [`Resolver`].
    pub fn parse(text: &str) -> Result<Peer, ResolveError> {
        Resolver::addresses_only().resolve(text)
    }
}

impl FromStr for Peer {
    type Err = ResolveError;

    fn from_str(s: &str) -> Result<Peer, ResolveError> {
        Peer::parse(s)
    }
}

// ---------------------------------------------------------------------------------------
// The resolver.

/// A task of the spec: its control address, and its data address once a map gave one.
#[derive(Clone, Debug)]
struct Slot {
    control: HostPort,
    data: Option<HostPort>,
}

/// The cluster side of a resolver.
#[derive(Clone, Debug)]
struct Known {
    /// Tasks by job, task 0 first.
    jobs: BTreeMap<String, Vec<Slot>>,
    /// Where the spec came from (`TF_CONFIG`, an option), for messages.
    source: Option<String>,
    /// The endpoint map's source; `None` until a map is given.
    map: Option<String>,
}

/// Turns target texts into [`Peer`]s: task names through a cluster spec and an endpoint
/// map, `host:port` texts through the system resolver. Built once, used for every target;
/// see the [module documentation](crate::cluster).
#[derive(Clone, Debug, Default)]
pub struct Resolver {
    cluster: Option<Known>,
}

impl Resolver {
    /// A resolver without a cluster: it resolves `host:port` texts only, and reports a
    /// task name as [`ResolveError::NoClusterSpec`].
    pub fn addresses_only() -> Resolver {
        Resolver::default()
    }

    /// A resolver for a cluster already joined with its endpoint map.
    pub fn new(cluster: Cluster) -> Resolver {
        let mut jobs: BTreeMap<String, Vec<Slot>> = BTreeMap::new();
        // `Cluster::tasks` is sorted by job then index, with no gaps.
        for t in cluster.tasks() {
            jobs.entry(t.id.job.clone()).or_default().push(Slot {
                control: t.control.clone(),
                data: Some(t.data.clone()),
            });
        }
        Resolver {
            cluster: Some(Known {
                jobs,
                source: None,
                map: Some("the endpoint map".to_owned()),
            }),
        }
    }

    /// A resolver for `spec` joined with `map`. A task without an entry in the map is
    /// reported when it is resolved, not here, so that a map listing only the tasks one
    /// talks to is enough.
    pub fn from_spec(spec: &ClusterSpec, map: &EndpointMap) -> Resolver {
        Resolver::for_spec(spec).with_map(map)
    }

    /// A resolver for `spec` still without its endpoint map: give one with
    /// [`with_map`](Resolver::with_map) or [`load_map`](Resolver::load_map) before
    /// resolving task names. [`task`](Resolver::task) says whether a target needs it.
    pub fn for_spec(spec: &ClusterSpec) -> Resolver {
        let mut jobs: BTreeMap<String, Vec<Slot>> = BTreeMap::new();
        for job in spec.jobs() {
            let slots = spec
                .job(job)
                .unwrap_or_default()
                .iter()
                .map(|control| Slot {
                    control: control.clone(),
                    data: None,
                })
                .collect();
            jobs.insert(job.to_owned(), slots);
        }
        Resolver {
            cluster: Some(Known {
                jobs,
                source: None,
                map: None,
            }),
        }
    }

    /// The resolver of a task in a job that sets `TF_CONFIG`: its cluster spec, joined
    /// with the endpoint map found as [`EndpointMap::locate`] finds it without an explicit
    /// path. Without `TF_CONFIG` (unset or empty), a resolver for addresses only.
    pub fn from_env() -> Result<Resolver, ResolveError> {
        Resolver::from_lookup(|name| std::env::var_os(name))
    }

    /// [`from_env`](Resolver::from_env) reading the environment through `lookup`.
    fn from_lookup(lookup: impl Fn(&str) -> Option<OsString>) -> Result<Resolver, ResolveError> {
        let spec_error = |errors| ResolveError::Spec {
            spec_source: ENV_TF_CONFIG.to_owned(),
            errors,
        };
        let text = match lookup(ENV_TF_CONFIG) {
            None => return Ok(Resolver::addresses_only()),
            Some(v) if v.is_empty() => return Ok(Resolver::addresses_only()),
            Some(v) => v
                .into_string()
                .map_err(|_| spec_error(vec![ClusterError::NotUtf8]))?,
        };
        let tf = TfConfig::parse_all(&text).map_err(spec_error)?;
        let map = EndpointMap::locate_and_load(None, lookup).map_err(ResolveError::Map)?;
        Ok(Resolver::for_spec(&tf.cluster)
            .with_source(ENV_TF_CONFIG)
            .with_map(&map))
    }

    /// Names where the cluster spec came from (`TF_CONFIG`, `--ps_hosts`), for messages:
    /// "ps:3 is not in the cluster spec from TF_CONFIG".
    pub fn with_source(mut self, source: impl Into<String>) -> Resolver {
        if let Some(known) = &mut self.cluster {
            known.source = Some(source.into());
        }
        self
    }

    /// Takes the data addresses of the spec's tasks from `map` (replacing those of an
    /// earlier map). Without a cluster spec this changes nothing.
    pub fn with_map(mut self, map: &EndpointMap) -> Resolver {
        if let Some(known) = &mut self.cluster {
            for slot in known.jobs.values_mut().flatten() {
                slot.data = map.data_addr(&slot.control).cloned();
            }
            known.map = Some(map.source().to_owned());
        }
        self
    }

    /// Loads the endpoint map from where [`EndpointMap::locate`] finds it (`explicit`,
    /// else the folder in `TF_SEASTAR_ENDPOINT_MAP_PATH`, else the current folder) and
    /// takes the data addresses from it. Without a cluster spec nothing is read.
    pub fn load_map(self, explicit: Option<&Path>) -> Result<Resolver, ResolveError> {
        if self.cluster.is_none() {
            return Ok(self);
        }
        let map = EndpointMap::locate_and_load(explicit, |name| std::env::var_os(name))
            .map_err(ResolveError::Map)?;
        Ok(self.with_map(&map))
    }

    /// Whether a cluster spec was given.
    pub fn has_cluster(&self) -> bool {
        self.cluster.is_some()
    }

    /// The task `target` names, when it is a task name and the cluster spec has that
    /// task; `None` for an address, and for a task name that [`resolve`](Resolver::resolve)
    /// would reject without reading the endpoint map.
    pub fn task(&self, target: &str) -> Option<TaskId> {
        let known = self.cluster.as_ref()?;
        let task = TaskId::parse(target).ok()?;
        known.slot(&task).map(|_| task)
    }

    /// The peer a target names: a task name (`ps:0`, `/job:ps/task:0`,
    /// `/job:ps/replica:0/task:0`) or a `host:port`. A host name is looked up each call:
    /// resolve once and keep the [`Peer`].
    pub fn resolve(&self, target: &str) -> Result<Peer, ResolveError> {
        let task = TaskId::parse(target);
        let explicit = target.starts_with("/job:");
        match (&task, &self.cluster) {
            (Ok(task), Some(known)) if explicit || known.jobs.contains_key(&task.job) => {
                return self.task_peer(target, task)
            }
            (Err(error), _) if explicit => {
                return Err(ResolveError::BadTaskName {
                    target: target.to_owned(),
                    error: error.clone(),
                })
            }
            (Ok(task), None) if explicit => {
                return Err(ResolveError::NoClusterSpec {
                    target: target.to_owned(),
                    task: task.clone(),
                })
            }
            _ => {}
        }
        let task = task.ok();
        let hp = match (HostPort::parse(target), &task) {
            (Ok(hp), _) => hp,
            // Not an address, but a task name the cluster does not have (`ps:0`).
            (Err(_), Some(task)) => {
                return Err(match &self.cluster {
                    None => ResolveError::NoClusterSpec {
                        target: target.to_owned(),
                        task: task.clone(),
                    },
                    Some(known) => known.unknown_job(target, &task.job),
                })
            }
            (Err(error), None) => {
                return Err(ResolveError::Malformed {
                    target: target.to_owned(),
                    error,
                })
            }
        };
        let named = |addr: SocketAddr| {
            let peer = Peer::new(addr);
            match self.cluster.as_ref().and_then(|k| k.task_at(&hp, addr)) {
                Some(task) => peer.with_task(&task),
                None => peer,
            }
        };
        hp.resolve()
            .map(named)
            .map_err(|error| ResolveError::Unresolvable {
                target: target.to_owned(),
                host: hp,
                // Also a task name (`ps:1`): say why it was not taken as one.
                not_a_task: task.map(|t| match &self.cluster {
                    None => "no cluster spec is given".to_owned(),
                    Some(known) => format!(
                        "the cluster spec{} has no job {:?}",
                        FromSource(&known.source),
                        t.job
                    ),
                }),
                error,
            })
    }

    /// The peer of a task.
    pub fn resolve_task(&self, task: &TaskId) -> Result<Peer, ResolveError> {
        self.task_peer(&task.to_string(), task)
    }

    /// The peers of every task of `job`, task 0 first (every PS: `peers("ps")`).
    pub fn peers(&self, job: &str) -> Result<Vec<Peer>, ResolveError> {
        let Some(known) = &self.cluster else {
            return Err(ResolveError::NoClusterSpec {
                target: job.to_owned(),
                task: TaskId::new(job, 0),
            });
        };
        let Some(slots) = known.jobs.get(job) else {
            return Err(known.unknown_job(job, job));
        };
        (0..slots.len())
            .map(|i| self.resolve_task(&TaskId::new(job, i as u32)))
            .collect()
    }

    /// Every task of the cluster that has a data address, with its peer, job by job (jobs
    /// in name order, task 0 first); empty without a cluster spec. Tasks the endpoint map
    /// does not list (or all, without a map) are left out, as a map may list only the tasks
    /// one talks to; any other failure to resolve one is an error.
    pub fn tasks(&self) -> Result<Vec<(TaskId, Peer)>, ResolveError> {
        let Some(known) = &self.cluster else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for (job, slots) in &known.jobs {
            for i in 0..slots.len() {
                let task = TaskId::new(job, i as u32);
                match self.resolve_task(&task) {
                    Ok(peer) => out.push((task, peer)),
                    Err(ResolveError::NoEndpointMap { .. } | ResolveError::NoEntry { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(out)
    }

    fn task_peer(&self, target: &str, task: &TaskId) -> Result<Peer, ResolveError> {
        let Some(known) = &self.cluster else {
            return Err(ResolveError::NoClusterSpec {
                target: target.to_owned(),
                task: task.clone(),
            });
        };
        let Some(slots) = known.jobs.get(&task.job) else {
            return Err(known.unknown_job(target, &task.job));
        };
        let Some(slot) = slots.get(task.index as usize) else {
            return Err(ResolveError::NoSuchTask {
                target: target.to_owned(),
                task: task.clone(),
                tasks: slots.len(),
                spec_source: known.source.clone(),
            });
        };
        let Some(map) = &known.map else {
            return Err(ResolveError::NoEndpointMap {
                target: target.to_owned(),
                task: task.clone(),
            });
        };
        let Some(data) = &slot.data else {
            return Err(ResolveError::NoEntry {
                target: target.to_owned(),
                task: task.clone(),
                control: slot.control.clone(),
                map: map.clone(),
            });
        };
        data.resolve()
            .map(|addr| Peer::new(addr).with_task(task))
            .map_err(|error| ResolveError::Unresolvable {
                target: target.to_owned(),
                host: data.clone(),
                not_a_task: None,
                error,
            })
    }
}

impl Known {
    fn slot(&self, task: &TaskId) -> Option<&Slot> {
        self.jobs.get(&task.job)?.get(task.index as usize)
    }

    /// The task whose data address is `hp` (as written, or the same IP address and port
    /// as `addr`, what `hp` resolved to). No name is looked up.
    fn task_at(&self, hp: &HostPort, addr: SocketAddr) -> Option<TaskId> {
        self.jobs.iter().find_map(|(job, slots)| {
            slots.iter().enumerate().find_map(|(index, slot)| {
                let data = slot.data.as_ref()?;
                let same = data == hp
                    || (data.host().ip() == Some(addr.ip()) && data.port() == addr.port());
                same.then(|| TaskId::new(job, index as u32))
            })
        })
    }

    fn unknown_job(&self, target: &str, job: &str) -> ResolveError {
        ResolveError::UnknownJob {
            target: target.to_owned(),
            job: job.to_owned(),
            jobs: self.jobs.keys().cloned().collect(),
            spec_source: self.source.clone(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Errors.

/// Why a target has no peer. Each names the target as written.
///
/// `Debug` is the message (`Display`), so that `?` in `main` says what failed and, for an
/// endpoint map that cannot be read, its path and `TF_SEASTAR_ENDPOINT_MAP_PATH`; match
/// on the variants for the parts.
#[non_exhaustive]
pub enum ResolveError {
    /// Neither a `host:port` nor a task name.
    Malformed {
        /// As written.
        target: String,
        /// Why it is not a `host:port`.
        error: AddrError,
    },
    /// A `/job:` text that is not a task name.
    BadTaskName {
        /// As written.
        target: String,
        /// What is wrong.
        error: ClusterError,
    },
    /// A task name, but the resolver has no cluster spec.
    NoClusterSpec {
        /// As written (a job name, for [`Resolver::peers`]).
        target: String,
        /// The task.
        task: TaskId,
    },
    /// A task of a job the cluster spec does not have.
    UnknownJob {
        /// As written.
        target: String,
        /// The job.
        job: String,
        /// The jobs the spec has.
        jobs: Vec<String>,
        /// Where the spec came from, when the resolver was told
        /// ([`Resolver::with_source`]).
        spec_source: Option<String>,
    },
    /// A task index past the last task of its job.
    NoSuchTask {
        /// As written.
        target: String,
        /// The task.
        task: TaskId,
        /// How many tasks the job has.
        tasks: usize,
        /// Where the spec came from, when the resolver was told
        /// ([`Resolver::with_source`]).
        spec_source: Option<String>,
    },
    /// A task name resolved before an endpoint map was given
    /// ([`Resolver::for_spec`] without [`Resolver::with_map`]).
    NoEndpointMap {
        /// As written.
        target: String,
        /// The task.
        task: TaskId,
    },
    /// The task's control address has no line in the endpoint map.
    NoEntry {
        /// As written.
        target: String,
        /// The task.
        task: TaskId,
        /// Its control address.
        control: HostPort,
        /// Where the map came from.
        map: String,
    },
    /// The host name has no address.
    Unresolvable {
        /// As written.
        target: String,
        /// The address looked up (the task's data address, for a task).
        host: HostPort,
        /// For a text that is also a task name: why it was not resolved as one.
        not_a_task: Option<String>,
        /// What the system resolver said.
        error: io::Error,
    },
    /// The cluster spec ([`Resolver::from_env`]: `TF_CONFIG`) has problems.
    Spec {
        /// Where the spec came from.
        spec_source: String,
        /// Every problem (never empty).
        errors: Vec<ClusterError>,
    },
    /// The endpoint map could not be read, or has problems.
    Map(LoadError),
}

impl ResolveError {
    /// The target as written; `None` for a problem of the spec or the map themselves.
    pub fn target(&self) -> Option<&str> {
        match self {
            ResolveError::Malformed { target, .. }
            | ResolveError::BadTaskName { target, .. }
            | ResolveError::NoClusterSpec { target, .. }
            | ResolveError::UnknownJob { target, .. }
            | ResolveError::NoSuchTask { target, .. }
            | ResolveError::NoEndpointMap { target, .. }
            | ResolveError::NoEntry { target, .. }
            | ResolveError::Unresolvable { target, .. } => Some(target),
            ResolveError::Spec { .. } | ResolveError::Map(_) => None,
        }
    }
}

impl fmt::Display for ResolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResolveError::Malformed { target, error } => write!(
                f,
                "{target}: {error} (expected HOST:PORT, JOB:INDEX or /job:JOB/task:INDEX)"
            ),
            ResolveError::BadTaskName { target, error } => match error {
                ClusterError::BadTaskId { .. } => {
                    write!(f, "{target}: expected /job:JOB/task:INDEX")
                }
                e => write!(f, "{target}: {e}"),
            },
            ResolveError::NoClusterSpec { target, .. } => {
                write!(f, "{target}: a task name, but no cluster spec is given")
            }
            ResolveError::UnknownJob {
                target,
                job,
                jobs,
                spec_source,
            } => write!(
                f,
                "{target}: the cluster spec{} has no job {job:?} (it has {})",
                FromSource(spec_source),
                if jobs.is_empty() {
                    "none".to_owned()
                } else {
                    jobs.join(", ")
                }
            ),
            ResolveError::NoSuchTask {
                target,
                task,
                tasks,
                spec_source,
            } => write!(
                f,
                "{target} is not in the cluster spec{} (job {} has {tasks} task{})",
                FromSource(spec_source),
                task.job,
                if *tasks == 1 { "" } else { "s" }
            ),
            ResolveError::NoEndpointMap { target, .. } => {
                write!(f, "{target}: no endpoint map is given for its data address")
            }
            ResolveError::NoEntry {
                target,
                control,
                map,
                ..
            } => write!(f, "{target} ({control}) has no entry in {map}"),
            ResolveError::Unresolvable {
                target,
                host,
                not_a_task,
                error,
            } => {
                if target == &host.to_string() {
                    write!(f, "{target}: cannot resolve the host name: {error}")?;
                } else {
                    write!(f, "{target}: cannot resolve {host}: {error}")?;
                }
                match not_a_task {
                    Some(why) => write!(f, "; as a task name: {why}"),
                    None => Ok(()),
                }
            }
            ResolveError::Spec {
                spec_source,
                errors,
            } => {
                write!(f, "{spec_source}: ")?;
                for (i, e) in errors.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{e}")?;
                }
                Ok(())
            }
            ResolveError::Map(e) => write!(f, "{e}"),
        }
    }
}

impl fmt::Debug for ResolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// ` from SOURCE` when the source is known, else nothing.
struct FromSource<'a>(&'a Option<String>);

impl fmt::Display for FromSource<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(source) => write!(f, " from {source}"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for ResolveError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ResolveError::Malformed { error, .. } => Some(error),
            ResolveError::BadTaskName { error, .. } => Some(error),
            ResolveError::Unresolvable { error, .. } => Some(error),
            ResolveError::Map(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    const MAP: &[u8] = b"10.0.0.1:2222=10.0.0.1:5555\n\
        10.0.0.2:2222=[fd00::2]:5555\n\
        10.0.0.3:2222=localhost:6666\n\
        10.0.0.4:2222=no-such-host.invalid:7777\n";

    /// ps:0, ps:1, worker:0, worker:1 (no map entry), chief:0 (unresolvable data host).
    fn spec() -> ClusterSpec {
        let mut spec = ClusterSpec::new();
        spec.add_job("ps", "10.0.0.1:2222,10.0.0.2:2222").unwrap();
        spec.add_job("worker", "10.0.0.3:2222,10.0.0.9:2222")
            .unwrap();
        spec.add_job("chief", "10.0.0.4:2222").unwrap();
        spec
    }

    fn resolver() -> Resolver {
        Resolver::from_spec(
            &spec(),
            &EndpointMap::parse("/job/.endpoint_map", MAP).unwrap(),
        )
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn err(r: &Resolver, target: &str) -> ResolveError {
        match r.resolve(target) {
            Ok(p) => panic!("{target} resolved to {p}"),
            Err(e) => {
                assert_eq!(e.target(), Some(target));
                e
            }
        }
    }

    #[test]
    fn task_names_in_every_form() {
        let r = resolver();
        for t in ["ps:0", "/job:ps/task:0", "/job:ps/replica:0/task:0"] {
            assert_eq!(r.resolve(t).unwrap().addr(), addr("10.0.0.1:5555"), "{t}");
            assert_eq!(r.task(t), Some(TaskId::new("ps", 0)), "{t}");
        }
        assert_eq!(r.resolve("ps:1").unwrap().addr(), addr("[fd00::2]:5555"));
        // A data address that is a host name is looked up.
        assert_eq!(
            r.resolve("/job:worker/task:0").unwrap().addr(),
            addr("127.0.0.1:6666")
        );
        assert_eq!(
            r.resolve_task(&TaskId::new("ps", 1)).unwrap(),
            r.resolve("ps:1").unwrap()
        );
        assert!(r.has_cluster());
        // `task` names only tasks the spec has, whether or not the map has them.
        assert_eq!(r.task("worker:1"), Some(TaskId::new("worker", 1)));
        assert_eq!(r.task("ps:2"), None);
        assert_eq!(r.task("/job:evaluator/task:0"), None);
        assert_eq!(Resolver::addresses_only().task("ps:0"), None);
    }

    #[test]
    fn a_peer_knows_the_task_it_was_resolved_from() {
        let r = resolver();
        for t in ["ps:0", "/job:ps/task:0", "/job:ps/replica:0/task:0"] {
            assert_eq!(r.resolve(t).unwrap().task(), Some("ps:0"), "{t}");
        }
        assert_eq!(
            r.resolve_task(&TaskId::new("ps", 1)).unwrap().task(),
            Some("ps:1")
        );
        let all: Vec<_> = r.peers("ps").unwrap().iter().map(|p| p.task()).collect();
        assert_eq!(all, [Some("ps:0"), Some("ps:1")]);
        // An address the cluster has a task at is that task, written as an IP address or
        // as the map writes it (a host name, not looked up to compare).
        assert_eq!(r.resolve("10.0.0.1:5555").unwrap().task(), Some("ps:0"));
        assert_eq!(r.resolve("[fd00::2]:5555").unwrap().task(), Some("ps:1"));
        assert_eq!(
            r.resolve("localhost:6666").unwrap().task(),
            Some("worker:0")
        );
        // Any other address has no name; nor has any address without a cluster.
        assert_eq!(r.resolve("10.0.0.1:5556").unwrap().task(), None);
        let plain = Resolver::addresses_only().resolve("10.0.0.1:5555").unwrap();
        assert_eq!(plain.task(), None);
        // A name is a label: the peer is its address.
        let named = r.resolve("ps:0").unwrap();
        assert_eq!(named, plain);
        assert_eq!(named.to_string(), "10.0.0.1:5555");
        assert_eq!(format!("{named:?}"), "Peer(ps:0 at 10.0.0.1:5555)");
        let labelled = Peer::new(addr("127.0.0.1:9")).with_task(&TaskId::new("ps", 4));
        assert_eq!(labelled.task(), Some("ps:4"));
    }

    #[test]
    fn addresses_with_and_without_a_cluster() {
        for r in [resolver(), Resolver::addresses_only()] {
            assert_eq!(
                r.resolve("10.1.2.3:80").unwrap().addr(),
                addr("10.1.2.3:80")
            );
            assert_eq!(r.resolve("[::1]:5555").unwrap().addr(), addr("[::1]:5555"));
            // A job:index form whose job the spec lacks is an address.
            assert_eq!(
                r.resolve("localhost:5555").unwrap().addr(),
                addr("127.0.0.1:5555")
            );
            assert_eq!(r.task("localhost:5555"), None);
            assert_eq!(r.task("10.1.2.3:80"), None);
        }
        assert_eq!(
            Peer::parse("[fd00::1]:1").unwrap().addr(),
            addr("[fd00::1]:1")
        );
        let p: Peer = "127.0.0.1:9".parse().unwrap();
        assert_eq!(p, Peer::from(addr("127.0.0.1:9")));
        assert_eq!(p.to_string(), "127.0.0.1:9");
        assert_eq!(format!("{p:?}"), "Peer(127.0.0.1:9)");
        assert!(!Resolver::addresses_only().has_cluster());
    }

    #[test]
    fn every_task_of_a_job_in_order() {
        let r = resolver();
        assert_eq!(
            r.peers("ps").unwrap(),
            [
                Peer::new(addr("10.0.0.1:5555")),
                Peer::new(addr("[fd00::2]:5555"))
            ]
        );
        // worker:1 has no map entry: the first failing task is the error.
        let e = r.peers("worker").unwrap_err();
        assert!(
            matches!(&e, ResolveError::NoEntry { task, .. } if *task == TaskId::new("worker", 1))
        );
        let e = r.peers("evaluator").unwrap_err();
        assert_eq!(
            e.to_string(),
            "evaluator: the cluster spec has no job \"evaluator\" \
             (it has chief, ps, worker)"
        );
        let e = Resolver::addresses_only().peers("ps").unwrap_err();
        assert!(matches!(e, ResolveError::NoClusterSpec { .. }), "{e:?}");
    }

    #[test]
    fn a_joined_cluster() {
        let mut spec = ClusterSpec::new();
        spec.add_job("ps", "10.0.0.1:2222,10.0.0.2:2222").unwrap();
        let map = EndpointMap::parse("m", MAP).unwrap();
        let r = Resolver::new(Cluster::resolve(&spec, &map).unwrap()).with_source("TF_CONFIG");
        assert_eq!(
            r.resolve("ps:0").unwrap(),
            resolver().resolve("ps:0").unwrap()
        );
        assert_eq!(r.peers("ps").unwrap(), resolver().peers("ps").unwrap());
        assert_eq!(
            err(&r, "ps:2").to_string(),
            "ps:2 is not in the cluster spec from TF_CONFIG (job ps has 2 tasks)"
        );
    }

    #[test]
    fn errors_name_the_target_and_what_failed() {
        let r = resolver();
        let cases: [(&Resolver, &str, &str); 12] = [
            (&r, "", ": empty; expected host:port (expected HOST:PORT, JOB:INDEX or /job:JOB/task:INDEX)"),
            (&r, "10.0.0.1", "10.0.0.1: no port; expected host:port (expected HOST:PORT, JOB:INDEX or /job:JOB/task:INDEX)"),
            (&r, "::1:5555", "::1:5555: an IPv6 address must be in brackets, as in [::1]:5555 (expected HOST:PORT, JOB:INDEX or /job:JOB/task:INDEX)"),
            (&r, "/job:ps", "/job:ps: expected /job:JOB/task:INDEX"),
            (&r, "/job:p s/task:0", "/job:p s/task:0: job name \"p s\": expected 1 to 64 characters from A-Z a-z 0-9 _ -"),
            (&r, "/job:evaluator/task:0", "/job:evaluator/task:0: the cluster spec has no job \"evaluator\" (it has chief, ps, worker)"),
            // Port 0: not an address, so a task name of an unknown job.
            (&r, "evaluator:0", "evaluator:0: the cluster spec has no job \"evaluator\" (it has chief, ps, worker)"),
            (&r, "ps:2", "ps:2 is not in the cluster spec (job ps has 2 tasks)"),
            (&r, "/job:chief/task:1", "/job:chief/task:1 is not in the cluster spec (job chief has 1 task)"),
            (&r, "worker:1", "worker:1 (10.0.0.9:2222) has no entry in /job/.endpoint_map"),
            (&Resolver::for_spec(&spec()), "ps:0", "ps:0: no endpoint map is given for its data address"),
            (&Resolver::addresses_only(), "/job:ps/task:0", "/job:ps/task:0: a task name, but no cluster spec is given"),
        ];
        for (r, target, want) in cases {
            assert_eq!(err(r, target).to_string(), want);
        }
        let e = err(&Resolver::addresses_only(), "ps:0");
        assert!(
            matches!(&e, ResolveError::NoClusterSpec { task, .. } if *task == TaskId::new("ps", 0))
        );
        let e = err(&r, "");
        let source = std::error::Error::source(&e).unwrap();
        assert_eq!(source.to_string(), AddrError::Empty.to_string());
    }

    #[test]
    fn unresolvable_hosts() {
        let r = resolver();
        let e = err(&r, "no-such-host.invalid:5555");
        assert!(
            e.to_string()
                .starts_with("no-such-host.invalid:5555: cannot resolve the host name: "),
            "{e}"
        );
        assert!(std::error::Error::source(&e).is_some());
        // A task whose data address does not resolve.
        let e = err(&r, "chief:0");
        assert!(
            e.to_string()
                .starts_with("chief:0: cannot resolve no-such-host.invalid:7777: "),
            "{e}"
        );
        // A task-like text taken as an address: the message says why.
        let e = err(&Resolver::addresses_only(), "no-such-job-7f3a:1");
        assert!(
            e.to_string()
                .ends_with("; as a task name: no cluster spec is given"),
            "{e}"
        );
        let e = err(&r, "no-such-job-7f3a:1");
        assert!(
            e.to_string().ends_with(
                "; as a task name: the cluster spec has no job \
                 \"no-such-job-7f3a\""
            ),
            "{e}"
        );
    }

    /// A fresh folder under the system's temporary one.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("starwire-peer-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn from_the_environment() {
        let dir = scratch("env");
        std::fs::write(dir.join(".endpoint_map"), MAP).unwrap();
        let path = dir.to_str().unwrap();
        let tf = r#"{"cluster": {"ps": ["10.0.0.1:2222"]}, "task": {"type": "ps"}}"#;
        let r = Resolver::from_lookup(env(&[
            ("TF_CONFIG", tf),
            ("TF_SEASTAR_ENDPOINT_MAP_PATH", path),
        ]))
        .unwrap();
        assert_eq!(
            r.resolve("/job:ps/task:0").unwrap().addr(),
            addr("10.0.0.1:5555")
        );
        assert_eq!(
            err(&r, "ps:1").to_string(),
            "ps:1 is not in the cluster spec from TF_CONFIG (job ps has 1 task)"
        );
        // No TF_CONFIG: addresses only, and no map is read.
        for vars in [&[][..], &[("TF_CONFIG", "")][..]] {
            let r = Resolver::from_lookup(env(vars)).unwrap();
            assert!(!r.has_cluster());
        }
        // A bad TF_CONFIG: every problem.
        let e = Resolver::from_lookup(env(&[(
            "TF_CONFIG",
            r#"{"cluster": {"ps": ["a:0", "b:0"]}}"#,
        )]))
        .unwrap_err();
        assert_eq!(e.target(), None);
        assert_eq!(
            e.to_string(),
            "TF_CONFIG: ps:0: address \"a:0\": port 0 is not allowed; \
             ps:1: address \"b:0\": port 0 is not allowed"
        );
        // No map where it is looked for.
        let empty = scratch("env-empty");
        let e = Resolver::from_lookup(env(&[
            ("TF_CONFIG", tf),
            ("TF_SEASTAR_ENDPOINT_MAP_PATH", empty.to_str().unwrap()),
        ]))
        .unwrap_err();
        assert!(
            matches!(e, ResolveError::Map(LoadError::Io { .. })),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .starts_with(&format!("{}: ", empty.join(".endpoint_map").display())),
            "{e}"
        );
        // What `?` in main prints: the path and the variable it was found through.
        let shown = format!("{e:?}");
        assert_eq!(shown, e.to_string());
        assert!(
            shown.contains("found through TF_SEASTAR_ENDPOINT_MAP_PATH"),
            "{shown}"
        );
        // A map with problems.
        std::fs::write(empty.join(".endpoint_map"), b"10.0.0.1:2222=10.0.0.1:0\n").unwrap();
        let e = Resolver::from_lookup(env(&[
            ("TF_CONFIG", tf),
            ("TF_SEASTAR_ENDPOINT_MAP_PATH", empty.to_str().unwrap()),
        ]))
        .unwrap_err();
        assert!(
            matches!(e, ResolveError::Map(LoadError::Invalid(ref p)) if p.len() == 1),
            "{e:?}"
        );
        // An explicit path wins over the environment.
        let r = Resolver::for_spec(&spec()).load_map(Some(&dir)).unwrap();
        assert_eq!(r.resolve("ps:0").unwrap().addr(), addr("10.0.0.1:5555"));
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&empty);
    }
}
