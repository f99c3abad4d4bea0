//! The worker channel: workers dial out to these endpoints and never listen themselves.
//!
//! A worker registers once, then keeps one long poll open: the poll first records the starts
//! and ends the worker reports, then answers as soon as there is work for the worker's free
//! slots or a stop order for one of its tasks (woken by NOTIFY, with a periodic re-check as a
//! safety net), or when its wait runs out. Every call about a task names `(worker, task,
//! attempt)`; a mismatch is `409 lease_lost` (a refused end is listed in the answer's `lost`)
//! and the worker kills that process group.

use crate::auth::{Authorized, may};
use crate::error::{ApiError, ApiResult};
use crate::jobs::json_body;
use crate::server::AppState;
use axum::Json;
use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use domain::{Attempt, JobId, TaskId, WorkerId};
use protocol::{
    Assignment, HeartbeatRequest, LogBatch, PollRequest, PollResponse, RegisterRequest,
    RegisterResponse, RendezvousAnswer, RendezvousPoint, StopOrder, StopWhy, TaskLease,
    TaskReports, WorkerList, WorkerSummary,
};
use std::time::Duration;
use store::{Channel, Completion, FinishReport, StartReport, StopReason, Wakeup};
use tokio::time::Instant;

/// The longest a poll is held open. Shorter than common proxy idle timeouts (60 s), so a
/// load balancer between worker and API does not cut it.
const MAX_POLL_WAIT: Duration = Duration::from_secs(25);

/// A held poll re-checks the tables this often even without a notification.
const POLL_SAFETY_RECHECK: Duration = Duration::from_secs(5);

/// How long a poll a submit took waits for that submit's claim (one transaction).
const HANDOFF_WAIT: Duration = Duration::from_secs(10);

/// Most lines in one log batch; keeps one insert's arrays bounded.
const MAX_LOG_BATCH: usize = 5000;

/// Most reports (starts plus ends) in one poll; a worker has one per task it runs.
const MAX_REPORTS: usize = 10_000;

/// Register a worker (join token).
#[utoipa::path(post, path = "/v1/workers", request_body = RegisterRequest, responses((status = 200, body = RegisterResponse)))]
pub async fn register(
    State(app): State<AppState>,
    _: Authorized<may::ActAsWorker>,
    body: Result<Json<RegisterRequest>, JsonRejection>,
) -> ApiResult<Json<RegisterResponse>> {
    let req = json_body(body)?;
    crate::names::check_plain_name("worker", &req.name).map_err(ApiError::BadRequest)?;
    if req.slots == 0 {
        return Err(ApiError::BadRequest(
            "a worker needs at least 1 slot".into(),
        ));
    }
    let id = app
        .store
        .register_worker(store::NewWorker {
            name: &req.name,
            labels: &req.labels,
            slots: req.slots,
            inventory: &req.inventory,
            version: &req.version,
        })
        .await?;
    let lease = app.config.lease;
    Ok(Json(RegisterResponse {
        worker_id: WorkerId(id),
        lease_seconds: lease.as_secs().max(1),
        heartbeat_seconds: (lease.as_secs() / 4).max(1),
    }))
}

/// Workers, online first.
#[utoipa::path(get, path = "/v1/workers", responses((status = 200, body = WorkerList)))]
pub async fn list(
    State(app): State<AppState>,
    _: Authorized<may::ReadJobs>,
) -> ApiResult<Json<WorkerList>> {
    let workers = app
        .store
        .list_workers()
        .await?
        .into_iter()
        .map(|w| WorkerSummary {
            id: WorkerId(w.id),
            name: w.name,
            state: w.state,
            labels: w.labels,
            slots: w.slots,
            busy_slots: w.busy_slots,
            inventory: w.inventory,
            version: w.version,
            last_seen: w.last_seen,
            registered_at: w.registered_at,
            busy_devices: w.busy_devices,
        })
        .collect();
    Ok(Json(WorkerList { workers }))
}

