//! What the dashboard draws: the queue sampled over time, and which tasks held which worker's
//! devices (or slots) lately.

use crate::{Result, Store};
use chrono::{DateTime, Utc};
use sqlx::Row;

/// The queue at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSample {
    pub at: DateTime<Utc>,
    pub pending: i32,
    pub running: i32,
    /// Tasks that finished since the previous sample.
    pub finished: i32,
}

/// When a task ran where, for a picture of a worker's occupancy.
#[derive(Debug, Clone)]
pub struct TaskSpan {
    pub worker_id: i64,
    pub job_id: i64,
    pub devices: Vec<u32>,
    pub state: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// The newest tasks a sample looks at for the ones that finished since the last: a task
/// that finished long after it was claimed (thousands of tasks later) is not counted.
const FINISHED_LOOKBACK: i64 = 20_000;

impl Store {
    /// Counts the queue now (waiting, assigned or running, finished since the last sample)
    /// and keeps it; samples older than a day go.
    pub async fn record_queue_sample(&self) -> Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO queue_samples (at, pending, running, finished)
             SELECT now(),
                    (SELECT count(*) FROM tasks WHERE state = 'pending'),
                    (SELECT count(*) FROM tasks WHERE state IN ('assigned', 'running')),
                    (SELECT count(*) FROM (SELECT finished_at FROM tasks
                                           ORDER BY id DESC LIMIT {FINISHED_LOOKBACK}) r
                     WHERE r.finished_at > COALESCE((SELECT max(at) FROM queue_samples),
                                                    now() - interval '15 seconds'))
             ON CONFLICT (at) DO NOTHING"
        )))
        .execute(self.pool())
        .await?;
        sqlx::query("DELETE FROM queue_samples WHERE at < now() - interval '1 day'")
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// The samples since `since`, oldest first.
    pub async fn queue_samples(&self, since: DateTime<Utc>) -> Result<Vec<QueueSample>> {
        let rows = sqlx::query(
            "SELECT at, pending, running, finished FROM queue_samples WHERE at >= $1 ORDER BY at",
        )
        .bind(since)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| QueueSample {
                at: r.get(0),
                pending: r.get(1),
                running: r.get(2),
                finished: r.get(3),
            })
            .collect())
    }

    /// Tasks that ran on a worker since `since`: every one still running, and those among
    /// the newest `newest` tasks that ended after `since`.
    pub async fn recent_task_spans(
        &self,
        since: DateTime<Utc>,
        newest: i64,
    ) -> Result<Vec<TaskSpan>> {
        let newest = newest.clamp(1, 100_000);
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT worker_id, job_id, devices, state, started_at, finished_at FROM (
                 SELECT worker_id, job_id, devices, state, started_at, finished_at FROM tasks
                 ORDER BY id DESC LIMIT {newest}) t
             WHERE state NOT IN ('pending', 'assigned', 'running') AND worker_id IS NOT NULL
               AND started_at IS NOT NULL AND finished_at > $1
             UNION ALL
             SELECT worker_id, job_id, devices, state, started_at, finished_at FROM tasks
             WHERE state IN ('assigned', 'running') AND worker_id IS NOT NULL
               AND started_at IS NOT NULL"
        )))
        .bind(since)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| TaskSpan {
                worker_id: r.get(0),
                job_id: r.get(1),
                devices: r
                    .get::<Vec<i32>, _>(2)
                    .into_iter()
                    .map(|d| d as u32)
                    .collect(),
                state: r.get(3),
                started_at: r.get(4),
                finished_at: r.get(5),
            })
            .collect())
    }
}
