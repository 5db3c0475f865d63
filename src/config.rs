//! Configuration: a [`Config`] built with [`ConfigBuilder`], from defaults, the environment,
//! or both.
//!
//! The environment names of the originals (DeepRec GRPC++ / StarServer) are kept, so a job
//! script written for them configures starwire the same way; knobs the originals did not
//! have get a `STARWIRE_` prefix. Every value is validated, and a bad one is a
//! [`ConfigError`] that names the variable (or builder method), shows the value and says
//! what was expected. An unset variable means the default; a set but empty one is an error.
//!
//! Precedence, lowest first: the defaults (the `DEFAULT_*` constants), then the environment
//! ([`ConfigBuilder::from_env`]), then builder methods.
//!
//! # Role
//!
//! Three of the originals' variables come in two flavours, chosen by the task's job name
//! (see [`Role`]): the jobs `worker` and `chief` read `WORKER_ENABLE_POLLING`,
//! `NETWORK_WORKER_CORE_NUMBER` and `WORKER_DISABLE_PIN_CORES`; every other job (`ps`,
//! `evaluator`, ...) reads `PS_ENABLE_POLLING`, `NETWORK_PS_CORE_NUMBER` and
//! `PS_DISABLE_PIN_CORES`.
//!
//! `docs/tuning.md` explains what each setting does and how to choose it.
//!
//! ```
//! use starwire::config::{Config, ConfigBuilder};
//!
//! // Defaults, overridden by the environment, overridden by code.
//! let config = ConfigBuilder::from_env("ps", 0)?.polling(true).build()?;
//! assert!(config.polling);
//! assert_eq!(config.role_prefix(), "PS");
//!
//! // Defaults only.
//! let config = Config::builder("worker", 3).loops(2).build()?;
//! assert_eq!(config.loop_count(100, 64), 2);
//! # Ok::<(), starwire::config::ConfigError>(())
//! ```

use std::borrow::Cow;
use std::error::Error;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

pub use crate::sys::{Backend, BackendChoice};
use crate::wire::{self, Limits};

// ---------------------------------------------------------------------------------------
// Environment variable names.

/// Environment variable: the cluster id both ends of a connection must share (decimal `u64`).
pub const ENV_CLUSTER_ID: &str = "STARWIRE_CLUSTER_ID";
/// Environment variable: the spin budget before a loop parks, in microseconds.
pub const ENV_SPIN_US: &str = "STARWIRE_SPIN_US";
/// Environment variable: the I/O backend, `uring`, `epoll` or `auto`.
pub const ENV_BACKEND: &str = crate::sys::BACKEND_ENV;
/// Environment variable: [`Limits::max_frame`].
pub const ENV_MAX_FRAME: &str = "STARWIRE_MAX_FRAME";
/// Environment variable: [`Limits::max_key`].
pub const ENV_MAX_KEY: &str = "STARWIRE_MAX_KEY";
/// Environment variable: [`Limits::max_tensors`].
pub const ENV_MAX_TENSORS: &str = "STARWIRE_MAX_TENSORS";
/// Environment variable: [`Limits::max_rank`].
pub const ENV_MAX_RANK: &str = "STARWIRE_MAX_RANK";
/// Environment variable: [`Limits::max_tensor_bytes`].
pub const ENV_MAX_TENSOR_BYTES: &str = "STARWIRE_MAX_TENSOR_BYTES";
/// Environment variable: the size of one chunk of a large tensor, in bytes.
pub const ENV_CHUNK_SIZE: &str = "STARWIRE_CHUNK_SIZE";
/// Environment variable: how many bytes of small frames one write may coalesce.
pub const ENV_ACC_SIZE: &str = "STARWIRE_ACC_SIZE";
/// Environment variable: the registered buffer pool size in bytes, 0 for none.
pub const ENV_BUF_SIZE: &str = "STARWIRE_BUF_SIZE";
/// Environment variable: fuse the recv requests for one peer into one frame.
pub const ENV_TENSOR_FUSE: &str = "STARWIRE_TENSOR_FUSE";
/// Environment variable: the initial receive buffer of a connection, in bytes.
pub const ENV_RECV_BUFFER: &str = "STARWIRE_RECV_BUFFER";
/// Environment variable: request contexts per event loop.
pub const ENV_MAX_INFLIGHT: &str = "STARWIRE_MAX_INFLIGHT";
/// Environment variable: how many times a failed connect is retried.
pub const ENV_CONNECT_RETRIES: &str = "STARWIRE_CONNECT_RETRIES";
/// Environment variable: the first connect backoff, in milliseconds.
pub const ENV_CONNECT_BACKOFF_MS: &str = "STARWIRE_CONNECT_BACKOFF_MS";
/// Environment variable: TCP connections to open to each peer.
pub const ENV_CONNECTIONS_PER_PEER: &str = "STARWIRE_CONNECTIONS_PER_PEER";
/// Environment variable: the shared cluster token (raw bytes).
pub const ENV_CLUSTER_TOKEN: &str = "STARWIRE_CLUSTER_TOKEN";
/// Environment variable: how long a handshake may take, in milliseconds.
pub const ENV_HANDSHAKE_TIMEOUT_MS: &str = "STARWIRE_HANDSHAKE_TIMEOUT_MS";
/// Environment variable: how long a frame's header and meta section may take to arrive, in
/// milliseconds.
pub const ENV_FRAME_TIMEOUT_MS: &str = "STARWIRE_FRAME_TIMEOUT_MS";
/// Environment variable: the most connections a task accepts at once.
pub const ENV_MAX_CONNECTIONS: &str = "STARWIRE_MAX_CONNECTIONS";

// ---------------------------------------------------------------------------------------
// Defaults and ranges.

/// Longest job name, in bytes (the wire format's limit).
pub const MAX_JOB_LEN: usize = wire::MAX_JOB_NAME;

/// Default [`Config::cluster_id`].
pub const DEFAULT_CLUSTER_ID: u64 = 0;

/// Default [`Config::polling`]: spin, then park, rather than busy-poll forever. The originals'
/// default too; polling costs a whole CPU per loop.
pub const DEFAULT_POLLING: bool = false;

/// Default [`Config::pin`]: loops are not pinned (the originals' default: their
/// `*_DISABLE_PIN_CORES` defaults to true).
pub const DEFAULT_PIN: bool = false;

/// Default [`Config::spin`]: how long an idle loop spins before it parks.
///
/// A placeholder until it is measured (see `docs/performance-log.md`, spin budget, runs A to C).
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);
/// Longest accepted [`Config::spin`].
pub const MAX_SPIN: Duration = Duration::from_secs(10);

/// Most event loops that may be asked for explicitly (the size of a Linux CPU set).
pub const MAX_LOOPS: usize = 1024;
/// Cap of the computed loop count: `min(16, connections)`, the GRPC++ rule.
pub const DEFAULT_LOOP_CAP: usize = 16;

/// Default [`Config::chunk_size`], 4 MiB (the chunk size RDMA-TensorFlow uses too).
///
/// When `max_frame` is configured below `DEFAULT_CHUNK_SIZE + CHUNK_FRAME_OVERHEAD` and no
/// chunk size is given, the default becomes the largest multiple of 4 KiB that fits.
pub const DEFAULT_CHUNK_SIZE: u32 = 4 << 20;
/// Smallest accepted [`Config::chunk_size`], 4 KiB.
pub const MIN_CHUNK_SIZE: u32 = 4 << 10;
/// Room kept in a frame beside a chunk's bytes: the 32-byte header and the 16-byte chunk
/// body, rounded up. [`Config::chunk_size`] is at most `max_frame - CHUNK_FRAME_OVERHEAD`.
pub const CHUNK_FRAME_OVERHEAD: u32 = 64;

/// Default [`Config::acc_size`], 256 KiB.
pub const DEFAULT_ACC_SIZE: u32 = 256 << 10;
/// Smallest accepted [`Config::acc_size`], 4 KiB.
pub const MIN_ACC_SIZE: u32 = 4 << 10;
/// Largest accepted [`Config::acc_size`], 64 MiB.
pub const MAX_ACC_SIZE: u32 = 64 << 20;

/// Default [`Config::buf_size`]: 0, no pool. Registering the pool measured no faster on
/// loopback (`docs/performance-log.md`, runs R1 and R2), and it locks memory.
pub const DEFAULT_BUF_SIZE: u64 = 0;
/// Smallest nonzero [`Config::buf_size`], 4 KiB (one page); it must also hold at least one
/// receive buffer ([`Config::recv_buffer`]).
pub const MIN_BUF_SIZE: u64 = 4 << 10;
/// Largest accepted [`Config::buf_size`], 1 GiB per loop.
pub const MAX_BUF_SIZE: u64 = 1 << 30;

/// Default [`Config::tensor_fuse`]: off, as in the originals.
pub const DEFAULT_TENSOR_FUSE: bool = false;

/// Default [`Config::recv_buffer`], 64 KiB.
pub const DEFAULT_RECV_BUFFER: usize = 64 << 10;
/// Smallest accepted [`Config::recv_buffer`], 4 KiB.
pub const MIN_RECV_BUFFER: usize = 4 << 10;
/// Largest accepted [`Config::recv_buffer`], 64 MiB.
pub const MAX_RECV_BUFFER: usize = 64 << 20;

/// Default [`Config::max_inflight`].
pub const DEFAULT_MAX_INFLIGHT: usize = 65_536;
/// Largest accepted [`Config::max_inflight`], 2^22.
pub const MAX_MAX_INFLIGHT: usize = 1 << 22;

/// Default [`Config::connect_retries`].
pub const DEFAULT_CONNECT_RETRIES: u32 = 8;

/// Default [`Config::connect_backoff`], the delay before the first retry.
pub const DEFAULT_CONNECT_BACKOFF: Duration = Duration::from_millis(10);
/// Smallest accepted [`Config::connect_backoff`].
pub const MIN_CONNECT_BACKOFF: Duration = Duration::from_millis(1);
/// Largest accepted [`Config::connect_backoff`].
pub const MAX_CONNECT_BACKOFF: Duration = Duration::from_secs(60);
/// The doubling backoff stops growing here (see [`Config::connect_delay`]).
pub const CONNECT_BACKOFF_CAP: Duration = Duration::from_secs(2);

