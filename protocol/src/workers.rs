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

/// `POST /v1/workers/{id}/poll` body: "here is what I run, how much room I have and what
/// happened since my last answered poll; answer when there is work or a stop order, or after
/// `wait_ms`".
///
/// A poll that carries reports is answered as soon as they are recorded; one that does not
/// may be held until there is work or a stop order. A worker may drop a poll at any time (to
/// send news sooner) and send a new one: reports are idempotent and repeated until a poll
/// carrying them is answered, and tasks assigned for a dropped poll are delivered again by
/// the next one (`poll_seq` fences the dropped poll off, so it assigns nothing after its
/// successor has started).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PollRequest {
    pub free_slots: u32,
    /// Remote function calls the worker would queue beyond its free slots (its warm runners
    /// take them one after another): calls are claimed in batches.
    #[serde(default)]
    pub call_room: u32,
    pub running: Vec<TaskLease>,
    pub wait_ms: u64,
    /// Set on the first poll after registering, and after a poll that failed or was dropped
    /// while it could have claimed: its answer may have been lost. The server then hands out
    /// again the tasks it assigned here that the worker does not run, and fails those it
    /// thinks run here that the worker no longer runs.
    #[serde(default)]
    pub reconcile: bool,
    /// Increases with every poll of one registration.
    #[serde(default)]
    pub poll_seq: u64,
    /// Starts and ends of tasks not yet acknowledged by an answered poll.
    #[serde(default)]
    pub reports: TaskReports,
    /// Nothing runs on the worker any more, so no news can come that this poll would delay:
    /// the server may hold it (for new work) after recording its reports, which spares the
    /// worker a second poll and the server a second round.
    #[serde(default)]
    pub quiet: bool,
}

/// What happened to a worker's tasks, told in the next poll.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct TaskReports {
    #[serde(default)]
    pub started: Vec<TaskStarted>,
    #[serde(default)]
    pub finished: Vec<TaskFinished>,
}

impl TaskReports {
    pub fn is_empty(&self) -> bool {
        self.started.is_empty() && self.finished.is_empty()
    }
}

/// A task's process started `age_us` microseconds before the poll was sent. Ages rather than
/// timestamps, so the worker's clock never has to agree with the server's.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct TaskStarted {
    #[serde(flatten)]
    pub lease: TaskLease,
    pub age_us: u64,
}

/// A task ended `age_us` microseconds before the poll was sent, after its last log line and
/// its outputs were stored.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct TaskFinished {
    #[serde(flatten)]
    pub lease: TaskLease,
    /// The process's exit code; for a signal, 128 + the signal number.
    pub exit_code: Option<i32>,
    /// Why the task failed before or around running, when it did (staging, spawn, upload).
    pub error: Option<String>,
    /// When its process started, if it did (a start not yet reported travels here).
    pub started_age_us: Option<u64>,
    pub age_us: u64,
    /// A remote function call's value or exception.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub call: Option<domain::CallOutcome>,
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
    /// Which node of its job this is (a multi-node job's node rank; 0 otherwise).
    #[serde(default)]
    pub node: u32,
}

/// `POST /v1/workers/{w}/tasks/{t}/attempts/{a}/rendezvous` body (node 0 of a distributed
/// job), and what `GET` on the same path answers once node 0 has said.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct RendezvousPoint {
    /// An address of node 0 that the other nodes reach.
    pub addr: String,
    /// A port free on node 0, where rank 0 listens.
    pub port: u16,
}

/// `GET .../rendezvous` answer: where to meet, once node 0 has said (the call waits a while
/// for it), else nothing yet.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct RendezvousAnswer {
    pub rendezvous: Option<RendezvousPoint>,
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
    /// Finished reports the server refused: those tasks are no longer this worker's (their
    /// lease was lost), so their results were dropped.
    #[serde(default)]
    pub lost: Vec<TaskLease>,
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
    /// The global rank of the process that printed it, in a multi-process job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

/// `POST /v1/tasks/{task}/attempts/{attempt}/logs` body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LogBatch {
    pub lines: Vec<LogAppend>,
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
