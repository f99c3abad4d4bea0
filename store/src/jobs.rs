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

/// One node (task) of a multi-node job.
#[derive(Debug, Clone)]
pub struct NodeRow {
    pub node: i32,
    pub task_id: i64,
    pub state: String,
    pub attempt: i32,
    pub worker_id: Option<i64>,
    pub worker_name: Option<String>,
    pub reason: Option<String>,
    pub exit_code: Option<i32>,
    pub devices: Vec<u32>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub outputs_key: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub state: Option<JobState>,
    /// Only jobs submitted by the token of this name.
    pub submitted_by: Option<String>,
    /// Only jobs whose (first) task ran, or runs, on the worker of this name.
    pub worker: Option<String>,
    /// Only jobs older than this id (the next page, newest first).
    pub before: Option<i64>,
    pub limit: i64,
}

/// A page of the job list.
#[derive(Debug, Clone)]
pub struct JobPage {
    pub jobs: Vec<JobRow>,
    /// Set when the page stopped at its window before finding `limit` jobs: the oldest id
    /// it looked at (the next page goes on below it).
    pub scanned_down_to: Option<i64>,
}

/// The conditions on `jobs j0` itself (id and submitter: both indexed).
fn push_job_bounds(q: &mut sqlx::QueryBuilder<sqlx::Postgres>, filter: &JobFilter) {
    if let Some(before) = filter.before {
        q.push(" AND j0.id < ").push_bind(before);
    }
    if let Some(name) = &filter.submitted_by {
        q.push(" AND j0.submitted_by IN (SELECT id FROM tokens WHERE name = ")
            .push_bind(name.clone())
            .push(")");
    }
}

/// One entry of a job's timeline.
#[derive(Debug, Clone)]
pub struct EventRow {
    pub kind: String,
    pub detail: Option<String>,
    pub worker_name: Option<String>,
    pub at: DateTime<Utc>,
}

/// A device a running (or assigned) task holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldDevice {
    pub worker_id: i64,
    pub device: u32,
    pub job_id: i64,
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

/// Jobs per insert statement of a large batch (see `Store::insert_jobs`): about 50 ms of
/// writing, after which workers can start on them.
const INSERT_CHUNK: usize = 1000;