/// A worker leaving on purpose; its unfinished tasks fail at once.
#[utoipa::path(delete, path = "/v1/workers/{worker}", params(("worker" = i64, Path, description = "the worker's id, as registering gave it")), responses((status = 204)))]
pub async fn deregister(
    State(app): State<AppState>,
    _: Authorized<may::ActAsWorker>,
    Path(worker): Path<i64>,
) -> ApiResult<StatusCode> {
    app.store
        .deregister_worker(worker, "the worker shut down")
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The scheduler's view of one worker for its own claims: slots are counted by the poll
/// (`free_slots`) and busy devices by the claim, so both start empty here.
async fn claiming_view(app: &AppState, worker: i64) -> ApiResult<scheduler::WorkerView> {
    // A worker's name, labels and inventory never change after it registers (joining again
    // makes a new worker), so each replica reads them once.
    if let Some(view) = app
        .worker_views
        .lock()
        .expect("worker views lock")
        .get(&worker)
    {
        return Ok(view.clone());
    }
    let store = app.store.clone();
    let row = shielded(async move { store.worker(worker).await }).await?;
    let view = scheduler::WorkerView {
        id: WorkerId(row.id),
        name: row.name,
        inventory: row.inventory,
        labels: row.labels,
        online: true,
        slots: u32::MAX,
        busy_slots: 0,
        busy_devices: vec![],
    };
    let mut views = app.worker_views.lock().expect("worker views lock");
    if views.len() > 100_000 {
        views.clear();
    }
    views.insert(worker, view.clone());
    Ok(view)
}

fn stop_orders(found: Vec<(i64, i32, StopReason)>) -> Vec<StopOrder> {
    found
        .into_iter()
        .map(|(task, attempt, why)| StopOrder {
            lease: TaskLease {
                task: TaskId(task),
                attempt: Attempt(attempt),
            },
            why: match why {
                StopReason::Cancelled => StopWhy::Cancelled,
                StopReason::LeaseLost => StopWhy::LeaseLost,
            },
        })
        .collect()
}

/// The reports of a poll in the store's terms.
fn store_reports(reports: TaskReports) -> (Vec<StartReport>, Vec<FinishReport>) {
    let age = Duration::from_micros;
    let started = reports
        .started
        .into_iter()
        .map(|s| StartReport {
            task_id: s.lease.task.0,
            attempt: s.lease.attempt.0,
            age: age(s.age_us),
        })
        .collect();
    let finished = reports
        .finished
        .into_iter()
        .map(|f| FinishReport {
            task_id: f.lease.task.0,
            attempt: f.lease.attempt.0,
            completion: Completion {
                exit_code: f.exit_code,
                error: f.error,
                call: f.call,
            },
            started_age: f.started_age_us.map(age),
            age: age(f.age_us),
        })
        .collect();
    (started, finished)
}

/// The long poll: records the reported starts and ends, then answers with new work for the
/// free slots and stop orders for running tasks.
#[utoipa::path(post, path = "/v1/workers/{worker}/poll", params(("worker" = i64, Path, description = "the worker's id, as registering gave it")), request_body = PollRequest, responses((status = 200, body = PollResponse), (status = 410, body = protocol::ErrorBody)))]
pub async fn poll(
    State(app): State<AppState>,
    _: Authorized<may::ActAsWorker>,
    Path(worker): Path<i64>,
    body: Result<Json<PollRequest>, JsonRejection>,
) -> ApiResult<Json<PollResponse>> {
    let req = json_body(body)?;
    if req.reports.started.len() + req.reports.finished.len() > MAX_REPORTS {
        return Err(ApiError::BadRequest(format!(
            "at most {MAX_REPORTS} reports per poll"
        )));
    }
    let deadline = Instant::now() + Duration::from_millis(req.wait_ms).min(MAX_POLL_WAIT);
    let view = claiming_view(&app, worker).await?;
    let running: Vec<(i64, i32)> = req
        .running
        .iter()
        .map(|l| (l.task.0, l.attempt.0))
        .collect();
    // Subscribe before the first check so a NOTIFY between check and wait is not missed.
    let mut rx = app.hub.subscribe_work();
    // A poll that reports is answered at once, never held: the worker waits for that answer
    // instead of dropping the poll for a newer one (which would wait on its locks, to record
    // the same reports again). Unless nothing runs there any more: then no news can come.
    let reports = !req.reports.is_empty() && !req.quiet;
    let (started, finished) = store_reports(req.reports);
    let (mut started, mut finished, mut reconcile) = (Some(started), Some(finished), req.reconcile);
    // Set once the poll was woken by new work: then it claims only in turn (see
    // `WokenClaims`). Woken for itself (a gang node pushed to it), after a lost notification
    // or by the periodic re-check, it claims at once.
    let mut woken_at: Option<Instant> = None;
    let mut lost: Vec<TaskLease> = Vec::new();
    // What a submit claimed for this poll while it waited parked (see `handoff`).
    let mut handed: Option<Vec<store::Claimed>> = None;
    let parks = req.free_slots > 0 || (req.call_room > 0 && view.inventory.call_python().is_some());
    loop {
        // A worker drops a held poll when it has news (to send it sooner). Database work is
        // shielded from that cancellation: a query cut off half way makes sqlx throw its
        // connection away, and connections are expensive to replace.
        let outcome = match handed.take() {
            // A submit on this replica claimed for this poll while it waited.
            Some(claimed) => store::RoundOutcome {
                lost: vec![],
                stop: vec![],
                claimed: Some(claimed),
            },
            None => {
                let check = {
                    let (store, running, view, free, seq, turns) = (
                        app.store.clone(),
                        running.clone(),
                        view.clone(),
                        req.free_slots,
                        req.poll_seq,
                        app.woken_claims.clone(),
                    );
                    let call_room = req.call_room;
                    let gangs_due = gangs_due(&app);
                    // The reports and the reconciliation go with the first round only.
                    let (started, finished) = (
                        started.take().unwrap_or_default(),
                        finished.take().unwrap_or_default(),
                    );
                    let reconcile = std::mem::take(&mut reconcile);
                    async move {
                        let accelerators = view.inventory.runnable_accelerators();
                        let round = store::PollRound {
                            worker_id: worker,
                            seq,
                            running: &running,
                            finished: &finished,
                            started: &started,
                            reconcile,
                            accelerators: &accelerators,
                            free_slots: free,
                            track_devices: !view.inventory.devices.is_empty(),
                            call_room,
                            call_python: view.inventory.call_python(),
                        };
                        let placer = RoundPlacer {
                            view: view.clone(),
                            gangs_due,
                        };
                        // Nothing awaits delivery to a held poll (its first round delivered it, and
                        // older polls are fenced off), so once woken it only looks for new work.
                        let _turn = match woken_at {
                            Some(at) if free > 0 => {
                                match WokenClaims::take_turn(&turns, &store, at, &accelerators)
                                    .await?
                                {
                                    Some(turn) => Some(turn),
                                    None => {
                                        let stop = store.stop_orders(worker, &running).await?;
                                        return Ok(store::RoundOutcome {
                                            lost: vec![],
                                            stop,
                                            claimed: Some(vec![]),
                                        });
                                    }
                                }
                            }
                            _ => None,
                        };
                        store.poll_round(&round, placer).await
                    }
                };
                shielded(check).await?
            }
        };
        lost.extend(outcome.lost.into_iter().map(|(task, attempt)| TaskLease {
            task: TaskId(task),
            attempt: Attempt(attempt),
        }));
        let stop = stop_orders(outcome.stop);
        // None: the worker has sent a newer poll, and nobody reads this answer any more.
        let superseded = outcome.claimed.is_none();
        let assignments: Vec<Assignment> = outcome
            .claimed
            .unwrap_or_default()
            .into_iter()
            .map(|c| Assignment {
                job: JobId(c.job_id),
                task: TaskId(c.task_id),
                attempt: Attempt(c.attempt),
                spec: c.spec,
                devices: c.devices,
                node: c.node,
            })
            .collect();
        if superseded
            || reports
            || !stop.is_empty()
            || !assignments.is_empty()
            || !lost.is_empty()
            || Instant::now() >= deadline
        {
            return Ok(Json(PollResponse {
                assignments,
                stop,
                lost,
            }));
        }
        let relevant = |w: &Wakeup| match w {
            Wakeup::Notified {
                channel: Channel::Work | Channel::Stop,
                ..
            } => true,
            Wakeup::Pushed(workers) => workers.contains(&worker),
            _ => false,
        };
        // Parked while it waits, so that a submit to this replica can claim for it at once.
        let (deliver, mut delivery) = tokio::sync::oneshot::channel();
        let parked = parks.then(|| {
            app.idle_polls.park(
                worker,
                crate::handoff::IdlePoll {
                    seq: req.poll_seq,
                    view: view.clone(),
                    running: running.clone(),
                    free_slots: req.free_slots,
                    call_room: req.call_room,
                    deliver,
                    parked_at: std::time::Instant::now(),
                },
            )
        });
        let woken = tokio::select! {
            w = crate::hub::wait_for(&mut rx, relevant) => Some(w),
            _ = tokio::time::sleep_until(deadline.min(Instant::now() + POLL_SAFETY_RECHECK)) => None,
            d = &mut delivery, if parked.is_some() => {
                // The claim is in the database; None or a failed submit: what it may have
                // assigned is handed out by the next round.
                match d {
                    Ok(Some(claimed)) => handed = Some(claimed),
                    _ => reconcile = true,
                }
                woken_at = None;
                continue;
            }
        };
        if let Some(parked) = parked
            && !parked.leave()
        {
            // A submit took this poll just now: its claim is on the way.
            match tokio::time::timeout(HANDOFF_WAIT, delivery).await {
                Ok(Ok(Some(claimed))) => handed = Some(claimed),
                _ => reconcile = true,
            }
            woken_at = None;
            continue;
        }
        woken_at = match woken {
            Some(Wakeup::Notified { .. }) => Some(Instant::now()),
            _ => None,
        };
        // No heartbeat here: every NOTIFY wakes every held poll, and the worker's own
        // heartbeats keep its lease; a lost worker is caught by the claim.
    }
}

/// How often a replica's claims look for a gang to start, besides the claims of the workers
/// a gang keeps (which always do): a gang that cannot start yet would otherwise cost every
/// claim a few statements.
const GANG_RETRY: Duration = Duration::from_millis(200);

/// Whether this round should look for a gang to start (at most every `GANG_RETRY`).
fn gangs_due(app: &AppState) -> bool {
    let mut last = app.gang_tries.lock().expect("gang tries lock");
    let now = Instant::now();
    match *last {
        Some(at) if now.duration_since(at) < GANG_RETRY => false,
        _ => {
            *last = Some(now);
            true
        }
    }
}

/// The scheduler, as one poll's claim asks it: about candidates for the claiming worker, and
/// about a gang on the whole fleet.
pub(crate) struct RoundPlacer {
    pub(crate) view: scheduler::WorkerView,
    pub(crate) gangs_due: bool,
}

impl store::Placer for RoundPlacer {
    fn fit(&mut self, spec: &domain::JobSpec, busy: &[u32]) -> Option<Vec<u32>> {
        self.view.busy_devices = busy.to_vec();
        scheduler::fit_now(&self.view, spec).ok()
    }

    fn gangs_due(&mut self) -> bool {
        self.gangs_due
    }

    fn place_gang(
        &mut self,
        spec: &domain::JobSpec,
        workers: &[store::WorkerRow],
        reserved: &[i64],
    ) -> store::GangChoice {
        let views: Vec<scheduler::WorkerView> = workers
            .iter()
            .cloned()
            .map(crate::placement::view_of)
            .collect();
        let reserved: Vec<WorkerId> = reserved.iter().copied().map(WorkerId).collect();
        match scheduler::place_gang(&views, spec, &reserved) {
            scheduler::GangDecision::Place { nodes, why, .. } => store::GangChoice::Assign {
                nodes: nodes.into_iter().map(|(w, d)| (w.0, d)).collect(),
                why,
            },
            scheduler::GangDecision::Reserve { workers, .. } => {
                store::GangChoice::Reserve(workers.into_iter().map(|w| w.0).collect())
            }
            scheduler::GangDecision::Unplaceable { .. } => store::GangChoice::Wait,
        }
    }
}

/// Held polls that one notification woke take turns to claim, each first learning whether
/// work is left for it: a new job then costs one claim, not one per idle worker (the herd,
/// which doubled the submit-to-start time with 32 idle workers), and the first one woken
/// gets it soonest. What a turn learnt spares the later turns of the same wake-up a query.
#[derive(Debug, Default)]
pub struct WokenClaims {
    /// When the latest turn began.
    last_turn: Option<Instant>,
    /// Nothing of these kinds was pending when a turn that began at this instant looked.
    nothing_pending: Option<(Instant, Vec<domain::Accelerator>)>,
}

impl WokenClaims {
    /// Whether a poll woken at `woken_at` that takes `kinds` must look for work: not when a
    /// turn that began after it woke found nothing of those kinds (anything newer sends a
    /// new notification, which wakes it again).
    fn must_look(&self, woken_at: Instant, kinds: &[domain::Accelerator]) -> bool {
        match &self.nothing_pending {
            Some((at, empty)) => *at < woken_at || !kinds.iter().all(|k| empty.contains(k)),
            None => true,
        }
    }

    /// A woken poll's turn: the guard to hold while it claims, or None when no work of its
    /// kinds is pending (then it claims nothing).
    async fn take_turn<'a>(
        turns: &'a tokio::sync::Mutex<WokenClaims>,
        store: &store::Store,
        woken_at: Instant,
        kinds: &[domain::Accelerator],
    ) -> Result<Option<tokio::sync::MutexGuard<'a, WokenClaims>>, store::StoreError> {
        let mut turn = turns.lock().await;
        let began = Instant::now();
        // The first turn after a wake-up most likely finds the new work: it claims at once.
        // Later turns look first (one cheap read) whether anything is left.
        let first = turn.last_turn.is_none_or(|t| t < woken_at);
        turn.last_turn = Some(began);
        if !first {
            if !turn.must_look(woken_at, kinds) {
                return Ok(None);
            }
            if !store.work_pending(kinds).await? {
                turn.nothing_pending = Some((began, kinds.to_vec()));
                return Ok(None);
            }
        }
        Ok(Some(turn))
    }
}

