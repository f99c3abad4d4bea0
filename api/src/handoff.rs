//! Idle held polls of this replica, and handing a new job straight to one of them.
//!
//! A worker with room holds a poll open here while it waits. A submit that reaches the same
//! replica and fits such a worker inserts the job and runs that worker's claim in one
//! transaction, then gives the claim to the held poll to answer with: no notification round
//! trip and no second transaction between a submit and its start. The claim is the poll's
//! own (same fence, queue order, scheduler), so an older pending job still goes first, and
//! everything it assigned is in the database before the poll hears of it: an answer lost on
//! the way is handed out again by the worker's next poll, as for any claim.

use crate::error::{ApiError, ApiResult};
use crate::server::AppState;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use store::Claimed;
use tokio::sync::oneshot;

/// A held poll waiting for work, as a submit needs it to claim on its worker's behalf.
#[derive(Debug)]
pub(crate) struct IdlePoll {
    pub seq: u64,
    pub view: scheduler::WorkerView,
    pub running: Vec<(i64, i32)>,
    pub free_slots: u32,
    pub call_room: u32,
    /// Where the claim goes: None when the claim could not run (the poll then claims for
    /// itself, handing out again whatever may have been assigned).
    pub deliver: oneshot::Sender<Option<Vec<Claimed>>>,
    /// When it parked: among the fitting polls, the one idle longest takes the job.
    pub parked_at: std::time::Instant,
}

/// This replica's idle held polls, by worker.
#[derive(Debug, Default)]
pub struct IdlePolls {
    idle: Mutex<HashMap<i64, IdlePoll>>,
}

/// Takes a parked poll off the list when its request ends, however it ends.
#[derive(Debug)]
pub(crate) struct Parked {
    polls: Arc<IdlePolls>,
    worker: i64,
    seq: u64,
}

impl Parked {
    /// Whether the poll was still parked (and now is not): false when a submit took it, and
    /// its claim is on the way.
    pub(crate) fn leave(self) -> bool {
        let left = self.polls.remove(self.worker, self.seq);
        std::mem::forget(self);
        left
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        self.polls.remove(self.worker, self.seq);
    }
}

impl IdlePolls {
    /// Parks the poll of `worker` (replacing an older one of that worker).
    pub(crate) fn park(self: &Arc<Self>, worker: i64, poll: IdlePoll) -> Parked {
        let seq = poll.seq;
        self.idle
            .lock()
            .expect("idle polls lock")
            .insert(worker, poll);
        Parked {
            polls: self.clone(),
            worker,
            seq,
        }
    }

    fn remove(&self, worker: i64, seq: u64) -> bool {
        let mut idle = self.idle.lock().expect("idle polls lock");
        match idle.get(&worker) {
            Some(p) if p.seq == seq => {
                idle.remove(&worker);
                true
            }
            _ => false,
        }
    }

    /// An idle poll whose worker could start `spec` now, taken off the list: the one with
    /// the most free slots, then the one waiting longest, so that new jobs spread over the
    /// idle workers instead of going to whichever polls again first.
    pub(crate) fn take_fitting(&self, spec: &domain::JobSpec) -> Option<(i64, IdlePoll)> {
        if spec.layout.is_gang() {
            return None;
        }
        let mut idle = self.idle.lock().expect("idle polls lock");
        let queued_call = spec.queueable_call();
        let rank = |p: &IdlePoll| (std::cmp::Reverse(p.free_slots), p.parked_at);
        let mut best: Option<(i64, (std::cmp::Reverse<u32>, std::time::Instant))> = None;
        for (worker, p) in idle.iter() {
            let room = p.free_slots > 0
                || (p.call_room > 0
                    && queued_call.is_some()
                    && p.view.inventory.call_python() == queued_call);
            // The scheduler is asked only about a poll that would be chosen over the best
            // so far: a submit holds this lock, and a fleet may have many idle workers.
            if room
                && best.is_none_or(|(_, b)| rank(p) < b)
                && scheduler::fit_now(&p.view, spec).is_ok()
            {
                best = Some((*worker, rank(p)));
            }
        }
        let (worker, _) = best?;
        idle.remove(&worker).map(|p| (worker, p))
    }
}

/// Hands a new job to an idle held poll whose worker could start it now, if there is one on
/// this replica: inserts the job and claims on that poll's behalf in one transaction. The
/// job's id, or None when no such poll waits (then submit the usual way). A job handed over
/// needs no admission: a worker that can start it exists.
pub(crate) async fn submit_to_idle_poll(
    app: &AppState,
    spec: &domain::JobSpec,
    submitted_by: i64,
    idempotency_key: Option<&str>,
) -> ApiResult<Option<i64>> {
    let Some((worker, poll)) = app.idle_polls.take_fitting(spec) else {
        return Ok(None);
    };
    let (store, spec, key) = (
        app.store.clone(),
        spec.clone(),
        idempotency_key.map(String::from),
    );
    // Run to the end even if the submitter goes away: once the claim commits, the poll must
    // hear of it (or, if this fails, find out for itself).
    let work = async move {
        let IdlePoll {
            seq,
            view,
            running,
            free_slots,
            call_room,
            deliver,
            ..
        } = poll;
        let accelerators = view.inventory.runnable_accelerators();
        let round = store::PollRound {
            worker_id: worker,
            seq,
            running: &running,
            finished: &[],
            started: &[],
            reconcile: false,
            accelerators: &accelerators,
            free_slots,
            track_devices: !view.inventory.devices.is_empty(),
            call_room,
            call_python: view.inventory.call_python(),
        };
        let placer = crate::worker_channel::RoundPlacer {
            view: view.clone(),
            gangs_due: false,
        };
        let (id, claimed) = store
            .insert_job_claiming(&spec, Some(submitted_by), key.as_deref(), &round, placer)
            .await?;
        // A poll gone meanwhile finds what was assigned to it with its worker's next poll.
        let _ = deliver.send(claimed);
        Ok::<_, store::StoreError>(id)
    };
    match tokio::spawn(work).await {
        Ok(id) => Ok(Some(id?)),
        Err(e) => Err(ApiError::Internal(format!("store task failed: {e}"))),
    }
}
