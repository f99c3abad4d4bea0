//! Starts and ends of tasks, as their workers report them (in batches, with their polls):
//! one statement records a whole batch, so the per-job cost of the queue falls as the load
//! rises. Every write names `(task, attempt, worker)`: a report that no longer matches is
//! refused (fencing).
//!
//! The statements find tasks by id. They test the worker as `worker_id IS NOT DISTINCT FROM
//! $1`, which no index serves: with `= $1` the planner, believing a worker has a task or
//! two, read the worker's every entry in `tasks_by_worker` instead (the dead ones of its
//! finished tasks too, hundreds per worker under load) to save looking a few ids up.

use crate::queue::{ROUND_BEGIN, requeue_or_fail};
use crate::wakeups::Channel;
use crate::{Result, Store, StoreError, record_event};
use sqlx::{Postgres, Transaction};
use std::time::Duration;

/// How a task ended, as its worker reports it.
#[derive(Debug, Clone)]
pub struct Completion {
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    /// A remote call's value or exception, kept for its caller (`call_results`).
    pub call: Option<domain::CallOutcome>,
}

/// A task's process started `age` before the report was sent.
#[derive(Debug, Clone, Copy)]
pub struct StartReport {
    pub task_id: i64,
    pub attempt: i32,
    pub age: Duration,
}

/// A task ended `age` before the report was sent; its process started `started_age` before
/// (None when it never started).
#[derive(Debug, Clone)]
pub struct FinishReport {
    pub task_id: i64,
    pub attempt: i32,
    pub completion: Completion,
    pub started_age: Option<Duration>,
    pub age: Duration,
}

/// Reports are clamped to this age: a worker cannot date an event before its assignment
/// anyway, and a wild value must not overflow an interval.
const MAX_REPORT_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

fn micros(age: Duration) -> i64 {
    age.min(MAX_REPORT_AGE).as_micros() as i64
}

/// Records a batch of starts (see `record_starts_in`): $1 worker, then per start its task,
/// attempt and age in microseconds.
pub(crate) const RECORD_STARTS: &str = "WITH r AS (SELECT * FROM unnest($2::bigint[], $3::int[], $4::bigint[]) AS r(id, attempt, age_us)),
     t AS (
         UPDATE tasks SET state = 'running',
             started_at = greatest(tasks.assigned_at, now() - r.age_us * interval '1 microsecond')
         FROM r
         WHERE tasks.id = r.id AND tasks.attempt = r.attempt AND tasks.worker_id IS NOT DISTINCT FROM $1
           AND tasks.state = 'assigned'
         RETURNING tasks.id, tasks.job_id, tasks.started_at
     ),
     j AS (
         UPDATE jobs SET state = 'running' FROM t
         WHERE jobs.id = t.job_id AND jobs.state IN ('pending', 'assigned')
     ),
     e AS (INSERT INTO events (job_id, worker_id, kind, at) SELECT job_id, $1, 'running', started_at FROM t)
     SELECT id FROM t";

