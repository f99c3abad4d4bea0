//! `gpulayer submit`: pack the source (if any), upload it once per content digest, submit.

use crate::logs::{follow, job_exit_code};
use anyhow::{Context, Result, bail};
use clap::Args;
use domain::requirements::{parse_device_count, parse_memory};
use domain::{
    Accelerator, Command, Digest, EnvVar, FrameworkSpec, JobName, JobSpec, LabelSelector,
    OutputGlob, Requirements, SourceRef,
};
use indicatif::{ProgressBar, ProgressStyle};
use protocol::SubmitRequest;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub(crate) struct SubmitArgs {
    /// What the job needs: cpu, cuda, mps or any.
    #[arg(long, default_value = "any")]
    accelerator: String,
    /// A directory to ship; the command runs inside its unpacked copy. Honours .gitignore
    /// and .gpulayerignore.
    #[arg(long)]
    source: Option<PathBuf>,
    /// Files to bring back, as globs relative to the job's work directory (repeatable).
    /// Everything written to $GPULAYER_OUTPUT_DIR comes back too.
    #[arg(long = "output", value_name = "GLOB")]
    outputs: Vec<String>,
    /// An environment variable for the job, KEY=VALUE (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// A name to recognise the job by.
    #[arg(long)]
    name: Option<String>,
    /// How many devices of the accelerator kind each node needs [default: one per process
    /// for cuda/mps].
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    devices: Option<String>,
    /// Run on this many workers at once, all started together (a gang).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        allow_hyphen_values = true
    )]
    nodes: i64,
    /// Start this many processes on each node, with torchrun's environment (RANK,
    /// LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...) and their own devices.
    #[arg(
        long,
        value_name = "M",
        default_value_t = 1,
        allow_hyphen_values = true
    )]
    procs_per_node: i64,
    /// How far apart the nodes may be: zone (several zones of one region) or region (several
    /// regions too). Nodes are kept as close as the fleet allows either way.
    #[arg(long, value_name = "zone|region", default_value = "zone")]
    spread: String,
    /// Least memory each device must have, e.g. 40GiB.
    #[arg(long, value_name = "SIZE")]
    min_device_memory: Option<String>,
    /// A framework the job needs, with PEP 440 versions: 'jax>=0.4', 'torch>=2,<3' (repeatable).
    #[arg(long = "framework", value_name = "SPEC")]
    frameworks: Vec<String>,
    /// A label the worker must carry, KEY=VALUE (repeatable).
    #[arg(long = "where", value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// How many times to run the job again if its worker is lost [default: 3].
    #[arg(long, value_name = "N")]
    retries: Option<u32>,
    /// Also retry when the job itself fails (non-zero exit), up to --retries times.
    #[arg(long)]
    retry_failed: bool,
    /// Higher runs first; jobs of one priority run in submit order.
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    priority: i32,
    /// Stop and fail the job if one attempt runs longer than this many seconds.
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<u64>,
    /// Show which workers could run the job, and why not, without submitting it.
    #[arg(long)]
    dry_run: bool,
    /// Stream the job's logs and exit with its exit code.
    #[arg(long)]
    follow: bool,
    /// Submit every job in this file instead: one JSON job spec per line (as the REST API
    /// takes them; `accelerator` defaults to "any"). All or none.
    #[arg(long, value_name = "FILE.jsonl", conflicts_with_all = ["command", "source", "follow", "dry_run"])]
    batch: Option<PathBuf>,
    /// Print the job as JSON.
    #[arg(long)]
    json: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true)]
    command: Vec<String>,
}

impl SubmitArgs {
    pub(crate) fn has_source(&self) -> bool {
        self.source.is_some()
    }
}

