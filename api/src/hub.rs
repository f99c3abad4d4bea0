//! One LISTEN connection per replica, fanned out to every request that waits for a change
//! (long polls, log followers). A notification is only a hint: waiters re-read the tables.
//! After the listener reconnects, everyone is woken, since hints sent meanwhile are lost.
//!
//! Two fan-outs, so nobody is woken for what it does not wait for: workers' long polls hear
//! of new work, stop orders and gang nodes pushed to them; log followers hear of their jobs'
//! lines and ends (one of those per job start, line batch and end: far too many to wake
//! every held poll with).

use std::time::Duration;
use store::{Channel, Store, Wakeup};
use tokio::sync::broadcast;

/// Waiters that fall this far behind get `Lagged` and simply re-read everything.
const HUB_CAPACITY: usize = 1024;

/// How long to wait before reconnecting a failed listener.
const RECONNECT_DELAY: Duration = Duration::from_millis(500);

#[derive(Debug, Clone)]
pub struct Hub {
    /// Work and stop orders, for workers' long polls.
    workers: broadcast::Sender<Wakeup>,
    /// Log lines and job ends, for log followers.
    jobs: broadcast::Sender<Wakeup>,
}

impl Hub {
    /// Starts the listener task for `store`.
    pub fn start(store: Store) -> Self {
        let hub = Self {
            workers: broadcast::channel(HUB_CAPACITY).0,
            jobs: broadcast::channel(HUB_CAPACITY).0,
        };
        let (workers, jobs) = (hub.workers.clone(), hub.jobs.clone());
        tokio::spawn(async move {
            loop {
                match store.listen().await {
                    Ok(mut listener) => {
                        // Anything sent before this LISTEN began is unseen: wake everyone.
                        let _ = workers.send(Wakeup::Reconnected);
                        let _ = jobs.send(Wakeup::Reconnected);
                        loop {
                            match listener.recv().await {
                                Ok(
                                    w @ (Wakeup::Notified {
                                        channel: Channel::Work | Channel::Stop,
                                        ..
                                    }
                                    | Wakeup::Pushed(_)),
                                ) => {
                                    let _ = workers.send(w);
                                }
                                Ok(w) => {
                                    let _ = jobs.send(w);
                                }
                                // The replica is shutting down: nothing to listen for.
                                Err(_) if store.pool().is_closed() => return,
                                Err(e) => {
                                    tracing::warn!(error = %e, "LISTEN connection failed; reconnecting");
                                    break;
                                }
                            }
                        }
                    }
                    Err(_) if store.pool().is_closed() => return,
                    Err(e) => tracing::warn!(error = %e, "cannot LISTEN; retrying"),
                }
                tokio::time::sleep(RECONNECT_DELAY).await;
            }
        });
        hub
    }

    /// Hints for a worker's long poll: new work, stop orders.
    pub fn subscribe_work(&self) -> broadcast::Receiver<Wakeup> {
        self.workers.subscribe()
    }

    /// Hints for log followers: new lines, jobs that changed state.
    pub fn subscribe_jobs(&self) -> broadcast::Receiver<Wakeup> {
        self.jobs.subscribe()
    }
}

/// Waits until a wakeup satisfying `relevant` arrives, and returns it; `Reconnected` also
/// when the receiver lagged or the listener reconnected, after which anything may have
/// changed.
pub async fn wait_for(
    rx: &mut broadcast::Receiver<Wakeup>,
    relevant: impl Fn(&Wakeup) -> bool,
) -> Wakeup {
    loop {
        match rx.recv().await {
            Ok(Wakeup::Reconnected) => return Wakeup::Reconnected,
            Ok(w) if relevant(&w) => return w,
            Ok(_) => continue,
            Err(broadcast::error::RecvError::Lagged(_)) => return Wakeup::Reconnected,
            // The hub never closes while the server runs; if it did, don't spin.
            Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}
