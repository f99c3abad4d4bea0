//! Log lines: appended by workers in idempotent batches, read by clients with per-attempt
//! cursors so a follower never skips or repeats a line.

use crate::wakeups::{Channel, notify};
use crate::{Result, Store};
use chrono::{DateTime, Utc};
use sqlx::Row;

/// One stored line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredLine {
    pub task_id: i64,
    pub attempt: i32,
    pub seq: i64,
    pub stream: i16,
    pub text: String,
    pub at: DateTime<Utc>,
    /// The global rank of the process that printed it (multi-process jobs).
    pub rank: Option<i32>,
}

/// How far a reader has got in one attempt's lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LogCursor {
    pub task_id: i64,
    pub attempt: i32,
    pub seq: i64,
}

/// PostgreSQL text cannot hold NUL; a process may print one.
fn storable(text: &str) -> String {
    text.replace('\0', "\u{FFFD}")
}

impl Store {
    /// Appends lines for `(task, attempt)`; lines already stored (same seq) are skipped, so a
    /// retried batch is harmless. Lines from a worker that lost the task are refused.
    pub async fn append_logs(
        &self,
        worker_id: i64,
        task_id: i64,
        attempt: i32,
        lines: &[(i64, i16, String)],
    ) -> Result<()> {
        let ranked: Vec<(i64, i16, String, Option<i32>)> = lines
            .iter()
            .map(|(seq, stream, text)| (*seq, *stream, text.clone(), None))
            .collect();
        self.append_ranked_logs(worker_id, task_id, attempt, &ranked)
            .await
    }

    /// `append_logs` with each line's process rank (multi-process jobs).
    pub async fn append_ranked_logs(
        &self,
        worker_id: i64,
        task_id: i64,
        attempt: i32,
        lines: &[(i64, i16, String, Option<i32>)],
    ) -> Result<()> {
        let mut tx = self.begin().await?;
        let job_id = crate::queue::leased_job(&mut *tx, worker_id, task_id, attempt).await?;
        let seqs: Vec<i64> = lines.iter().map(|l| l.0).collect();
        let streams: Vec<i16> = lines.iter().map(|l| l.1).collect();
        let texts: Vec<String> = lines.iter().map(|l| storable(&l.2)).collect();
        let ranks: Vec<Option<i32>> = lines.iter().map(|l| l.3).collect();
        sqlx::query(
            "INSERT INTO logs (task_id, attempt, seq, job_id, stream, text, rank)
             SELECT $1, $2, l.seq, $3, l.stream, l.text, l.rank
             FROM unnest($4::bigint[], $5::smallint[], $6::text[], $7::int[]) AS l(seq, stream, text, rank)
             ON CONFLICT DO NOTHING",
        )
        .bind(task_id)
        .bind(attempt)
        .bind(job_id)
        .bind(&seqs)
        .bind(&streams)
        .bind(&texts)
        .bind(&ranks)
        .execute(&mut *tx)
        .await?;
        notify(&mut tx, Channel::Logs, Some(job_id)).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Lines of a job past the given cursors (attempts without a cursor from their start),
    /// in (task, attempt, seq) order; only those of process `rank` if given.
    pub async fn read_logs(
        &self,
        job_id: i64,
        after: &[LogCursor],
        limit: i64,
        rank: Option<i32>,
    ) -> Result<Vec<StoredLine>> {
        let tasks: Vec<i64> = after.iter().map(|c| c.task_id).collect();
        let attempts: Vec<i32> = after.iter().map(|c| c.attempt).collect();
        let seqs: Vec<i64> = after.iter().map(|c| c.seq).collect();
        let rows = sqlx::query(
            "SELECT l.task_id, l.attempt, l.seq, l.stream, l.text, l.at, l.rank
             FROM logs l
             LEFT JOIN unnest($2::bigint[], $3::int[], $4::bigint[]) AS c(task_id, attempt, seq)
               ON c.task_id = l.task_id AND c.attempt = l.attempt
             WHERE l.job_id = $1 AND l.seq > coalesce(c.seq, -1)
               AND ($6::int IS NULL OR l.rank = $6)
             ORDER BY l.task_id, l.attempt, l.seq
             LIMIT $5",
        )
        .bind(job_id)
        .bind(&tasks)
        .bind(&attempts)
        .bind(&seqs)
        .bind(limit)
        .bind(rank)
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().map(stored_line).collect())
    }

    /// One page of a job's lines in (task, attempt, seq) order, strictly after `after`; only
    /// those of process `rank` if given.
    pub async fn read_logs_after(
        &self,
        job_id: i64,
        after: Option<LogCursor>,
        limit: i64,
        rank: Option<i32>,
    ) -> Result<Vec<StoredLine>> {
        let c = after.unwrap_or(LogCursor {
            task_id: -1,
            attempt: -1,
            seq: -1,
        });
        let rows = sqlx::query(
            "SELECT task_id, attempt, seq, stream, text, at, rank FROM logs
             WHERE job_id = $1 AND (task_id, attempt, seq) > ($2, $3, $4)
               AND ($6::int IS NULL OR rank = $6)
             ORDER BY task_id, attempt, seq
             LIMIT $5",
        )
        .bind(job_id)
        .bind(c.task_id)
        .bind(c.attempt)
        .bind(c.seq)
        .bind(limit)
        .bind(rank)
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().map(stored_line).collect())
    }
}

fn stored_line(r: sqlx::postgres::PgRow) -> StoredLine {
    StoredLine {
        task_id: r.get("task_id"),
        attempt: r.get("attempt"),
        seq: r.get("seq"),
        stream: r.get("stream"),
        text: r.get("text"),
        at: r.get("at"),
        rank: r.get("rank"),
    }
}
