//! Tokens: creating, listing and revoking them (admin tokens only).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/tokens`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTokenRequest {
    /// What the token is for (1-64 of `A-Z a-z 0-9 . _ -`); shown on every job it submits.
    pub name: String,
    /// `admin`, `submitter`, `read-only` or `worker`.
    pub role: String,
    /// Seconds until it stops working; none: until revoked.
    pub expires_in_seconds: Option<i64>,
}

/// A token as the server has it (never its secret).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenView {
    pub id: i64,
    pub name: String,
    pub role: String,
    /// `live`, `expired` or `revoked`.
    pub state: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
    /// The name of the token that created it (none: `gpulayer up` did).
    pub created_by: Option<String>,
    /// How many jobs it submitted.
    pub jobs: i64,
}

/// `POST /v1/tokens`' answer: the secret, shown this once.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CreatedToken {
    pub token: TokenView,
    pub secret: String,
}

/// `GET /v1/tokens`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenList {
    pub tokens: Vec<TokenView>,
}

/// `POST /v1/dashboard/links`' answer: a one-time link that opens the dashboard logged in as
/// the calling token.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DashboardLink {
    /// Path and query of the link, to append to the server's URL.
    pub path: String,
    pub expires_in_seconds: u64,
}
