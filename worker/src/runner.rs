//! One task from start to end: stage the source, run the command as a process group, ship
//! its output, obey stop orders, upload outputs, report the exit code.
//!
//! A task runs in its slot's work directory, which outlives it: the next task of the slot
//! finds it emptied. Making and removing a directory per task was the worker's largest cost
//! on short jobs (ext4 searches for an inode not recently freed on every mkdir under churn).

use crate::launch::Finish;
use crate::reports::{Ending, Reports};
use crate::sentinel::Sentinel;
use crate::shipper::{Line, ShipEnd, Shipper};
use client::Client;
use protocol::{Assignment, StopWhy, Stream, TaskLease};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// Lines waiting to be shipped per task; when full, reading the pipes pauses, which pauses
/// the process on its next write: back-pressure instead of dropped lines.
const LINE_BUFFER: usize = 10_000;

/// Where a task runs: `dir` holds `src` (its working directory) and `output`.
#[derive(Debug, Clone)]
pub struct WorkDir {
    pub dir: PathBuf,
    /// Kept as the task left it (for debugging), rather than emptied for the next task.
    pub keep: bool,
}

/// Everything a task needs from the agent.
pub struct TaskContext {
    pub client: Client,
    pub worker: i64,
    pub worker_name: String,
    pub assignment: Assignment,
    /// The worker's work root (the source cache lives there).
    pub work_root: PathBuf,
    pub work_dir: WorkDir,
    /// Where the task's start and end are reported.
    pub reports: Arc<Reports>,
    /// What this worker advertised (device UUIDs for `CUDA_VISIBLE_DEVICES`).
    pub inventory: std::sync::Arc<domain::Inventory>,
    /// Set by the agent when the server orders this task stopped.
    pub stop: watch::Receiver<Option<StopWhy>>,
    /// Kills the task's process group if the worker dies first (None: it could not start).
    pub sentinel: Option<Arc<Sentinel>>,
    /// The address other nodes reach this worker at (node 0 of a multi-node job gives it as
    /// the rendezvous); None: the one on the route to the server.
    pub advertise_addr: Option<String>,
    /// The interpreter remote function calls, and jobs whose program is a bare `python` or
    /// `python3`, run with.
    pub python: String,
    /// The slots' warm Python runners.
    pub runners: Arc<crate::calls::Runners>,
}

impl TaskContext {
    /// Records that the task's process (or call) started now, for the next poll.
    pub(crate) fn report_started(&self, started: &mut Option<Instant>) {
        let now = Instant::now();
        *started = Some(now);
        let a = &self.assignment;
        self.reports.started(
            TaskLease {
                task: a.task,
                attempt: a.attempt,
            },
            now,
        );
    }
}

/// How the task ended, for the agent's bookkeeping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskEnd {
    Reported,
    LeaseLost,
}

