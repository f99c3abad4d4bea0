//! Remote function calls (`@gl.remote`): run in warm Python runners — one long-lived
//! interpreter per slot and interpreter path — instead of a process per call, so imports
//! stay loaded and a map over many small items pays no interpreter start per item.
//!
//! A runner (`call_runner.py`) talks to the worker over a Unix socket (one JSON object per
//! line); what the call prints goes to the runner's stdout and stderr, which are read here
//! as the call's log lines. After each call the runner writes an end marker to both, so no
//! line of one call is shipped as the next one's. A runner that dies, or a call that is
//! cancelled or times out, costs that runner (its process group is killed); the next call
//! on the slot starts a fresh one.

use crate::process::{exit_code, signal_group};
use crate::runner::{TaskContext, stop_ordered};
use crate::shipper::Line;
use domain::CallOutcome;
use nix::sys::signal::Signal;
use protocol::{StopWhy, Stream};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;

const RUNNER_SCRIPT: &str = include_str!("call_runner.py");

/// How long a new runner may take to start and say it is ready (an interpreter start and
/// `import cloudpickle`; slow disks and cold caches included).
const RUNNER_START_TIMEOUT: Duration = Duration::from_secs(60);

/// After a call's answer, how long its last lines may take to arrive.
const MARKER_WAIT: Duration = Duration::from_secs(2);

/// The line a runner writes to stdout and stderr after each call (then the call's number).
const END_MARKER: &str = "\u{1e}gpulayer-end ";

/// The largest pickled result a call may return unless `GPULAYER_MAX_RESULT_BYTES` says
/// otherwise (the server keeps results in PostgreSQL, and every caller holds its own).
pub const DEFAULT_MAX_RESULT_BYTES: usize = 64 << 20;

fn max_result_bytes() -> usize {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        std::env::var("GPULAYER_MAX_RESULT_BYTES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_MAX_RESULT_BYTES)
    })
}

/// Idle runners, by slot directory and interpreter.
#[derive(Debug, Default)]
pub struct Runners {
    idle: Mutex<HashMap<(PathBuf, String), Runner>>,
}

impl Runners {
    fn take(&self, dir: &Path, python: &str) -> Option<Runner> {
        let mut idle = self.idle.lock().expect("runners lock");
        idle.remove(&(dir.to_path_buf(), python.to_string()))
    }

    fn put(&self, dir: &Path, python: &str, runner: Runner) {
        let mut idle = self.idle.lock().expect("runners lock");
        idle.insert((dir.to_path_buf(), python.to_string()), runner);
    }

    /// Stops every idle runner (the worker is leaving).
    pub fn stop_all(&self) {
        let mut idle = self.idle.lock().expect("runners lock");
        for (_, runner) in idle.drain() {
            runner.kill();
        }
    }
}

#[derive(Debug)]
struct Runner {
    child: tokio::process::Child,
    pgid: u32,
    answers: tokio::io::Lines<BufReader<OwnedReadHalf>>,
    requests: OwnedWriteHalf,
    output: mpsc::Receiver<(Stream, String)>,
    seq: u64,
}

impl Runner {
    fn kill(mut self) {
        signal_group(self.pgid, Signal::SIGKILL);
        let _ = self.child.start_kill();
    }
}

#[derive(Debug, Deserialize)]
struct Ready {
    ready: String,
}

#[derive(Debug, Deserialize)]
struct Answer {
    done: u64,
    ok: bool,
    payload: Option<String>,
    error: Option<serde_json::Value>,
}

/// Where the runner of `dir` listens: in the slot's directory, unless that path is too long
/// for a Unix socket address (108 bytes).
fn socket_path(dir: &Path) -> PathBuf {
    let p = dir.join("runner.sock");
    if p.as_os_str().len() < 100 {
        return p;
    }
    std::env::temp_dir().join(format!(
        "gpulayer-runner-{}-{}.sock",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ))
}

