//! `commctl serve`: a standalone starwire server.
//!
//! The server is the runtime in listening mode: its event loops answer pings themselves,
//! pulls and pushes go to a synthetic tensor [`Store`], and recvs take tensors from a
//! rendezvous that a producer thread keeps filled (see [`Producer`]).
//!
//! The store holds `--tensors N` variables, ids `0..N`, each a `u8` tensor of
//! `--tensor-size` bytes. A pull of id `i < N` returns variable `i` (no copy: the stored
//! tensor is shared); any other id is `NOT_FOUND`. A push of `(i, t)` checks and drops:
//! `OK` when `i < N` and `t` has `--tensor-size` bytes, `NOT_FOUND` for another id,
//! `INVALID_ARGUMENT` for another size.
//!
//! Recv keys are `t/0` .. `t/N-1` (the decimal id after `t/`). The producer keeps every
//! one of them published: it checks [`Rendezvous::ready_count`], and when a key is
//! missing it tries to publish all of them again (a key still published refuses). It
//! sleeps between passes, [`PRODUCER_BUSY`] after one that published something and up
//! to [`PRODUCER_IDLE`] when idle, so a key received is back within about a pass and a
//! pause. A recv of a key not published yet waits for it (a recv of any other key waits
//! until its deadline). Keys may be received by any number of clients and runs, any
//! number of times; the step is ignored. The producer's CPU time is part of the
//! server's: a pass costs one publish attempt per key, so with a large `--tensors` and
//! few keys per request it is most of the recv cost.
//!
//! The same service serves embedding rows (`PULL_ROWS`, `PUSH_ROWS`) from one table,
//! `--table` (default 1): starwire's `PsTable`, or its small `MemTable` with
//! `--table-kind mem`, of `--dim` f32 per row, with the `--init` and `--optimizer` given;
//! its rows made at start or loaded from a checkpoint (see [`crate::table`]). The server
//! says at start how the table is laid out and where its rows came from, and at the end
//! what it served.

use std::io::Write;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use starwire::cluster::endpoint_map::{AddrError, HostPort};
use starwire::cluster::TaskId;
use starwire::config::ConfigBuilder;
use starwire::DType;
use starwire::Status;
use starwire::{Config, Options, Rendezvous, Runtime, Service, StartError, Stats, Table, Tensor};

use crate::cli::ServeArgs;
use crate::exit::{self, Failure};
use crate::signals;
use crate::table::{self as rows, RowsServed, RowsTable, TableKind, TableSpec};
use crate::target;

/// Most `--tensors`.
pub const MAX_TENSORS: u64 = 1 << 20;
/// Largest `--tensor-size` (1 GiB); the store holds `tensors * size` bytes at most
/// [`MAX_STORE_BYTES`].
pub const MAX_TENSOR_SIZE: u64 = 1 << 30;
/// Most bytes the store may hold (4 GiB).
pub const MAX_STORE_BYTES: u64 = 4 << 30;
/// How long the producer sleeps after a pass that published something.
pub const PRODUCER_BUSY: Duration = Duration::from_micros(50);
/// The longest it sleeps: after passes that published nothing, the pause doubles from
/// [`PRODUCER_BUSY`] up to this.
pub const PRODUCER_IDLE: Duration = Duration::from_millis(5);

/// The recv key of variable `i`.
pub fn recv_key(i: u64) -> Vec<u8> {
    format!("t/{i}").into_bytes()
}

/// What `commctl serve` serves: the synthetic tensor store, `n` variables of `size` bytes
/// each, for pull and push, and the rows table, for pull-rows and push-rows.
pub struct Store {
    vars: Vec<Arc<Tensor>>,
    size: usize,
    pushed: AtomicU64,
    table_id: u32,
    table: RowsTable,
    /// Where the table's rows came from, with its bytes.
    table_start: String,
}

impl Store {
    /// `n` variables of `size` bytes, variable `i` filled with the byte `i % 251`, and the
    /// default rows table ([`TableSpec::default`]).
    pub fn new(n: u64, size: u64) -> Result<Store, Failure> {
        Store::with_table(n, size, &TableSpec::default())
    }

