//! One poll's worth of queue work in one transaction: the ends and starts the worker reports,
//! the tasks it forgot, the stop orders for what it runs, and a claim for its free slots. One
//! commit and a handful of round trips however many tasks the poll reports or takes (a worker
//! reporting its last calls' ends commits them first, for their waiting callers).

use crate::gangs::Placer;
use crate::queue::{
    Claimed, PollContext, ROUND_BEGIN, StopReason, claim_calls_in, claim_in, fail_forgotten_in,
    stop_orders_in,
};
use crate::reports::{FinishReport, StartReport, finish_tasks_in, record_starts_in};
use crate::wakeups::Channel;
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
        // A worker that ran out of calls: their callers wait for these ends, and the worker
        // usually finds nothing else to take. The ends go out with a commit of their own, and
        // one read replaces the claim's transaction and commit when nothing waits (a held
        // poll still claims when woken, and re-checks every few seconds).
        if !round.reconcile
            && round.running.is_empty()
            && round.finished.iter().any(|f| f.completion.call.is_some())
        {
            tx.commit().await?;
            if !self
                .anything_to_claim(worker_id, round.accelerators)
                .await?
            {
                return Ok(RoundOutcome {
                    lost,
                    stop: vec![],
                    claimed: Some(vec![]),
                });
            }
            tx = self.pool().begin_with(ROUND_BEGIN).await?;
        }
        let stop = stop_orders_in(&mut *tx, worker_id, round.running).await?;
        let claimed = claim_for_poll_in(&mut tx, round, &mut placer, true).await?;
        tx.commit().await?;
        Ok(RoundOutcome {
            lost,
            stop,
            claimed,
        })
    }
}

impl Store {
    /// Inserts a pending job and, in the same transaction, runs the claim of `round`: a
    /// worker's held poll (reporting nothing) that waits on this replica. Returns the job's
    /// id and what the claim took for that poll to answer with: usually the new job, an
    /// older one first if one waits that the worker can run; None when the claim could not
    /// run (the worker has sent a newer poll, or was declared lost). The job's wake-up goes
    /// out unless the claim took it.
    pub async fn insert_job_claiming(
        &self,
        spec: &domain::JobSpec,
        submitted_by: Option<i64>,
        idempotency_key: Option<&str>,
        round: &PollRound<'_>,
        mut placer: impl Placer,
    ) -> Result<(i64, Option<Vec<Claimed>>)> {
        debug_assert!(round.finished.is_empty() && round.started.is_empty() && !round.reconcile);
        let mut tx = self.pool().begin_with(ROUND_BEGIN).await?;
        let keys = [idempotency_key.map(str::to_string)];
        let id = crate::jobs::insert_chunk_in(
            &mut tx,
            std::slice::from_ref(spec),
            submitted_by,
            &keys,
            false,
        )
        .await?[0];
        let direct = if spec.devices_per_node() == 0 && !spec.layout.is_gang() {
            assign_new_in(&mut tx, round, id).await?
        } else {
            None
        };
        let claimed = match direct {
            Some((task_id, attempt)) => Some(vec![Claimed {
                job_id: id,
                task_id,
                attempt,
                spec: spec.clone(),
                devices: vec![],
                node: 0,
            }]),
            None => match claim_for_poll_in(&mut tx, round, &mut placer, false).await {
                Ok(claimed) => claimed,
                // Lost meanwhile: the job waits for another worker.
                Err(StoreError::WorkerLost(_)) => None,
                Err(e) => return Err(e),
            },
        };
        let taken = claimed
            .as_ref()
            .is_some_and(|c| c.iter().any(|c| c.job_id == id));
        if !taken {
            crate::wakeups::notify(&mut tx, Channel::Work, None).await?;
        }
        tx.commit().await?;
        Ok((id, claimed))
    }
}

