//! Results of remote function calls (`@gl.remote`), as their callers fetch them.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The most calls one `POST /v1/calls/results` asks about.
pub const MAX_CALLS_PER_REQUEST: usize = 10_000;

/// The longest `POST /v1/calls/results` holds a request open waiting for a result.
pub const MAX_RESULTS_WAIT_MS: u64 = 20_000;

/// `POST /v1/calls/results` body: the calls (job ids) to ask about; with `wait_ms`, the
/// answer waits up to that long for at least one of them to finish.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CallResultsRequest {
    pub jobs: Vec<i64>,
    #[serde(default)]
    pub wait_ms: u64,
}

/// `POST /v1/calls` body: one remote call to submit, and how long to wait for its result
/// (at most `MAX_RESULTS_WAIT_MS`) before answering with the job alone. Sends as
/// `Idempotency-Key` what a submit does.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CallRequest {
    #[schema(value_type = Object)]
    pub spec: domain::JobSpec,
    #[serde(default)]
    pub wait_ms: u64,
}

/// The answer to `POST /v1/calls`: the call's job, with its result if it finished in time
/// (else ask `POST /v1/calls/results`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CallAnswer {
    pub job: i64,
    pub result: Option<CallResult>,
}

/// The calls among those asked about that have finished.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CallResults {
    pub results: Vec<CallResult>,
}

/// One finished call.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CallResult {
    pub job: i64,
    /// `succeeded`, `failed` or `cancelled`.
    pub state: String,
    /// Why the job failed, when it did.
    pub reason: Option<String>,
    /// What the call did: None when it never reported (lost worker, cancel, timeout).
    pub ok: Option<bool>,
    /// The pickled value (ok) or exception, base64.
    pub payload: Option<String>,
    /// What was raised: type, module, message, traceback.
    #[schema(value_type = Option<Object>)]
    pub error: Option<serde_json::Value>,
    /// The call's stdout (1) and stderr (2) lines, in order: `[[stream, text], ...]`.
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    pub lines: Vec<(u8, String)>,
}