    /// `n` variables of `size` bytes, and the rows table `table` with its rows (made, or
    /// loaded from its checkpoint).
    pub fn with_table(n: u64, size: u64, table: &TableSpec) -> Result<Store, Failure> {
        let size_usize = usize::try_from(size)
            .map_err(|_| Failure::usage(format!("--tensor-size {size}: too large")))?;
        let mut vars = Vec::with_capacity(n as usize);
        for i in 0..n {
            let t = Tensor::from_bytes(DType::U8, &[size], vec![(i % 251) as u8; size_usize])
                .map_err(|e| Failure::usage(format!("--tensor-size {size}: {e}")))?;
            vars.push(Arc::new(t));
        }
        let (rows_table, table_start) = rows::start(table).map_err(Failure::usage)?;
        Ok(Store {
            vars,
            size: size_usize,
            pushed: AtomicU64::new(0),
            table_id: table.id,
            table: rows_table,
            table_start,
        })
    }

    /// Tensors pushed and accepted so far.
    pub fn pushed(&self) -> u64 {
        self.pushed.load(Ordering::Relaxed)
    }

    /// The rows table and its id.
    pub fn rows_table(&self) -> (u32, &RowsTable) {
        (self.table_id, &self.table)
    }

    /// Where the rows table's rows came from (made at start, or loaded from a
    /// checkpoint), with its bytes and where they fit among the CPU's caches.
    pub fn table_start(&self) -> &str {
        &self.table_start
    }
}

impl Service for Store {
    fn pull(&self, ids: &[u64], out: &mut Vec<Result<Arc<Tensor>, Status>>) {
        out.extend(ids.iter().map(|&id| {
            usize::try_from(id)
                .ok()
                .and_then(|i| self.vars.get(i))
                .cloned()
                .ok_or(Status::NotFound)
        }));
    }

    fn push(&self, items: &mut Vec<(u64, Tensor)>, statuses: &mut Vec<Status>) {
        let mut ok = 0;
        statuses.extend(items.iter().map(|(id, t)| {
            if *id >= self.vars.len() as u64 {
                Status::NotFound
            } else if t.byte_len() != self.size {
                Status::InvalidArgument
            } else {
                ok += 1;
                Status::Ok
            }
        }));
        self.pushed.fetch_add(ok, Ordering::Relaxed);
    }

    fn table(&self, table: u32) -> Option<&dyn Table> {
        (table == self.table_id).then_some(self.table.table())
    }

    fn table_ids(&self) -> Vec<u32> {
        vec![self.table_id]
    }
}

/// The thread that keeps every recv key of the store published.
pub struct Producer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<u64>>,
}

