//! `sw_runtime`: a running runtime (its event loops, the service and tables it serves, its
//! rendezvous), started from `sw_runtime_options`, and its counters.

use std::ffi::{c_char, OsString};
use std::sync::Arc;

use starwire::config::ConfigBuilder;
use starwire::{Config, Options, Rendezvous, Runtime, Service, TensorAllocator};

use crate::allocator::{allocator_of, sw_allocator};
use crate::boundary::boundary;
use crate::cast::{box_from, ref_from, to_boxed, Boxed, Castable, Plain};
use crate::cast::{try_addr, try_out, try_ref, try_slice, try_str};
use crate::result::sw_result::{self, *};
use crate::result::Failure;
use crate::service::{sw_service, CService};
use crate::table::{sw_table, tables_of};
use crate::tensor::sw_tensor;

/// How to start a runtime. Settings are named by their environment variables
/// (`STARWIRE_BACKEND`, `NETWORK_PS_CORE_NUMBER`, `STARWIRE_CLUSTER_TOKEN`, ... see
/// `docs/tuning.md`) and validated the same way.
#[repr(C)]
pub struct sw_runtime_options {
    /// Job name (`ps`, `worker`, `chief`, ...): decides which role variables apply. Required.
    pub job: *const c_char,
    /// Task index within the job.
    pub task_index: u32,
    /// `settings` names and values (NUL-terminated strings); may be NULL when 0.
    pub setting_names: *const *const c_char,
    /// Values, in the order of `setting_names`.
    pub setting_values: *const *const c_char,
    /// Number of settings.
    pub settings: usize,
    /// Whether settings not given are read from the process environment.
    pub use_env: bool,
    /// `host:port` to listen on (port 0 picks one), or NULL for a client-only runtime.
    pub listen: *const c_char,
    /// The PS service, or NULL.
    pub service: *const sw_service,
    /// Memory for received tensors, or NULL for starwire's heap allocator.
    pub allocator: *const sw_allocator,
    /// Handler threads for the service (0: handlers run inline on the loops).
    pub handler_threads: u32,
    /// Ids of the tables of embedding rows served (`PULL_ROWS`, `PUSH_ROWS`): `tables[i]` is
    /// served as table `table_ids[i]`, ids distinct; may be NULL when `n_tables` is 0. A
    /// table not given is answered `NOT_FOUND`.
    pub table_ids: *const u32,
    /// The tables, in the order of `table_ids` (`sw_ps_table_as_table` of a PS table,
    /// `sw_mem_table_new`, `sw_table_new`). The runtime keeps its own references: the
    /// caller may free its handles once `sw_runtime_new` returns.
    pub tables: *const *const sw_table,
    /// Number of tables.
    pub n_tables: usize,
}

/// A running starwire runtime: event loops, and the task's rendezvous.
pub struct sw_runtime {
    _private: [u8; 0],
}

/// What a `sw_runtime` handle is: the runtime, and what its embedded clients are made of.
pub(crate) struct RuntimeHandle {
    pub(crate) runtime: Runtime,
    rendezvous: Arc<Rendezvous>,
    /// Where its settings came from, for the embedded clients made from it.
    pub(crate) source: ConfigSource,
    /// Its allocator hooks, which its embedded clients use too.
    pub(crate) allocator: Option<Arc<dyn TensorAllocator>>,
}

impl Castable for sw_runtime {
    type Ownership = Boxed;
    type RustType = RuntimeHandle;
}

impl Castable for sw_runtime_options {
    type Ownership = Plain;
    type RustType = sw_runtime_options;
}

/// `n` settings given as two arrays of strings, names and values (NULL when `n` is 0).
pub(crate) fn settings_of(
    names: *const *const c_char,
    values: *const *const c_char,
    n: usize,
) -> Result<Vec<(String, OsString)>, Failure> {
    let names = try_slice!(names, n, "setting_names");
    let values = try_slice!(values, n, "setting_values");
    let mut settings = Vec::with_capacity(n);
    for (&n, &v) in names.iter().zip(values) {
        let n = try_str!(n, "setting name");
        let v = try_str!(v, "setting value");
        settings.push((n.to_string(), OsString::from(v)));
    }
    Ok(settings)
}