/// Checks everything the user typed before anything is packed or sent.
pub(crate) fn spec_from(args: &SubmitArgs) -> Result<JobSpec> {
    let spec = JobSpec {
        name: args.name.as_deref().map(JobName::parse).transpose()?,
        command: Command::parse(args.command.clone())?,
        accelerator: args.accelerator.parse::<Accelerator>()?,
        source: None,
        outputs: args
            .outputs
            .iter()
            .map(|g| OutputGlob::parse(g))
            .collect::<Result<_, _>>()?,
        env: args
            .env
            .iter()
            .map(|e| EnvVar::parse(e))
            .collect::<Result<_, _>>()?,
        requirements: Requirements {
            devices: args
                .devices
                .as_deref()
                .map(parse_device_count)
                .transpose()?,
            min_device_memory_bytes: args
                .min_device_memory
                .as_deref()
                .map(parse_memory)
                .transpose()?,
            frameworks: args
                .frameworks
                .iter()
                .map(|f| FrameworkSpec::parse(f))
                .collect::<Result<_, _>>()?,
            labels: args
                .labels
                .iter()
                .map(|l| LabelSelector::parse(l))
                .collect::<Result<_, _>>()?,
        },
        retries: args.retries,
        retry_failed: args.retry_failed,
        priority: args.priority,
        timeout_seconds: args.timeout,
        layout: domain::Layout {
            nodes: count("--nodes", args.nodes)?,
            procs_per_node: count("--procs-per-node", args.procs_per_node)?,
            spread: domain::Spread::parse(&args.spread)?,
        },
        call: None,
    };
    spec.check()?;
    Ok(spec)
}

/// A count as typed; negative ones get the same message as zero.
fn count(flag: &str, n: i64) -> Result<u32> {
    u32::try_from(n).or_else(|_| bail!("{flag} must be at least 1, not {n}"))
}

/// Exit code of a submit that no worker could ever run (and of a dry run that finds none).
pub(crate) const EXIT_UNPLACEABLE: u8 = 3;

/// Prints a placement table (or its JSON) and returns the exit code it calls for.
pub(crate) fn print_placement(report: &protocol::PlacementReport, json: bool) -> Result<u8> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else if report.eligible_workers == 0 {
        eprintln!("{}", report.table);
    } else {
        println!("{}", report.table);
    }
    let none = report.eligible_workers == 0 && !report.verdicts.is_empty();
    Ok(if none { EXIT_UNPLACEABLE } else { 0 })
}

/// Reads a JSONL batch, checking every line before anything is sent.
fn read_batch(path: &Path) -> Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read --batch {}", path.display()))?;
    let mut jobs = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{} line {}", path.display(), n + 1);
        let mut value: serde_json::Value = serde_json::from_str(line).with_context(at)?;
        if let Some(obj) = value.as_object_mut() {
            obj.entry("accelerator").or_insert_with(|| "any".into());
        }
        let spec: JobSpec = serde_json::from_value(value.clone()).with_context(at)?;
        spec.check().with_context(at)?;
        jobs.push(value);
    }
    if jobs.is_empty() {
        bail!("--batch {} holds no jobs", path.display());
    }
    Ok(jobs)
}

async fn run_batch(path: &Path, json: bool) -> Result<()> {
    let jobs = read_batch(path)?;
    let client = crate::settings::client()?;
    let key = uuid::Uuid::new_v4().to_string();
    let mut ids = Vec::with_capacity(jobs.len());
    // Larger files go in several requests, each retried safely under its own key.
    for (n, chunk) in jobs.chunks(api::jobs::MAX_BATCH_JOBS).enumerate() {
        let req = protocol::BatchSubmitRequest {
            jobs: chunk.to_vec(),
        };
        match client.submit_batch(&req, &format!("{key}:{n}")).await {
            Ok(resp) => ids.extend(resp.ids.into_iter().map(|id| id.0)),
            Err(client::ClientError::Unplaceable(report)) => {
                print_placement(&report, json)?;
                return Err(crate::Exit(EXIT_UNPLACEABLE).into());
            }
            Err(e) => return Err(e.into()),
        }
    }
    if json {
        println!("{}", serde_json::json!({ "ids": ids }));
    } else {
        let (first, last) = (
            ids.first().copied().unwrap_or(0),
            ids.last().copied().unwrap_or(0),
        );
        println!("submitted {} job(s): ids {first} to {last}", ids.len());
    }
    Ok(())
}

