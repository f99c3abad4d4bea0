//! The queue: claim a batch of tasks for a worker, start them, complete them, and tell a
//! worker which of its tasks it must stop.
//!
//! Claim and assignment happen in one transaction: a task is never "taken" without being
//! assigned, so a crash at any point leaves it either pending or assigned, never lost.

use crate::wakeups::{Channel, notify};
use crate::{Result, Store, StoreError, record_event};
use domain::{Accelerator, JobSpec};
use sqlx::Row;

/// How many candidates the claim reads per free slot. The store filters by accelerator kind;
/// the scheduler may still turn a candidate down (e.g. too few devices), so read a few extra
/// rather than come back empty while fitting work waits behind unfit work.
const CANDIDATES_PER_SLOT: i64 = 4;

/// A task just assigned to the claiming worker.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub job_id: i64,
    pub task_id: i64,
    pub attempt: i32,
    pub spec: JobSpec,
    /// Device indices the task holds on the worker.
    pub devices: Vec<u32>,
}

/// How a task ended, as its worker reports it.
#[derive(Debug, Clone)]
pub struct Completion {
    pub exit_code: Option<i32>,
    pub error: Option<String>,
}

/// Whether a running task must stop, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Cancelled,
    LeaseLost,
}

impl Store {
    /// Claims up to `free_slots` pending tasks whose accelerator this worker offers, asking
    /// `place(spec, busy_devices)` for each candidate which devices it would get (None: not
    /// this one), and assigns them to `worker_id` in the same transaction. Also records the
    /// worker's heartbeat. `track_devices` is false for a worker without devices, which
    /// skips reading what its tasks hold.
    pub async fn claim_batch(
        &self,
        worker_id: i64,
        accelerators: &[Accelerator],
        free_slots: u32,
        track_devices: bool,
        mut place: impl FnMut(&JobSpec, &[u32]) -> Option<Vec<u32>>,
    ) -> Result<Vec<Claimed>> {
        if free_slots == 0 {
            return Ok(vec![]);
        }
        let kinds: Vec<&str> = accelerators.iter().map(|a| a.as_str()).collect();
        let mut tx = self.begin().await?;
        // Touching the worker's heartbeat row does three things at once: it records that the
        // worker is alive, it refuses a worker declared lost (its lease is gone, it takes
        // nothing), and its row lock serialises claims for one worker (a retried poll racing
        // the original), so two claims never hand out the same device.
        let alive: Option<i32> = sqlx::query_scalar(
            "UPDATE worker_heartbeats h SET last_seen = now()
             FROM workers w
             WHERE h.worker_id = $1 AND w.id = h.worker_id AND w.state = 'online'
             RETURNING 1",
        )
        .bind(worker_id)
        .fetch_optional(&mut *tx)
        .await?;
        if alive.is_none() {
            return Err(StoreError::WorkerLost(worker_id));
        }
        let mut busy: Vec<u32> = if track_devices {
            let held: Vec<i32> = sqlx::query_scalar(
                "SELECT d FROM tasks t, unnest(t.devices) AS d
                 WHERE t.worker_id = $1 AND t.state IN ('assigned', 'running')",
            )
            .bind(worker_id)
            .fetch_all(&mut *tx)
            .await?;
            held.into_iter().map(|d| d as u32).collect()
        } else {
            vec![]
        };
        // The CTE fences the LIMIT: without it the planner may evaluate the locking subquery
        // more than once and lock more rows than asked for.
        let rows = sqlx::query(
            "WITH c AS (
                 SELECT id FROM tasks
                 WHERE state = 'pending' AND accelerator = ANY($1)
                 ORDER BY priority DESC, id
                 LIMIT $2
                 FOR UPDATE SKIP LOCKED
             )
             SELECT t.id, t.job_id, t.attempt, j.spec
             FROM c JOIN tasks t ON t.id = c.id JOIN jobs j ON j.id = t.job_id
             ORDER BY t.priority DESC, t.id",
        )
        .bind(&kinds)
        .bind(i64::from(free_slots) * CANDIDATES_PER_SLOT)
        .fetch_all(&mut *tx)
        .await?;
        let mut chosen: Vec<Claimed> = Vec::new();
        for r in rows {
            if chosen.len() as u32 >= free_slots {
                break;
            }
            let spec: sqlx::types::Json<JobSpec> = r.try_get("spec")?;
            if let Some(devices) = place(&spec.0, &busy) {
                busy.extend(&devices);
                chosen.push(Claimed {
                    job_id: r.get("job_id"),
                    task_id: r.get("id"),
                    attempt: r.get::<i32, _>("attempt") + 1,
                    spec: spec.0,
                    devices,
                });
            }
        }
        if chosen.is_empty() {
            // Commit all the same: the heartbeat stands.
            tx.commit().await?;
            return Ok(chosen);
        }
        let task_ids: Vec<i64> = chosen.iter().map(|c| c.task_id).collect();
        let attempts: Vec<i32> = chosen.iter().map(|c| c.attempt).collect();
        // Device lists as array literals: PostgreSQL arrays of arrays must be rectangular.
        let devices: Vec<String> = chosen
            .iter()
            .map(|c| {
                format!(
                    "{{{}}}",
                    c.devices
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                )
            })
            .collect();
        sqlx::query(
            "WITH u AS (SELECT * FROM unnest($2::bigint[], $3::int[], $4::text[]) AS u(id, attempt, devices)),
             t AS (
                 UPDATE tasks SET state = 'assigned', worker_id = $1, attempt = u.attempt, assigned_at = now(),
                                  started_at = NULL, exit_code = NULL, reason = NULL, devices = u.devices::int[]
                 FROM u WHERE tasks.id = u.id
                 RETURNING tasks.job_id
             ),
             j AS (UPDATE jobs SET state = 'assigned' FROM t WHERE jobs.id = t.job_id AND jobs.state = 'pending')
             INSERT INTO events (job_id, worker_id, kind) SELECT job_id, $1, 'assigned' FROM t",
        )
        .bind(worker_id)
        .bind(&task_ids)
        .bind(&attempts)
        .bind(&devices)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(chosen)
    }

    /// The worker started the task's process.
    pub async fn mark_running(&self, worker_id: i64, task_id: i64, attempt: i32) -> Result<()> {
        // One statement (so one round trip, atomic on its own) on the per-job hot path. No
        // NOTIFY: log followers wait for lines and for the end, not for the start.
        let job_id: Option<i64> = sqlx::query_scalar(
            "WITH t AS (
                 UPDATE tasks SET state = 'running', started_at = now()
                 WHERE id = $1 AND attempt = $2 AND worker_id = $3 AND state = 'assigned'
                 RETURNING job_id
             ),
             j AS (
                 UPDATE jobs SET state = 'running' FROM t
                 WHERE jobs.id = t.job_id AND jobs.state IN ('pending', 'assigned')
             ),
             e AS (INSERT INTO events (job_id, worker_id, kind) SELECT job_id, $3, 'running' FROM t)
             SELECT job_id FROM t",
        )
        .bind(task_id)
        .bind(attempt)
        .bind(worker_id)
        .fetch_optional(self.pool())
        .await?;
        match job_id {
            Some(_) => Ok(()),
            None => Err(StoreError::LeaseLost {
                task: task_id,
                attempt,
            }),
        }
    }

    /// Records how the task ended and finishes its job. Repeating the same completion (a
    /// retried request) is a no-op; completing a task that was cancelled keeps it cancelled.
    pub async fn complete_task(
        &self,
        worker_id: i64,
        task_id: i64,
        attempt: i32,
        done: &Completion,
    ) -> Result<()> {
        let succeeded = done.exit_code == Some(0) && done.error.is_none();
        let state = if succeeded { "succeeded" } else { "failed" };
        let reason = match (&done.error, done.exit_code) {
            (Some(e), _) => Some(e.clone()),
            (None, Some(0)) => None,
            (None, Some(code)) if code > 128 => Some(format!("killed by signal {}", code - 128)),
            (None, Some(code)) => Some(format!("exited with code {code}")),
            (None, None) => Some("ended without an exit code".to_string()),
        };
        // The common case in one statement: the attempt is this worker's and is not to be
        // retried. Everything else (a retry, a repeat, a cancel, a lost lease) takes the
        // slower path below.
        let finish = Finish {
            worker_id,
            task_id,
            attempt,
            state,
            exit_code: done.exit_code,
            reason: reason.as_deref(),
            failed: !succeeded,
        };
        let finished = finish.run(self.pool()).await?;
        if finished.is_some() {
            return Ok(());
        }
        let mut tx = self.begin().await?;
        // A failed attempt of a job that asked for retries on failure goes back to the queue.
        let retry: Option<bool> = sqlx::query_scalar(
            "SELECT retry_failed AND attempt < max_attempts FROM tasks
             WHERE id = $1 AND attempt = $2 AND worker_id = $3 AND state IN ('assigned', 'running')
             FOR UPDATE",
        )
        .bind(task_id)
        .bind(attempt)
        .bind(worker_id)
        .fetch_optional(&mut *tx)
        .await?;
        if retry == Some(true) && !succeeded {
            let why = reason.clone().unwrap_or_else(|| "failed".into());
            sqlx::query("UPDATE tasks SET exit_code = $2 WHERE id = $1")
                .bind(task_id)
                .bind(done.exit_code)
                .execute(&mut *tx)
                .await?;
            requeue_or_fail(&mut tx, &[task_id], &[format!("attempt {attempt} {why}")]).await?;
            tx.commit().await?;
            return Ok(());
        }
        // Owned and live but not a retry: it raced into shape since the first try.
        if finish.run(&mut *tx).await?.is_some() {
            tx.commit().await?;
            return Ok(());
        }
        // Already finished by this very attempt (a repeated request), or cancelled meanwhile:
        // fine, and the exit code is kept. Anything else is no longer this worker's.
        let finished: Option<String> = sqlx::query_scalar(
            "SELECT state FROM tasks WHERE id = $1 AND attempt = $2 AND worker_id = $3
             AND state IN ('succeeded', 'failed', 'cancelled')",
        )
        .bind(task_id)
        .bind(attempt)
        .bind(worker_id)
        .fetch_optional(&mut *tx)
        .await?;
        if finished.is_none() {
            return Err(StoreError::LeaseLost {
                task: task_id,
                attempt,
            });
        }
        sqlx::query(
            "UPDATE tasks SET exit_code = coalesce(exit_code, $3) WHERE id = $1 AND attempt = $2",
        )
        .bind(task_id)
        .bind(attempt)
        .bind(done.exit_code)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Checks that the task is still this worker's current attempt (for uploads).
    pub async fn check_lease(&self, worker_id: i64, task_id: i64, attempt: i32) -> Result<i64> {
        leased_job(self.pool(), worker_id, task_id, attempt).await
    }

    /// Records where the task's packed outputs were stored.
    pub async fn set_outputs(
        &self,
        worker_id: i64,
        task_id: i64,
        attempt: i32,
        key: &str,
        bytes: i64,
    ) -> Result<()> {
        let updated = sqlx::query(
            "UPDATE tasks SET outputs_key = $4, outputs_bytes = $5
             WHERE id = $1 AND attempt = $2 AND worker_id = $3",
        )
        .bind(task_id)
        .bind(attempt)
        .bind(worker_id)
        .bind(key)
        .bind(bytes)
        .execute(self.pool())
        .await?
        .rows_affected();
        if updated == 0 {
            return Err(StoreError::LeaseLost {
                task: task_id,
                attempt,
            });
        }
        Ok(())
    }

    /// Called at the start of each long poll with the tasks the worker says it runs. A task
    /// assigned to it that it does not list was handed out in a poll answer that never
    /// reached it: put it back in the queue. A running task it does not list was forgotten
    /// (its process is gone): fail it. Returns the number of tasks touched.
    pub async fn reconcile_worker_tasks(&self, worker_id: i64, running: &[i64]) -> Result<u64> {
        let mut tx = self.begin().await?;
        let requeued: Vec<i64> = sqlx::query_scalar(
            "UPDATE tasks SET state = 'pending', worker_id = NULL, assigned_at = NULL
             WHERE worker_id = $1 AND state = 'assigned' AND id <> ALL($2)
             RETURNING job_id",
        )
        .bind(worker_id)
        .bind(running)
        .fetch_all(&mut *tx)
        .await?;
        if !requeued.is_empty() {
            sqlx::query(
                "UPDATE jobs SET state = 'pending' WHERE id = ANY($1) AND state = 'assigned'",
            )
            .bind(&requeued)
            .execute(&mut *tx)
            .await?;
            sqlx::query("INSERT INTO events (job_id, worker_id, kind, detail) SELECT unnest($1::bigint[]), $2, 'requeued', 'the assignment never reached the worker'")
                .bind(&requeued)
                .bind(worker_id)
                .execute(&mut *tx)
                .await?;
            notify(&mut tx, Channel::Work, None).await?;
        }
        let forgotten: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM tasks WHERE worker_id = $1 AND state = 'running' AND id <> ALL($2)
             ORDER BY id FOR UPDATE",
        )
        .bind(worker_id)
        .bind(running)
        .fetch_all(&mut *tx)
        .await?;
        let reasons = vec!["the worker no longer runs this task".to_string(); forgotten.len()];
        requeue_or_fail(&mut tx, &forgotten, &reasons).await?;
        tx.commit().await?;
        Ok((requeued.len() + forgotten.len()) as u64)
    }

    /// Of the tasks a worker says it runs, those it must stop: cancelled ones, and ones that
    /// are no longer its current attempt.
    pub async fn stop_orders(
        &self,
        worker_id: i64,
        running: &[(i64, i32)],
    ) -> Result<Vec<(i64, i32, StopReason)>> {
        if running.is_empty() {
            return Ok(vec![]);
        }
        let tasks: Vec<i64> = running.iter().map(|r| r.0).collect();
        let attempts: Vec<i32> = running.iter().map(|r| r.1).collect();
        let rows = sqlx::query(
            "SELECT r.task, r.attempt, t.state, (t.attempt = r.attempt AND t.worker_id = $3) AS mine
             FROM unnest($1::bigint[], $2::int[]) AS r(task, attempt)
             LEFT JOIN tasks t ON t.id = r.task",
        )
        .bind(&tasks)
        .bind(&attempts)
        .bind(worker_id)
        .fetch_all(self.pool())
        .await?;
        let mut out = Vec::new();
        for r in rows {
            let state: Option<String> = r.get("state");
            let mine: Option<bool> = r.get("mine");
            let why = match (state.as_deref(), mine) {
                (Some("assigned" | "running"), Some(true)) => continue,
                (Some("cancelled"), Some(true)) => StopReason::Cancelled,
                _ => StopReason::LeaseLost,
            };
            out.push((r.get("task"), r.get("attempt"), why));
        }
        Ok(out)
    }
}

