//! Workers: registration, heartbeats, listing, and the rescue of workers that went silent.

use crate::{Result, Store, StoreError, record_event};
use chrono::{DateTime, Utc};
use domain::Inventory;
use sqlx::Row;
use std::collections::BTreeMap;
use std::time::Duration;

pub struct NewWorker<'a> {
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub slots: u32,
    pub inventory: &'a Inventory,
    pub version: &'a str,
}

#[derive(Debug, Clone)]
pub struct WorkerRow {
    pub id: i64,
    pub name: String,
    pub state: String,
    pub labels: BTreeMap<String, String>,
    pub slots: u32,
    pub busy_slots: u32,
    pub inventory: Inventory,
    pub version: String,
    pub last_seen: Option<DateTime<Utc>>,
    pub registered_at: DateTime<Utc>,
    /// Device indices held by its assigned and running tasks.
    pub busy_devices: Vec<u32>,
}

/// A worker the rescue sweep declared lost, and the jobs it was running (requeued, or
/// failed when out of attempts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostWorker {
    pub id: i64,
    pub name: String,
    pub jobs: Vec<i64>,
}

impl Store {
    pub async fn register_worker(&self, w: NewWorker<'_>) -> Result<i64> {
        let mut tx = self.begin().await?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO workers (name, labels, inventory, slots, state, version)
             VALUES ($1, $2, $3, $4, 'online', $5) RETURNING id",
        )
        .bind(w.name)
        .bind(sqlx::types::Json(w.labels))
        .bind(sqlx::types::Json(w.inventory))
        .bind(w.slots as i32)
        .bind(w.version)
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query("INSERT INTO worker_heartbeats (worker_id, last_seen) VALUES ($1, now())")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        record_event(&mut tx, None, Some(id), "worker_joined", Some(w.name)).await?;
        tx.commit().await?;
        Ok(id)
    }

    /// Records that the worker is alive. Fails with `WorkerLost` once it was declared lost.
    pub async fn heartbeat(&self, worker_id: i64) -> Result<()> {
        heartbeat_in(self.pool(), worker_id).await
    }

    /// A worker leaving on purpose: its unfinished tasks go back to the queue at once (or fail
    /// when out of attempts).
    pub async fn deregister_worker(&self, worker_id: i64, reason: &str) -> Result<()> {
        let mut tx = self.begin().await?;
        sqlx::query("UPDATE workers SET state = 'stopped', lost_at = now(), lost_reason = $2 WHERE id = $1 AND state = 'online'")
            .bind(worker_id)
            .bind(reason)
            .execute(&mut *tx)
            .await?;
        release_tasks_of_workers(&mut tx, &[worker_id], &[reason.to_string()]).await?;
        record_event(
            &mut tx,
            None,
            Some(worker_id),
            "worker_stopped",
            Some(reason),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Declares every online worker silent for longer than `lease` lost and takes its
    /// unfinished tasks back (retried elsewhere while they have attempts left). Run by the
    /// leader only.
    pub async fn rescue_lost_workers(&self, lease: Duration) -> Result<Vec<LostWorker>> {
        let mut tx = self.begin().await?;
        let rows = sqlx::query(
            "UPDATE workers w
             SET state = 'lost', lost_at = now(),
                 lost_reason = format('no heartbeat for %s s', floor(extract(epoch FROM now() - h.last_seen)))
             FROM worker_heartbeats h
             WHERE h.worker_id = w.id AND w.state = 'online'
               AND h.last_seen < now() - make_interval(secs => $1)
             RETURNING w.id, w.name, w.lost_reason",
        )
        .bind(lease.as_secs_f64())
        .fetch_all(&mut *tx)
        .await?;
        if rows.is_empty() {
            return Ok(vec![]);
        }
        let ids: Vec<i64> = rows.iter().map(|r| r.get("id")).collect();
        let reasons: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "worker {} lost: {}",
                    r.get::<String, _>("name"),
                    r.get::<String, _>("lost_reason")
                )
            })
            .collect();
        let failed = release_tasks_of_workers(&mut tx, &ids, &reasons).await?;
        for (id, reason) in ids.iter().zip(&reasons) {
            record_event(&mut tx, None, Some(*id), "worker_lost", Some(reason)).await?;
        }
        tx.commit().await?;
        Ok(rows
            .iter()
            .map(|r| {
                let id: i64 = r.get("id");
                LostWorker {
                    id,
                    name: r.get("name"),
                    jobs: failed
                        .iter()
                        .filter(|(w, _)| *w == id)
                        .map(|(_, j)| *j)
                        .collect(),
                }
            })
            .collect())
    }

    /// One worker (its labels and inventory as registered).
    pub async fn worker(&self, id: i64) -> Result<WorkerRow> {
        self.read_workers(Some(id))
            .await?
            .pop()
            .ok_or_else(|| StoreError::NotFound(format!("worker {id}")))
    }

    /// Every worker, online first, with how many tasks and which devices each runs now.
    pub async fn list_workers(&self) -> Result<Vec<WorkerRow>> {
        self.read_workers(None).await
    }

    async fn read_workers(&self, only: Option<i64>) -> Result<Vec<WorkerRow>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {WORKER_COLUMNS}
             FROM workers w LEFT JOIN worker_heartbeats h ON h.worker_id = w.id
             WHERE $1::bigint IS NULL OR w.id = $1
             ORDER BY (w.state = 'online') DESC, w.id DESC
             LIMIT 1000"
        )))
        .bind(only)
        .fetch_all(self.pool())
        .await?;
        Ok(rows.iter().map(worker_row).collect())
    }
}

