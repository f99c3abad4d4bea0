//! Jobs: insert (with its task, in one transaction), read, list, cancel.

use crate::wakeups::{Channel, notify};
use crate::{Result, Store, StoreError, record_event};
use chrono::{DateTime, Utc};
use domain::{JobSpec, JobState};
use sqlx::Row;
use sqlx::postgres::PgRow;

/// A job joined with its (first) task, worker and submitting token, as views need it.
#[derive(Debug, Clone)]
pub struct JobRow {
    pub id: i64,
    pub spec: JobSpec,
    pub state: JobState,
    pub exit_code: Option<i32>,
    pub reason: Option<String>,
    pub submitted_by: Option<String>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub task_id: i64,
    pub attempt: i32,
    pub worker_id: Option<i64>,
    pub worker_name: Option<String>,
    pub assigned_at: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub outputs_key: Option<String>,
    pub outputs_bytes: Option<i64>,
    pub devices: Vec<u32>,
}

#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub state: Option<JobState>,
    pub limit: i64,
}

const JOB_COLUMNS: &str =
    "j.id, j.spec, j.state, j.exit_code, j.reason, j.created_at, j.finished_at,
     k.name AS submitted_by, t.id AS task_id, t.attempt, t.worker_id, w.name AS worker_name,
     t.assigned_at, t.started_at, t.outputs_key, t.outputs_bytes, t.devices
     FROM jobs j
     JOIN tasks t ON t.job_id = j.id AND t.task_index = 0
     LEFT JOIN workers w ON w.id = t.worker_id
     LEFT JOIN tokens k ON k.id = j.submitted_by";

fn job_row(r: PgRow) -> Result<JobRow> {
    let spec: sqlx::types::Json<JobSpec> = r.try_get("spec")?;
    let state: String = r.get("state");
    Ok(JobRow {
        id: r.get("id"),
        spec: spec.0,
        state: state.parse().map_err(StoreError::Corrupt)?,
        exit_code: r.get("exit_code"),
        reason: r.get("reason"),
        submitted_by: r.get("submitted_by"),
        created_at: r.get("created_at"),
        finished_at: r.get("finished_at"),
        task_id: r.get("task_id"),
        attempt: r.get("attempt"),
        worker_id: r.get("worker_id"),
        worker_name: r.get("worker_name"),
        assigned_at: r.get("assigned_at"),
        started_at: r.get("started_at"),
        outputs_key: r.get("outputs_key"),
        outputs_bytes: r.get("outputs_bytes"),
        devices: r
            .get::<Vec<i32>, _>("devices")
            .into_iter()
            .map(|d| d as u32)
            .collect(),
    })
}

impl Store {
    /// Inserts a pending job and its task and wakes the workers. With an idempotency key, a
    /// repeat of the same submit returns the first job instead of creating another.
    pub async fn insert_job(
        &self,
        spec: &JobSpec,
        submitted_by: Option<i64>,
        idempotency_key: Option<&str>,
    ) -> Result<i64> {
        let mut tx = self.begin().await?;
        let inserted: Option<i64> = sqlx::query_scalar(
            "INSERT INTO jobs (name, spec, accelerator, state, submitted_by, idempotency_key)
             VALUES ($1, $2, $3, 'pending', $4, $5)
             ON CONFLICT (idempotency_key) DO NOTHING
             RETURNING id",
        )
        .bind(spec.name.as_ref().map(|n| n.as_str()))
        .bind(sqlx::types::Json(spec))
        .bind(spec.accelerator.as_str())
        .bind(submitted_by)
        .bind(idempotency_key)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(id) = inserted else {
            tx.rollback().await?;
            let id = sqlx::query_scalar("SELECT id FROM jobs WHERE idempotency_key = $1")
                .bind(idempotency_key)
                .fetch_one(self.pool())
                .await?;
            return Ok(id);
        };
        sqlx::query(
            "INSERT INTO tasks (job_id, state, accelerator, max_attempts, retry_failed)
             VALUES ($1, 'pending', $2, $3, $4)",
        )
        .bind(id)
        .bind(spec.accelerator.as_str())
        .bind(spec.max_attempts() as i32)
        .bind(spec.retry_failed)
        .execute(&mut *tx)
        .await?;
        record_event(&mut tx, Some(id), None, "submitted", None).await?;
        notify(&mut tx, Channel::Work, None).await?;
        tx.commit().await?;
        Ok(id)
    }

    pub async fn get_job(&self, id: i64) -> Result<JobRow> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {JOB_COLUMNS} WHERE j.id = $1"
        )))
        .bind(id)
        .fetch_optional(self.pool())
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("job {id}")))?;
        job_row(row)
    }

    /// Jobs newest first.
    pub async fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<JobRow>> {
        // JOB_COLUMNS is a constant: nothing user-given reaches the SQL text.
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {JOB_COLUMNS} WHERE ($1::text IS NULL OR j.state = $1) ORDER BY j.id DESC LIMIT $2"
        )))
        .bind(filter.state.map(|s| s.as_str()))
        .bind(filter.limit)
        .fetch_all(self.pool())
        .await?;
        rows.into_iter().map(job_row).collect()
    }

    /// Cancels a job that has not finished. Returns the state it was in; a finished job is
    /// left as it is.
    pub async fn cancel_job(&self, id: i64, by: &str) -> Result<JobState> {
        let mut tx = self.begin().await?;
        // Lock order is tasks, then jobs, everywhere (claim, start, complete, rescue): taking
        // the job first here could deadlock against a claim of the same task.
        sqlx::query("SELECT id FROM tasks WHERE job_id = $1 ORDER BY id FOR UPDATE")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let state: String = sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("job {id}")))?;
        let previous: JobState = state.parse().map_err(StoreError::Corrupt)?;
        if previous.is_terminal() {
            return Ok(previous);
        }
        let reason = format!("cancelled by {by}");
        sqlx::query(
            "UPDATE jobs SET state = 'cancelled', reason = $2, finished_at = now() WHERE id = $1",
        )
        .bind(id)
        .bind(&reason)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE tasks SET state = 'cancelled', reason = $2, finished_at = now()
             WHERE job_id = $1 AND state IN ('pending', 'assigned', 'running')",
        )
        .bind(id)
        .bind(&reason)
        .execute(&mut *tx)
        .await?;
        record_event(&mut tx, Some(id), None, "cancelled", Some(&reason)).await?;
        notify(&mut tx, Channel::Stop, None).await?;
        notify(&mut tx, Channel::Job, Some(id)).await?;
        tx.commit().await?;
        Ok(previous)
    }
}
