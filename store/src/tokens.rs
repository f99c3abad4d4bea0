//! Bearer tokens. Only the sha256 of a secret is stored; the secret is shown once.

use crate::{Result, Store};
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};
use sqlx::Row;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Everything, tokens included.
    Admin,
    /// Submit, read and cancel jobs.
    Submitter,
    /// Read jobs, logs, outputs and workers.
    ReadOnly,
    /// Register a worker and act as one.
    Worker,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Admin, Role::Submitter, Role::ReadOnly, Role::Worker];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Submitter => "submitter",
            Role::ReadOnly => "read-only",
            Role::Worker => "worker",
        }
    }

    /// The start of this role's secrets, so a token says what it is wherever it is pasted.
    pub fn secret_prefix(self) -> &'static str {
        match self {
            Role::Admin => "gla_",
            Role::Submitter => "gls_",
            Role::ReadOnly => "glr_",
            Role::Worker => "glj_",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// A live token, as a request's caller.
#[derive(Debug, Clone)]
pub struct TokenRow {
    pub id: i64,
    pub name: String,
    pub role: Role,
    pub expires_at: Option<DateTime<Utc>>,
}

/// A token as `gpulayer token list` shows it (never its secret).
#[derive(Debug, Clone)]
pub struct TokenInfo {
    pub id: i64,
    pub name: String,
    pub role: Role,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
    /// The name of the token that created it (None: made by `gpulayer up`).
    pub created_by: Option<String>,
    /// How many jobs it submitted.
    pub jobs: i64,
}

fn secret_hash(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

fn role_of(r: &sqlx::postgres::PgRow) -> Result<Role> {
    let role: String = r.get("role");
    Role::parse(&role).ok_or_else(|| crate::StoreError::Corrupt(format!("token role '{role}'")))
}

/// The columns of a `TokenInfo` (a constant: the only thing formatted into these queries).
const INFO_COLUMNS: &str = "t.id, t.name, t.role, t.created_at, t.expires_at, t.revoked_at, \
     c.name AS created_by, (SELECT count(*) FROM jobs j WHERE j.submitted_by = t.id) AS jobs";

fn info(r: &sqlx::postgres::PgRow) -> Result<TokenInfo> {
    Ok(TokenInfo {
        id: r.get("id"),
        name: r.get("name"),
        role: role_of(r)?,
        created_at: r.get("created_at"),
        expires_at: r.get("expires_at"),
        revoked_at: r.get("revoked_at"),
        created_by: r.get("created_by"),
        jobs: r.get("jobs"),
    })
}

impl Store {
    /// Stores a new token's hash; the caller generated and shows the secret.
    pub async fn insert_token(&self, name: &str, role: Role, secret: &str) -> Result<i64> {
        Ok(self.create_token(name, role, secret, None, None).await?.id)
    }

    /// Stores a new token's hash, expiring after `expires_in_seconds` when given, made by
    /// the token `created_by`.
    pub async fn create_token(
        &self,
        name: &str,
        role: Role,
        secret: &str,
        expires_in_seconds: Option<i64>,
        created_by: Option<i64>,
    ) -> Result<TokenInfo> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "WITH t AS (
                 INSERT INTO tokens (name, role, secret_sha256, expires_at, created_by)
                 VALUES ($1, $2, $3, now() + make_interval(secs => $4), $5)
                 RETURNING *)
             SELECT {INFO_COLUMNS} FROM t LEFT JOIN tokens c ON c.id = t.created_by"
        )))
        .bind(name)
        .bind(role.as_str())
        .bind(secret_hash(secret))
        .bind(expires_in_seconds.map(|s| s as f64))
        .bind(created_by)
        .fetch_one(self.pool())
        .await?;
        info(&row)
    }

    /// The live (not revoked, not expired) token with this secret, if any.
    pub async fn find_token(&self, secret: &str) -> Result<Option<TokenRow>> {
        let row = sqlx::query(
            "SELECT id, name, role, expires_at FROM tokens
             WHERE secret_sha256 = $1 AND revoked_at IS NULL
               AND (expires_at IS NULL OR expires_at > now())",
        )
        .bind(secret_hash(secret))
        .fetch_optional(self.pool())
        .await?;
        row.map(|r| {
            Ok(TokenRow {
                id: r.get("id"),
                name: r.get("name"),
                role: role_of(&r)?,
                expires_at: r.get("expires_at"),
            })
        })
        .transpose()
    }

    /// Every token, oldest first; revoked and expired ones only with `all`.
    pub async fn list_tokens(&self, all: bool) -> Result<Vec<TokenInfo>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {INFO_COLUMNS} FROM tokens t LEFT JOIN tokens c ON c.id = t.created_by
             WHERE $1 OR (t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > now()))
             ORDER BY t.id"
        )))
        .bind(all)
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(info).collect()
    }

    /// Revokes the token `id`; the token as it is now (None: there is no such token;
    /// `Conflict` when it is the only live admin token, whose loss would leave nobody able
    /// to manage tokens). A token revoked already keeps its first revocation time.
    pub async fn revoke_token(&self, id: i64) -> Result<Option<TokenInfo>> {
        let mut tx = self.pool().begin().await?;
        // The live admin tokens, locked: two revocations at once cannot both take the other
        // for the one that remains.
        let admins: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM tokens WHERE role = 'admin' AND revoked_at IS NULL
               AND (expires_at IS NULL OR expires_at > now())
             ORDER BY id FOR UPDATE",
        )
        .fetch_all(&mut *tx)
        .await?;
        if admins == [id] {
            return Err(crate::StoreError::Conflict(format!(
                "token {id} is the last live admin token, and nobody could manage tokens without it: create another admin token first"
            )));
        }
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "WITH t AS (
                 UPDATE tokens SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1
                 RETURNING *)
             SELECT {INFO_COLUMNS} FROM t LEFT JOIN tokens c ON c.id = t.created_by"
        )))
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        row.as_ref().map(info).transpose()
    }

    /// Whether any live token has this role (used to create the first admin token once).
    pub async fn has_token_with_role(&self, role: Role) -> Result<bool> {
        let found: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM tokens WHERE role = $1 AND revoked_at IS NULL
                            AND (expires_at IS NULL OR expires_at > now()))",
        )
        .bind(role.as_str())
        .fetch_one(self.pool())
        .await?;
        Ok(found)
    }
}