/// A key used before for a different job. Keys are stored as `<token>:<key>[:<i>]`; the
/// caller knows only its own part.
fn key_conflict(stored: &str, existing: i64) -> StoreError {
    let key = stored.split_once(':').map(|(_, k)| k).unwrap_or(stored);
    StoreError::Conflict(format!(
        "idempotency key '{key}' was used for job {existing} with a different spec"
    ))
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
        let keys = [idempotency_key.map(str::to_string)];
        let ids = self
            .insert_jobs(std::slice::from_ref(spec), submitted_by, &keys)
            .await?;
        Ok(ids[0])
    }

    /// Inserts many pending jobs, their tasks and events, and wakes the workers. `keys[i]` is
    /// job i's idempotency key, if any: a repeat with the same key and the same spec returns
    /// the first job; the same key with a different spec is `Conflict`, and then nothing is
    /// inserted. Returns the ids in input order.
    ///
    /// Large batches go in chunks of `INSERT_CHUNK` jobs, a statement each (each atomic on
    /// its own), so that workers start on the first jobs while the rest are written: 10,000
    /// jobs in one statement kept every worker idle for 0.7 s. An interrupted batch is
    /// completed by its retry under the same keys.
    pub async fn insert_jobs(
        &self,
        specs: &[JobSpec],
        submitted_by: Option<i64>,
        keys: &[Option<String>],
    ) -> Result<Vec<i64>> {
        assert_eq!(specs.len(), keys.len(), "one key slot per spec");
        if specs.len() > 1 {
            self.refuse_reused_keys(specs, keys).await?;
        }
        let mut ids = Vec::with_capacity(specs.len());
        for start in (0..specs.len()).step_by(INSERT_CHUNK) {
            let end = (start + INSERT_CHUNK).min(specs.len());
            let mut conn = self.pool().acquire().await?;
            ids.extend(
                insert_chunk_in(
                    &mut conn,
                    &specs[start..end],
                    submitted_by,
                    &keys[start..end],
                    true,
                )
                .await?,
            );
        }
        Ok(ids)
    }

    /// `Conflict` when a key of the batch was used before for a different job.
    async fn refuse_reused_keys(&self, specs: &[JobSpec], keys: &[Option<String>]) -> Result<()> {
        let json: Vec<sqlx::types::Json<&JobSpec>> = specs.iter().map(sqlx::types::Json).collect();
        let reused: Option<(String, i64)> = sqlx::query_as(
            "SELECT j.idempotency_key, j.id
             FROM unnest($1::text[], $2::jsonb[]) AS k(key, spec)
             JOIN jobs j ON j.idempotency_key = k.key
             WHERE j.spec <> k.spec
             LIMIT 1",
        )
        .bind(keys)
        .bind(&json)
        .fetch_optional(self.pool())
        .await?;
        match reused {
            Some((key, existing)) => Err(key_conflict(&key, existing)),
            None => Ok(()),
        }
    }

    /// Where a gang's latest attempt was placed and why (its latest `placed` event).
    pub async fn gang_placement(&self, id: i64) -> Result<Option<String>> {
        Ok(sqlx::query_scalar(
            "SELECT detail FROM events WHERE job_id = $1 AND kind = 'placed' ORDER BY id DESC LIMIT 1",
        )
        .bind(id)
        .fetch_optional(self.pool())
        .await?
        .flatten())
    }

    /// Every node of a job, in node order.
    pub async fn job_nodes(&self, id: i64) -> Result<Vec<NodeRow>> {
        let rows = sqlx::query(
            "SELECT t.task_index, t.id, t.state, t.attempt, t.worker_id, w.name AS worker_name,
                    t.reason, t.exit_code, t.devices, t.started_at, t.finished_at, t.outputs_key
             FROM tasks t LEFT JOIN workers w ON w.id = t.worker_id
             WHERE t.job_id = $1 ORDER BY t.task_index",
        )
        .bind(id)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| NodeRow {
                node: r.get("task_index"),
                task_id: r.get("id"),
                state: r.get("state"),
                attempt: r.get("attempt"),
                worker_id: r.get("worker_id"),
                worker_name: r.get("worker_name"),
                reason: r.get("reason"),
                exit_code: r.get("exit_code"),
                devices: r
                    .get::<Vec<i32>, _>("devices")
                    .into_iter()
                    .map(|d| d as u32)
                    .collect(),
                started_at: r.get("started_at"),
                finished_at: r.get("finished_at"),
                outputs_key: r.get("outputs_key"),
            })
            .collect())
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

    /// Jobs newest first, at most `filter.limit`.
    pub async fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<JobRow>> {
        Ok(self.list_jobs_page(filter, None).await?.jobs)
    }

    /// A page of jobs, newest first. The page's ids are chosen first (`page`, with the limit
    /// written into the statement: a generic plan that guesses a third of the table for
    /// `LIMIT $n` scans all of it), then joined with their task, worker and token.
    ///
    /// `jobs.state` has no index (its updates stay HOT: migration 0007), and the worker is
    /// on the task, so filtering by either reads jobs newest first. With `window`, such a
    /// page looks at no more than that many jobs: a rare state then costs a bounded read,
    /// and the page says how far down it looked (`scanned_down_to`) for the next to go on.
    pub async fn list_jobs_page(&self, filter: &JobFilter, window: Option<i64>) -> Result<JobPage> {
        let limit = filter.limit.clamp(1, 10_000);
        let scans = filter.state.is_some() || filter.worker.is_some();
        let window = window.filter(|_| scans).map(|w| w.clamp(limit, 1_000_000));
        // Every piece of SQL text below is a constant or a number; values are bound.
        let mut q =
            sqlx::QueryBuilder::new("WITH win AS (SELECT j0.id, j0.state FROM jobs j0 WHERE true");
        push_job_bounds(&mut q, filter);
        q.push(" ORDER BY j0.id DESC");
        // Without a state or worker filter every job the window reads is on the page.
        match (scans, window) {
            (false, _) => q.push(format!(" LIMIT {limit}")),
            (true, Some(w)) => q.push(format!(" LIMIT {w}")),
            (true, None) => &mut q,
        };
        q.push("), page AS (SELECT win.id FROM win");
        if filter.worker.is_some() {
            q.push(" JOIN tasks t0 ON t0.job_id = win.id AND t0.task_index = 0");
        }
        q.push(" WHERE true");
        if let Some(state) = filter.state {
            q.push(" AND win.state = ").push_bind(state.as_str());
        }
        if let Some(name) = &filter.worker {
            q.push(" AND t0.worker_id IN (SELECT id FROM workers WHERE name = ")
                .push_bind(name.clone())
                .push(")");
        }
        q.push(format!(" ORDER BY win.id DESC LIMIT {limit})"));
        q.push(format!(
            " SELECT {JOB_COLUMNS} JOIN page ON page.id = j.id ORDER BY j.id DESC"
        ));
        let jobs = q
            .build()
            .fetch_all(self.pool())
            .await?
            .into_iter()
            .map(job_row)
            .collect::<Result<Vec<_>>>()?;
        let mut scanned_down_to = None;
        if let Some(w) = window
            && (jobs.len() as i64) < limit
        {
            // Fewer matches than asked: either the jobs ran out, or the window did.
            let mut q = sqlx::QueryBuilder::new(
                "SELECT min(id), count(*) FROM (SELECT j0.id FROM jobs j0 WHERE true",
            );
            push_job_bounds(&mut q, filter);
            q.push(format!(" ORDER BY j0.id DESC LIMIT {w}) win"));
            let row = q.build().fetch_one(self.pool()).await?;
            let (oldest, looked): (Option<i64>, i64) = (row.get(0), row.get(1));
            if looked == w {
                scanned_down_to = oldest;
            }
        }
        Ok(JobPage {
            jobs,
            scanned_down_to,
        })
    }

    /// A job's events, oldest first: its timeline.
    pub async fn job_events(&self, id: i64) -> Result<Vec<EventRow>> {
        let rows = sqlx::query(
            "SELECT e.kind, e.detail, w.name AS worker_name, e.at
             FROM events e LEFT JOIN workers w ON w.id = e.worker_id
             WHERE e.job_id = $1 ORDER BY e.id LIMIT 1000",
        )
        .bind(id)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| EventRow {
                kind: r.get("kind"),
                detail: r.get("detail"),
                worker_name: r.get("worker_name"),
                at: r.get("at"),
            })
            .collect())
    }

    /// Every device held by an assigned or running task, with its job.
    pub async fn held_devices(&self) -> Result<Vec<HeldDevice>> {
        let rows = sqlx::query(
            "SELECT t.worker_id, d.device, t.job_id
             FROM tasks t CROSS JOIN LATERAL unnest(t.devices) AS d(device)
             WHERE t.state IN ('assigned', 'running') AND t.worker_id IS NOT NULL
             ORDER BY t.worker_id, d.device",
        )
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| HeldDevice {
                worker_id: r.get(0),
                device: r.get::<i32, _>(1) as u32,
                job_id: r.get(2),
            })
            .collect())
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

