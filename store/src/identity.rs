//! The TLS certificate and key every API replica presents, shared through the database.

use crate::{Result, Store, StoreError};
use sqlx::Row;

/// A PEM certificate (chain) and its PEM private key.
#[derive(Clone)]
pub struct ServerCertificate {
    pub certificate_pem: String,
    pub private_key_pem: String,
}

impl std::fmt::Debug for ServerCertificate {
    // The key never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerCertificate")
            .field("certificate_pem", &self.certificate_pem)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// The certificate the replicas present, if one was kept.
    pub async fn server_certificate(&self) -> Result<Option<ServerCertificate>> {
        let row = sqlx::query(
            "SELECT certificate_pem, private_key_pem FROM server_certificate WHERE only_one",
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| ServerCertificate {
            certificate_pem: r.get(0),
            private_key_pem: r.get(1),
        }))
    }

    /// Keeps `made` as the replicas' certificate unless one is kept already, and returns
    /// the one kept: replicas starting at once all end up presenting the same.
    pub async fn keep_server_certificate(
        &self,
        made: &ServerCertificate,
    ) -> Result<ServerCertificate> {
        sqlx::query(
            "INSERT INTO server_certificate (certificate_pem, private_key_pem) VALUES ($1, $2)
             ON CONFLICT (only_one) DO NOTHING",
        )
        .bind(&made.certificate_pem)
        .bind(&made.private_key_pem)
        .execute(&self.pool)
        .await?;
        self.server_certificate().await?.ok_or_else(|| {
            StoreError::Corrupt("the server certificate vanished as it was kept".into())
        })
    }
}
