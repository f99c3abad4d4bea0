//! One poll's worth of queue work in one transaction: the ends and starts the worker reports,
//! the tasks it forgot, the stop orders for what it runs, and a claim for its free slots. One
//! commit and a handful of round trips however many tasks the poll reports or takes.

use crate::gangs::Placer;
use crate::queue::{
    Claimed, PollContext, ROUND_BEGIN, StopReason, claim_calls_in, claim_in, fail_forgotten_in,
    stop_orders_in,
};
use crate::reports::{FinishReport, StartReport, finish_tasks_in, record_starts_in};
use crate::{Result, Store, StoreError};
use domain::Accelerator;

/// What one poll asks of the queue.
#[derive(Debug, Clone, Copy)]
pub struct PollRound<'a> {
    pub worker_id: i64,
    /// The poll's sequence number: an older poll than the worker's newest claims nothing.
    pub seq: u64,
    /// `(task, attempt)` of every task the worker runs.
    pub running: &'a [(i64, i32)],
    pub finished: &'a [FinishReport],
    pub started: &'a [StartReport],
    /// An earlier poll's answer may have been lost (it failed, or the worker dropped it):
    /// hand out again what the worker was assigned and does not run, and fail the tasks it
    /// reported started and no longer runs.
    pub reconcile: bool,
    pub accelerators: &'a [Accelerator],
    pub free_slots: u32,
    /// Whether the worker has devices (claims then ask the scheduler about each task).
    pub track_devices: bool,
    /// Queueable remote calls the worker takes beyond its free slots, and its Python
    /// `major.minor` (see `JobSpec::queueable_call`).
    pub call_room: u32,
    pub call_python: Option<&'a str>,
}

/// What the queue answers a poll.
#[derive(Debug, Clone)]
pub struct RoundOutcome {
    /// Reported ends refused: those tasks are no longer the worker's.
    pub lost: Vec<(i64, i32)>,
    pub stop: Vec<(i64, i32, StopReason)>,
    /// None when the worker has sent a newer poll: this one's answer will not be read.
    pub claimed: Option<Vec<Claimed>>,
}

impl Store {
    /// Runs `round` in one transaction; `placer` as for [`Store::claim_batch`]. Fails with
    /// `WorkerLost` (and records nothing) when the worker was declared lost.
    pub async fn poll_round(
        &self,
        round: &PollRound<'_>,
        mut placer: impl Placer,
    ) -> Result<RoundOutcome> {
        let worker_id = round.worker_id;
        let ids: Vec<i64> = round.running.iter().map(|r| r.0).collect();
        let mut tx = self.pool().begin_with(ROUND_BEGIN).await?;
        // Ends first: a task's end and its start travel together only as an end.
        let lost = finish_tasks_in(&mut tx, worker_id, round.finished).await?;
        record_starts_in(&mut tx, worker_id, round.started).await?;
        if round.reconcile {
            fail_forgotten_in(&mut tx, worker_id, &ids).await?;
        }
        let stop = stop_orders_in(&mut *tx, worker_id, round.running).await?;
        let mut claimed = if round.free_slots == 0 {
            // No claim to record the heartbeat (and to notice a lost worker) with.
            crate::workers::heartbeat_in(&mut *tx, worker_id).await?;
            Some(vec![])
        } else {
            // After a failed or dropped poll, an answer with assignments may have been lost.
            let poll = PollContext {
                seq: round.seq,
                running: &ids,
                redeliver: round.reconcile,
            };
            let claim = claim_in(
                &mut tx,
                worker_id,
                round.accelerators,
                round.free_slots,
                round.track_devices,
                poll,
                &mut placer,
            )
            .await;
            match claim {
                Ok(claimed) => Some(claimed),
                // The claim wrote nothing; the reports recorded above stand.
                Err(StoreError::PollSuperseded(_)) => None,
                Err(e) => return Err(e),
            }
        };
        if let (Some(taken), Some(python)) = (claimed.as_mut(), round.call_python)
            && round.call_room > 0
        {
            let calls = claim_calls_in(
                &mut tx,
                worker_id,
                round.seq,
                python,
                round.accelerators,
                round.call_room,
            )
            .await?;
            taken.extend(calls);
        }
        tx.commit().await?;
        Ok(RoundOutcome {
            lost,
            stop,
            claimed,
        })
    }
}
