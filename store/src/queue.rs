//! The queue: claiming tasks for a worker, the stop orders for its running tasks, and putting
//! tasks back in the queue when their attempt ends without a result.
//!
//! Claim and assignment happen in one transaction: a task is never "taken" without being
//! assigned, so a crash at any point leaves it either pending or assigned, never lost. A task
//! assigned by a poll whose answer never reached the worker is handed out again by the
//! worker's next poll (same attempt), so an answer lost on the way costs nothing.
//!
//! Two ways to claim. Jobs that ask for nothing but their accelerator kind (`plain`, most
//! jobs) are claimed by one statement that also fences the poll and records the heartbeat.
//! From the first candidate that asks for more (devices, frameworks, labels) on, and on
//! workers with devices, each candidate is put to the scheduler before it is assigned.

use crate::gangs::Placer;
use crate::wakeups::{Channel, notify};
use crate::{Result, Store, StoreError, record_event};
use domain::{Accelerator, JobSpec};
use sqlx::{Postgres, Row, Transaction};

/// How many candidates a claim that asks the scheduler locks per free slot: it may turn a
/// candidate down (e.g. too few devices), so read a few extra rather than come back empty
/// while fitting work waits behind unfit work. Every extra row stays locked until the claim
/// commits, and concurrent claims skip over it, so keep it low.
const CANDIDATES_PER_SLOT: i64 = 2;

/// Opens the transaction of a poll's queue work (claims, reports, stop orders).
///
/// The claim must walk the claimable index in order and stop after a few rows. With stale
/// statistics (a queue table swings from empty to thousands of rows between autovacuum's
/// analyses) the planner believes few rows are pending and reads and sorts all of them
/// instead: 1.7 ms a claim at 10,000 pending, measured. Sorting is turned off for this
/// transaction only, which leaves the ordered index as the cheapest plan; so is JIT, which
/// the resulting "disabled" cost estimates would otherwise trigger (1.4 s of compiling per
/// claim, measured). No other query here may ask for an order: without a sort it would walk
/// a whole index in that order instead.
///
/// Plans are generic. The batch statements take arrays whose lengths change from call to
/// call, so PostgreSQL would plan them afresh every time, for the same plan (0.5 ms each for
/// the one that records ends, a fifth of the database's time per job, measured). A generic
/// plan knows no array length and trusts the stale statistics, so sequential scans are off
/// too: every statement here has an index to go by, and tests pin the plans of the hot ones.
pub(crate) const ROUND_BEGIN: &str = "BEGIN; SET LOCAL enable_sort = off; \
     SET LOCAL enable_seqscan = off; SET LOCAL jit = off; \
     SET LOCAL plan_cache_mode = force_generic_plan";

/// The candidates of a claim that asks the scheduler, locked in queue order. The CTE fences
/// the LIMIT: without it the planner may evaluate the locking subquery more than once and
/// lock more rows than asked for.
const CLAIM_CANDIDATES: &str = "WITH c AS (
         SELECT id FROM tasks
         WHERE state = 'pending' AND accelerator = ANY($1) AND gang_size = 1
         ORDER BY priority DESC, id
         LIMIT $2
         FOR NO KEY UPDATE SKIP LOCKED
     )
     SELECT t.id, t.job_id, t.attempt, t.priority, j.spec
     FROM c JOIN tasks t ON t.id = c.id JOIN jobs j ON j.id = t.job_id";

/// The state of each task a worker says it runs: $1 tasks, $2 attempts, $3 worker.
const STOP_ORDERS: &str =
    "SELECT r.task, r.attempt, t.state, (t.attempt = r.attempt AND t.worker_id = $3) AS mine
     FROM unnest($1::bigint[], $2::int[]) AS r(task, attempt)
     LEFT JOIN tasks t ON t.id = r.task";

