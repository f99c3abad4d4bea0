//! Bearer tokens: who is calling and what they may do.

use crate::error::ApiError;
use crate::server::AppState;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use rand::Rng;
use rand::distr::Alphanumeric;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use store::Role;

/// Random characters in a secret: 40 alphanumerics is about 238 bits.
const SECRET_LEN: usize = 40;

/// A new secret with a prefix that says what it is for (`glc_` client, `glj_` join).
pub fn mint_secret(prefix: &str) -> String {
    let body: String = rand::rng()
        .sample_iter(Alphanumeric)
        .take(SECRET_LEN)
        .map(char::from)
        .collect();
    format!("{prefix}{body}")
}

/// How long a verified token is trusted without asking the database again. Every request
/// carries a token, and a worker sends several per job: without this cache each would cost a
/// query. A revoked token keeps working on a replica for at most this long.
const TOKEN_CACHE_TTL: Duration = Duration::from_secs(5);

/// Tokens this replica verified recently, keyed by the secret's sha256.
#[derive(Debug, Default)]
pub struct TokenCache {
    entries: Mutex<HashMap<[u8; 32], (Caller, Instant)>>,
}

impl TokenCache {
    fn get(&self, key: &[u8; 32]) -> Option<Caller> {
        let entries = self.entries.lock().expect("token cache lock");
        entries
            .get(key)
            .filter(|(_, at)| at.elapsed() < TOKEN_CACHE_TTL)
            .map(|(c, _)| c.clone())
    }

    fn put(&self, key: [u8; 32], caller: Caller) {
        let mut entries = self.entries.lock().expect("token cache lock");
        // Bounded: expired entries go whenever the map grows large.
        if entries.len() > 10_000 {
            entries.retain(|_, (_, at)| at.elapsed() < TOKEN_CACHE_TTL);
        }
        entries.insert(key, (caller, Instant::now()));
    }
}

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub struct Caller {
    pub token_id: i64,
    pub name: String,
    pub role: Role,
}

/// What a request needs its caller to be allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    ReadJobs,
    SubmitJobs,
    ActAsWorker,
    /// Download sources: clients that read jobs, and workers that stage them.
    FetchSources,
}

impl Caller {
    pub fn require(&self, permission: Permission) -> Result<(), ApiError> {
        use Permission::*;
        let allowed = match self.role {
            Role::Admin => true,
            Role::Submitter => matches!(permission, ReadJobs | SubmitJobs | FetchSources),
            Role::ReadOnly => matches!(permission, ReadJobs | FetchSources),
            Role::Join => matches!(permission, ActAsWorker | FetchSources),
        };
        if allowed {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!(
                "token '{}' has role {} which may not {}",
                self.name,
                self.role.as_str(),
                match permission {
                    ReadJobs => "read jobs",
                    SubmitJobs => "submit or cancel jobs",
                    ActAsWorker => "act as a worker",
                    FetchSources => "download sources",
                }
            )))
        }
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                ApiError::Unauthorized("missing bearer token (Authorization: Bearer ...)".into())
            })?;
        let secret = header
            .strip_prefix("Bearer ")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                ApiError::Unauthorized("the Authorization header is not `Bearer <token>`".into())
            })?;
        let key: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        if let Some(caller) = state.tokens.get(&key) {
            return Ok(caller);
        }
        let token = state.store.find_token(secret).await?.ok_or_else(|| {
            ApiError::Unauthorized("the token is not known to this server (or was revoked)".into())
        })?;
        let caller = Caller {
            token_id: token.id,
            name: token.name,
            role: token.role,
        };
        state.tokens.put(key, caller.clone());
        Ok(caller)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(role: Role) -> Caller {
        Caller {
            token_id: 1,
            name: "t".into(),
            role,
        }
    }

    #[test]
    fn roles_allow_exactly_their_permissions() {
        use Permission::*;
        let table = [
            (Role::Admin, [true, true, true, true]),
            (Role::Submitter, [true, true, false, true]),
            (Role::ReadOnly, [true, false, false, true]),
            (Role::Join, [false, false, true, true]),
        ];
        for (role, expect) in table {
            let got = [ReadJobs, SubmitJobs, ActAsWorker, FetchSources]
                .map(|p| caller(role).require(p).is_ok());
            assert_eq!(got, expect, "{role:?}");
        }
    }

    #[test]
    fn secrets_carry_their_prefix_and_differ() {
        let a = mint_secret("glc_");
        assert!(a.starts_with("glc_") && a.len() == 44);
        assert_ne!(a, mint_secret("glc_"));
    }
}