/// Finishes a batch of attempts (see `finish_batch`): $1 worker, then per end its task,
/// attempt, final state, exit code, reason, whether it failed, and the ages of its start and
/// end in microseconds; $10 the channel to wake log followers on; $11 the calls' outcomes
/// (JSON, NULL for command tasks).
pub(crate) const FINISH_BATCH: &str = "WITH r AS (
         SELECT * FROM unnest($2::bigint[], $3::int[], $4::text[], $5::int[], $6::text[], $7::bool[], $8::bigint[], $9::bigint[])
             AS r(id, attempt, state, exit_code, reason, failed, started_age_us, age_us)
     ),
     -- Read before the update (every part of one statement sees the same snapshot).
     unstarted AS (SELECT id FROM tasks WHERE id = ANY($2) AND started_at IS NULL),
     t AS (
         UPDATE tasks SET state = r.state, exit_code = r.exit_code, reason = r.reason,
             started_at = coalesce(tasks.started_at,
                 greatest(tasks.assigned_at, now() - r.started_age_us * interval '1 microsecond')),
             finished_at = greatest(tasks.assigned_at, now() - r.age_us * interval '1 microsecond')
         FROM r
         WHERE tasks.id = r.id AND tasks.attempt = r.attempt AND tasks.worker_id IS NOT DISTINCT FROM $1
           AND tasks.state IN ('assigned', 'running')
           AND NOT (r.failed AND tasks.retry_failed AND tasks.attempt < tasks.max_attempts)
           AND tasks.gang_size = 1
         RETURNING tasks.id, tasks.attempt, tasks.job_id, tasks.state, tasks.exit_code,
                   tasks.reason, tasks.started_at, tasks.finished_at
     ),
     j AS (
         UPDATE jobs SET state = t.state, exit_code = t.exit_code, reason = t.reason,
             finished_at = t.finished_at
         FROM t
         WHERE jobs.id = t.job_id AND jobs.state NOT IN ('succeeded', 'failed', 'cancelled')
     ),
     e AS (
         INSERT INTO events (job_id, worker_id, kind, detail, at)
         SELECT job_id, $1, kind, detail, at FROM (
             SELECT job_id, 'running' AS kind, NULL AS detail, started_at AS at, 0 AS step
             FROM t WHERE started_at IS NOT NULL AND id IN (SELECT id FROM unstarted)
             UNION ALL
             SELECT job_id, state, reason, finished_at, 1 FROM t
         ) AS x ORDER BY job_id, step
     ),
     c AS (
         INSERT INTO call_results (job_id, ok, payload, error)
         SELECT t.job_id, (o.outcome->>'ok')::bool, o.outcome->>'payload', o.outcome->'error'
         FROM t JOIN (SELECT * FROM unnest($2::bigint[], $11::jsonb[]) AS o(id, outcome)) AS o ON o.id = t.id
         WHERE o.outcome IS NOT NULL
         ON CONFLICT (job_id) DO UPDATE SET ok = EXCLUDED.ok, payload = EXCLUDED.payload,
             error = EXCLUDED.error, at = now()
     )
     SELECT t.id, t.attempt FROM t, pg_notify($10, t.job_id::text)";

impl Store {
    /// The worker started the task's process.
    pub async fn mark_running(&self, worker_id: i64, task_id: i64, attempt: i32) -> Result<()> {
        let start = StartReport {
            task_id,
            attempt,
            age: Duration::ZERO,
        };
        match self.record_starts(worker_id, &[start]).await?.as_slice() {
            [] => Err(StoreError::LeaseLost {
                task: task_id,
                attempt,
            }),
            _ => Ok(()),
        }
    }

    /// Records a batch of starts; see [`record_starts_in`].
    pub async fn record_starts(&self, worker_id: i64, starts: &[StartReport]) -> Result<Vec<i64>> {
        let mut tx = self.pool().begin_with(ROUND_BEGIN).await?;
        let started = record_starts_in(&mut tx, worker_id, starts).await?;
        tx.commit().await?;
        Ok(started)
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
        let report = FinishReport {
            task_id,
            attempt,
            completion: done.clone(),
            started_age: None,
            age: Duration::ZERO,
        };
        match self.finish_tasks(worker_id, &[report]).await?.as_slice() {
            [] => Ok(()),
            _ => Err(StoreError::LeaseLost {
                task: task_id,
                attempt,
            }),
        }
    }

    /// Records a batch of ends; see [`finish_tasks_in`].
    pub async fn finish_tasks(
        &self,
        worker_id: i64,
        reports: &[FinishReport],
    ) -> Result<Vec<(i64, i32)>> {
        let mut tx = self.pool().begin_with(ROUND_BEGIN).await?;
        let lost = finish_tasks_in(&mut tx, worker_id, reports).await?;
        tx.commit().await?;
        Ok(lost)
    }
}

/// Records a batch of starts in one statement and returns the tasks it moved to running. A
/// start that no longer matches an assigned attempt of this worker is skipped: the stop
/// orders of the same poll tell the worker to kill it. No NOTIFY: log followers wait for
/// lines and for the end, not for the start.
pub(crate) async fn record_starts_in(
    tx: &mut Transaction<'_, Postgres>,
    worker_id: i64,
    starts: &[StartReport],
) -> Result<Vec<i64>> {
    if starts.is_empty() {
        return Ok(vec![]);
    }
    let ids: Vec<i64> = starts.iter().map(|s| s.task_id).collect();
    let attempts: Vec<i32> = starts.iter().map(|s| s.attempt).collect();
    let ages: Vec<i64> = starts.iter().map(|s| micros(s.age)).collect();
    Ok(sqlx::query_scalar(RECORD_STARTS)
        .bind(worker_id)
        .bind(&ids)
        .bind(&attempts)
        .bind(&ages)
        .fetch_all(&mut **tx)
        .await?)
}