/// Assigns the new job `job` to the held poll of `round` in one statement, when nothing
/// waits ahead of it that the worker might take (then the poll's full claim decides, in queue
/// order): fenced like `CLAIM_PLAIN`. $1 worker, $2 poll sequence, $3 accelerator kinds,
/// $4 the job.
pub(crate) const ASSIGN_NEW: &str = "WITH h AS (
         UPDATE worker_heartbeats h SET last_seen = now(), poll_seq = $2
         FROM workers w
         WHERE h.worker_id = $1 AND w.id = h.worker_id AND w.state = 'online' AND h.poll_seq <= $2
           AND NOT h.pushed AND h.reserved_for IS NULL
         RETURNING h.worker_id
     ),
     mine AS (SELECT id, priority FROM tasks WHERE job_id = $4 AND state = 'pending' AND gang_size = 1),
     ahead AS (
         SELECT 1 FROM tasks, mine
         WHERE tasks.state = 'pending' AND tasks.accelerator = ANY($3) AND tasks.gang_size = 1
           AND (-tasks.priority, tasks.id) < (-mine.priority, mine.id)
         LIMIT 1
     ),
     a AS (
         UPDATE tasks SET state = 'assigned', worker_id = $1, attempt = tasks.attempt + 1,
             assigned_at = now(), started_at = NULL, exit_code = NULL, reason = NULL, devices = '{}'
         FROM mine
         WHERE tasks.id = mine.id AND EXISTS (SELECT 1 FROM h) AND NOT EXISTS (SELECT 1 FROM ahead)
         RETURNING tasks.id, tasks.job_id, tasks.attempt
     ),
     j AS (UPDATE jobs SET state = 'assigned' FROM a WHERE jobs.id = a.job_id AND jobs.state = 'pending'),
     e AS (INSERT INTO events (job_id, worker_id, kind) SELECT job_id, $1, 'assigned' FROM a)
     SELECT id, attempt FROM a";

/// The new job's `(task, attempt)` if [`ASSIGN_NEW`] assigned it.
async fn assign_new_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    round: &PollRound<'_>,
    job: i64,
) -> Result<Option<(i64, i32)>> {
    let kinds: Vec<&str> = round.accelerators.iter().map(|a| a.as_str()).collect();
    Ok(sqlx::query_as(ASSIGN_NEW)
        .bind(round.worker_id)
        .bind(round.seq as i64)
        .bind(&kinds)
        .bind(job)
        .fetch_optional(&mut **tx)
        .await?)
}

/// The claim of a poll's round: for its free slots, then queueable calls beyond them. None
/// when the worker has sent a newer poll. A round with no free slot records the heartbeat
/// instead when `heartbeat` (a poll's own round; a claim on a held poll's behalf has no
/// news of the worker).
async fn claim_for_poll_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    round: &PollRound<'_>,
    placer: &mut impl Placer,
    heartbeat: bool,
) -> Result<Option<Vec<Claimed>>> {
    let worker_id = round.worker_id;
    let ids: Vec<i64> = round.running.iter().map(|r| r.0).collect();
    let mut claimed = if round.free_slots == 0 {
        if heartbeat {
            // No claim to record the heartbeat (and to notice a lost worker) with.
            crate::workers::heartbeat_in(&mut **tx, worker_id).await?;
        }
        Some(vec![])
    } else {
        // After a failed or dropped poll, an answer with assignments may have been lost.
        let poll = PollContext {
            seq: round.seq,
            running: &ids,
            redeliver: round.reconcile,
        };
        let claim = claim_in(
            tx,
            worker_id,
            round.accelerators,
            round.free_slots,
            round.track_devices,
            poll,
            placer,
        )
        .await;
        match claim {
            Ok(claimed) => Some(claimed),
            // The claim wrote nothing; the reports recorded before it stand.
            Err(StoreError::PollSuperseded(_)) => None,
            Err(e) => return Err(e),
        }
    };
    if let (Some(taken), Some(python)) = (claimed.as_mut(), round.call_python)
        && round.call_room > 0
    {
        let calls = claim_calls_in(
            tx,
            worker_id,
            round.seq,
            python,
            round.accelerators,
            round.call_room,
        )
        .await?;
        taken.extend(calls);
    }
    Ok(claimed)
}
