//! The `commctl serve` that bench starts when it is given no target.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use crate::cli::BenchArgs;
use crate::exit::Failure;
use crate::table::{float_name, TableKind};

/// A `commctl serve` started by bench; stopped (SIGTERM) when dropped.
pub(super) struct Spawned {
    child: Child,
    pub addr: SocketAddr,
}

impl Spawned {
    pub(super) fn start(args: &BenchArgs, dim: usize, rows: u64) -> Result<Spawned, Failure> {
        let exe = std::env::current_exe()
            .map_err(|e| Failure::usage(format!("cannot find the commctl binary: {e}")))?;
        let mut child = Command::new(exe)
            .args(["serve", "--listen", "127.0.0.1:0", "--loops"])
            .arg(args.server_loops.to_string())
            .arg("--tensors")
            .arg(args.variables.to_string())
            .arg("--tensor-size")
            .arg(args.tensor_size.to_string())
            .arg("--table")
            .arg(args.table.to_string())
            .arg("--dim")
            .arg(dim.to_string())
            .arg("--rows")
            .arg(rows.to_string())
            .arg("--table-kind")
            .arg(match args.table_kind {
                TableKind::Ps => "ps",
                TableKind::Mem => "mem",
            })
            .arg("--stored")
            .arg(float_name(args.stored))
            .arg("--optimizer")
            .arg(args.optimizer.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Failure::usage(format!("cannot start commctl serve: {e}")))?;
        let mut line = String::new();
        if let Some(stdout) = child.stdout.take() {
            let _ = BufReader::new(stdout).read_line(&mut line);
        }
        let addr = line
            .strip_prefix("listening on ")
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|a| a.parse::<SocketAddr>().ok());
        match addr {
            Some(addr) => {
                // Drain stderr so the server never blocks on it.
                if let Some(mut err) = child.stderr.take() {
                    let _ = std::thread::Builder::new()
                        .name("commctl-serve-stderr".into())
                        .spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
                }
                Ok(Spawned { child, addr })
            }
            None => {
                let mut why = String::new();
                if let Some(err) = child.stderr.take() {
                    let _ = err.take(4096).read_to_string(&mut why);
                }
                let _ = child.kill();
                let _ = child.wait();
                Err(Failure::usage(format!(
                    "the server did not start: {}",
                    why.trim().trim_start_matches("commctl: ")
                )))
            }
        }
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}