impl Store {
    /// Deletes up to `limit` jobs that finished more than `older_than` ago, with their tasks,
    /// logs and events, and returns the object-store keys of their outputs for the caller to
    /// delete. Keeps the tables (and so every scan of them) from growing without end.
    pub async fn prune_finished(
        &self,
        older_than: std::time::Duration,
        limit: i64,
    ) -> Result<Vec<String>> {
        let keys: Vec<Option<String>> = sqlx::query_scalar(
            "WITH doomed AS (
                 SELECT id FROM jobs
                 WHERE state IN ('succeeded', 'failed', 'cancelled')
                   AND finished_at < now() - make_interval(secs => $1)
                 ORDER BY id LIMIT $2
             ),
             l AS (DELETE FROM logs WHERE job_id IN (SELECT id FROM doomed)),
             r AS (DELETE FROM call_results WHERE job_id IN (SELECT id FROM doomed)),
             e AS (DELETE FROM events WHERE job_id IN (SELECT id FROM doomed)),
             t AS (DELETE FROM tasks WHERE job_id IN (SELECT id FROM doomed) RETURNING outputs_key),
             j AS (DELETE FROM jobs WHERE id IN (SELECT id FROM doomed))
             SELECT outputs_key FROM t",
        )
        .bind(older_than.as_secs_f64())
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        Ok(keys.into_iter().flatten().collect())
    }
}

