//! The cluster spec: its jobs and tasks, from host lists or `TF_CONFIG`, joined with an
//! endpoint map into a [`Cluster`].

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;

use super::json::{self, JsonError, Node, Value};

use super::endpoint_map::{AddrError, EndpointMap, HostPort};
use crate::config::{Role, MAX_JOB_LEN};

/// Environment variable holding the JSON cluster spec (TensorFlow's name).
pub const ENV_TF_CONFIG: &str = "TF_CONFIG";
/// Most tasks in one job (a bound on what a spec may ask to allocate).
pub const MAX_TASKS_PER_JOB: usize = 1 << 20;

// ---------------------------------------------------------------------------------------
// Task ids.

/// A task: its job name and its index in the job. Displays as `job:index`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId {
    /// The job name (`ps`, `worker`, `chief`, ...).
    pub job: String,
    /// The index within the job.
    pub index: u32,
}

impl TaskId {
    /// A task id.
    pub fn new(job: &str, index: u32) -> TaskId {
        TaskId {
            job: job.to_owned(),
            index,
        }
    }

    /// Which configuration variables the task reads ([`Role::of_job`]).
    pub fn role(&self) -> Role {
        Role::of_job(&self.job)
    }

    /// Parses `job:index` or TensorFlow's device form `/job:ps/task:0` (a `replica:0`
    /// part is allowed and ignored).
    pub fn parse(text: &str) -> Result<TaskId, ClusterError> {
        let bad = || ClusterError::BadTaskId {
            text: text.to_owned(),
        };
        let (job, index) = if let Some(rest) = text.strip_prefix("/job:") {
            let (job, rest) = rest.split_once('/').ok_or_else(bad)?;
            let rest = match rest.strip_prefix("replica:") {
                Some(r) => r.split_once('/').ok_or_else(bad)?.1,
                None => rest,
            };
            (job, rest.strip_prefix("task:").ok_or_else(bad)?)
        } else {
            text.rsplit_once(':').ok_or_else(bad)?
        };
        check_job_name(job)?;
        let index = parse_index(index).ok_or_else(bad)?;
        Ok(TaskId::new(job, index))
    }
}

impl FromStr for TaskId {
    type Err = ClusterError;

    fn from_str(s: &str) -> Result<TaskId, ClusterError> {
        TaskId::parse(s)
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.job, self.index)
    }
}

/// A decimal `u32` without sign or leading zeros (other than `0` itself).
fn parse_index(text: &str) -> Option<u32> {
    if text.is_empty()
        || !text.bytes().all(|b| b.is_ascii_digit())
        || (text.len() > 1 && text.starts_with('0'))
    {
        return None;
    }
    text.parse().ok()
}

/// The job name rule of [`Config::job`](crate::Config::job): 1 to 64 of `A-Z a-z 0-9 _ -`.
fn check_job_name(job: &str) -> Result<(), ClusterError> {
    let ok = !job.is_empty()
        && job.len() <= MAX_JOB_LEN
        && job
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ClusterError::BadJobName {
            job: job.to_owned(),
        })
    }
}

// ---------------------------------------------------------------------------------------
// The spec.

/// Jobs and the control addresses of their tasks, by job name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterSpec {
    jobs: BTreeMap<String, Vec<HostPort>>,
}

impl ClusterSpec {
    /// An empty spec.
    pub fn new() -> ClusterSpec {
        ClusterSpec::default()
    }

    /// Adds a job from a comma list of `host:port` (the form of `--ps_hosts`), task 0
    /// first. White space around the items is ignored. Every bad item is reported.
    pub fn add_job(&mut self, job: &str, hosts: &str) -> Result<(), Vec<ClusterError>> {
        let items: Vec<&str> = hosts.split(',').map(|s| s.trim()).collect();
        self.add_job_items(job, items.iter().map(|s| Some(*s)))
    }

    /// Adds a job from `JOB=HOST:PORT,...`.
    pub fn add_job_spec(&mut self, spec: &str) -> Result<(), Vec<ClusterError>> {
        match spec.split_once('=') {
            Some((job, hosts)) => self.add_job(job.trim(), hosts),
            None => Err(vec![ClusterError::BadJobSpec {
                text: spec.to_owned(),
            }]),
        }
    }