/// Fences the poll and records the heartbeat (see `fence`): $1 worker, $2 poll sequence.
/// Also says whether gang nodes were pushed to the worker, which gang keeps it, and whether
/// a gang waits.
const FENCE_POLL: &str = "UPDATE worker_heartbeats h SET last_seen = now(), poll_seq = $2
     FROM workers w
     WHERE h.worker_id = $1 AND w.id = h.worker_id AND w.state = 'online' AND h.poll_seq <= $2
     RETURNING h.pushed, h.reserved_for,
               EXISTS (SELECT 1 FROM tasks WHERE state = 'pending' AND gang_size > 1) AS gangs_waiting";

/// A claim of plain jobs in one statement: $1 worker, $2 poll sequence number, $3
/// accelerator kinds, $4 how many. It fences the poll and records the heartbeat (`h`: no row
/// when the worker is not online or has sent a newer poll, and then nothing else happens),
/// and assigns the plain candidates ahead of the first one that is not. The last row, all
/// NULLs but the fence's findings, says `h` matched, whether such a candidate was met, and
/// what `FENCE_POLL` says. A worker kept for a gang, or with gang nodes pushed to it, takes
/// nothing here. Gangs' tasks are never candidates (see `store::gangs`). The locking CTE is
/// materialized so that it runs once, as the fence its LIMIT needs.
const CLAIM_PLAIN: &str = "WITH h AS (
         UPDATE worker_heartbeats h SET last_seen = now(), poll_seq = $2
         FROM workers w
         WHERE h.worker_id = $1 AND w.id = h.worker_id AND w.state = 'online' AND h.poll_seq <= $2
         RETURNING h.worker_id, h.pushed, h.reserved_for
     ),
     c AS MATERIALIZED (
         SELECT id, plain, priority FROM tasks
         WHERE state = 'pending' AND accelerator = ANY($3) AND gang_size = 1
           AND EXISTS (SELECT 1 FROM h WHERE NOT pushed AND reserved_for IS NULL)
         ORDER BY priority DESC, id
         LIMIT $4
         FOR NO KEY UPDATE SKIP LOCKED
     ),
     a AS (
         UPDATE tasks SET state = 'assigned', worker_id = $1, attempt = tasks.attempt + 1,
             assigned_at = now(), started_at = NULL, exit_code = NULL, reason = NULL, devices = '{}'
         FROM c
         WHERE tasks.id = c.id
           AND NOT EXISTS (SELECT 1 FROM c AS f WHERE NOT f.plain AND (-f.priority, f.id) <= (-c.priority, c.id))
         RETURNING tasks.id, tasks.job_id, tasks.attempt
     ),
     j AS (UPDATE jobs SET state = 'assigned' FROM a WHERE jobs.id = a.job_id AND jobs.state = 'pending'),
     e AS (INSERT INTO events (job_id, worker_id, kind) SELECT job_id, $1, 'assigned' FROM a)
     SELECT a.id, a.job_id, a.attempt, jobs.spec, NULL::bool AS needs_scheduler,
            NULL::bool AS pushed, NULL::bigint AS reserved_for, NULL::bool AS gangs_waiting
     FROM a JOIN jobs ON jobs.id = a.job_id
     UNION ALL
     SELECT NULL, NULL, NULL, NULL, EXISTS (SELECT 1 FROM c WHERE NOT plain), pushed, reserved_for,
            EXISTS (SELECT 1 FROM tasks WHERE state = 'pending' AND gang_size > 1)
     FROM h";

