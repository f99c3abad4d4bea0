//! The leader loop: one replica at a time holds the advisory lock and rescues lost workers.

use std::time::Duration;
use store::Store;
use store::leader::Leadership;

/// The sweep runs several times per lease so a lost worker is noticed soon after its lease
/// ends, but at least every 5 s and at most every 250 ms.
pub fn sweep_interval(lease: Duration) -> Duration {
    (lease / 4).clamp(Duration::from_millis(250), Duration::from_secs(5))
}

/// Runs forever: try to lead; while leading, sweep.
pub async fn run(store: Store, lease: Duration) {
    let interval = sweep_interval(lease);
    let mut leadership: Option<Leadership> = None;
    loop {
        if leadership.is_none() {
            match store.try_lead().await {
                Ok(Some(l)) => {
                    tracing::info!("this replica is now the leader (runs the sweeps)");
                    leadership = Some(l);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "leader election failed; retrying"),
            }
        }
        if let Some(l) = leadership.as_mut() {
            if !l.still_held().await {
                tracing::warn!("lost the leader connection; stepping down");
                leadership = None;
            } else {
                match store.rescue_lost_workers(lease).await {
                    Ok(lost) => {
                        for w in lost {
                            tracing::warn!(worker = w.id, name = %w.name, jobs = ?w.jobs, "worker lost; its jobs go back to the queue (attempts permitting)");
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "rescue sweep failed"),
                }
            }
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_runs_a_few_times_per_lease_within_bounds() {
        let cases = [(1, 250), (4, 1000), (10, 2500), (60, 5000)];
        for (lease_s, expect_ms) in cases {
            assert_eq!(
                sweep_interval(Duration::from_secs(lease_s)),
                Duration::from_millis(expect_ms)
            );
        }
    }
}