/// The job of a task that is still `(worker, attempt)`'s: assigned, running, or cancelled
/// (a cancelled task's last lines and outputs are still welcome). `LeaseLost` otherwise.
pub(crate) async fn leased_job<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    worker_id: i64,
    task_id: i64,
    attempt: i32,
) -> Result<i64> {
    sqlx::query_scalar(
        "SELECT job_id FROM tasks WHERE id = $1 AND attempt = $2 AND worker_id = $3
         AND state IN ('assigned', 'running', 'cancelled')",
    )
    .bind(task_id)
    .bind(attempt)
    .bind(worker_id)
    .fetch_optional(executor)
    .await?
    .ok_or(StoreError::LeaseLost {
        task: task_id,
        attempt,
    })
}

/// Finishing one attempt: task, job, event and wake-up in one statement (one round trip,
/// atomic on its own). Attempts of jobs that retry on failure are left alone when failed.
struct Finish<'a> {
    worker_id: i64,
    task_id: i64,
    attempt: i32,
    state: &'a str,
    exit_code: Option<i32>,
    reason: Option<&'a str>,
    failed: bool,
}

impl Finish<'_> {
    /// The job's id when the attempt was finished; None when it was not this worker's live
    /// attempt (or is to be retried).
    async fn run<'e>(&self, executor: impl sqlx::PgExecutor<'e>) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar(
            "WITH t AS (
                 UPDATE tasks SET state = $4, exit_code = $5, reason = $6, finished_at = now()
                 WHERE id = $1 AND attempt = $2 AND worker_id = $3 AND state IN ('assigned', 'running')
                   AND NOT ($7 AND retry_failed AND attempt < max_attempts)
                 RETURNING job_id
             ),
             j AS (
                 UPDATE jobs SET state = $4, exit_code = $5, reason = $6, finished_at = now() FROM t
                 WHERE jobs.id = t.job_id AND jobs.state NOT IN ('succeeded', 'failed', 'cancelled')
             ),
             e AS (INSERT INTO events (job_id, worker_id, kind, detail) SELECT job_id, $3, $4, $6 FROM t)
             SELECT t.job_id FROM t, pg_notify($8, t.job_id::text)",
        )
        .bind(self.task_id)
        .bind(self.attempt)
        .bind(self.worker_id)
        .bind(self.state)
        .bind(self.exit_code)
        .bind(self.reason)
        .bind(self.failed)
        .bind(Channel::Job.name())
        .fetch_optional(executor)
        .await?)
    }
}