/// A runtime's settings as given: read again, with more on top, for its embedded clients.
pub(crate) struct ConfigSource {
    job: String,
    task_index: u32,
    settings: Vec<(String, OsString)>,
    use_env: bool,
}

impl ConfigSource {
    /// The configuration of these settings, with `more` given on top of them.
    pub(crate) fn config(&self, more: &[(String, OsString)]) -> Result<Config, Failure> {
        let lookup = |name: &str| {
            let given = more
                .iter()
                .chain(&self.settings)
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone());
            given.or_else(|| {
                if self.use_env {
                    std::env::var_os(name)
                } else {
                    None
                }
            })
        };
        ConfigBuilder::from_lookup(&self.job, self.task_index, lookup)
            .and_then(|b| b.build())
            .map_err(|e| Failure::new(SW_ERR_CONFIG, e.to_string()))
    }
}

/// Starts a runtime. On `SW_OK`, `*out` is a runtime the caller stops with
/// `sw_runtime_free`.
///
/// # Safety
/// `options` points at valid options (their strings NUL-terminated, arrays of `settings`
/// and `n_tables` entries, tables live handles); `out` is writable.
#[no_mangle]
pub extern "C" fn sw_runtime_new(
    options: *const sw_runtime_options,
    out: *mut *mut sw_runtime,
) -> sw_result {
    boundary!({
        let o = try_ref!(options);
        let out = try_out!(out);
        let job = try_str!(o.job, "options.job");
        let settings = settings_of(o.setting_names, o.setting_values, o.settings)?;
        let source = ConfigSource {
            job: job.to_string(),
            task_index: o.task_index,
            settings,
            use_env: o.use_env,
        };
        let config = source.config(&[])?;
        let listen = if o.listen.is_null() {
            None
        } else {
            Some(try_addr!(o.listen, "options.listen"))
        };
        let tables = tables_of(o.table_ids, o.tables, o.n_tables)?;
        let service = match (ref_from(o.service), tables.is_empty()) {
            (None, true) => None,
            (s, _) => {
                let callbacks = s.copied().unwrap_or(sw_service {
                    user_data: std::ptr::null_mut(),
                    pull: None,
                    push: None,
                });
                Some(Arc::new(CService(callbacks, tables)) as Arc<dyn Service>)
            }
        };
        let rendezvous = Rendezvous::new();
        let allocator = allocator_of(o.allocator)?;
        let options = Options {
            listen,
            service,
            rendezvous: Some(rendezvous.clone()),
            allocator: allocator.clone(),
            handler_threads: Some(o.handler_threads as usize),
            ..Options::default()
        };
        let runtime = Runtime::start_with(config, options)
            .map_err(|e| Failure::new(SW_ERR_IO, format!("starting the runtime: {e}")))?;
        out.write(to_boxed(RuntimeHandle {
            runtime,
            rendezvous,
            source,
            allocator,
        }));
        Ok(())
    })
}

/// The port the runtime listens on (0 if it does not listen, or `rt` is NULL).
///
/// # Safety
/// `rt` is NULL or a live runtime.
#[no_mangle]
pub extern "C" fn sw_runtime_port(rt: *const sw_runtime) -> u16 {
    boundary!(0, {
        ref_from(rt)
            .and_then(|r| r.runtime.local_addr())
            .map_or(0, |a| a.port())
    })
}

