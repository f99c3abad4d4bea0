//! Log lines, as stored in Postgres and streamed to clients.

use chrono::{DateTime, Utc};
use domain::{Attempt, JobState, TaskId};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Which stream a line came from; `system` lines are GPUlayer's own (staging, exit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
    System,
}

impl Stream {
    pub fn as_i16(self) -> i16 {
        match self {
            Stream::Stdout => 1,
            Stream::Stderr => 2,
            Stream::System => 3,
        }
    }
    pub fn from_i16(n: i16) -> Self {
        match n {
            1 => Stream::Stdout,
            2 => Stream::Stderr,
            _ => Stream::System,
        }
    }
}

/// One line of a job's output. `(task, attempt, seq)` identifies it; `seq` counts from 0
/// within one attempt.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct LogLine {
    #[schema(value_type = i64)]
    pub task: TaskId,
    #[schema(value_type = i32)]
    pub attempt: Attempt,
    pub seq: i64,
    pub stream: Stream,
    pub text: String,
    pub at: DateTime<Utc>,
    /// The global rank of the process that printed it, in a multi-process job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

/// `GET /v1/jobs/{id}/logs` response.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LogPage {
    pub lines: Vec<LogLine>,
    #[schema(value_type = String)]
    pub job_state: JobState,
}

/// A message on the log websocket (`GET /v1/jobs/{id}/logs/ws`), one JSON text frame each.
/// The server sends every stored line once, in order, then `end` once the job is finished
/// and its last line has been sent.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum LogStreamMessage {
    Line(LogLine),
    End {
        #[schema(value_type = String)]
        state: JobState,
        exit_code: Option<i32>,
        reason: Option<String>,
    },
}
