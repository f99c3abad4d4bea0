//! The web dashboard every replica serves under `/dashboard`: jobs (filtered, paged, each
//! with its requirements, placement, why it waits, timeline and live logs), workers (devices
//! and who holds them, framework checks), login by one-time link or token, cancel for roles
//! that may. Server-rendered with askama; only the live logs use a script.

mod charts;
mod format;
pub mod session;

use crate::auth::{Authorized, may};
use crate::error::{ApiError, ApiResult};
use crate::server::AppState;
use askama::Template;
use axum::Router;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Form, Path, Query, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use chrono::Utc;
use domain::JobState;
use protocol::DashboardLink;
use serde::Deserialize;
use session::{LOGIN_COOKIE, Viewer};
use std::collections::BTreeMap;
use store::{JobFilter, LogCursor};

/// Jobs per page of the list.
const PAGE: i64 = 50;
/// The most jobs one page filtered by state or worker looks at (neither is indexed on jobs;
/// see `Store::list_jobs_page`): a rare state costs a bounded read, and the page says how
/// far it looked.
const SCAN_WINDOW: i64 = 5_000;
/// Lines a job page shows before the live stream takes over.
const PAGE_LINES: i64 = 2000;

/// The dashboard's routes (`/dashboard/...`).
pub fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/dashboard",
            get(|| async { Redirect::to("/dashboard/jobs") }),
        )
        .route("/dashboard/login", get(login_page).post(login_form))
        .route("/dashboard/logout", post(logout))
        .route("/dashboard/jobs", get(jobs_page))
        .route("/dashboard/jobs/{id}", get(job_page))
        .route("/dashboard/jobs/{id}/cancel", post(cancel))
        .route("/dashboard/jobs/{id}/logs/ws", get(logs_ws))
        .route("/dashboard/jobs/{id}/outputs", get(outputs))
        .route("/dashboard/workers", get(workers_page))
        .route("/dashboard/assets/{file}", get(asset))
        .layer(axum::middleware::map_response(protect))
}

/// Headers on every dashboard response: scripts, styles and connections from this origin
/// only, never framed, a referrer only to this origin (a login link's code stays out of other
/// sites' logs; `no-referrer` would make browsers send `Origin: null` with our own forms).
async fn protect(mut response: Response) -> Response {
    let headers = response.headers_mut();
    let set = |h: &mut HeaderMap, k: &'static str, v: &'static str| {
        h.insert(k, HeaderValue::from_static(v));
    };
    set(
        headers,
        "content-security-policy",
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    );
    set(headers, "x-content-type-options", "nosniff");
    set(headers, "referrer-policy", "same-origin");
    if !headers.contains_key(CACHE_CONTROL) {
        set(headers, "cache-control", "no-store");
    }
    response
}

/// A dashboard error, as a page a person can read.
struct PageError(ApiError);

impl From<ApiError> for PageError {
    fn from(e: ApiError) -> Self {
        PageError(e)
    }
}

impl From<store::StoreError> for PageError {
    fn from(e: store::StoreError) -> Self {
        PageError(e.into())
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let (status, _) = self.0.parts();
        let message = match &self.0 {
            ApiError::Internal(detail) => {
                tracing::error!(%detail, "internal error");
                "internal error; the server log has the details".to_string()
            }
            other => other.to_string(),
        };
        let page = ErrorPage {
            status: status.as_u16(),
            message,
        };
        (status, Html(page.render().unwrap_or_default())).into_response()
    }
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage {
    status: u16,
    message: String,
}

type PageResult<T> = Result<T, PageError>;

fn render(page: &impl Template) -> PageResult<Response> {
    let html = page
        .render()
        .map_err(|e| ApiError::Internal(format!("rendering a page: {e}")))?;
    Ok(Html(html).into_response())
}

// ---- login -------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
struct LoginQuery {
    code: Option<String>,
}

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    csrf: String,
    error: Option<String>,
}

