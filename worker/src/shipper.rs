//! Ships one task's output lines to the server in batches, in order, retrying until stored.
//!
//! Lines are numbered here (`seq`), so a batch retried after a lost answer is stored once.
//! A batch goes out when 100 ms have passed since its first line or when it holds 1,000
//! lines, whichever comes first: live enough to watch, few enough requests to scale.

use client::{Client, ClientError};
use protocol::{ErrorCode, LogAppend, LogBatch, Stream};
use std::time::Duration;
use tokio::sync::mpsc;

const BATCH_LINES: usize = 1000;

/// One line to ship: its stream, the rank of the process that printed it (multi-process
/// jobs), its text.
pub type Line = (Stream, Option<u32>, String);
const BATCH_DELAY: Duration = Duration::from_millis(100);
/// A line longer than this is split: one huge line must not become one huge row.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// How shipping ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShipEnd {
    /// Every line was stored.
    Done,
    /// The server said the task is no longer ours; the process must be killed.
    LeaseLost,
}

pub struct Shipper {
    pub client: Client,
    pub worker: i64,
    pub task: i64,
    pub attempt: i32,
}

impl Shipper {
    /// Consumes lines until every sender is dropped and everything is stored.
    pub async fn run(self, mut rx: mpsc::Receiver<Line>) -> ShipEnd {
        let mut seq: i64 = 0;
        let mut open = true;
        while open {
            let mut batch: Vec<LogAppend> = Vec::new();
            match rx.recv().await {
                Some(line) => push(&mut batch, &mut seq, line),
                None => break,
            }
            let deadline = tokio::time::Instant::now() + BATCH_DELAY;
            while batch.len() < BATCH_LINES {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(line)) => push(&mut batch, &mut seq, line),
                    Ok(None) => {
                        open = false;
                        break;
                    }
                    Err(_) => break,
                }
            }
            if self.send(LogBatch { lines: batch }).await == ShipEnd::LeaseLost {
                return ShipEnd::LeaseLost;
            }
        }
        ShipEnd::Done
    }

    async fn send(&self, batch: LogBatch) -> ShipEnd {
        let mut backoff = Duration::from_millis(200);
        loop {
            match self
                .client
                .append_logs(self.worker, self.task, self.attempt, &batch)
                .await
            {
                Ok(()) => return ShipEnd::Done,
                Err(e)
                    if e.code() == Some(ErrorCode::LeaseLost)
                        || e.code() == Some(ErrorCode::WorkerLost) =>
                {
                    return ShipEnd::LeaseLost;
                }
                Err(e) => {
                    log_retry(&e);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

fn log_retry(e: &ClientError) {
    tracing::warn!(error = %e, "storing log lines failed; retrying");
}

fn push(batch: &mut Vec<LogAppend>, seq: &mut i64, (stream, rank, text): Line) {
    batch.push(LogAppend {
        seq: *seq,
        stream,
        text,
        rank,
    });
    *seq += 1;
}

/// Splits `text` into pieces of at most `MAX_LINE_BYTES`, on character boundaries.
pub fn split_long_line(text: &str) -> Vec<String> {
    if text.len() <= MAX_LINE_BYTES {
        return vec![text.to_string()];
    }
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut cut = rest.len().min(MAX_LINE_BYTES);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        out.push(rest[..cut].to_string());
        rest = &rest[cut..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_split_on_character_boundaries() {
        let text = "é".repeat(MAX_LINE_BYTES); // two bytes each
        let parts = split_long_line(&text);
        assert_eq!(parts.len(), 2);
        assert!(parts.iter().all(|p| p.len() <= MAX_LINE_BYTES));
        assert_eq!(parts.concat(), text);
        assert_eq!(split_long_line("short"), vec!["short".to_string()]);
    }
}
