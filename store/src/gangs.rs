//! Gangs: multi-node jobs, whose N tasks (one per node, `task_index` = node rank) are
//! assigned in one transaction or not at all, stopped together, and retried together.
//!
//! Starting a gang is decided by one claim at a time, cluster-wide: the claim that tries
//! holds `GANG_LOCK` (a transaction-scoped advisory lock, taken without waiting: a claim that
//! finds it taken leaves the gang to the one that holds it). Under it, the gang first in the
//! queue is put to the scheduler (through [`Placer::place_gang`]) with the online workers'
//! rows locked, so none of them claims meanwhile and their free capacity is what it reads.
//! The answer assigns every node at once (the other workers are `pushed`: their next claim
//! hands their node out), or keeps the chosen workers for the gang (`reserved_for`: they take
//! no other work until it starts), or leaves it waiting.
//!
//! Lock order: the advisory lock, then the gang's task rows, then worker rows. Claims that
//! hold their own worker row never wait for the advisory lock, so the two cannot deadlock.
//! Ending, failing and cancelling a gang lock all its task rows in node order, then the job.

use crate::queue::Claimed;
use crate::wakeups::Channel;
use crate::workers::{WORKER_COLUMNS, WorkerRow, worker_row};
use crate::{Result, Store, StoreError, record_event};
use domain::JobSpec;
use sqlx::{Postgres, Row, Transaction};

/// The advisory lock under which gangs are started (an arbitrary constant: "gang").
const GANG_LOCK: i64 = 0x67616e67;

/// What to do with a gang now, as the scheduler decides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GangChoice {
    /// Start it: node i on worker `nodes[i].0`, with those device indices; `why` says how
    /// close together they are (kept as the job's `placed` event).
    Assign {
        nodes: Vec<(i64, Vec<u32>)>,
        why: String,
    },
    /// Keep these workers for it.
    Reserve(Vec<i64>),
    /// Nothing to do now.
    Wait,
}

/// The scheduler's side of a claim: which devices a task would get on the claiming worker,
/// and what to do with a gang.
pub trait Placer {
    /// The devices `spec` would get on the claiming worker with `busy` held, or None.
    fn fit(&mut self, spec: &JobSpec, busy: &[u32]) -> Option<Vec<u32>>;

    /// Whether this claim should look for a gang to start (worth a few statements).
    fn gangs_due(&mut self) -> bool {
        false
    }

    /// What to do with the gang `spec` on the online `workers`; `reserved` are the workers
    /// already kept for it.
    fn place_gang(
        &mut self,
        _spec: &JobSpec,
        _workers: &[WorkerRow],
        _reserved: &[i64],
    ) -> GangChoice {
        GangChoice::Wait
    }
}

/// A plain closure places single tasks and never starts gangs.
impl<F: FnMut(&JobSpec, &[u32]) -> Option<Vec<u32>>> Placer for F {
    fn fit(&mut self, spec: &JobSpec, busy: &[u32]) -> Option<Vec<u32>> {
        self(spec, busy)
    }
}

/// One task of a gang, as its lock reads it.
#[derive(Debug, Clone)]
pub(crate) struct GangTask {
    pub id: i64,
    pub node: i32,
    pub state: String,
    pub worker_id: Option<i64>,
    pub attempt: i32,
    pub max_attempts: i32,
    pub retry_failed: bool,
}