/// A claim of queueable remote calls (see `JobSpec::queueable_call`) beyond the worker's free
/// slots: $1 worker, $2 poll sequence number, $3 the worker's Python `major.minor`, $4
/// accelerator kinds, $5 how many. Fenced like `CLAIM_PLAIN` (nothing for a poll older than
/// the worker's newest, a worker not online, or one kept for a gang). Only calls ahead of the
/// first other pending task of the worker's kinds are taken (`o`): queue order is kept, and
/// a stream of calls cannot keep the worker's slots from a job waiting behind them.
pub(crate) const CLAIM_CALLS: &str = "WITH h AS (
         SELECT h.worker_id FROM worker_heartbeats h JOIN workers w ON w.id = h.worker_id
         WHERE h.worker_id = $1 AND w.state = 'online' AND h.poll_seq <= $2
           AND NOT h.pushed AND h.reserved_for IS NULL
     ),
     o AS (
         SELECT priority, id FROM tasks
         WHERE state = 'pending' AND call_python IS NULL AND gang_size = 1 AND accelerator = ANY($4)
         ORDER BY priority DESC, id
         LIMIT 1
     ),
     c AS MATERIALIZED (
         SELECT id FROM tasks
         WHERE state = 'pending' AND call_python = $3 AND accelerator = ANY($4) AND gang_size = 1
           AND EXISTS (SELECT 1 FROM h)
           AND NOT EXISTS (SELECT 1 FROM o WHERE (-o.priority, o.id) < (-tasks.priority, tasks.id))
         ORDER BY priority DESC, id
         LIMIT $5
         FOR NO KEY UPDATE SKIP LOCKED
     ),
     a AS (
         UPDATE tasks SET state = 'assigned', worker_id = $1, attempt = tasks.attempt + 1,
             assigned_at = now(), started_at = NULL, exit_code = NULL, reason = NULL, devices = '{}'
         FROM c WHERE tasks.id = c.id
         RETURNING tasks.id, tasks.job_id, tasks.attempt
     ),
     j AS (UPDATE jobs SET state = 'assigned' FROM a WHERE jobs.id = a.job_id AND jobs.state = 'pending'),
     e AS (INSERT INTO events (job_id, worker_id, kind) SELECT job_id, $1, 'assigned' FROM a)
     SELECT a.id, a.job_id, a.attempt, jobs.spec FROM a JOIN jobs ON jobs.id = a.job_id";

/// Claims up to `room` queueable calls for a worker whose Python is `python` (see
/// [`CLAIM_CALLS`]).
pub(crate) async fn claim_calls_in(
    tx: &mut Transaction<'_, Postgres>,
    worker_id: i64,
    seq: u64,
    python: &str,
    accelerators: &[Accelerator],
    room: u32,
) -> Result<Vec<Claimed>> {
    let kinds: Vec<&str> = accelerators.iter().map(|a| a.as_str()).collect();
    let rows: Vec<(i64, i64, i32, sqlx::types::Json<JobSpec>)> = sqlx::query_as(CLAIM_CALLS)
        .bind(worker_id)
        .bind(seq as i64)
        .bind(python)
        .bind(&kinds)
        .bind(i64::from(room))
        .fetch_all(&mut **tx)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(task_id, job_id, attempt, spec)| Claimed {
            job_id,
            task_id,
            attempt,
            spec: spec.0,
            devices: vec![],
            node: 0,
        })
        .collect())
}

/// A task just assigned to the claiming worker (or handed out again).
#[derive(Debug, Clone)]
pub struct Claimed {
    pub job_id: i64,
    pub task_id: i64,
    pub attempt: i32,
    pub spec: JobSpec,
    /// Device indices the task holds on the worker.
    pub devices: Vec<u32>,
    /// Which node of its job the task is (0 for single-node jobs).
    pub node: u32,
}

/// Which poll a claim answers: its sequence number (a claim for a poll older than the
/// worker's newest assigns nothing), the tasks the worker runs, and whether an earlier
/// poll's answer may have been lost (then assigned tasks that it does not run are handed out
/// again).
#[derive(Debug, Clone, Copy, Default)]
pub struct PollContext<'a> {
    pub seq: u64,
    pub running: &'a [i64],
    pub redeliver: bool,
}

/// Whether a running task must stop, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Cancelled,
    LeaseLost,
}

