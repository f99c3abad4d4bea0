//! Whether one worker can run one job, and if not, why.

use domain::{Accelerator, Inventory, JobSpec};
use std::fmt;

/// Why a worker cannot take a job. Displayed as the line `gpulayer` prints for that worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// The job needs devices of a kind the worker has too few of.
    NeedsDevices {
        kind: Accelerator,
        needed: usize,
        has: usize,
    },
    /// The worker is not connected (its lease ran out).
    Offline,
    /// The worker could run it, but every slot is busy right now.
    Busy { slots: u32 },
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NeedsDevices { kind, needed, has } => {
                write!(
                    f,
                    "needs {needed} usable {kind} device(s), worker has {has}"
                )
            }
            Reason::Offline => f.write_str("worker is offline"),
            Reason::Busy { slots } => write!(f, "all {slots} slot(s) busy"),
        }
    }
}

impl Reason {
    /// Whether the worker could take the job once it frees up (as opposed to never).
    pub fn is_temporary(&self) -> bool {
        matches!(self, Reason::Busy { .. } | Reason::Offline)
    }
}

/// Checks the job's hardware needs against the worker's inventory, ignoring current load.
pub fn check(worker: &Inventory, spec: &JobSpec) -> Result<(), Reason> {
    let kind = spec.accelerator;
    if !kind.needs_device() {
        return Ok(());
    }
    let has = worker.count(kind);
    let needed = 1;
    if has < needed {
        return Err(Reason::NeedsDevices { kind, needed, has });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::fixtures::{inventory, job};

    #[test]
    fn accelerator_needs_are_checked_against_devices() {
        use Accelerator::*;
        let cases: &[(&[Accelerator], Accelerator, Result<(), &str>)] = &[
            (&[], Cpu, Ok(())),
            (&[], Any, Ok(())),
            (&[Cuda], Any, Ok(())),
            (&[Cuda], Cuda, Ok(())),
            (
                &[],
                Cuda,
                Err("needs 1 usable cuda device(s), worker has 0"),
            ),
            (
                &[Cuda, Cuda],
                Mps,
                Err("needs 1 usable mps device(s), worker has 0"),
            ),
            (&[Mps], Mps, Ok(())),
        ];
        for (devices, wants, expect) in cases {
            let got = check(&inventory("w", devices), &job(*wants)).map_err(|r| r.to_string());
            assert_eq!(
                got,
                expect.map_err(str::to_string),
                "{devices:?} running {wants}"
            );
        }
    }
}