/// Default [`Config::connections_per_peer`].
pub const DEFAULT_CONNECTIONS_PER_PEER: usize = 1;
/// Largest accepted [`Config::connections_per_peer`].
pub const MAX_CONNECTIONS_PER_PEER: usize = 4096;

/// Longest [`Config::cluster_token`], in bytes (the wire format's limit).
pub const MAX_CLUSTER_TOKEN: usize = wire::MAX_TOKEN;

/// Default [`Config::handshake_timeout`].
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Smallest accepted [`Config::handshake_timeout`].
pub const MIN_HANDSHAKE_TIMEOUT: Duration = Duration::from_millis(1);
/// Largest accepted [`Config::handshake_timeout`], 10 minutes.
pub const MAX_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(600);
/// Default [`Config::frame_timeout`].
pub const DEFAULT_FRAME_TIMEOUT: Duration = Duration::from_secs(30);
/// Smallest accepted [`Config::frame_timeout`].
pub const MIN_FRAME_TIMEOUT: Duration = Duration::from_millis(1);
/// Largest accepted [`Config::frame_timeout`], 1 hour.
pub const MAX_FRAME_TIMEOUT: Duration = Duration::from_secs(3600);
/// Default [`Config::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Largest accepted [`Config::max_connections`].
pub const MAX_MAX_CONNECTIONS: usize = 1 << 20;

const _: () = assert!(wire::HEADER_LEN as u32 + 16 <= CHUNK_FRAME_OVERHEAD);

// ---------------------------------------------------------------------------------------
// Role.

/// Which of the originals' two variable families a task reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The jobs `worker` and `chief`: `WORKER_*` and `NETWORK_WORKER_*`.
    Worker,
    /// Every other job (`ps`, `evaluator`, ...): `PS_*` and `NETWORK_PS_*`.
    Ps,
}

impl Role {
    /// The role of a job name: `worker` and `chief` (exactly, case-sensitive, as in the
    /// originals) are workers, everything else reads the PS variables.
    pub fn of_job(job: &str) -> Role {
        match job {
            "worker" | "chief" => Role::Worker,
            _ => Role::Ps,
        }
    }

    /// `WORKER` or `PS`.
    pub const fn prefix(self) -> &'static str {
        match self {
            Role::Worker => "WORKER",
            Role::Ps => "PS",
        }
    }

    /// `WORKER_ENABLE_POLLING` or `PS_ENABLE_POLLING`.
    pub const fn polling_env(self) -> &'static str {
        match self {
            Role::Worker => "WORKER_ENABLE_POLLING",
            Role::Ps => "PS_ENABLE_POLLING",
        }
    }

    /// `NETWORK_WORKER_CORE_NUMBER` or `NETWORK_PS_CORE_NUMBER`.
    pub const fn loops_env(self) -> &'static str {
        match self {
            Role::Worker => "NETWORK_WORKER_CORE_NUMBER",
            Role::Ps => "NETWORK_PS_CORE_NUMBER",
        }
    }

    /// `WORKER_DISABLE_PIN_CORES` or `PS_DISABLE_PIN_CORES` (true means *not* pinned).
    pub const fn disable_pin_env(self) -> &'static str {
        match self {
            Role::Worker => "WORKER_DISABLE_PIN_CORES",
            Role::Ps => "PS_DISABLE_PIN_CORES",
        }
    }
}

// ---------------------------------------------------------------------------------------
// Config.

/// The validated configuration of one task. Build it with [`Config::builder`] or
/// [`ConfigBuilder::from_env`]; every field has passed the checks of
/// [`ConfigBuilder::build`].
///
/// `Debug` does not show the cluster token, only its length.
#[derive(Clone)]
pub struct Config {
    /// The task's job name (`worker`, `ps`, `chief`, ...): 1 to 64 characters from
    /// `A-Z a-z 0-9 _ -`. Decides the [`Role`].
    pub job: String,
    /// The task's index within its job.
    pub task_index: u32,
    /// Both ends of a connection must have the same; a mismatch fails the handshake.
    pub cluster_id: u64,
    /// Event loops asked for explicitly; `None` computes them (see [`Config::loop_count`]).
    pub loops: Option<usize>,
    /// Busy-poll forever instead of spinning for [`spin`](Config::spin) and then parking.
    pub polling: bool,
    /// Pin each loop thread to one CPU of the allowed set (see [`pin_plan`]).
    pub pin: bool,
    /// How long an idle loop spins before it parks (ignored when polling).
    pub spin: Duration,
    /// The I/O backend: `BackendChoice::Auto` (io_uring if the start-up probe finds what the
    /// loops need, else epoll), `Uring` (io_uring or an error) or `Epoll`.
    pub backend: BackendChoice,
    /// The receiver's parse-time limits, also announced to peers.
    pub limits: Limits,
    /// Tensors larger than this are sent as chunks of this many bytes.
    pub chunk_size: u32,
    /// Most bytes of queued frames one write (`sendmsg`) coalesces.
    pub acc_size: u32,
    /// Bytes of each loop's receive-buffer pool, cut into buffers of `recv_buffer` bytes
    /// that connections use for their life, registered as io_uring fixed buffers on
    /// io_uring; 0 turns it off.
    pub buf_size: u64,
    /// Fuse the recv requests for one peer found in one drain pass into one frame.
    pub tensor_fuse: bool,
    /// Initial receive buffer of a connection, in bytes; it grows up to one frame as needed.
    pub recv_buffer: usize,
    /// Request contexts per event loop: the most requests a loop has in flight at once.
    pub max_inflight: usize,
    /// How many times a failed connect is retried before the peer is reported unreachable.
    pub connect_retries: u32,
    /// Delay before the first connect retry; it doubles per retry (see
    /// [`Config::connect_delay`]).
    pub connect_backoff: Duration,
    /// TCP connections opened to each peer.
    pub connections_per_peer: usize,
    /// Shared secret sent in the handshake; `None` sends and requires none.
    pub cluster_token: Option<Vec<u8>>,
    /// How long a connection may take from connect (or accept) to a completed handshake.
    pub handshake_timeout: Duration,
    /// How long a frame's header and meta section may take to arrive once its first byte
    /// has: a peer that stalls (or trickles bytes) inside them is disconnected. Payload
    /// bytes are not timed, as a large tensor may take long on a slow link.
    pub frame_timeout: Duration,
    /// The most connections the task accepts at once, over all its event loops; more are
    /// closed as soon as they are accepted. Connections the task opens are not counted.
    pub max_connections: usize,
}

impl Config {
    /// A builder starting from the defaults, ignoring the environment.
    pub fn builder(job: &str, task_index: u32) -> ConfigBuilder {
        ConfigBuilder::new(job, task_index)
    }

    /// The defaults overridden by the environment, validated. Shorthand for
    /// `ConfigBuilder::from_env(job, task_index)?.build()`.
    pub fn from_env(job: &str, task_index: u32) -> Result<Config, ConfigError> {
        ConfigBuilder::from_env(job, task_index)?.build()
    }

    /// Which variable family this task reads: [`Role::of_job`] of [`job`](Config::job).
    pub fn role(&self) -> Role {
        Role::of_job(&self.job)
    }

    /// `WORKER` for the jobs `worker` and `chief`, `PS` for every other job.
    pub fn role_prefix(&self) -> &'static str {
        self.role().prefix()
    }

    /// How many event loops to run for `connections` peer connections on a process that may
    /// run on `allowed_cpus` CPUs.
    ///
    /// - [`loops`](Config::loops) if it was set, lowered to `allowed_cpus` (with a warning
    ///   naming the variable) when larger;
    /// - otherwise `min(16, connections)`, the rule of the originals (GRPC++; StarServer
    ///   used `min(8, ..)` on PS and `min(2, ..)` on workers), and never more than
    ///   `allowed_cpus`.
    ///
    /// Always at least 1, also for 0 connections or 0 CPUs.
    pub fn loop_count(&self, connections: usize, allowed_cpus: usize) -> usize {
        let cpus = allowed_cpus.max(1);
        match self.loops {
            Some(asked) if asked > cpus => {
                log::warn!(
                    "{}={asked} (or ConfigBuilder::loops) asks for more event loops than the \
                     {cpus} CPUs this process may run on; running {cpus}",
                    self.role().loops_env()
                );
                cpus
            }
            Some(asked) => asked.max(1),
            None => DEFAULT_LOOP_CAP.min(connections.max(1)).min(cpus),
        }
    }

    /// The delay before connect retry number `retry` (0 for the first retry):
    /// [`connect_backoff`](Config::connect_backoff) doubled `retry` times, capped at
    /// [`CONNECT_BACKOFF_CAP`], or at `connect_backoff` itself when that is larger.
    pub fn connect_delay(&self, retry: u32) -> Duration {
        let cap = CONNECT_BACKOFF_CAP.max(self.connect_backoff);
        let factor = 1u32 << retry.min(31);
        self.connect_backoff.saturating_mul(factor).min(cap)
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("job", &self.job)
            .field("task_index", &self.task_index)
            .field("cluster_id", &self.cluster_id)
            .field("loops", &self.loops)
            .field("polling", &self.polling)
            .field("pin", &self.pin)
            .field("spin", &self.spin)
            .field("backend", &self.backend)
            .field("limits", &self.limits)
            .field("chunk_size", &self.chunk_size)
            .field("acc_size", &self.acc_size)
            .field("buf_size", &self.buf_size)
            .field("tensor_fuse", &self.tensor_fuse)
            .field("recv_buffer", &self.recv_buffer)
            .field("max_inflight", &self.max_inflight)
            .field("connect_retries", &self.connect_retries)
            .field("connect_backoff", &self.connect_backoff)
            .field("connections_per_peer", &self.connections_per_peer)
            .field("cluster_token", &Redacted(self.cluster_token.as_deref()))
            .field("handshake_timeout", &self.handshake_timeout)
            .field("frame_timeout", &self.frame_timeout)
            .field("max_connections", &self.max_connections)
            .finish()
    }
}

/// Shows a token's length, never its bytes.
struct Redacted<'a>(Option<&'a [u8]>);

impl fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            None => f.write_str("None"),
            Some(token) => write!(f, "Some(<{} bytes, not shown>)", token.len()),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Pin plan.

