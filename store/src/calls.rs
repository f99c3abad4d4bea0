//! What remote function calls returned or raised (`call_results`), read by their callers.

use crate::{Result, Store};

/// A finished call as its caller sees it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct CallResult {
    pub job_id: i64,
    /// The job's final state.
    pub state: String,
    /// Why it failed, when it did.
    pub reason: Option<String>,
    /// None when the call never reported (its worker was lost with no attempts left, it was
    /// cancelled, it timed out).
    pub ok: Option<bool>,
    pub payload: Option<String>,
    pub error: Option<serde_json::Value>,
    /// The call's stdout (1) and stderr (2) lines, in order: `[[stream, text], ...]`.
    pub lines: Option<serde_json::Value>,
}

impl Store {
    /// The calls among `job_ids` that have finished, with their outcomes and output lines.
    pub async fn call_results(&self, job_ids: &[i64]) -> Result<Vec<CallResult>> {
        Ok(sqlx::query_as(
            "SELECT j.id AS job_id, j.state, j.reason, r.ok, r.payload, r.error,
                    (SELECT json_agg(json_build_array(l.stream, l.text) ORDER BY l.task_id, l.attempt, l.seq)
                     FROM logs l WHERE l.job_id = j.id AND l.stream IN (1, 2)) AS lines
             FROM jobs j LEFT JOIN call_results r ON r.job_id = j.id
             WHERE j.id = ANY($1) AND j.state IN ('succeeded', 'failed', 'cancelled')",
        )
        .bind(job_ids)
        .fetch_all(self.pool())
        .await?)
    }
}
