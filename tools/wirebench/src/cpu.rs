//! The CPU time a run costs each end: the server's process and this one (the clients).
//!
//! A run's clients open a [`Meter`]'s window when their load starts (connections open,
//! client threads started) and close it when the load has stopped (every request
//! answered), before they close their connections: setting up and tearing down are left
//! out.
//!
//! A process's CPU time is read from its CPU-time clock (`clock_getcpuclockid`,
//! `clock_gettime`): the kernel's sum of the run time of all its threads, in nanoseconds,
//! threads that have ended included. (The per-thread `/proc/<pid>/task/*/schedstat` would
//! lose a thread's time when it ends, and the raw server's threads end with their
//! connections: at the end of a run, or within one when a connection breaks and is
//! replaced.) Where that clock cannot be read, utime + stime of `/proc/<pid>/stat`: the
//! same process total, in clock ticks (`sysconf(_SC_CLK_TCK)`, as a rule 1/100 s).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::time::ClockId;
use nix::unistd::Pid;

/// A process's CPU time so far.
#[derive(Clone, Copy, Debug)]
pub struct Reading {
    pub time: Duration,
    /// Read in clock ticks from `/proc/<pid>/stat`, the CPU-time clock being unreadable.
    pub ticks: bool,
}

/// The CPU time so far of process `pid`, or of this process for `None`; `None` if neither
/// way can read it.
pub fn read(pid: Option<u32>) -> Option<Reading> {
    let clock = match pid {
        None => Ok(ClockId::CLOCK_PROCESS_CPUTIME_ID),
        Some(p) => ClockId::pid_cpu_clock_id(Pid::from_raw(i32::try_from(p).ok()?)),
    };
    if let Ok(t) = clock.and_then(ClockId::now) {
        return Some(Reading {
            time: t.into(),
            ticks: false,
        });
    }
    let path = pid.map_or("/proc/self/stat".into(), |p| format!("/proc/{p}/stat"));
    let line = std::fs::read_to_string(path).ok()?;
    Some(Reading {
        time: stat_cpu(&line, ticks_per_second()?)?,
        ticks: true,
    })
}

/// Clock ticks a second, the unit of `/proc/<pid>/stat`'s times.
fn ticks_per_second() -> Option<u64> {
    use nix::unistd::{sysconf, SysconfVar};
    let ticks = sysconf(SysconfVar::CLK_TCK).ok()??;
    u64::try_from(ticks).ok().filter(|&t| t > 0)
}