pub(crate) async fn run(args: SubmitArgs) -> Result<()> {
    if let Some(path) = &args.batch {
        return run_batch(path, args.json).await;
    }
    let mut spec = spec_from(&args)?;
    if let Some(dir) = &args.source {
        check_source_dir(dir)?;
    }
    let client = crate::settings::client()?;
    if args.dry_run {
        let report = client.placement(&SubmitRequest { spec }).await?;
        let code = print_placement(&report, args.json)?;
        if code != 0 {
            return Err(crate::Exit(code).into());
        }
        return Ok(());
    }
    // Ask before packing and uploading a source nobody could run.
    let report = client
        .placement(&SubmitRequest { spec: spec.clone() })
        .await?;
    if report.eligible_workers == 0 && !report.verdicts.is_empty() {
        print_placement(&report, args.json)?;
        return Err(crate::Exit(EXIT_UNPLACEABLE).into());
    }
    let show_progress = std::io::stderr().is_terminal() && !args.json;
    if let Some(dir) = &args.source {
        spec.source = Some(ship_source(&client, dir, show_progress).await?);
    }
    let key = uuid::Uuid::new_v4().to_string();
    let job = match client.submit(&SubmitRequest { spec }, &key).await {
        Ok(job) => job,
        // A worker left between the check and the submit.
        Err(client::ClientError::Unplaceable(report)) => {
            print_placement(&report, args.json)?;
            return Err(crate::Exit(EXIT_UNPLACEABLE).into());
        }
        Err(e) => return Err(e.into()),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&job)?);
    } else if !args.follow {
        println!("submitted job {} ({})", job.id, job.state);
        println!("  follow its logs:  gpulayer logs {} --follow", job.id);
    } else {
        eprintln!("submitted job {} ({})", job.id, job.state);
    }
    if args.follow {
        let end = follow(&client, job.id.0, None, args.json).await?;
        let code = job_exit_code(&end);
        if code != 0 {
            return Err(crate::Exit(code).into());
        }
    }
    Ok(())
}

pub(crate) fn check_source_dir(dir: &Path) -> Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => bail!("--source {} is not a directory", dir.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("--source {} does not exist", dir.display())
        }
        Err(e) => bail!("cannot read --source {}: {e}", dir.display()),
    }
}

/// Packs `dir` into a temporary file and uploads it unless the server already has it.
pub(crate) async fn ship_source(
    client: &client::Client,
    dir: &Path,
    show_progress: bool,
) -> Result<SourceRef> {
    let packed =
        tempfile::NamedTempFile::new().context("cannot create a temporary file for the source")?;
    let bar = progress_bar(show_progress, "packing");
    let (dir_owned, file) = (
        dir.to_path_buf(),
        packed
            .reopen()
            .context("cannot reopen the temporary file")?,
    );
    let pack_bar = bar.clone();
    let summary = tokio::task::spawn_blocking(move || {
        archive::pack_dir(&dir_owned, std::io::BufWriter::new(file), |done, total| {
            pack_bar.set_length(total);
            pack_bar.set_position(done);
        })
    })
    .await
    .context("the packing task failed")??;
    bar.finish_and_clear();
    let digest = Digest::parse(&summary.digest)?;
    if !client.blob_exists(digest.as_str()).await? {
        let bar = progress_bar(show_progress, "uploading");
        bar.set_length(summary.bytes);
        let upload_bar = bar.clone();
        client
            .upload_blob(digest.as_str(), packed.path(), move |sent| {
                upload_bar.set_position(sent)
            })
            .await?;
        bar.finish_and_clear();
    }
    Ok(SourceRef {
        digest,
        bytes: summary.bytes,
        files: summary.files,
    })
}

fn progress_bar(visible: bool, what: &str) -> ProgressBar {
    if !visible {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{msg:>9} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: SubmitArgs,
    }

    fn parse(argv: &[&str]) -> Result<JobSpec> {
        let mut full = vec!["submit"];
        full.extend_from_slice(argv);
        spec_from(&Wrapper::try_parse_from(full).unwrap().args)
    }

    #[test]
    fn bad_input_is_refused_before_anything_is_sent() {
        let cases: &[(&[&str], &str)] = &[
            (&[], "no command given"),
            (
                &["--accelerator", "tpu", "--", "true"],
                "unknown accelerator 'tpu'",
            ),
            (&["--env", "NOPE", "--", "true"], "'NOPE' is not KEY=VALUE"),
            (
                &["--output", "/etc/passwd", "--", "true"],
                "must be a relative path",
            ),
        ];
        for (argv, expect) in cases {
            let err = parse(argv).unwrap_err().to_string();
            assert!(err.contains(expect), "{argv:?}: {err}");
        }
        let spec = parse(&[
            "--accelerator",
            "cuda",
            "--env",
            "A=1",
            "--",
            "python3",
            "-c",
            "print(1)",
        ])
        .unwrap();
        assert_eq!(spec.command.argv(), ["python3", "-c", "print(1)"]);
        assert_eq!(spec.accelerator, Accelerator::Cuda);
    }
}
