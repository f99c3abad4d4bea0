//! The dashboard's one-time login links and browser sessions. Only sha256s of their secrets
//! are stored; a session acts with its token's role and ends with the token.

use crate::tokens::{Role, TokenRow};
use crate::{Result, Store, StoreError};
use sha2::{Digest, Sha256};
use sqlx::Row;
use std::time::Duration;

fn hash(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

/// A live session: its token and the CSRF value its forms carry.
#[derive(Debug, Clone)]
pub struct SessionRow {
    pub token: TokenRow,
    pub csrf: String,
}

impl Store {
    /// Records a one-time login link for `token_id`, good for `ttl`.
    pub async fn create_dashboard_link(
        &self,
        token_id: i64,
        code: &str,
        ttl: Duration,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO dashboard_links (code_sha256, token_id, expires_at)
             VALUES ($1, $2, now() + make_interval(secs => $3))",
        )
        .bind(hash(code))
        .bind(token_id)
        .bind(ttl.as_secs_f64())
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Uses up a login link: its token if the link existed, had not expired and its token
    /// is still live. A link works once, even when two browsers race for it.
    pub async fn redeem_dashboard_link(&self, code: &str) -> Result<Option<i64>> {
        let row = sqlx::query(
            "WITH used AS (DELETE FROM dashboard_links WHERE code_sha256 = $1 RETURNING *)
             SELECT u.token_id FROM used u JOIN tokens t ON t.id = u.token_id
             WHERE u.expires_at > now() AND t.revoked_at IS NULL
               AND (t.expires_at IS NULL OR t.expires_at > now())",
        )
        .bind(hash(code))
        .fetch_optional(self.pool())
        .await?;
        // Expired links of everybody go on the way.
        sqlx::query("DELETE FROM dashboard_links WHERE expires_at < now()")
            .execute(self.pool())
            .await?;
        Ok(row.map(|r| r.get(0)))
    }

    /// Opens a session for `token_id`, good for `ttl` (never past the token's expiry).
    pub async fn create_dashboard_session(
        &self,
        token_id: i64,
        secret: &str,
        csrf: &str,
        ttl: Duration,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO dashboard_sessions (secret_sha256, token_id, csrf, expires_at)
             SELECT $1, id, $3, LEAST(now() + make_interval(secs => $4),
                                      COALESCE(expires_at, 'infinity'))
             FROM tokens WHERE id = $2",
        )
        .bind(hash(secret))
        .bind(token_id)
        .bind(csrf)
        .bind(ttl.as_secs_f64())
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// The live session with this secret, if any (its token not revoked nor expired).
    pub async fn find_dashboard_session(&self, secret: &str) -> Result<Option<SessionRow>> {
        let row = sqlx::query(
            "SELECT t.id, t.name, t.role, t.expires_at, s.csrf
             FROM dashboard_sessions s JOIN tokens t ON t.id = s.token_id
             WHERE s.secret_sha256 = $1 AND s.expires_at > now() AND t.revoked_at IS NULL
               AND (t.expires_at IS NULL OR t.expires_at > now())",
        )
        .bind(hash(secret))
        .fetch_optional(self.pool())
        .await?;
        row.map(|r| {
            let role: String = r.get("role");
            Ok(SessionRow {
                token: TokenRow {
                    id: r.get("id"),
                    name: r.get("name"),
                    role: Role::parse(&role)
                        .ok_or_else(|| StoreError::Corrupt(format!("token role '{role}'")))?,
                    expires_at: r.get("expires_at"),
                },
                csrf: r.get("csrf"),
            })
        })
        .transpose()
    }

    /// Ends a session (logging out).
    pub async fn delete_dashboard_session(&self, secret: &str) -> Result<()> {
        sqlx::query("DELETE FROM dashboard_sessions WHERE secret_sha256 = $1")
            .bind(hash(secret))
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Deletes sessions and links that expired (the leader's sweep).
    pub async fn prune_dashboard_sessions(&self) -> Result<u64> {
        let sessions = sqlx::query("DELETE FROM dashboard_sessions WHERE expires_at < now()")
            .execute(self.pool())
            .await?;
        sqlx::query("DELETE FROM dashboard_links WHERE expires_at < now()")
            .execute(self.pool())
            .await?;
        Ok(sessions.rows_affected())
    }
}
