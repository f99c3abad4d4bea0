//! One task from start to end: stage the source, run the command as a process group, ship
//! its output, obey stop orders, upload outputs, report the exit code.

use crate::process::{STOP_GRACE, exit_code, signal_group};
use crate::shipper::{ShipEnd, Shipper, split_long_line};
use client::Client;
use nix::sys::signal::Signal;
use protocol::{Assignment, CompleteRequest, ErrorCode, StopWhy, Stream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::{mpsc, watch};

/// Lines waiting to be shipped per task; when full, reading the pipes pauses, which pauses
/// the process on its next write: back-pressure instead of dropped lines.
const LINE_BUFFER: usize = 10_000;

/// After the main process exits, how long its pipes may stay open (held by a straggler)
/// before we stop reading them.
const PIPE_DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Everything a task needs from the agent.
pub struct TaskContext {
    pub client: Client,
    pub worker: i64,
    pub worker_name: String,
    pub assignment: Assignment,
    pub work_root: PathBuf,
    pub keep_work_dirs: bool,
    /// What this worker advertised (device UUIDs for `CUDA_VISIBLE_DEVICES`).
    pub inventory: std::sync::Arc<domain::Inventory>,
    /// Set by the agent when the server orders this task stopped.
    pub stop: watch::Receiver<Option<StopWhy>>,
}

/// How the task ended, for the agent's bookkeeping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskEnd {
    Reported,
    LeaseLost,
}

pub async fn run_task(mut ctx: TaskContext) -> TaskEnd {
    let a = &ctx.assignment;
    let (job, task, attempt) = (a.job.0, a.task.0, a.attempt.0);
    let dir = ctx
        .work_root
        .join("jobs")
        .join(format!("job-{job}-task-{task}-attempt-{attempt}"));
    let src = dir.join("src");
    let output_dir = dir.join("output");

    let (lines_tx, lines_rx) = mpsc::channel::<(Stream, String)>(LINE_BUFFER);
    let shipper = Shipper {
        client: ctx.client.clone(),
        worker: ctx.worker,
        task,
        attempt,
    };
    let shipping = tokio::spawn(shipper.run(lines_rx));

    let outcome = execute(&mut ctx, &dir, &src, &output_dir, lines_tx).await;
    let shipped = shipping.await.unwrap_or(ShipEnd::LeaseLost);
    let stopped = *ctx.stop.borrow();
    // A task stopped because its lease is gone, or because this worker is leaving, is not
    // reported: the server requeues it (or has already).
    let lease_lost = shipped == ShipEnd::LeaseLost
        || matches!(stopped, Some(StopWhy::LeaseLost | StopWhy::WorkerShutdown));

    let end = if lease_lost {
        TaskEnd::LeaseLost
    } else {
        let mut report = match outcome {
            Ok(code) => CompleteRequest {
                exit_code: Some(code),
                error: None,
            },
            Err(error) => CompleteRequest {
                exit_code: None,
                error: Some(error),
            },
        };
        if report.error.is_none()
            && let Err(e) = upload_outputs(&ctx, &src, &output_dir, &dir).await
        {
            report.error = Some(format!("uploading outputs failed: {e}"));
        }
        report_completion(&ctx, &report).await
    };
    if !ctx.keep_work_dirs {
        let _ = tokio::fs::remove_dir_all(&dir).await;
    }
    end
}

