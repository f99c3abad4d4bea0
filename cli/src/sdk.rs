//! The CLI's client-side operations without their printing, for the Python package's native
//! module (`python/`): one place decides how flags become a job, how a source is shipped and
//! how outputs come back, whichever way in the user took.

use anyhow::{Context, Result, bail};
use clap::Parser;
use domain::{JobSpec, SourceRef};
use protocol::{JobView, LogLine, PlacementReport, SubmitRequest};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use client::{Client, ClientError};

/// A client for `url` with `token`, pinning the server's certificate `fingerprint`, each
/// defaulting as the CLI's do (environment, then the config file `gpulayer up` wrote).
pub fn connect(
    url: Option<&str>,
    token: Option<&str>,
    fingerprint: Option<&str>,
) -> Result<Client> {
    crate::settings::client_with(url, token, fingerprint)
}

/// The one-line message the CLI would print for `e`.
pub fn explain(e: &anyhow::Error) -> String {
    crate::settings::explain(e)
}

#[derive(Debug, Parser)]
#[command(name = "gpulayer submit", no_binary_name = true)]
struct SubmitLine {
    #[command(flatten)]
    args: crate::submit::SubmitArgs,
}

/// The job `gpulayer submit ARGS` would submit (no `--source`: see [`ship_source`]), checked
/// with the CLI's own messages.
pub fn spec_from_args(args: &[String]) -> Result<JobSpec> {
    let line = SubmitLine::try_parse_from(args).map_err(|e| {
        let text = e.render().to_string();
        let first = text
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("bad arguments");
        anyhow::anyhow!("{}", first.trim_start_matches("error: "))
    })?;
    if line.args.has_source() {
        bail!("give the source to ship_source, not as --source");
    }
    crate::submit::spec_from(&line.args)
}

/// Which workers could run `spec`, and why not the others. Nothing is stored.
pub async fn placement(client: &Client, spec: &JobSpec) -> Result<PlacementReport> {
    Ok(client
        .placement(&SubmitRequest { spec: spec.clone() })
        .await?)
}

/// Packs `dir` and uploads it unless the server has it already.
pub async fn ship_source(client: &Client, dir: &Path) -> Result<SourceRef> {
    crate::submit::check_source_dir(dir)?;
    crate::submit::ship_source(client, dir, false).await
}

/// Job `id` once it has ended, or None if it is still going after `timeout`.
pub async fn wait(client: &Client, id: i64, timeout: Option<Duration>) -> Result<Option<JobView>> {
    // A timeout too long to add is no timeout.
    let deadline = timeout.and_then(|t| tokio::time::Instant::now().checked_add(t));
    Ok(crate::jobs::wait_for_end(client, id, deadline).await?.ok())
}

/// Every line stored for job `id` so far (of process `rank` only, if given).
pub async fn stored_lines(client: &Client, id: i64, rank: Option<u32>) -> Result<Vec<LogLine>> {
    let mut lines = Vec::new();
    crate::logs::for_each_stored_line(client, id, rank, |l| lines.push(l.clone())).await?;
    Ok(lines)
}

/// Downloads job `id`'s outputs and unpacks them into `dest`: the bytes fetched and the
/// files written (relative to `dest`).
pub async fn download(client: &Client, id: i64, dest: &Path) -> Result<(u64, Vec<PathBuf>)> {
    crate::jobs::fetch_outputs(client, id, dest, &indicatif::ProgressBar::hidden())
        .await
        .with_context(|| format!("downloading job {id}'s outputs"))
}
