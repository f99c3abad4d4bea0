//! Starting a task's processes: one, or for a distributed job `--procs-per-node` of them,
//! each with its ranks, its own devices and torchrun's environment, all in one process
//! group; and waiting for them, so that the first one to fail stops the others.
//!
//! No torchrun and no elastic agent: the worker is the agent. Node 0 picks the rendezvous
//! (an address of its own that the other nodes reach, and a port free there) and tells the
//! server; the other nodes ask the server for it before they start.

use crate::process::{STOP_GRACE, exit_code, signal_group};
use crate::shipper::{Line, split_long_line};
use client::{Client, ClientError};
use domain::{Accelerator, Inventory, JobSpec, ProcessPlace};
use nix::sys::signal::Signal;
use protocol::{Assignment, ErrorCode, RendezvousPoint, StopWhy, Stream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::{mpsc, watch};

/// After the processes exit, how long their pipes may stay open (held by a straggler)
/// before we stop reading them.
const PIPE_DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Where the processes of one distributed attempt meet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meeting {
    pub addr: String,
    pub port: u16,
}

/// Finds (node 0) or learns (the others) where this attempt's processes meet. Waits for
/// node 0 as long as it takes, unless the task is ordered to stop (then None).
pub async fn meet(
    client: &Client,
    worker: i64,
    a: &Assignment,
    advertise: Option<&str>,
    stop: &mut watch::Receiver<Option<StopWhy>>,
) -> Result<Option<Meeting>, String> {
    let (task, attempt) = (a.task.0, a.attempt.0);
    if a.node == 0 {
        let port = free_port().map_err(|e| format!("cannot find a free port: {e}"))?;
        let addr = match (a.spec.layout.nodes, advertise) {
            // One node: its processes meet on loopback.
            (1, _) => "127.0.0.1".to_string(),
            (_, Some(addr)) => addr.to_string(),
            (_, None) => route_to(client.url()).unwrap_or_else(|| "127.0.0.1".into()),
        };
        if a.spec.layout.nodes > 1 {
            let point = RendezvousPoint {
                addr: addr.clone(),
                port,
            };
            retry(stop, || {
                client.set_rendezvous(worker, task, attempt, &point)
            })
            .await?;
        }
        return Ok(Some(Meeting { addr, port }));
    }
    loop {
        let Some(answer) = retry(stop, || client.rendezvous(worker, task, attempt)).await? else {
            return Ok(None);
        };
        if let Some(point) = answer.rendezvous {
            return Ok(Some(Meeting {
                addr: point.addr,
                port: point.port,
            }));
        }
    }
}

/// Calls until it works, is refused for good, or the task is ordered to stop (None).
async fn retry<T, F: std::future::Future<Output = Result<T, ClientError>>>(
    stop: &mut watch::Receiver<Option<StopWhy>>,
    call: impl Fn() -> F,
) -> Result<Option<T>, String> {
    let mut backoff = Duration::from_millis(100);
    loop {
        tokio::select! {
            r = call() => match r {
                Ok(v) => return Ok(Some(v)),
                Err(e) if matches!(e.code(), Some(ErrorCode::LeaseLost | ErrorCode::WorkerLost)) => {
                    return Err(format!("the rendezvous was refused: {e}"));
                }
                Err(e) => tracing::warn!(error = %e, "rendezvous call failed; retrying"),
            },
            () = crate::runner::stop_ordered(stop) => return Ok(None),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// A port free on this machine now (bound, read, released: the usual race, which torchrun
/// runs too).
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind(("0.0.0.0", 0))?
        .local_addr()?
        .port())
}

/// This machine's address on the route to the server (no packet is sent): the one the other
/// nodes, which reach the same server, most likely reach too.
fn route_to(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split('/').next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let default = if scheme == "https" { 443 } else { 80 };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
            (h.trim_matches(['[', ']']), p.parse().ok()?)
        }
        _ => (authority.trim_matches(['[', ']']), default),
    };
    let any = if host.contains(':') {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    };
    let socket = std::net::UdpSocket::bind(any).ok()?;
    socket.connect((host, port)).ok()?;
    Some(socket.local_addr().ok()?.ip().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_on_the_route_to_a_loopback_server_is_loopback() {
        assert_eq!(
            route_to("http://127.0.0.1:8470").as_deref(),
            Some("127.0.0.1")
        );
        assert_eq!(
            route_to("http://localhost:1/v1").as_deref(),
            Some("127.0.0.1")
        );
        assert_eq!(route_to("not a url"), None);
    }
}

/// Everything the processes of one task share.
pub struct Launch<'a> {
    pub spec: &'a JobSpec,
    pub assignment: &'a Assignment,
    pub program: PathBuf,
    /// What the processes see as their `argv[0]`: the command's program as given, or the
    /// interpreter's path when the worker's Python stands in for a bare `python` (a venv's
    /// interpreter finds its venv from its `argv[0]`; a bare name would be looked up on the
    /// `PATH` and find the system's).
    pub arg0: String,
    pub src: &'a Path,
    pub output_dir: &'a Path,
    pub inventory: &'a Inventory,
    /// Where a distributed job's processes meet (None for a single process).
    pub meeting: Option<Meeting>,
}

