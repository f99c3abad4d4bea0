//! Job endpoints for clients: submit, list, status, cancel, logs and outputs.

use crate::auth::{Authorized, Caller, may};
use crate::error::{ApiError, ApiResult};
use crate::server::AppState;
use axum::Json;
use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use domain::{JobId, JobState};
use futures_util::StreamExt;
use object_store::ObjectStoreExt;
use protocol::{
    CancelResponse, JobList, JobView, LogLine, LogPage, LogStreamMessage, Stream, SubmitRequest,
    WorkerRef,
};
use serde::Deserialize;
use std::collections::HashMap;
use std::io::Seek;
use std::time::Duration;
use store::{JobFilter, JobRow, LogCursor, StoredLine, Wakeup};
use tokio::io::AsyncWriteExt;

/// Most lines one read returns; followers read again at once when a read comes back full.
const LOG_READ_LIMIT: i64 = 2000;

/// A follower re-reads this often even without a notification (a missed hint costs at most
/// this much delay).
const LOG_SAFETY_POLL: Duration = Duration::from_secs(2);

/// Turns axum's JSON rejection into our error with serde's explanation.
pub(crate) fn json_body<T>(body: Result<Json<T>, JsonRejection>) -> ApiResult<T> {
    body.map(|Json(v)| v)
        .map_err(|e| ApiError::BadRequest(format!("invalid request body: {}", e.body_text())))
}

pub(crate) fn job_view(row: JobRow) -> JobView {
    JobView {
        id: JobId(row.id),
        name: row.spec.name.as_ref().map(|n| n.as_str().to_string()),
        state: row.state,
        accelerator: row.spec.accelerator,
        command: row.spec.command.argv().to_vec(),
        source: row.spec.source.clone(),
        outputs: row
            .spec
            .outputs
            .iter()
            .map(|g| g.as_str().to_string())
            .collect(),
        worker: row
            .worker_id
            .zip(row.worker_name)
            .map(|(id, name)| WorkerRef {
                id: domain::WorkerId(id),
                name,
            }),
        attempt: row.attempt,
        exit_code: row.exit_code,
        reason: row.reason,
        submitted_by: row.submitted_by,
        outputs_bytes: row.outputs_bytes,
        devices: row.devices,
        waiting: None,
        created_at: row.created_at,
        assigned_at: row.assigned_at,
        started_at: row.started_at,
        finished_at: row.finished_at,
        layout: row.spec.layout,
        nodes: vec![],
        placed: None,
    }
}

fn node_view(n: store::NodeRow) -> protocol::NodeView {
    protocol::NodeView {
        node: n.node as u32,
        worker: n.worker_id.zip(n.worker_name).map(|(id, name)| WorkerRef {
            id: domain::WorkerId(id),
            name,
        }),
        state: n.state,
        attempt: n.attempt,
        exit_code: n.exit_code,
        reason: n.reason,
        devices: n.devices,
        started_at: n.started_at,
        finished_at: n.finished_at,
    }
}

fn log_line(l: StoredLine) -> LogLine {
    LogLine {
        task: domain::TaskId(l.task_id),
        attempt: domain::Attempt(l.attempt),
        seq: l.seq,
        stream: Stream::from_i16(l.stream),
        text: l.text,
        at: l.at,
        rank: l.rank.map(|r| r as u32),
    }
}

/// Submit a job. Repeating a submit with the same `Idempotency-Key` header returns the
/// first job.
#[utoipa::path(post, path = "/v1/jobs", request_body = SubmitRequest,
    responses((status = 200, body = JobView), (status = 400, body = protocol::ErrorBody)))]
pub async fn submit(
    State(app): State<AppState>,
    Authorized(caller, _): Authorized<may::SubmitJobs>,
    headers: HeaderMap,
    body: Result<Json<SubmitRequest>, JsonRejection>,
) -> ApiResult<Json<JobView>> {
    let req = json_body(body)?;
    let id = accept(&app, &caller, &headers, &req.spec).await?;
    Ok(Json(job_view(app.store.get_job(id).await?)))
}

