//! Configuration: a [`Config`] built with [`ConfigBuilder`], from defaults, the environment,
//! or both.
//!
//! The environment names of the originals (DeepRec GRPC++ / StarServer) are kept, so a job
//! script written for them configures starwire the same way; knobs the originals did not
//! have get a `STARWIRE_` prefix. Every value is validated, and a bad one is a
//! [`ConfigError`] that names the variable (or builder method), shows the value and says
//! what was expected. An unset variable means the default; a set but empty one is an error.
//! A built [`Config`] cannot be changed: its values are read through accessors of the
//! settings' names (`config.polling()`, `config.max_inflight()`, ...).
//!
//! Precedence, lowest first: the defaults (the `DEFAULT_*` constants), then the environment
//! ([`ConfigBuilder::from_env`], or [`ConfigBuilder::from_tf_config`] for the task
//! `TF_CONFIG` names, which takes the job and index from it), then builder methods.
//!
//! Every setting is written once, in one table (`src/config/table.rs`); the config, the
//! builder, the environment reader, the checks and the table of settings in
//! `docs/tuning.md` ([`settings_table`]) are made from it.
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
//! assert!(config.polling());
//! assert_eq!(config.role_prefix(), "PS");
//!
//! // Defaults only.
//! let config = Config::builder("worker", 3).loops(2).build()?;
//! assert_eq!(config.loop_count(100, 64), 2);
//! # Ok::<(), starwire::config::ConfigError>(())
//! ```

use std::borrow::Cow;
use std::ffi::OsString;
use std::time::Duration;

pub use crate::sys::{Backend, BackendChoice, IoFeatures};
use crate::wire::Limits;

#[macro_use]
mod macros;
mod doc;
mod env;
mod error;
mod pin;
mod table;
#[cfg(test)]
mod tests;
mod types;

pub use doc::settings_table;
pub use error::ConfigError;
pub use pin::{pin_plan, PinPlanError};
pub use table::*;

use env::Env;
use error::{label, shown, Origin};

// ---------------------------------------------------------------------------------------
// Config (the struct and its accessors are made from the table).

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

    /// The task's receive budget in bytes: [`recv_budget`](Config::recv_budget) if set,
    /// else a quarter of the machine's physical memory or of the cgroup's memory limit,
    /// whichever is lower (1 GiB when neither can be read).
    pub fn recv_budget_bytes(&self) -> u64 {
        self.recv_budget
            .unwrap_or_else(|| physical_memory().map_or(1 << 30, |m| m / 4))
            .max(MIN_RECV_BUDGET)
    }

    /// One connection's part of the receive budget in bytes:
    /// [`conn_recv_budget`](Config::conn_recv_budget) if set, else half of
    /// [`recv_budget_bytes`](Config::recv_budget_bytes); never more than the latter.
    pub fn conn_recv_budget_bytes(&self) -> u64 {
        let total = self.recv_budget_bytes();
        self.conn_recv_budget
            .unwrap_or(total / 2)
            .clamp(MIN_RECV_BUDGET, total)
    }

    /// The delay before connect retry number `retry` (0 for the first retry):
    /// [`connect_backoff`](Config::connect_backoff) doubled `retry` times, capped at
    /// [`CONNECT_BACKOFF_CAP`], or at `connect_backoff` itself when that is larger.
    pub fn connect_delay(&self, retry: u32) -> Duration {
        let cap = CONNECT_BACKOFF_CAP.max(self.connect_backoff);
        let factor = 1u32 << retry.min(31);
        self.connect_backoff.saturating_mul(factor).min(cap)
    }

    /// The time a connect that keeps failing waits between its attempts, over all
    /// [`connect_retries`](Config::connect_retries) retries: the sum of
    /// [`connect_delay`](Config::connect_delay)`(n)` for every retry `n`. With the
    /// defaults (8 retries from 10 ms) 10 + 20 + 40 + ... + 1280 ms = 2.55 s: about when a
    /// request with no deadline to an address where nothing listens (every attempt
    /// refused at once) fails with `ConnectFailed`.
    pub fn connect_retry_wait(&self) -> Duration {
        let cap = CONNECT_BACKOFF_CAP.max(self.connect_backoff);
        let mut total = Duration::ZERO;
        for retry in 0..self.connect_retries {
            let delay = self.connect_delay(retry);
            if delay == cap {
                // Every later retry waits the cap too.
                let left = self.connect_retries - retry;
                return total.saturating_add(cap.saturating_mul(left));
            }
            total += delay;
        }
        total
    }

    /// The longest a request with no deadline waits for a peer that cannot be reached
    /// before it fails with `ConnectFailed`: [`connect_retry_wait`](Config::connect_retry_wait)
    /// plus, for each of the `connect_retries + 1` attempts, up to
    /// [`handshake_timeout`](Config::handshake_timeout) (an attempt fails as soon as the
    /// system says why — refused at once, no route to host after the kernel's own wait —
    /// and one the peer never answers is given up, without further retries, at
    /// `handshake_timeout`). With the defaults: 2.55 s + 9 × 5 s = 47.55 s; an address
    /// where nothing listens fails after about 2.55 s, one that does not answer at all
    /// after 5 s. A deadline cuts it short ([`ErrorKind::Timeout`](crate::ErrorKind::Timeout),
    /// naming the last attempt's reason).
    pub fn connect_give_up_bound(&self) -> Duration {
        let attempts = self.connect_retries.saturating_add(1);
        let per_attempt = self.handshake_timeout.saturating_mul(attempts);
        self.connect_retry_wait().saturating_add(per_attempt)
    }
}