/// utime + stime of a `/proc/<pid>/stat` line (fields 14 and 15, the process's threads
/// together, ended ones included), at `ticks` clock ticks a second.
fn stat_cpu(line: &str, ticks: u64) -> Option<Duration> {
    // Field 2, the command name, is in parentheses and may hold spaces and parentheses of
    // its own: field 3 on follow the last ')'.
    let rest = &line[line.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(14 - 3);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let t = utime.checked_add(stime)?;
    let nanos = (t % ticks) * 1_000_000_000 / ticks;
    Some(Duration::from_secs(t / ticks) + Duration::from_nanos(nanos))
}

/// The CPU time both ends spend over a stretch of wall time.
struct Window {
    server: u32,
    start: Instant,
    srv: Option<Reading>,
    cli: Option<Reading>,
}

/// What a [`Window`] measured, in seconds; NaN where a CPU time could not be read.
#[derive(Clone, Copy, Debug)]
pub struct Spent {
    /// CPU seconds of the server's process.
    pub server: f64,
    /// CPU seconds of this process.
    pub client: f64,
    /// Wall seconds of the window.
    pub wall: f64,
    /// Some CPU time was read in clock ticks (see [`Reading::ticks`]).
    pub ticks: bool,
}

impl Window {
    /// Opens a window on this process and the server's, process `server`.
    fn open(server: u32) -> Window {
        let srv = read(Some(server));
        let cli = read(None);
        Window {
            server,
            start: Instant::now(),
            srv,
            cli,
        }
    }

    fn close(self) -> Spent {
        let wall = self.start.elapsed().as_secs_f64();
        let cli = read(None);
        let srv = read(Some(self.server));
        Spent {
            server: spent(self.srv, srv),
            client: spent(self.cli, cli),
            wall,
            ticks: [self.srv, srv, self.cli, cli]
                .iter()
                .any(|r| r.is_some_and(|r| r.ticks)),
        }
    }
}

/// A run's window on the CPU time of both ends, which its clients open and close from
/// whichever thread starts and stops their load.
pub struct Meter {
    server: u32,
    window: Mutex<Option<Window>>,
    spent: Mutex<Option<Spent>>,
}

impl Meter {
    /// A meter on this process and the server's, process `server`.
    pub fn new(server: u32) -> Meter {
        Meter {
            server,
            window: Mutex::new(None),
            spent: Mutex::new(None),
        }
    }

    /// The load starts: opens the window.
    pub fn start(&self) {
        *self.window.lock().unwrap() = Some(Window::open(self.server));
    }

    /// The load has stopped: closes the window (if it was opened).
    pub fn stop(&self) {
        if let Some(w) = self.window.lock().unwrap().take() {
            *self.spent.lock().unwrap() = Some(w.close());
        }
    }

    /// What the window measured; all NaN if it was not opened and closed.
    pub fn spent(&self) -> Spent {
        self.spent.lock().unwrap().unwrap_or(Spent {
            server: f64::NAN,
            client: f64::NAN,
            wall: f64::NAN,
            ticks: false,
        })
    }
}

/// CPU seconds from `before` to `after`; NaN if either is missing or they were read in
/// different ways.
fn spent(before: Option<Reading>, after: Option<Reading>) -> f64 {
    match (before, after) {
        (Some(b), Some(a)) if a.ticks == b.ticks => a.time.saturating_sub(b.time).as_secs_f64(),
        _ => f64::NAN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `/proc/<pid>/stat` line (Linux 6.x: 52 fields), utime 1234 and stime 56 ticks,
    /// with a command name that holds a space and parentheses.
    const STAT: &str = "4242 (wire (bench) x) S 4200 4242 4200 34816 4242 4194304 1523 0 0 0 1234 56 0 0 20 0 9 0 123456 1234567890 2345 18446744073709551615 1 1 0 0 0 0 0 4096 17664 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n";

    #[test]
    fn stat_line() {
        assert_eq!(stat_cpu(STAT, 100), Some(Duration::from_millis(12_900)));
        // 1290 ticks at 1000 a second; at 300, 4 s and 90/300 of one.
        assert_eq!(stat_cpu(STAT, 1000), Some(Duration::from_millis(1_290)));
        assert_eq!(stat_cpu(STAT, 300), Some(Duration::from_millis(4_300)));
    }

    #[test]
    fn stat_line_cut_short() {
        assert_eq!(stat_cpu("4242 (wirebench) S 4200 4242", 100), None);
        assert_eq!(stat_cpu("4242 wirebench S", 100), None);
        assert_eq!(stat_cpu("", 100), None);
    }

    /// This process's own `/proc/self/stat` agrees with its CPU-time clock, to a tick.
    #[test]
    fn stat_agrees_with_clock() {
        let ticks = ticks_per_second().expect("sysconf(_SC_CLK_TCK)");
        let before = read(None).unwrap().time;
        let line = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
        let after = read(None).unwrap().time;
        let stat = stat_cpu(&line, ticks).expect("a /proc/self/stat line");
        let tick = Duration::from_secs(1) / ticks as u32;
        assert!(stat <= after + tick, "{stat:?} > {after:?}");
        assert!(stat + 2 * tick >= before, "{stat:?} < {before:?}");
    }

    #[test]
    fn own_time_counts_work() {
        let a = read(None).expect("this process's CPU time");
        assert!(!a.ticks, "this process's CPU-time clock is readable");
        // Work until the clock has moved 10 ms (however busy the machine is).
        let t0 = Instant::now();
        let mut x = 0u64;
        while read(None).unwrap().time < a.time + Duration::from_millis(10) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "the clock stands still"
            );
        }
    }

    #[test]
    fn other_process_time() {
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .expect("start sleep");
        let r = read(Some(child.id()));
        let _ = child.kill();
        let _ = child.wait();
        let r = r.expect("the child's CPU time");
        assert!(!r.ticks, "the child's CPU-time clock is readable");
        assert!(r.time < Duration::from_secs(1));
    }
}