/// The CPU each of `loops` event loops pins to: the first `loops` CPUs of `allowed` (the
/// process's allowed set, as `sched_getaffinity` reports it), in order, one loop per CPU.
///
/// Fails when there are fewer allowed CPUs than loops; [`Config::loop_count`] never asks
/// for more.
pub fn pin_plan(loops: usize, allowed: &[usize]) -> Result<Vec<usize>, PinPlanError> {
    match allowed.get(..loops) {
        Some(cpus) => Ok(cpus.to_vec()),
        None => Err(PinPlanError {
            loops,
            allowed: allowed.to_vec(),
        }),
    }
}

/// More loops to pin than allowed CPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinPlanError {
    loops: usize,
    allowed: Vec<usize>,
}

impl PinPlanError {
    /// The number of loops that were to be pinned.
    pub fn loops(&self) -> usize {
        self.loops
    }

    /// The CPUs the process may run on.
    pub fn allowed(&self) -> &[usize] {
        &self.allowed
    }
}

impl fmt::Display for PinPlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot pin {} event loops to one CPU each: this process may run on only {} CPUs ({})",
            self.loops,
            self.allowed.len(),
            CpuList(&self.allowed)
        )
    }
}

impl Error for PinPlanError {}

/// Formats a CPU list compactly: `0-3,6,8-9`.
struct CpuList<'a>(&'a [usize]);

impl fmt::Display for CpuList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let mut rest = self.0;
        let mut first = true;
        while let Some((&start, _)) = rest.split_first() {
            let mut run = 1;
            while rest
                .get(run)
                .is_some_and(|&cpu| Some(cpu) == start.checked_add(run))
            {
                run += 1;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if run == 1 {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{}", start + run - 1)?;
            }
            rest = &rest[run..];
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Errors.

/// A configuration value that is malformed or out of range.
///
/// Displays as `NAME=VALUE: expected ...`, where `NAME` is the environment variable, or
/// `ConfigBuilder::method` for a value set in code, or `job`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    name: Cow<'static, str>,
    value: String,
    expected: Cow<'static, str>,
}

impl ConfigError {
    fn new(
        name: impl Into<Cow<'static, str>>,
        value: String,
        expected: impl Into<Cow<'static, str>>,
    ) -> ConfigError {
        ConfigError {
            name: name.into(),
            value,
            expected: expected.into(),
        }
    }

    /// The environment variable or builder method the value came from.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rejected value as shown in the message (environment values quoted).
    pub fn value(&self) -> &str {
        &self.value
    }

    /// What a valid value looks like.
    pub fn expected(&self) -> &str {
        &self.expected
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={}: expected {}",
            self.name, self.value, self.expected
        )
    }
}

impl Error for ConfigError {}

// ---------------------------------------------------------------------------------------
// Builder.

/// Where a builder value came from; decides what an error calls it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    Default,
    Env,
    Builder,
}

#[derive(Clone, Copy)]
struct Setting<T> {
    value: T,
    origin: Origin,
}

impl<T> Setting<T> {
    const fn default(value: T) -> Setting<T> {
        Setting {
            value,
            origin: Origin::Default,
        }
    }

    fn env(&mut self, value: Option<T>) {
        if let Some(value) = value {
            *self = Setting {
                value,
                origin: Origin::Env,
            };
        }
    }

    fn set(&mut self, value: T) {
        *self = Setting {
            value,
            origin: Origin::Builder,
        };
    }
}

/// What an error calls a setting: the environment variable it came from, or the builder
/// method that set it.
fn label(origin: Origin, env: &'static str, method: &'static str) -> Cow<'static, str> {
    match origin {
        Origin::Env => Cow::Borrowed(env),
        Origin::Default => Cow::Owned(format!("default {method}")),
        Origin::Builder => Cow::Owned(format!("ConfigBuilder::{method}")),
    }
}

/// How an error shows a value: quoted as it would appear in the environment, or as set in
/// code.
fn shown(origin: Origin, env_form: impl fmt::Display, code_form: impl fmt::Debug) -> String {
    match origin {
        Origin::Env => format!("\"{env_form}\""),
        _ => format!("{code_form:?}"),
    }
}

/// Builds a [`Config`]: defaults, optionally overridden by the environment
/// ([`from_env`](ConfigBuilder::from_env)), overridden by the methods here. Every method
/// overrides whatever the environment said; [`build`](ConfigBuilder::build) validates.
///
/// `Debug` does not show the cluster token, only its length.
#[derive(Clone)]
pub struct ConfigBuilder {
    job: String,
    task_index: u32,
    cluster_id: Setting<u64>,
    loops: Setting<Option<usize>>,
    polling: Setting<bool>,
    pin: Setting<bool>,
    spin: Setting<Duration>,
    backend: Setting<BackendChoice>,
    limits: Limits,
    /// Origins of `max_frame`, `max_key`, `max_tensors`, `max_rank`, `max_tensor_bytes`.
    limit_origins: [Origin; 5],
    chunk_size: Setting<u32>,
    acc_size: Setting<u32>,
    buf_size: Setting<u64>,
    tensor_fuse: Setting<bool>,
    recv_buffer: Setting<usize>,
    max_inflight: Setting<usize>,
    connect_retries: Setting<u32>,
    connect_backoff: Setting<Duration>,
    connections_per_peer: Setting<usize>,
    cluster_token: Setting<Option<Vec<u8>>>,
    handshake_timeout: Setting<Duration>,
    frame_timeout: Setting<Duration>,
    max_connections: Setting<usize>,
}

impl fmt::Debug for ConfigBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfigBuilder")
            .field("job", &self.job)
            .field("task_index", &self.task_index)
            .field("cluster_id", &self.cluster_id.value)
            .field("loops", &self.loops.value)
            .field("polling", &self.polling.value)
            .field("pin", &self.pin.value)
            .field("spin", &self.spin.value)
            .field("backend", &self.backend.value)
            .field("limits", &self.limits)
            .field("chunk_size", &self.chunk_size.value)
            .field("acc_size", &self.acc_size.value)
            .field("buf_size", &self.buf_size.value)
            .field("tensor_fuse", &self.tensor_fuse.value)
            .field("recv_buffer", &self.recv_buffer.value)
            .field("max_inflight", &self.max_inflight.value)
            .field("connect_retries", &self.connect_retries.value)
            .field("connect_backoff", &self.connect_backoff.value)
            .field("connections_per_peer", &self.connections_per_peer.value)
            .field(
                "cluster_token",
                &Redacted(self.cluster_token.value.as_deref()),
            )
            .field("handshake_timeout", &self.handshake_timeout.value)
            .field("frame_timeout", &self.frame_timeout.value)
            .field("max_connections", &self.max_connections.value)
            .finish()
    }
}