async fn start_runner(python: &str, dir: &Path, src: &Path) -> Result<Runner, String> {
    let path = socket_path(dir);
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)
        .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    let mut child = tokio::process::Command::new(python)
        .args(["-u", "-c", RUNNER_SCRIPT])
        .current_dir(src)
        .env("GPULAYER_RUNNER_SOCKET", &path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {python}: {e}"))?;
    let pgid = child.id().unwrap_or_default();
    let (tx, mut output) = mpsc::channel::<(Stream, String)>(10_000);
    for (stream, pipe) in [
        (
            Stream::Stdout,
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ),
        (
            Stream::Stderr,
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ),
    ] {
        let Some(pipe) = pipe else { continue };
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(pipe).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if tx.send((stream, line)).await.is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);
    let accepted = tokio::select! {
        a = tokio::time::timeout(RUNNER_START_TIMEOUT, listener.accept()) => a,
        status = child.wait() => {
            let _ = std::fs::remove_file(&path);
            let mut said = Vec::new();
            while let Ok(Some((_, line))) = tokio::time::timeout(Duration::from_millis(500), output.recv()).await {
                said.push(line);
            }
            let status = status.map(|s| format!("exit code {}", exit_code(s))).unwrap_or_else(|e| e.to_string());
            let last = said.last().cloned().unwrap_or_else(|| "no output".into());
            return Err(format!("the Python runner ({python}) exited at start ({status}): {last}"));
        }
    };
    let _ = std::fs::remove_file(&path);
    let (stream, _) = match accepted {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(format!("the Python runner did not connect: {e}")),
        Err(_) => {
            signal_group(pgid, Signal::SIGKILL);
            return Err(format!(
                "the Python runner ({python}) did not start within {} s",
                RUNNER_START_TIMEOUT.as_secs()
            ));
        }
    };
    let (read, requests) = stream.into_split();
    let mut answers = BufReader::new(read).lines();
    let ready = tokio::time::timeout(RUNNER_START_TIMEOUT, answers.next_line())
        .await
        .map_err(|_| "the Python runner did not say it was ready".to_string())?
        .map_err(|e| format!("the Python runner's socket failed: {e}"))?
        .ok_or("the Python runner closed its socket at start")?;
    let ready: Ready = serde_json::from_str(&ready)
        .map_err(|e| format!("the Python runner said {ready:?} at start: {e}"))?;
    tracing::debug!(python, version = %ready.ready, "a Python runner started");
    Ok(Runner {
        child,
        pgid,
        answers,
        requests,
        output,
        seq: 0,
    })
}

/// The function's pickle in the worker's cache (fetched once per digest).
async fn function_file(ctx: &TaskContext, digest: &str) -> Result<PathBuf, String> {
    let cache = ctx.work_root.join("cache");
    let path = cache.join(format!("fn-{digest}.pkl"));
    if path.exists() {
        return Ok(path);
    }
    tokio::fs::create_dir_all(&cache)
        .await
        .map_err(|e| e.to_string())?;
    let partial = cache.join(format!(
        "fn-{digest}.{}.partial",
        uuid::Uuid::new_v4().simple()
    ));
    let fetched = ctx.client.download_blob(digest, &partial).await;
    if let Err(e) = fetched {
        let _ = tokio::fs::remove_file(&partial).await;
        return Err(format!("cannot fetch the function {}: {e}", &digest[..12]));
    }
    tokio::fs::rename(&partial, &path)
        .await
        .map_err(|e| e.to_string())?;
    Ok(path)
}

/// How a call ended: (exit code, failure reason, outcome for the caller).
pub type CallEnd = (i32, Option<String>, Option<CallOutcome>);

