//! What can go wrong talking to a server, each with what to do about it.

use protocol::ErrorCode;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "'{url}' is not a valid server URL ({detail}); set GPULAYER_URL to e.g. http://127.0.0.1:8470"
    )]
    BadUrl { url: String, detail: String },
    #[error(
        "cannot reach the GPUlayer server at {url}: {detail} (is `gpulayer up` running there? set GPULAYER_URL or `url` in the config file)"
    )]
    Unreachable { url: String, detail: String },
    #[error(
        "the server at {url} rejected the token: {message} (set GPULAYER_TOKEN or `token` in the config file)"
    )]
    Unauthorized { url: String, message: String },
    #[error("{message}")]
    Api {
        status: u16,
        code: ErrorCode,
        message: String,
    },
    /// No online worker could ever run the job: every worker's verdict.
    #[error("{}", .0.table)]
    Unplaceable(protocol::PlacementReport),
    #[error("unexpected answer from {url}: {detail}")]
    Protocol { url: String, detail: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl ClientError {
    /// The server's stable error code, when the server answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Api { code, .. } => Some(*code),
            ClientError::Unauthorized { .. } => Some(ErrorCode::Unauthorized),
            ClientError::Unplaceable(_) => Some(ErrorCode::Unplaceable),
            _ => None,
        }
    }

    /// Whether trying again later may succeed (the server was down or overloaded).
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Unreachable { .. } => true,
            ClientError::Api { status, .. } => *status >= 500,
            _ => false,
        }
    }
}
