//! The worker loop: register, keep one long poll open, heartbeat, start tasks, obey stop
//! orders, and on shutdown stop everything and say goodbye.
//!
//! Starts and ends travel with the next poll. When news arrives while a poll is held, the
//! worker waits a moment for news from its other running tasks (short tasks end close
//! together), then drops the held poll and sends a new one carrying all of it: one request
//! and a few statements for a whole batch of tasks, which is what lets many short jobs
//! through a small machine.

use crate::reports::Reports;
use crate::runner::{TaskContext, TaskEnd, WorkDir, run_task};
use crate::sentinel::Sentinel;
use client::{Client, ClientError};
use domain::{Attempt, TaskId};
use protocol::{ErrorCode, HeartbeatRequest, PollRequest, RegisterRequest, StopWhy, TaskLease};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// How long the server may hold a poll when there is nothing to do.
const POLL_WAIT: Duration = Duration::from_secs(20);
/// How long news may wait for more news while other tasks still run. Long enough for a batch
/// of short tasks started together to end together (a few ms each, longer on a machine
/// they saturate); short against any
/// job worth queueing, and a cancel still reaches a running task within it.
const REPORT_LINGER: Duration = Duration::from_millis(20);
/// How many remote calls a slot's runner may have waiting (a map's small calls are claimed
/// and reported in batches of up to this many per slot).
const CALLS_QUEUED_PER_SLOT: usize = 16;
/// Pause after a failed call before trying again, doubling up to the maximum.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub url: String,
    pub token: String,
    /// The server's certificate fingerprint (`gpulayer join --fingerprint`): only a server
    /// presenting that certificate is trusted.
    pub fingerprint: Option<client::Fingerprint>,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub slots: u32,
    pub work_root: PathBuf,
    pub keep_work_dirs: bool,
    /// The address other nodes of a multi-node job reach this worker at [default: this
    /// machine's address on the route to the server].
    pub advertise_addr: Option<String>,
    /// Probe this machine, or advertise a recorded inventory (tests, load tests).
    pub inventory: InventorySource,
    /// Told the worker id after each (re-)registration.
    pub registered: Option<tokio::sync::mpsc::UnboundedSender<i64>>,
}

/// Where the worker's inventory comes from.
#[derive(Debug, Clone)]
pub enum InventorySource {
    /// Probe the hardware and run the framework checks with this interpreter.
    Probe { python: String, refresh: bool },
    /// Advertise this inventory as is (marked simulated).
    Recorded(Box<domain::Inventory>),
}

/// A running task's stop switch.
struct Running {
    stop: watch::Sender<Option<StopWhy>>,
}

struct Tasks {
    running: Mutex<HashMap<TaskLease, Running>>,
    /// Woken when a task ends.
    freed: Notify,
    /// Starts and ends not yet acknowledged by the server.
    reports: Arc<Reports>,
    /// Slots' work directories not in use (indices under the run directory).
    free_dirs: Mutex<Vec<usize>>,
    /// Where the slots' work directories live, one per slot, for this worker process.
    run_dir: PathBuf,
    /// Kills the tasks' process groups if this process dies first.
    sentinel: Option<Arc<Sentinel>>,
    /// Warm Python runners for remote function calls, per slot.
    runners: Arc<crate::calls::Runners>,
    /// Remote calls assigned beyond the free slots, waiting for one (they count as running).
    queued:
        Mutex<std::collections::VecDeque<(protocol::Assignment, watch::Receiver<Option<StopWhy>>)>>,
}

impl Tasks {
    fn new(slots: u32, run_dir: PathBuf, sentinel: Option<Arc<Sentinel>>) -> Self {
        Self {
            running: Mutex::default(),
            freed: Notify::new(),
            reports: Arc::default(),
            free_dirs: Mutex::new((0..slots as usize).rev().collect()),
            run_dir,
            sentinel,
            runners: Arc::default(),
            queued: Mutex::default(),
        }
    }

    /// Tasks not yet ordered to stop: what the worker tells the server it runs.
    fn leases(&self) -> Vec<TaskLease> {
        let running = self.running.lock().expect("tasks lock");
        running
            .iter()
            .filter(|(_, r)| r.stop.borrow().is_none())
            .map(|(l, _)| *l)
            .collect()
    }

    fn busy(&self) -> usize {
        self.running.lock().expect("tasks lock").len()
    }

    fn stop(&self, lease: TaskLease, why: StopWhy) {
        if let Some(r) = self.running.lock().expect("tasks lock").get(&lease) {
            r.stop.send_if_modified(|s| {
                if s.is_none() {
                    *s = Some(why);
                    true
                } else {
                    false
                }
            });
        }
    }