/// Records a batch of ends and returns the `(task, attempt)`s refused because they are no
/// longer this worker's (their lease was lost). The common case, attempts of this worker that
/// are not to be retried, takes one statement for the whole batch; everything else (a retry,
/// a repeat, a cancel, a lost lease) a few statements per task.
pub(crate) async fn finish_tasks_in(
    tx: &mut Transaction<'_, Postgres>,
    worker_id: i64,
    reports: &[FinishReport],
) -> Result<Vec<(i64, i32)>> {
    if reports.is_empty() {
        return Ok(vec![]);
    }
    let finished = finish_batch(&mut **tx, worker_id, reports).await?;
    let mut lost = Vec::new();
    for report in reports
        .iter()
        .filter(|r| !finished.contains(&(r.task_id, r.attempt)))
    {
        match finish_slowly(tx, worker_id, report).await {
            Ok(()) => {}
            Err(StoreError::LeaseLost { task, attempt }) => lost.push((task, attempt)),
            Err(e) => return Err(e),
        }
    }
    Ok(lost)
}

/// An end the batch statement left alone. `LeaseLost` (after reading only) when the attempt
/// is no longer this worker's.
async fn finish_slowly(
    tx: &mut Transaction<'_, Postgres>,
    worker_id: i64,
    report: &FinishReport,
) -> Result<()> {
    let (task_id, attempt) = (report.task_id, report.attempt);
    let outcome = Outcome::of(&report.completion);
    let gang: Option<(i64, i32)> =
        sqlx::query_as("SELECT job_id, gang_size FROM tasks WHERE id = $1")
            .bind(task_id)
            .fetch_optional(&mut **tx)
            .await?;
    if let Some((job_id, size)) = gang
        && size > 1
    {
        return finish_gang_node(tx, worker_id, job_id, report, outcome).await;
    }
    // A failed attempt of a job that asked for retries on failure goes back to the queue.
    let retry: Option<bool> = sqlx::query_scalar(
        "SELECT retry_failed AND attempt < max_attempts FROM tasks
         WHERE id = $1 AND attempt = $2 AND worker_id = $3 AND state IN ('assigned', 'running')
         FOR UPDATE",
    )
    .bind(task_id)
    .bind(attempt)
    .bind(worker_id)
    .fetch_optional(&mut **tx)
    .await?;
    if retry == Some(true) && outcome.failed {
        let why = outcome.reason.unwrap_or_else(|| "failed".into());
        sqlx::query("UPDATE tasks SET exit_code = $2 WHERE id = $1")
            .bind(task_id)
            .bind(report.completion.exit_code)
            .execute(&mut **tx)
            .await?;
        requeue_or_fail(tx, &[task_id], &[format!("attempt {attempt} {why}")]).await?;
        return Ok(());
    }
    // Owned and live but not a retry: it raced into shape since the first try.
    if !finish_batch(&mut **tx, worker_id, std::slice::from_ref(report))
        .await?
        .is_empty()
    {
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
    .fetch_optional(&mut **tx)
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
    .bind(report.completion.exit_code)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The end of one node of a gang. A failed node stops the whole gang (see
/// `gangs::stop_gang`); the job succeeds when its last node does.
async fn finish_gang_node(
    tx: &mut Transaction<'_, Postgres>,
    worker_id: i64,
    job_id: i64,
    report: &FinishReport,
    outcome: Outcome,
) -> Result<()> {
    let (task_id, attempt) = (report.task_id, report.attempt);
    let nodes = crate::gangs::lock_gang(tx, job_id).await?;
    let lost = StoreError::LeaseLost {
        task: task_id,
        attempt,
    };
    let Some(me) = nodes.iter().find(|n| n.id == task_id) else {
        return Err(lost);
    };
    if me.attempt != attempt || me.worker_id != Some(worker_id) {
        return Err(lost);
    }
    match me.state.as_str() {
        "assigned" | "running" => {}
        // A repeated report, or the gang was stopped or cancelled meanwhile: nothing to do.
        "succeeded" | "failed" | "cancelled" => return Ok(()),
        _ => return Err(lost),
    }
    if outcome.failed {
        let cause = outcome.reason.unwrap_or_else(|| "failed".into());
        return crate::gangs::stop_gang(
            tx,
            job_id,
            &nodes,
            me,
            &cause,
            report.completion.exit_code,
            me.retry_failed,
        )
        .await;
    }
    let started: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
        "UPDATE tasks SET state = 'succeeded', exit_code = $2, reason = NULL,
             started_at = coalesce(started_at, greatest(assigned_at, now() - $3 * interval '1 microsecond')),
             finished_at = greatest(assigned_at, now() - $4 * interval '1 microsecond')
         WHERE id = $1
         RETURNING started_at",
    )
    .bind(task_id)
    .bind(report.completion.exit_code)
    .bind(report.started_age.map(micros))
    .bind(micros(report.age))
    .fetch_one(&mut **tx)
    .await?;
    let detail = format!("node {}", me.node);
    if me.state == "assigned" && started.is_some() {
        sqlx::query(
            "INSERT INTO events (job_id, worker_id, kind, detail, at) VALUES ($1, $2, 'running', $3, $4)",
        )
        .bind(job_id)
        .bind(worker_id)
        .bind(&detail)
        .bind(started)
        .execute(&mut **tx)
        .await?;
    }
    record_event(
        tx,
        Some(job_id),
        Some(worker_id),
        "node_succeeded",
        Some(&detail),
    )
    .await?;
    // The last node to end ends the job (the gang is locked: the others' ends are visible).
    if nodes
        .iter()
        .all(|n| n.id == task_id || n.state == "succeeded")
    {
        sqlx::query(
            "UPDATE jobs SET state = 'succeeded', exit_code = 0, reason = NULL, finished_at = now()
             WHERE id = $1 AND state NOT IN ('succeeded', 'failed', 'cancelled')",
        )
        .bind(job_id)
        .execute(&mut **tx)
        .await?;
        record_event(tx, Some(job_id), None, "succeeded", None).await?;
        crate::wakeups::notify(tx, Channel::Job, Some(job_id)).await?;
    }
    Ok(())
}

/// What a completion means for the task: its final state and the reason shown for it.
struct Outcome {
    state: &'static str,
    reason: Option<String>,
    failed: bool,
}

impl Outcome {
    fn of(done: &Completion) -> Self {
        let succeeded = done.exit_code == Some(0) && done.error.is_none();
        let reason = match (&done.error, done.exit_code) {
            (Some(e), _) => Some(e.clone()),
            (None, Some(0)) => None,
            (None, Some(code)) if code > 128 => Some(format!("killed by signal {}", code - 128)),
            (None, Some(code)) => Some(format!("exited with code {code}")),
            (None, None) => Some("ended without an exit code".to_string()),
        };
        Self {
            state: if succeeded { "succeeded" } else { "failed" },
            reason,
            failed: !succeeded,
        }
    }
}

/// Finishing attempts: tasks, jobs, events (a `running` one too for a start reported only
/// now) and wake-ups, for a whole batch in one statement (one round trip, atomic on its own).
/// Attempts that are not this worker's live ones, and failed attempts of jobs that retry on
/// failure, are left alone. Returns the `(task, attempt)`s it finished.
async fn finish_batch<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    worker_id: i64,
    reports: &[FinishReport],
) -> Result<Vec<(i64, i32)>> {
    let outcomes: Vec<Outcome> = reports.iter().map(|r| Outcome::of(&r.completion)).collect();
    let ids: Vec<i64> = reports.iter().map(|r| r.task_id).collect();
    let attempts: Vec<i32> = reports.iter().map(|r| r.attempt).collect();
    let states: Vec<&str> = outcomes.iter().map(|o| o.state).collect();
    let exit_codes: Vec<Option<i32>> = reports.iter().map(|r| r.completion.exit_code).collect();
    let reasons: Vec<Option<&str>> = outcomes.iter().map(|o| o.reason.as_deref()).collect();
    let failed: Vec<bool> = outcomes.iter().map(|o| o.failed).collect();
    let started: Vec<Option<i64>> = reports.iter().map(|r| r.started_age.map(micros)).collect();
    let ages: Vec<i64> = reports.iter().map(|r| micros(r.age)).collect();
    let calls: Vec<Option<sqlx::types::Json<&domain::CallOutcome>>> = reports
        .iter()
        .map(|r| r.completion.call.as_ref().map(sqlx::types::Json))
        .collect();
    Ok(sqlx::query_as(FINISH_BATCH)
        .bind(worker_id)
        .bind(&ids)
        .bind(&attempts)
        .bind(&states)
        .bind(&exit_codes)
        .bind(&reasons)
        .bind(&failed)
        .bind(&started)
        .bind(&ages)
        .bind(Channel::Job.name())
        .bind(&calls)
        .fetch_all(executor)
        .await?)
}