/// Puts tasks back in the queue while they have attempts left, failing them (and their jobs)
/// otherwise; `reasons[i]` says why task `tasks[i]` stopped. Writes an event per task and
/// wakes the workers when anything was requeued. Returns each task's job, in order.
pub(crate) async fn requeue_or_fail(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    tasks: &[i64],
    reasons: &[String],
) -> Result<Vec<i64>> {
    if tasks.is_empty() {
        return Ok(vec![]);
    }
    let rows = sqlx::query(
        "WITH r AS (SELECT * FROM unnest($1::bigint[], $2::text[]) AS r(task_id, reason))
         UPDATE tasks SET
             state = CASE WHEN tasks.attempt < tasks.max_attempts THEN 'pending' ELSE 'failed' END,
             reason = CASE WHEN tasks.attempt < tasks.max_attempts
                 THEN format('%s; retrying (attempt %s of %s)', r.reason, tasks.attempt + 1, tasks.max_attempts)
                 ELSE format('%s; no attempts left (%s of %s used)', r.reason, tasks.attempt, tasks.max_attempts) END,
             worker_id = CASE WHEN tasks.attempt < tasks.max_attempts THEN NULL ELSE tasks.worker_id END,
             devices = CASE WHEN tasks.attempt < tasks.max_attempts THEN '{}' ELSE tasks.devices END,
             assigned_at = CASE WHEN tasks.attempt < tasks.max_attempts THEN NULL ELSE tasks.assigned_at END,
             finished_at = CASE WHEN tasks.attempt < tasks.max_attempts THEN NULL ELSE now() END
         FROM r WHERE tasks.id = r.task_id
         RETURNING tasks.id, tasks.job_id, tasks.state, tasks.reason",
    )
    .bind(tasks)
    .bind(reasons)
    .fetch_all(&mut **tx)
    .await?;
    let mut by_task = std::collections::HashMap::new();
    let mut requeued = false;
    for r in &rows {
        let (job, state, reason): (i64, String, String) =
            (r.get("job_id"), r.get("state"), r.get("reason"));
        requeued |= state == "pending";
        sqlx::query(
            "UPDATE jobs SET state = $2, reason = $3,
                 finished_at = CASE WHEN $2 = 'failed' THEN now() ELSE NULL END
             WHERE id = $1 AND state NOT IN ('succeeded', 'failed', 'cancelled')",
        )
        .bind(job)
        .bind(&state)
        .bind(&reason)
        .execute(&mut **tx)
        .await?;
        let kind = if state == "pending" {
            "retrying"
        } else {
            "failed"
        };
        record_event(tx, Some(job), None, kind, Some(&reason)).await?;
        notify(tx, Channel::Job, Some(job)).await?;
        by_task.insert(r.get::<i64, _>("id"), job);
    }
    if requeued {
        notify(tx, Channel::Work, None).await?;
    }
    Ok(tasks
        .iter()
        .filter_map(|t| by_task.get(t).copied())
        .collect())
}
