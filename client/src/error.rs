//! What can go wrong talking to a server, each with what to do about it.

use protocol::ErrorCode;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "'{url}' is not a valid server URL ({detail}); set GPULAYER_URL to e.g. https://127.0.0.1:8470"
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
    #[error(
        "'{given}' is not a certificate fingerprint ({detail}); use the sha256:... that `gpulayer up` printed (GPULAYER_FINGERPRINT, --fingerprint or `fingerprint` in the config file)"
    )]
    BadFingerprint { given: String, detail: String },
    /// The server presented another certificate than the pinned one.
    #[error(
        "the server at {url} presented the certificate {presented}, not the pinned {pinned}: refusing to talk to it (if the server's certificate was changed on purpose, set GPULAYER_FINGERPRINT, --fingerprint or `fingerprint` in the config file to what `gpulayer up` prints now; otherwise something is between you and the server)"
    )]
    FingerprintMismatch {
        url: String,
        presented: String,
        pinned: String,
    },
    /// An https server whose certificate this system does not trust, and no fingerprint.
    #[error(
        "the server at {url} presented a certificate this system does not trust ({detail}): pin it with GPULAYER_FINGERPRINT=sha256:... (or --fingerprint), as `gpulayer up` printed it"
    )]
    UntrustedCertificate { url: String, detail: String },
    /// A fingerprint was given for a server that does not speak TLS.
    #[error(
        "a certificate fingerprint is set but {url} is plain http: use https:// (`gpulayer up` speaks TLS unless started with --insecure-http), or unset GPULAYER_FINGERPRINT"
    )]
    PinWithoutTls { url: String },
    #[error("cannot set up TLS: {0}")]
    Tls(String),
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
