//! Content-addressed blobs (packed sources) known to be in the object store.

use crate::{Result, Store};

impl Store {
    /// Records that the blob with this digest is stored (idempotent).
    pub async fn record_blob(&self, digest: &str, bytes: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO blobs (digest, bytes) VALUES ($1, $2) ON CONFLICT (digest) DO NOTHING",
        )
        .bind(digest)
        .bind(bytes)
        .execute(self.pool())
        .await?;
        Ok(())
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
