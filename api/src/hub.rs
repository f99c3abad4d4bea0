//! One LISTEN connection per replica, fanned out to every request that waits for a change
//! (long polls, log followers). A notification is only a hint: waiters re-read the tables.
//! After the listener reconnects, everyone is woken, since hints sent meanwhile are lost.

use std::time::Duration;
use store::{Store, Wakeup};
use tokio::sync::broadcast;

/// Waiters that fall this far behind get `Lagged` and simply re-read everything.
const HUB_CAPACITY: usize = 1024;

/// How long to wait before reconnecting a failed listener.
const RECONNECT_DELAY: Duration = Duration::from_millis(500);

#[derive(Debug, Clone)]
pub struct Hub {
    tx: broadcast::Sender<Wakeup>,
}

impl Hub {
    /// Starts the listener task for `store`.
    pub fn start(store: Store) -> Self {
        let (tx, _) = broadcast::channel(HUB_CAPACITY);
        let hub = Self { tx };
        let sender = hub.tx.clone();
        tokio::spawn(async move {
            loop {
                match store.listen().await {
                    Ok(mut listener) => {
                        // Anything sent before this LISTEN began is unseen: wake everyone.
                        let _ = sender.send(Wakeup::Reconnected);
                        loop {
                            match listener.recv().await {
                                Ok(w) => {
                                    let _ = sender.send(w);
                                }
                                Err(e) => {
                                    tracing::warn!(error = %e, "LISTEN connection failed; reconnecting");
                                    break;
                                }
                            }
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot LISTEN; retrying"),
                }
                tokio::time::sleep(RECONNECT_DELAY).await;
            }
        });
        hub
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Wakeup> {
        self.tx.subscribe()
    }
}

/// Waits until a wakeup satisfying `relevant` arrives (or the receiver lagged, or the listener
/// reconnected, after which anything may have changed).
pub async fn wait_for(rx: &mut broadcast::Receiver<Wakeup>, relevant: impl Fn(&Wakeup) -> bool) {
    loop {
        match rx.recv().await {
            Ok(Wakeup::Reconnected) => return,
            Ok(w) if relevant(&w) => return,
            Ok(_) => continue,
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            // The hub never closes while the server runs; if it did, don't spin.
            Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}