impl Store {
    /// Claims up to `free_slots` tasks for `worker_id` in a transaction of its own; see
    /// [`claim_in`].
    pub async fn claim_batch(
        &self,
        worker_id: i64,
        accelerators: &[Accelerator],
        free_slots: u32,
        track_devices: bool,
        poll: PollContext<'_>,
        place: impl FnMut(&JobSpec, &[u32]) -> Option<Vec<u32>>,
    ) -> Result<Vec<Claimed>> {
        self.claim_with(
            worker_id,
            accelerators,
            free_slots,
            track_devices,
            poll,
            place,
        )
        .await
    }

    /// `claim_batch` with a [`Placer`] that may also start gangs.
    pub async fn claim_with(
        &self,
        worker_id: i64,
        accelerators: &[Accelerator],
        free_slots: u32,
        track_devices: bool,
        poll: PollContext<'_>,
        mut placer: impl Placer,
    ) -> Result<Vec<Claimed>> {
        let mut tx = self.pool().begin_with(ROUND_BEGIN).await?;
        let claimed = claim_in(
            &mut tx,
            worker_id,
            accelerators,
            free_slots,
            track_devices,
            poll,
            &mut placer,
        )
        .await?;
        tx.commit().await?;
        Ok(claimed)
    }

    /// Whether any task of these accelerator kinds is waiting: one cheap read, so that idle
    /// workers woken together need not each run a claim to learn that one of them took it.
    pub async fn work_pending(&self, accelerators: &[Accelerator]) -> Result<bool> {
        let kinds: Vec<&str> = accelerators.iter().map(|a| a.as_str()).collect();
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM tasks WHERE state = 'pending' AND accelerator = ANY($1))",
        )
        .bind(&kinds)
        .fetch_one(self.pool())
        .await?)
    }

    /// Whether a claim by `worker_id` could take anything: a task of these kinds waits, or
    /// gang nodes were pushed to the worker, or a gang keeps it.
    pub async fn anything_to_claim(
        &self,
        worker_id: i64,
        accelerators: &[Accelerator],
    ) -> Result<bool> {
        let kinds: Vec<&str> = accelerators.iter().map(|a| a.as_str()).collect();
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM tasks WHERE state = 'pending' AND accelerator = ANY($2))
                 OR EXISTS (SELECT 1 FROM worker_heartbeats
                            WHERE worker_id = $1 AND (pushed OR reserved_for IS NOT NULL))",
        )
        .bind(worker_id)
        .bind(&kinds)
        .fetch_one(self.pool())
        .await?)
    }

    /// The plans of the hot statements as a poll runs them (its transaction's settings, with
    /// sample arguments), by name, for tests that pin them. Changes nothing.
    #[doc(hidden)]
    pub async fn hot_plans(&self, accelerators: &[Accelerator]) -> Result<Vec<(String, String)>> {
        use crate::reports::{FINISH_BATCH, RECORD_STARTS};
        let kinds: Vec<&str> = accelerators.iter().map(|a| a.as_str()).collect();
        let kinds = format!("'{{{}}}'::text[]", kinds.join(","));
        let mut tx = self.pool().begin_with(ROUND_BEGIN).await?;
        let mut plans = Vec::new();
        for (name, statement, args) in [
            ("claim_each", CLAIM_CANDIDATES, format!("{kinds}, 8")),
            ("claim_plain", CLAIM_PLAIN, format!("1, 1, {kinds}, 4")),
            (
                "record_starts",
                RECORD_STARTS,
                "1, '{1,2}', '{1,1}', '{0,0}'".to_string(),
            ),
            (
                "finish_batch",
                FINISH_BATCH,
                "1, '{1,2}', '{1,1}', '{succeeded,failed}', '{0,1}', '{NULL,x}', '{f,t}', \
                 '{0,0}', '{0,0}', 'gpulayer_job', '{NULL,NULL}'"
                    .to_string(),
            ),
            (
                "calls_ahead",
                CLAIM_CALLS,
                format!("1, 1, '3.11', {kinds}, 16"),
            ),
            (
                "stop_orders",
                STOP_ORDERS,
                "'{1,2}', '{1,1}', 1".to_string(),
            ),
            (
                "assign_new",
                crate::poll::ASSIGN_NEW,
                format!("1, 1, {kinds}, 1"),
            ),
        ] {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "PREPARE {name} AS {statement}"
            )))
            .execute(&mut *tx)
            .await?;
            let lines: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "EXPLAIN EXECUTE {name}({args})"
            )))
            .fetch_all(&mut *tx)
            .await?;
            plans.push((name.to_string(), lines.join("\n")));
        }
        tx.rollback().await?;
        Ok(plans)
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

    /// See [`fail_forgotten_in`].
    pub async fn fail_forgotten_tasks(&self, worker_id: i64, running: &[i64]) -> Result<u64> {
        let mut tx = self.pool().begin_with(ROUND_BEGIN).await?;
        let touched = fail_forgotten_in(&mut tx, worker_id, running).await?;
        tx.commit().await?;
        Ok(touched)
    }

    /// See [`stop_orders_in`].
    pub async fn stop_orders(
        &self,
        worker_id: i64,
        running: &[(i64, i32)],
    ) -> Result<Vec<(i64, i32, StopReason)>> {
        stop_orders_in(self.pool(), worker_id, running).await
    }
}