    /// Adds a job from items that are addresses (`Some`) or not strings at all (`None`,
    /// from JSON).
    fn add_job_items<'a>(
        &mut self,
        job: &str,
        items: impl ExactSizeIterator<Item = Option<&'a str>>,
    ) -> Result<(), Vec<ClusterError>> {
        let mut errors = Vec::new();
        if let Err(e) = check_job_name(job) {
            errors.push(e);
        }
        if self.jobs.contains_key(job) {
            errors.push(ClusterError::DuplicateJob {
                job: job.to_owned(),
            });
        }
        if items.len() > MAX_TASKS_PER_JOB {
            errors.push(ClusterError::TooManyTasks {
                job: job.to_owned(),
                tasks: items.len(),
            });
            return Err(errors);
        }
        let mut addrs = Vec::with_capacity(items.len());
        for (i, item) in items.enumerate() {
            let task = TaskId::new(job, i as u32);
            match item.map(HostPort::parse) {
                Some(Ok(a)) => addrs.push(a),
                Some(Err(error)) => errors.push(ClusterError::BadAddress {
                    task,
                    text: item.unwrap_or_default().to_owned(),
                    error,
                }),
                None => errors.push(ClusterError::NotAString { task }),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        self.jobs.insert(job.to_owned(), addrs);
        Ok(())
    }

    /// The job names, sorted.
    pub fn jobs(&self) -> impl Iterator<Item = &str> {
        self.jobs.keys().map(|s| s.as_str())
    }

    /// The tasks of a job, task 0 first.
    pub fn job(&self, job: &str) -> Option<&[HostPort]> {
        self.jobs.get(job).map(|v| v.as_slice())
    }

    /// Every task and its control address, by job name then index.
    pub fn tasks(&self) -> impl Iterator<Item = (TaskId, &HostPort)> {
        self.jobs.iter().flat_map(|(job, addrs)| {
            addrs
                .iter()
                .enumerate()
                .map(move |(i, a)| (TaskId::new(job, i as u32), a))
        })
    }

    /// The control address of a task.
    pub fn control_addr(&self, task: &TaskId) -> Option<&HostPort> {
        self.jobs.get(&task.job)?.get(task.index as usize)
    }

    /// Whether the spec has a task.
    pub fn contains(&self, task: &TaskId) -> bool {
        self.control_addr(task).is_some()
    }

    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.jobs.values().map(Vec::len).sum()
    }

    /// Whether there are no tasks.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks that no two tasks share a control address.
    pub fn check(&self) -> Result<(), Vec<ClusterError>> {
        let mut seen: HashMap<&HostPort, TaskId> = HashMap::new();
        let mut errors = Vec::new();
        for (task, addr) in self.tasks() {
            if let Some(first) = seen.get(addr) {
                errors.push(ClusterError::SharedControl {
                    task,
                    other: first.clone(),
                    addr: addr.clone(),
                });
            } else {
                seen.insert(addr, task);
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

// ---------------------------------------------------------------------------------------
// TF_CONFIG.

/// The parts of `TF_CONFIG` starwire uses: the cluster, and which task this is.
/// Other members (`environment`, `rpc_layer`, ...) are ignored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TfConfig {
    /// `cluster`: job name to a list of `host:port`.
    pub cluster: ClusterSpec,
    /// `task`: `type` and `index` (0 when absent, as TensorFlow has it); `None` when
    /// `TF_CONFIG` has no `task`.
    pub task: Option<TaskId>,
}

impl TfConfig {
    /// Parses the JSON text. The first problem of the JSON syntax is an error; after that,
    /// every problem of the content is reported.
    pub fn parse(text: &str) -> Result<TfConfig, ClusterError> {
        TfConfig::parse_all(text).map_err(|mut e| e.swap_remove(0))
    }

    /// [`parse`](TfConfig::parse), returning every problem of the content (never an empty
    /// list).
    pub fn parse_all(text: &str) -> Result<TfConfig, Vec<ClusterError>> {
        let root = json::parse(text).map_err(|e| vec![ClusterError::Json(e)])?;
        let Value::Object(members) = root.value else {
            return Err(vec![shape("the top level", "an object", &root)]);
        };
        let mut errors = Vec::new();
        let mut tf = TfConfig::default();
        match members.iter().find(|(k, _)| k == "cluster") {
            None => errors.push(ClusterError::Shape {
                path: "the top level".into(),
                expected: "a \"cluster\" member",
                at: root.at,
            }),
            Some((_, node)) => match &node.value {
                Value::Object(jobs) => {
                    for (job, list) in jobs {
                        let Value::Array(items) = &list.value else {
                            errors.push(shape(
                                &format!("cluster.{job}"),
                                "an array of \"host:port\" strings",
                                list,
                            ));
                            continue;
                        };
                        let items = items.iter().map(|n| match &n.value {
                            Value::String(s) => Some(s.as_str()),
                            _ => None,
                        });
                        if let Err(e) = tf.cluster.add_job_items(job, items) {
                            errors.extend(e);
                        }
                    }
                }
                _ => errors.push(shape("cluster", "an object", node)),
            },
        }
        if let Some((_, node)) = members.iter().find(|(k, _)| k == "task") {
            match task_of(node) {
                Ok(task) => tf.task = Some(task),
                Err(e) => errors.push(e),
            }
        }
        if let Some(task) = &tf.task {
            if errors.is_empty() && !tf.cluster.contains(task) {
                errors.push(ClusterError::TaskNotInCluster { task: task.clone() });
            }
        }
        if let Err(e) = tf.cluster.check() {
            errors.extend(e);
        }
        if errors.is_empty() {
            Ok(tf)
        } else {
            Err(errors)
        }
    }

    /// Reads [`ENV_TF_CONFIG`]: `Ok(None)` when it is unset or empty.
    pub fn from_env() -> Result<Option<TfConfig>, Vec<ClusterError>> {
        match std::env::var_os(ENV_TF_CONFIG) {
            None => Ok(None),
            Some(v) if v.is_empty() => Ok(None),
            Some(v) => match v.to_str() {
                Some(text) => TfConfig::parse_all(text).map(Some),
                None => Err(vec![ClusterError::NotUtf8]),
            },
        }
    }
}

fn shape(path: &str, expected: &'static str, node: &Node) -> ClusterError {
    ClusterError::Shape {
        path: format!("{path} is {}", node.value.kind()),
        expected,
        at: node.at,
    }
}

fn task_of(node: &Node) -> Result<TaskId, ClusterError> {
    let Value::Object(members) = &node.value else {
        return Err(shape("task", "an object", node));
    };
    let get = |name: &str| members.iter().find(|(k, _)| k == name).map(|(_, n)| n);
    let job = match get("type") {
        Some(Node {
            value: Value::String(s),
            ..
        }) => s.as_str(),
        Some(n) => return Err(shape("task.type", "a job name string", n)),
        None => {
            return Err(ClusterError::Shape {
                path: "task".into(),
                expected: "a \"type\" member",
                at: node.at,
            })
        }
    };
    check_job_name(job)?;
    // TensorFlow reads `int(task["index"])`: a number or a string of digits.
    let index = match get("index") {
        None => Some(0),
        Some(Node {
            value: Value::Number(s) | Value::String(s),
            ..
        }) => parse_index(s),
        Some(_) => None,
    };
    match index {
        Some(index) => Ok(TaskId::new(job, index)),
        None => Err(ClusterError::Shape {
            path: "task.index".into(),
            expected: "a whole number from 0 to 4294967295",
            at: get("index").map_or(node.at, |n| n.at),
        }),
    }
}

// ---------------------------------------------------------------------------------------
// The resolved cluster.

/// A task with both its addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    /// Job and index.
    pub id: TaskId,
    /// Its address in the cluster spec.
    pub control: HostPort,
    /// Where its starwire listens, from the endpoint map.
    pub data: HostPort,
}

/// A cluster spec joined with an endpoint map: every task's data address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cluster {
    tasks: Vec<Task>,
}

impl Cluster {
    /// Joins `spec` with `map`. Every task without an entry, and every control address
    /// two tasks share, is reported.
    pub fn resolve(spec: &ClusterSpec, map: &EndpointMap) -> Result<Cluster, Vec<ClusterError>> {
        let mut errors = spec.check().err().unwrap_or_default();
        let mut tasks = Vec::with_capacity(spec.len());
        for (id, control) in spec.tasks() {
            match map.data_addr(control) {
                Some(data) => tasks.push(Task {
                    id,
                    control: control.clone(),
                    data: data.clone(),
                }),
                None => errors.push(ClusterError::MissingEntry {
                    task: id,
                    control: control.clone(),
                    map: map.source().to_owned(),
                }),
            }
        }
        if errors.is_empty() {
            Ok(Cluster { tasks })
        } else {
            Err(errors)
        }
    }

    /// Every task, by job name then index.
    pub fn tasks(&self) -> &[Task] {
        &self.tasks
    }

    /// A task.
    pub fn task(&self, id: &TaskId) -> Option<&Task> {
        self.tasks.iter().find(|t| t.id == *id)
    }

    /// The task whose data address this is.
    pub fn task_at(&self, data: &HostPort) -> Option<&Task> {
        self.tasks.iter().find(|t| t.data == *data)
    }
}

// ---------------------------------------------------------------------------------------
// Errors.

/// Something wrong with a cluster spec, `TF_CONFIG`, or their join with an endpoint map.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClusterError {
    /// `TF_CONFIG` is not JSON.
    Json(JsonError),
    /// `TF_CONFIG` is not valid UTF-8.
    NotUtf8,
    /// A JSON value of the wrong kind, or a missing member.
    Shape {
        /// Where, and what was found.
        path: String,
        /// What was expected.
        expected: &'static str,
        /// Byte offset in the JSON text.
        at: usize,
    },
    /// A job name that is empty, too long, or has characters other than `A-Z a-z 0-9 _ -`.
    BadJobName {
        /// The name.
        job: String,
    },
    /// Not `JOB=HOST:PORT,...`.
    BadJobSpec {
        /// As written.
        text: String,
    },
    /// Not `job:index`.
    BadTaskId {
        /// As written.
        text: String,
    },
    /// A job given twice.
    DuplicateJob {
        /// The job.
        job: String,
    },
    /// More than [`MAX_TASKS_PER_JOB`] tasks.
    TooManyTasks {
        /// The job.
        job: String,
        /// How many.
        tasks: usize,
    },
    /// A malformed address.
    BadAddress {
        /// The task it belongs to.
        task: TaskId,
        /// As written.
        text: String,
        /// What is wrong.
        error: AddrError,
    },
    /// A task's entry in a JSON list is not a string.
    NotAString {
        /// The task.
        task: TaskId,
    },
    /// Two tasks with one control address.
    SharedControl {
        /// The later task.
        task: TaskId,
        /// The earlier one.
        other: TaskId,
        /// The address.
        addr: HostPort,
    },
    /// The task named in `task` is not in `cluster`.
    TaskNotInCluster {
        /// The task.
        task: TaskId,
    },
    /// A task with no entry in the endpoint map.
    MissingEntry {
        /// The task.
        task: TaskId,
        /// Its control address.
        control: HostPort,
        /// The map's source.
        map: String,
    },
}