/// The login form, with a fresh CSRF value in a cookie and the form; or, with `?code=`, a
/// one-time link: it opens a session and is used up.
async fn login_page(
    State(app): State<AppState>,
    Query(q): Query<LoginQuery>,
) -> PageResult<Response> {
    if let Some(code) = q.code.filter(|c| !c.is_empty()) {
        return match app.store.redeem_dashboard_link(&code).await? {
            Some(token_id) => Ok(session::open_session(&app, token_id, "/dashboard/jobs").await?),
            None => login_form_page(
                &app,
                StatusCode::UNAUTHORIZED,
                Some("This login link was used already or has expired: run `gpulayer dashboard` again, or log in with a token.".into()),
            ),
        };
    }
    login_form_page(&app, StatusCode::OK, None)
}

fn login_form_page(
    app: &AppState,
    status: StatusCode,
    error: Option<String>,
) -> PageResult<Response> {
    let csrf = crate::auth::mint_secret("");
    let mut response = render(&LoginPage {
        csrf: csrf.clone(),
        error,
    })?;
    *response.status_mut() = status;
    response.headers_mut().append(
        SET_COOKIE,
        session::set_cookie(app, LOGIN_COOKIE, &csrf, session::SESSION_TTL),
    );
    Ok(response)
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    token: String,
    csrf: String,
}