/// The running processes of one task, one process group.
pub struct Started {
    /// The group's id (its first process's pid).
    pub pgid: u32,
    children: Vec<(u32, tokio::process::Child)>,
    pumps: Vec<tokio::task::JoinHandle<()>>,
}

/// How the processes ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// All ran to their end; the exit code, and for a failed distributed job which rank
    /// failed first.
    Exited {
        code: i32,
        failed: Option<String>,
    },
    /// Stopped on order.
    Stopped {
        code: i32,
    },
    TimedOut,
}

impl Launch<'_> {
    /// Starts every process of the task. On failure, those already started are killed.
    pub fn start(&self, lines: &mpsc::Sender<Line>) -> std::io::Result<Started> {
        let layout = self.spec.layout;
        let per_process = self.assignment.devices.len() / layout.procs_per_node as usize;
        let mut started = Started {
            pgid: 0,
            children: Vec::new(),
            pumps: Vec::new(),
        };
        for local in 0..layout.procs_per_node {
            let devices: Vec<u32> = match self.meeting {
                None => self.assignment.devices.clone(),
                Some(_) => self
                    .assignment
                    .devices
                    .iter()
                    .skip(local as usize * per_process)
                    .take(per_process)
                    .copied()
                    .collect(),
            };
            let mut cmd = self.command(local, &devices);
            // The first process leads the group; the others join it, so one signal reaches
            // every rank of the node and everything they start.
            cmd.process_group(started.pgid as i32);
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => {
                    if started.pgid != 0 {
                        signal_group(started.pgid, Signal::SIGKILL);
                    }
                    return Err(e);
                }
            };
            let pid = child.id().expect("a just-spawned child has a pid");
            if started.pgid == 0 {
                started.pgid = pid;
            }
            let rank = self
                .meeting
                .as_ref()
                .map(|_| self.assignment.node * layout.procs_per_node + local);
            for (pipe, stream) in [
                (
                    Box::new(child.stdout.take().expect("piped"))
                        as Box<dyn AsyncRead + Unpin + Send>,
                    Stream::Stdout,
                ),
                (
                    Box::new(child.stderr.take().expect("piped")),
                    Stream::Stderr,
                ),
            ] {
                started
                    .pumps
                    .push(tokio::spawn(pump(pipe, stream, rank, lines.clone())));
            }
            started.children.push((local, child));
        }
        Ok(started)
    }

    fn command(&self, local: u32, devices: &[u32]) -> tokio::process::Command {
        let a = self.assignment;
        let spec = self.spec;
        let mut cmd = tokio::process::Command::new(&self.program);
        // The job sees its command as it was given, whatever path it resolved to.
        cmd.arg0(&self.arg0)
            .args(spec.command.args())
            .current_dir(self.src)
            .env("PYTHONUNBUFFERED", "1")
            .envs(spec.env.iter().map(|e| (e.name(), e.value())))
            .env("GPULAYER_JOB_ID", a.job.to_string())
            .env("GPULAYER_TASK_ID", a.task.to_string())
            .env("GPULAYER_ATTEMPT", a.attempt.to_string())
            .envs(device_env(spec.accelerator, devices, self.inventory))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match &self.meeting {
            None => {
                cmd.env("GPULAYER_OUTPUT_DIR", self.output_dir);
            }
            Some(meeting) => {
                let place = ProcessPlace {
                    run_id: &a.job.to_string(),
                    layout: spec.layout,
                    node_rank: a.node,
                    local_rank: local,
                    master_addr: &meeting.addr,
                    master_port: meeting.port,
                    restart_count: a.attempt.0.saturating_sub(1) as u32,
                    max_restarts: spec.max_attempts().saturating_sub(1),
                };
                // Each rank writes its outputs apart, so ranks never overwrite each other.
                let output = self
                    .output_dir
                    .join(format!("rank-{}", place.global_rank()));
                let _ = std::fs::create_dir_all(&output);
                cmd.env("GPULAYER_OUTPUT_DIR", output);
                let own = |name: &str| spec.env.iter().any(|e| e.name() == name);
                cmd.envs(place.env(&own));
            }
        }
        cmd
    }
}