pub async fn run_task(mut ctx: TaskContext) -> TaskEnd {
    let a = &ctx.assignment;
    let lease = TaskLease {
        task: a.task,
        attempt: a.attempt,
    };
    let (task, attempt) = (a.task.0, a.attempt.0);
    let dir = ctx.work_dir.dir.clone();
    let src = dir.join("src");
    let output_dir = dir.join("output");

    let (lines_tx, lines_rx) = mpsc::channel::<Line>(LINE_BUFFER);
    let shipper = Shipper {
        client: ctx.client.clone(),
        worker: ctx.worker,
        task,
        attempt,
    };
    let shipping = tokio::spawn(shipper.run(lines_rx));

    let mut started = None;
    let outcome = if ctx.assignment.spec.call.is_some() {
        let prepared = std::fs::create_dir_all(&src)
            .and_then(|()| std::fs::create_dir_all(&output_dir))
            .map_err(|e| format!("cannot create {}: {e}", dir.display()));
        match prepared {
            Ok(()) => crate::calls::execute(&mut ctx, &src, &lines_tx, &mut started).await,
            Err(e) => Err(e),
        }
    } else {
        execute(&mut ctx, &src, &output_dir, lines_tx.clone(), &mut started)
            .await
            .map(|(code, failed)| (code, failed, None))
    };
    drop(lines_tx);
    let shipped = shipping.await.unwrap_or(ShipEnd::LeaseLost);
    let stopped = *ctx.stop.borrow();
    // A task stopped because its lease is gone, or because this worker is leaving, is not
    // reported: the server requeues it (or has already).
    let lease_lost = shipped == ShipEnd::LeaseLost
        || matches!(stopped, Some(StopWhy::LeaseLost | StopWhy::WorkerShutdown));

    let end = if lease_lost {
        TaskEnd::LeaseLost
    } else {
        let mut ending = match outcome {
            Ok((code, failed, call)) => Ending {
                exit_code: Some(code),
                error: failed,
                started,
                call,
            },
            Err(error) => Ending {
                exit_code: None,
                error: Some(error),
                started,
                call: None,
            },
        };
        if ending.error.is_none()
            && let Err(e) = upload_outputs(&ctx, &src, &output_dir, &dir).await
        {
            ending.error = Some(format!("uploading outputs failed: {e}"));
        }
        // Reported only now, after the last log line and the outputs were stored.
        ctx.reports.finished(lease, ending);
        TaskEnd::Reported
    };
    if !ctx.work_dir.keep {
        empty_work_dir(&dir).await;
    }
    end
}

/// Empties a slot's work directory for its next task, keeping `src` and `output` themselves.
/// Checking costs three directory reads; only what a task left behind is removed, off the
/// worker's event loop.
async fn empty_work_dir(dir: &Path) {
    let leftovers = leftovers(dir);
    if leftovers.is_empty() {
        return;
    }
    let _ = tokio::task::spawn_blocking(move || {
        for path in leftovers {
            let removed = if path.is_dir() && !path.is_symlink() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            if let Err(e) = removed {
                tracing::warn!(path = %path.display(), error = %e, "cannot clean the work directory");
            }
        }
    })
    .await;
}

/// What a task left in `dir`: everything inside `src` and `output`. (The worker's own files
/// beside them, a source being downloaded and packed outputs, are removed once used.)
fn leftovers(dir: &Path) -> Vec<PathBuf> {
    ["src", "output"]
        .into_iter()
        .flat_map(|d| {
            std::fs::read_dir(dir.join(d))
                .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
                .unwrap_or_else(|_| Vec::new())
        })
        .collect()
}