/// Tries to start (or keep workers for) the gang first in the queue, for the claim of
/// `worker_id`. Returns the node assigned to that worker, if any.
pub(crate) async fn attempt_gang_in(
    tx: &mut Transaction<'_, Postgres>,
    worker_id: i64,
    placer: &mut impl Placer,
) -> Result<Vec<Claimed>> {
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
        .bind(GANG_LOCK)
        .fetch_one(&mut **tx)
        .await?;
    if !locked {
        return Ok(vec![]);
    }
    // The gang first in the queue (the index walks queue order; nothing sorts here).
    let head: Option<(i64, sqlx::types::Json<JobSpec>)> = sqlx::query_as(
        "SELECT t.job_id, j.spec FROM tasks t JOIN jobs j ON j.id = t.job_id
         WHERE t.id = (SELECT id FROM tasks WHERE state = 'pending' AND gang_size > 1
                       ORDER BY priority DESC, id LIMIT 1)",
    )
    .fetch_optional(&mut **tx)
    .await?;
    let Some((job_id, spec)) = head else {
        // Nothing left to keep workers for.
        sqlx::query(
            "UPDATE worker_heartbeats SET reserved_for = NULL WHERE reserved_for IS NOT NULL",
        )
        .execute(&mut **tx)
        .await?;
        return Ok(vec![]);
    };
    let tasks = lock_gang(tx, job_id).await?;
    if tasks.iter().any(|t| t.state != "pending") || tasks.len() != spec.layout.nodes as usize {
        return Ok(vec![]);
    }
    // The online workers' rows, locked in id order: none of them claims until this ends, so
    // their free capacity is what the snapshot below reads.
    let reserved: Vec<(i64, Option<i64>)> = sqlx::query_as(
        "SELECT h.worker_id, h.reserved_for FROM worker_heartbeats h JOIN workers w ON w.id = h.worker_id
         WHERE w.state = 'online' ORDER BY h.worker_id FOR NO KEY UPDATE OF h",
    )
    .fetch_all(&mut **tx)
    .await?;
    let kept: Vec<i64> = reserved
        .iter()
        .filter(|(_, r)| *r == Some(job_id))
        .map(|(w, _)| *w)
        .collect();
    let workers = online_workers_in(tx).await?;
    let choice = placer.place_gang(&spec.0, &workers, &kept);
    let chosen: Vec<i64> = match &choice {
        GangChoice::Assign { nodes, .. } => nodes.iter().map(|(w, _)| *w).collect(),
        GangChoice::Reserve(ws) => ws.clone(),
        GangChoice::Wait => vec![],
    };
    // Only this gang keeps workers (the one first in the queue): those it keeps now, no others.
    let keep: Vec<i64> = match &choice {
        GangChoice::Reserve(ws) => ws.clone(),
        _ => vec![],
    };
    sqlx::query(
        "UPDATE worker_heartbeats SET reserved_for = CASE WHEN worker_id = ANY($1) THEN $2 END
         WHERE reserved_for IS NOT NULL OR worker_id = ANY($1)",
    )
    .bind(&keep)
    .bind(job_id)
    .execute(&mut **tx)
    .await?;
    let GangChoice::Assign { nodes, why } = choice else {
        return Ok(vec![]);
    };
    if nodes.len() != tasks.len() || {
        let mut distinct = chosen.clone();
        distinct.sort_unstable();
        distinct.dedup();
        distinct.len() != chosen.len()
    } {
        return Err(StoreError::Corrupt(format!(
            "a gang of {} nodes was placed on {:?}",
            tasks.len(),
            chosen
        )));
    }
    let ids: Vec<i64> = tasks.iter().map(|t| t.id).collect();
    let attempts: Vec<i32> = tasks.iter().map(|t| t.attempt + 1).collect();
    let devices: Vec<String> = nodes
        .iter()
        .map(|(_, d)| {
            format!(
                "{{{}}}",
                d.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
            )
        })
        .collect();
    sqlx::query(
        "WITH u AS (SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::int[], $4::text[]) AS u(id, worker_id, attempt, devices)),
         t AS (
             UPDATE tasks SET state = 'assigned', worker_id = u.worker_id, attempt = u.attempt, assigned_at = now(),
                              started_at = NULL, finished_at = NULL, exit_code = NULL, reason = NULL,
                              devices = u.devices::int[]
             FROM u WHERE tasks.id = u.id
             RETURNING tasks.job_id, tasks.worker_id
         ),
         j AS (UPDATE jobs SET state = 'assigned', reason = NULL WHERE id = $5 AND state = 'pending'),
         p AS (UPDATE worker_heartbeats SET pushed = true WHERE worker_id = ANY($2) AND worker_id <> $6)
         INSERT INTO events (job_id, worker_id, kind, detail)
         SELECT job_id, worker_id, 'assigned', NULL FROM t
         UNION ALL SELECT $5, NULL, 'placed', $7",
    )
    .bind(&ids)
    .bind(&chosen)
    .bind(&attempts)
    .bind(&devices)
    .bind(job_id)
    .bind(worker_id)
    .bind(&why)
    .execute(&mut **tx)
    .await?;
    let others: Vec<String> = chosen
        .iter()
        .filter(|w| **w != worker_id)
        .map(i64::to_string)
        .collect();
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(Channel::Push.name())
        .bind(others.join(","))
        .execute(&mut **tx)
        .await?;
    Ok(tasks
        .iter()
        .zip(&nodes)
        .filter(|(_, (w, _))| *w == worker_id)
        .map(|(t, (_, devices))| Claimed {
            job_id,
            task_id: t.id,
            attempt: t.attempt + 1,
            spec: spec.0.clone(),
            devices: devices.clone(),
            node: t.node as u32,
        })
        .collect())
}