macro_rules! setter {
    ($(#[$doc:meta])* $name:ident: $ty:ty) => {
        $(#[$doc])*
        #[must_use]
        pub fn $name(mut self, value: $ty) -> Self {
            self.$name.set(value);
            self
        }
    };
}

impl ConfigBuilder {
    fn new(job: &str, task_index: u32) -> ConfigBuilder {
        ConfigBuilder {
            job: job.to_owned(),
            task_index,
            cluster_id: Setting::default(DEFAULT_CLUSTER_ID),
            loops: Setting::default(None),
            polling: Setting::default(DEFAULT_POLLING),
            pin: Setting::default(DEFAULT_PIN),
            spin: Setting::default(DEFAULT_SPIN),
            backend: Setting::default(BackendChoice::Auto),
            limits: Limits::default(),
            limit_origins: [Origin::Default; 5],
            chunk_size: Setting::default(DEFAULT_CHUNK_SIZE),
            acc_size: Setting::default(DEFAULT_ACC_SIZE),
            buf_size: Setting::default(DEFAULT_BUF_SIZE),
            tensor_fuse: Setting::default(DEFAULT_TENSOR_FUSE),
            recv_buffer: Setting::default(DEFAULT_RECV_BUFFER),
            max_inflight: Setting::default(DEFAULT_MAX_INFLIGHT),
            connect_retries: Setting::default(DEFAULT_CONNECT_RETRIES),
            connect_backoff: Setting::default(DEFAULT_CONNECT_BACKOFF),
            connections_per_peer: Setting::default(DEFAULT_CONNECTIONS_PER_PEER),
            cluster_token: Setting::default(None),
            handshake_timeout: Setting::default(DEFAULT_HANDSHAKE_TIMEOUT),
            frame_timeout: Setting::default(DEFAULT_FRAME_TIMEOUT),
            max_connections: Setting::default(DEFAULT_MAX_CONNECTIONS),
        }
    }

    /// The defaults overridden by the process environment. Malformed or out-of-range
    /// variables are errors here, even those a builder method would override later.
    pub fn from_env(job: &str, task_index: u32) -> Result<ConfigBuilder, ConfigError> {
        Self::from_lookup(job, task_index, |name| std::env::var_os(name))
    }

    /// [`from_env`](ConfigBuilder::from_env) reading variables through `lookup` instead of
    /// the process environment (`None` = unset), so tests need not mutate the environment.
    pub fn from_lookup(
        job: &str,
        task_index: u32,
        lookup: impl Fn(&str) -> Option<OsString>,
    ) -> Result<ConfigBuilder, ConfigError> {
        let mut b = ConfigBuilder::new(job, task_index);
        let role = Role::of_job(job);
        let env = Env(&lookup);

        b.cluster_id
            .env(env.number(ENV_CLUSTER_ID, 0, u64::MAX, "an integer")?);
        b.loops.env(
            env.number(role.loops_env(), 1, MAX_LOOPS as u64, "a number of loops")?
                .map(Some),
        );
        b.polling.env(env.boolean(role.polling_env())?);
        b.pin
            .env(env.boolean(role.disable_pin_env())?.map(|disable| !disable));
        b.spin.env(
            env.number::<u64>(ENV_SPIN_US, 0, micros(MAX_SPIN), "microseconds")?
                .map(Duration::from_micros),
        );
        b.backend.env(env.backend()?);

        for (i, f) in LIMIT_FIELDS.iter().enumerate() {
            if let Some(v) = env.number::<u64>(f.env, f.lo, f.hi, f.unit)? {
                set_limit(&mut b.limits, i, v);
                b.limit_origins[i] = Origin::Env;
            }
        }

        // The upper bound depends on max_frame, checked in `build`.
        b.chunk_size.env(env.number(
            ENV_CHUNK_SIZE,
            u64::from(MIN_CHUNK_SIZE),
            u64::from(Limits::MAX_FRAME - CHUNK_FRAME_OVERHEAD),
            "bytes",
        )?);
        b.acc_size.env(env.number(
            ENV_ACC_SIZE,
            u64::from(MIN_ACC_SIZE),
            u64::from(MAX_ACC_SIZE),
            "bytes",
        )?);
        b.buf_size.env(env.buf_size()?);
        b.tensor_fuse.env(env.boolean(ENV_TENSOR_FUSE)?);
        b.recv_buffer.env(env.number(
            ENV_RECV_BUFFER,
            MIN_RECV_BUFFER as u64,
            MAX_RECV_BUFFER as u64,
            "bytes",
        )?);
        b.max_inflight.env(env.number(
            ENV_MAX_INFLIGHT,
            1,
            MAX_MAX_INFLIGHT as u64,
            "request contexts",
        )?);
        b.connect_retries.env(env.number(
            ENV_CONNECT_RETRIES,
            0,
            u64::from(u32::MAX),
            "retries",
        )?);
        b.connect_backoff.env(
            env.number::<u64>(
                ENV_CONNECT_BACKOFF_MS,
                millis(MIN_CONNECT_BACKOFF),
                millis(MAX_CONNECT_BACKOFF),
                "milliseconds",
            )?
            .map(Duration::from_millis),
        );
        b.connections_per_peer.env(env.number(
            ENV_CONNECTIONS_PER_PEER,
            1,
            MAX_CONNECTIONS_PER_PEER as u64,
            "connections",
        )?);
        b.cluster_token.env(env.token()?.map(Some));
        b.handshake_timeout.env(
            env.number::<u64>(
                ENV_HANDSHAKE_TIMEOUT_MS,
                millis(MIN_HANDSHAKE_TIMEOUT),
                millis(MAX_HANDSHAKE_TIMEOUT),
                "milliseconds",
            )?
            .map(Duration::from_millis),
        );
        b.frame_timeout.env(
            env.number::<u64>(
                ENV_FRAME_TIMEOUT_MS,
                millis(MIN_FRAME_TIMEOUT),
                millis(MAX_FRAME_TIMEOUT),
                "milliseconds",
            )?
            .map(Duration::from_millis),
        );
        b.max_connections.env(env.number(
            ENV_MAX_CONNECTIONS,
            1,
            MAX_MAX_CONNECTIONS as u64,
            "connections",
        )?);
        Ok(b)
    }

    setter!(
        /// [`Config::cluster_id`]; overrides `STARWIRE_CLUSTER_ID`.
        cluster_id: u64
    );
    setter!(
        /// [`Config::polling`]; overrides `WORKER_ENABLE_POLLING` / `PS_ENABLE_POLLING`.
        polling: bool
    );
    setter!(
        /// [`Config::pin`]; overrides `WORKER_DISABLE_PIN_CORES` / `PS_DISABLE_PIN_CORES`
        /// (note the inversion: `pin(true)` is `*_DISABLE_PIN_CORES=false`).
        pin: bool
    );
    setter!(
        /// [`Config::spin`], at most [`MAX_SPIN`]; overrides `STARWIRE_SPIN_US`.
        spin: Duration
    );
    setter!(
        /// [`Config::backend`]; overrides `STARWIRE_BACKEND`.
        backend: BackendChoice
    );
    setter!(
        /// [`Config::chunk_size`], from [`MIN_CHUNK_SIZE`] to `max_frame -`
        /// [`CHUNK_FRAME_OVERHEAD`]; overrides `STARWIRE_CHUNK_SIZE`.
        chunk_size: u32
    );
    setter!(
        /// [`Config::acc_size`], [`MIN_ACC_SIZE`] to [`MAX_ACC_SIZE`]; overrides
        /// `STARWIRE_ACC_SIZE`.
        acc_size: u32
    );
    setter!(
        /// [`Config::buf_size`], 0 or at least [`MIN_BUF_SIZE`]; overrides `STARWIRE_BUF_SIZE`.
        buf_size: u64
    );
    setter!(
        /// [`Config::tensor_fuse`]; overrides `STARWIRE_TENSOR_FUSE`.
        tensor_fuse: bool
    );
    setter!(
        /// [`Config::recv_buffer`], [`MIN_RECV_BUFFER`] to [`MAX_RECV_BUFFER`]; overrides
        /// `STARWIRE_RECV_BUFFER`.
        recv_buffer: usize
    );
    setter!(
        /// [`Config::max_inflight`], 1 to [`MAX_MAX_INFLIGHT`]; overrides
        /// `STARWIRE_MAX_INFLIGHT`.
        max_inflight: usize
    );
    setter!(
        /// [`Config::connect_retries`]; overrides `STARWIRE_CONNECT_RETRIES`.
        connect_retries: u32
    );
    setter!(
        /// [`Config::connect_backoff`], [`MIN_CONNECT_BACKOFF`] to [`MAX_CONNECT_BACKOFF`];
        /// overrides `STARWIRE_CONNECT_BACKOFF_MS`.
        connect_backoff: Duration
    );
    setter!(
        /// [`Config::connections_per_peer`], 1 to [`MAX_CONNECTIONS_PER_PEER`]; overrides
        /// `STARWIRE_CONNECTIONS_PER_PEER`.
        connections_per_peer: usize
    );
    setter!(
        /// [`Config::handshake_timeout`], [`MIN_HANDSHAKE_TIMEOUT`] to
        /// [`MAX_HANDSHAKE_TIMEOUT`]; overrides `STARWIRE_HANDSHAKE_TIMEOUT_MS`.
        handshake_timeout: Duration
    );
    setter!(
        /// [`Config::frame_timeout`], [`MIN_FRAME_TIMEOUT`] to [`MAX_FRAME_TIMEOUT`];
        /// overrides `STARWIRE_FRAME_TIMEOUT_MS`.
        frame_timeout: Duration
    );
    setter!(
        /// [`Config::max_connections`], 1 to [`MAX_MAX_CONNECTIONS`]; overrides
        /// `STARWIRE_MAX_CONNECTIONS`.
        max_connections: usize
    );

    /// [`Config::loops`]: a number (1 to [`MAX_LOOPS`]) fixes the loop count, `None`
    /// computes it; overrides `NETWORK_WORKER_CORE_NUMBER` / `NETWORK_PS_CORE_NUMBER`.
    #[must_use]
    pub fn loops(mut self, loops: impl Into<Option<usize>>) -> Self {
        self.loops.set(loops.into());
        self
    }

    /// [`Config::limits`], checked with [`Limits::validate`]; overrides every
    /// `STARWIRE_MAX_*` variable.
    #[must_use]
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self.limit_origins = [Origin::Builder; 5];
        self
    }

    /// [`Config::cluster_token`], 1 to [`MAX_CLUSTER_TOKEN`] bytes, or `None`; overrides
    /// `STARWIRE_CLUSTER_TOKEN`.
    #[must_use]
    pub fn cluster_token(mut self, token: impl Into<Option<Vec<u8>>>) -> Self {
        self.cluster_token.set(token.into());
        self
    }

    /// Validates every value, each on its own and against the others, and returns the
    /// [`Config`]. The error names the variable or builder method of the first bad value.
    pub fn build(self) -> Result<Config, ConfigError> {
        let role = Role::of_job(&self.job);
        check_job(&self.job)?;

        if let Some(n) = self.loops.value {
            if !(1..=MAX_LOOPS).contains(&n) {
                return Err(ConfigError::new(
                    label(self.loops.origin, role.loops_env(), "loops"),
                    shown(self.loops.origin, n, n),
                    format!("a number of loops from 1 to {MAX_LOOPS}"),
                ));
            }
        }
        check_duration(&self.spin, ENV_SPIN_US, "spin", Duration::ZERO, MAX_SPIN)?;
        let limits = self.check_limits()?;

        // Chunk size: its own range, then the frame it must fit in.
        let room = limits.max_frame.saturating_sub(CHUNK_FRAME_OVERHEAD);
        let chunk_size = match self.chunk_size.origin {
            // Follow a small max_frame down, keeping the chunk a multiple of 4 KiB.
            Origin::Default => self.chunk_size.value.min(room & !(MIN_CHUNK_SIZE - 1)),
            origin => {
                let v = self.chunk_size.value;
                if !(MIN_CHUNK_SIZE..=room).contains(&v) {
                    let bound = match self.limit_origins[0] {
                        Origin::Default => String::from("the default max_frame"),
                        o => format!("max_frame from {}", label(o, ENV_MAX_FRAME, "limits")),
                    };
                    return Err(ConfigError::new(
                        label(origin, ENV_CHUNK_SIZE, "chunk_size"),
                        shown(origin, v, v),
                        format!(
                            "a number of bytes from {MIN_CHUNK_SIZE} to {room} \
                             ({bound}, {}, minus {CHUNK_FRAME_OVERHEAD})",
                            limits.max_frame
                        ),
                    ));
                }
                v
            }
        };
        check_range(
            &self.acc_size,
            ENV_ACC_SIZE,
            "acc_size",
            MIN_ACC_SIZE,
            MAX_ACC_SIZE,
            "bytes",
        )?;
        let buf = self.buf_size;
        if buf.value != 0 && !(MIN_BUF_SIZE..=MAX_BUF_SIZE).contains(&buf.value) {
            return Err(ConfigError::new(
                label(buf.origin, ENV_BUF_SIZE, "buf_size"),
                shown(buf.origin, buf.value, buf.value),
                BUF_SIZE_EXPECTED,
            ));
        }
        check_range(
            &self.recv_buffer,
            ENV_RECV_BUFFER,
            "recv_buffer",
            MIN_RECV_BUFFER,
            MAX_RECV_BUFFER,
            "bytes",
        )?;
        let recv = self.recv_buffer.value as u64;
        if buf.value != 0 && buf.value < recv {
            return Err(ConfigError::new(
                label(buf.origin, ENV_BUF_SIZE, "buf_size"),
                shown(buf.origin, buf.value, buf.value),
                format!(
                    "0 (no pool) or at least one receive buffer ({recv} bytes, the recv_buffer \
                     setting {ENV_RECV_BUFFER})"
                ),
            ));
        }
        check_range(
            &self.max_inflight,
            ENV_MAX_INFLIGHT,
            "max_inflight",
            1,
            MAX_MAX_INFLIGHT,
            "request contexts",
        )?;
        check_duration(
            &self.connect_backoff,
            ENV_CONNECT_BACKOFF_MS,
            "connect_backoff",
            MIN_CONNECT_BACKOFF,
            MAX_CONNECT_BACKOFF,
        )?;
        check_range(
            &self.connections_per_peer,
            ENV_CONNECTIONS_PER_PEER,
            "connections_per_peer",
            1,
            MAX_CONNECTIONS_PER_PEER,
            "connections",
        )?;
        if let Some(token) = &self.cluster_token.value {
            check_token(
                label(
                    self.cluster_token.origin,
                    ENV_CLUSTER_TOKEN,
                    "cluster_token",
                ),
                token,
            )?;
        }
        check_duration(
            &self.handshake_timeout,
            ENV_HANDSHAKE_TIMEOUT_MS,
            "handshake_timeout",
            MIN_HANDSHAKE_TIMEOUT,
            MAX_HANDSHAKE_TIMEOUT,
        )?;
        check_duration(
            &self.frame_timeout,
            ENV_FRAME_TIMEOUT_MS,
            "frame_timeout",
            MIN_FRAME_TIMEOUT,
            MAX_FRAME_TIMEOUT,
        )?;
        check_range(
            &self.max_connections,
            ENV_MAX_CONNECTIONS,
            "max_connections",
            1,
            MAX_MAX_CONNECTIONS,
            "connections",
        )?;

        Ok(Config {
            job: self.job,
            task_index: self.task_index,
            cluster_id: self.cluster_id.value,
            loops: self.loops.value,
            polling: self.polling.value,
            pin: self.pin.value,
            spin: self.spin.value,
            backend: self.backend.value,
            limits,
            chunk_size,
            acc_size: self.acc_size.value,
            buf_size: self.buf_size.value,
            tensor_fuse: self.tensor_fuse.value,
            recv_buffer: self.recv_buffer.value,
            max_inflight: self.max_inflight.value,
            connect_retries: self.connect_retries.value,
            connect_backoff: self.connect_backoff.value,
            connections_per_peer: self.connections_per_peer.value,
            cluster_token: self.cluster_token.value,
            handshake_timeout: self.handshake_timeout.value,
            frame_timeout: self.frame_timeout.value,
            max_connections: self.max_connections.value,
        })
    }

    /// Checks each limit against its range, naming the variable (or `limits`) of a bad one,
    /// then the whole with [`Limits::validate`].
    fn check_limits(&self) -> Result<Limits, ConfigError> {
        for (i, f) in LIMIT_FIELDS.iter().enumerate() {
            let v = get_limit(&self.limits, i);
            if !(f.lo..=f.hi).contains(&v) {
                let origin = self.limit_origins[i];
                let name = match origin {
                    Origin::Env => Cow::Borrowed(f.env),
                    _ => Cow::Owned(format!("ConfigBuilder::limits.{}", f.field)),
                };
                return Err(ConfigError::new(
                    name,
                    shown(origin, v, v),
                    format!("a number of {} from {} to {}", f.unit, f.lo, f.hi),
                ));
            }
        }
        // The ranges above are those of `validate`; this keeps the two from drifting apart.
        self.limits.validate().map_err(|problem| {
            ConfigError::new(
                "ConfigBuilder::limits",
                format!("{:?}", self.limits),
                format!("limits that pass Limits::validate ({problem})"),
            )
        })?;
        Ok(self.limits)
    }
}

/// One field of [`Limits`]: its name, variable and allowed range (those of
/// [`Limits::validate`] and the wire format's section 6).
struct LimitField {
    field: &'static str,
    env: &'static str,
    lo: u64,
    hi: u64,
    unit: &'static str,
}

/// In the order of `ConfigBuilder::limit_origins`, [`get_limit`] and [`set_limit`].
const LIMIT_FIELDS: [LimitField; 5] = [
    LimitField {
        field: "max_frame",
        env: ENV_MAX_FRAME,
        lo: Limits::MIN_FRAME as u64,
        hi: Limits::MAX_FRAME as u64,
        unit: "bytes",
    },
    LimitField {
        field: "max_key",
        env: ENV_MAX_KEY,
        lo: 1,
        hi: u16::MAX as u64,
        unit: "bytes",
    },
    LimitField {
        field: "max_tensors",
        env: ENV_MAX_TENSORS,
        lo: 1,
        hi: Limits::MAX_TENSORS as u64,
        unit: "tensors",
    },
    LimitField {
        field: "max_rank",
        env: ENV_MAX_RANK,
        lo: 0,
        hi: wire::MAX_RANK as u64,
        unit: "dimensions",
    },
    LimitField {
        field: "max_tensor_bytes",
        env: ENV_MAX_TENSOR_BYTES,
        lo: 0,
        hi: i64::MAX as u64,
        unit: "bytes",
    },
];

fn get_limit(l: &Limits, i: usize) -> u64 {
    match i {
        0 => u64::from(l.max_frame),
        1 => u64::from(l.max_key),
        2 => u64::from(l.max_tensors),
        3 => u64::from(l.max_rank),
        _ => l.max_tensor_bytes,
    }
}

/// Sets field `i` to `v`, which is within that field's range (so it fits the field's type).
fn set_limit(l: &mut Limits, i: usize, v: u64) {
    match i {
        0 => l.max_frame = v.try_into().unwrap_or(u32::MAX),
        1 => l.max_key = v.try_into().unwrap_or(u16::MAX),
        2 => l.max_tensors = v.try_into().unwrap_or(u32::MAX),
        3 => l.max_rank = v.try_into().unwrap_or(u8::MAX),
        _ => l.max_tensor_bytes = v,
    }
}

const BUF_SIZE_EXPECTED: &str = "0 (no buffer pool) or a number of bytes from 4096 to 1073741824";

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn check_job(job: &str) -> Result<(), ConfigError> {
    let ok = (1..=MAX_JOB_LEN).contains(&job.len())
        && job
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(
            "job",
            format!("{job:?}"),
            format!("1 to {MAX_JOB_LEN} characters from A-Z a-z 0-9 _ -"),
        ))
    }
}