/// Runs store work to completion even if the request that started it is dropped.
async fn shielded<T: Send + 'static>(
    work: impl std::future::Future<Output = Result<T, store::StoreError>> + Send + 'static,
) -> ApiResult<T> {
    match tokio::spawn(work).await {
        Ok(result) => result.map_err(ApiError::from),
        Err(e) => Err(ApiError::Internal(format!("store task failed: {e}"))),
    }
}

/// Keeps the worker's lease; answers stop orders for tasks it must kill.
#[utoipa::path(post, path = "/v1/workers/{worker}/heartbeat", params(("worker" = i64, Path, description = "the worker's id, as registering gave it")), request_body = HeartbeatRequest, responses((status = 200, body = PollResponse), (status = 410, body = protocol::ErrorBody)))]
pub async fn heartbeat(
    State(app): State<AppState>,
    _: Authorized<may::ActAsWorker>,
    Path(worker): Path<i64>,
    body: Result<Json<HeartbeatRequest>, JsonRejection>,
) -> ApiResult<Json<PollResponse>> {
    let req = json_body(body)?;
    app.store.heartbeat(worker).await?;
    let running: Vec<(i64, i32)> = req
        .running
        .iter()
        .map(|l| (l.task.0, l.attempt.0))
        .collect();
    let stop = stop_orders(app.store.stop_orders(worker, &running).await?);
    Ok(Json(PollResponse {
        stop,
        ..PollResponse::default()
    }))
}

