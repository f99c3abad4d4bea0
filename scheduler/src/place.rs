//! Placing one job on a snapshot of the cluster, and explaining the outcome per worker.

use crate::devices;
use crate::fit::{Reason, check, suitable_devices};
use domain::{Inventory, JobSpec, WorkerId};
use std::collections::BTreeMap;
use std::fmt;

/// One worker as the scheduler sees it at one instant.
#[derive(Debug, Clone)]
pub struct WorkerView {
    pub id: WorkerId,
    pub name: String,
    pub inventory: Inventory,
    pub labels: BTreeMap<String, String>,
    pub online: bool,
    pub slots: u32,
    pub busy_slots: u32,
    /// Indices of this worker's devices that running tasks hold.
    pub busy_devices: Vec<u32>,
}

/// One worker's verdict on one job: `None` means eligible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub worker: String,
    pub reason: Option<Reason>,
}

/// Where a job goes, or why nowhere. "Nothing fits" is an ordinary answer, not an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// This worker, with these device indices (empty for jobs that need none).
    Place { worker: WorkerId, devices: Vec<u32> },
    /// No worker can take it now; every worker's reason.
    Unplaceable(Vec<Verdict>),
}

impl Decision {
    /// True when some reason is temporary (busy or offline), so waiting may help.
    pub fn could_run_later(&self) -> bool {
        match self {
            Decision::Place { .. } => true,
            Decision::Unplaceable(v) => v
                .iter()
                .any(|v| v.reason.as_ref().is_none_or(Reason::is_temporary)),
        }
    }
}

/// The verdict of every online worker on `spec`, ignoring what is busy now: what submit
/// checks before it stores a job.
pub fn eligibility(workers: &[WorkerView], spec: &JobSpec) -> Vec<Verdict> {
    workers
        .iter()
        .filter(|w| w.online)
        .map(|w| Verdict {
            worker: w.name.clone(),
            reason: check(&w.inventory, &w.labels, spec).err(),
        })
        .collect()
}

/// True when at least one verdict is eligible.
pub fn any_eligible(verdicts: &[Verdict]) -> bool {
    verdicts.iter().any(|v| v.reason.is_none())
}

/// The block `gpulayer` prints: a header, then one aligned line per worker.
#[derive(Debug)]
pub struct VerdictTable<'a>(pub &'a [Verdict]);

impl fmt::Display for VerdictTable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let eligible = self.0.iter().filter(|v| v.reason.is_none()).count();
        match eligible {
            0 => f.write_str("scheduling: no eligible worker")?,
            n => write!(f, "scheduling: {n} eligible worker(s)")?,
        }
        if self.0.is_empty() {
            return f.write_str("\n  (no workers online)");
        }
        let width = self.0.iter().map(|v| v.worker.len()).max().unwrap_or(0);
        for v in self.0 {
            let why = v
                .reason
                .as_ref()
                .map(Reason::to_string)
                .unwrap_or_else(|| "eligible".into());
            write!(f, "\n  {:<width$}  {why}", v.worker)?;
        }
        Ok(())
    }
}

/// Decides for one worker, counting what is busy: the devices it would give, or why not.
pub fn fit_now(w: &WorkerView, spec: &JobSpec) -> Result<Vec<u32>, Reason> {
    if !w.online {
        return Err(Reason::Offline);
    }
    check(&w.inventory, &w.labels, spec)?;
    if w.busy_slots >= w.slots {
        return Err(Reason::Busy { slots: w.slots });
    }
    let needed = spec.devices_per_node();
    if needed == 0 {
        return Ok(vec![]);
    }
    let free: Vec<u32> = suitable_devices(&w.inventory, spec)
        .into_iter()
        .filter(|d| !w.busy_devices.contains(d))
        .collect();
    let topology = w
        .inventory
        .topology
        .as_ref()
        .filter(|_| spec.accelerator == domain::Accelerator::Cuda);
    devices::choose(&free, needed as usize, topology).ok_or(Reason::DevicesBusy {
        kind: spec.accelerator,
        needed,
        free: free.len() as u32,
    })
}

/// Places `spec` on the least loaded worker that can take it now.
pub fn place(workers: &[WorkerView], spec: &JobSpec) -> Decision {
    let mut verdicts = Vec::new();
    let mut best: Option<(&WorkerView, Vec<u32>)> = None;
    let load = |v: &WorkerView| f64::from(v.busy_slots) / f64::from(v.slots.max(1));
    for w in workers {
        match fit_now(w, spec) {
            Ok(devices) => {
                if best.as_ref().is_none_or(|(b, _)| load(w) < load(b)) {
                    best = Some((w, devices));
                }
                verdicts.push(Verdict {
                    worker: w.name.clone(),
                    reason: None,
                });
            }
            Err(reason) => verdicts.push(Verdict {
                worker: w.name.clone(),
                reason: Some(reason),
            }),
        }
    }
    match best {
        Some((w, devices)) => Decision::Place {
            worker: w.id,
            devices,
        },
        None => Decision::Unplaceable(verdicts),
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
            labels: BTreeMap::new(),
            online,
            slots,
            busy_slots: busy,
            busy_devices: vec![],
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
            Decision::Place {
                worker: WorkerId(2),
                devices: vec![]
            }
        );
        assert_eq!(
            place(&workers, &job(Accelerator::Cuda)),
            Decision::Place {
                worker: WorkerId(2),
                devices: vec![0]
            }
        );
    }

    #[test]
    fn unplaceable_jobs_explain_every_worker() {
        let mut busy_gpus = view(4, "gpu-box-3", 2, true, 4, 1);
        busy_gpus.busy_devices = vec![0, 1];
        let workers = [
            view(1, "laptop", 0, true, 1, 0),
            view(2, "gpu-box-1", 1, false, 1, 0),
            view(3, "gpu-box-2", 1, true, 1, 1),
            busy_gpus,
        ];
        let Decision::Unplaceable(verdicts) = place(&workers, &job(Accelerator::Cuda)) else {
            panic!("nothing is free");
        };
        assert_eq!(
            VerdictTable(&verdicts).to_string(),
            "scheduling: no eligible worker\n  \
             laptop     needs 1 usable cuda device(s), worker has 0\n  \
             gpu-box-1  worker is offline\n  \
             gpu-box-2  all 1 slot(s) busy\n  \
             gpu-box-3  needs 1 free cuda device(s), 0 free now"
        );
        assert!(Decision::Unplaceable(verdicts).could_run_later());
    }

    #[test]
    fn eligibility_ignores_load_and_offline_workers() {
        let workers = [
            view(1, "laptop", 0, true, 1, 0),
            view(2, "gpu-box", 1, true, 1, 1),
            view(3, "gone", 4, false, 1, 0),
        ];
        let verdicts = eligibility(&workers, &job(Accelerator::Cuda));
        assert_eq!(
            VerdictTable(&verdicts).to_string(),
            "scheduling: 1 eligible worker(s)\n  laptop   needs 1 usable cuda device(s), worker has 0\n  gpu-box  eligible"
        );
        assert!(any_eligible(&verdicts));
        assert!(!any_eligible(&eligibility(
            &workers[..1],
            &job(Accelerator::Cuda)
        )));
    }
}