/// Locks every task of a gang, in node order (the order of the `(job_id, task_index)`
/// index, which this reads), then the job.
pub(crate) async fn lock_gang(
    tx: &mut Transaction<'_, Postgres>,
    job_id: i64,
) -> Result<Vec<GangTask>> {
    let rows = sqlx::query(
        "SELECT id, task_index, state, worker_id, attempt, max_attempts, retry_failed FROM tasks
         WHERE job_id = $1 FOR UPDATE",
    )
    .bind(job_id)
    .fetch_all(&mut **tx)
    .await?;
    sqlx::query("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE")
        .bind(job_id)
        .execute(&mut **tx)
        .await?;
    let mut tasks: Vec<GangTask> = rows
        .into_iter()
        .map(|r| GangTask {
            id: r.get("id"),
            node: r.get("task_index"),
            state: r.get("state"),
            worker_id: r.get("worker_id"),
            attempt: r.get("attempt"),
            max_attempts: r.get("max_attempts"),
            retry_failed: r.get("retry_failed"),
        })
        .collect();
    tasks.sort_by_key(|t| t.node);
    Ok(tasks)
}

/// Stops a gang whose node `first` failed (or whose worker was lost) for `cause`: its other
/// live nodes are stopped, and the whole gang goes back to the queue when `retry` and it has
/// attempts left, or fails naming the node that failed first. Wakes the workers that must
/// kill what they run. The gang is locked already (`lock_gang`).
pub(crate) async fn stop_gang(
    tx: &mut Transaction<'_, Postgres>,
    job_id: i64,
    tasks: &[GangTask],
    first: &GangTask,
    cause: &str,
    exit_code: Option<i32>,
    retry: bool,
) -> Result<()> {
    let attempts_left = first.attempt < first.max_attempts;
    let worker: Option<String> = match first.worker_id {
        Some(w) => {
            sqlx::query_scalar("SELECT name FROM workers WHERE id = $1")
                .bind(w)
                .fetch_optional(&mut **tx)
                .await?
        }
        None => None,
    };
    let on = worker
        .map(|w| format!("node {} (worker {w})", first.node))
        .unwrap_or_else(|| format!("node {}", first.node));
    let live: Vec<i64> = tasks
        .iter()
        .filter(|t| ["pending", "assigned", "running"].contains(&t.state.as_str()))
        .map(|t| t.id)
        .collect();
    if retry && attempts_left {
        let reason = format!(
            "{on}: {cause}; retrying the whole gang (attempt {} of {})",
            first.attempt + 1,
            first.max_attempts
        );
        sqlx::query(
            "UPDATE tasks SET state = 'pending', worker_id = NULL, devices = '{}', assigned_at = NULL,
                              finished_at = NULL, reason = $2
             WHERE id = ANY($1)",
        )
        .bind(&live)
        .bind(&reason)
        .execute(&mut **tx)
        .await?;
        sqlx::query("UPDATE jobs SET state = 'pending', reason = $2 WHERE id = $1")
            .bind(job_id)
            .bind(&reason)
            .execute(&mut **tx)
            .await?;
        record_event(tx, Some(job_id), None, "retrying", Some(&reason)).await?;
        crate::wakeups::notify(tx, Channel::Work, None).await?;
    } else {
        let job_reason = match (retry, attempts_left) {
            (true, false) => format!(
                "{on}: {cause}; no attempts left ({} of {} used)",
                first.attempt, first.max_attempts
            ),
            _ => format!("{on}: {cause}"),
        };
        let others = format!("stopped: {on} failed first");
        sqlx::query(
            "UPDATE tasks SET state = 'failed', finished_at = now(),
                              reason = CASE WHEN id = $2 THEN $3 ELSE $4 END,
                              exit_code = CASE WHEN id = $2 THEN $5 ELSE exit_code END
             WHERE id = ANY($1)",
        )
        .bind(&live)
        .bind(first.id)
        .bind(&job_reason)
        .bind(&others)
        .bind(exit_code)
        .execute(&mut **tx)
        .await?;
        sqlx::query(
            "UPDATE jobs SET state = 'failed', reason = $2, exit_code = $3, finished_at = now()
             WHERE id = $1 AND state NOT IN ('succeeded', 'failed', 'cancelled')",
        )
        .bind(job_id)
        .bind(&job_reason)
        .bind(exit_code)
        .execute(&mut **tx)
        .await?;
        record_event(
            tx,
            Some(job_id),
            first.worker_id,
            "failed",
            Some(&job_reason),
        )
        .await?;
        crate::wakeups::notify(tx, Channel::Job, Some(job_id)).await?;
    }
    // The other nodes' workers learn from their stop orders, at once.
    crate::wakeups::notify(tx, Channel::Stop, Some(job_id)).await?;
    Ok(())
}

