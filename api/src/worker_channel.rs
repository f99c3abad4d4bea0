//! The worker channel: workers dial out to these endpoints and never listen themselves.
//!
//! A worker registers once, then keeps one long poll open: the poll answers as soon as there
//! is work for the worker's free slots or a stop order for one of its tasks (woken by NOTIFY,
//! with a periodic re-check as a safety net), or when its wait runs out. Every call about a
//! task names `(worker, task, attempt)`; a mismatch is `409 lease_lost` and the worker kills
//! that process group.

use crate::auth::{Caller, Permission};
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
    Assignment, CompleteRequest, HeartbeatRequest, LogBatch, PollRequest, PollResponse,
    RegisterRequest, RegisterResponse, StopOrder, StopWhy, TaskLease, WorkerList, WorkerSummary,
};
use std::time::Duration;
use store::{Channel, Completion, StopReason, Wakeup};
use tokio::time::Instant;

/// The longest a poll is held open. Shorter than common proxy idle timeouts (60 s), so a
/// load balancer between worker and API does not cut it.
const MAX_POLL_WAIT: Duration = Duration::from_secs(25);

/// A held poll re-checks the tables this often even without a notification.
const POLL_SAFETY_RECHECK: Duration = Duration::from_secs(5);

/// Most lines in one log batch; keeps one insert's arrays bounded.
const MAX_LOG_BATCH: usize = 5000;