async fn report_completion(ctx: &TaskContext, report: &CompleteRequest) -> TaskEnd {
    let a = &ctx.assignment;
    let mut backoff = Duration::from_millis(200);
    loop {
        match ctx
            .client
            .complete_task(ctx.worker, a.task.0, a.attempt.0, report)
            .await
        {
            Ok(()) => return TaskEnd::Reported,
            Err(e) if matches!(e.code(), Some(ErrorCode::LeaseLost | ErrorCode::WorkerLost)) => {
                return TaskEnd::LeaseLost;
            }
            Err(e) => {
                // The result must reach the server: keep trying while it is away.
                tracing::warn!(error = %e, task = a.task.0, "reporting completion failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Stages, runs and waits. Ok(exit code) when the process ran; Err(reason) when it could not.
async fn execute(
    ctx: &mut TaskContext,
    dir: &Path,
    src: &Path,
    output_dir: &Path,
    lines: mpsc::Sender<(Stream, String)>,
) -> Result<i32, String> {
    let a = ctx.assignment.clone();
    let system = |text: String| {
        let lines = lines.clone();
        async move {
            let _ = lines.send((Stream::System, text)).await;
        }
    };
    for d in [src, output_dir] {
        tokio::fs::create_dir_all(d).await.map_err(|e| {
            format!(
                "cannot create {} on worker {}: {e}",
                d.display(),
                ctx.worker_name
            )
        })?;
    }
    if let Some(source) = &a.spec.source {
        system(format!(
            "staging source {} ({} files, {} bytes) on worker {}",
            source.digest.short(),
            source.files,
            source.bytes,
            ctx.worker_name
        ))
        .await;
        stage_source(ctx, source.digest.as_str(), dir, src)
            .await
            .map_err(|e| format!("staging the source failed: {e}"))?;
    }

    let program = resolve_program(a.spec.command.program(), src);
    let mut cmd = tokio::process::Command::new(&program);
    cmd.args(a.spec.command.args())
        .current_dir(src)
        .env("PYTHONUNBUFFERED", "1")
        .envs(a.spec.env.iter().map(|e| (e.name(), e.value())))
        .env("GPULAYER_JOB_ID", a.job.to_string())
        .env("GPULAYER_TASK_ID", a.task.to_string())
        .env("GPULAYER_ATTEMPT", a.attempt.to_string())
        .env("GPULAYER_OUTPUT_DIR", output_dir)
        .envs(device_env(&a, &ctx.inventory))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    die_with_worker(&mut cmd);
    let mut child = cmd.spawn().map_err(|e| {
        format!(
            "cannot start `{}` on worker {}: {e}",
            a.spec.command.program(),
            ctx.worker_name
        )
    })?;
    let pid = child.id().expect("a just-spawned child has a pid");

    if let Err(e) = ctx
        .client
        .task_started(ctx.worker, a.task.0, a.attempt.0)
        .await
    {
        signal_group(pid, Signal::SIGKILL);
        let _ = child.wait().await;
        return Err(format!("the server refused the start: {e}"));
    }

    let out = tokio::spawn(pump(
        child.stdout.take().expect("piped"),
        Stream::Stdout,
        lines.clone(),
    ));
    let err = tokio::spawn(pump(
        child.stderr.take().expect("piped"),
        Stream::Stderr,
        lines.clone(),
    ));

    let limit = a.spec.timeout_seconds.map(Duration::from_secs);
    let over_time = async {
        match limit {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    let mut timed_out = false;
    let status = tokio::select! {
        status = child.wait() => status,
        () = stop_ordered(&mut ctx.stop) => stop_group(pid, &mut child).await,
        () = over_time => {
            timed_out = true;
            stop_group(pid, &mut child).await
        }
    };
    // Whatever the leader left behind in its group goes with it: the job is over.
    signal_group(pid, Signal::SIGKILL);
    for pump in [out, err] {
        let _ = tokio::time::timeout(PIPE_DRAIN_TIMEOUT, pump).await;
    }
    if timed_out {
        let secs = limit.map(|t| t.as_secs()).unwrap_or_default();
        let why = format!("timed out after {secs} s (--timeout {secs})");
        system(format!("stopped: {why}")).await;
        return Err(why);
    }
    let status = status.map_err(|e| format!("waiting for the process failed: {e}"))?;
    let code = exit_code(status);
    let stopped = *ctx.stop.borrow();
    if let Some(why) = stopped {
        let what = match why {
            StopWhy::Cancelled => "the job was cancelled",
            StopWhy::LeaseLost => "the job is no longer this worker's",
            StopWhy::WorkerShutdown => {
                "the worker is shutting down; the job goes back to the queue"
            }
        };
        system(format!("stopped: {what} (exit code {code})")).await;
    }
    Ok(code)
}

/// The variables that confine a job to its reserved devices. A cuda job sees only its GPUs
/// (by UUID when known, which does not depend on enumeration order); a cpu job sees none; a
/// job that asked for `any` is left as it is.
fn device_env(a: &Assignment, inventory: &domain::Inventory) -> Vec<(&'static str, String)> {
    use domain::Accelerator;
    match a.spec.accelerator {
        Accelerator::Cuda => {
            let ids: Vec<String> = a
                .devices
                .iter()
                .map(|&i| {
                    inventory
                        .devices
                        .iter()
                        .find(|d| d.kind == Accelerator::Cuda && d.index == i)
                        .and_then(|d| d.uuid.clone())
                        .unwrap_or_else(|| i.to_string())
                })
                .collect();
            vec![
                ("CUDA_DEVICE_ORDER", "PCI_BUS_ID".to_string()),
                ("CUDA_VISIBLE_DEVICES", ids.join(",")),
                (
                    "GPULAYER_DEVICES",
                    a.devices
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(","),
                ),
            ]
        }
        Accelerator::Cpu => vec![("CUDA_VISIBLE_DEVICES", String::new())],
        Accelerator::Mps | Accelerator::Any => vec![],
    }
}

/// Makes the job's leader die with the worker: a worker killed outright (`kill -9`, OOM)
/// cannot stop its jobs, and its tasks are run again elsewhere, so a survivor would be the
/// same work twice. (Its grandchildren are not reached by this; cgroups would.)
#[allow(unsafe_code)]
fn die_with_worker(cmd: &mut tokio::process::Command) {
    let worker = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec and calls only prctl(2) and
    // getppid(2), both async-signal-safe; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
            // The worker may have died between fork and prctl: then nobody will send it.
            if nix::unistd::getppid() != worker {
                return Err(std::io::Error::other(
                    "the worker exited before the job started",
                ));
            }
            Ok(())
        });
    }
}

/// SIGTERM to the whole group, then SIGKILL if it is still there after the grace period.
async fn stop_group(
    pid: u32,
    child: &mut tokio::process::Child,
) -> std::io::Result<std::process::ExitStatus> {
    signal_group(pid, Signal::SIGTERM);
    match tokio::time::timeout(STOP_GRACE, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            signal_group(pid, Signal::SIGKILL);
            child.wait().await
        }
    }
}

/// Resolves once a stop order arrives (never, if the agent is gone without ordering one).
async fn stop_ordered(stop: &mut watch::Receiver<Option<StopWhy>>) {
    if stop.wait_for(|s| s.is_some()).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// A relative program path with a slash (`./render.sh`) means a file in the source.
fn resolve_program(program: &str, src: &Path) -> PathBuf {
    let p = Path::new(program);
    if p.is_relative() && program.contains('/') {
        src.join(p)
    } else {
        p.to_path_buf()
    }
}

/// Reads a pipe line by line (lossy UTF-8) into the shipper.
async fn pump(pipe: impl AsyncRead + Unpin, stream: Stream, lines: mpsc::Sender<(Stream, String)>) {
    let mut reader = BufReader::new(pipe);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                if buf.last() == Some(&b'\n') {
                    buf.pop();
                    if buf.last() == Some(&b'\r') {
                        buf.pop();
                    }
                }
                for piece in split_long_line(&String::from_utf8_lossy(&buf)) {
                    if lines.send((stream, piece)).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Downloads the source blob into the worker's cache (once per digest) and unpacks it.
async fn stage_source(
    ctx: &TaskContext,
    digest: &str,
    dir: &Path,
    src: &Path,
) -> Result<(), String> {
    let cache = ctx.work_root.join("cache");
    tokio::fs::create_dir_all(&cache)
        .await
        .map_err(|e| e.to_string())?;
    let cached = cache.join(format!("{digest}.tar.gz"));
    if !cached.exists() {
        let partial = dir.join("source.tar.gz.partial");
        ctx.client
            .download_blob(digest, &partial)
            .await
            .map_err(|e| e.to_string())?;
        let check = partial.clone();
        let actual = tokio::task::spawn_blocking(move || {
            std::fs::File::open(&check).and_then(archive::sha256_hex)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
        if actual != digest {
            return Err(format!(
                "the downloaded source hashes to {actual}, not {digest}"
            ));
        }
        tokio::fs::rename(&partial, &cached)
            .await
            .map_err(|e| e.to_string())?;
    }
    let (from, to) = (cached.clone(), src.to_path_buf());
    tokio::task::spawn_blocking(move || {
        let file = std::fs::File::open(&from)?;
        archive::unpack(std::io::BufReader::new(file), &to).map_err(std::io::Error::other)
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())?;
    Ok(())
}

/// Packs the output dir and the `--output` globs and uploads them.
async fn upload_outputs(
    ctx: &TaskContext,
    src: &Path,
    output_dir: &Path,
    dir: &Path,
) -> Result<(), String> {
    let a = &ctx.assignment;
    let globs: Vec<String> = a
        .spec
        .outputs
        .iter()
        .map(|g| g.as_str().to_string())
        .collect();
    let packed = dir.join("outputs.tar.gz");
    // Most jobs bring nothing back: no globs and an empty output dir need no walk at all.
    let output_dir_empty = std::fs::read_dir(output_dir)
        .map(|mut d| d.next().is_none())
        .unwrap_or(true);
    if globs.is_empty() && output_dir_empty {
        return Ok(());
    }
    let (out_dir, work, target) = (output_dir.to_path_buf(), src.to_path_buf(), packed.clone());
    let any = tokio::task::spawn_blocking(move || -> Result<bool, String> {
        let files = archive::collect_outputs(&out_dir, &work, &globs).map_err(|e| e.to_string())?;
        if files.is_empty() {
            return Ok(false);
        }
        let file = std::fs::File::create(&target).map_err(|e| e.to_string())?;
        archive::pack_files(&files, std::io::BufWriter::new(file)).map_err(|e| e.to_string())?;
        Ok(true)
    })
    .await
    .map_err(|e| e.to_string())??;
    // Nothing to bring back: no upload (the server answers a download with an empty archive).
    if !any {
        return Ok(());
    }
    ctx.client
        .upload_outputs(ctx.worker, a.task.0, a.attempt.0, &packed)
        .await
        .map_err(|e| e.to_string())
}
