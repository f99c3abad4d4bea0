//! Placing one job on a snapshot of the cluster.

use crate::fit::{Reason, check};
use domain::{Inventory, JobSpec, WorkerId};
use std::fmt;

/// One worker as the scheduler sees it at one instant.
#[derive(Debug, Clone)]
pub struct WorkerView {
    pub id: WorkerId,
    pub name: String,
    pub inventory: Inventory,
    pub online: bool,
    pub slots: u32,
    pub busy_slots: u32,
}

/// The outcome of placing a job: a worker, or every worker's reason. Not an error: "nothing
/// fits" is an ordinary answer that callers print.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Place(WorkerId),
    /// No worker can take it now; each entry is (worker name, why not).
    Unplaceable(Vec<(String, Reason)>),
}

impl Decision {
    /// True when every reason is temporary (busy or offline), so waiting may help.
    pub fn could_run_later(&self) -> bool {
        match self {
            Decision::Place(_) => true,
            Decision::Unplaceable(reasons) => {
                !reasons.is_empty() && reasons.iter().any(|(_, r)| r.is_temporary())
            }
        }
    }
}

impl fmt::Display for Decision {
    /// The block `gpulayer` prints, one line per worker, names aligned.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::Place(id) => write!(f, "scheduling: placed on worker {id}"),
            Decision::Unplaceable(reasons) if reasons.is_empty() => {
                write!(
                    f,
                    "scheduling: no eligible worker\n  (no workers have joined)"
                )
            }
            Decision::Unplaceable(reasons) => {
                let width = reasons.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
                f.write_str("scheduling: no eligible worker")?;
                for (name, reason) in reasons {
                    write!(f, "\n  {name:<width$}  {reason}")?;
                }
                Ok(())
            }
        }
    }
}

/// Places `spec` on the first worker that fits and has a free slot, preferring the least
/// loaded; returns every worker's reason otherwise.
pub fn place(workers: &[WorkerView], spec: &JobSpec) -> Decision {
    let mut reasons = Vec::new();
    let mut best: Option<&WorkerView> = None;
    for w in workers {
        let verdict = if !w.online {
            Err(Reason::Offline)
        } else {
            check(&w.inventory, spec).and(if w.busy_slots >= w.slots {
                Err(Reason::Busy { slots: w.slots })
            } else {
                Ok(())
            })
        };
        match verdict {
            Ok(()) => {
                let load = |v: &WorkerView| f64::from(v.busy_slots) / f64::from(v.slots.max(1));
                if best.is_none_or(|b| load(w) < load(b)) {
                    best = Some(w);
                }
            }
            Err(reason) => reasons.push((w.name.clone(), reason)),
        }
    }
    match best {
        Some(w) => Decision::Place(w.id),
        None => Decision::Unplaceable(reasons),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::Accelerator;
    use domain::fixtures::{cuda_inventory, job};

    fn view(id: i64, name: &str, cuda: usize, online: bool, slots: u32, busy: u32) -> WorkerView {
        WorkerView {
            id: WorkerId(id),
            name: name.into(),
            inventory: cuda_inventory(name, cuda),
            online,
            slots,
            busy_slots: busy,
        }
    }

    #[test]
    fn the_least_loaded_eligible_worker_wins() {
        let workers = [
            view(1, "laptop", 0, true, 2, 1),
            view(2, "gpu-box-1", 1, true, 2, 0),
            view(3, "gpu-box-2", 1, true, 4, 3),
        ];
        assert_eq!(
            place(&workers, &job(Accelerator::Cpu)),
            Decision::Place(WorkerId(2))
        );
        assert_eq!(
            place(&workers, &job(Accelerator::Cuda)),
            Decision::Place(WorkerId(2))
        );
    }

    #[test]
    fn unplaceable_jobs_explain_every_worker() {
        let workers = [
            view(1, "laptop", 0, true, 1, 0),
            view(2, "gpu-box-1", 1, false, 1, 0),
            view(3, "gpu-box-2", 1, true, 1, 1),
        ];
        let decision = place(&workers, &job(Accelerator::Cuda));
        assert_eq!(
            decision.to_string(),
            "scheduling: no eligible worker\n  \
             laptop     needs 1 usable cuda device(s), worker has 0\n  \
             gpu-box-1  worker is offline\n  \
             gpu-box-2  all 1 slot(s) busy"
        );
        assert!(decision.could_run_later());
    }

    #[test]
    fn a_job_no_worker_can_ever_run_is_not_worth_waiting_for() {
        let workers = [view(1, "laptop", 0, true, 1, 0)];
        let decision = place(&workers, &job(Accelerator::Cuda));
        assert!(!decision.could_run_later());
        assert!(!place(&[], &job(Accelerator::Cpu)).could_run_later());
    }
}