/// Claims up to `free_slots` pending tasks whose accelerator this worker offers and assigns
/// them to `worker_id`, asking `placer` which devices a candidate would get (None: not this
/// one) unless it is plain. Tasks already assigned to the worker that `poll.running` does not
/// list come first, with `poll.redeliver` (an earlier answer carrying them never arrived) or
/// when a gang's node was pushed to it. A worker kept for a gang claims nothing else, and
/// tries to start that gang; others try to start a waiting gang when `placer` says it is
/// time. Also records the worker's heartbeat. `track_devices` is false for a worker without
/// devices. Fails with `PollSuperseded` when the worker has sent a newer poll (having written
/// nothing), and with `WorkerLost` when it was declared lost.
pub(crate) async fn claim_in(
    tx: &mut Transaction<'_, Postgres>,
    worker_id: i64,
    accelerators: &[Accelerator],
    free_slots: u32,
    track_devices: bool,
    poll: PollContext<'_>,
    placer: &mut impl Placer,
) -> Result<Vec<Claimed>> {
    if free_slots == 0 {
        // Nothing can be waiting for delivery either: a worker's free slots always cover the
        // tasks assigned to it that it has not received.
        return Ok(vec![]);
    }
    let kinds: Vec<&str> = accelerators.iter().map(|a| a.as_str()).collect();
    let mut claimed = Vec::new();
    let mut needs_scheduler = track_devices;
    let fenced = if poll.redeliver || track_devices {
        // Fenced in a statement of its own: what the next statements read is then newer than
        // any claim of an older poll, which took the same row lock first or never will.
        fence(tx, worker_id, poll.seq).await?
    } else {
        let plain = claim_plain(tx, worker_id, poll.seq, &kinds, free_slots as usize).await?;
        claimed = plain.claimed;
        needs_scheduler = plain.needs_scheduler;
        plain.fenced
    };
    if poll.redeliver || fenced.pushed {
        let mut held: Vec<i64> = poll.running.to_vec();
        held.extend(claimed.iter().map(|c| c.task_id));
        claimed.extend(undelivered(tx, worker_id, &held).await?);
        if fenced.pushed {
            sqlx::query("UPDATE worker_heartbeats SET pushed = false WHERE worker_id = $1")
                .bind(worker_id)
                .execute(&mut **tx)
                .await?;
        }
        // The plain claim took nothing meanwhile (pushed) or has not run (redeliver).
        needs_scheduler = true;
    }
    if fenced.reserved_for.is_some() {
        // Kept for a gang: it takes nothing else until the gang starts.
        claimed.extend(crate::gangs::attempt_gang_in(tx, worker_id, placer).await?);
        return Ok(claimed);
    }
    let left = (free_slots as usize).saturating_sub(claimed.len());
    if left > 0 && needs_scheduler {
        if !track_devices && (poll.redeliver || fenced.pushed) {
            let plain = claim_plain(tx, worker_id, poll.seq, &kinds, left).await?;
            needs_scheduler = plain.needs_scheduler;
            claimed.extend(plain.claimed);
        }
        let left = (free_slots as usize).saturating_sub(claimed.len());
        if left > 0 && needs_scheduler {
            claimed.extend(claim_each(tx, worker_id, &kinds, left, track_devices, placer).await?);
        }
    }
    if fenced.gangs_waiting && placer.gangs_due() {
        claimed.extend(crate::gangs::attempt_gang_in(tx, worker_id, placer).await?);
    }
    Ok(claimed)
}

