//! The error body of every non-2xx response: a stable code for programs, a sentence for people.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Stable error codes; programs match on these, never on the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    Unauthorized,
    Forbidden,
    NotFound,
    BadRequest,
    Conflict,
    LeaseLost,
    /// The worker was declared lost; it must register again.
    WorkerLost,
    PayloadTooLarge,
    /// No online worker could ever run the job; `placement` says why, per worker.
    Unplaceable,
    Internal,
    Unavailable,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
    /// With `unplaceable`: every worker's verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<crate::PlacementReport>,
}
