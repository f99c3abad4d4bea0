//! `jobs`, `status`, `wait`, `cancel`, `download`, `workers`.

use crate::table;
use anyhow::{Context, Result};
use clap::Args;
use domain::{JobId, JobState};
use protocol::JobView;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often `wait` re-reads the job's state.
const WAIT_POLL: Duration = Duration::from_millis(200);
const FIRST_WAIT_POLL: Duration = Duration::from_millis(5);

pub(crate) fn parse_job(raw: &str) -> Result<i64> {
    Ok(raw.parse::<JobId>()?.0)
}

/// The exit code for a finished job (see `logs::job_exit_code`).
pub(crate) fn exit_code_for(state: JobState, exit_code: Option<i32>) -> u8 {
    match state {
        JobState::Succeeded => 0,
        JobState::Cancelled => 130,
        _ => match exit_code {
            Some(c) if (1..=255).contains(&c) => c as u8,
            _ => 1,
        },
    }
}

#[derive(Debug, Args)]
pub(crate) struct JobArg {
    /// The job id.
    job: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct JobsArgs {
    /// Only jobs in this state (pending, assigned, running, succeeded, failed, cancelled).
    #[arg(long)]
    state: Option<String>,
    /// At most this many.
    #[arg(long, default_value_t = 20)]
    limit: u32,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn worker_name(job: &JobView) -> String {
    job.worker
        .as_ref()
        .map(|w| w.name.clone())
        .unwrap_or_else(|| "-".into())
}

fn runtime(job: &JobView) -> String {
    match (job.started_at, job.finished_at) {
        (Some(s), Some(f)) => table::duration((f - s).num_seconds()),
        (Some(s), None) => table::duration((chrono::Utc::now() - s).num_seconds()),
        _ => "-".into(),
    }
}

pub(crate) async fn list(args: JobsArgs) -> Result<()> {
    if let Some(s) = &args.state {
        s.parse::<JobState>().map_err(anyhow::Error::msg)?;
    }
    let client = crate::settings::client()?;
    let jobs = client.list_jobs(args.state.as_deref(), args.limit).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&jobs)?);
        return Ok(());
    }
    if jobs.jobs.is_empty() {
        println!("no jobs yet: gpulayer submit -- echo hello");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = jobs
        .jobs
        .iter()
        .map(|j| {
            vec![
                j.id.to_string(),
                j.name.clone().unwrap_or_else(|| "-".into()),
                j.state.to_string(),
                j.accelerator.to_string(),
                worker_name(j),
                table::ago(j.created_at),
                j.submitted_by.clone().unwrap_or_else(|| "-".into()),
                runtime(j),
                j.exit_code
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "-".into()),
                domain::Command::parse(j.command.clone())
                    .map(|c| c.to_string())
                    .unwrap_or_default(),
            ]
        })
        .collect();
    table::print(
        &[
            "ID",
            "NAME",
            "STATE",
            "ACCEL",
            "WORKER",
            "SUBMITTED",
            "BY",
            "RUNTIME",
            "EXIT",
            "COMMAND",
        ],
        &rows,
    );
    Ok(())
}

