//! `ApiError`: every failure a handler returns, mapped to an HTTP status and a stable code.
//! Internal details go to the server log, never to the caller.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use protocol::{ErrorBody, ErrorCode};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    LeaseLost(String),
    #[error("{0}")]
    WorkerLost(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("internal error: {0}")]
    Internal(String),
    /// No online worker could ever run the job.
    #[error("{}", .0.table)]
    Unplaceable(protocol::PlacementReport),
}

impl ApiError {
    pub(crate) fn parts(&self) -> (StatusCode, ErrorCode) {
        match self {
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, ErrorCode::Forbidden),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, ErrorCode::NotFound),
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, ErrorCode::BadRequest),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, ErrorCode::Conflict),
            ApiError::LeaseLost(_) => (StatusCode::CONFLICT, ErrorCode::LeaseLost),
            ApiError::WorkerLost(_) => (StatusCode::GONE, ErrorCode::WorkerLost),
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable),
            ApiError::PayloadTooLarge(_) => {
                (StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::PayloadTooLarge)
            }
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal),
            ApiError::Unplaceable(_) => (StatusCode::UNPROCESSABLE_ENTITY, ErrorCode::Unplaceable),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.parts();
        let placement = match &self {
            ApiError::Unplaceable(report) => Some(report.clone()),
            _ => None,
        };
        let message = match &self {
            ApiError::Internal(detail) => {
                tracing::error!(%detail, "internal error");
                "internal error; the server log has the details".to_string()
            }
            other => other.to_string(),
        };
        (
            status,
            Json(ErrorBody {
                code,
                message,
                placement,
            }),
        )
            .into_response()
    }
}

impl From<store::StoreError> for ApiError {
    fn from(e: store::StoreError) -> Self {
        use store::StoreError as S;
        match e {
            S::NotFound(what) => ApiError::NotFound(format!("{what} does not exist")),
            S::Conflict(what) => ApiError::Conflict(what),
            e @ S::LeaseLost { .. } => ApiError::LeaseLost(e.to_string()),
            e @ S::WorkerLost(_) => ApiError::WorkerLost(e.to_string()),
            e @ S::PollSuperseded(_) => ApiError::Conflict(e.to_string()),
            S::Database(sqlx::Error::PoolTimedOut) => ApiError::Unavailable(
                "the database is overloaded or unreachable; retry shortly".into(),
            ),
            // Text PostgreSQL cannot hold (a NUL character, in a text column or as \u0000 in
            // JSON): the request's fault, whichever field of it the check before missed.
            S::Database(sqlx::Error::Database(d)) if unstorable_text(d.code().as_deref()) => {
                ApiError::BadRequest(
                    "the request holds a NUL character (\\0, \\u0000), which no text field may contain"
                        .into(),
                )
            }
            other => ApiError::Internal(other.to_string()),
        }
    }
}

/// SQLSTATEs of text the database cannot store: 22021 character_not_in_repertoire (a NUL in
/// text), 22P05 untranslatable_character (`\u0000` in jsonb).
fn unstorable_text(code: Option<&str>) -> bool {
    matches!(code, Some("22021" | "22P05"))
}

impl From<object_store::Error> for ApiError {
    fn from(e: object_store::Error) -> Self {
        match e {
            object_store::Error::NotFound { path, .. } => {
                ApiError::NotFound(format!("object {path} does not exist"))
            }
            other => ApiError::Internal(format!("object store: {other}")),
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