fn check_range<T>(
    s: &Setting<T>,
    env: &'static str,
    method: &'static str,
    lo: T,
    hi: T,
    unit: &str,
) -> Result<(), ConfigError>
where
    T: Copy + PartialOrd + fmt::Display + fmt::Debug,
{
    if (lo..=hi).contains(&s.value) {
        return Ok(());
    }
    Err(ConfigError::new(
        label(s.origin, env, method),
        shown(s.origin, s.value, s.value),
        format!("a number of {unit} from {lo} to {hi}"),
    ))
}

/// Checks a duration; its environment variable is in microseconds when `env` ends with
/// `_US`, else in milliseconds.
fn check_duration(
    s: &Setting<Duration>,
    env: &'static str,
    method: &'static str,
    lo: Duration,
    hi: Duration,
) -> Result<(), ConfigError> {
    if (lo..=hi).contains(&s.value) {
        return Ok(());
    }
    let (env_form, expected) = if env.ends_with("_US") {
        (
            micros(s.value),
            format!("microseconds from {} to {}", micros(lo), micros(hi)),
        )
    } else {
        (
            millis(s.value),
            format!("milliseconds from {} to {}", millis(lo), millis(hi)),
        )
    };
    let expected = match s.origin {
        Origin::Env => expected,
        _ => format!("a duration from {lo:?} to {hi:?}"),
    };
    Err(ConfigError::new(
        label(s.origin, env, method),
        shown(s.origin, env_form, s.value),
        expected,
    ))
}

fn check_token(name: Cow<'static, str>, token: &[u8]) -> Result<(), ConfigError> {
    if (1..=MAX_CLUSTER_TOKEN).contains(&token.len()) {
        return Ok(());
    }
    // Never echo a secret, even a malformed one.
    Err(ConfigError::new(
        name,
        format!("<{} bytes, not shown>", token.len()),
        format!("1 to {MAX_CLUSTER_TOKEN} bytes (or no token at all)"),
    ))
}

// ---------------------------------------------------------------------------------------
// Environment parsing.

const BOOL_EXPECTED: &str = "true or false (or 1/0, yes/no)";
const BACKEND_EXPECTED: &str = "uring, epoll or auto";

/// Reads and parses variables through a lookup function.
struct Env<'a, F>(&'a F);

impl<F: Fn(&str) -> Option<OsString>> Env<'_, F> {
    /// The value of `name` as UTF-8, `None` when unset.
    fn text(&self, name: &'static str, expected: &str) -> Result<Option<String>, ConfigError> {
        let Some(raw) = (self.0)(name) else {
            return Ok(None);
        };
        match raw.into_string() {
            Ok(s) => Ok(Some(s)),
            Err(raw) => Err(ConfigError::new(
                name,
                format!("{:?}", raw.as_os_str()),
                format!("valid UTF-8: {expected}"),
            )),
        }
    }

    fn boolean(&self, name: &'static str) -> Result<Option<bool>, ConfigError> {
        let Some(s) = self.text(name, BOOL_EXPECTED)? else {
            return Ok(None);
        };
        match parse_bool(&s) {
            Some(b) => Ok(Some(b)),
            None => Err(ConfigError::new(name, format!("{s:?}"), BOOL_EXPECTED)),
        }
    }

    /// A decimal integer in `lo..=hi`, converted to `T` (which `hi` must fit).
    fn number<T: TryFrom<u64>>(
        &self,
        name: &'static str,
        lo: u64,
        hi: u64,
        unit: &str,
    ) -> Result<Option<T>, ConfigError> {
        let expected = || format!("a decimal number of {unit} from {lo} to {hi}");
        let Some(s) = self.text(name, &expected())? else {
            return Ok(None);
        };
        parse_decimal(&s)
            .filter(|v| (lo..=hi).contains(v))
            .and_then(|v| T::try_from(v).ok())
            .map(Some)
            .ok_or_else(|| ConfigError::new(name, format!("{s:?}"), expected()))
    }

    fn buf_size(&self) -> Result<Option<u64>, ConfigError> {
        let Some(s) = self.text(ENV_BUF_SIZE, BUF_SIZE_EXPECTED)? else {
            return Ok(None);
        };
        match parse_decimal(&s) {
            Some(v) if v == 0 || (MIN_BUF_SIZE..=MAX_BUF_SIZE).contains(&v) => Ok(Some(v)),
            _ => Err(ConfigError::new(
                ENV_BUF_SIZE,
                format!("{s:?}"),
                BUF_SIZE_EXPECTED,
            )),
        }
    }

    fn backend(&self) -> Result<Option<BackendChoice>, ConfigError> {
        let Some(s) = self.text(ENV_BACKEND, BACKEND_EXPECTED)? else {
            return Ok(None);
        };
        // `BackendChoice::parse` would read blanks as nothing; an empty value is an error
        // here, as for every variable.
        if s.trim().is_empty() {
            return Err(ConfigError::new(
                ENV_BACKEND,
                format!("{s:?}"),
                BACKEND_EXPECTED,
            ));
        }
        BackendChoice::parse(&s)
            .map(Some)
            .map_err(|_| ConfigError::new(ENV_BACKEND, format!("{s:?}"), BACKEND_EXPECTED))
    }

    /// The token's raw bytes: any bytes, not necessarily UTF-8.
    fn token(&self) -> Result<Option<Vec<u8>>, ConfigError> {
        let Some(raw) = (self.0)(ENV_CLUSTER_TOKEN) else {
            return Ok(None);
        };
        let bytes = OsStr::as_bytes(&raw);
        check_token(Cow::Borrowed(ENV_CLUSTER_TOKEN), bytes)?;
        Ok(Some(bytes.to_vec()))
    }
}

