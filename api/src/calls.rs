//! Remote function calls' results for their callers: `POST /v1/calls/results`, answered at
//! once with the calls that have finished, or held (woken by NOTIFY on the jobs channel,
//! re-read every second as a safety net) until one does or `wait_ms` passes.

use crate::auth::{Caller, Permission};
use crate::error::{ApiError, ApiResult};
use crate::server::AppState;
use axum::Json;
use axum::extract::State;
use protocol::calls::{
    CallResult, CallResults, CallResultsRequest, MAX_CALLS_PER_REQUEST, MAX_RESULTS_WAIT_MS,
};
use std::time::Duration;
use store::Wakeup;
use tokio::time::Instant;

/// Re-read this often while waiting, whatever the notifications say.
const SAFETY_RECHECK: Duration = Duration::from_secs(1);

#[utoipa::path(post, path = "/v1/calls/results", request_body = CallResultsRequest, responses((status = 200, body = CallResults)))]
pub async fn results(
    State(app): State<AppState>,
    caller: Caller,
    Json(req): Json<CallResultsRequest>,
) -> ApiResult<Json<CallResults>> {
    caller.require(Permission::ReadJobs)?;
    if req.jobs.len() > MAX_CALLS_PER_REQUEST {
        return Err(ApiError::BadRequest(format!(
            "ask about at most {MAX_CALLS_PER_REQUEST} calls at once, not {}",
            req.jobs.len()
        )));
    }
    let deadline = Instant::now() + Duration::from_millis(req.wait_ms.min(MAX_RESULTS_WAIT_MS));
    // Subscribed before the first read, so a finish between the read and the wait wakes it.
    let mut rx = app.hub.subscribe_jobs();
    let asked: std::collections::HashSet<i64> = req.jobs.iter().copied().collect();
    loop {
        let found = app.store.call_results(&req.jobs).await?;
        if !found.is_empty() || Instant::now() >= deadline {
            return Ok(Json(CallResults {
                results: found.into_iter().map(view).collect(),
            }));
        }
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
