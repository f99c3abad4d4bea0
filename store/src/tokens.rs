//! Bearer tokens. Only the sha256 of a secret is stored; the secret is shown once.

use crate::{Result, Store};
use sha2::{Digest, Sha256};
use sqlx::Row;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Everything.
    Admin,
    /// Submit, read and cancel jobs.
    Submitter,
    /// Read jobs, logs, outputs and workers.
    ReadOnly,
    /// Register a worker and act as one.
    Join,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Submitter => "submitter",
            Role::ReadOnly => "read_only",
            Role::Join => "join",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [Role::Admin, Role::Submitter, Role::ReadOnly, Role::Join]
            .into_iter()
            .find(|r| r.as_str() == s)
    }
}

#[derive(Debug, Clone)]
pub struct TokenRow {
    pub id: i64,
    pub name: String,
    pub role: Role,
}

fn secret_hash(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

impl Store {
    /// Stores a new token's hash; the caller generated and shows the secret.
    pub async fn insert_token(&self, name: &str, role: Role, secret: &str) -> Result<i64> {
        let id = sqlx::query_scalar(
            "INSERT INTO tokens (name, role, secret_sha256) VALUES ($1, $2, $3) RETURNING id",
        )
        .bind(name)
        .bind(role.as_str())
        .bind(secret_hash(secret))
        .fetch_one(self.pool())
        .await?;
        Ok(id)
    }

    /// The live token with this secret, if any.
    pub async fn find_token(&self, secret: &str) -> Result<Option<TokenRow>> {
        let row = sqlx::query(
            "SELECT id, name, role FROM tokens WHERE secret_sha256 = $1 AND revoked_at IS NULL",
        )
        .bind(secret_hash(secret))
        .fetch_optional(self.pool())
        .await?;
        row.map(|r| {
            let role: String = r.get("role");
            Ok(TokenRow {
                id: r.get("id"),
                name: r.get("name"),
                role: Role::parse(&role)
                    .ok_or_else(|| crate::StoreError::Corrupt(format!("token role '{role}'")))?,
            })
        })
        .transpose()
    }

    /// Whether any live token has this role (used to create the first admin token once).
    pub async fn has_token_with_role(&self, role: Role) -> Result<bool> {
        let found: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM tokens WHERE role = $1 AND revoked_at IS NULL)",
        )
        .bind(role.as_str())
        .fetch_one(self.pool())
        .await?;
        Ok(found)
    }
}
