//! The leader loop: one replica at a time holds the advisory lock, rescues lost workers,
//! samples the queue for the dashboard and prunes finished jobs past their retention.

use crate::server::AppState;
use object_store::ObjectStoreExt;
use std::time::Duration;
use store::leader::Leadership;

/// How often the leader prunes, and how many jobs at most per round: small rounds keep each
/// delete short, so it never holds back vacuum or blocks claims for long.
const PRUNE_EVERY: Duration = Duration::from_secs(60);
const PRUNE_BATCH: i64 = 5_000;
/// How often the leader counts the queue for the dashboard's pictures.
const SAMPLE_EVERY: Duration = Duration::from_secs(15);

/// The sweep runs several times per lease so a lost worker is noticed soon after its lease
/// ends, but at least every 5 s and at most every 250 ms.
pub fn sweep_interval(lease: Duration) -> Duration {
    (lease / 4).clamp(Duration::from_millis(250), Duration::from_secs(5))
}

/// Runs forever: try to lead; while leading, sweep.
pub async fn run(app: AppState) {
    let (store, lease) = (app.store.clone(), app.config.lease);
    let interval = sweep_interval(lease);
    let mut last_prune = tokio::time::Instant::now();
    let mut last_sample: Option<tokio::time::Instant> = None;
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
                if last_sample.is_none_or(|at| at.elapsed() >= SAMPLE_EVERY) {
                    last_sample = Some(tokio::time::Instant::now());
                    if let Err(e) = store.record_queue_sample().await {
                        tracing::warn!(error = %e, "sampling the queue failed");
                    }
                }
                if last_prune.elapsed() >= PRUNE_EVERY {
                    last_prune = tokio::time::Instant::now();
                    prune(&app).await;
                }
            }
        }
        tokio::time::sleep(interval).await;
    }
}

async fn prune(app: &AppState) {
    match app
        .store
        .prune_finished(app.config.retention, PRUNE_BATCH)
        .await
    {
        Ok(keys) => {
            for key in &keys {
                if let Err(e) = app
                    .objects
                    .delete(&object_store::path::Path::from(key.as_str()))
                    .await
                {
                    tracing::warn!(key, error = %e, "could not delete pruned outputs");
                }
            }
            if !keys.is_empty() {
                tracing::info!(
                    outputs = keys.len(),
                    "pruned finished jobs past their retention"
                );
            }
        }
        Err(e) => tracing::warn!(error = %e, "pruning failed"),
    }
    // Expired dashboard sessions and login links go too (they are refused anyway).
    if let Err(e) = app.store.prune_dashboard_sessions().await {
        tracing::warn!(error = %e, "pruning dashboard sessions failed");
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
