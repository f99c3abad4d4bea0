//! All of GPUlayer's SQL: migrations, the queue (insert, claim, start, complete, rescue), logs,
//! workers, tokens, LISTEN/NOTIFY wakeups, leader election, and the embedded PostgreSQL.
//!
//! PostgreSQL is the only state. Every job state change is one transaction that also writes
//! an `events` row; every write about a running task names `(task, attempt, worker)` and
//! reports [`StoreError::LeaseLost`] when that no longer matches (fencing). Transactions that
//! touch both lock `tasks` rows before `jobs` rows, so they cannot deadlock each other.
//!
//! # Layout
//! - [`embedded`] — the private cluster `gpulayer up` runs when given no database URL.
//! - [`jobs`] — inserting, reading, listing and cancelling jobs.
//! - [`queue`] — claiming tasks for a worker, stop orders, requeueing.
//! - [`reports`] — recording the starts and ends workers report, a batch per statement.
//! - [`poll`] — one poll's queue work (reports, stop orders, claim) in one transaction.
//! - [`gangs`] — multi-node jobs: started all at once or not at all, stopped together.
//! - [`workers`] — registration, heartbeats, and the rescue of lost workers.
//! - [`logs`] — appending and reading log lines.
//! - [`tokens`] — bearer tokens, stored as sha256 only.
//! - [`sessions`] — the dashboard's one-time login links and browser sessions.
//! - [`identity`] — the TLS certificate every replica presents.
//! - [`history`] — the queue sampled over time and recent task spans, for the dashboard.
//! - [`blobs`] — which content-addressed sources are stored.
//! - [`wakeups`] — NOTIFY channels and the listener.
//! - [`leader`] — the advisory-lock leader that runs sweeps.

pub mod blobs;
pub mod calls;
pub mod embedded;
pub mod gangs;
pub mod history;
pub mod identity;
pub mod jobs;
pub mod leader;
pub mod logs;
pub mod poll;
pub mod queue;
pub mod reports;
pub mod sessions;
pub mod tokens;
pub mod wakeups;
pub mod workers;

pub use calls::CallResult;
pub use embedded::{EmbeddedError, EmbeddedPostgres};
pub use gangs::{GangChoice, Placer, Rendezvous};
pub use history::{QueueSample, TaskSpan};
pub use identity::ServerCertificate;
pub use jobs::{EventRow, HeldDevice, JobFilter, JobPage, JobRow, NodeRow};
pub use logs::{LogCursor, StoredLine};
pub use poll::{PollRound, RoundOutcome};
pub use queue::{Claimed, PollContext, StopReason};
pub use reports::{Completion, FinishReport, StartReport};
pub use sessions::SessionRow;
pub use tokens::{Role, TokenInfo, TokenRow};
pub use wakeups::{Channel, Wakeup};
pub use workers::{LostWorker, NewWorker, WorkerRow};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};
use std::time::Duration;

/// Connections each API process keeps. Handlers hold one only for a query or a short
/// transaction (long polls wait on NOTIFY, not on a connection), so a few go a long way.
const POOL_MAX_CONNECTIONS: u32 = 16;

/// How long a request waits for a free connection before failing with `Unavailable`.
const POOL_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection idle for longer than this is pinged before it is handed out (one round trip):
/// it may have died with a restart of the server. One in steady use is not: pinging every
/// time (sqlx's default) added a round trip to every statement of the hot path.
const PING_WHEN_IDLE_FOR: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The task's `(attempt, worker)` no longer matches: the worker must stop it.
    #[error("lease lost: task {task} attempt {attempt} is no longer this worker's")]
    LeaseLost { task: i64, attempt: i32 },
    #[error("{0} not found")]
    NotFound(String),
    /// The request contradicts what is stored (an idempotency key reused for another job).
    #[error("{0}")]
    Conflict(String),
    /// The worker was declared lost; it must register again.
    #[error("worker {0} was declared lost; register again")]
    WorkerLost(i64),
    /// The worker has sent a newer poll than this one, which therefore claims nothing.
    #[error("worker {0} has sent a newer poll")]
    PollSuperseded(i64),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("corrupt row: {0}")]
    Corrupt(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A handle on the database; cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    pool: PgPool,
    options: PgConnectOptions,
}

impl Store {
    /// Connects and applies pending migrations (safe when several replicas start at once:
    /// the migrator serialises on an advisory lock).
    pub async fn open(options: PgConnectOptions) -> Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(POOL_MAX_CONNECTIONS)
            .acquire_timeout(POOL_ACQUIRE_TIMEOUT)
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for > PING_WHEN_IDLE_FOR {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(options.clone())
            .await?;
        sqlx::migrate!("../migrations").run(&pool).await?;
        Ok(Self { pool, options })
    }

    /// Parses a `postgres://` URL (with `?host=/socket/dir` for Unix sockets).
    pub fn parse_url(url: &str) -> Result<PgConnectOptions> {
        Ok(url.parse::<PgConnectOptions>()?)
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub(crate) async fn begin(&self) -> Result<Transaction<'static, Postgres>> {
        Ok(self.pool.begin().await?)
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// True when the database answers.
    pub async fn ping(&self) -> bool {
        sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }
}

/// Writes one `events` row inside the caller's transaction.
pub(crate) async fn record_event(
    tx: &mut Transaction<'_, Postgres>,
    job_id: Option<i64>,
    worker_id: Option<i64>,
    kind: &str,
    detail: Option<&str>,
) -> Result<()> {
    sqlx::query("INSERT INTO events (job_id, worker_id, kind, detail) VALUES ($1, $2, $3, $4)")
        .bind(job_id)
        .bind(worker_id)
        .bind(kind)
        .bind(detail)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