    fn stop_all(&self, why: StopWhy) {
        for lease in self
            .running
            .lock()
            .expect("tasks lock")
            .keys()
            .copied()
            .collect::<Vec<_>>()
        {
            self.stop(lease, why);
        }
    }
}

fn is_worker_lost(e: &ClientError) -> bool {
    e.code() == Some(ErrorCode::WorkerLost)
}

/// Runs the worker until `shutdown` resolves.
pub async fn run(
    config: WorkerConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ClientError> {
    let client = Client::pinned(&config.url, Some(&config.token), config.fingerprint)?;
    let run_dir = prepare_run_dir(&config.work_root);
    let sentinel = match crate::sentinel::Sentinel::start() {
        Ok(s) => Some(Arc::new(s)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the sentinel: if this worker is killed, its tasks' processes will outlive it");
            None
        }
    };
    let tasks = Arc::new(Tasks::new(config.slots, run_dir, sentinel));
    let inventory = match &config.inventory {
        InventorySource::Recorded(inv) => {
            let mut inv = (**inv).clone();
            inv.simulated = true;
            inv
        }
        InventorySource::Probe { python, refresh } => {
            crate::detect(
                python,
                *refresh,
                Some(config.work_root.join("framework-checks.json")),
            )
            .await
        }
    };
    let shared_inventory = Arc::new(inventory.clone());
    // Only a worker that knows its interpreter takes calls ahead of its slots (a recorded
    // inventory does not say which Python runs them).
    let probed_python = inventory.python.is_some();
    let shared_config = Arc::new(config.clone());
    let labels = crate::locality::with_cloud_zone(config.labels.clone()).await;
    tokio::pin!(shutdown);
    let mut backoff = FIRST_BACKOFF;

    'register: loop {
        let request = RegisterRequest {
            name: config.name.clone(),
            labels: labels.clone(),
            slots: config.slots,
            inventory: inventory.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        };
        let registered = tokio::select! {
            r = client.register_worker(&request) => r,
            _ = &mut shutdown => return Ok(()),
        };
        let reg = match registered {
            Ok(r) => r,
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, "cannot register yet; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
            Err(e) => return Err(e),
        };
        backoff = FIRST_BACKOFF;
        let worker = reg.worker_id.0;
        tracing::info!(worker, name = %config.name, slots = config.slots, "joined {}", config.url);
        if let Some(tx) = &config.registered {
            let _ = tx.send(worker);
        }

        let launcher = Launcher {
            inventory: shared_inventory.clone(),
            client: client.clone(),
            worker,
            config: shared_config.clone(),
            tasks: tasks.clone(),
        };
        let heartbeat = tokio::spawn(heartbeat_loop(
            client.clone(),
            worker,
            Duration::from_secs(reg.heartbeat_seconds.max(1)),
            tasks.clone(),
        ));

        // The first poll after registering, and every poll after one that failed or that we
        // dropped with room in it, asks the server to compare what it assigned here with what
        // we run (an answer may have been lost).
        let mut reconcile = true;
        let mut poll_seq: u64 = 0;
        // When the last answer started tasks: their starts (and, for short ones, ends) are
        // news worth waiting a moment for.
        let mut started_at: Option<Instant> = None;
        loop {
            let since = tasks.reports.unsent_since().map(Instant::from_std);
            if let Some(since) = since.into_iter().chain(started_at.take()).min() {
                tokio::select! {
                    () = settle(&tasks, since) => {}
                    _ = &mut shutdown => {
                        heartbeat.abort();
                        shut_down(&client, worker, &tasks, poll_seq).await;
                        return Ok(());
                    }
                }
            }
            let free = (config.slots as usize).saturating_sub(tasks.busy()) as u32;
            // Queueable remote calls are taken in batches: each slot's warm runner works
            // through several.
            let call_room = if probed_python {
                (config.slots as usize * CALLS_QUEUED_PER_SLOT).saturating_sub(tasks.busy()) as u32
            } else {
                0
            };
            let (reports, carried) = tasks.reports.for_poll(std::time::Instant::now());
            poll_seq += 1;
            let request = PollRequest {
                free_slots: free,
                call_room,
                running: tasks.leases(),
                wait_ms: POLL_WAIT.as_millis() as u64,
                reconcile,
                poll_seq,
                reports,
                quiet: tasks.busy() == 0,
            };
            // A poll that carries reports is answered at once: wait for it. One that does not
            // may be held (so may one sent with nothing running); with something to tell,
            // replace it (dropping a poll loses nothing, see `PollRequest`: what it reported
            // goes again), unless it answers first.
            let carries_reports = !request.reports.is_empty() && !request.quiet;
            let answer = tokio::select! {
                biased;
                r = client.poll(worker, &request) => Some(r),
                () = reason_to_repoll(&tasks, config.slots, free), if !carries_reports => None,
                _ = &mut shutdown => {
                    heartbeat.abort();
                    shut_down(&client, worker, &tasks, poll_seq).await;
                    return Ok(());
                }
            };
            let Some(answer) = answer else {
                // A dropped poll with room may have claimed tasks for us: ask for them.
                reconcile |= free > 0 || call_room > 0;
                continue;
            };
            match answer {
                Ok(resp) => {
                    backoff = FIRST_BACKOFF;
                    reconcile = false;
                    tasks.reports.acknowledge(&carried);
                    for lease in resp.lost {
                        tracing::warn!(
                            task = lease.task.0,
                            attempt = lease.attempt.0,
                            "the server refused this task's result: it is no longer this worker's"
                        );
                    }
                    for order in resp.stop {
                        tasks.stop(order.lease, order.why);
                    }
                    if !resp.assignments.is_empty() {
                        started_at = Some(Instant::now());
                    }
                    for assignment in resp.assignments {
                        start_task(&launcher, assignment);
                    }
                }
                Err(e) if is_worker_lost(&e) => {
                    // Our lease ran out while we were away: the server already failed our
                    // tasks. Stop them and join again as a new worker.
                    tracing::warn!(
                        "the server declared this worker lost; stopping its tasks and joining again"
                    );
                    heartbeat.abort();
                    tasks.stop_all(StopWhy::LeaseLost);
                    continue 'register;
                }
                Err(e) => {
                    reconcile = true;
                    tracing::warn!(error = %e, "poll failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
}

/// Waits until news that arrived at `since` has lingered long enough: `REPORT_LINGER`, or
/// until no task runs any more (nothing else could end soon).
async fn settle(tasks: &Tasks, since: Instant) {
    let deadline = since + REPORT_LINGER;
    loop {
        let freed = tasks.freed.notified();
        tokio::pin!(freed);
        freed.as_mut().enable();
        if tasks.busy() == 0 || Instant::now() >= deadline {
            return;
        }
        tokio::select! {
            () = freed => {}
            () = tokio::time::sleep_until(deadline) => return,
        }
    }
}

/// Resolves when a held poll should give way to a new one: news arrived and settled, or a
/// slot freed up while the poll asked for no work (a task stopped without news, say).
async fn reason_to_repoll(tasks: &Tasks, slots: u32, asked_free: u32) {
    loop {
        let freed = tasks.freed.notified();
        tokio::pin!(freed);
        freed.as_mut().enable();
        if let Some(since) = tasks.reports.unsent_since() {
            settle(tasks, Instant::from_std(since)).await;
            return;
        }
        if asked_free == 0 && tasks.busy() < slots as usize {
            return;
        }
        tokio::select! {
            () = tasks.reports.news() => {}
            () = freed => {}
        }
    }
}

/// What starting a task needs from the agent, shared by every task of one registration.
#[derive(Clone)]
struct Launcher {
    inventory: Arc<domain::Inventory>,
    client: Client,
    worker: i64,
    config: Arc<WorkerConfig>,
    tasks: Arc<Tasks>,
}

fn start_task(launcher: &Launcher, assignment: protocol::Assignment) {
    let tasks = &launcher.tasks;
    let lease = TaskLease {
        task: TaskId(assignment.task.0),
        attempt: Attempt(assignment.attempt.0),
    };
    let (stop_tx, stop_rx) = watch::channel(None);
    {
        let mut running = tasks.running.lock().expect("tasks lock");
        if running.contains_key(&lease) {
            // Delivered twice (a poll answered after its successor left): already running.
            return;
        }
        running.insert(lease, Running { stop: stop_tx });
    }
    // A kept work directory is the task's own; so is one for a task beyond the slots (never
    // expected but for remote calls: the server assigns no more than the free slots, and
    // calls beyond them wait for a slot's runner).
    let slot = match launcher.config.keep_work_dirs {
        true => None,
        false => tasks.free_dirs.lock().expect("slots lock").pop(),
    };
    if slot.is_none() && !launcher.config.keep_work_dirs && assignment.spec.call.is_some() {
        let mut queued = tasks.queued.lock().expect("queue lock");
        queued.push_back((assignment, stop_rx));
        return;
    }
    run_in(launcher.clone(), slot, assignment, stop_rx);
}

/// Runs a task in slot `slot` (or a directory of its own), then hands the slot to the next
/// queued call, if any.
fn run_in(
    launcher: Launcher,
    slot: Option<usize>,
    assignment: protocol::Assignment,
    stop_rx: watch::Receiver<Option<StopWhy>>,
) {
    let (tasks, config) = (&launcher.tasks, &launcher.config);
    let lease = TaskLease {
        task: TaskId(assignment.task.0),
        attempt: Attempt(assignment.attempt.0),
    };
    let work_dir = match slot {
        Some(i) => WorkDir {
            dir: tasks.run_dir.join(format!("slot-{i}")),
            keep: false,
        },
        None => WorkDir {
            dir: config.work_root.join("jobs").join(format!(
                "job-{}-task-{}-attempt-{}",
                assignment.job.0, lease.task.0, lease.attempt.0
            )),
            keep: config.keep_work_dirs,
        },
    };
    tracing::debug!(
        job = assignment.job.0,
        task = lease.task.0,
        attempt = lease.attempt.0,
        "starting"
    );
    let ctx = TaskContext {
        client: launcher.client.clone(),
        worker: launcher.worker,
        worker_name: config.name.clone(),
        assignment,
        work_root: config.work_root.clone(),
        work_dir: work_dir.clone(),
        reports: tasks.reports.clone(),
        inventory: launcher.inventory.clone(),
        stop: stop_rx,
        sentinel: tasks.sentinel.clone(),
        advertise_addr: config.advertise_addr.clone(),
        python: match &config.inventory {
            InventorySource::Probe { python, .. } => python.clone(),
            InventorySource::Recorded(_) => "python3".into(),
        },
        runners: tasks.runners.clone(),
    };
    tokio::spawn(async move {
        let end = run_task(ctx).await;
        if end == TaskEnd::LeaseLost {
            tracing::warn!(
                task = lease.task.0,
                "task stopped: it is no longer this worker's"
            );
        }
        let tasks = &launcher.tasks;
        let next = match slot {
            Some(i) => {
                let next = tasks.queued.lock().expect("queue lock").pop_front();
                if next.is_none() {
                    tasks.free_dirs.lock().expect("slots lock").push(i);
                }
                next
            }
            None if !work_dir.keep => {
                let _ = tokio::fs::remove_dir_all(&work_dir.dir).await;
                None
            }
            None => None,
        };
        tasks.running.lock().expect("tasks lock").remove(&lease);
        if let Some((assignment, stop_rx)) = next {
            run_in(launcher.clone(), slot, assignment, stop_rx);
        }
        tasks.freed.notify_waiters();
    });
}

async fn heartbeat_loop(client: Client, worker: i64, every: Duration, tasks: Arc<Tasks>) {
    loop {
        tokio::time::sleep(every).await;
        let request = HeartbeatRequest {
            running: tasks.leases(),
        };
        match client.heartbeat(worker, &request).await {
            Ok(resp) => {
                for order in resp.stop {
                    tasks.stop(order.lease, order.why);
                }
            }
            // The poll loop notices too and re-registers; here just stop beating.
            Err(e) if is_worker_lost(&e) => return,
            Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
        }
    }
}

/// Stops every task, then deregisters: the server puts them back in the queue for another
/// worker (their retries permitting).
async fn shut_down(client: &Client, worker: i64, tasks: &Tasks, poll_seq: u64) {
    tracing::info!("shutting down: stopping {} task(s)", tasks.busy());
    tasks.stop_all(StopWhy::WorkerShutdown);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tasks.busy() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Tasks that ended before the stop must be recorded as ended before leaving: leaving puts
    // every unfinished task back in the queue, and these would run twice.
    let (reports, _) = tasks.reports.for_poll(std::time::Instant::now());
    if !reports.is_empty() {
        let last = PollRequest {
            free_slots: 0,
            call_room: 0,
            running: tasks.leases(),
            wait_ms: 0,
            reconcile: false,
            poll_seq: poll_seq + 1,
            reports,
            quiet: false,
        };
        if let Err(e) = client.poll(worker, &last).await {
            tracing::warn!(error = %e, "could not report the last task ends");
        }
    }
    tasks.runners.stop_all();
    let _ = std::fs::remove_dir_all(&tasks.run_dir);
    if let Err(e) = client.deregister_worker(worker).await {
        tracing::warn!(error = %e, "could not deregister; the server will declare this worker lost after its lease");
    }
}

/// This worker process's own directory for its slots' work directories, under the work
/// root: `run-<pid>`, emptied first. Those of worker processes that are gone (killed before
/// they could clean up) are removed.
fn prepare_run_dir(work_root: &Path) -> PathBuf {
    if let Ok(entries) = std::fs::read_dir(work_root) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix("run-"))
                .and_then(|p| p.parse::<i32>().ok())
            else {
                continue;
            };
            let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
            if !alive {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let dir = work_root.join(format!("run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}