pub(crate) async fn status(args: JobArg) -> Result<()> {
    let id = parse_job(&args.job)?;
    let client = crate::settings::client()?;
    let job = client.job(id).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&job)?);
        return Ok(());
    }
    let command = domain::Command::parse(job.command.clone())
        .map(|c| c.to_string())
        .unwrap_or_default();
    let mut lines = vec![
        ("job", job.id.to_string()),
        ("name", job.name.clone().unwrap_or_else(|| "-".into())),
        ("state", job.state.to_string()),
        ("command", command),
        ("accelerator", job.accelerator.to_string()),
        ("worker", worker_name(&job)),
        ("attempt", job.attempt.to_string()),
        (
            "submitted",
            format!(
                "{} by {}",
                table::ago(job.created_at),
                job.submitted_by.as_deref().unwrap_or("-")
            ),
        ),
        ("runtime", runtime(&job)),
    ];
    if let Some(source) = &job.source {
        lines.push((
            "source",
            format!(
                "{} ({} files, {})",
                source.digest.short(),
                source.files,
                table::bytes(source.bytes)
            ),
        ));
    }
    if let Some(code) = job.exit_code {
        lines.push(("exit code", code.to_string()));
    }
    if let Some(reason) = &job.reason {
        lines.push(("reason", reason.clone()));
    }
    if let Some(b) = job.outputs_bytes {
        lines.push((
            "outputs",
            format!("{} (gpulayer download {})", table::bytes(b as u64), job.id),
        ));
    }
    if !job.devices.is_empty() {
        let d: Vec<String> = job
            .devices
            .iter()
            .map(|d| format!("{}:{d}", job.accelerator))
            .collect();
        lines.push(("devices", d.join(", ")));
    }
    for (k, v) in lines {
        println!("{:<12} {v}", format!("{k}:"));
    }
    if job.layout.nodes > 1 || job.layout.procs_per_node > 1 {
        println!(
            "{:<12} {} node(s) x {} process(es), spread {}",
            "layout:", job.layout.nodes, job.layout.procs_per_node, job.layout.spread
        );
    }
    if let Some(placed) = &job.placed {
        println!("{:<12} {placed}", "placed:");
    }
    for n in &job.nodes {
        let worker = n.worker.as_ref().map(|w| w.name.as_str()).unwrap_or("-");
        let why = n
            .reason
            .as_deref()
            .map(|r| format!("  {r}"))
            .unwrap_or_default();
        println!(
            "{:<12} {:<10} on {worker} (attempt {}){why}",
            format!("node {}:", n.node),
            n.state,
            n.attempt
        );
    }
    if let Some(waiting) = &job.waiting {
        println!(
            "waiting:     {}",
            waiting.table.replace('\n', "\n             ")
        );
    }
    Ok(())
}

#[derive(Debug, Args)]
pub(crate) struct WaitArgs {
    /// The job id.
    job: String,
    /// Give up after this many seconds (exit 124), like timeout(1).
    #[arg(long)]
    timeout: Option<u64>,
    /// Print the finished job as JSON.
    #[arg(long)]
    json: bool,
}

/// Job `id` once it has ended (Ok), or as it is at `deadline` (Err). Asks quickly at first (a
/// short job ends in milliseconds), then more gently.
pub(crate) async fn wait_for_end(
    client: &client::Client,
    id: i64,
    deadline: Option<tokio::time::Instant>,
) -> Result<std::result::Result<JobView, JobView>> {
    let mut pause = FIRST_WAIT_POLL;
    loop {
        let job = client.job(id).await?;
        if job.state.is_terminal() {
            return Ok(Ok(job));
        }
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            return Ok(Err(job));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(WAIT_POLL);
    }
}

pub(crate) async fn wait(args: WaitArgs) -> Result<()> {
    let id = parse_job(&args.job)?;
    let client = crate::settings::client()?;
    let deadline = args
        .timeout
        .map(|s| tokio::time::Instant::now() + Duration::from_secs(s));
    let job = match wait_for_end(&client, id, deadline).await? {
        Ok(job) => job,
        Err(job) => {
            eprintln!(
                "job {id} is still {} after {}s",
                job.state,
                args.timeout.unwrap_or_default()
            );
            return Err(crate::Exit(124).into());
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&job)?);
    } else {
        let why = job
            .reason
            .as_deref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        eprintln!("job {id} {}{why}", job.state);
    }
    let code = exit_code_for(job.state, job.exit_code);
    if code != 0 {
        return Err(crate::Exit(code).into());
    }
    Ok(())
}

pub(crate) async fn cancel(args: JobArg) -> Result<()> {
    let id = parse_job(&args.job)?;
    let client = crate::settings::client()?;
    let resp = client.cancel(id).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&resp)?);
    } else if resp.previous_state.is_terminal() {
        println!(
            "job {id} had already {}; nothing to cancel",
            resp.previous_state
        );
    } else {
        println!("cancelled job {id} (was {})", resp.previous_state);
    }
    Ok(())
}

#[derive(Debug, Args)]
pub(crate) struct DownloadArgs {
    /// The job id.
    job: String,
    /// Directory to unpack into [default: ./job-ID-outputs].
    dest: Option<PathBuf>,
    /// Print the downloaded files as JSON.
    #[arg(long)]
    json: bool,
}