/// Publishes `tensor` under `key` (`key_len` bytes) in this task's rendezvous: a recv of
/// `key` from a peer, waiting or future, gets it, exactly once. The tensor is shared, not
/// copied; the caller keeps its handle.
///
/// # Safety
/// `rt` and `tensor` are live handles; `key` points at `key_len` bytes.
#[no_mangle]
pub extern "C" fn sw_runtime_publish(
    rt: *const sw_runtime,
    key: *const u8,
    key_len: usize,
    tensor: *const sw_tensor,
) -> sw_result {
    boundary!({
        let rt = try_ref!(rt);
        let t = try_ref!(tensor);
        let key = try_slice!(key, key_len);
        if key.is_empty() {
            return Err(Failure::invalid("empty rendezvous key"));
        }
        rt.rendezvous
            .publish(key, t.tensor.clone())
            .map_err(|e| Failure::new(SW_ERR_ALREADY_PUBLISHED, e.to_string()))
    })
}

/// Fails every recv of `step` still waiting in this task's rendezvous (status `ABORTED`).
///
/// # Safety
/// `rt` is a live runtime.
#[no_mangle]
pub extern "C" fn sw_runtime_abort_step(rt: *const sw_runtime, step: u64) -> sw_result {
    boundary!({
        try_ref!(rt).rendezvous.abort_step(step);
        Ok(())
    })
}

/// Counters of all the runtime's loops.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct sw_stats {
    /// Frames received.
    pub frames_in: u64,
    /// Frames sent.
    pub frames_out: u64,
    /// Bytes received.
    pub bytes_in: u64,
    /// Bytes sent.
    pub bytes_out: u64,
    /// Requests completed successfully.
    pub requests_completed: u64,
    /// Requests failed.
    pub requests_failed: u64,
    /// Connections accepted.
    pub connections_accepted: u64,
    /// Connections opened to peers.
    pub connections_opened: u64,
    /// Connections lost or closed for an error.
    pub connections_lost: u64,
    /// Tensor payload bytes received straight into tensor memory.
    pub payload_direct: u64,
    /// Tensor payload bytes copied out of receive buffers.
    pub payload_copied: u64,
    /// Connections their peer closed cleanly (between frames, nothing in flight).
    pub connections_closed: u64,
    /// Blocks the send arenas allocated (flat in steady state: blocks are kept for the
    /// next turns, up to `STARWIRE_SEND_ARENA_KEEP` per connection).
    pub send_blocks_allocated: u64,
}

/// Writes a snapshot of the runtime's counters to `*out`.
///
/// # Safety
/// `rt` is a live runtime; `out` is writable.
#[no_mangle]
pub extern "C" fn sw_runtime_stats(rt: *const sw_runtime, out: *mut sw_stats) -> sw_result {
    boundary!({
        let rt = try_ref!(rt);
        let out = try_out!(out);
        out.write(sw_stats::of(&rt.runtime.stats()));
        Ok(())
    })
}

impl sw_stats {
    pub(crate) fn of(s: &starwire::Stats) -> sw_stats {
        sw_stats {
            frames_in: s.frames_in,
            frames_out: s.frames_out,
            bytes_in: s.bytes_in,
            bytes_out: s.bytes_out,
            requests_completed: s.completed.iter().sum(),
            requests_failed: s.failed.iter().sum(),
            connections_accepted: s.connections_accepted,
            connections_opened: s.connections_opened,
            connections_lost: s.connections_lost,
            payload_direct: s.payload_direct,
            payload_copied: s.payload_copied,
            connections_closed: s.connections_closed,
            send_blocks_allocated: s.send_blocks_allocated,
        }
    }
}

/// Stops the runtime: in-flight requests fail with `SW_ERR_SHUTDOWN`, loops are joined.
/// Free every client of this runtime first. NULL is ignored.
///
/// # Safety
/// `rt` is NULL or a runtime from `sw_runtime_new` not freed before.
#[no_mangle]
pub extern "C" fn sw_runtime_free(rt: *mut sw_runtime) {
    boundary!((), {
        if let Some(rt) = box_from(rt) {
            rt.runtime.shutdown();
        }
    })
}