/// What fencing a poll found out about its worker.
#[derive(Debug, Clone, Copy, Default)]
struct Fenced {
    /// Nodes of a gang were assigned to it by another worker's claim.
    pushed: bool,
    /// The gang that keeps it.
    reserved_for: Option<i64>,
    /// Some gang waits to start.
    gangs_waiting: bool,
}

/// Records the heartbeat, refusing a worker declared lost and a poll the worker has
/// replaced. Its row lock serialises claims for one worker, so two claims never hand out the
/// same device and a newer poll sees everything an older one assigned.
async fn fence(tx: &mut Transaction<'_, Postgres>, worker_id: i64, seq: u64) -> Result<Fenced> {
    let row: Option<(bool, Option<i64>, bool)> = sqlx::query_as(FENCE_POLL)
        .bind(worker_id)
        .bind(seq as i64)
        .fetch_optional(&mut **tx)
        .await?;
    match row {
        Some((pushed, reserved_for, gangs_waiting)) => Ok(Fenced {
            pushed,
            reserved_for,
            gangs_waiting,
        }),
        None => Err(why_not_claiming(tx, worker_id).await?),
    }
}

/// Tasks assigned to the worker that it does not run: handed out by an answer that never
/// reached it, or by another worker's claim that started a gang. Handed out (again), same
/// attempt.
async fn undelivered(
    tx: &mut Transaction<'_, Postgres>,
    worker_id: i64,
    running: &[i64],
) -> Result<Vec<Claimed>> {
    let mut tasks: Vec<Claimed> = sqlx::query(
        "SELECT t.id, t.job_id, t.attempt, t.devices, t.task_index, j.spec
         FROM tasks t JOIN jobs j ON j.id = t.job_id
         WHERE t.worker_id = $1 AND t.state = 'assigned' AND t.id <> ALL($2)",
    )
    .bind(worker_id)
    .bind(running)
    .fetch_all(&mut **tx)
    .await?
    .into_iter()
    .map(|r| {
        let spec: sqlx::types::Json<JobSpec> = r.try_get("spec")?;
        let devices: Vec<i32> = r.try_get("devices")?;
        Ok(Claimed {
            job_id: r.try_get("job_id")?,
            task_id: r.try_get("id")?,
            attempt: r.try_get("attempt")?,
            spec: spec.0,
            devices: devices.into_iter().map(|d| d as u32).collect(),
            node: r.try_get::<i32, _>("task_index")? as u32,
        })
    })
    .collect::<Result<_>>()?;
    // Sorted here: the database does not sort in this transaction (see ROUND_BEGIN).
    tasks.sort_by_key(|c| c.task_id);
    Ok(tasks)
}

/// What the one-statement claim of plain jobs did and found.
struct PlainClaim {
    claimed: Vec<Claimed>,
    /// A candidate that needs the scheduler stopped it.
    needs_scheduler: bool,
    fenced: Fenced,
}