/// One statement's worth of `insert_jobs`: the jobs, their tasks and events, and (with
/// `wake`) the wake-up. A job whose key conflicts is not inserted by it.
pub(crate) async fn insert_chunk_in(
    conn: &mut sqlx::PgConnection,
    specs: &[JobSpec],
    submitted_by: Option<i64>,
    keys: &[Option<String>],
    wake: bool,
) -> Result<Vec<i64>> {
    let names: Vec<Option<&str>> = specs
        .iter()
        .map(|s| s.name.as_ref().map(|n| n.as_str()))
        .collect();
    let json: Vec<sqlx::types::Json<&JobSpec>> = specs.iter().map(sqlx::types::Json).collect();
    let accelerators: Vec<&str> = specs.iter().map(|s| s.accelerator.as_str()).collect();
    let priorities: Vec<i32> = specs.iter().map(|s| s.priority).collect();
    let attempts: Vec<i32> = specs.iter().map(|s| s.max_attempts() as i32).collect();
    let retry: Vec<bool> = specs.iter().map(|s| s.retry_failed).collect();
    let plain: Vec<bool> = specs.iter().map(JobSpec::is_plain).collect();
    let nodes: Vec<i32> = specs.iter().map(|s| s.layout.nodes as i32).collect();
    let call_python: Vec<Option<&str>> = specs.iter().map(JobSpec::queueable_call).collect();
    let rows: Vec<(i64, bool)> = sqlx::query_as(
        "WITH input AS MATERIALIZED (
             SELECT nextval(pg_get_serial_sequence('jobs', 'id')) AS id, i.*
             FROM unnest($1::text[], $2::jsonb[], $3::text[], $5::text[], $6::int[], $7::int[], $8::bool[], $10::bool[], $11::int[], $12::text[])
                  WITH ORDINALITY AS i(name, spec, accelerator, key, priority, max_attempts, retry_failed, plain, nodes, call_python, n)
         ),
         j AS (
             INSERT INTO jobs (id, name, spec, accelerator, state, submitted_by, idempotency_key, priority)
             SELECT id, name, spec, accelerator, 'pending', $4, key, priority FROM input
             ON CONFLICT (idempotency_key) DO NOTHING
             RETURNING id
         ),
         -- A task per node, node i's with task_index i.
         t AS (
             INSERT INTO tasks (job_id, task_index, state, accelerator, max_attempts, retry_failed, priority,
                                plain, gang_size, call_python)
             SELECT input.id, node.i, 'pending', input.accelerator, input.max_attempts, input.retry_failed,
                    input.priority, input.plain, input.nodes, input.call_python
             FROM input JOIN j ON j.id = input.id
                  CROSS JOIN LATERAL generate_series(0, input.nodes - 1) AS node(i)
         ),
         e AS (INSERT INTO events (job_id, kind) SELECT id, 'submitted' FROM j)
         -- One wake-up however many jobs: PostgreSQL folds identical notifications.
         SELECT input.id, woken.id IS NOT NULL AS inserted
         FROM input LEFT JOIN (SELECT j.id FROM j, (SELECT CASE WHEN $13 THEN pg_notify($9, '')::text END) AS n) AS woken
              ON woken.id = input.id
         ORDER BY input.n",
    )
    .bind(&names)
    .bind(&json)
    .bind(&accelerators)
    .bind(submitted_by)
    .bind(keys)
    .bind(&priorities)
    .bind(&attempts)
    .bind(&retry)
    .bind(Channel::Work.name())
    .bind(&plain)
    .bind(&nodes)
    .bind(&call_python)
    .bind(wake)
    .fetch_all(&mut *conn)
    .await?;
    let mut ids = Vec::with_capacity(rows.len());
    // A job whose key was used before: the earlier job stands, if it is the same job.
    for (i, (id, inserted)) in rows.into_iter().enumerate() {
        if inserted {
            ids.push(id);
            continue;
        }
        let key = keys[i].as_deref().unwrap_or_default();
        let (existing, same): (i64, bool) =
            sqlx::query_as("SELECT id, spec = $2 FROM jobs WHERE idempotency_key = $1")
                .bind(key)
                .bind(sqlx::types::Json(&specs[i]))
                .fetch_one(&mut *conn)
                .await?;
        if !same {
            return Err(key_conflict(key, existing));
        }
        ids.push(existing);
    }
    Ok(ids)
}