/// Takes the unfinished tasks of `workers` away from them, the i-th worker's with
/// `reasons[i]`: each goes back to the queue while it has attempts left, and fails otherwise.
/// Returns (worker, job) pairs.
async fn release_tasks_of_workers(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    workers: &[i64],
    reasons: &[String],
) -> Result<Vec<(i64, i64)>> {
    let rows = sqlx::query(
        "SELECT t.id, t.worker_id, r.reason
         FROM tasks t JOIN unnest($1::bigint[], $2::text[]) AS r(worker_id, reason) ON r.worker_id = t.worker_id
         WHERE t.state IN ('assigned', 'running')
         ORDER BY t.id
         FOR UPDATE OF t",
    )
    .bind(workers)
    .bind(reasons)
    .fetch_all(&mut **tx)
    .await?;
    let tasks: Vec<i64> = rows.iter().map(|r| r.get("id")).collect();
    let task_reasons: Vec<String> = rows.iter().map(|r| r.get("reason")).collect();
    let owners: Vec<i64> = rows.iter().map(|r| r.get("worker_id")).collect();
    let jobs = crate::queue::requeue_or_fail(tx, &tasks, &task_reasons).await?;
    Ok(owners.into_iter().zip(jobs).collect())
}

/// Records that the worker is alive. Fails with `WorkerLost` once it was declared lost.
pub(crate) async fn heartbeat_in<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    worker_id: i64,
) -> Result<()> {
    let touched = sqlx::query(
        "UPDATE worker_heartbeats h SET last_seen = now()
         FROM workers w
         WHERE h.worker_id = $1 AND w.id = h.worker_id AND w.state = 'online'",
    )
    .bind(worker_id)
    .execute(executor)
    .await?
    .rows_affected();
    if touched == 0 {
        return Err(StoreError::WorkerLost(worker_id));
    }
    Ok(())
}

/// The columns [`worker_row`] reads, of `workers w` joined with `worker_heartbeats h`: the
/// worker, and how many tasks and which devices it runs now.
pub(crate) const WORKER_COLUMNS: &str = "w.id, w.name, w.state, w.labels, w.slots, w.inventory, w.version,
    w.registered_at, h.last_seen,
    (SELECT count(*) FROM tasks t WHERE t.worker_id = w.id AND t.state IN ('assigned', 'running')) AS busy,
    (SELECT coalesce(array_agg(d), '{}') FROM tasks t, unnest(t.devices) AS d
     WHERE t.worker_id = w.id AND t.state IN ('assigned', 'running')) AS busy_devices";

/// A worker as [`WORKER_COLUMNS`] select it.
pub(crate) fn worker_row(r: &sqlx::postgres::PgRow) -> WorkerRow {
    let labels: sqlx::types::Json<BTreeMap<String, String>> = r.get("labels");
    let inventory: sqlx::types::Json<Inventory> = r.get("inventory");
    WorkerRow {
        id: r.get("id"),
        name: r.get("name"),
        state: r.get("state"),
        labels: labels.0,
        slots: r.get::<i32, _>("slots") as u32,
        busy_slots: r.get::<i64, _>("busy") as u32,
        inventory: inventory.0,
        version: r.get("version"),
        last_seen: r.get("last_seen"),
        registered_at: r.get("registered_at"),
        busy_devices: r
            .get::<Vec<i32>, _>("busy_devices")
            .into_iter()
            .map(|d| d as u32)
            .collect(),
    }
}