/// Stages, runs and waits. Ok(exit code) when the process ran; Err(reason) when it could not.
/// Ok((exit code, which rank failed first in a distributed job)) when the processes ran;
/// Err(reason) when they could not.
async fn execute(
    ctx: &mut TaskContext,
    src: &Path,
    output_dir: &Path,
    lines: mpsc::Sender<Line>,
    started: &mut Option<Instant>,
) -> Result<(i32, Option<String>), String> {
    let a = ctx.assignment.clone();
    let system = |text: String| {
        let lines = lines.clone();
        async move {
            let _ = lines.send((Stream::System, None, text)).await;
        }
    };
    // Usually there already (a slot's directories outlive its tasks): a lookup, not a mkdir.
    for d in [src, output_dir] {
        std::fs::create_dir_all(d).map_err(|e| {
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
        stage_source(ctx, source.digest.as_str(), &ctx.work_dir.dir, src)
            .await
            .map_err(|e| format!("staging the source failed: {e}"))?;
    }

    let job_path = a
        .spec
        .env
        .iter()
        .find(|e| e.name() == "PATH")
        .map(|e| std::ffi::OsString::from(e.value()));
    let given = a.spec.command.program();
    let program = job_program(given, &ctx.python, job_path.is_some());
    let search = job_path.or_else(|| std::env::var_os("PATH"));
    let resolved = resolve_program(program, src, search.as_deref());
    let arg0 = if program == given {
        given.to_string()
    } else {
        resolved.to_string_lossy().into_owned()
    };
    let program = resolved;
    let distributed = a.spec.layout.is_distributed();
    let meeting = if distributed {
        let met = crate::launch::meet(
            &ctx.client,
            ctx.worker,
            &a,
            ctx.advertise_addr.as_deref(),
            &mut ctx.stop,
        )
        .await?;
        match met {
            Some(m) => Some(m),
            // Stopped while waiting for node 0: nothing ran.
            None => return Err("stopped before it started".into()),
        }
    } else {
        None
    };
    let launch = crate::launch::Launch {
        spec: &a.spec,
        assignment: &a,
        program,
        arg0,
        src,
        output_dir,
        inventory: &ctx.inventory,
        meeting,
    };
    let group = launch.start(&lines).map_err(|e| {
        format!(
            "cannot start `{}` on worker {}: {e}",
            a.spec.command.program(),
            ctx.worker_name
        )
    })?;
    let pgid = group.pgid;
    if let Some(sentinel) = &ctx.sentinel {
        sentinel.watch(pgid);
    }
    // Reported with the next poll; if the task is no longer ours, that poll's stop orders
    // say so and the group is killed.
    ctx.report_started(started);
    let limit = a.spec.timeout_seconds.map(Duration::from_secs);
    let first_rank = distributed.then(|| a.node * a.spec.layout.procs_per_node);
    let finish = group.wait(&mut ctx.stop, limit, first_rank).await;
    if let Some(sentinel) = &ctx.sentinel {
        sentinel.forget(pgid);
    }
    let finish = finish.map_err(|e| format!("waiting for the process failed: {e}"))?;
    let code = match finish {
        Finish::TimedOut => {
            let secs = limit.map(|t| t.as_secs()).unwrap_or_default();
            let why = format!("timed out after {secs} s (--timeout {secs})");
            system(format!("stopped: {why}")).await;
            return Err(why);
        }
        Finish::Exited {
            code,
            failed: Some(failed),
        } => {
            system(format!("stopped every process of this node: {failed}")).await;
            return Ok((code, Some(failed)));
        }
        Finish::Exited { code, failed: None } | Finish::Stopped { code } => code,
    };
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
    Ok((code, None))
}

/// Resolves once a stop order arrives (never, if the agent is gone without ordering one).
pub(crate) async fn stop_ordered(stop: &mut watch::Receiver<Option<StopWhy>>) {
    if stop.wait_for(|s| s.is_some()).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The program a job's command names, as the worker runs it: a bare `python` or `python3`
/// is the worker's interpreter (`--python`), the one its framework checks ran with, so a job
/// placed for `--framework torch` finds torch — unless the job sets its own `PATH`, which
/// then decides, as for any bare name.
fn job_program<'a>(program: &'a str, python: &'a str, own_path: bool) -> &'a str {
    if !own_path && matches!(program, "python" | "python3") {
        python
    } else {
        program
    }
}

/// A relative program path with a slash (`./render.sh`) means a file in the source.
/// A bare name (`python3`) is looked up in `search` (the job's `PATH`, else the worker's) as
/// `execvp` would, but once, here: the child then makes one `execve` instead of one per
/// `PATH` entry, and the worker can start it with `posix_spawn` (the child of a `PATH`
/// search must be forked). Relative entries are relative to `src`, the job's directory. A
/// name found nowhere stays bare, and starting it fails as it would have.
fn resolve_program(program: &str, src: &Path, search: Option<&std::ffi::OsStr>) -> PathBuf {
    let p = Path::new(program);
    if program.contains('/') {
        return if p.is_relative() {
            src.join(p)
        } else {
            p.to_path_buf()
        };
    }
    let Some(search) = search else {
        return p.to_path_buf();
    };
    // A relative entry depends on the job's directory; only absolute ones are remembered.
    let cacheable = std::env::split_paths(search).all(|d| d.is_absolute());
    if cacheable && let Some(found) = RESOLVED.get(program, search) {
        return found;
    }
    for dir in std::env::split_paths(search) {
        let candidate = src.join(dir).join(program);
        if is_executable_file(&candidate) {
            if cacheable {
                RESOLVED.put(program, search, &candidate);
            }
            return candidate;
        }
    }
    p.to_path_buf()
}

/// Programs found on a `PATH` lately: a lookup stats every entry (15 of them here, for
/// `true`), the largest part of starting a short job but the spawn itself. An entry is
/// trusted for `RESOLVED_FOR` and while the file is still there, so a program installed
/// earlier on the `PATH` is picked up within seconds.
struct Resolved(std::sync::Mutex<HashMap<(String, std::ffi::OsString), (PathBuf, Instant)>>);

const RESOLVED_FOR: Duration = Duration::from_secs(5);

static RESOLVED: std::sync::LazyLock<Resolved> =
    std::sync::LazyLock::new(|| Resolved(std::sync::Mutex::default()));

impl Resolved {
    fn get(&self, program: &str, search: &std::ffi::OsStr) -> Option<PathBuf> {
        let cache = self.0.lock().expect("resolved lock");
        let (path, at) = cache.get(&(program.to_string(), search.to_os_string()))?;
        (at.elapsed() < RESOLVED_FOR && is_executable_file(path)).then(|| path.clone())
    }

    fn put(&self, program: &str, search: &std::ffi::OsStr, path: &Path) {
        let mut cache = self.0.lock().expect("resolved lock");
        if cache.len() > 1000 {
            cache.clear();
        }
        cache.insert(
            (program.to_string(), search.to_os_string()),
            (path.to_path_buf(), Instant::now()),
        );
    }
}

fn is_executable_file(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
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
        let fetched = fetch_source(ctx, digest, &partial, &cached).await;
        if fetched.is_err() {
            let _ = tokio::fs::remove_file(&partial).await;
        }
        fetched?;
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
    let uploaded = ctx
        .client
        .upload_outputs(ctx.worker, a.task.0, a.attempt.0, &packed)
        .await
        .map_err(|e| e.to_string());
    let _ = tokio::fs::remove_file(&packed).await;
    uploaded
}

/// Downloads a source blob to `partial`, checks its digest and moves it to `cached`.
async fn fetch_source(
    ctx: &TaskContext,
    digest: &str,
    partial: &Path,
    cached: &Path,
) -> Result<(), String> {
    ctx.client
        .download_blob(digest, partial)
        .await
        .map_err(|e| e.to_string())?;
    let check = partial.to_path_buf();
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
    tokio::fs::rename(partial, cached)
        .await
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_bare_python_is_the_workers_interpreter_unless_the_job_sets_its_path() {
        let venv = "/opt/venv/bin/python";
        for (program, own_path, runs) in [
            ("python", false, venv),
            ("python3", false, venv),
            ("python", true, "python"),
            ("python3.11", false, "python3.11"),
            ("./python", false, "./python"),
            ("/usr/bin/python3", false, "/usr/bin/python3"),
            ("sh", false, "sh"),
        ] {
            assert_eq!(
                job_program(program, venv, own_path),
                runs,
                "{program} {own_path}"
            );
        }
    }

    #[test]
    fn programs_resolve_like_execvp_but_once() {
        let dir = tempfile::tempdir().unwrap();
        let (bin, src) = (dir.path().join("bin"), dir.path().join("src"));
        for d in [&bin, &src] {
            std::fs::create_dir(d).unwrap();
        }
        let tool = bin.join("tool");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let not_executable = bin.join("data");
        std::fs::write(&not_executable, "").unwrap();
        let search = std::env::join_paths([Path::new("/nonexistent"), &bin]).unwrap();
        let check = |program: &str, expect: PathBuf| {
            assert_eq!(
                resolve_program(program, &src, Some(&search)),
                expect,
                "{program}"
            );
        };
        check("tool", tool.clone());
        check("data", PathBuf::from("data"));
        check("missing", PathBuf::from("missing"));
        check("./run.sh", src.join("./run.sh"));
        check("/bin/sh", PathBuf::from("/bin/sh"));
        assert_eq!(resolve_program("tool", &src, None), PathBuf::from("tool"));
        // A relative PATH entry is relative to the job's directory.
        let relative = std::env::join_paths(["../bin"]).unwrap();
        assert_eq!(
            resolve_program("tool", &src, Some(&relative)),
            src.join("../bin").join("tool")
        );
    }
}