/// The one-statement claim of up to `wanted` plain jobs (`CLAIM_PLAIN`), which also fences
/// the poll. Also says whether a candidate that needs the scheduler stopped it.
async fn claim_plain(
    tx: &mut Transaction<'_, Postgres>,
    worker_id: i64,
    seq: u64,
    kinds: &[&str],
    wanted: usize,
) -> Result<PlainClaim> {
    let rows = sqlx::query(CLAIM_PLAIN)
        .bind(worker_id)
        .bind(seq as i64)
        .bind(kinds)
        .bind(wanted as i64)
        .fetch_all(&mut **tx)
        .await?;
    let mut claimed = Vec::with_capacity(rows.len());
    let mut marker = None;
    for r in rows {
        let Some(task_id) = r.try_get::<Option<i64>, _>("id")? else {
            marker = Some((
                r.try_get::<bool, _>("needs_scheduler")?,
                Fenced {
                    pushed: r.try_get("pushed")?,
                    reserved_for: r.try_get("reserved_for")?,
                    gangs_waiting: r.try_get("gangs_waiting")?,
                },
            ));
            continue;
        };
        let spec: sqlx::types::Json<JobSpec> = r.try_get("spec")?;
        claimed.push(Claimed {
            job_id: r.try_get("job_id")?,
            task_id,
            attempt: r.try_get("attempt")?,
            spec: spec.0,
            devices: vec![],
            node: 0,
        });
    }
    let Some((needs_scheduler, fenced)) = marker else {
        return Err(why_not_claiming(tx, worker_id).await?);
    };
    // Sorted here: the database does not sort in this transaction (see ROUND_BEGIN).
    claimed.sort_by_key(|c| c.task_id);
    Ok(PlainClaim {
        claimed,
        needs_scheduler,
        fenced,
    })
}

/// The claim that asks `place` about each candidate before assigning it, with the devices
/// it chose: for workers with devices, and for candidates that are not plain. The poll is
/// fenced already.
async fn claim_each(
    tx: &mut Transaction<'_, Postgres>,
    worker_id: i64,
    kinds: &[&str],
    wanted: usize,
    track_devices: bool,
    placer: &mut impl Placer,
) -> Result<Vec<Claimed>> {
    let mut busy: Vec<u32> = if track_devices {
        let held: Vec<i32> = sqlx::query_scalar(
            "SELECT d FROM tasks t, unnest(t.devices) AS d
             WHERE t.worker_id = $1 AND t.state IN ('assigned', 'running')",
        )
        .bind(worker_id)
        .fetch_all(&mut **tx)
        .await?;
        held.into_iter().map(|d| d as u32).collect()
    } else {
        vec![]
    };
    let mut rows = sqlx::query(CLAIM_CANDIDATES)
        .bind(kinds)
        .bind(wanted as i64 * CANDIDATES_PER_SLOT)
        .fetch_all(&mut **tx)
        .await?;
    // In queue order (sorted here: the database does not sort in this transaction).
    rows.sort_by_key(|r| {
        (
            std::cmp::Reverse(r.get::<i32, _>("priority")),
            r.get::<i64, _>("id"),
        )
    });
    let mut chosen: Vec<Claimed> = Vec::new();
    for r in rows {
        if chosen.len() >= wanted {
            break;
        }
        let spec: sqlx::types::Json<JobSpec> = r.try_get("spec")?;
        if let Some(devices) = placer.fit(&spec.0, &busy) {
            busy.extend(&devices);
            chosen.push(Claimed {
                job_id: r.get("job_id"),
                task_id: r.get("id"),
                attempt: r.get::<i32, _>("attempt") + 1,
                spec: spec.0,
                devices,
                node: 0,
            });
        }
    }
    if chosen.is_empty() {
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
    .execute(&mut **tx)
    .await?;
    Ok(chosen)
}

/// Why a claim's fence matched nothing: the worker was declared lost, or the poll was
/// replaced by a newer one.
async fn why_not_claiming(
    tx: &mut Transaction<'_, Postgres>,
    worker_id: i64,
) -> Result<StoreError> {
    let online: Option<bool> =
        sqlx::query_scalar("SELECT state = 'online' FROM workers WHERE id = $1")
            .bind(worker_id)
            .fetch_optional(&mut **tx)
            .await?;
    Ok(match online {
        Some(true) => StoreError::PollSuperseded(worker_id),
        _ => StoreError::WorkerLost(worker_id),
    })
}

/// Called by a poll that follows a failed one, with the tasks the worker says it runs: a task
/// this worker reported started that it no longer lists was forgotten (its process is gone,
/// its end never reported): it goes back to the queue, or fails when out of attempts. (An
/// assigned task it does not list is not forgotten but undelivered: the claim hands it out
/// again.) Returns the number of tasks touched.
pub(crate) async fn fail_forgotten_in(
    tx: &mut Transaction<'_, Postgres>,
    worker_id: i64,
    running: &[i64],
) -> Result<u64> {
    let mut forgotten: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM tasks WHERE worker_id = $1 AND state = 'running' AND id <> ALL($2)",
    )
    .bind(worker_id)
    .bind(running)
    .fetch_all(&mut **tx)
    .await?;
    if forgotten.is_empty() {
        return Ok(0);
    }
    // Locked in id order, like every lock on several tasks (an index scan over `ANY` walks
    // the array sorted): the order no two transactions can deadlock on.
    forgotten.sort_unstable();
    let forgotten: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM tasks WHERE id = ANY($1) AND worker_id = $2 AND state = 'running'
         FOR UPDATE",
    )
    .bind(&forgotten)
    .bind(worker_id)
    .fetch_all(&mut **tx)
    .await?;
    let reasons = vec!["the worker no longer runs this task".to_string(); forgotten.len()];
    requeue_or_fail(tx, &forgotten, &reasons).await?;
    Ok(forgotten.len() as u64)
}