/// Runs the assignment's call in the slot's warm runner (starting one if needed).
/// Err(reason) when it could not run or did not finish (stopped, timed out, runner died).
pub async fn execute(
    ctx: &mut TaskContext,
    src: &Path,
    lines: &mpsc::Sender<Line>,
    started: &mut Option<Instant>,
) -> Result<CallEnd, String> {
    let a = ctx.assignment.clone();
    let call = a.spec.call.clone().ok_or("not a call")?;
    let python = ctx.python.clone();
    let system = |text: String| async move {
        let _ = lines.send((Stream::System, None, text)).await;
    };
    // A call that waited in the queue may have been stopped meanwhile: nothing ran.
    if ctx.stop.borrow().is_some() {
        return Err("stopped before it started".into());
    }
    let function_path = function_file(ctx, call.function.as_str()).await?;
    let dir = ctx.work_dir.dir.clone();
    let mut runner = match ctx.runners.take(&dir, &python) {
        Some(r) => r,
        None => {
            system(format!(
                "starting a Python runner ({python}) on worker {}",
                ctx.worker_name
            ))
            .await;
            start_runner(&python, &dir, src)
                .await
                .map_err(|e| format!("cannot run the call on worker {}: {e}", ctx.worker_name))?
        }
    };
    if let Some(sentinel) = &ctx.sentinel {
        sentinel.watch(runner.pgid);
    }
    runner.seq += 1;
    let seq = runner.seq;
    let mut env: serde_json::Map<String, serde_json::Value> = a
        .spec
        .env
        .iter()
        .map(|e| (e.name().to_string(), e.value().into()))
        .collect();
    env.insert("GPULAYER_JOB_ID".into(), a.job.0.to_string().into());
    let request = serde_json::json!({
        "call": seq,
        "job": a.job.0,
        "function": call.function.as_str(),
        "function_path": function_path,
        "args": call.args,
        "max_result": max_result_bytes(),
        "env": env,
    });
    ctx.report_started(started);
    let sent = async {
        let mut text = request.to_string();
        text.push('\n');
        runner.requests.write_all(text.as_bytes()).await
    }
    .await;
    if let Err(e) = sent {
        runner.kill();
        return Err(format!("the Python runner is gone: {e}"));
    }
    let limit = a.spec.timeout_seconds.map(Duration::from_secs);
    let deadline = limit.map(|l| tokio::time::Instant::now() + l);
    let mut markers = 0;
    let mut output_closed = false;
    let answer = loop {
        tokio::select! {
            biased;
            out = runner.output.recv(), if !output_closed => match out {
                Some((stream, line)) => {
                    markers += usize::from(forward(lines, stream, line, seq).await);
                }
                // Both pipes closed: the runner is gone; its socket says so next.
                None => output_closed = true,
            },
            answer = runner.answers.next_line() => match answer {
                Ok(Some(text)) => match serde_json::from_str::<Answer>(&text) {
                    Ok(answer) if answer.done == seq => break answer,
                    Ok(_) => continue,
                    Err(e) => {
                        runner.kill();
                        return Err(format!("the Python runner answered {text:?}: {e}"));
                    }
                },
                _ => {
                    // The runner died mid-call: the call's own doing (os._exit, a crash).
                    let status = runner.child.wait().await.map(exit_code).unwrap_or(-1);
                    drain(&mut runner, lines, seq).await;
                    runner.kill();
                    return Err(format!(
                        "the Python interpreter running the call exited (exit code {status}): the function ended it (os._exit, a crash in native code, or out of memory); see the call's last lines"
                    ));
                }
            },
            () = stop_ordered(&mut ctx.stop) => {
                runner.kill();
                let why = match *ctx.stop.borrow() {
                    Some(StopWhy::Cancelled) => "the job was cancelled",
                    Some(StopWhy::LeaseLost) => "the job is no longer this worker's",
                    _ => "the worker is shutting down; the call goes back to the queue",
                };
                system(format!("stopped: {why}")).await;
                return Err(format!("stopped: {why}"));
            }
            () = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            } => {
                runner.kill();
                let secs = limit.map(|l| l.as_secs()).unwrap_or_default();
                let why = format!("timed out after {secs} s (timeout={secs})");
                system(format!("stopped: {why}")).await;
                return Err(why);
            }
        }
    };
    // The answer overtook the call's last lines: wait for its markers on both pipes.
    let until = tokio::time::Instant::now() + MARKER_WAIT;
    while markers < 2 {
        match tokio::time::timeout_at(until, runner.output.recv()).await {
            Ok(Some((stream, line))) => {
                if forward(lines, stream, line, seq).await {
                    markers += 1;
                }
            }
            _ => break,
        }
    }
    if let Some(sentinel) = &ctx.sentinel {
        sentinel.forget(runner.pgid);
    }
    ctx.runners.put(&dir, &python, runner);
    let outcome = CallOutcome {
        ok: answer.ok,
        payload: answer.payload,
        error: answer.error,
    };
    if outcome.ok {
        return Ok((0, None, Some(outcome)));
    }
    let raised = outcome
        .error
        .as_ref()
        .map(|e| {
            let kind = e
                .get("type")
                .and_then(|t| t.as_str())
                .unwrap_or("Exception");
            let message = e.get("message").and_then(|m| m.as_str()).unwrap_or("");
            format!("raised {kind}: {message}")
        })
        .unwrap_or_else(|| "raised an exception".into());
    Ok((1, Some(raised), Some(outcome)))
}

/// Ships one line of the runner's output; true when it was (or ended with) the marker of
/// call `seq`.
async fn forward(lines: &mpsc::Sender<Line>, stream: Stream, line: String, seq: u64) -> bool {
    let (text, marker) = match line.find(END_MARKER) {
        Some(at) => (&line[..at], Some(&line[at + END_MARKER.len()..])),
        None => (line.as_str(), None),
    };
    if marker.is_none() || !text.is_empty() {
        let _ = lines.send((stream, None, text.to_string())).await;
    }
    marker.is_some_and(|m| m.trim() == seq.to_string())
}

/// What a dead runner still had in its pipes.
async fn drain(runner: &mut Runner, lines: &mpsc::Sender<Line>, seq: u64) {
    let until = tokio::time::Instant::now() + Duration::from_millis(500);
    while let Ok(Some((stream, line))) = tokio::time::timeout_at(until, runner.output.recv()).await
    {
        forward(lines, stream, line, seq).await;
    }
}
