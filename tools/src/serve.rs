//! `commctl serve`: a standalone starwire server.
//!
//! The server is the runtime in listening mode: its event loops answer pings themselves.
//! Request kinds that need a service behind them (recv, pull, push) are answered by the
//! service given to the runtime, once the runtime takes one; [`Server::start`] is where it
//! will be passed.

use std::io::Write;
use std::net::{SocketAddr, ToSocketAddrs};

use starwire::cluster::TaskId;
use starwire::config::ConfigBuilder;
use starwire::endpoint_map::{AddrError, HostPort};
use starwire::{Config, Runtime, Stats};

use crate::cli::ServeArgs;
use crate::exit::{self, Failure};
use crate::signals;
use crate::target;

/// A running server.
pub struct Server {
    rt: Runtime,
    task: TaskId,
}

impl Server {
    /// Starts the loops on `listen`.
    pub fn start(cfg: Config, listen: SocketAddr) -> Result<Server, Failure> {
        let task = TaskId::new(&cfg.job, cfg.task_index);
        let rt = Runtime::start(cfg, Some(listen)).map_err(|e| {
            let hint = match e.kind() {
                std::io::ErrorKind::AddrNotAvailable => {
                    " (not an address of this host; try --listen 0.0.0.0:PORT)"
                }
                std::io::ErrorKind::AddrInUse => " (another process listens there)",
                std::io::ErrorKind::PermissionDenied => " (ports below 1024 need privileges)",
                _ => "",
            };
            Failure::usage(format!("cannot listen on {listen}: {e}{hint}"))
        })?;
        Ok(Server { rt, task })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.rt.local_addr()
    }

    /// Stops the loops; returns the final counters.
    pub fn stop(self) -> Stats {
        let stats = self.rt.stats();
        self.rt.shutdown();
        stats
    }
}

/// What to serve as, and where.
fn plan(args: &ServeArgs) -> Result<(TaskId, SocketAddr), Failure> {
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
    Ok((task.unwrap_or_else(|| TaskId::new("ps", 0)), listen))
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
    signals::block()?;
    let (task, listen) = plan(args)?;
    let mut b = ConfigBuilder::from_env(&task.job, task.index)
        .map_err(|e| Failure::usage(e.to_string()))?;
    if let Some(n) = args.loops {
        b = b.loops(n);
    }
    let cfg = b.build().map_err(|e| Failure::usage(e.to_string()))?;
    let server = Server::start(cfg, listen)?;
    let addr = server.local_addr().unwrap_or(listen);
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "listening on {addr} as {} ({} event loop{}, {} backend)",
            server.task,
            server.rt.loops(),
            if server.rt.loops() == 1 { "" } else { "s" },
            server.rt.backend()
        );
        let _ = out.flush();
    }
    let signal = signals::wait();
    let stats = server.stop();
    eprintln!(
        "commctl serve: {signal}: stopped after {} connection{}, {} bytes in, {} bytes out",
        stats.connections_accepted,
        if stats.connections_accepted == 1 {
            ""
        } else {
            "s"
        },
        stats.bytes_in,
        stats.bytes_out
    );
    Ok(exit::OK)
}
