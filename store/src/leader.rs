//! Leader election with a session advisory lock on a dedicated connection.
//!
//! Exactly one API replica holds the lock and runs the sweeps (rescue of lost workers). The
//! lock belongs to the connection: if the leader dies or its connection drops, PostgreSQL
//! releases it and another replica takes over on its next try. The leader checks the
//! connection before each sweep and steps down when it is gone.

use crate::{Result, Store};
use sqlx::{Connection, PgConnection};

/// The advisory lock key for leadership ("GPUL" in ASCII), chosen to stay clear of the
/// migrator's own lock.
const LEADER_LOCK_KEY: i64 = 0x4750_554C;

#[derive(Debug)]
pub struct Leadership {
    conn: PgConnection,
}

impl Store {
    /// Tries once to become leader.
    pub async fn try_lead(&self) -> Result<Option<Leadership>> {
        let mut conn = PgConnection::connect_with(&self.options).await?;
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(LEADER_LOCK_KEY)
            .fetch_one(&mut conn)
            .await?;
        if got {
            Ok(Some(Leadership { conn }))
        } else {
            conn.close().await.ok();
            Ok(None)
        }
    }
}

impl Leadership {
    /// True while the lock's connection is alive (and so the lock still held).
    pub async fn still_held(&mut self) -> bool {
        self.conn.ping().await.is_ok()
    }

    /// Gives leadership up so another replica can take it at once.
    pub async fn resign(mut self) {
        let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(LEADER_LOCK_KEY)
            .execute(&mut self.conn)
            .await;
        let _ = self.conn.close().await;
    }
}
