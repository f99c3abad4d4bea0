//! Server configuration, shared state, the router and `serve`.

use crate::hub::Hub;
use crate::{blobs, jobs, openapi, worker_channel};
use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use object_store::ObjectStore;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use store::Store;
use tower_http::trace::TraceLayer;

/// What a replica needs besides its database.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// A worker silent for longer than this is declared lost.
    pub lease: Duration,
    /// Finished jobs (with their logs, events and outputs) are deleted after this long.
    pub retention: Duration,
    /// Mark the dashboard's cookies `Secure` (the server speaks TLS).
    pub secure_cookies: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            // Long enough to ride out a GC pause or a brief network blip, short enough that
            // a dead machine's jobs are failed (and, later, retried) within half a minute.
            lease: Duration::from_secs(20),
            retention: Duration::from_secs(14 * 86_400),
            secure_cookies: false,
        }
    }
}

/// Everything a handler can reach. Cheap to clone; no state beyond handles.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub objects: Arc<dyn ObjectStore>,
    pub hub: Hub,
    pub config: Arc<ServerConfig>,
    pub tokens: Arc<crate::auth::TokenCache>,
    /// Recent refusals of unknown tokens (each makes the next one wait longer).
    pub bad_tokens: Arc<crate::auth::BadTokens>,
    /// Workers' registration facts, read once per replica (they never change).
    pub worker_views: Arc<std::sync::Mutex<std::collections::HashMap<i64, scheduler::WorkerView>>>,
    /// Held polls that one notification woke take turns to claim (see [`WokenClaims`]).
    pub woken_claims: Arc<tokio::sync::Mutex<crate::worker_channel::WokenClaims>>,
    /// When this replica's claims last looked for a gang to start.
    pub gang_tries: Arc<std::sync::Mutex<Option<tokio::time::Instant>>>,
    /// Held polls of workers with room, which a submit here may hand its job to.
    pub idle_polls: Arc<crate::handoff::IdlePolls>,
}

impl AppState {
    /// Builds the state and starts this replica's LISTEN hub.
    pub fn new(store: Store, objects: Arc<dyn ObjectStore>, config: ServerConfig) -> Self {
        Self {
            hub: Hub::start(store.clone()),
            store,
            objects,
            config: Arc::new(config),
            tokens: Arc::default(),
            bad_tokens: Arc::default(),
            worker_views: Arc::default(),
            woken_claims: Arc::default(),
            gang_tries: Arc::default(),
            idle_polls: Arc::default(),
        }
    }
}

pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/openapi.json", get(openapi::document))
        .route("/jobs", post(jobs::submit).get(jobs::list))
        .route(
            "/jobs/batch",
            // A batch of 10,000 specs with commands and environments fits well within this.
            post(jobs::submit_batch).layer(DefaultBodyLimit::max(64 * 1024 * 1024)),
        )
        .route("/jobs/{id}", get(jobs::status))
        .route("/placement", post(crate::placement::dry_run))
        .route("/calls", post(crate::calls::call))
        .route("/calls/results", post(crate::calls::results))
        .route("/jobs/{id}/cancel", post(jobs::cancel))
        .route("/jobs/{id}/logs", get(jobs::logs_page))
        .route("/jobs/{id}/logs/ws", get(jobs::logs_ws))
        .route("/jobs/{id}/outputs", get(jobs::download_outputs))
        .route(
            "/tokens",
            post(crate::tokens::create).get(crate::tokens::list),
        )
        .route("/tokens/{id}/revoke", post(crate::tokens::revoke))
        .route("/dashboard/links", post(crate::dashboard::create_link))
        .route(
            "/blobs/{digest}",
            put(blobs::upload).head(blobs::exists).get(blobs::download),
        )
        .route(
            "/workers",
            post(worker_channel::register).get(worker_channel::list),
        )
        .route(
            "/workers/{worker}",
            axum::routing::delete(worker_channel::deregister),
        )
        .route("/workers/{worker}/poll", post(worker_channel::poll))
        .route(
            "/workers/{worker}/heartbeat",
            post(worker_channel::heartbeat),
        )
        .route(
            "/workers/{worker}/tasks/{task}/attempts/{attempt}/logs",
            post(worker_channel::append_logs),
        )
        .route(
            "/workers/{worker}/tasks/{task}/attempts/{attempt}/rendezvous",
            post(worker_channel::set_rendezvous).get(worker_channel::rendezvous),
        )
        .route(
            "/workers/{worker}/tasks/{task}/attempts/{attempt}/outputs",
            put(worker_channel::upload_outputs),
        )
        // Sources and outputs stream to the object store; JSON bodies stay small.
        .layer(DefaultBodyLimit::max(16 * 1024 * 1024));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .nest(protocol::PREFIX, v1)
        .merge(crate::dashboard::router())
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// Ready when the database answers: a replica without its database can serve nothing.
async fn readyz(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if state.store.ping().await {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "database unreachable")
    }
}

/// Serves the API on `listener` until `shutdown` resolves, running the leader loop beside it;
/// `extra` routes (the MCP endpoint, which lives with the CLI's operations) are served too.
pub async fn serve<L>(
    listener: L,
    state: AppState,
    extra: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    let sweeper = tokio::spawn(crate::sweeper::run(state.clone()));
    let result = axum::serve(listener, router(state).merge(extra))
        .with_graceful_shutdown(shutdown)
        .await;
    sweeper.abort();
    result
}
