//! The worker loop: register, keep one long poll open, heartbeat, start tasks, obey stop
//! orders, and on shutdown stop everything and say goodbye.

use crate::runner::{TaskContext, TaskEnd, run_task};
use client::{Client, ClientError};
use domain::{Attempt, TaskId};
use protocol::{ErrorCode, HeartbeatRequest, PollRequest, RegisterRequest, StopWhy, TaskLease};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, watch};

/// How long the server may hold a poll when there is nothing to do.
const POLL_WAIT: Duration = Duration::from_secs(20);
/// Pause after a failed call before trying again, doubling up to the maximum.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub url: String,
    pub token: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub slots: u32,
    pub work_root: PathBuf,
    pub keep_work_dirs: bool,
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

#[derive(Default)]
struct Tasks {
    running: Mutex<HashMap<TaskLease, Running>>,
    /// Woken when a task ends, so a poll sent with no free slot can be re-sent with one.
    freed: Notify,
}

impl Tasks {
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
    let client = Client::new(&config.url, Some(&config.token))?;
    let tasks = Arc::new(Tasks::default());
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
    tokio::pin!(shutdown);
    let mut backoff = FIRST_BACKOFF;

    'register: loop {
        let request = RegisterRequest {
            name: config.name.clone(),
            labels: config.labels.clone(),
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

        let heartbeat = tokio::spawn(heartbeat_loop(
            client.clone(),
            worker,
            Duration::from_secs(reg.heartbeat_seconds.max(1)),
            tasks.clone(),
        ));

        // The first poll after registering, and every poll after one that failed, asks the
        // server to compare what it assigned with what we run (an answer may have been lost).
        let mut reconcile = true;
        loop {
            let free = (config.slots as usize).saturating_sub(tasks.busy()) as u32;
            let request = PollRequest {
                free_slots: free,
                running: tasks.leases(),
                wait_ms: POLL_WAIT.as_millis() as u64,
                reconcile,
            };
            let answer = tokio::select! {
                r = client.poll(worker, &request) => Some(r),
                // With no free slot the server claims nothing for this poll, so dropping it
                // to re-poll with the freed slot cannot lose an assignment.
                _ = tasks.freed.notified(), if free == 0 => None,
                _ = &mut shutdown => {
                    heartbeat.abort();
                    shut_down(&client, worker, &tasks).await;
                    return Ok(());
                }
            };
            let Some(answer) = answer else { continue };
            match answer {
                Ok(resp) => {
                    backoff = FIRST_BACKOFF;
                    reconcile = false;
                    for order in resp.stop {
                        tasks.stop(order.lease, order.why);
                    }
                    for assignment in resp.assignments {
                        start_task(
                            &shared_inventory,
                            &client,
                            worker,
                            &config,
                            &tasks,
                            assignment,
                        );
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

fn start_task(
    inventory: &Arc<domain::Inventory>,
    client: &Client,
    worker: i64,
    config: &WorkerConfig,
    tasks: &Arc<Tasks>,
    assignment: protocol::Assignment,
) {
    let lease = TaskLease {
        task: TaskId(assignment.task.0),
        attempt: Attempt(assignment.attempt.0),
    };
    let (stop_tx, stop_rx) = watch::channel(None);
    tasks
        .running
        .lock()
        .expect("tasks lock")
        .insert(lease, Running { stop: stop_tx });
    tracing::info!(
        job = assignment.job.0,
        task = lease.task.0,
        attempt = lease.attempt.0,
        "starting"
    );
    let ctx = TaskContext {
        client: client.clone(),
        worker,
        worker_name: config.name.clone(),
        assignment,
        work_root: config.work_root.clone(),
        keep_work_dirs: config.keep_work_dirs,
        inventory: inventory.clone(),
        stop: stop_rx,
    };
    let tasks = tasks.clone();
    tokio::spawn(async move {
        let end = run_task(ctx).await;
        if end == TaskEnd::LeaseLost {
            tracing::warn!(
                task = lease.task.0,
                "task stopped: it is no longer this worker's"
            );
        }
        tasks.running.lock().expect("tasks lock").remove(&lease);
        tasks.freed.notify_one();
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
async fn shut_down(client: &Client, worker: i64, tasks: &Tasks) {
    tracing::info!("shutting down: stopping {} task(s)", tasks.busy());
    tasks.stop_all(StopWhy::WorkerShutdown);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tasks.busy() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if let Err(e) = client.deregister_worker(worker).await {
        tracing::warn!(error = %e, "could not deregister; the server will declare this worker lost after its lease");
    }
}