/// Logs in with a token typed into the form.
async fn login_form(
    State(app): State<AppState>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> PageResult<Response> {
    session::check_origin(&headers)?;
    let expected = session::cookie(&headers, LOGIN_COOKIE).unwrap_or_default();
    if expected.is_empty() || expected != form.csrf {
        return login_form_page(
            &app,
            StatusCode::FORBIDDEN,
            Some("The form expired; try again.".into()),
        );
    }
    let Some(token) = app.store.find_token(form.token.trim()).await? else {
        tokio::time::sleep(app.bad_tokens.refused()).await;
        return login_form_page(
            &app,
            StatusCode::UNAUTHORIZED,
            Some("This token is not known to the server (or was revoked, or expired).".into()),
        );
    };
    if token.role == store::Role::Worker {
        return login_form_page(
            &app,
            StatusCode::FORBIDDEN,
            Some("A worker token cannot open the dashboard: use an admin, submitter or read-only token.".into()),
        );
    }
    Ok(session::open_session(&app, token.id, "/dashboard/jobs").await?)
}

#[derive(Debug, Deserialize)]
struct CsrfForm {
    csrf: String,
}

async fn logout(
    State(app): State<AppState>,
    viewer: Viewer,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> PageResult<Response> {
    session::check_origin(&headers)?;
    viewer.check_csrf(&form.csrf)?;
    if let Some(secret) = session::cookie(&headers, session::SESSION_COOKIE) {
        app.store.delete_dashboard_session(secret).await?;
    }
    let mut response = Redirect::to("/dashboard/login").into_response();
    response.headers_mut().append(
        SET_COOKIE,
        session::set_cookie(&app, session::SESSION_COOKIE, "", std::time::Duration::ZERO),
    );
    Ok(response)
}

/// A one-time link that opens the dashboard logged in as the calling token (`gpulayer
/// dashboard`); it works once, within a minute.
#[utoipa::path(post, path = "/v1/dashboard/links", responses((status = 200, body = DashboardLink)))]
pub async fn create_link(
    State(app): State<AppState>,
    Authorized(caller, _): Authorized<may::ReadJobs>,
) -> ApiResult<axum::Json<DashboardLink>> {
    let code = crate::auth::mint_secret("");
    app.store
        .create_dashboard_link(caller.token_id, &code, session::LINK_TTL)
        .await?;
    Ok(axum::Json(DashboardLink {
        path: format!("/dashboard/login?code={code}"),
        expires_in_seconds: session::LINK_TTL.as_secs(),
    }))
}

// ---- jobs --------------------------------------------------------------------------------

#[derive(Debug, Deserialize, Default)]
struct JobsQuery {
    state: Option<String>,
    by: Option<String>,
    worker: Option<String>,
    before: Option<String>,
}

struct StateOption {
    name: &'static str,
    selected: bool,
}

struct JobLine {
    id: i64,
    name: String,
    state: String,
    accelerator: String,
    worker: String,
    submitted_at: String,
    submitted_ago: String,
    by: String,
    runtime: String,
    exit: String,
    command: String,
}

#[derive(Template)]
#[template(path = "jobs.html")]
struct JobsPage {
    nav: &'static str,
    viewer: String,
    role: &'static str,
    csrf: String,
    states: Vec<StateOption>,
    filter_by: String,
    filter_worker: String,
    filtered: bool,
    jobs: Vec<JobLine>,
    older: Option<String>,
    looked: Option<String>,
    /// SVG, built from numbers and escaped names.
    queue_chart: String,
    finished_chart: String,
}

/// The window the pictures cover.
const PICTURE_MINUTES: i64 = 60;

fn given(v: &Option<String>) -> Option<String> {
    v.as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

async fn jobs_page(
    State(app): State<AppState>,
    viewer: Viewer,
    Query(q): Query<JobsQuery>,
) -> PageResult<Response> {
    let state = given(&q.state)
        .map(|s| s.parse::<JobState>())
        .transpose()
        .map_err(ApiError::BadRequest)?;
    let before = given(&q.before)
        .map(|b| b.parse::<i64>())
        .transpose()
        .map_err(|_| ApiError::BadRequest("before= is not a job id".into()))?;
    let filter = JobFilter {
        state,
        submitted_by: given(&q.by),
        worker: given(&q.worker),
        before,
        limit: PAGE,
    };
    let page = app.store.list_jobs_page(&filter, Some(SCAN_WINDOW)).await?;
    let rows = page.jobs;
    let now = Utc::now();
    let next_before = match page.scanned_down_to {
        Some(oldest) => Some(oldest),
        None if rows.len() as i64 == PAGE => rows.last().map(|r| r.id),
        None => None,
    };
    let looked = page.scanned_down_to.map(|oldest| {
        format!(
            "This page looked at {SCAN_WINDOW} jobs, down to job {oldest}: state and worker filters read the newest jobs first, so older matches are on the next pages."
        )
    });
    let older = next_before.map(|last| {
        let mut params: Vec<(&str, String)> = Vec::new();
        if let Some(s) = filter.state {
            params.push(("state", s.as_str().to_string()));
        }
        if let Some(b) = &filter.submitted_by {
            params.push(("by", b.clone()));
        }
        if let Some(w) = &filter.worker {
            params.push(("worker", w.clone()));
        }
        params.push(("before", last.to_string()));
        format!(
            "/dashboard/jobs?{}",
            serde_urlencoded::to_string(&params).unwrap_or_default()
        )
    });
    let jobs = rows
        .into_iter()
        .map(|r| JobLine {
            id: r.id,
            name: r
                .spec
                .name
                .as_ref()
                .map(|n| n.as_str().to_string())
                .unwrap_or_else(|| "-".into()),
            state: r.state.as_str().to_string(),
            accelerator: r.spec.accelerator.to_string(),
            worker: r.worker_name.clone().unwrap_or_else(|| "-".into()),
            submitted_at: format::timestamp(Some(r.created_at)),
            submitted_ago: format::ago(r.created_at, now),
            by: r.submitted_by.clone().unwrap_or_else(|| "-".into()),
            runtime: format::runtime(r.started_at, r.finished_at, now),
            exit: r
                .exit_code
                .map(|c| c.to_string())
                .unwrap_or_else(|| "-".into()),
            command: format::command(r.spec.command.argv()),
        })
        .collect();
    let from = now - chrono::Duration::minutes(PICTURE_MINUTES);
    let samples = app.store.queue_samples(from).await?;
    let (queue_chart, finished_chart) = if samples.is_empty() {
        (String::new(), String::new())
    } else {
        let (waiting, running, finished) =
            charts::per_minute(&samples, from, PICTURE_MINUTES as usize);
        (
            charts::lines(
                &[
                    ("waiting", "pending", waiting),
                    ("running", "running", running),
                ],
                PICTURE_MINUTES,
            ),
            charts::bars("finished", &finished, PICTURE_MINUTES),
        )
    };
    let states = [
        JobState::Pending,
        JobState::Assigned,
        JobState::Running,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
    ]
    .into_iter()
    .map(|s| StateOption {
        name: s.as_str(),
        selected: filter.state == Some(s),
    })
    .collect();
    render(&JobsPage {
        nav: "jobs",
        viewer: viewer.caller.name.clone(),
        role: viewer.caller.role.as_str(),
        csrf: viewer.csrf.clone(),
        states,
        filtered: filter.state.is_some()
            || filter.submitted_by.is_some()
            || filter.worker.is_some(),
        filter_by: filter.submitted_by.unwrap_or_default(),
        filter_worker: filter.worker.unwrap_or_default(),
        jobs,
        older,
        looked,
        queue_chart,
        finished_chart,
    })
}

struct JobFacts {
    id: i64,
    name: String,
    state: String,
    command: String,
    by: String,
    submitted_at: String,
    started_at: String,
    finished_at: String,
    runtime: String,
    exit: String,
    reason: String,
    attempt: i32,
    accelerator: String,
}

struct VerdictLine {
    worker: String,
    eligible: bool,
    temporary: bool,
    text: String,
}

struct NodeLine {
    node: u32,
    state: String,
    worker: String,
    devices: String,
    exit: String,
    ranks: Vec<u32>,
}

struct ShownLine {
    class: &'static str,
    prefix: String,
    text: String,
}

struct EventLine {
    at: String,
    kind: String,
    worker: String,
    detail: String,
}

#[derive(Template)]
#[template(path = "job.html")]
struct JobPage {
    nav: &'static str,
    viewer: String,
    role: &'static str,
    csrf: String,
    job: JobFacts,
    may_cancel: bool,
    requirements: Vec<(String, String)>,
    placement: String,
    outputs_link: String,
    outputs_label: String,
    waiting: Option<Vec<VerdictLine>>,
    nodes: Vec<NodeLine>,
    rank: Option<u32>,
    lines: Vec<ShownLine>,
    truncated: bool,
    live: bool,
    logs_ws: String,
    logs_after: String,
    events: Vec<EventLine>,
}

#[derive(Debug, Deserialize)]
struct JobQuery {
    rank: Option<u32>,
}

async fn job_page(
    State(app): State<AppState>,
    viewer: Viewer,
    Path(id): Path<String>,
    Query(q): Query<JobQuery>,
) -> PageResult<Response> {
    let id = crate::jobs::job_id(&id)?;
    let view = crate::jobs::job_status(&app, id).await?;
    let row = app.store.get_job(id).await?;
    let now = Utc::now();
    let spec = &row.spec;
    let terminal = view.state.is_terminal();

    let mut requirements = Vec::new();
    let devices = spec.requirements.device_count(spec.accelerator);
    if devices > 0 {
        requirements.push(("Devices".to_string(), devices.to_string()));
    }
    if let Some(m) = spec.requirements.min_device_memory_bytes {
        requirements.push((
            "Device memory".into(),
            format!("at least {}", format::bytes(m)),
        ));
    }
    if !spec.requirements.frameworks.is_empty() {
        let list: Vec<String> = spec
            .requirements
            .frameworks
            .iter()
            .map(|f| f.to_string())
            .collect();
        requirements.push(("Frameworks".into(), list.join(", ")));
    }
    if !spec.requirements.labels.is_empty() {
        let list: Vec<String> = spec
            .requirements
            .labels
            .iter()
            .map(|l| l.to_string())
            .collect();
        requirements.push(("Labels".into(), list.join(", ")));
    }
    if spec.layout.is_gang() || spec.layout.procs_per_node > 1 {
        requirements.push((
            "Layout".into(),
            format!(
                "{} node(s) × {} process(es)",
                spec.layout.nodes, spec.layout.procs_per_node
            ),
        ));
    }
    if !view.outputs.is_empty() {
        requirements.push(("Output globs".into(), view.outputs.join(", ")));
    }
    if let Some(t) = spec.timeout_seconds {
        requirements.push(("Timeout".into(), format::duration(t as f64)));
    }
    if !spec.env.is_empty() {
        // Names only: values may be secrets.
        let names: Vec<String> = spec.env.iter().map(|e| e.name().to_string()).collect();
        requirements.push(("Environment".into(), names.join(", ")));
    }

    let placement = match (&view.worker, &view.placed) {
        (_, Some(placed)) => placed.clone(),
        (Some(w), None) if view.devices.is_empty() => format!("worker {}", w.name),
        (Some(w), None) => {
            // Why these devices: the worker's interconnect matrix says what `choose` saw.
            let topology = match row.worker_id {
                Some(id) => app.store.worker(id).await?.inventory.topology,
                None => None,
            };
            format!(
                "worker {}, {} {} — {}",
                w.name,
                view.accelerator,
                view.devices
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                scheduler::devices::why(&view.devices, topology.as_ref())
            )
        }
        (None, None) => "not placed yet".into(),
    };
    let outputs_ready = view.outputs_bytes.is_some()
        || (terminal && view.started_at.is_some() && view.exit_code.is_some());
    let (outputs_link, outputs_label) = if outputs_ready {
        (
            format!("/dashboard/jobs/{id}/outputs"),
            format!(
                "job-{id}-outputs.tar.gz{}",
                view.outputs_bytes
                    .map(|b| format!(" ({})", format::bytes(b as u64)))
                    .unwrap_or_default()
            ),
        )
    } else {
        (String::new(), String::new())
    };
    let waiting = view.waiting.as_ref().map(|w| {
        w.verdicts
            .iter()
            .map(|v| VerdictLine {
                worker: v.worker.clone(),
                eligible: v.eligible,
                temporary: v.temporary,
                text: if v.eligible {
                    "eligible".into()
                } else {
                    v.reason.clone().unwrap_or_default()
                },
            })
            .collect()
    });
    let per_node = spec.layout.procs_per_node;
    let nodes = view
        .nodes
        .iter()
        .map(|n| NodeLine {
            node: n.node,
            state: n.state.clone(),
            worker: n
                .worker
                .as_ref()
                .map(|w| w.name.clone())
                .unwrap_or_else(|| "-".into()),
            devices: n
                .devices
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            exit: n
                .exit_code
                .map(|c| c.to_string())
                .unwrap_or_else(|| "-".into()),
            ranks: (n.node * per_node..(n.node + 1) * per_node).collect(),
        })
        .collect();

    let rank = q.rank;
    let stored = app
        .store
        .read_logs_after(id, None, PAGE_LINES, rank.map(|r| r as i32))
        .await?;
    let truncated = stored.len() as i64 == PAGE_LINES;
    let mut cursors: BTreeMap<(i64, i32), i64> = BTreeMap::new();
    let mut lines = Vec::with_capacity(stored.len());
    for l in stored {
        cursors.insert((l.task_id, l.attempt), l.seq);
        lines.push(ShownLine {
            class: match protocol::Stream::from_i16(l.stream) {
                protocol::Stream::Stderr => "err",
                protocol::Stream::Stdout => "out",
                protocol::Stream::System => "sys",
            },
            prefix: l.rank.map(|r| format!("[rank {r}] ")).unwrap_or_default(),
            text: l.text,
        });
    }
    let logs_after = cursors
        .iter()
        .map(|((t, a), s)| format!("{t}:{a}:{s}"))
        .collect::<Vec<_>>()
        .join(",");
    let logs_ws = match rank {
        Some(r) => format!("/dashboard/jobs/{id}/logs/ws?rank={r}"),
        None => format!("/dashboard/jobs/{id}/logs/ws"),
    };

    let events = app
        .store
        .job_events(id)
        .await?
        .into_iter()
        .map(|e| EventLine {
            at: format::timestamp(Some(e.at)),
            kind: e.kind,
            worker: e.worker_name.unwrap_or_default(),
            detail: e.detail.unwrap_or_default(),
        })
        .collect();

    render(&JobPage {
        nav: "jobs",
        viewer: viewer.caller.name.clone(),
        role: viewer.caller.role.as_str(),
        csrf: viewer.csrf.clone(),
        may_cancel: viewer.may_submit() && !terminal,
        job: JobFacts {
            id,
            name: view.name.clone().unwrap_or_default(),
            state: view.state.as_str().to_string(),
            command: format::command(&view.command),
            by: view.submitted_by.clone().unwrap_or_else(|| "-".into()),
            submitted_at: format::timestamp(Some(view.created_at)),
            started_at: format::timestamp(view.started_at),
            finished_at: format::timestamp(view.finished_at),
            runtime: format::runtime(view.started_at, view.finished_at, now),
            exit: view
                .exit_code
                .map(|c| c.to_string())
                .unwrap_or_else(|| "-".into()),
            reason: view.reason.clone().unwrap_or_default(),
            attempt: view.attempt,
            accelerator: view.accelerator.to_string(),
        },
        requirements,
        placement,
        outputs_link,
        outputs_label,
        waiting,
        nodes,
        rank,
        lines,
        truncated,
        live: !terminal || truncated,
        logs_ws,
        logs_after,
        events,
    })
}

/// Cancels a job from its page (roles that may submit), then shows the page again.
async fn cancel(
    State(app): State<AppState>,
    viewer: Viewer,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<CsrfForm>,
) -> PageResult<Response> {
    session::check_origin(&headers)?;
    viewer.check_csrf(&form.csrf)?;
    viewer.caller.require(crate::auth::Permission::SubmitJobs)?;
    let id = crate::jobs::job_id(&id)?;
    app.store
        .cancel_job(id, &format!("token '{}' (dashboard)", viewer.caller.name))
        .await?;
    Ok(Redirect::to(&format!("/dashboard/jobs/{id}")).into_response())
}

#[derive(Debug, Deserialize)]
struct FollowQuery {
    rank: Option<u32>,
    after: Option<String>,
}

/// The job page's live logs: the job's log stream from the lines already shown on. A
/// websocket from another site's page is refused (its `Origin` names another host).
async fn logs_ws(
    State(app): State<AppState>,
    viewer: Viewer,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<FollowQuery>,
    ws: WebSocketUpgrade,
) -> PageResult<Response> {
    session::check_origin(&headers)?;
    let id = crate::jobs::job_id(&id)?;
    app.store.get_job(id).await?;
    let after: Vec<LogCursor> = q
        .after
        .as_deref()
        .unwrap_or_default()
        .split(',')
        .filter(|c| !c.is_empty())
        .map(crate::jobs::parse_after)
        .collect::<ApiResult<_>>()?;
    let name = viewer.caller.name;
    Ok(ws.on_upgrade(move |socket| async move {
        let rank = q.rank.map(|r| r as i32);
        if let Err(e) = crate::jobs::follow_logs(app, id, rank, after, socket).await {
            tracing::debug!(job = id, viewer = %name, error = %e, "dashboard log stream ended early");
        }
    }))
}

async fn outputs(
    State(app): State<AppState>,
    _: Viewer,
    Path(id): Path<String>,
) -> PageResult<Response> {
    Ok(crate::jobs::job_outputs(&app, crate::jobs::job_id(&id)?).await?)
}

// ---- workers -----------------------------------------------------------------------------

struct DeviceLine {
    id: String,
    name: String,
    memory: String,
    job: Option<i64>,
}

struct FrameworkLine {
    name: String,
    version: String,
    usable: bool,
    result: String,
}

struct WorkerCard {
    name: String,
    state: String,
    simulated: bool,
    host: String,
    slots: u32,
    busy_slots: u32,
    seen: String,
    version: String,
    labels: Vec<(String, String)>,
    devices: Vec<DeviceLine>,
    frameworks: Vec<FrameworkLine>,
    /// SVG: its devices (or slots) held over the last hour.
    occupancy: String,
}

#[derive(Template)]
#[template(path = "workers.html")]
struct WorkersPage {
    nav: &'static str,
    viewer: String,
    role: &'static str,
    csrf: String,
    workers: Vec<WorkerCard>,
}

/// The newest tasks the occupancy pictures look at (besides every running one).
const PICTURE_TASKS: i64 = 2_000;

async fn workers_page(State(app): State<AppState>, viewer: Viewer) -> PageResult<Response> {
    let now = Utc::now();
    let from = now - chrono::Duration::minutes(PICTURE_MINUTES);
    let held = app.store.held_devices().await?;
    let spans = app.store.recent_task_spans(from, PICTURE_TASKS).await?;
    let workers = app
        .store
        .list_workers()
        .await?
        .into_iter()
        .map(|w| {
            let inv = &w.inventory;
            let devices = inv
                .devices
                .iter()
                .map(|d| DeviceLine {
                    id: format!("{}:{}", d.kind, d.index),
                    name: d.name.clone(),
                    memory: d
                        .memory_bytes
                        .map(format::bytes)
                        .unwrap_or_else(|| "-".into()),
                    job: held
                        .iter()
                        .find(|h| {
                            h.worker_id == w.id && h.device == d.index && d.kind.needs_device()
                        })
                        .map(|h| h.job_id),
                })
                .collect();
            let frameworks = inv
                .frameworks
                .iter()
                .map(|f| FrameworkLine {
                    name: f.name(),
                    version: f.version.clone().unwrap_or_else(|| "-".into()),
                    usable: f.usable,
                    result: if f.usable {
                        "usable".into()
                    } else {
                        f.reason.clone().unwrap_or_else(|| "not usable".into())
                    },
                })
                .collect();
            let mine = spans.iter().filter(|s| s.worker_id == w.id);
            let gpus: Vec<&domain::Device> = inv
                .devices
                .iter()
                .filter(|d| d.kind.needs_device())
                .collect();
            let occupancy = if gpus.is_empty() {
                let lanes: Vec<String> = (0..w.slots).map(|i| format!("slot {i}")).collect();
                let holds = charts::slot_lanes(
                    mine.map(|s| charts::Hold {
                        lane: 0,
                        from: s.started_at,
                        to: s.finished_at,
                        job: s.job_id,
                        state: s.state.clone(),
                    })
                    .collect(),
                    lanes.len(),
                );
                charts::occupancy(&lanes, &holds, from, now)
            } else {
                let lanes: Vec<String> = gpus
                    .iter()
                    .map(|d| format!("{}:{}", d.kind, d.index))
                    .collect();
                let holds: Vec<charts::Hold> = mine
                    .flat_map(|s| {
                        s.devices.iter().filter_map(|dev| {
                            gpus.iter()
                                .position(|g| g.index == *dev)
                                .map(|lane| charts::Hold {
                                    lane,
                                    from: s.started_at,
                                    to: s.finished_at,
                                    job: s.job_id,
                                    state: s.state.clone(),
                                })
                        })
                    })
                    .collect();
                charts::occupancy(&lanes, &holds, from, now)
            };
            WorkerCard {
                occupancy,
                host: format!(
                    "{} ({} {}) · {} CPUs · {}",
                    inv.hostname,
                    inv.os,
                    inv.arch,
                    inv.cpus,
                    format::bytes(inv.memory_bytes)
                ),
                seen: w
                    .last_seen
                    .map(|t| format::ago(t, now))
                    .unwrap_or_else(|| "never".into()),
                name: w.name,
                state: w.state,
                simulated: inv.simulated,
                slots: w.slots,
                busy_slots: w.busy_slots,
                version: w.version,
                labels: w.labels.into_iter().collect(),
                devices,
                frameworks,
            }
        })
        .collect();
    render(&WorkersPage {
        nav: "workers",
        viewer: viewer.caller.name.clone(),
        role: viewer.caller.role.as_str(),
        csrf: viewer.csrf.clone(),
        workers,
    })
}

// ---- assets ------------------------------------------------------------------------------

const CSS: &str = include_str!("../../../templates/assets/dashboard.css");
const JS: &str = include_str!("../../../templates/assets/dashboard.js");

async fn asset(Path(file): Path<String>) -> Response {
    let (body, kind) = match file.as_str() {
        "dashboard.css" => (CSS, "text/css; charset=utf-8"),
        "dashboard.js" => (JS, "text/javascript; charset=utf-8"),
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    ([(CONTENT_TYPE, kind), (CACHE_CONTROL, "max-age=300")], body).into_response()
}