/// Online workers with what they run now, for the gang placer. (No order: sorting is off
/// in a poll's transaction.)
async fn online_workers_in(tx: &mut Transaction<'_, Postgres>) -> Result<Vec<WorkerRow>> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {WORKER_COLUMNS}
         FROM workers w JOIN worker_heartbeats h ON h.worker_id = w.id
         WHERE w.state = 'online'"
    )))
    .fetch_all(&mut **tx)
    .await?;
    let mut workers: Vec<WorkerRow> = rows.iter().map(worker_row).collect();
    workers.sort_by_key(|w| w.id);
    Ok(workers)
}

/// Where the processes of one attempt of a job meet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendezvous {
    pub addr: String,
    pub port: u16,
}

impl Store {
    /// The workers kept for the gang `job_id` while it waits.
    pub async fn kept_for(&self, job_id: i64) -> Result<Vec<i64>> {
        Ok(
            sqlx::query_scalar("SELECT worker_id FROM worker_heartbeats WHERE reserved_for = $1")
                .bind(job_id)
                .fetch_all(self.pool())
                .await?,
        )
    }

    /// Node 0 of `(task, attempt)` tells where its processes listen. Fenced like every call
    /// about a task; only node 0 of a distributed job may.
    pub async fn set_rendezvous(
        &self,
        worker_id: i64,
        task_id: i64,
        attempt: i32,
        rendezvous: &Rendezvous,
    ) -> Result<()> {
        let job: Option<i64> = sqlx::query_scalar(
            "INSERT INTO rendezvous (job_id, attempt, addr, port)
             SELECT job_id, attempt, $4, $5 FROM tasks
             WHERE id = $1 AND attempt = $2 AND worker_id = $3 AND task_index = 0
               AND state IN ('assigned', 'running')
             ON CONFLICT (job_id, attempt) DO UPDATE SET addr = excluded.addr, port = excluded.port
             RETURNING job_id",
        )
        .bind(task_id)
        .bind(attempt)
        .bind(worker_id)
        .bind(&rendezvous.addr)
        .bind(i32::from(rendezvous.port))
        .fetch_optional(self.pool())
        .await?;
        let Some(job) = job else {
            return Err(StoreError::LeaseLost {
                task: task_id,
                attempt,
            });
        };
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(Channel::Job.name())
            .bind(job.to_string())
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Where `(task, attempt)`'s job meets, once node 0 said; the job id either way.
    /// `LeaseLost` when the task is no longer this worker's.
    pub async fn rendezvous(
        &self,
        worker_id: i64,
        task_id: i64,
        attempt: i32,
    ) -> Result<(i64, Option<Rendezvous>)> {
        let row: Option<(i64, Option<String>, Option<i32>)> = sqlx::query_as(
            "SELECT t.job_id, r.addr, r.port FROM tasks t
             LEFT JOIN rendezvous r ON r.job_id = t.job_id AND r.attempt = t.attempt
             WHERE t.id = $1 AND t.attempt = $2 AND t.worker_id = $3
               AND t.state IN ('assigned', 'running')",
        )
        .bind(task_id)
        .bind(attempt)
        .bind(worker_id)
        .fetch_optional(self.pool())
        .await?;
        match row {
            None => Err(StoreError::LeaseLost {
                task: task_id,
                attempt,
            }),
            Some((job, Some(addr), Some(port))) => Ok((
                job,
                Some(Rendezvous {
                    addr,
                    port: port as u16,
                }),
            )),
            Some((job, _, _)) => Ok((job, None)),
        }
    }
}