impl fmt::Display for ClusterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterError::Json(e) => write!(f, "{e}"),
            ClusterError::NotUtf8 => write!(f, "{ENV_TF_CONFIG} is not valid UTF-8"),
            ClusterError::Shape { path, expected, at } => {
                write!(f, "at byte {at}: {path}; expected {expected}")
            }
            ClusterError::BadJobName { job } => write!(
                f,
                "job name {job:?}: expected 1 to {MAX_JOB_LEN} characters from A-Z a-z 0-9 _ -"
            ),
            ClusterError::BadJobSpec { text } => {
                write!(f, "{text:?}: expected JOB=HOST:PORT[,HOST:PORT...]")
            }
            ClusterError::BadTaskId { text } => {
                write!(f, "{text:?}: expected JOB:INDEX, as in ps:0")
            }
            ClusterError::DuplicateJob { job } => write!(f, "job {job:?} is given twice"),
            ClusterError::TooManyTasks { job, tasks } => write!(
                f,
                "job {job:?} has {tasks} tasks; at most {MAX_TASKS_PER_JOB} are allowed"
            ),
            ClusterError::BadAddress { task, text, error } => {
                write!(f, "{task}: address {text:?}: {error}")
            }
            ClusterError::NotAString { task } => {
                write!(f, "{task}: expected a \"host:port\" string")
            }
            ClusterError::SharedControl { task, other, addr } => {
                write!(f, "{task}: address {addr} is also the address of {other}")
            }
            ClusterError::TaskNotInCluster { task } => {
                write!(f, "task {task} is not in the cluster")
            }
            ClusterError::MissingEntry { task, control, map } => {
                write!(f, "{task} ({control}) has no entry in {map}")
            }
        }
    }
}

