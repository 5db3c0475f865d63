//! Where a task lives: the cluster spec (which tasks a training job has and their control
//! addresses, from host lists or `TF_CONFIG`), the [`.endpoint_map`](endpoint_map) (the data
//! address of each), the [`Resolver`] that turns a task name into a [`Peer`], and
//! [membership changes](ClusterChange) at run time.
//!
//! A spec comes from the comma lists a launcher passes (`--ps_hosts=a:2222,b:2222`
//! `--worker_hosts=...`, see [`ClusterSpec::add_job`]) or from the `TF_CONFIG` JSON that
//! Kubernetes training operators set (see [`TfConfig`]):
//!
//! ```json
//! {"cluster": {"ps": ["ps-0:2222"], "worker": ["worker-0:2222", "worker-1:2222"]},
//!  "task": {"type": "worker", "index": 1}}
//! ```
//!
//! [`Cluster::resolve`] joins a spec with an endpoint map. A task with no entry in the
//! map is an error naming its job and index; so is a control address used by two tasks.
//!
//! ```
//! use starwire::cluster::{Cluster, TfConfig, TaskId};
//! use starwire::cluster::endpoint_map::EndpointMap;
//!
//! let tf = TfConfig::parse(r#"{"cluster": {"ps": ["10.0.0.1:2222"],
//!     "worker": ["10.0.0.2:2222"]}, "task": {"type": "worker", "index": 0}}"#)?;
//! let map = EndpointMap::parse(".endpoint_map",
//!     b"10.0.0.1:2222=10.0.0.1:5555\n10.0.0.2:2222=10.0.0.2:5555\n").unwrap();
//! let cluster = Cluster::resolve(&tf.cluster, &map).unwrap();
//! let ps0 = cluster.task(&TaskId::new("ps", 0)).unwrap();
//! assert_eq!(ps0.data.to_string(), "10.0.0.1:5555");
//! assert_eq!(tf.task.unwrap().to_string(), "worker:0");
//! # Ok::<(), starwire::cluster::ClusterError>(())
//! ```
//!
//! # Resolving a target
//!
//! Where a request goes: a [`Peer`], made once from an address or a task name and reused
//! for every request at no cost.
//!
//! A [`Resolver`] turns a target text into a `Peer`:
//!
//! - a task name, `ps:0`, `/job:ps/task:0` or `/job:ps/replica:0/task:0`: its control
//!   address from the cluster spec (`TF_CONFIG`, or host lists such as `--ps_hosts`), then
//!   its data address from the [`.endpoint_map`](crate::cluster::endpoint_map), then a name lookup
//!   when that address is a host name;
//! - a `host:port`: an IPv4 address, a bracketed IPv6 address (`[::1]:5555`) or a host
//!   name, looked up through the system resolver.
//!
//! A `job:index` text is a task name when the cluster spec has that job, else an address
//! (`localhost:5555` stays an address); the `/job:` forms are always task names.
//! Everything that can fail is a [`ResolveError`] naming the target and what failed.
//!
//! ```
//! use starwire::cluster::ClusterSpec;
//! use starwire::cluster::endpoint_map::EndpointMap;
//! use starwire::cluster::{Peer, Resolver};
//!
//! // Host lists, as a launcher passes them (`--ps_hosts`, `--worker_hosts`).
//! let mut spec = ClusterSpec::new();
//! spec.add_job("ps", "10.0.0.1:2222,10.0.0.2:2222").unwrap();
//! spec.add_job("worker", "10.0.0.3:2222").unwrap();
//! // Where each task's starwire listens.
//! let map = EndpointMap::parse(
//!     ".endpoint_map",
//!     b"10.0.0.1:2222=10.0.0.1:5555\n10.0.0.2:2222=10.0.0.2:5555\n\
//!       10.0.0.3:2222=10.0.0.3:5555\n",
//! )
//! .unwrap();
//! let resolver = Resolver::from_spec(&spec, &map);
//!
//! let ps0 = resolver.resolve("ps:0")?;
//! assert_eq!(resolver.resolve("/job:ps/task:0")?, ps0);
//! assert_eq!(resolver.resolve("/job:ps/replica:0/task:0")?, ps0);
//! assert_eq!(ps0.addr(), "10.0.0.1:5555".parse().unwrap());
//! // Every PS, task 0 first.
//! let all: Vec<String> = resolver.peers("ps")?.iter().map(Peer::to_string).collect();
//! assert_eq!(all, ["10.0.0.1:5555", "10.0.0.2:5555"]);
//! // An address needs no cluster.
//! assert_eq!(Peer::parse("[::1]:5555")?.addr(), "[::1]:5555".parse().unwrap());
//!
//! let e = resolver.resolve("ps:2").unwrap_err();
//! assert_eq!(
//!     e.to_string(),
//!     "ps:2 is not in the cluster spec (job ps has 2 tasks)"
//! );
//! # Ok::<(), starwire::cluster::ResolveError>(())
//! ```
//!
//! In a job that sets `TF_CONFIG`, [`Resolver::from_env`] reads it and the endpoint map
//! (from [`TF_SEASTAR_ENDPOINT_MAP_PATH`](crate::cluster::endpoint_map::ENV_PATH), else the
//! current folder).
//!
//! # A PS on its own data address
//!
//! A task started by a training operator finds everything in its environment: its job and
//! index in `TF_CONFIG` ([`ConfigBuilder::from_tf_config`](crate::ConfigBuilder::from_tf_config)),
//! and its data address, where it listens, by resolving its own name:
//!
//! ```no_run
//! use starwire::cluster::{Resolver, TaskId};
//! use starwire::config::ConfigBuilder;
//! use starwire::rows::{Init, MemTable, Optimizer, Tables};
//! use starwire::{Options, Runtime};
//! use std::sync::Arc;
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // TF_CONFIG='{"cluster": {"ps": [...], "worker": [...]},
//!     //             "task": {"type": "ps", "index": 1}}'
//!     // TF_SEASTAR_ENDPOINT_MAP_PATH=/etc/training (its .endpoint_map)
//!     let config = ConfigBuilder::from_tf_config()?.build()?;
//!     let me = TaskId::new(config.job(), config.task_index());
//!     let listen = Resolver::from_env()?.resolve_task(&me)?.addr(); // ps:1's data address
//!     let table = MemTable::new(16, Init::Zeros, Optimizer::Sgd { lr: 0.01 });
//!     let ps = Runtime::start_with(
//!         config,
//!         Options {
//!             service: Some(Arc::new(Tables::new().with(0, Arc::new(table)))),
//!             ..Options::listen(listen)
//!         },
//!     )?;
//!     eprintln!("{me} listening on {listen}: {}", ps.report());
//!     // ... serve until told to stop; dropping `ps` stops its loops.
//!     Ok(())
//! }
//! ```
//!
//! The data address's host must be one of this machine's (in a pod, its service name
//! resolves to the pod's address); where it is not, listen on all of them with its port,
//! `SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), listen.port())`. Workers reach the PS
//! by the same name: `Resolver::from_env()?.resolve("ps:1")` or `peers("ps")`.

pub mod endpoint_map;
mod json;
mod membership;
mod peer;
mod resolver;
mod spec;
mod task_config;

pub use endpoint_map::EndpointMap;
pub use json::JsonError;
pub use membership::ClusterChange;
pub(crate) use membership::{apply, Retirements};
pub use peer::Peer;
pub use resolver::{ResolveError, Resolver};
pub use spec::{
    Cluster, ClusterError, ClusterSpec, Task, TaskId, TfConfig, ENV_TF_CONFIG, MAX_TASKS_PER_JOB,
};