impl Producer {
    /// Starts publishing `t/i` = variable `i` into `rv`, for every variable of `store`.
    pub fn start(store: &Store, rv: Arc<Rendezvous>) -> Result<Producer, Failure> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let items: Vec<(Vec<u8>, Arc<Tensor>)> = store
            .vars
            .iter()
            .enumerate()
            .map(|(i, t)| (recv_key(i as u64), t.clone()))
            .collect();
        let thread = std::thread::Builder::new()
            .name("commctl-producer".into())
            .spawn(move || {
                let mut published = 0u64;
                let mut idle = PRODUCER_BUSY;
                while !flag.load(Ordering::Relaxed) {
                    // Every key still published (the cheap check): nothing to do.
                    let fresh = if rv.ready_count() < items.len() {
                        let mut fresh = 0u64;
                        for (key, t) in &items {
                            // AlreadyPublished: not received yet, nothing to do.
                            if rv.publish(key, t.clone()).is_ok() {
                                fresh += 1;
                            }
                        }
                        fresh
                    } else {
                        0
                    };
                    published += fresh;
                    idle = if fresh > 0 {
                        PRODUCER_BUSY
                    } else {
                        (idle * 2).min(PRODUCER_IDLE)
                    };
                    std::thread::sleep(idle);
                }
                published
            })
            .map_err(|e| Failure::usage(format!("cannot start the producer thread: {e}")))?;
        Ok(Producer {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the thread; returns how many tensors it published.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or(0)
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the server serves.
pub struct Content {
    /// Variables.
    pub tensors: u64,
    /// Bytes of each.
    pub tensor_size: u64,
    /// Threads running pull/push handlers (0: inline on the loops).
    pub handler_threads: usize,
    /// The rows table.
    pub table: TableSpec,
}

/// A running server.
pub struct Server {
    rt: Runtime,
    task: TaskId,
    store: Arc<Store>,
    rv: Arc<Rendezvous>,
    producer: Producer,
}

/// What a server did, once stopped.
pub struct Final {
    /// The runtime's counters.
    pub stats: Stats,
    /// Tensors recvs took: what the producer published beyond the keys still waiting
    /// (each key is published once at start, and again each time a recv took it).
    pub received: u64,
    /// Tensors pushed and accepted.
    pub pushed: u64,
    /// What the rows table served.
    pub rows: RowsServed,
}

impl Server {
    /// Builds the store and starts the loops on `listen`, and the producer.
    pub fn start(cfg: Config, listen: SocketAddr, content: &Content) -> Result<Server, Failure> {
        let task = TaskId::new(cfg.job(), cfg.task_index());
        let store = Arc::new(Store::with_table(
            content.tensors,
            content.tensor_size,
            &content.table,
        )?);
        let rv = Rendezvous::new();
        let service: Arc<dyn Service> = store.clone();
        let options = Options {
            listen: Some(listen),
            service: Some(service),
            rendezvous: Some(rv.clone()),
            handler_threads: Some(content.handler_threads),
            ..Options::default()
        };
        let rt = Runtime::start_with(cfg, options).map_err(|e| {
            let hint = match e.kind() {
                std::io::ErrorKind::AddrNotAvailable => {
                    " (not an address of this host; try --listen 0.0.0.0:PORT)"
                }
                std::io::ErrorKind::AddrInUse => " (another process listens there)",
                std::io::ErrorKind::PermissionDenied => " (ports below 1024 need privileges)",
                _ => "",
            };
            match e {
                StartError::Listen { addr, source } => {
                    Failure::usage(format!("cannot listen on {addr}: {source}{hint}"))
                }
                e => Failure::usage(format!("cannot start the server: {e}")),
            }
        })?;
        // What start-up did differently from what was asked (fewer loops, a fallback).
        for note in rt.report().notes() {
            crate::out::errln!("commctl serve: {note}");
        }
        let producer = match Producer::start(&store, rv.clone()) {
            Ok(p) => p,
            Err(f) => {
                rt.shutdown();
                return Err(f);
            }
        };
        Ok(Server {
            rt,
            task,
            store,
            rv,
            producer,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.rt.local_addr()
    }

    /// Stops the producer and the loops; returns the final counters.
    pub fn stop(self) -> Final {
        let published = self.producer.stop();
        let stats = self.rt.stats();
        self.rt.shutdown();
        // No recv takes a key any more: what was published and is not waiting was taken.
        let waiting = self.rv.ready_count() as u64;
        Final {
            stats,
            received: published.saturating_sub(waiting),
            pushed: self.store.pushed(),
            rows: self.store.table.served(),
        }
    }
}

/// The task `serve` calls itself without `--task` (or a task in `TF_CONFIG`): `ps:0`.
pub fn default_task() -> TaskId {
    TaskId::new("ps", 0)
}

/// What to serve as (`None`: no task given, [`default_task`]), and where.
fn plan(args: &ServeArgs) -> Result<(Option<TaskId>, SocketAddr), Failure> {
    let opts = args.cluster_opts();
    let task = match &args.task {
        Some(t) => Some(TaskId::parse(t).map_err(|e| Failure::usage(format!("--task: {e}")))?),
        None => None,
    };
    let wants_spec =
        args.tf_config || opts.has_lists() || (task.is_some() && args.listen.is_none());
    let spec = if wants_spec {
        target::spec(&opts, true)?
    } else {
        None
    };
    let task = task.or_else(|| spec.as_ref().and_then(|s| s.task.clone()));
    let listen = match &args.listen {
        Some(l) => listen_addr(l)?,
        None => match &task {
            Some(t) => target::resolve_task(t, spec.as_ref(), &opts)?.addr,
            None => {
                return Err(Failure::usage(
                    "nothing to listen on: give --listen ADDR, or --task JOB:INDEX with a \
                     cluster spec, or --tf-config",
                ))
            }
        },
    };
    Ok((task, listen))
}

/// The address of `--listen`: an IP address and port, or a host name and port; port 0
/// picks a free port.
fn listen_addr(text: &str) -> Result<SocketAddr, Failure> {
    if let Ok(a) = text.parse::<SocketAddr>() {
        return Ok(a);
    }
    let bad = |e: &dyn std::fmt::Display| Failure::usage(format!("--listen {text}: {e}"));
    match HostPort::parse(text) {
        Ok(hp) => hp.resolve().map_err(|e| bad(&e)),
        Err(AddrError::PortZero) => match text.to_socket_addrs() {
            Ok(mut addrs) => addrs.next().ok_or_else(|| bad(&"no address")),
            Err(e) => Err(bad(&e)),
        },
        Err(e) => Err(bad(&e)),
    }
}

/// Runs `commctl serve` until SIGINT or SIGTERM.
pub fn run(args: &ServeArgs) -> Result<i32, Failure> {
    let mut signals = signals::take()?;
    let (task, listen) = plan(args)?;
    let named = task.is_some();
    let task = task.unwrap_or_else(default_task);
    let mut b = ConfigBuilder::from_env(&task.job, task.index)
        .map_err(|e| Failure::usage(e.to_string()))?;
    if let Some(n) = args.loops {
        b = b.loops(n);
    }
    // The table's checkpoints and the runtime's are one directory: --checkpoint-dir, else
    // STARWIRE_CHECKPOINT_DIR (read by the builder).
    if let Some(dir) = &args.checkpoint_dir {
        b = b.checkpoint_dir(dir.clone());
    }
    let cfg = b.build().map_err(|e| Failure::usage(e.to_string()))?;
    let content = content(args, cfg.checkpoint_dir())?;
    let checkpoints = checkpoints_line(cfg.checkpoint_dir(), content.table.kind);
    let server = Server::start(cfg, listen, &content)?;
    let addr = server.local_addr().unwrap_or(listen);
    {
        let mut out = crate::out::stdout();
        let _ = writeln!(
            out,
            "listening on {addr} as {} ({}{} event loop{}, {} backend; {} tensors of {} B; {})",
            server.task,
            if named { "" } else { "the default task; " },
            server.rt.loops(),
            if server.rt.loops() == 1 { "" } else { "s" },
            server.rt.backend(),
            content.tensors,
            content.tensor_size,
            content.table
        );
        // The table's report (its layout, what the kernel gave), and where its rows came
        // from.
        let (id, _) = server.store.rows_table();
        if let Some(line) = server.store.table(id).and_then(|t| t.report()) {
            let _ = writeln!(out, "{line}");
        }
        let _ = writeln!(out, "{}", server.store.table_start());
        let _ = writeln!(out, "{checkpoints}");
        let _ = out.flush();
    }
    log::info!(
        "{} backend, kernel I/O features in use: {}",
        server.rt.backend(),
        server.rt.report().features()
    );
    log::info!(
        "serving pull and push of ids 0..{} ({} B u8 tensors), recv of keys t/0..t/{}, and \
         PULL_ROWS and PUSH_ROWS of {}",
        content.tensors,
        content.tensor_size,
        content.tensors - 1,
        content.table
    );
    let signal = signals::wait(&mut signals);
    let f = server.stop();
    let stats = f.stats;
    crate::out::errln!(
        "commctl serve: {signal}: stopped after {} connection{}, {} bytes in, {} bytes out, \
         {} tensors taken by recvs, {} pushed; table {}: {} rows pulled ({} missing), \
         {} rows pushed, {} rows stored",
        stats.connections_accepted,
        if stats.connections_accepted == 1 {
            ""
        } else {
            "s"
        },
        stats.bytes_in,
        stats.bytes_out,
        f.received,
        f.pushed,
        content.table.id,
        f.rows.pulled,
        f.rows.missing,
        f.rows.pushed,
        f.rows.stored
    );
    Ok(exit::OK)
}

/// What a checkpoint request to this server does, in one line.
fn checkpoints_line(dir: Option<&Path>, kind: TableKind) -> String {
    match (dir, kind) {
        (Some(dir), TableKind::Ps) => format!(
            "checkpoints: the table is saved into {} when a peer asks (commctl checkpoint)",
            dir.display()
        ),
        (Some(_), TableKind::Mem) => {
            "checkpoints: refused, a MemTable cannot be saved (--table-kind ps can)".to_owned()
        }
        (None, _) => "checkpoints: refused, no checkpoint directory (--checkpoint-dir DIR or \
                      STARWIRE_CHECKPOINT_DIR)"
            .to_owned(),
    }
}

/// The store of `--tensors` and `--tensor-size`, and the table, checked; the table's rows
/// are loaded from `checkpoint_dir`, the task's checkpoint directory, when they are there
/// (a `MemTable` has no checkpoints: it ignores a directory it did not ask for).
fn content(args: &ServeArgs, checkpoint_dir: Option<&Path>) -> Result<Content, Failure> {
    if !(1..=MAX_TENSORS).contains(&args.tensors) {
        return Err(Failure::usage(format!(
            "--tensors {}: expected 1 to {MAX_TENSORS}",
            args.tensors
        )));
    }
    if args.tensor_size > MAX_TENSOR_SIZE {
        return Err(Failure::usage(format!(
            "--tensor-size {}: expected at most {MAX_TENSOR_SIZE} bytes",
            args.tensor_size
        )));
    }
    if args.tensors.saturating_mul(args.tensor_size) > MAX_STORE_BYTES {
        return Err(Failure::usage(format!(
            "--tensors {} x --tensor-size {}: the store would exceed {MAX_STORE_BYTES} bytes",
            args.tensors, args.tensor_size
        )));
    }
    if args.handler_threads > 256 {
        return Err(Failure::usage(format!(
            "--handler-threads {}: expected 0 to 256",
            args.handler_threads
        )));
    }
    let table = TableSpec {
        id: args.table,
        kind: args.table_kind,
        dim: args.dim,
        stored: args.stored,
        init: args.init,
        optimizer: args.optimizer,
        lr: args.lr,
        initial_accumulator: args.initial_accumulator,
        rows: args.rows,
        checkpoint_dir: match (args.table_kind, &args.checkpoint_dir) {
            // From the environment, for another kind of table.
            (TableKind::Mem, None) => None,
            _ => checkpoint_dir.map(Path::to_path_buf),
        },
    };
    table.check().map_err(Failure::usage)?;
    Ok(Content {
        tensors: args.tensors,
        tensor_size: args.tensor_size,
        handler_threads: args.handler_threads,
        table,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{InitSpec, OptimizerKind};

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn one_service_serves_tensors_and_rows() {
        for kind in [TableKind::Ps, TableKind::Mem] {
            let spec = TableSpec {
                id: 5,
                kind,
                dim: 2,
                init: InitSpec::Missing,
                optimizer: OptimizerKind::Sgd,
                lr: 0.5,
                rows: 0,
                ..TableSpec::default()
            };
            let store = Store::with_table(4, 8, &spec).unwrap();
            // Tensors, as before.
            let mut out = Vec::new();
            store.pull(&[1, 9], &mut out);
            assert_eq!(out[0].as_ref().unwrap().bytes(), &[1u8; 8]);
            assert_eq!(out[1], Err(Status::NotFound));
            // Rows: only table 5, which the service lists.
            assert_eq!(store.table_ids(), [5]);
            assert!(store.table(1).is_none());
            let table = store.table(5).expect("table 5");
            assert_eq!((table.dtype(), table.row_dims()), (DType::F32, &[2u64][..]));
            assert_eq!(
                table.push(&[3, 3], &f32_bytes(&[1.0, 2.0, 1.0, 0.0])),
                Status::Ok
            );
            let (mut rows, mut missing) = (vec![0u8; 16], Vec::new());
            assert_eq!(table.pull(&[7, 3], &mut rows, &mut missing), Status::Ok);
            assert_eq!(missing, [0]);
            assert_eq!(rows[8..], f32_bytes(&[-1.0, -1.0]));
            // A wrong length is refused and not counted.
            assert_eq!(table.push(&[3], &[0u8; 4]), Status::InvalidArgument);
            let served = store.rows_table().1.served();
            assert_eq!(
                served,
                RowsServed {
                    pulled: 2,
                    missing: 1,
                    pushed: 2,
                    stored: 1
                },
                "{kind}"
            );
            assert_eq!(store.rows_table().1.get(3), Some(vec![-1.0, -1.0]));
            // The PS table reports itself; the MemTable has no report.
            assert_eq!(table.report().is_some(), kind == TableKind::Ps);
        }
    }
}