impl Started {
    /// Waits until every process has ended. The first to fail stops the others (SIGTERM to
    /// the group, SIGKILL after the grace period); so does a stop order or the timeout.
    pub async fn wait(
        mut self,
        stop: &mut watch::Receiver<Option<StopWhy>>,
        timeout: Option<Duration>,
        first_rank: Option<u32>,
    ) -> std::io::Result<Finish> {
        let (done_tx, mut done) = mpsc::unbounded_channel();
        for (local, mut child) in std::mem::take(&mut self.children) {
            let done_tx = done_tx.clone();
            tokio::spawn(async move {
                let _ = done_tx.send((local, child.wait().await));
            });
        }
        drop(done_tx);
        let over_time = async {
            match timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(over_time);
        let mut code = None;
        let mut failed = None;
        // Why the group is being stopped, and when the grace period ends.
        let mut why: Option<Finish> = None;
        let mut kill_at: Option<tokio::time::Instant> = None;
        loop {
            let deadline = kill_at;
            let grace = async move {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let stopping = why.is_some();
            tokio::select! {
                ended = done.recv() => {
                    let Some((local, status)) = ended else { break };
                    let c = exit_code(status?);
                    if c != 0 && !stopping {
                        failed = first_rank.map(|r| format!("rank {} exited with code {c}", r + local));
                        code = Some(c);
                        why = Some(Finish::Exited { code: c, failed: failed.clone() });
                    }
                    code.get_or_insert(c);
                }
                () = crate::runner::stop_ordered(stop), if !stopping => {
                    why = Some(Finish::Stopped { code: 0 });
                }
                () = &mut over_time, if !stopping => {
                    why = Some(Finish::TimedOut);
                }
                () = grace => {
                    signal_group(self.pgid, Signal::SIGKILL);
                    kill_at = None;
                    continue;
                }
            }
            if why.is_some() && !stopping {
                // The others would wait for the failed one forever, or must stop: SIGTERM to
                // the group, SIGKILL after the grace period.
                signal_group(self.pgid, Signal::SIGTERM);
                kill_at = Some(tokio::time::Instant::now() + STOP_GRACE);
            }
        }
        // Whatever the processes left behind in their group goes with them: the task is over.
        signal_group(self.pgid, Signal::SIGKILL);
        for pump in self.pumps {
            let _ = tokio::time::timeout(PIPE_DRAIN_TIMEOUT, pump).await;
        }
        let code = code.unwrap_or(-1);
        Ok(match why {
            Some(Finish::Stopped { .. }) => Finish::Stopped { code },
            Some(Finish::TimedOut) => Finish::TimedOut,
            _ => Finish::Exited { code, failed },
        })
    }
}

/// The variables that confine a process to its devices. A cuda process sees only its GPUs
/// (by UUID when known, which does not depend on enumeration order); a cpu one sees none; one
/// that asked for `any` is left as it is.
pub fn device_env(
    accelerator: Accelerator,
    devices: &[u32],
    inventory: &Inventory,
) -> Vec<(&'static str, String)> {
    match accelerator {
        Accelerator::Cuda => {
            let ids: Vec<String> = devices
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
                    devices
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

/// Reads a pipe line by line (lossy UTF-8) into the shipper.
async fn pump(
    pipe: impl AsyncRead + Unpin,
    stream: Stream,
    rank: Option<u32>,
    lines: mpsc::Sender<Line>,
) {
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
                    if lines.send((stream, rank, piece)).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}