// ---------------------------------------------------------------------------------------
// Builder (the struct and the setters of single settings are made from the table).

impl ConfigBuilder {
    /// The defaults overridden by the process environment. Malformed or out-of-range
    /// variables are errors here, even those a builder method would override later. In a
    /// job that sets `TF_CONFIG`, [`from_tf_config`](ConfigBuilder::from_tf_config) takes
    /// `job` and `task_index` from it.
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
        let env = Env(&lookup);
        b.read_settings(Role::of_job(job), &env)?;
        for (f, origin) in LIMIT_FIELDS.iter().zip(&mut b.limit_origins) {
            if let Some(v) = env.number(f.env, f.lo, f.hi, f.unit)? {
                (f.set)(&mut b.limits, v);
                *origin = Origin::Env;
            }
        }
        Ok(b)
    }

    /// [`Config::limits`], checked with [`Limits::validate`]; overrides every
    /// `STARWIRE_MAX_*` variable.
    #[must_use]
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self.limit_origins = [Origin::Builder; LIMIT_FIELDS.len()];
        self
    }

    /// Validates every value, each on its own and against the others, and returns the
    /// [`Config`]. The error names the variable or builder method of the first bad value.
    pub fn build(mut self) -> Result<Config, ConfigError> {
        let role = Role::of_job(&self.job);
        check_job(&self.job)?;
        self.check_settings(role)?;
        let limits = self.check_limits()?;

        // The chunk must fit in a frame beside its header.
        let room = limits.max_frame.saturating_sub(CHUNK_FRAME_OVERHEAD);
        let chunk = self.chunk_size;
        match chunk.origin {
            // Follow a small max_frame down, keeping the chunk a multiple of 4 KiB.
            Origin::Default => {
                self.chunk_size.value = chunk.value.min(room & !(MIN_CHUNK_SIZE - 1));
            }
            origin if !(MIN_CHUNK_SIZE..=room).contains(&chunk.value) => {
                let bound = match self.limit_origins[0] {
                    Origin::Default => String::from("the default max_frame"),
                    o => format!("max_frame from {}", label(o, ENV_MAX_FRAME, "limits")),
                };
                return Err(ConfigError::new(
                    label(origin, ENV_CHUNK_SIZE, "chunk_size"),
                    shown(origin, chunk.value, chunk.value),
                    format!(
                        "a number of bytes from {MIN_CHUNK_SIZE} to {room} \
                         ({bound}, {}, minus {CHUNK_FRAME_OVERHEAD})",
                        limits.max_frame
                    ),
                ));
            }
            _ => {}
        }

        // A buffer pool must hold at least one receive buffer.
        let buf = self.buf_size;
        let recv = self.recv_buffer.value as u64;
        if buf.value != 0 && buf.value < recv {
            return Err(ConfigError::new(
                buf.label(ENV_BUF_SIZE, "buf_size"),
                shown(buf.origin, buf.value, buf.value),
                format!(
                    "0 (no pool) or at least one receive buffer ({recv} bytes, the recv_buffer \
                     setting {ENV_RECV_BUFFER})"
                ),
            ));
        }

        Ok(self.into_config(limits))
    }

    /// Checks each limit against its range, naming the variable (or `limits`) of a bad one,
    /// then the whole with [`Limits::validate`].
    fn check_limits(&self) -> Result<Limits, ConfigError> {
        for (f, &origin) in LIMIT_FIELDS.iter().zip(&self.limit_origins) {
            let v = (f.get)(&self.limits);
            if !(f.lo..=f.hi).contains(&v) {
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

/// Memory this process may use in bytes: the machine's physical memory, or the memory
/// limit of its cgroup (a container's) when that is lower; `None` if the system says
/// neither.
fn physical_memory() -> Option<u64> {
    use nix::unistd::{sysconf, SysconfVar};
    let physical = (|| {
        let pages = sysconf(SysconfVar::_PHYS_PAGES).ok()??;
        let size = sysconf(SysconfVar::PAGE_SIZE).ok()??;
        u64::try_from(pages)
            .ok()?
            .checked_mul(u64::try_from(size).ok()?)
    })();
    // cgroup v2, then v1, as a container sees its own cgroup; "max" means no limit.
    let limit = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .find_map(|path| {
        std::fs::read_to_string(path)
            .ok()?
            .trim()
            .parse::<u64>()
            .ok()
    });
    match (physical, limit) {
        (Some(p), Some(l)) => Some(p.min(l)),
        (p, l) => p.or(l),
    }
}