/// A submit's work: checks `spec`, then hands it straight to a waiting worker when one on
/// this replica can start it now, else admits it (refused when nobody could ever run it)
/// and queues it, waking the workers. The job's id.
/// A job's source must be an uploaded archive the server checked (not, say, a pickled
/// function uploaded as a blob).
async fn check_source(app: &AppState, source: &domain::SourceRef, which: &str) -> ApiResult<()> {
    match app.store.blob_is_source(source.digest.as_str()).await? {
        Some(true) => Ok(()),
        None => Err(ApiError::BadRequest(format!(
            "{which}source {} has not been uploaded: PUT it to /v1/blobs/{} first",
            source.digest.short(),
            source.digest
        ))),
        Some(false) => Err(ApiError::BadRequest(format!(
            "{which}blob {} is not a source archive (it was uploaded as other data): upload the packed source",
            source.digest.short()
        ))),
    }
}

pub(crate) async fn accept(
    app: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    spec: &domain::JobSpec,
) -> ApiResult<i64> {
    spec.check()
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    if let Some(source) = &spec.source {
        check_source(app, source, "").await?;
    }
    let key = headers
        .get(protocol::IDEMPOTENCY_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|k| format!("{}:{k}", caller.token_id));
    let handed =
        crate::handoff::submit_to_idle_poll(app, spec, caller.token_id, key.as_deref()).await?;
    match handed {
        Some(id) => Ok(id),
        None => {
            crate::placement::admit(app, spec).await?;
            Ok(app
                .store
                .insert_job(spec, Some(caller.token_id), key.as_deref())
                .await?)
        }
    }
}

/// Most jobs one batch may hold; larger sets are split by the client.
pub const MAX_BATCH_JOBS: usize = 10_000;

/// Submit many jobs at once (one transaction; all or none). An `Idempotency-Key` header makes
/// a retried batch return the same jobs.
#[utoipa::path(post, path = "/v1/jobs/batch", request_body = protocol::BatchSubmitRequest,
    responses((status = 200, body = protocol::BatchSubmitResponse), (status = 400, body = protocol::ErrorBody),
              (status = 409, body = protocol::ErrorBody), (status = 413, body = protocol::ErrorBody),
              (status = 422, body = protocol::ErrorBody)))]
