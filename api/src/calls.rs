//! Remote function calls for their callers: `POST /v1/calls/results`, answered at once with
//! the calls that have finished, or held (woken by NOTIFY on the jobs channel, re-read every
//! second as a safety net) until one does or `wait_ms` passes; and `POST /v1/calls`, which
//! submits one call and waits for it the same way.

use crate::auth::{Authorized, may};
use crate::error::{ApiError, ApiResult};
use crate::server::AppState;
use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::HeaderMap;
use protocol::calls::{
    CallAnswer, CallRequest, CallResult, CallResults, CallResultsRequest, MAX_CALLS_PER_REQUEST,
    MAX_RESULTS_WAIT_MS,
};
use std::time::Duration;
use store::Wakeup;
use tokio::time::Instant;

/// Re-read this often while waiting, whatever the notifications say.
const SAFETY_RECHECK: Duration = Duration::from_secs(1);

#[utoipa::path(post, path = "/v1/calls/results", request_body = CallResultsRequest, responses((status = 200, body = CallResults)))]
pub async fn results(
    State(app): State<AppState>,
    _: Authorized<may::ReadJobs>,
    Json(req): Json<CallResultsRequest>,
) -> ApiResult<Json<CallResults>> {
    if req.jobs.len() > MAX_CALLS_PER_REQUEST {
        return Err(ApiError::BadRequest(format!(
            "ask about at most {MAX_CALLS_PER_REQUEST} calls at once, not {}",
            req.jobs.len()
        )));
    }
    let deadline = Instant::now() + Duration::from_millis(req.wait_ms.min(MAX_RESULTS_WAIT_MS));
    let found = finished_calls(&app, &req.jobs, deadline).await?;
    Ok(Json(CallResults {
        results: found.into_iter().map(view).collect(),
    }))
}

/// Submits one call and waits (up to `wait_ms`) for its result: a single `.remote()` costs
/// one request instead of a submit and a results request.
#[utoipa::path(post, path = "/v1/calls", request_body = CallRequest, responses((status = 200, body = CallAnswer), (status = 422, body = protocol::ErrorBody)))]
pub async fn call(
    State(app): State<AppState>,
    Authorized(caller, _): Authorized<may::SubmitJobs>,
    headers: HeaderMap,
    body: Result<Json<CallRequest>, JsonRejection>,
) -> ApiResult<Json<CallAnswer>> {
    let req = crate::jobs::json_body(body)?;
    if req.spec.call.is_none() {
        return Err(ApiError::BadRequest(
            "POST /v1/calls takes remote function calls; submit other jobs to /v1/jobs".into(),
        ));
    }
    let deadline = Instant::now() + Duration::from_millis(req.wait_ms.min(MAX_RESULTS_WAIT_MS));
    // Subscribed before the submit, so its end cannot slip by: the first read waits for it
    // (a call just submitted has not finished).
    let rx = app.hub.subscribe_jobs();
    let job = crate::jobs::accept(&app, &caller, &headers, &req.spec).await?;
    let result = wait_for_calls(&app, rx, &[job], deadline, true)
        .await?
        .into_iter()
        .next()
        .map(view);
    Ok(Json(CallAnswer { job, result }))
}

/// The calls among `jobs` that have finished, waiting until one has (woken by NOTIFY on the
/// jobs channel, re-read every `SAFETY_RECHECK`) or `deadline` passes.
async fn finished_calls(
    app: &AppState,
    jobs: &[i64],
    deadline: Instant,
) -> ApiResult<Vec<store::CallResult>> {
    // Subscribed before the first read, so a finish between the read and the wait wakes it.
    let rx = app.hub.subscribe_jobs();
    wait_for_calls(app, rx, jobs, deadline, false).await
}

/// `finished_calls` with the subscription `rx` taken earlier; with `wait_first`, the first
/// read waits for a wake-up (or the safety re-check) instead of going at once.
async fn wait_for_calls(
    app: &AppState,
    mut rx: tokio::sync::broadcast::Receiver<Wakeup>,
    jobs: &[i64],
    deadline: Instant,
    wait_first: bool,
) -> ApiResult<Vec<store::CallResult>> {
    let asked: std::collections::HashSet<i64> = jobs.iter().copied().collect();
    let mut read = !wait_first;
    loop {
        if read {
            let found = app.store.call_results(jobs).await?;
            if !found.is_empty() || Instant::now() >= deadline {
                return Ok(found);
            }
        }
        read = true;
        let relevant = |w: &Wakeup| match w {
            Wakeup::Notified {
                job_id: Some(j), ..
            } => asked.contains(j),
            _ => false,
        };
        tokio::select! {
            _ = crate::hub::wait_for(&mut rx, relevant) => {}
            _ = tokio::time::sleep_until(deadline.min(Instant::now() + SAFETY_RECHECK)) => {}
        }
    }
}

fn view(r: store::CallResult) -> CallResult {
    let lines = r
        .lines
        .and_then(|v| serde_json::from_value::<Vec<(i16, String)>>(v).ok())
        .unwrap_or_default()
        .into_iter()
        .map(|(stream, text)| (stream.clamp(0, 255) as u8, text))
        .collect();
    CallResult {
        job: r.job_id,
        state: r.state,
        reason: r.reason,
        ok: r.ok,
        payload: r.payload,
        error: r.error,
        lines,
    }
}
