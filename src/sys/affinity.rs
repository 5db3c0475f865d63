//! CPU affinity: the CPUs this process may run on, and pinning a loop thread to one.
//!
//! CPUs are chosen from `sched_getaffinity`, never from the machine's CPU count: containers
//! and `taskset` restrict the set. Pin in the loop thread before it allocates its state.

use std::fmt;
use std::io;

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// The CPUs the calling thread may run on, ascending. Never empty on success.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    let set = sched_getaffinity(Pid::from_raw(0))?;
    let cpus: Vec<usize> = (0..CpuSet::count())
        .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
        .collect();
    if cpus.is_empty() {
        return Err(io::Error::other(
            "sched_getaffinity returned an empty CPU set",
        ));
    }
    Ok(cpus)
}

/// Why a thread could not be pinned.
#[derive(Debug)]
pub enum PinError {
    /// The CPU is not in this thread's allowed set.
    NotAllowed {
        /// The CPU asked for.
        cpu: usize,
        /// The CPUs that are allowed.
        allowed: Vec<usize>,
    },
    /// Reading the allowed set failed.
    Query(io::Error),
    /// `sched_setaffinity` failed.
    Syscall {
        /// The CPU asked for.
        cpu: usize,
        /// The syscall's error.
        source: io::Error,
    },
}

impl fmt::Display for PinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PinError::NotAllowed { cpu, allowed } => write!(
                f,
                "cannot pin to CPU {cpu}: not in this process's allowed CPU set {}",
                CpuList(allowed)
            ),
            PinError::Query(err) => write!(f, "cannot read the allowed CPU set: {err}"),
            PinError::Syscall { cpu, source } => {
                write!(f, "sched_setaffinity to CPU {cpu} failed: {source}")
            }
        }
    }
}

impl std::error::Error for PinError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PinError::NotAllowed { .. } => None,
            PinError::Query(err) | PinError::Syscall { source: err, .. } => Some(err),
        }
    }
}

impl From<PinError> for io::Error {
    fn from(err: PinError) -> io::Error {
        let kind = match &err {
            PinError::NotAllowed { .. } => io::ErrorKind::InvalidInput,
            PinError::Query(e) | PinError::Syscall { source: e, .. } => e.kind(),
        };
        io::Error::new(kind, err)
    }
}

/// Formats a CPU list compactly, as `taskset -c` does: `0-3,6,8-9`.
struct CpuList<'a>(&'a [usize]);

impl fmt::Display for CpuList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut i = 0;
        let cpus = self.0;
        let mut first = true;
        while i < cpus.len() {
            let start = cpus[i];
            let mut end = start;
            while i + 1 < cpus.len() && cpus[i + 1] == end + 1 {
                i += 1;
                end = cpus[i];
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
            i += 1;
        }
        if first {
            f.write_str("(empty)")?;
        }
        Ok(())
    }
}

/// Pins the calling thread to `cpu`, which must be in [`allowed_cpus`].
pub fn pin_current_thread(cpu: usize) -> Result<(), PinError> {
    let allowed = allowed_cpus().map_err(PinError::Query)?;
    if !allowed.contains(&cpu) {
        return Err(PinError::NotAllowed { cpu, allowed });
    }
    let mut set = CpuSet::new();
    set.set(cpu).map_err(|e| PinError::Syscall {
        cpu,
        source: e.into(),
    })?;
    sched_setaffinity(Pid::from_raw(0), &set).map_err(|e| PinError::Syscall {
        cpu,
        source: e.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_cpus_is_non_empty_and_sorted() {
        let cpus = allowed_cpus().unwrap();
        assert!(!cpus.is_empty());
        assert!(cpus.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn pin_to_first_allowed_cpu() {
        // In a separate thread: pinning the test runner's thread would constrain other tests.
        std::thread::spawn(|| {
            let first = allowed_cpus().unwrap()[0];
            pin_current_thread(first).unwrap();
            assert_eq!(allowed_cpus().unwrap(), vec![first]);
            assert_eq!(nix::sched::sched_getcpu().unwrap(), first);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn pin_to_absurd_cpu_errors_clearly() {
        let err = pin_current_thread(100_000).unwrap_err();
        assert!(
            matches!(err, PinError::NotAllowed { cpu: 100_000, .. }),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("100000") && msg.contains("allowed CPU set"),
            "{msg}"
        );
        let io_err: io::Error = err.into();
        assert_eq!(io_err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn cpu_list_is_compact() {
        assert_eq!(CpuList(&[0, 1, 2, 3, 6, 8, 9]).to_string(), "0-3,6,8-9");
        assert_eq!(CpuList(&[5]).to_string(), "5");
        assert_eq!(CpuList(&[]).to_string(), "(empty)");
    }
}
