//! Where a task's CPU time goes: the time its threads ran and the time they were ready to
//! run but waited for a CPU, from Linux's scheduler statistics of each thread
//! (`/proc/self/task/*/schedstat`). On a machine with fewer CPUs than busy threads the wait
//! is the part of a step that no overlap of communication with computation can hide.

use std::time::Duration;

/// A process's CPU time and its threads' wait for a CPU, so far (threads that have ended
/// are not counted).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu {
    pub ran: Duration,
    pub waited: Duration,
}

impl Cpu {
    /// This process, now; zero where the statistics cannot be read (not Linux).
    pub fn now() -> Cpu {
        let mut sum = Cpu::default();
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return sum;
        };
        for task in tasks.flatten() {
            let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else {
                continue;
            };
            let mut f = text
                .split_whitespace()
                .map(|v| v.parse::<u64>().unwrap_or(0));
            sum.ran += Duration::from_nanos(f.next().unwrap_or(0));
            sum.waited += Duration::from_nanos(f.next().unwrap_or(0));
        }
        sum
    }

    /// What happened between `earlier` and this.
    pub fn since(self, earlier: Cpu) -> Cpu {
        Cpu {
            ran: self.ran.saturating_sub(earlier.ran),
            waited: self.waited.saturating_sub(earlier.waited),
        }
    }
}