impl std::error::Error for ClusterError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp(s: &str) -> HostPort {
        HostPort::parse(s).unwrap()
    }

    fn tf_errors(text: &str) -> Vec<String> {
        TfConfig::parse_all(text)
            .unwrap_err()
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    #[test]
    fn task_ids() {
        assert_eq!(TaskId::parse("ps:0").unwrap(), TaskId::new("ps", 0));
        assert_eq!(
            TaskId::parse("worker:12").unwrap(),
            TaskId::new("worker", 12)
        );
        assert_eq!(
            TaskId::parse("/job:ps/task:3").unwrap(),
            TaskId::new("ps", 3)
        );
        assert_eq!(
            TaskId::parse("/job:worker/replica:0/task:1").unwrap(),
            TaskId::new("worker", 1)
        );
        for bad in [
            "ps",
            "ps:",
            ":0",
            "ps:-1",
            "ps:01",
            "ps:x",
            "p s:0",
            "/job:ps",
            "/job:ps/0",
        ] {
            assert!(
                matches!(
                    TaskId::parse(bad),
                    Err(ClusterError::BadTaskId { .. } | ClusterError::BadJobName { .. })
                ),
                "{bad}"
            );
        }
        assert_eq!(TaskId::new("chief", 0).role(), Role::Worker);
        assert_eq!(TaskId::new("ps", 0).role(), Role::Ps);
    }

    #[test]
    fn comma_lists() {
        let mut spec = ClusterSpec::new();
        spec.add_job("ps", "10.0.0.1:2222, 10.0.0.2:2222").unwrap();
        spec.add_job_spec("worker=w0:2222,w1:2222,w2:2222").unwrap();
        assert_eq!(spec.len(), 5);
        assert_eq!(spec.jobs().collect::<Vec<_>>(), ["ps", "worker"]);
        assert_eq!(
            spec.control_addr(&TaskId::new("ps", 1)),
            Some(&hp("10.0.0.2:2222"))
        );
        assert_eq!(spec.control_addr(&TaskId::new("ps", 2)), None);
        let e = spec.add_job("ps", "a:1").unwrap_err();
        assert_eq!(e[0].to_string(), "job \"ps\" is given twice");
        let e = spec.add_job("chief", "a:1,,b:0").unwrap_err();
        let text: Vec<_> = e.iter().map(|e| e.to_string()).collect();
        assert_eq!(
            text,
            [
                "chief:1: address \"\": empty; expected host:port",
                "chief:2: address \"b:0\": port 0 is not allowed"
            ]
        );
        assert!(spec.add_job_spec("evaluator").is_err());
        assert!(spec.add_job("bad job", "a:1").is_err());
        let mut spec = ClusterSpec::new();
        spec.add_job("ps", "a:1").unwrap();
        spec.add_job("worker", "b:1,a:1").unwrap();
        let e = spec.check().unwrap_err();
        assert_eq!(
            e[0].to_string(),
            "worker:1: address a:1 is also the address of ps:0"
        );
    }

    const KUBEFLOW: &str = r#"{
        "cluster": {
            "chief": ["trainer-chief-0.ns.svc:2222"],
            "ps": ["trainer-ps-0.ns.svc:2222", "trainer-ps-1.ns.svc:2222"],
            "worker": ["trainer-worker-0.ns.svc:2222"]
        },
        "task": {"type": "ps", "index": 1},
        "environment": "cloud"
    }"#;

    #[test]
    fn tf_config_of_an_operator() {
        let tf = TfConfig::parse(KUBEFLOW).unwrap();
        assert_eq!(tf.task, Some(TaskId::new("ps", 1)));
        assert_eq!(
            tf.cluster.jobs().collect::<Vec<_>>(),
            ["chief", "ps", "worker"]
        );
        assert_eq!(tf.cluster.len(), 4);
        assert_eq!(
            tf.cluster.control_addr(&TaskId::new("ps", 1)),
            Some(&hp("trainer-ps-1.ns.svc:2222"))
        );
        // The index may be a string, or absent (0).
        let tf = TfConfig::parse(
            r#"{"cluster":{"worker":["a:1","b:1"]},"task":{"type":"worker","index":"1"}}"#,
        )
        .unwrap();
        assert_eq!(tf.task, Some(TaskId::new("worker", 1)));
        let tf =
            TfConfig::parse(r#"{"cluster":{"worker":["a:1"]},"task":{"type":"worker"}}"#).unwrap();
        assert_eq!(tf.task, Some(TaskId::new("worker", 0)));
        let tf = TfConfig::parse(r#"{"cluster":{"worker":["a:1"]}}"#).unwrap();
        assert_eq!(tf.task, None);
        // Escapes in strings.
        let tf = TfConfig::parse(r#"{"cluster":{"w\u006frker":["\u0061:1"]}}"#).unwrap();
        assert_eq!(tf.cluster.job("worker"), Some(&[hp("a:1")][..]));
    }

    #[test]
    fn tf_config_errors() {
        assert_eq!(
            tf_errors(r#"{"cluster": {"ps": ["a:1"],}}"#),
            ["invalid JSON at byte 27: expected a member name in double quotes, found '}'"]
        );
        assert_eq!(
            tf_errors("[]"),
            ["at byte 0: the top level is an array; expected an object"]
        );
        assert_eq!(
            tf_errors(r#"{"task": {"type": "ps"}}"#),
            ["at byte 0: the top level; expected a \"cluster\" member"]
        );
        assert_eq!(
            tf_errors(r#"{"cluster": {"ps": "a:1", "worker": ["b:0", 7, "c:1"]}}"#),
            [
                "at byte 19: cluster.ps is a string; expected an array of \"host:port\" strings",
                "worker:0: address \"b:0\": port 0 is not allowed",
                "worker:1: expected a \"host:port\" string",
            ]
        );
        assert_eq!(
            tf_errors(r#"{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 1}}"#),
            ["task ps:1 is not in the cluster"]
        );
        assert_eq!(
            tf_errors(r#"{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": -1}}"#),
            ["at byte 61: task.index; expected a whole number from 0 to 4294967295"]
        );
        assert_eq!(
            tf_errors(r#"{"cluster": {"ps": ["a:1"]}, "task": {"index": 0}}"#),
            ["at byte 37: task; expected a \"type\" member"]
        );
        assert_eq!(
            tf_errors(r#"{"cluster": {"ps": ["a:1"], "worker": ["a:1"]}}"#),
            ["worker:0: address a:1 is also the address of ps:0"]
        );
        assert_eq!(
            tf_errors(r#"{"cluster": {"p s": ["a:1"]}}"#),
            ["job name \"p s\": expected 1 to 64 characters from A-Z a-z 0-9 _ -"]
        );
    }

    #[test]
    fn resolve_through_the_endpoint_map() {
        let tf = TfConfig::parse(KUBEFLOW).unwrap();
        let map = EndpointMap::parse(
            "/job/.endpoint_map",
            b"trainer-chief-0.ns.svc:2222=trainer-chief-0.ns.svc:5555\n\
              trainer-ps-0.ns.svc:2222=trainer-ps-0.ns.svc:5555\n\
              trainer-ps-1.ns.svc:2222=trainer-ps-1.ns.svc:5555\n",
        )
        .unwrap();
        let e = Cluster::resolve(&tf.cluster, &map).unwrap_err();
        assert_eq!(
            e.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            ["worker:0 (trainer-worker-0.ns.svc:2222) has no entry in /job/.endpoint_map"]
        );
        let mut text = map.to_string();
        text.push_str("trainer-worker-0.ns.svc:2222=trainer-worker-0.ns.svc:5555\n");
        let map = EndpointMap::parse("m", text.as_bytes()).unwrap();
        let cluster = Cluster::resolve(&tf.cluster, &map).unwrap();
        assert_eq!(cluster.tasks().len(), 4);
        let ps1 = cluster.task(&TaskId::new("ps", 1)).unwrap();
        assert_eq!(ps1.data, hp("trainer-ps-1.ns.svc:5555"));
        assert_eq!(
            cluster
                .task_at(&hp("trainer-worker-0.ns.svc:5555"))
                .unwrap()
                .id,
            TaskId::new("worker", 0)
        );
    }
}
