//! Printing log lines, and following them live until the job ends.

use anyhow::Result;
use clap::Args;
use protocol::{LogLine, LogStreamMessage, Stream};
use std::io::Write;

#[derive(Debug, Args)]
pub(crate) struct LogsArgs {
    /// The job id.
    job: String,
    /// Keep printing new lines until the job ends; exit with its exit code.
    #[arg(long, short)]
    follow: bool,
    /// One JSON object per line (JSON Lines).
    #[arg(long)]
    json: bool,
    /// Only the lines of this process of a multi-process job (its global rank, as RANK).
    #[arg(long, value_name = "R")]
    rank: Option<u32>,
}

/// stdout lines to stdout, stderr lines to stderr, GPUlayer's own lines to stderr marked.
pub(crate) fn print_line(line: &LogLine, json: bool) {
    if json {
        if let Ok(text) = serde_json::to_string(line) {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{text}");
            let _ = out.flush();
        }
        return;
    }
    // The lines of a multi-process job say whose they are.
    let rank = line
        .rank
        .map(|r| format!("[rank {r}] "))
        .unwrap_or_default();
    match line.stream {
        Stream::Stdout => {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{rank}{}", line.text);
            let _ = out.flush();
        }
        Stream::Stderr => eprintln!("{rank}{}", line.text),
        Stream::System => eprintln!("[gpulayer] {}", line.text),
    }
}

/// The exit code `wait` and `--follow` pass on: the job's own, 1 for a failure without one
/// (e.g. a lost worker), 130 for a cancelled job.
pub(crate) fn job_exit_code(end: &LogStreamMessage) -> u8 {
    match end {
        LogStreamMessage::End {
            state, exit_code, ..
        } => crate::jobs::exit_code_for(*state, *exit_code),
        LogStreamMessage::Line(_) => 1,
    }
}

/// Streams lines until the job ends and returns the end message; says why it ended on stderr
/// unless it succeeded.
pub(crate) async fn follow(
    client: &client::Client,
    job: i64,
    rank: Option<u32>,
    json: bool,
) -> Result<LogStreamMessage> {
    let end = client
        .follow_rank_logs(job, rank, |line| print_line(line, json))
        .await?;
    if let LogStreamMessage::End { state, reason, .. } = &end {
        if json {
            println!("{}", serde_json::to_string(&end)?);
        } else if *state != domain::JobState::Succeeded {
            let why = reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default();
            eprintln!("[gpulayer] job {job} {state}{why}");
        }
    }
    Ok(end)
}

pub(crate) async fn run(args: LogsArgs) -> Result<()> {
    let job = crate::jobs::parse_job(&args.job)?;
    let client = crate::settings::client()?;
    if args.follow {
        let end = follow(&client, job, args.rank, args.json).await?;
        let code = job_exit_code(&end);
        if code != 0 {
            return Err(crate::Exit(code).into());
        }
        return Ok(());
    }
    for_each_stored_line(&client, job, args.rank, |line| print_line(line, args.json)).await
}

/// Every line stored for job `id` so far (of process `rank` only, if given), page by page.
pub(crate) async fn for_each_stored_line(
    client: &client::Client,
    id: i64,
    rank: Option<u32>,
    mut each: impl FnMut(&protocol::LogLine),
) -> Result<()> {
    let mut after: Option<String> = None;
    loop {
        let page = client.logs_page(id, after.as_deref(), rank).await?;
        let Some(last) = page.lines.last() else {
            return Ok(());
        };
        after = Some(format!("{}:{}:{}", last.task, last.attempt, last.seq));
        page.lines.iter().for_each(&mut each);
    }
}
