//! What goes over the wire between the CLI/SDK, the API replicas and the workers.
//!
//! Version 1 of the REST surface lives under `/v1`. Every type here is serde JSON and carries
//! a `utoipa` schema so `/v1/openapi.json` is generated from the same definitions.
//!
//! # Layout
//! - [`jobs`] — submitting, listing, cancelling jobs; job views.
//! - [`logs`] — log lines, pages and the websocket stream's messages.
//! - [`tokens`] — creating, listing and revoking tokens.
//! - [`workers`] — the worker channel: register, poll (with task reports), heartbeat, logs.
//! - [`errors`] — the error body every non-2xx response carries.

pub mod calls;
pub mod errors;
pub mod jobs;
pub mod logs;
pub mod tokens;
pub mod workers;

pub use errors::{ErrorBody, ErrorCode};
pub use jobs::{
    BatchSubmitRequest, BatchSubmitResponse, CancelResponse, JobList, JobView, NodeView,
    PlacementReport, SubmitRequest, WorkerRef, WorkerVerdict,
};
pub use logs::{LogLine, LogPage, LogStreamMessage, Stream};
pub use tokens::{CreateTokenRequest, CreatedToken, DashboardLink, TokenList, TokenView};
pub use workers::{
    Assignment, HeartbeatRequest, LogAppend, LogBatch, PollRequest, PollResponse, RegisterRequest,
    RegisterResponse, RendezvousAnswer, RendezvousPoint, StopOrder, StopWhy, TaskFinished,
    TaskLease, TaskReports, TaskStarted, WorkerList, WorkerSummary,
};

/// The path prefix of this protocol version.
pub const PREFIX: &str = "/v1";

/// Header that carries a client-chosen key so a retried submit creates one job, not two.
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";
