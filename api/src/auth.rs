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

/// A new secret with a prefix that says what it is for (`Role::secret_prefix`: `gla_`
/// admin, `gls_` submitter, `glr_` read-only, `glj_` worker).
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
/// query. A revoked token keeps working on the other replicas for at most this long (the
/// replica that revoked it forgets it at once); an expiring one is never trusted past its
/// expiry.
const TOKEN_CACHE_TTL: Duration = Duration::from_secs(5);

/// Tokens this replica verified recently, keyed by the secret's sha256.
#[derive(Debug, Default)]
pub struct TokenCache {
    /// Each caller with the instant it stops being trusted without asking again.
    entries: Mutex<HashMap<[u8; 32], (Caller, Instant)>>,
}

impl TokenCache {
    fn get(&self, key: &[u8; 32]) -> Option<Caller> {
        let entries = self.entries.lock().expect("token cache lock");
        entries
            .get(key)
            .filter(|(_, until)| Instant::now() < *until)
            .map(|(c, _)| c.clone())
    }

    /// Trusts `caller` for `TOKEN_CACHE_TTL`, or until its token expires if that is sooner.
    fn put(
        &self,
        key: [u8; 32],
        caller: Caller,
        expires_at: Option<chrono::DateTime<chrono::Utc>>,
    ) {
        let now = Instant::now();
        let mut until = now + TOKEN_CACHE_TTL;
        if let Some(at) = expires_at {
            let left = (at - chrono::Utc::now()).to_std().unwrap_or(Duration::ZERO);
            until = until.min(now + left);
        }
        let mut entries = self.entries.lock().expect("token cache lock");
        // Bounded: stale entries go whenever the map grows large.
        if entries.len() > 10_000 {
            entries.retain(|_, (_, until)| now < *until);
        }
        entries.insert(key, (caller, until));
    }

    /// Drops token `id` (just revoked) so this replica refuses it at once.
    pub fn forget(&self, id: i64) {
        let mut entries = self.entries.lock().expect("token cache lock");
        entries.retain(|_, (c, _)| c.token_id != id);
    }
}

/// Recent refusals of unknown tokens on this replica. Each refusal waits longer the more
/// there were in the last `BAD_TOKEN_WINDOW`, so guessing (or a misconfigured client in a
/// retry loop) costs the guesser time and the database little; known tokens never wait.
#[derive(Debug, Default)]
pub struct BadTokens {
    recent: Mutex<std::collections::VecDeque<Instant>>,
}

const BAD_TOKEN_WINDOW: Duration = Duration::from_secs(10);
/// What each recent refusal adds to the next one's wait, and the most it waits.
const BAD_TOKEN_STEP: Duration = Duration::from_millis(50);
const BAD_TOKEN_MAX_WAIT: Duration = Duration::from_secs(2);

impl BadTokens {
    /// Records a refusal; how long to wait before answering it.
    pub fn refused(&self) -> Duration {
        let mut recent = self.recent.lock().expect("bad tokens lock");
        let now = Instant::now();
        while recent
            .front()
            .is_some_and(|at| now.duration_since(*at) > BAD_TOKEN_WINDOW)
        {
            recent.pop_front();
        }
        let wait = BAD_TOKEN_STEP
            .saturating_mul(recent.len() as u32)
            .min(BAD_TOKEN_MAX_WAIT);
        if recent.len() < 10_000 {
            recent.push_back(now);
        }
        wait
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
    /// Create, list and revoke tokens.
    ManageTokens,
}

impl Caller {
    pub fn require(&self, permission: Permission) -> Result<(), ApiError> {
        use Permission::*;
        let allowed = match self.role {
            Role::Admin => true,
            // Only admins manage tokens: no other role can make itself an admin.
            Role::Submitter => matches!(permission, ReadJobs | SubmitJobs | FetchSources),
            Role::ReadOnly => matches!(permission, ReadJobs | FetchSources),
            Role::Worker => matches!(permission, ActAsWorker | FetchSources),
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
                    ManageTokens => "manage tokens",
                }
            )))
        }
    }
}

/// The permissions as types, for `Authorized`.
pub mod may {
    use super::Permission;

    /// A permission a handler needs, as a type.
    pub trait Needs: Send + Sync + 'static {
        const PERMISSION: Permission;
    }

    macro_rules! permissions {
        ($($name:ident),*) => {$(
            pub struct $name;
            impl Needs for $name {
                const PERMISSION: Permission = Permission::$name;
            }
        )*};
    }
    permissions!(
        ReadJobs,
        SubmitJobs,
        ActAsWorker,
        FetchSources,
        ManageTokens
    );
}

/// A caller that has permission `P`. Checked while the request's head is read, before any
/// other extractor runs: a caller without the right is refused (403) before its path is
/// parsed or its body read, so no role learns anything from an endpoint it may not call.
pub struct Authorized<P: may::Needs>(pub Caller, pub std::marker::PhantomData<P>);

impl<P: may::Needs> FromRequestParts<AppState> for Authorized<P> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let caller = Caller::from_request_parts(parts, state).await?;
        caller.require(P::PERMISSION)?;
        Ok(Authorized(caller, std::marker::PhantomData))
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
        let Some(token) = state.store.find_token(secret).await? else {
            tokio::time::sleep(state.bad_tokens.refused()).await;
            return Err(ApiError::Unauthorized(
                "the token is not known to this server (or was revoked, or expired)".into(),
            ));
        };
        let caller = Caller {
            token_id: token.id,
            name: token.name,
            role: token.role,
        };
        state.tokens.put(key, caller.clone(), token.expires_at);
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
            (Role::Admin, [true, true, true, true, true]),
            (Role::Submitter, [true, true, false, true, false]),
            (Role::ReadOnly, [true, false, false, true, false]),
            (Role::Worker, [false, false, true, true, false]),
        ];
        for (role, expect) in table {
            let got = [
                ReadJobs,
                SubmitJobs,
                ActAsWorker,
                FetchSources,
                ManageTokens,
            ]
            .map(|p| caller(role).require(p).is_ok());
            assert_eq!(got, expect, "{role:?}");
        }
    }

    #[test]
    fn each_unknown_token_in_a_burst_waits_longer_up_to_a_cap() {
        let bad = BadTokens::default();
        let waits: Vec<Duration> = (0..50).map(|_| bad.refused()).collect();
        assert_eq!(waits[0], Duration::ZERO);
        assert_eq!(waits[1], BAD_TOKEN_STEP);
        assert_eq!(waits[10], BAD_TOKEN_STEP * 10);
        assert_eq!(waits[49], BAD_TOKEN_MAX_WAIT);
        assert!(waits.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn secrets_carry_their_prefix_and_differ() {
        let a = mint_secret("gla_");
        assert!(a.starts_with("gla_") && a.len() == 44);
        assert_ne!(a, mint_secret("gla_"));
    }
}