pub async fn submit_batch(
    State(app): State<AppState>,
    Authorized(caller, _): Authorized<may::SubmitJobs>,
    headers: HeaderMap,
    body: Result<Json<protocol::BatchSubmitRequest>, JsonRejection>,
) -> ApiResult<Json<protocol::BatchSubmitResponse>> {
    let req = json_body(body)?;
    if req.jobs.len() > MAX_BATCH_JOBS {
        return Err(ApiError::PayloadTooLarge(format!(
            "a batch of {} jobs exceeds the limit of {MAX_BATCH_JOBS} per request: split it",
            req.jobs.len()
        )));
    }
    if req.jobs.is_empty() {
        return Err(ApiError::BadRequest("the batch holds no jobs".into()));
    }
    let specs: Vec<domain::JobSpec> = req
        .jobs
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            serde_json::from_value(v)
                .map_err(|e| ApiError::BadRequest(format!("job {}: {e}", i + 1)))
        })
        .collect::<ApiResult<_>>()?;
    crate::placement::admit_batch(&app, &specs).await?;
    for (i, spec) in specs.iter().enumerate() {
        if let Some(source) = &spec.source {
            check_source(&app, source, &format!("job {}: ", i + 1)).await?;
        }
    }
    let key = headers
        .get(protocol::IDEMPOTENCY_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|k| format!("{}:{k}", caller.token_id));
    let keys: Vec<Option<String>> = (0..specs.len())
        .map(|i| key.as_ref().map(|k| format!("{k}:{i}")))
        .collect();
    let ids = app
        .store
        .insert_jobs(&specs, Some(caller.token_id), &keys)
        .await?;
    Ok(Json(protocol::BatchSubmitResponse {
        ids: ids.into_iter().map(JobId).collect(),
    }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct ListQuery {
    /// Only jobs in this state.
    pub state: Option<String>,
    /// At most this many (default 50, at most 1000).
    pub limit: Option<i64>,
}

/// Jobs, newest first.
#[utoipa::path(get, path = "/v1/jobs", params(ListQuery), responses((status = 200, body = JobList)))]
pub async fn list(
    State(app): State<AppState>,
    _: Authorized<may::ReadJobs>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<JobList>> {
    let state = q
        .state
        .as_deref()
        .map(str::parse::<JobState>)
        .transpose()
        .map_err(ApiError::BadRequest)?;
    let filter = JobFilter {
        state,
        limit: q.limit.unwrap_or(50).clamp(1, 1000),
        ..Default::default()
    };
    let jobs = app
        .store
        .list_jobs(&filter)
        .await?
        .into_iter()
        .map(job_view)
        .collect();
    Ok(Json(JobList { jobs }))
}

pub(crate) fn job_id(raw: &str) -> ApiResult<i64> {
    raw.parse::<JobId>()
        .map(|j| j.0)
        .map_err(|e| ApiError::BadRequest(e.to_string()))
}

/// One job.
#[utoipa::path(get, path = "/v1/jobs/{id}", params(("id" = i64, Path, description = "the job's id")), responses((status = 200, body = JobView), (status = 404, body = protocol::ErrorBody)))]
pub async fn status(
    State(app): State<AppState>,
    _: Authorized<may::ReadJobs>,
    Path(id): Path<String>,
) -> ApiResult<Json<JobView>> {
    Ok(Json(job_status(&app, job_id(&id)?).await?))
}

/// One job as `status` shows it: with its nodes and placement when it is a gang, and why it
/// waits when it is pending.
pub(crate) async fn job_status(app: &AppState, id: i64) -> ApiResult<JobView> {
    let row = app.store.get_job(id).await?;
    let pending = row.state == JobState::Pending;
    let spec = row.spec.clone();
    let gang = row.spec.layout.is_gang();
    let mut view = job_view(row);
    if gang {
        view.nodes = app
            .store
            .job_nodes(view.id.0)
            .await?
            .into_iter()
            .map(node_view)
            .collect();
        view.placed = app.store.gang_placement(view.id.0).await?;
    }
    if pending {
        view.waiting = Some(crate::placement::waiting(app, view.id.0, &spec).await?);
    }
    Ok(view)
}

/// Cancel a job: a pending job never starts; a running one's process group is killed.
#[utoipa::path(post, path = "/v1/jobs/{id}/cancel", params(("id" = i64, Path, description = "the job's id")), responses((status = 200, body = CancelResponse)))]
pub async fn cancel(
    State(app): State<AppState>,
    Authorized(caller, _): Authorized<may::SubmitJobs>,
    Path(id): Path<String>,
) -> ApiResult<Json<CancelResponse>> {
    let id = job_id(&id)?;
    let previous_state = app
        .store
        .cancel_job(id, &format!("token '{}'", caller.name))
        .await?;
    let job = job_view(app.store.get_job(id).await?);
    Ok(Json(CancelResponse {
        job,
        previous_state,
    }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct LogsQuery {
    /// Continue after this line: `TASK:ATTEMPT:SEQ` as the last line of the previous page.
    pub after: Option<String>,
    /// At most this many lines (default and maximum 2000).
    pub limit: Option<i64>,
    /// Only the lines of this process (its global rank) of a multi-process job.
    pub rank: Option<u32>,
}

/// `GET /v1/jobs/{id}/logs/ws` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct FollowQuery {
    /// Only the lines of this process (its global rank) of a multi-process job.
    pub rank: Option<u32>,
}

/// A page of a job's log lines so far.
#[utoipa::path(get, path = "/v1/jobs/{id}/logs", params(("id" = i64, Path, description = "the job's id"), LogsQuery), responses((status = 200, body = LogPage)))]
pub async fn logs_page(
    State(app): State<AppState>,
    _: Authorized<may::ReadJobs>,
    Path(id): Path<String>,
    Query(q): Query<LogsQuery>,
) -> ApiResult<Json<LogPage>> {
    let id = job_id(&id)?;
    let job = app.store.get_job(id).await?;
    let after = q.after.as_deref().map(parse_after).transpose()?;
    let limit = q.limit.unwrap_or(LOG_READ_LIMIT).clamp(1, LOG_READ_LIMIT);
    let rank = q.rank.map(|r| r as i32);
    let lines = app.store.read_logs_after(id, after, limit, rank).await?;
    Ok(Json(LogPage {
        lines: lines.into_iter().map(log_line).collect(),
        job_state: job.state,
    }))
}

pub(crate) fn parse_after(s: &str) -> ApiResult<LogCursor> {
    let bad = || ApiError::BadRequest(format!("after='{s}' is not TASK:ATTEMPT:SEQ"));
    let mut parts = s.split(':');
    let mut next = || {
        parts
            .next()
            .and_then(|p| p.parse::<i64>().ok())
            .ok_or_else(bad)
    };
    let cursor = LogCursor {
        task_id: next()?,
        attempt: i32::try_from(next()?).map_err(|_| bad())?,
        seq: next()?,
    };
    Ok(cursor)
}

/// Streams a job's log lines over a websocket (JSON text frames of `LogStreamMessage`): every
/// line stored so far, then new lines as they are stored, then `end` when the job is done.
#[utoipa::path(get, path = "/v1/jobs/{id}/logs/ws", params(("id" = i64, Path, description = "the job's id"), FollowQuery), responses((status = 101, description = "websocket of LogStreamMessage frames")))]
pub async fn logs_ws(
    State(app): State<AppState>,
    _: Authorized<may::ReadJobs>,
    Path(id): Path<String>,
    Query(q): Query<FollowQuery>,
    ws: WebSocketUpgrade,
) -> ApiResult<Response> {
    let id = job_id(&id)?;
    app.store.get_job(id).await?; // 404 before upgrading, not after
    Ok(ws.on_upgrade(move |socket| async move {
        let rank = q.rank.map(|r| r as i32);
        if let Err(e) = follow_logs(app, id, rank, Vec::new(), socket).await {
            tracing::debug!(job = id, error = %e, "log stream ended early");
        }
    }))
}

/// Streams `job`'s lines after `after` (one cursor per task attempt already shown), then new
/// ones as they are stored, then `end`.
pub(crate) async fn follow_logs(
    app: AppState,
    job: i64,
    rank: Option<i32>,
    after: Vec<LogCursor>,
    mut socket: WebSocket,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut cursors: HashMap<(i64, i32), i64> = after
        .into_iter()
        .map(|c| ((c.task_id, c.attempt), c.seq))
        .collect();
    let mut rx = app.hub.subscribe_jobs();
    loop {
        // Read until caught up; then, if the job has ended, everything it printed is stored
        // (workers ship logs before completing), so one more read drains it.
        let mut ended = None;
        loop {
            let after: Vec<LogCursor> = cursors
                .iter()
                .map(|(&(task_id, attempt), &seq)| LogCursor {
                    task_id,
                    attempt,
                    seq,
                })
                .collect();
            let lines = app
                .store
                .read_logs(job, &after, LOG_READ_LIMIT, rank)
                .await?;
            let full = lines.len() as i64 == LOG_READ_LIMIT;
            for line in lines {
                cursors.insert((line.task_id, line.attempt), line.seq);
                let msg = serde_json::to_string(&LogStreamMessage::Line(log_line(line)))?;
                socket.send(Message::Text(msg.into())).await?;
            }
            if full {
                continue;
            }
            if ended.is_some() {
                break;
            }
            let row = app.store.get_job(job).await?;
            if !row.state.is_terminal() {
                break;
            }
            ended = Some(row);
        }
        if let Some(row) = ended {
            let end = LogStreamMessage::End {
                state: row.state,
                exit_code: row.exit_code,
                reason: row.reason,
            };
            socket
                .send(Message::Text(serde_json::to_string(&end)?.into()))
                .await?;
            socket.send(Message::Close(None)).await.ok();
            return Ok(());
        }
        let relevant =
            |w: &Wakeup| matches!(w, Wakeup::Notified { job_id: Some(j), .. } if *j == job);
        tokio::select! {
            _ = crate::hub::wait_for(&mut rx, relevant) => {}
            _ = tokio::time::sleep(LOG_SAFETY_POLL) => {}
            msg = socket.recv() => {
                // The client closed (or sent something we don't expect): stop.
                if !matches!(msg, Some(Ok(Message::Ping(_) | Message::Pong(_)))) {
                    return Ok(());
                }
            }
        }
    }
}

/// The job's packed outputs (`.tar.gz`).
#[utoipa::path(get, path = "/v1/jobs/{id}/outputs", params(("id" = i64, Path, description = "the job's id")), responses((status = 200, content_type = "application/gzip"), (status = 404, body = protocol::ErrorBody), (status = 409, body = protocol::ErrorBody)))]
pub async fn download_outputs(
    State(app): State<AppState>,
    _: Authorized<may::ReadJobs>,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    job_outputs(&app, job_id(&id)?).await
}

/// A job's outputs as a `.tar.gz` download (a gang's nodes merged into one).
pub(crate) async fn job_outputs(app: &AppState, id: i64) -> ApiResult<Response> {
    let job = app.store.get_job(id).await?;
    if job.spec.layout.is_gang() && job.state.is_terminal() {
        let parts: Vec<(u32, String)> = app
            .store
            .job_nodes(id)
            .await?
            .into_iter()
            .filter_map(|n| Some((n.node as u32, n.outputs_key?)))
            .collect();
        if !parts.is_empty() {
            return merged_outputs(app, id, parts).await;
        }
    }
    let Some(key) = job.outputs_key else {
        // A job that ran to its end and wrote nothing to bring back has empty outputs.
        let ran_to_the_end = job.started_at.is_some() && job.exit_code.is_some();
        if job.state.is_terminal() && ran_to_the_end {
            let mut empty = Vec::new();
            archive::pack_files(&[], &mut empty).map_err(|e| ApiError::Internal(e.to_string()))?;
            return Ok((
                [(header::CONTENT_TYPE, "application/gzip".to_string())],
                empty,
            )
                .into_response());
        }
        return Err(if job.state.is_terminal() {
            ApiError::NotFound(format!(
                "job {id} has no outputs: it ended ({}) before uploading any{}",
                job.state,
                job.reason.map(|r| format!(" ({r})")).unwrap_or_default()
            ))
        } else {
            ApiError::Conflict(format!(
                "job {id} is {}; its outputs are uploaded when it ends (try `gpulayer wait {id}` first)",
                job.state
            ))
        });
    };
    let got = app
        .objects
        .get(&object_store::path::Path::from(key))
        .await?;
    let size = got.meta.size;
    let body = Body::from_stream(got.into_stream());
    Ok(outputs_response(id, size, body))
}

/// A job's outputs archive as a download.
fn outputs_response(id: i64, size: u64, body: Body) -> Response {
    (
        [
            (header::CONTENT_TYPE, "application/gzip".to_string()),
            (header::CONTENT_LENGTH, size.to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"job-{id}-outputs.tar.gz\""),
            ),
        ],
        body,
    )
        .into_response()
}

/// A multi-node job's outputs: its nodes' archives merged into one (`archive::merge_archives`:
/// rank directories side by side, node K's glob matches under `node-K/`). The parts and the
/// result are spooled through unlinked temp files, so a large checkpoint never sits in memory.
async fn merged_outputs(app: &AppState, id: i64, parts: Vec<(u32, String)>) -> ApiResult<Response> {
    let internal =
        move |e: std::io::Error| ApiError::Internal(format!("merging job {id}'s outputs: {e}"));
    let mut spooled = Vec::with_capacity(parts.len());
    for (node, key) in parts {
        let mut stream = app
            .objects
            .get(&object_store::path::Path::from(key))
            .await?
            .into_stream();
        let mut file = tokio::fs::File::from_std(tempfile::tempfile().map_err(internal)?);
        while let Some(chunk) = stream.next().await {
            file.write_all(&chunk?).await.map_err(internal)?;
        }
        file.flush().await.map_err(internal)?;
        let mut file = file.into_std().await;
        file.seek(std::io::SeekFrom::Start(0)).map_err(internal)?;
        spooled.push((node, file));
    }
    let merged = tokio::task::spawn_blocking(move || -> Result<std::fs::File, ApiError> {
        let mut out = tempfile::tempfile().map_err(internal)?;
        archive::merge_archives(spooled, &mut out)
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        out.seek(std::io::SeekFrom::Start(0)).map_err(internal)?;
        Ok(out)
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))??;
    let size = merged.metadata().map_err(internal)?.len();
    let body = Body::from_stream(tokio_util::io::ReaderStream::new(
        tokio::fs::File::from_std(merged),
    ));
    Ok(outputs_response(id, size, body))
}
