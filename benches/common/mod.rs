//! Helpers shared by the benches: CPU placement, process counters, starwire end
//! configuration, medians.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;
use starwire::config::{BackendChoice, ConfigBuilder};
use starwire::Config;

// ----- starwire end configuration -----

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Uring,
    Epoll,
}

impl Backend {
    pub fn parse(s: &str) -> Backend {
        match s {
            "uring" => Backend::Uring,
            "epoll" => Backend::Epoll,
            _ => panic!("backend {s:?}: expected uring or epoll"),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Backend::Uring => "uring",
            Backend::Epoll => "epoll",
        }
    }
    pub fn choice(self) -> BackendChoice {
        match self {
            Backend::Uring => BackendChoice::Uring,
            Backend::Epoll => BackendChoice::Epoll,
        }
    }
}

/// Everything that defines one starwire end's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwCfg {
    pub backend: Backend,
    pub polling: bool,
    pub spin: Duration,
}

impl SwCfg {
    pub fn config(&self, job: &str) -> Config {
        self.builder(job).build().expect("config")
    }
    /// The builder of [`config`](SwCfg::config), for settings a bench adds.
    pub fn builder(&self, job: &str) -> ConfigBuilder {
        ConfigBuilder::from_env(job, 0)
            .expect("environment")
            .loops(1)
            .pin(true)
            .polling(self.polling)
            .spin(self.spin)
            .backend(self.backend.choice())
    }
    pub fn args(&self) -> Vec<String> {
        vec![
            self.backend.name().into(),
            on_off(self.polling).into(),
            self.spin.as_micros().to_string(),
        ]
    }
    pub fn from_args(a: &[String]) -> SwCfg {
        SwCfg {
            backend: Backend::parse(&a[0]),
            polling: a[1] == "on",
            spin: Duration::from_micros(a[2].parse().expect("spin µs")),
        }
    }
}

/// This bench's arguments: the program name and the `--bench` that `cargo bench` passes
/// dropped.
pub fn bench_args() -> Vec<String> {
    std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect()
}

pub fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

// ----- CPU placement -----

pub fn allowed_cpus() -> Vec<usize> {
    let set = sched_getaffinity(Pid::from_raw(0)).expect("sched_getaffinity");
    (0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect()
}

/// Restricts the calling thread (and the threads it starts afterwards) to `cpu`.
pub fn restrict_to(cpu: usize) {
    let mut set = CpuSet::new();
    set.set(cpu).expect("cpu number");
    sched_setaffinity(Pid::from_raw(0), &set)
        .unwrap_or_else(|e| panic!("sched_setaffinity to CPU {cpu}: {e}"));
}

pub fn restrict_to_set(cpus: &[usize]) {
    let mut set = CpuSet::new();
    for &c in cpus {
        set.set(c).expect("cpu number");
    }
    sched_setaffinity(Pid::from_raw(0), &set).expect("sched_setaffinity");
}

// ----- process counters -----

pub fn rusage(who: libc::c_int) -> libc::rusage {
    // SAFETY: getrusage only writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `who` is RUSAGE_SELF or RUSAGE_THREAD.
    let rc = unsafe { libc::getrusage(who, &mut ru) };
    assert_eq!(rc, 0, "getrusage");
    ru
}

/// Process CPU time (user + system) so far.
pub fn process_cpu_time() -> Duration {
    let ru = rusage(libc::RUSAGE_SELF);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Voluntary context switches (sleeps) of the calling thread so far.
pub fn thread_sleeps() -> u64 {
    rusage(libc::RUSAGE_THREAD).ru_nvcsw as u64
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_string()
}

// ----- statistics -----

/// Median of the values that are not NaN (NaN when there are none).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| !x.is_nan());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "**missed**"
    }
}

// ----- a server in a child process -----

/// A server in a child process: this bench's binary run again as `--server CPU ARGS...`,
/// which prints `ADDR <address>` first, answers lines on stdin, and exits when stdin
/// closes.
pub struct Server {
    pub child: Child,
    pub stdin: ChildStdin,
    pub stdout: BufReader<ChildStdout>,
    pub addr: SocketAddr,
}

impl Server {
    pub fn spawn(cpu: usize, kind: &[String]) -> Server {
        let exe = std::env::current_exe().expect("current_exe");
        let mut child = Command::new(exe)
            .arg("--server")
            .arg(cpu.to_string())
            .args(kind)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn server");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("server address");
        let addr = line
            .trim()
            .strip_prefix("ADDR ")
            .unwrap_or_else(|| panic!("server said {line:?}"))
            .parse()
            .expect("address");
        Server {
            child,
            stdin,
            stdout,
            addr,
        }
    }

    pub fn stop(self) {
        let Server {
            mut child, stdin, ..
        } = self;
        drop(stdin);
        child.wait().ok();
    }
}
