//! Which CPU each event loop pins to.

use std::error::Error;
use std::fmt;

/// The CPU each of `loops` event loops pins to: the first `loops` CPUs of `allowed` (the
/// process's allowed set, as `sched_getaffinity` reports it), in order, one loop per CPU.
///
/// Fails when there are fewer allowed CPUs than loops; [`Config::loop_count`] never asks
/// for more.
///
/// [`Config::loop_count`]: super::Config::loop_count
pub fn pin_plan(loops: usize, allowed: &[usize]) -> Result<Vec<usize>, PinPlanError> {
    match allowed.get(..loops) {
        Some(cpus) => Ok(cpus.to_vec()),
        None => Err(PinPlanError {
            loops,
            allowed: allowed.to_vec(),
        }),
    }
}

/// More loops to pin than allowed CPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinPlanError {
    loops: usize,
    allowed: Vec<usize>,
}

impl PinPlanError {
    /// The number of loops that were to be pinned.
    pub fn loops(&self) -> usize {
        self.loops
    }

    /// The CPUs the process may run on.
    pub fn allowed(&self) -> &[usize] {
        &self.allowed
    }
}

impl fmt::Display for PinPlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot pin {} event loops to one CPU each: this process may run on only {} CPUs ({})",
            self.loops,
            self.allowed.len(),
            CpuList(&self.allowed)
        )
    }
}

impl Error for PinPlanError {}

/// Formats a CPU list compactly: `0-3,6,8-9`.
pub(crate) struct CpuList<'a>(pub(crate) &'a [usize]);

impl fmt::Display for CpuList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let mut rest = self.0;
        let mut first = true;
        while let Some((&start, _)) = rest.split_first() {
            let mut run = 1;
            while rest
                .get(run)
                .is_some_and(|&cpu| Some(cpu) == start.checked_add(run))
            {
                run += 1;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if run == 1 {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{}", start + run - 1)?;
            }
            rest = &rest[run..];
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_plan_takes_allowed_cpus_in_order() {
        assert_eq!(pin_plan(3, &[2, 3, 5, 7]).unwrap(), vec![2, 3, 5]);
        assert_eq!(pin_plan(4, &[2, 3, 5, 7]).unwrap(), vec![2, 3, 5, 7]);
        assert_eq!(pin_plan(0, &[0]).unwrap(), Vec::<usize>::new());

        assert_eq!(pin_plan(5, &[0, 1, 2, 3, 8]).unwrap().len(), 5);
        let err = pin_plan(6, &[0, 1, 2, 3, 8]).unwrap_err();
        assert_eq!(err.loops(), 6);
        assert_eq!(err.allowed(), &[0, 1, 2, 3, 8]);
        assert_eq!(
            err.to_string(),
            "cannot pin 6 event loops to one CPU each: this process may run on only 5 CPUs (0-3,8)"
        );
        assert!(pin_plan(1, &[])
            .unwrap_err()
            .to_string()
            .ends_with("(none)"));
    }

    #[test]
    fn cpu_list_format() {
        assert_eq!(CpuList(&[0, 1, 2, 3, 6, 8, 9]).to_string(), "0-3,6,8-9");
        assert_eq!(CpuList(&[5]).to_string(), "5");
        assert_eq!(CpuList(&[1, 3]).to_string(), "1,3");
        assert_eq!(CpuList(&[usize::MAX]).to_string(), usize::MAX.to_string());
    }
}
