//! What the process-level tests of commctl share: the binary run with a clean starwire
//! environment, a running `commctl serve`, scratch folders.
#![allow(dead_code)] // each test binary uses its part

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The binary under test.
pub const COMMCTL: &str = env!("CARGO_BIN_EXE_commctl");

/// `commctl ARGS` with a clean starwire environment (the backend choice is kept: CI runs
/// the suite once per backend).
pub fn commctl(args: &[&str]) -> Command {
    let mut c = Command::new(COMMCTL);
    c.args(args)
        .env_remove("TF_CONFIG")
        .env_remove("TF_SEASTAR_ENDPOINT_MAP_PATH")
        .env_remove("STARWIRE_CLUSTER_ID")
        .env_remove("STARWIRE_CLUSTER_TOKEN")
        .env_remove("STARWIRE_CHECKPOINT_DIR")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    c
}

/// A finished run: its exit code and output.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` to its end.
pub fn run(cmd: &mut Command) -> Run {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("commctl runs");
    Run {
        code: status.code().expect("exited, not killed"),
        stdout: String::from_utf8(stdout).unwrap(),
        stderr: String::from_utf8(stderr).unwrap(),
    }
}

/// A scratch folder, removed at the end.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("commctl-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `commctl serve`; SIGKILLed if the test ends without stopping it.
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    /// The first line it printed: `listening on ...`.
    pub line: String,
    /// The lines it printed after it.
    pub more: mpsc::Receiver<String>,
}

impl Server {
    /// `commctl serve ARGS` with `env`, once it prints its address.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut cmd = commctl(&["serve"]);
        cmd.args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Server::from_child(cmd.spawn().expect("serve starts"))
    }

    /// A started `commctl serve` with piped stdout and stderr, once it prints its address.
    pub fn from_child(mut child: Child) -> Server {
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut out = BufReader::new(stdout);
            loop {
                let mut line = String::new();
                match out.read_line(&mut line) {
                    Ok(n) if n > 0 && tx.send(line).is_ok() => {}
                    _ => return,
                }
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("serve prints its address");
        let addr = line
            .strip_prefix("listening on ")
            .and_then(|r| r.split_whitespace().next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        Server {
            child,
            addr,
            line,
            more: rx,
        }
    }

    /// The next line it printed after the first.
    pub fn next_line(&self) -> String {
        self.more
            .recv_timeout(Duration::from_secs(20))
            .expect("serve prints its start-up lines")
    }

    /// Sends `sig`; the exit code and stderr.
    pub fn signal(&mut self, sig: &str) -> (i32, String) {
        let ok = Command::new("kill")
            .args(["-s", sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
        let out = std::mem::replace(&mut self.child, Command::new("true").spawn().unwrap())
            .wait_with_output()
            .unwrap();
        (
            out.status.code().expect("exits, not killed"),
            String::from_utf8(out.stderr).unwrap(),
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `v` as string slices.
pub fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}