/// Downloads job `id`'s outputs (showing progress on `bar`) and unpacks them into `dest`.
pub(crate) async fn fetch_outputs(
    client: &client::Client,
    id: i64,
    dest: &Path,
    bar: &indicatif::ProgressBar,
) -> Result<(u64, Vec<PathBuf>)> {
    let tmp = tempfile::NamedTempFile::new().context("cannot create a temporary file")?;
    let bytes = client
        .download_outputs(id, tmp.path(), |done, total| {
            if let Some(t) = total {
                bar.set_length(t);
            }
            bar.set_position(done);
        })
        .await?;
    bar.finish_and_clear();
    let (from, to) = (tmp.path().to_path_buf(), dest.to_path_buf());
    let files = tokio::task::spawn_blocking(move || {
        let f = std::fs::File::open(&from)?;
        archive::unpack(std::io::BufReader::new(f), &to).map_err(std::io::Error::other)
    })
    .await
    .context("the unpack task failed")?
    .with_context(|| format!("cannot unpack the outputs into {}", dest.display()))?;
    Ok((bytes, files))
}

pub(crate) async fn download(args: DownloadArgs) -> Result<()> {
    let id = parse_job(&args.job)?;
    let client = crate::settings::client()?;
    let dest = args
        .dest
        .unwrap_or_else(|| PathBuf::from(format!("job-{id}-outputs")));
    let bar = if std::io::stderr().is_terminal() && !args.json {
        indicatif::ProgressBar::new(0)
    } else {
        indicatif::ProgressBar::hidden()
    };
    let (bytes, files) = fetch_outputs(&client, id, &dest, &bar).await?;
    if args.json {
        let out = serde_json::json!({
            "job": id,
            "dest": dest,
            "bytes": bytes,
            "files": files,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else if files.is_empty() {
        println!("job {id} produced no output files");
    } else {
        for f in &files {
            println!("{}", dest.join(f).display());
        }
        eprintln!(
            "{} file(s) from job {id} in {}",
            files.len(),
            dest.display()
        );
    }
    Ok(())
}

#[derive(Debug, Args)]
pub(crate) struct WorkersArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// The workers, for a listing; None when nothing is left to print (`--json` printed them, or
/// there are none and the way to add one was said).
pub(crate) async fn worker_list(json: bool) -> Result<Option<protocol::WorkerList>> {
    let client = crate::settings::client()?;
    let list = client.workers().await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(None);
    }
    if list.workers.is_empty() {
        println!("no workers yet: run the `gpulayer join ...` line that `gpulayer up` printed");
        return Ok(None);
    }
    Ok(Some(list))
}

pub(crate) async fn workers(args: WorkersArgs) -> Result<()> {
    let Some(list) = worker_list(args.json).await? else {
        return Ok(());
    };
    let rows: Vec<Vec<String>> = list
        .workers
        .iter()
        .map(|w| {
            let devices = if w.inventory.devices.is_empty() {
                "cpu".to_string()
            } else {
                w.inventory
                    .devices
                    .iter()
                    .map(|d| format!("{}:{} {}", d.kind, d.index, d.name))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            vec![
                w.id.to_string(),
                w.name.clone(),
                w.state.clone(),
                format!("{}/{}", w.busy_slots, w.slots),
                format!(
                    "{} cpus, {}",
                    w.inventory.cpus,
                    table::bytes(w.inventory.memory_bytes)
                ),
                w.last_seen.map(table::ago).unwrap_or_else(|| "-".into()),
                devices,
            ]
        })
        .collect();
    table::print(
        &["ID", "NAME", "STATE", "BUSY", "HOST", "SEEN", "DEVICES"],
        &rows,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_pass_on_the_jobs_own() {
        let cases = [
            (JobState::Succeeded, Some(0), 0),
            (JobState::Failed, Some(3), 3),
            (JobState::Failed, Some(137), 137),
            (JobState::Failed, None, 1),
            (JobState::Failed, Some(-1), 1),
            (JobState::Cancelled, Some(143), 130),
        ];
        for (state, code, expect) in cases {
            assert_eq!(exit_code_for(state, code), expect, "{state} {code:?}");
        }
    }
}