/// `true`/`false`/`1`/`0`/`yes`/`no`, ASCII case-insensitive, nothing else (no blanks).
fn parse_bool(s: &str) -> Option<bool> {
    const TRUE: [&str; 3] = ["true", "1", "yes"];
    const FALSE: [&str; 3] = ["false", "0", "no"];
    if TRUE.iter().any(|t| s.eq_ignore_ascii_case(t)) {
        Some(true)
    } else if FALSE.iter().any(|f| s.eq_ignore_ascii_case(f)) {
        Some(false)
    } else {
        None
    }
}

/// ASCII digits only (no sign, blanks or separators), fitting a `u64`.
fn parse_decimal(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::os::unix::ffi::OsStringExt;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|&(k, v)| (k.to_owned(), OsString::from(v)))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn config(job: &str, pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        ConfigBuilder::from_lookup(job, 0, lookup(pairs))?.build()
    }

    fn error(job: &str, pairs: &[(&str, &str)]) -> ConfigError {
        match config(job, pairs) {
            Ok(c) => panic!("{pairs:?} accepted: {c:?}"),
            Err(e) => e,
        }
    }

    fn assert_defaults(c: &Config) {
        assert_eq!(c.cluster_id, DEFAULT_CLUSTER_ID);
        assert_eq!(c.loops, None);
        assert_eq!(c.polling, DEFAULT_POLLING);
        assert_eq!(c.pin, DEFAULT_PIN);
        assert_eq!(c.spin, DEFAULT_SPIN);
        assert_eq!(c.backend, BackendChoice::Auto);
        assert_eq!(c.limits, Limits::default());
        assert_eq!(c.chunk_size, DEFAULT_CHUNK_SIZE);
        assert_eq!(c.acc_size, DEFAULT_ACC_SIZE);
        assert_eq!(c.buf_size, DEFAULT_BUF_SIZE);
        assert_eq!(c.tensor_fuse, DEFAULT_TENSOR_FUSE);
        assert_eq!(c.recv_buffer, DEFAULT_RECV_BUFFER);
        assert_eq!(c.max_inflight, DEFAULT_MAX_INFLIGHT);
        assert_eq!(c.connect_retries, DEFAULT_CONNECT_RETRIES);
        assert_eq!(c.connect_backoff, DEFAULT_CONNECT_BACKOFF);
        assert_eq!(c.connections_per_peer, DEFAULT_CONNECTIONS_PER_PEER);
        assert_eq!(c.cluster_token, None);
        assert_eq!(c.handshake_timeout, DEFAULT_HANDSHAKE_TIMEOUT);
        assert_eq!(c.frame_timeout, DEFAULT_FRAME_TIMEOUT);
        assert_eq!(c.max_connections, DEFAULT_MAX_CONNECTIONS);
    }

    #[test]
    fn defaults() {
        let c = Config::builder("ps", 3).build().unwrap();
        assert_eq!(c.job, "ps");
        assert_eq!(c.task_index, 3);
        assert_defaults(&c);
        assert_defaults(&config("worker", &[]).unwrap());
        // The documented values.
        assert_eq!(DEFAULT_SPIN, Duration::from_micros(50));
        assert_eq!(DEFAULT_CHUNK_SIZE, 4 * 1024 * 1024);
        assert_eq!(DEFAULT_ACC_SIZE, 256 * 1024);
        assert_eq!(DEFAULT_BUF_SIZE, 0);
        assert_eq!(DEFAULT_RECV_BUFFER, 64 * 1024);
        assert_eq!(
            (DEFAULT_POLLING, DEFAULT_PIN, DEFAULT_TENSOR_FUSE),
            (false, false, false)
        );
    }

    #[test]
    fn every_variable_parsed() {
        let c = config(
            "ps",
            &[
                ("STARWIRE_CLUSTER_ID", "18446744073709551615"),
                ("NETWORK_PS_CORE_NUMBER", "8"),
                ("PS_ENABLE_POLLING", "True"),
                ("PS_DISABLE_PIN_CORES", "False"),
                ("STARWIRE_SPIN_US", "0"),
                ("STARWIRE_BACKEND", "epoll"),
                ("STARWIRE_MAX_FRAME", "1073741824"),
                ("STARWIRE_MAX_KEY", "65535"),
                ("STARWIRE_MAX_TENSORS", "16777216"),
                ("STARWIRE_MAX_RANK", "0"),
                ("STARWIRE_MAX_TENSOR_BYTES", "9223372036854775807"),
                ("STARWIRE_CHUNK_SIZE", "1073741760"),
                ("STARWIRE_ACC_SIZE", "4096"),
                ("STARWIRE_BUF_SIZE", "0"),
                ("STARWIRE_TENSOR_FUSE", "yes"),
                ("STARWIRE_RECV_BUFFER", "67108864"),
                ("STARWIRE_MAX_INFLIGHT", "4194304"),
                ("STARWIRE_CONNECT_RETRIES", "0"),
                ("STARWIRE_CONNECT_BACKOFF_MS", "60000"),
                ("STARWIRE_CONNECTIONS_PER_PEER", "4096"),
                ("STARWIRE_CLUSTER_TOKEN", "s3cret"),
                ("STARWIRE_HANDSHAKE_TIMEOUT_MS", "250"),
                ("STARWIRE_FRAME_TIMEOUT_MS", "1500"),
                ("STARWIRE_MAX_CONNECTIONS", "10"),
            ],
        )
        .unwrap();
        assert_eq!(c.cluster_id, u64::MAX);
        assert_eq!(c.loops, Some(8));
        assert!(c.polling);
        assert!(c.pin, "DISABLE_PIN_CORES=False pins");
        assert_eq!(c.spin, Duration::ZERO);
        assert_eq!(c.backend, BackendChoice::Epoll);
        assert_eq!(
            c.limits,
            Limits {
                max_frame: 1 << 30,
                max_key: u16::MAX,
                max_tensors: 1 << 24,
                max_rank: 0,
                max_tensor_bytes: i64::MAX as u64,
            }
        );
        assert_eq!(c.chunk_size, (1 << 30) - 64);
        assert_eq!(c.acc_size, 4096);
        assert_eq!(c.buf_size, 0);
        assert!(c.tensor_fuse);
        assert_eq!(c.recv_buffer, 64 << 20);
        assert_eq!(c.max_inflight, 1 << 22);
        assert_eq!(c.connect_retries, 0);
        assert_eq!(c.connect_backoff, Duration::from_secs(60));
        assert_eq!(c.connections_per_peer, 4096);
        assert_eq!(c.cluster_token.as_deref(), Some(&b"s3cret"[..]));
        assert_eq!(c.handshake_timeout, Duration::from_millis(250));
        assert_eq!(c.frame_timeout, Duration::from_millis(1500));
        assert_eq!(c.max_connections, 10);

        // The other ends of the ranges, and the other spellings.
        let c = config(
            "worker",
            &[
                ("NETWORK_WORKER_CORE_NUMBER", "1"),
                ("WORKER_ENABLE_POLLING", "0"),
                ("WORKER_DISABLE_PIN_CORES", "YES"),
                ("STARWIRE_SPIN_US", "10000000"),
                ("STARWIRE_BACKEND", "URING"),
                ("STARWIRE_MAX_FRAME", "65536"),
                ("STARWIRE_MAX_RANK", "32"),
                ("STARWIRE_CHUNK_SIZE", "4096"),
                ("STARWIRE_ACC_SIZE", "67108864"),
                ("STARWIRE_BUF_SIZE", "4096"),
                ("STARWIRE_TENSOR_FUSE", "no"),
                ("STARWIRE_RECV_BUFFER", "4096"),
                ("STARWIRE_MAX_INFLIGHT", "1"),
                ("STARWIRE_CONNECT_BACKOFF_MS", "1"),
                ("STARWIRE_CONNECTIONS_PER_PEER", "1"),
                ("STARWIRE_CLUSTER_ID", "007"),
            ],
        )
        .unwrap();
        assert_eq!(c.loops, Some(1));
        assert!(!c.polling && !c.pin && !c.tensor_fuse);
        assert_eq!(c.spin, MAX_SPIN);
        assert_eq!(c.backend, BackendChoice::Uring);
        assert_eq!(c.limits.max_frame, 65536);
        assert_eq!(c.limits.max_rank, 32);
        assert_eq!(c.chunk_size, 4096);
        assert_eq!(c.acc_size, 64 << 20);
        assert_eq!(c.buf_size, 4096);
        assert_eq!(c.recv_buffer, 4096);
        assert_eq!(c.max_inflight, 1);
        assert_eq!(c.connect_backoff, Duration::from_millis(1));
        assert_eq!(c.cluster_id, 7);

        for (value, expected) in [
            ("true", true),
            ("TRUE", true),
            ("1", true),
            ("Yes", true),
            ("false", false),
            ("fAlSe", false),
            ("0", false),
            ("NO", false),
        ] {
            let c = config("ps", &[("STARWIRE_TENSOR_FUSE", value)]).unwrap();
            assert_eq!(c.tensor_fuse, expected, "{value}");
        }
        let c = config("ps", &[("STARWIRE_BACKEND", "auto")]).unwrap();
        assert_eq!(c.backend, BackendChoice::Auto);
    }

    /// Values every variable of the kind rejects.
    const BAD_BOOLS: &[&str] = &["", "maybe", "2", "-1", " true", "true ", "t", "on", "yes!"];
    const BAD_NUMBERS: &[&str] = &[
        "",
        " ",
        "-1",
        "+1",
        "1.5",
        "12x",
        "0x10",
        "1_000",
        " 8",
        "8 ",
        "abc",
        "18446744073709551616",
        "99999999999999999999999999",
    ];

    fn assert_rejected(job: &str, var: &str, value: &str) {
        let err = error(job, &[(var, value)]);
        assert_eq!(err.name(), var, "{var}={value:?}: {err}");
        let text = err.to_string();
        assert!(text.starts_with(&format!("{var}=")), "{text}");
        assert!(text.contains(": expected "), "{text}");
        if var != ENV_CLUSTER_TOKEN {
            assert_eq!(err.value(), format!("{value:?}"), "{text}");
        }
    }

    #[test]
    fn every_bool_variable_rejects_bad_values() {
        for (job, var) in [
            ("worker", "WORKER_ENABLE_POLLING"),
            ("worker", "WORKER_DISABLE_PIN_CORES"),
            ("ps", "PS_ENABLE_POLLING"),
            ("ps", "PS_DISABLE_PIN_CORES"),
            ("ps", ENV_TENSOR_FUSE),
        ] {
            for bad in BAD_BOOLS {
                assert_rejected(job, var, bad);
            }
        }
        assert_eq!(
            error("ps", &[("PS_ENABLE_POLLING", "maybe")]).to_string(),
            "PS_ENABLE_POLLING=\"maybe\": expected true or false (or 1/0, yes/no)"
        );
    }

    #[test]
    fn every_number_variable_rejects_bad_and_out_of_range_values() {
        // (job, variable, values out of range)
        let cases: &[(&str, &str, &[&str])] = &[
            ("ps", ENV_CLUSTER_ID, &[]),
            ("ps", "NETWORK_PS_CORE_NUMBER", &["0", "1025"]),
            ("chief", "NETWORK_WORKER_CORE_NUMBER", &["0", "100000"]),
            ("ps", ENV_SPIN_US, &["10000001"]),
            ("ps", ENV_MAX_FRAME, &["0", "65535", "1073741825"]),
            ("ps", ENV_MAX_KEY, &["0", "65536"]),
            ("ps", ENV_MAX_TENSORS, &["0", "16777217"]),
            ("ps", ENV_MAX_RANK, &["33", "256"]),
            ("ps", ENV_MAX_TENSOR_BYTES, &["9223372036854775808"]),
            ("ps", ENV_CHUNK_SIZE, &["0", "4095", "1073741761"]),
            ("ps", ENV_ACC_SIZE, &["0", "4095", "67108865"]),
            ("ps", ENV_BUF_SIZE, &["1", "4095"]),
            ("ps", ENV_RECV_BUFFER, &["0", "4095", "67108865"]),
            ("ps", ENV_MAX_INFLIGHT, &["0", "4194305"]),
            ("ps", ENV_CONNECT_RETRIES, &["4294967296"]),
            ("ps", ENV_CONNECT_BACKOFF_MS, &["0", "60001"]),
            ("ps", ENV_CONNECTIONS_PER_PEER, &["0", "4097"]),
            ("ps", ENV_HANDSHAKE_TIMEOUT_MS, &["0", "600001"]),
            ("ps", ENV_FRAME_TIMEOUT_MS, &["0", "3600001"]),
            ("ps", ENV_MAX_CONNECTIONS, &["0", "1048577"]),
        ];
        for &(job, var, out_of_range) in cases {
            for bad in BAD_NUMBERS.iter().chain(out_of_range) {
                assert_rejected(job, var, bad);
            }
        }
        assert_eq!(
            error("ps", &[(ENV_RECV_BUFFER, "1k")]).to_string(),
            "STARWIRE_RECV_BUFFER=\"1k\": expected a decimal number of bytes from 4096 to 67108864"
        );
    }

    #[test]
    fn backend_and_token_reject_bad_values() {
        for bad in ["", " ", "io-uring", "kqueue", "epoll2"] {
            assert_rejected("ps", ENV_BACKEND, bad);
        }
        let long = "x".repeat(MAX_CLUSTER_TOKEN + 1);
        for bad in ["", long.as_str()] {
            let err = error("ps", &[(ENV_CLUSTER_TOKEN, bad)]);
            assert_eq!(err.name(), ENV_CLUSTER_TOKEN);
            assert!(
                !err.to_string().contains("xxx"),
                "the token is not shown: {err}"
            );
        }
        let max = "y".repeat(MAX_CLUSTER_TOKEN);
        let c = config("ps", &[(ENV_CLUSTER_TOKEN, &max)]).unwrap();
        assert_eq!(c.cluster_token.unwrap().len(), MAX_CLUSTER_TOKEN);
    }

    #[test]
    fn non_utf8_is_rejected_naming_the_variable() {
        let vars = [
            ENV_CLUSTER_ID,
            "NETWORK_PS_CORE_NUMBER",
            "PS_ENABLE_POLLING",
            "PS_DISABLE_PIN_CORES",
            ENV_SPIN_US,
            ENV_BACKEND,
            ENV_MAX_FRAME,
            ENV_MAX_KEY,
            ENV_MAX_TENSORS,
            ENV_MAX_RANK,
            ENV_MAX_TENSOR_BYTES,
            ENV_CHUNK_SIZE,
            ENV_ACC_SIZE,
            ENV_BUF_SIZE,
            ENV_TENSOR_FUSE,
            ENV_RECV_BUFFER,
            ENV_MAX_INFLIGHT,
            ENV_CONNECT_RETRIES,
            ENV_CONNECT_BACKOFF_MS,
            ENV_CONNECTIONS_PER_PEER,
            ENV_HANDSHAKE_TIMEOUT_MS,
            ENV_FRAME_TIMEOUT_MS,
            ENV_MAX_CONNECTIONS,
        ];
        for var in vars {
            let bad = move |name: &str| (name == var).then(|| OsString::from_vec(vec![b'1', 0xff]));
            let err = ConfigBuilder::from_lookup("ps", 0, bad).unwrap_err();
            assert_eq!(err.name(), var);
            assert!(err.expected().starts_with("valid UTF-8"), "{err}");
        }
        // A token is bytes: any bytes.
        let token = |name: &str| {
            (name == ENV_CLUSTER_TOKEN).then(|| OsString::from_vec(vec![0xff, 0, 0xfe]))
        };
        let c = ConfigBuilder::from_lookup("ps", 0, token)
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(c.cluster_token, Some(vec![0xff, 0, 0xfe]));
    }

    #[test]
    fn role_prefix() {
        for job in ["worker", "chief"] {
            assert_eq!(Role::of_job(job), Role::Worker);
            let c = config(
                job,
                &[
                    ("WORKER_ENABLE_POLLING", "true"),
                    ("NETWORK_WORKER_CORE_NUMBER", "3"),
                    ("WORKER_DISABLE_PIN_CORES", "false"),
                    // The other family is not read.
                    ("PS_ENABLE_POLLING", "garbage"),
                    ("NETWORK_PS_CORE_NUMBER", "garbage"),
                    ("PS_DISABLE_PIN_CORES", "garbage"),
                ],
            )
            .unwrap();
            assert_eq!(c.role_prefix(), "WORKER");
            assert!(c.polling && c.pin);
            assert_eq!(c.loops, Some(3));
        }
        for job in ["ps", "evaluator", "Worker", "workers", "chief-0"] {
            assert_eq!(Role::of_job(job), Role::Ps, "{job}");
            let c = config(
                job,
                &[
                    ("PS_ENABLE_POLLING", "1"),
                    ("NETWORK_PS_CORE_NUMBER", "5"),
                    ("PS_DISABLE_PIN_CORES", "0"),
                    ("WORKER_ENABLE_POLLING", "garbage"),
                    ("NETWORK_WORKER_CORE_NUMBER", "garbage"),
                    ("WORKER_DISABLE_PIN_CORES", "garbage"),
                ],
            )
            .unwrap();
            assert_eq!(c.role_prefix(), "PS");
            assert!(c.polling && c.pin);
            assert_eq!(c.loops, Some(5));
        }
        assert_eq!(Role::Worker.loops_env(), "NETWORK_WORKER_CORE_NUMBER");
        assert_eq!(Role::Ps.disable_pin_env(), "PS_DISABLE_PIN_CORES");
    }

    #[test]
    fn builder_overrides_env() {
        let env = lookup(&[
            ("PS_ENABLE_POLLING", "true"),
            ("NETWORK_PS_CORE_NUMBER", "4"),
            ("PS_DISABLE_PIN_CORES", "false"),
            ("STARWIRE_SPIN_US", "7"),
            ("STARWIRE_BACKEND", "uring"),
            ("STARWIRE_MAX_FRAME", "1048576"),
            ("STARWIRE_CHUNK_SIZE", "8192"),
            ("STARWIRE_CLUSTER_TOKEN", "from-env"),
            ("STARWIRE_CLUSTER_ID", "5"),
            ("STARWIRE_HANDSHAKE_TIMEOUT_MS", "10"),
        ]);
        let c = ConfigBuilder::from_lookup("ps", 1, env)
            .unwrap()
            .polling(false)
            .loops(None)
            .pin(false)
            .spin(Duration::from_micros(1))
            .backend(BackendChoice::Epoll)
            .limits(Limits::default())
            .chunk_size(1 << 20)
            .cluster_token(None)
            .cluster_id(9)
            .handshake_timeout(Duration::from_secs(1))
            .acc_size(8192)
            .buf_size(0)
            .tensor_fuse(true)
            .recv_buffer(1 << 20)
            .max_inflight(10)
            .connect_retries(1)
            .connect_backoff(Duration::from_millis(3))
            .connections_per_peer(2)
            .build()
            .unwrap();
        assert!(!c.polling && !c.pin && c.tensor_fuse);
        assert_eq!(c.loops, None);
        assert_eq!(c.spin, Duration::from_micros(1));
        assert_eq!(c.backend, BackendChoice::Epoll);
        assert_eq!(c.limits, Limits::default());
        assert_eq!(c.chunk_size, 1 << 20);
        assert_eq!(c.cluster_token, None);
        assert_eq!(c.cluster_id, 9);
        assert_eq!(c.handshake_timeout, Duration::from_secs(1));
        assert_eq!(
            (c.acc_size, c.buf_size, c.recv_buffer, c.max_inflight),
            (8192, 0, 1 << 20, 10)
        );
        assert_eq!(c.connect_retries, 1);
        assert_eq!(c.connect_backoff, Duration::from_millis(3));
        assert_eq!(c.connections_per_peer, 2);

        // Fields the builder leaves alone keep the environment's value.
        let c = ConfigBuilder::from_lookup("ps", 1, lookup(&[("STARWIRE_SPIN_US", "7")]))
            .unwrap()
            .polling(true)
            .build()
            .unwrap();
        assert_eq!(c.spin, Duration::from_micros(7));
    }

    #[test]
    fn buf_size_must_hold_one_receive_buffer() {
        let e = error("ps", &[("STARWIRE_BUF_SIZE", "8192")]);
        let msg = e.to_string();
        assert!(msg.contains("STARWIRE_BUF_SIZE"), "{msg}");
        assert!(msg.contains("\"8192\""), "{msg}");
        assert!(msg.contains("65536 bytes"), "{msg}");
        let e = error("ps", &[("STARWIRE_BUF_SIZE", "1073741825")]);
        assert!(e.to_string().contains("1073741824"), "{e}");
        let c = config(
            "ps",
            &[
                ("STARWIRE_BUF_SIZE", "8192"),
                ("STARWIRE_RECV_BUFFER", "8192"),
            ],
        )
        .unwrap();
        assert_eq!((c.buf_size, c.recv_buffer), (8192, 8192));
        assert_eq!(config("ps", &[]).unwrap().buf_size, 0, "off by default");
    }

    #[test]
    fn builder_values_are_validated_and_named() {
        let b = || Config::builder("ps", 0);
        let cases: Vec<(ConfigBuilder, &str)> = vec![
            (b().loops(0), "ConfigBuilder::loops"),
            (b().loops(MAX_LOOPS + 1), "ConfigBuilder::loops"),
            (
                b().spin(MAX_SPIN + Duration::from_nanos(1)),
                "ConfigBuilder::spin",
            ),
            (b().chunk_size(4095), "ConfigBuilder::chunk_size"),
            (b().acc_size(MAX_ACC_SIZE + 1), "ConfigBuilder::acc_size"),
            (b().buf_size(1), "ConfigBuilder::buf_size"),
            (b().buf_size(MAX_BUF_SIZE + 1), "ConfigBuilder::buf_size"),
            (b().buf_size(32 << 10), "ConfigBuilder::buf_size"),
            (b().recv_buffer(0), "ConfigBuilder::recv_buffer"),
            (b().max_inflight(0), "ConfigBuilder::max_inflight"),
            (
                b().connect_backoff(Duration::from_micros(999)),
                "ConfigBuilder::connect_backoff",
            ),
            (
                b().connections_per_peer(0),
                "ConfigBuilder::connections_per_peer",
            ),
            (
                b().cluster_token(Vec::new()),
                "ConfigBuilder::cluster_token",
            ),
            (
                b().cluster_token(vec![7; MAX_CLUSTER_TOKEN + 1]),
                "ConfigBuilder::cluster_token",
            ),
            (
                b().handshake_timeout(Duration::ZERO),
                "ConfigBuilder::handshake_timeout",
            ),
            (
                b().limits(Limits {
                    max_frame: 1000,
                    ..Limits::default()
                }),
                "ConfigBuilder::limits.max_frame",
            ),
            (
                b().limits(Limits {
                    max_rank: 33,
                    ..Limits::default()
                }),
                "ConfigBuilder::limits.max_rank",
            ),
            (Config::builder("", 0), "job"),
            (Config::builder("p s", 0), "job"),
            (Config::builder(&"j".repeat(MAX_JOB_LEN + 1), 0), "job"),
        ];
        for (builder, name) in cases {
            let err = builder.build().unwrap_err();
            assert_eq!(err.name(), name, "{err}");
        }
        assert_eq!(
            b().connect_backoff(Duration::ZERO)
                .build()
                .unwrap_err()
                .to_string(),
            "ConfigBuilder::connect_backoff=0ns: expected a duration from 1ms to 60s"
        );
        assert!(Config::builder(&"j".repeat(MAX_JOB_LEN), 0).build().is_ok());
        assert!(Config::builder("Worker_2-b", 0).build().is_ok());
    }

    #[test]
    fn chunk_size_must_fit_max_frame() {
        // From the environment: the chunk variable is named, with the frame it must fit.
        let err = error(
            "ps",
            &[(ENV_MAX_FRAME, "1048576"), (ENV_CHUNK_SIZE, "1048576")],
        );
        assert_eq!(err.name(), ENV_CHUNK_SIZE);
        assert_eq!(err.value(), "\"1048576\"");
        assert!(err.expected().contains("1048512"), "{err}");
        assert!(err.expected().contains(ENV_MAX_FRAME), "{err}");
        assert!(config(
            "ps",
            &[(ENV_MAX_FRAME, "1048576"), (ENV_CHUNK_SIZE, "1048512")]
        )
        .is_ok());

        // From code.
        let small = Limits {
            max_frame: 1 << 20,
            ..Limits::default()
        };
        let err = Config::builder("ps", 0)
            .limits(small)
            .chunk_size(2 << 20)
            .build()
            .unwrap_err();
        assert_eq!(err.name(), "ConfigBuilder::chunk_size");
        // Against the default max_frame.
        let err = Config::builder("ps", 0)
            .chunk_size(1 << 30)
            .build()
            .unwrap_err();
        assert!(err.expected().contains("default max_frame"), "{err}");

        // An unset chunk size follows a small max_frame down, to a multiple of 4 KiB.
        let c = Config::builder("ps", 0).limits(small).build().unwrap();
        assert_eq!(c.chunk_size, (1 << 20) - 4096);
        let c = config("ps", &[(ENV_MAX_FRAME, "65536")]).unwrap();
        assert_eq!(c.chunk_size, 61440);
        let c = config("ps", &[(ENV_MAX_FRAME, "1073741824")]).unwrap();
        assert_eq!(c.chunk_size, DEFAULT_CHUNK_SIZE);
    }

    fn with_loops(loops: Option<usize>) -> Config {
        Config::builder("ps", 0).loops(loops).build().unwrap()
    }

    #[test]
    fn loop_count_explicit_and_clamped() {
        assert_eq!(with_loops(Some(4)).loop_count(100, 64), 4);
        assert_eq!(
            with_loops(Some(4)).loop_count(1, 64),
            4,
            "explicit ignores connections"
        );
        assert_eq!(
            with_loops(Some(32)).loop_count(100, 64),
            32,
            "explicit may exceed 16"
        );
        assert_eq!(
            with_loops(Some(8)).loop_count(100, 2),
            2,
            "clamped to the CPUs"
        );
        assert_eq!(with_loops(Some(8)).loop_count(100, 0), 1);
    }

    #[test]
    fn loop_count_default_is_min_16_connections_cpus() {
        let c = with_loops(None);
        for (connections, cpus, expected) in [
            (1, 2, 1),
            (8, 2, 2),
            (100, 2, 2),
            (1, 64, 1),
            (8, 64, 8),
            (100, 64, 16),
            (0, 64, 1),
            (100, 0, 1),
        ] {
            assert_eq!(
                c.loop_count(connections, cpus),
                expected,
                "{connections} connections, {cpus} CPUs"
            );
        }
    }

    #[test]
    fn pin_plan_takes_allowed_cpus_in_order() {
        assert_eq!(pin_plan(3, &[2, 3, 5, 7]).unwrap(), vec![2, 3, 5]);
        assert_eq!(pin_plan(4, &[2, 3, 5, 7]).unwrap(), vec![2, 3, 5, 7]);
        assert_eq!(pin_plan(0, &[0]).unwrap(), Vec::<usize>::new());

        assert_eq!(pin_plan(5, &[0, 1, 2, 3, 8]).unwrap().len(), 5);
        let err = pin_plan(6, &[0, 1, 2, 3, 8]).unwrap_err();
        assert_eq!(err.loops(), 6);
        assert_eq!(err.allowed(), &[0, 1, 2, 3, 8]);
        assert_eq!(
            err.to_string(),
            "cannot pin 6 event loops to one CPU each: this process may run on only 5 CPUs (0-3,8)"
        );
        assert!(pin_plan(1, &[])
            .unwrap_err()
            .to_string()
            .ends_with("(none)"));
    }

    #[test]
    fn cpu_list_format() {
        assert_eq!(CpuList(&[0, 1, 2, 3, 6, 8, 9]).to_string(), "0-3,6,8-9");
        assert_eq!(CpuList(&[5]).to_string(), "5");
        assert_eq!(CpuList(&[1, 3]).to_string(), "1,3");
        assert_eq!(CpuList(&[usize::MAX]).to_string(), usize::MAX.to_string());
    }

    #[test]
    fn connect_delay_doubles_up_to_the_cap() {
        let c = Config::builder("ps", 0).build().unwrap();
        let ms = |n| Duration::from_millis(n);
        assert_eq!(c.connect_delay(0), ms(10));
        assert_eq!(c.connect_delay(1), ms(20));
        assert_eq!(c.connect_delay(7), ms(1280));
        assert_eq!(c.connect_delay(8), CONNECT_BACKOFF_CAP);
        assert_eq!(c.connect_delay(u32::MAX), CONNECT_BACKOFF_CAP);
        let slow = Config::builder("ps", 0)
            .connect_backoff(ms(5000))
            .build()
            .unwrap();
        assert_eq!(slow.connect_delay(0), ms(5000));
        assert_eq!(slow.connect_delay(3), ms(5000));
    }

    #[test]
    fn debug_hides_the_token() {
        let b = Config::builder("ps", 0).cluster_token(b"hunter2".to_vec());
        assert!(!format!("{b:?}").contains("104"), "{b:?}");
        let c = b.build().unwrap();
        let shown = format!("{c:?}");
        assert!(shown.contains("<7 bytes, not shown>"), "{shown}");
        assert!(!shown.contains("104, 117"), "{shown}");
    }
}
