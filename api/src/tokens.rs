//! `/v1/tokens`: admin tokens create, list and revoke tokens of every role.

use crate::auth::{Authorized, may, mint_secret};
use crate::error::{ApiError, ApiResult};
use crate::server::AppState;
use axum::Json;
use axum::extract::{Path, Query, State};
use protocol::{CreateTokenRequest, CreatedToken, TokenList, TokenView};
use serde::Deserialize;
use store::{Role, TokenInfo};

fn view(t: TokenInfo) -> TokenView {
    let state = if t.revoked_at.is_some() {
        "revoked"
    } else if t.expires_at.is_some_and(|at| at <= chrono::Utc::now()) {
        "expired"
    } else {
        "live"
    };
    TokenView {
        id: t.id,
        name: t.name,
        role: t.role.as_str().to_string(),
        state: state.to_string(),
        created_at: t.created_at,
        expires_at: t.expires_at,
        revoked_at: t.revoked_at,
        created_by: t.created_by,
        jobs: t.jobs,
    }
}

/// Create a token (admin only). The secret is in this answer and nowhere else.
#[utoipa::path(post, path = "/v1/tokens", request_body = CreateTokenRequest,
    responses((status = 200, body = CreatedToken)))]
pub async fn create(
    State(app): State<AppState>,
    Authorized(caller, _): Authorized<may::ManageTokens>,
    Json(req): Json<CreateTokenRequest>,
) -> ApiResult<Json<CreatedToken>> {
    crate::names::check_plain_name("token", &req.name).map_err(ApiError::BadRequest)?;
    let role = Role::parse(&req.role).ok_or_else(|| {
        ApiError::BadRequest(format!(
            "unknown role '{}': use admin, submitter, read-only or worker",
            req.role
        ))
    })?;
    if let Some(s) = req.expires_in_seconds
        && !(1..=10 * 366 * 86_400).contains(&s)
    {
        return Err(ApiError::BadRequest(format!(
            "expires_in_seconds must be between 1 and ten years, not {s}"
        )));
    }
    let secret = mint_secret(role.secret_prefix());
    let token = app
        .store
        .create_token(
            &req.name,
            role,
            &secret,
            req.expires_in_seconds,
            Some(caller.token_id),
        )
        .await?;
    tracing::info!(id = token.id, name = %token.name, role = role.as_str(), by = %caller.name, "token created");
    Ok(Json(CreatedToken {
        token: view(token),
        secret,
    }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct ListQuery {
    /// Also revoked and expired tokens.
    #[serde(default)]
    pub all: bool,
}

/// List tokens (admin only), oldest first; never their secrets.
#[utoipa::path(get, path = "/v1/tokens", params(ListQuery), responses((status = 200, body = TokenList)))]
pub async fn list(
    State(app): State<AppState>,
    _: Authorized<may::ManageTokens>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<TokenList>> {
    let tokens = app.store.list_tokens(q.all).await?;
    Ok(Json(TokenList {
        tokens: tokens.into_iter().map(view).collect(),
    }))
}

/// Revoke a token (admin only): refused from then on — at once on this replica, within
/// seconds on the others (each trusts a verified token for a few seconds).
#[utoipa::path(post, path = "/v1/tokens/{id}/revoke", params(("id" = i64, Path, description = "the token's id")), responses((status = 200, body = TokenView)))]
pub async fn revoke(
    State(app): State<AppState>,
    Authorized(caller, _): Authorized<may::ManageTokens>,
    Path(id): Path<String>,
) -> ApiResult<Json<TokenView>> {
    let id: i64 = id
        .parse()
        .map_err(|_| ApiError::BadRequest(format!("'{id}' is not a token id")))?;
    let token = app
        .store
        .revoke_token(id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("there is no token {id}")))?;
    app.tokens.forget(id);
    tracing::info!(id, name = %token.name, by = %caller.name, "token revoked");
    Ok(Json(view(token)))
}