fn worker_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// Register a worker (join token).
#[utoipa::path(post, path = "/v1/workers", request_body = RegisterRequest, responses((status = 200, body = RegisterResponse)))]
pub async fn register(
    State(app): State<AppState>,
    caller: Caller,
    body: Result<Json<RegisterRequest>, JsonRejection>,
) -> ApiResult<Json<RegisterResponse>> {
    caller.require(Permission::ActAsWorker)?;
    let req = json_body(body)?;
    if !worker_name_ok(&req.name) {
        return Err(ApiError::BadRequest(format!(
            "worker name '{}' must be 1-64 letters, digits, '-', '_' or '.'",
            req.name
        )));
    }
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
pub async fn list(State(app): State<AppState>, caller: Caller) -> ApiResult<Json<WorkerList>> {
    caller.require(Permission::ReadJobs)?;
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
#[utoipa::path(delete, path = "/v1/workers/{worker}", responses((status = 204)))]
pub async fn deregister(
    State(app): State<AppState>,
    caller: Caller,
    Path(worker): Path<i64>,
) -> ApiResult<StatusCode> {
    caller.require(Permission::ActAsWorker)?;
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

/// The long poll: new work for the free slots, and stop orders for running tasks.
#[utoipa::path(post, path = "/v1/workers/{worker}/poll", request_body = PollRequest, responses((status = 200, body = PollResponse), (status = 410, body = protocol::ErrorBody)))]
pub async fn poll(
    State(app): State<AppState>,
    caller: Caller,
    Path(worker): Path<i64>,
    body: Result<Json<PollRequest>, JsonRejection>,
) -> ApiResult<Json<PollResponse>> {
    caller.require(Permission::ActAsWorker)?;
    let req = json_body(body)?;
    let deadline = Instant::now() + Duration::from_millis(req.wait_ms).min(MAX_POLL_WAIT);
    let view = claiming_view(&app, worker).await?;
    let running: Vec<(i64, i32)> = req
        .running
        .iter()
        .map(|l| (l.task.0, l.attempt.0))
        .collect();
    // Subscribe before the first check so a NOTIFY between check and wait is not missed.
    let mut rx = app.hub.subscribe_work();
    // A worker drops a held poll when one of its tasks ends (to poll again with the freed
    // slot). Database work is shielded from that cancellation: a query cut off half way
    // makes sqlx throw its connection away, and connections are expensive to replace.
    let setup = {
        let (store, running, free, reconcile) = (
            app.store.clone(),
            running.clone(),
            req.free_slots,
            req.reconcile,
        );
        async move {
            // With a free slot, the claim records the heartbeat in its own transaction.
            if free == 0 {
                store.heartbeat(worker).await?;
            }
            if reconcile {
                let ids: Vec<i64> = running.iter().map(|r| r.0).collect();
                store.reconcile_worker_tasks(worker, &ids).await?;
            }
            Ok::<(), store::StoreError>(())
        }
    };
    shielded(setup).await?;
    loop {
        let check = {
            let (store, running, mut view, free) = (
                app.store.clone(),
                running.clone(),
                view.clone(),
                req.free_slots,
            );
            async move {
                let stop = store.stop_orders(worker, &running).await?;
                let accelerators = view.inventory.runnable_accelerators();
                let track_devices = !view.inventory.devices.is_empty();
                let claimed = store
                    .claim_batch(worker, &accelerators, free, track_devices, |spec, busy| {
                        view.busy_devices = busy.to_vec();
                        scheduler::fit_now(&view, spec).ok()
                    })
                    .await?;
                Ok::<_, store::StoreError>((stop, claimed))
            }
        };
        let (stop, claimed) = shielded(check).await?;
        let stop = stop_orders(stop);
        let assignments: Vec<Assignment> = claimed
            .into_iter()
            .map(|c| Assignment {
                job: JobId(c.job_id),
                task: TaskId(c.task_id),
                attempt: Attempt(c.attempt),
                spec: c.spec,
                devices: c.devices,
            })
            .collect();
        if !stop.is_empty() || !assignments.is_empty() || Instant::now() >= deadline {
            return Ok(Json(PollResponse { assignments, stop }));
        }
        let relevant = |w: &Wakeup| {
            matches!(
                w,
                Wakeup::Notified {
                    channel: Channel::Work | Channel::Stop,
                    ..
                }
            )
        };
        tokio::select! {
            _ = crate::hub::wait_for(&mut rx, relevant) => {}
            _ = tokio::time::sleep_until(deadline.min(Instant::now() + POLL_SAFETY_RECHECK)) => {}
        }
        // No heartbeat here: every NOTIFY wakes every held poll, and the worker's own
        // heartbeats keep its lease; a lost worker is caught by the claim.
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
#[utoipa::path(post, path = "/v1/workers/{worker}/heartbeat", request_body = HeartbeatRequest, responses((status = 200, body = PollResponse), (status = 410, body = protocol::ErrorBody)))]
pub async fn heartbeat(
    State(app): State<AppState>,
    caller: Caller,
    Path(worker): Path<i64>,
    body: Result<Json<HeartbeatRequest>, JsonRejection>,
) -> ApiResult<Json<PollResponse>> {
    caller.require(Permission::ActAsWorker)?;
    let req = json_body(body)?;
    app.store.heartbeat(worker).await?;
    let running: Vec<(i64, i32)> = req
        .running
        .iter()
        .map(|l| (l.task.0, l.attempt.0))
        .collect();
    let stop = stop_orders(app.store.stop_orders(worker, &running).await?);
    Ok(Json(PollResponse {
        assignments: vec![],
        stop,
    }))
}

/// The task's process has started.
#[utoipa::path(post, path = "/v1/workers/{worker}/tasks/{task}/attempts/{attempt}/started", responses((status = 204), (status = 409, body = protocol::ErrorBody)))]
pub async fn started(
    State(app): State<AppState>,
    caller: Caller,
    Path((worker, task, attempt)): Path<(i64, i64, i32)>,
) -> ApiResult<StatusCode> {
    caller.require(Permission::ActAsWorker)?;
    app.store.mark_running(worker, task, attempt).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Appends log lines (idempotent by `seq`).
#[utoipa::path(post, path = "/v1/workers/{worker}/tasks/{task}/attempts/{attempt}/logs", request_body = LogBatch, responses((status = 204), (status = 409, body = protocol::ErrorBody)))]
pub async fn append_logs(
    State(app): State<AppState>,
    caller: Caller,
    Path((worker, task, attempt)): Path<(i64, i64, i32)>,
    body: Result<Json<LogBatch>, JsonRejection>,
) -> ApiResult<StatusCode> {
    caller.require(Permission::ActAsWorker)?;
    let batch = json_body(body)?;
    if batch.lines.len() > MAX_LOG_BATCH {
        return Err(ApiError::BadRequest(format!(
            "at most {MAX_LOG_BATCH} lines per batch"
        )));
    }
    let lines: Vec<(i64, i16, String)> = batch
        .lines
        .into_iter()
        .map(|l| (l.seq, l.stream.as_i16(), l.text))
        .collect();
    app.store.append_logs(worker, task, attempt, &lines).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Uploads the task's packed outputs (`.tar.gz`).
#[utoipa::path(put, path = "/v1/workers/{worker}/tasks/{task}/attempts/{attempt}/outputs", request_body(content = Vec<u8>, content_type = "application/gzip"), responses((status = 204), (status = 409, body = protocol::ErrorBody)))]
pub async fn upload_outputs(
    State(app): State<AppState>,
    caller: Caller,
    Path((worker, task, attempt)): Path<(i64, i64, i32)>,
    body: Body,
) -> ApiResult<StatusCode> {
    caller.require(Permission::ActAsWorker)?;
    let job = app.store.check_lease(worker, task, attempt).await?;
    let key = format!("outputs/{job}/task-{task}-attempt-{attempt}.tar.gz");
    let (_, bytes) =
        crate::blobs::store_stream(&app, &object_store::path::Path::from(key.as_str()), body)
            .await?;
    app.store
        .set_outputs(worker, task, attempt, &key, bytes as i64)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The task ended.
#[utoipa::path(post, path = "/v1/workers/{worker}/tasks/{task}/attempts/{attempt}/complete", request_body = CompleteRequest, responses((status = 204), (status = 409, body = protocol::ErrorBody)))]
pub async fn complete(
    State(app): State<AppState>,
    caller: Caller,
    Path((worker, task, attempt)): Path<(i64, i64, i32)>,
    body: Result<Json<CompleteRequest>, JsonRejection>,
) -> ApiResult<StatusCode> {
    caller.require(Permission::ActAsWorker)?;
    let req = json_body(body)?;
    let done = Completion {
        exit_code: req.exit_code,
        error: req.error,
    };
    app.store
        .complete_task(worker, task, attempt, &done)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