/// Node 0 of a distributed job says where its processes meet.
#[utoipa::path(post, path = "/v1/workers/{worker}/tasks/{task}/attempts/{attempt}/rendezvous", params(("worker" = i64, Path, description = "the worker's id, as registering gave it"), ("task" = i64, Path, description = "the task's id"), ("attempt" = i32, Path, description = "the task's attempt")), request_body = RendezvousPoint, responses((status = 204), (status = 409, body = protocol::ErrorBody)))]
pub async fn set_rendezvous(
    State(app): State<AppState>,
    _: Authorized<may::ActAsWorker>,
    Path((worker, task, attempt)): Path<(i64, i64, i32)>,
    body: Result<Json<RendezvousPoint>, JsonRejection>,
) -> ApiResult<StatusCode> {
    let point = json_body(body)?;
    if point.addr.is_empty() || point.addr.len() > 255 || point.port == 0 {
        return Err(ApiError::BadRequest(
            "a rendezvous needs an address and a port other than 0".into(),
        ));
    }
    let rendezvous = store::Rendezvous {
        addr: point.addr,
        port: point.port,
    };
    app.store
        .set_rendezvous(worker, task, attempt, &rendezvous)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The longest a rendezvous request waits for node 0.
const MAX_RENDEZVOUS_WAIT: Duration = Duration::from_secs(20);

/// Where the other nodes of a distributed job meet node 0: answered as soon as node 0 has
/// said (woken by NOTIFY), or with nothing after a while (ask again).
#[utoipa::path(get, path = "/v1/workers/{worker}/tasks/{task}/attempts/{attempt}/rendezvous", params(("worker" = i64, Path, description = "the worker's id, as registering gave it"), ("task" = i64, Path, description = "the task's id"), ("attempt" = i32, Path, description = "the task's attempt")), responses((status = 200, body = RendezvousAnswer), (status = 409, body = protocol::ErrorBody)))]
pub async fn rendezvous(
    State(app): State<AppState>,
    _: Authorized<may::ActAsWorker>,
    Path((worker, task, attempt)): Path<(i64, i64, i32)>,
) -> ApiResult<Json<RendezvousAnswer>> {
    let deadline = Instant::now() + MAX_RENDEZVOUS_WAIT;
    let mut rx = app.hub.subscribe_jobs();
    loop {
        let (job, found) = app.store.rendezvous(worker, task, attempt).await?;
        if found.is_some() || Instant::now() >= deadline {
            return Ok(Json(RendezvousAnswer {
                rendezvous: found.map(|r| RendezvousPoint {
                    addr: r.addr,
                    port: r.port,
                }),
            }));
        }
        let relevant =
            |w: &Wakeup| matches!(w, Wakeup::Notified { job_id: Some(j), .. } if *j == job);
        tokio::select! {
            _ = crate::hub::wait_for(&mut rx, relevant) => {}
            _ = tokio::time::sleep_until(deadline.min(Instant::now() + POLL_SAFETY_RECHECK)) => {}
        }
    }
}

/// Appends log lines (idempotent by `seq`).
#[utoipa::path(post, path = "/v1/workers/{worker}/tasks/{task}/attempts/{attempt}/logs", params(("worker" = i64, Path, description = "the worker's id, as registering gave it"), ("task" = i64, Path, description = "the task's id"), ("attempt" = i32, Path, description = "the task's attempt")), request_body = LogBatch, responses((status = 204), (status = 409, body = protocol::ErrorBody)))]
pub async fn append_logs(
    State(app): State<AppState>,
    _: Authorized<may::ActAsWorker>,
    Path((worker, task, attempt)): Path<(i64, i64, i32)>,
    body: Result<Json<LogBatch>, JsonRejection>,
) -> ApiResult<StatusCode> {
    let batch = json_body(body)?;
    if batch.lines.len() > MAX_LOG_BATCH {
        return Err(ApiError::BadRequest(format!(
            "at most {MAX_LOG_BATCH} lines per batch"
        )));
    }
    let lines: Vec<(i64, i16, String, Option<i32>)> = batch
        .lines
        .into_iter()
        .map(|l| (l.seq, l.stream.as_i16(), l.text, l.rank.map(|r| r as i32)))
        .collect();
    app.store
        .append_ranked_logs(worker, task, attempt, &lines)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Uploads the task's packed outputs (`.tar.gz`).
#[utoipa::path(put, path = "/v1/workers/{worker}/tasks/{task}/attempts/{attempt}/outputs", params(("worker" = i64, Path, description = "the worker's id, as registering gave it"), ("task" = i64, Path, description = "the task's id"), ("attempt" = i32, Path, description = "the task's attempt")), request_body(content = Vec<u8>, content_type = "application/gzip"), responses((status = 204), (status = 409, body = protocol::ErrorBody)))]
pub async fn upload_outputs(
    State(app): State<AppState>,
    _: Authorized<may::ActAsWorker>,
    Path((worker, task, attempt)): Path<(i64, i64, i32)>,
    body: Body,
) -> ApiResult<StatusCode> {
    let job = app.store.check_lease(worker, task, attempt).await?;
    let key = format!("outputs/{job}/task-{task}-attempt-{attempt}.tar.gz");
    let (_, bytes) = crate::blobs::store_stream(
        &app,
        &object_store::path::Path::from(key.as_str()),
        body,
        None,
    )
    .await?;
    app.store
        .set_outputs(worker, task, attempt, &key, bytes as i64)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
