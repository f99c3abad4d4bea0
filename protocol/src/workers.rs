//! The worker channel. Workers only ever dial out: they register, then keep one long poll open
//! (new work and stop orders come back on it) and send heartbeats, logs and completions.
//!
//! Every call about a task names `(task, attempt)`: a call that no longer matches the task's
//! current attempt on this worker is answered `409 lease_lost`, and the worker must kill that
//! process group (fencing).

use chrono::{DateTime, Utc};
use domain::{Attempt, Inventory, JobId, JobSpec, TaskId, WorkerId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

use crate::logs::Stream;

/// `POST /v1/workers` body (authenticated with a join token).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RegisterRequest {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub slots: u32,
    #[schema(value_type = Object)]
    pub inventory: Inventory,
    pub version: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RegisterResponse {
    #[schema(value_type = i64)]
    pub worker_id: WorkerId,
    /// A worker silent for longer than this is declared lost and its tasks are failed.
    pub lease_seconds: u64,
    /// How often the worker should heartbeat (a fraction of the lease).
    pub heartbeat_seconds: u64,
}

/// A task this worker is running, named for fencing.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema, PartialEq, Eq, Hash)]
pub struct TaskLease {
    #[schema(value_type = i64)]
    pub task: TaskId,
    #[schema(value_type = i32)]
    pub attempt: Attempt,
}

/// `POST /v1/workers/{id}/poll` body: "here is what I run and how much room I have; answer
/// when there is work or a stop order, or after `wait_ms`".
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PollRequest {
    pub free_slots: u32,
    pub running: Vec<TaskLease>,
    pub wait_ms: u64,
    /// Set on the first poll after registering and after a poll that failed: an answer may
    /// have been lost, so the server compares `running` with what it assigned.
    #[serde(default)]
    pub reconcile: bool,
}

/// One task handed to a worker.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Assignment {
    #[schema(value_type = i64)]
    pub job: JobId,
    #[schema(value_type = i64)]
    pub task: TaskId,
    #[schema(value_type = i32)]
    pub attempt: Attempt,
    #[schema(value_type = Object)]
    pub spec: JobSpec,
    /// Device indices reserved for it on this worker.
    pub devices: Vec<u32>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StopWhy {
    /// Someone cancelled the job.
    Cancelled,
    /// The task is no longer this worker's (declared lost, or finished elsewhere).
    LeaseLost,
    /// The worker itself is shutting down; the task goes back to the queue. Never sent by
    /// the server: the worker orders it to itself.
    WorkerShutdown,
}

/// An order to kill a task's process group.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct StopOrder {
    #[serde(flatten)]
    pub lease: TaskLease,
    pub why: StopWhy,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct PollResponse {
    pub assignments: Vec<Assignment>,
    pub stop: Vec<StopOrder>,
}

/// `POST /v1/workers/{id}/heartbeat` body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HeartbeatRequest {
    pub running: Vec<TaskLease>,
}

/// One line a worker appends; `seq` makes retries idempotent.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LogAppend {
    pub seq: i64,
    pub stream: Stream,
    pub text: String,
}

/// `POST /v1/tasks/{task}/attempts/{attempt}/logs` body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LogBatch {
    pub lines: Vec<LogAppend>,
}

/// `POST /v1/tasks/{task}/attempts/{attempt}/complete` body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CompleteRequest {
    /// The process's exit code; for a signal, 128 + the signal number.
    pub exit_code: Option<i32>,
    /// Why the task failed before or around running, when it did (staging, spawn, upload).
    pub error: Option<String>,
}

/// A worker as `gpulayer workers` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WorkerSummary {
    #[schema(value_type = i64)]
    pub id: WorkerId,
    pub name: String,
    pub state: String,
    pub labels: BTreeMap<String, String>,
    pub slots: u32,
    pub busy_slots: u32,
    #[schema(value_type = Object)]
    pub inventory: Inventory,
    pub version: String,
    pub last_seen: Option<DateTime<Utc>>,
    pub registered_at: DateTime<Utc>,
    /// Device indices its running tasks hold.
    pub busy_devices: Vec<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WorkerList {
    pub workers: Vec<WorkerSummary>,
}