/// Of the tasks a worker says it runs, those it must stop: cancelled ones, and ones that are
/// no longer its current attempt.
pub(crate) async fn stop_orders_in<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    worker_id: i64,
    running: &[(i64, i32)],
) -> Result<Vec<(i64, i32, StopReason)>> {
    if running.is_empty() {
        return Ok(vec![]);
    }
    let tasks: Vec<i64> = running.iter().map(|r| r.0).collect();
    let attempts: Vec<i32> = running.iter().map(|r| r.1).collect();
    let rows = sqlx::query(STOP_ORDERS)
        .bind(&tasks)
        .bind(&attempts)
        .bind(worker_id)
        .fetch_all(executor)
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
    // A node of a gang takes the whole gang with it: every node stops, and the gang goes
    // back to the queue together (attempts permitting).
    let gangs: Vec<(i64, i64)> =
        sqlx::query_as("SELECT id, job_id FROM tasks WHERE id = ANY($1) AND gang_size > 1")
            .bind(tasks)
            .fetch_all(&mut **tx)
            .await?;
    let mut stopped = std::collections::HashMap::new();
    for (task, job) in &gangs {
        if stopped.contains_key(job) {
            continue;
        }
        let nodes = crate::gangs::lock_gang(tx, *job).await?;
        let i = tasks.iter().position(|t| t == task).unwrap_or_default();
        if let Some(first) = nodes.iter().find(|n| n.id == *task)
            && ["assigned", "running"].contains(&first.state.as_str())
        {
            crate::gangs::stop_gang(tx, *job, &nodes, first, &reasons[i], None, true).await?;
        }
        stopped.insert(*job, ());
    }
    let gang_tasks: Vec<i64> = gangs.iter().map(|(t, _)| *t).collect();
    let (tasks, reasons): (Vec<i64>, Vec<String>) = tasks
        .iter()
        .zip(reasons)
        .filter(|(t, _)| !gang_tasks.contains(t))
        .map(|(t, r)| (*t, r.clone()))
        .unzip();
    let mut jobs: Vec<i64> = gangs.iter().map(|(_, j)| *j).collect();
    jobs.extend(requeue_or_fail_single(tx, &tasks, &reasons).await?);
    Ok(jobs)
}

/// `requeue_or_fail` for tasks of single-node jobs.
async fn requeue_or_fail_single(
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
