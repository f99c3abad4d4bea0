//! Jobs as clients submit and see them.

use chrono::{DateTime, Utc};
use domain::{Accelerator, JobId, JobSpec, JobState, Layout, SourceRef, WorkerId};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/jobs` body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SubmitRequest {
    /// The job spec: `command` (argv, non-empty), `accelerator` (cpu|cuda|mps|any), optional
    /// `name`, `source` (a blob uploaded first), `outputs` (globs) and `env` ({name, value}).
    #[schema(value_type = Object)]
    pub spec: JobSpec,
}

/// `POST /v1/jobs/batch` body: many jobs in one request (at most 10,000). Each element is a
/// job spec as in `SubmitRequest`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BatchSubmitRequest {
    #[schema(value_type = Vec<Object>)]
    pub jobs: Vec<serde_json::Value>,
}

/// The ids of a batch's jobs, in the order they were given.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BatchSubmitResponse {
    #[schema(value_type = Vec<i64>)]
    pub ids: Vec<JobId>,
}

/// A worker as a job refers to it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct WorkerRef {
    #[schema(value_type = i64)]
    pub id: WorkerId,
    pub name: String,
}

/// A job as `status`, `jobs` and the dashboard show it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobView {
    #[schema(value_type = i64)]
    pub id: JobId,
    pub name: Option<String>,
    #[schema(value_type = String, example = "running")]
    pub state: JobState,
    #[schema(value_type = String, example = "cuda")]
    pub accelerator: Accelerator,
    pub command: Vec<String>,
    #[schema(value_type = Option<Object>)]
    pub source: Option<SourceRef>,
    pub outputs: Vec<String>,
    pub worker: Option<WorkerRef>,
    pub attempt: i32,
    pub exit_code: Option<i32>,
    /// Why the job ended as it did (or why it is still waiting), in words.
    pub reason: Option<String>,
    /// The name of the token that submitted it.
    pub submitted_by: Option<String>,
    /// Size of the packed outputs once uploaded.
    pub outputs_bytes: Option<i64>,
    /// Device indices (of its accelerator kind) the job holds on its worker.
    pub devices: Vec<u32>,
    /// For a pending job: why each worker does not run it yet.
    pub waiting: Option<PlacementReport>,
    pub created_at: DateTime<Utc>,
    pub assigned_at: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Nodes, processes per node, and how far apart the nodes may be.
    #[schema(value_type = Object)]
    #[serde(default)]
    pub layout: Layout,
    /// A multi-node job's nodes, in node order (`status` only; empty otherwise).
    #[serde(default)]
    pub nodes: Vec<NodeView>,
    /// Where a multi-node job's latest attempt was placed and why, e.g. "2 nodes in network
    /// group r1 (2 eligible there)" (`status` only).
    #[serde(default)]
    pub placed: Option<String>,
}

/// One node of a multi-node job.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeView {
    pub node: u32,
    pub worker: Option<WorkerRef>,
    pub state: String,
    pub attempt: i32,
    pub exit_code: Option<i32>,
    pub reason: Option<String>,
    pub devices: Vec<u32>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// `GET /v1/jobs` response, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobList {
    pub jobs: Vec<JobView>,
}

/// `POST /v1/jobs/{id}/cancel` response.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CancelResponse {
    pub job: JobView,
    /// The state the job was in when the cancel arrived.
    #[schema(value_type = String)]
    pub previous_state: JobState,
}

/// One worker's verdict on one job.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct WorkerVerdict {
    pub worker: String,
    pub eligible: bool,
    /// Why not, as the CLI prints it (`needs 2 usable cuda device(s), worker has 1`).
    pub reason: Option<String>,
    /// True when the reason may pass (busy, offline) rather than never.
    pub temporary: bool,
}

/// Where a job could go: `POST /v1/placement` (a dry run), a pending job's `waiting`, and
/// the body of an `unplaceable` submit.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct PlacementReport {
    pub eligible_workers: usize,
    pub verdicts: Vec<WorkerVerdict>,
    /// The same as text, one aligned line per worker.
    pub table: String,
}
