//! Content-addressed blobs (packed sources) known to be in the object store.

use crate::{Result, Store};

impl Store {
    /// Records that the blob with this digest is stored (idempotent): a source archive the
    /// server checked (`archive`), or other data.
    pub async fn record_blob(&self, digest: &str, bytes: i64, archive: bool) -> Result<()> {
        sqlx::query(
            "INSERT INTO blobs (digest, bytes, archive) VALUES ($1, $2, $3)
             ON CONFLICT (digest) DO NOTHING",
        )
        .bind(digest)
        .bind(bytes)
        .bind(archive)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Whether the blob may be a job's source: None when it is not stored, Some(false) when
    /// it was stored as other data (a pickled function), not as a checked archive.
    pub async fn blob_is_source(&self, digest: &str) -> Result<Option<bool>> {
        let archive: Option<Option<bool>> =
            sqlx::query_scalar("SELECT archive FROM blobs WHERE digest = $1")
                .bind(digest)
                .fetch_optional(self.pool())
                .await?;
        Ok(archive.map(|a| a != Some(false)))
    }

    /// The size of a stored blob, if it is stored.
    pub async fn blob_size(&self, digest: &str) -> Result<Option<i64>> {
        Ok(
            sqlx::query_scalar("SELECT bytes FROM blobs WHERE digest = $1")
                .bind(digest)
                .fetch_optional(self.pool())
                .await?,
        )
    }
}
