//! The queue's promises: one claim per task, fencing by attempt, rescue, cursors, cancels.

use domain::Accelerator;
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;
use store::{Completion, LogCursor, NewWorker, StopReason, Store};

async fn store() -> Store {
    let db = testkit::fresh_database().await;
    Store::open(db.options).await.expect("open store")
}

fn spec(accelerator: Accelerator) -> domain::JobSpec {
    domain::fixtures::job(accelerator)
}

async fn worker(store: &Store, name: &str, cuda: usize) -> i64 {
    store
        .register_worker(NewWorker {
            name,
            labels: &BTreeMap::new(),
            slots: 4,
            inventory: &domain::fixtures::cuda_inventory(name, cuda),
            version: "test",
        })
        .await
        .unwrap()
}

const CPU: &[Accelerator] = &[Accelerator::Cpu, Accelerator::Any];

/// A cpu job running on a fresh worker named `name`: (job, worker, its claimed task).
async fn running_job(store: &Store, name: &str) -> (i64, i64, store::Claimed) {
    running_job_with(store, name, &spec(Accelerator::Cpu)).await
}

/// `spec` running on a fresh worker named `name`: (job, worker, its claimed task).
async fn running_job_with(
    store: &Store,
    name: &str,
    spec: &domain::JobSpec,
) -> (i64, i64, store::Claimed) {
    let job = store.insert_job(spec, None, None).await.unwrap();
    let w = worker(store, name, 0).await;
    let c = store
        .claim_batch(w, CPU, 1, true, |_, _| Some(vec![]))
        .await
        .unwrap()
        .remove(0);
    store.mark_running(w, c.task_id, c.attempt).await.unwrap();
    (job, w, c)
}

/// Starts a claimed task and reports how it ended.
async fn run_to_end(store: &Store, worker: i64, c: &store::Claimed, done: &Completion) {
    store
        .mark_running(worker, c.task_id, c.attempt)
        .await
        .unwrap();
    store
        .complete_task(worker, c.task_id, c.attempt, done)
        .await
        .unwrap();
}

#[tokio::test]
async fn racing_workers_never_claim_the_same_task() {
    let store = store().await;
    let n_jobs = 60;
    for _ in 0..n_jobs {
        store
            .insert_job(&spec(Accelerator::Cpu), None, None)
            .await
            .unwrap();
    }
    let workers: Vec<i64> = futures_join(&store).await;
    let mut claimed = Vec::new();
    loop {
        let (a, b, c) = tokio::join!(
            store.claim_batch(workers[0], CPU, 3, true, |_, _| Some(vec![])),
            store.claim_batch(workers[1], CPU, 3, true, |_, _| Some(vec![])),
            store.claim_batch(workers[2], CPU, 3, true, |_, _| Some(vec![])),
        );
        let batch: Vec<_> = [a.unwrap(), b.unwrap(), c.unwrap()]
            .into_iter()
            .flatten()
            .collect();
        if batch.is_empty() {
            break;
        }
        claimed.extend(batch.into_iter().map(|c| c.task_id));
    }
    let unique: HashSet<i64> = claimed.iter().copied().collect();
    assert_eq!(claimed.len(), n_jobs, "every task claimed");
    assert_eq!(unique.len(), n_jobs, "no task claimed twice");
}

async fn futures_join(store: &Store) -> Vec<i64> {
    vec![
        worker(store, "a", 0).await,
        worker(store, "b", 0).await,
        worker(store, "c", 0).await,
    ]
}

#[tokio::test]
async fn a_claim_takes_no_more_than_the_free_slots_and_skips_what_does_not_fit() {
    let store = store().await;
    let cuda_job = store
        .insert_job(&spec(Accelerator::Cuda), None, None)
        .await
        .unwrap();
    for _ in 0..3 {
        store
            .insert_job(&spec(Accelerator::Cpu), None, None)
            .await
            .unwrap();
    }
    let cpu_worker = worker(&store, "cpu-only", 0).await;
    let got = store
        .claim_batch(cpu_worker, CPU, 2, true, |_, _| Some(vec![]))
        .await
        .unwrap();
    assert_eq!(got.len(), 2);
    assert!(
        got.iter().all(|c| c.job_id != cuda_job),
        "a cpu worker never gets a cuda job"
    );
    assert!(got.iter().all(|c| c.attempt == 1));

    // The scheduler's verdict is final even when the kind matches.
    let gpu_worker = worker(&store, "gpu", 1).await;
    let kinds = [Accelerator::Cpu, Accelerator::Cuda, Accelerator::Any];
    let refused = store
        .claim_batch(gpu_worker, &kinds, 4, true, |_, _| None)
        .await
        .unwrap();
    assert!(refused.is_empty());
    let got = store
        .claim_batch(gpu_worker, &kinds, 4, true, |_, _| Some(vec![]))
        .await
        .unwrap();
    let jobs: HashSet<i64> = got.iter().map(|c| c.job_id).collect();
    assert!(jobs.contains(&cuda_job));
    assert_eq!(got.len(), 2, "the cuda job and the last cpu job");
}

#[tokio::test]
async fn the_claim_reads_the_claimable_index_in_order_without_sorting() {
    let store = store().await;
    let mut conn = store.pool().acquire().await.unwrap();
    // On a near-empty table any plan is cheap; take the scans that ignore order off the
    // table so the test asks the real question: can the index serve the claim's ORDER BY?
    for setting in ["SET enable_seqscan = off", "SET enable_bitmapscan = off"] {
        sqlx::query(setting).execute(&mut *conn).await.unwrap();
    }
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN SELECT id FROM tasks WHERE state = 'pending' AND accelerator = ANY('{cpu,any}')
         ORDER BY priority DESC, id LIMIT 8 FOR UPDATE SKIP LOCKED",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let plan = plan.join("\n");
    assert!(plan.contains("tasks_claimable"), "{plan}");
    assert!(!plan.contains("Sort"), "{plan}");
}

#[tokio::test]
async fn a_stale_attempt_can_neither_log_nor_complete() {
    let store = store().await;
    let (job, w, c) = running_job(&store, "w").await;
    let other = worker(&store, "other", 0).await;

    let wrong_attempt = store
        .append_logs(w, c.task_id, c.attempt + 1, &[(0, 1, "x".into())])
        .await;
    assert!(matches!(
        wrong_attempt,
        Err(store::StoreError::LeaseLost { .. })
    ));
    let wrong_worker = store
        .complete_task(
            other,
            c.task_id,
            c.attempt,
            &Completion {
                exit_code: Some(0),
                error: None,
            },
        )
        .await;
    assert!(matches!(
        wrong_worker,
        Err(store::StoreError::LeaseLost { .. })
    ));

    let done = Completion {
        exit_code: Some(3),
        error: None,
    };
    store
        .complete_task(w, c.task_id, c.attempt, &done)
        .await
        .unwrap();
    store
        .complete_task(w, c.task_id, c.attempt, &done)
        .await
        .expect("a retried completion is a no-op");
    let row = store.get_job(job).await.unwrap();
    assert_eq!(row.state, domain::JobState::Failed);
    assert_eq!(row.exit_code, Some(3));
    assert_eq!(row.reason.as_deref(), Some("exited with code 3"));
}

#[tokio::test]
async fn a_lost_workers_job_is_retried_elsewhere_and_the_old_attempt_is_fenced_off() {
    let store = store().await;
    let (job, w, first) = running_job(&store, "flaky").await;
    assert!(
        store
            .rescue_lost_workers(Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lost = store
        .rescue_lost_workers(Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(lost.len(), 1);
    assert_eq!(lost[0].jobs, vec![job]);
    let row = store.get_job(job).await.unwrap();
    assert_eq!(row.state, domain::JobState::Pending);
    let reason = row.reason.unwrap();
    assert!(
        reason.starts_with("worker flaky lost: no heartbeat for"),
        "{reason}"
    );
    assert!(reason.ends_with("; retrying (attempt 2 of 4)"), "{reason}");

    // The lost worker may not come back for it: no heartbeat, no claim, no completion.
    assert!(matches!(
        store.heartbeat(w).await,
        Err(store::StoreError::WorkerLost(_))
    ));
    assert!(matches!(
        store
            .claim_batch(w, CPU, 1, true, |_, _| Some(vec![]))
            .await,
        Err(store::StoreError::WorkerLost(_))
    ));
    let healthy = worker(&store, "healthy", 0).await;
    let second = store
        .claim_batch(healthy, CPU, 1, true, |_, _| Some(vec![]))
        .await
        .unwrap()
        .remove(0);
    assert_eq!((second.task_id, second.attempt), (first.task_id, 2));
    let ok = Completion {
        exit_code: Some(0),
        error: None,
    };
    let stale = store
        .complete_task(w, first.task_id, first.attempt, &ok)
        .await;
    assert!(
        matches!(stale, Err(store::StoreError::LeaseLost { .. })),
        "{stale:?}"
    );
    run_to_end(&store, healthy, &second, &ok).await;
    assert_eq!(
        store.get_job(job).await.unwrap().state,
        domain::JobState::Succeeded
    );
}

#[tokio::test]
async fn a_job_out_of_attempts_fails_with_the_reason() {
    let store = store().await;
    let no_retries = domain::JobSpec {
        retries: Some(0),
        ..spec(Accelerator::Cpu)
    };
    let job = store.insert_job(&no_retries, None, None).await.unwrap();
    let w = worker(&store, "flaky", 0).await;
    let c = store
        .claim_batch(w, CPU, 1, true, |_, _| Some(vec![]))
        .await
        .unwrap()
        .remove(0);
    store.mark_running(w, c.task_id, c.attempt).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    store
        .rescue_lost_workers(Duration::from_millis(200))
        .await
        .unwrap();
    let row = store.get_job(job).await.unwrap();
    assert_eq!(row.state, domain::JobState::Failed);
    assert!(
        row.reason
            .as_deref()
            .unwrap()
            .ends_with("; no attempts left (1 of 1 used)"),
        "{:?}",
        row.reason
    );
}

#[tokio::test]
async fn a_failing_job_is_retried_only_when_it_asked() {
    let store = store().await;
    let retried = domain::JobSpec {
        retries: Some(1),
        retry_failed: true,
        ..spec(Accelerator::Cpu)
    };
    let job = store.insert_job(&retried, None, None).await.unwrap();
    let w = worker(&store, "w", 0).await;
    let exit_1 = Completion {
        exit_code: Some(1),
        error: None,
    };
    for attempt in 1..=2 {
        let c = store
            .claim_batch(w, CPU, 1, true, |_, _| Some(vec![]))
            .await
            .unwrap()
            .remove(0);
        assert_eq!(c.attempt, attempt);
        store.mark_running(w, c.task_id, c.attempt).await.unwrap();
        store
            .complete_task(w, c.task_id, c.attempt, &exit_1)
            .await
            .unwrap();
    }
    let row = store.get_job(job).await.unwrap();
    assert_eq!(
        row.state,
        domain::JobState::Failed,
        "two attempts, both failed"
    );
    assert_eq!(row.exit_code, Some(1));
    // Without --retry-failed a failure is final at once.
    let once = store
        .insert_job(&spec(Accelerator::Cpu), None, None)
        .await
        .unwrap();
    let c = store
        .claim_batch(w, CPU, 1, true, |_, _| Some(vec![]))
        .await
        .unwrap()
        .remove(0);
    run_to_end(&store, w, &c, &exit_1).await;
    assert_eq!(
        store.get_job(once).await.unwrap().state,
        domain::JobState::Failed
    );
}

#[tokio::test]
async fn log_cursors_skip_nothing_and_repeat_nothing() {
    let store = store().await;
    let job = store
        .insert_job(&spec(Accelerator::Cpu), None, None)
        .await
        .unwrap();
    let w = worker(&store, "w", 0).await;
    let c = store
        .claim_batch(w, CPU, 1, true, |_, _| Some(vec![]))
        .await
        .unwrap()
        .remove(0);
    let batch = |from: i64, to: i64| {
        (from..to)
            .map(|i| (i, 1i16, format!("line {i}")))
            .collect::<Vec<_>>()
    };
    store
        .append_logs(w, c.task_id, c.attempt, &batch(0, 5))
        .await
        .unwrap();
    store
        .append_logs(w, c.task_id, c.attempt, &batch(3, 8))
        .await
        .unwrap();

    let first = store.read_logs(job, &[], 4).await.unwrap();
    assert_eq!(
        first.iter().map(|l| l.seq).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    let cursor = LogCursor {
        task_id: c.task_id,
        attempt: c.attempt,
        seq: 3,
    };
    let rest = store.read_logs(job, &[cursor], 100).await.unwrap();
    assert_eq!(
        rest.iter().map(|l| l.seq).collect::<Vec<_>>(),
        vec![4, 5, 6, 7]
    );
    assert_eq!(rest[3].text, "line 7");

    store
        .append_logs(w, c.task_id, c.attempt, &[(8, 2, "nul\0byte".into())])
        .await
        .unwrap();
    let nul = store
        .read_logs(job, &[LogCursor { seq: 7, ..cursor }], 10)
        .await
        .unwrap();
    assert_eq!(nul[0].text, "nul\u{FFFD}byte");
}

#[tokio::test]
async fn cancelling_a_running_job_becomes_a_stop_order_for_its_worker() {
    let store = store().await;
    let (job, w, c) = running_job(&store, "w").await;
    assert!(
        store
            .stop_orders(w, &[(c.task_id, c.attempt)])
            .await
            .unwrap()
            .is_empty()
    );

    let previous = store.cancel_job(job, "admin").await.unwrap();
    assert_eq!(previous, domain::JobState::Running);
    let orders = store
        .stop_orders(w, &[(c.task_id, c.attempt), (999_999, 1)])
        .await
        .unwrap();
    assert_eq!(
        orders,
        vec![
            (c.task_id, c.attempt, StopReason::Cancelled),
            (999_999, 1, StopReason::LeaseLost)
        ]
    );
    // The process's exit after the kill is recorded, but the job stays cancelled.
    store
        .complete_task(
            w,
            c.task_id,
            c.attempt,
            &Completion {
                exit_code: Some(143),
                error: None,
            },
        )
        .await
        .unwrap();
    let row = store.get_job(job).await.unwrap();
    assert_eq!(row.state, domain::JobState::Cancelled);
    assert_eq!(
        store.cancel_job(job, "admin").await.unwrap(),
        domain::JobState::Cancelled
    );
}

#[tokio::test]
async fn a_repeated_submit_with_the_same_key_creates_one_job() {
    let store = store().await;
    let a = store
        .insert_job(&spec(Accelerator::Cpu), None, Some("key-1"))
        .await
        .unwrap();
    let b = store
        .insert_job(&spec(Accelerator::Cpu), None, Some("key-1"))
        .await
        .unwrap();
    let c = store
        .insert_job(&spec(Accelerator::Cpu), None, Some("key-2"))
        .await
        .unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[tokio::test]
async fn several_replicas_migrating_at_once_all_succeed() {
    let db = testkit::fresh_database().await;
    let (a, b, c) = tokio::join!(
        Store::open(db.options.clone()),
        Store::open(db.options.clone()),
        Store::open(db.options.clone())
    );
    a.unwrap();
    b.unwrap();
    c.unwrap();
}

#[tokio::test]
async fn only_one_replica_leads_at_a_time_and_leadership_passes_on() {
    let store = store().await;
    let first = store
        .try_lead()
        .await
        .unwrap()
        .expect("the first try leads");
    assert!(store.try_lead().await.unwrap().is_none());
    first.resign().await;
    assert!(store.try_lead().await.unwrap().is_some());
}

#[tokio::test]
async fn tasks_a_worker_does_not_list_go_back_to_the_queue() {
    let store = store().await;
    let lost_answer = store
        .insert_job(&spec(Accelerator::Cpu), None, None)
        .await
        .unwrap();
    let forgotten = store
        .insert_job(&spec(Accelerator::Cpu), None, None)
        .await
        .unwrap();
    let kept = store
        .insert_job(&spec(Accelerator::Cpu), None, None)
        .await
        .unwrap();
    let w = worker(&store, "w", 0).await;
    let claimed = store
        .claim_batch(w, CPU, 3, true, |_, _| Some(vec![]))
        .await
        .unwrap();
    let task_of = |job: i64| claimed.iter().find(|c| c.job_id == job).unwrap().clone();
    for job in [forgotten, kept] {
        let c = task_of(job);
        store.mark_running(w, c.task_id, c.attempt).await.unwrap();
    }

    // The worker's next poll lists only `kept`: the first answer never arrived, and it lost
    // track of `forgotten` (its process is gone).
    let touched = store
        .reconcile_worker_tasks(w, &[task_of(kept).task_id])
        .await
        .unwrap();
    assert_eq!(touched, 2);
    assert_eq!(
        store.get_job(lost_answer).await.unwrap().state,
        domain::JobState::Pending
    );
    let retried = store.get_job(forgotten).await.unwrap();
    assert_eq!(retried.state, domain::JobState::Pending);
    assert_eq!(
        retried.reason.as_deref(),
        Some("the worker no longer runs this task; retrying (attempt 2 of 4)")
    );
    assert_eq!(
        store.get_job(kept).await.unwrap().state,
        domain::JobState::Running
    );

    let again = store
        .claim_batch(w, CPU, 1, true, |_, _| Some(vec![]))
        .await
        .unwrap();
    assert_eq!(again[0].job_id, lost_answer);
    assert_eq!(
        again[0].attempt, 2,
        "a new attempt, so the lost one is fenced off"
    );
}

#[tokio::test]
async fn cancels_racing_claims_neither_deadlock_nor_run_a_cancelled_job() {
    let store = store().await;
    let mut jobs = Vec::new();
    for _ in 0..40 {
        jobs.push(
            store
                .insert_job(&spec(Accelerator::Cpu), None, None)
                .await
                .unwrap(),
        );
    }
    let w = worker(&store, "w", 0).await;
    let claims = async {
        let mut claimed = Vec::new();
        for _ in 0..20 {
            claimed.extend(
                store
                    .claim_batch(w, CPU, 2, true, |_, _| Some(vec![]))
                    .await
                    .expect("claim"),
            );
        }
        claimed
    };
    let cancels = async {
        for job in &jobs {
            store.cancel_job(*job, "test").await.expect("cancel");
        }
    };
    let (claimed, ()) = tokio::join!(claims, cancels);
    for c in &claimed {
        // Whatever was claimed before its cancel is now a stop order, never a job to start.
        let start = store.mark_running(w, c.task_id, c.attempt).await;
        assert!(
            matches!(start, Err(store::StoreError::LeaseLost { .. })),
            "{start:?}"
        );
    }
    for job in jobs {
        assert_eq!(
            store.get_job(job).await.unwrap().state,
            domain::JobState::Cancelled
        );
    }
}

#[tokio::test]
async fn a_claim_sees_the_devices_running_tasks_hold_and_records_its_own() {
    let store = store().await;
    for _ in 0..3 {
        store
            .insert_job(&spec(Accelerator::Cuda), None, None)
            .await
            .unwrap();
    }
    let w = worker(&store, "two-gpus", 2).await;
    let kinds = [Accelerator::Cpu, Accelerator::Cuda, Accelerator::Any];
    // Lowest free of devices 0 and 1, as the scheduler would without a topology.
    let lowest_free =
        |_: &domain::JobSpec, busy: &[u32]| (0..2).find(|d| !busy.contains(d)).map(|d| vec![d]);
    let first = store
        .claim_batch(w, &kinds, 3, true, lowest_free)
        .await
        .unwrap();
    assert_eq!(
        first.iter().map(|c| c.devices.clone()).collect::<Vec<_>>(),
        vec![vec![0], vec![1]]
    );
    assert!(
        store
            .claim_batch(w, &kinds, 1, true, lowest_free)
            .await
            .unwrap()
            .is_empty(),
        "both devices are held"
    );
    assert_eq!(store.list_workers().await.unwrap()[0].busy_devices.len(), 2);

    let done = &first[1];
    store
        .mark_running(w, done.task_id, done.attempt)
        .await
        .unwrap();
    store
        .complete_task(
            w,
            done.task_id,
            done.attempt,
            &store::Completion {
                exit_code: Some(0),
                error: None,
            },
        )
        .await
        .unwrap();
    let third = store
        .claim_batch(w, &kinds, 1, true, lowest_free)
        .await
        .unwrap();
    assert_eq!(
        third[0].devices,
        vec![1],
        "a finished task's device is free again"
    );
    assert_eq!(
        store.get_job(third[0].job_id).await.unwrap().devices,
        vec![1]
    );
}

#[tokio::test]
async fn a_batch_inserts_every_job_once_and_a_retried_batch_inserts_nothing() {
    let store = store().await;
    let n = 5000;
    let specs: Vec<domain::JobSpec> = (0..n)
        .map(|i| domain::JobSpec {
            name: Some(domain::JobName::parse(&format!("shard-{i}")).unwrap()),
            ..spec(Accelerator::Cpu)
        })
        .collect();
    let keys: Vec<Option<String>> = (0..n).map(|i| Some(format!("batch-1:{i}"))).collect();
    let ids = store.insert_jobs(&specs, None, &keys).await.unwrap();
    assert_eq!(ids.len(), n);
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids follow the input order"
    );
    let again = store.insert_jobs(&specs, None, &keys).await.unwrap();
    assert_eq!(again, ids, "a retried batch returns the same jobs");
    let (jobs, tasks): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM tasks WHERE state = 'pending')",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!((jobs, tasks), (n as i64, n as i64));
    let row = store.get_job(ids[4321]).await.unwrap();
    assert_eq!(row.spec.name.unwrap().as_str(), "shard-4321");
}

#[tokio::test]
async fn a_reused_idempotency_key_with_a_different_job_is_a_conflict() {
    let store = store().await;
    store
        .insert_job(&spec(Accelerator::Cpu), None, Some("k"))
        .await
        .unwrap();
    let other = store
        .insert_job(&spec(Accelerator::Any), None, Some("k"))
        .await;
    assert!(
        matches!(&other, Err(store::StoreError::Conflict(m)) if m.contains("different spec")),
        "{other:?}"
    );
}

#[tokio::test]
async fn higher_priorities_are_claimed_first_and_ties_in_submit_order() {
    let store = store().await;
    let with_priority = |priority| domain::JobSpec {
        priority,
        ..spec(Accelerator::Cpu)
    };
    let low = store
        .insert_job(&with_priority(-1), None, None)
        .await
        .unwrap();
    let normal_1 = store
        .insert_job(&with_priority(0), None, None)
        .await
        .unwrap();
    let urgent = store
        .insert_job(&with_priority(10), None, None)
        .await
        .unwrap();
    let normal_2 = store
        .insert_job(&with_priority(0), None, None)
        .await
        .unwrap();
    let w = worker(&store, "w", 0).await;
    let mut order = Vec::new();
    for _ in 0..4 {
        let c = store
            .claim_batch(w, CPU, 1, false, |_, _| Some(vec![]))
            .await
            .unwrap();
        order.push(c[0].job_id);
    }
    assert_eq!(order, vec![urgent, normal_1, normal_2, low]);
}

#[tokio::test]
async fn finished_jobs_past_their_retention_are_pruned_and_nothing_else() {
    let store = store().await;
    let (old, w, c) = running_job(&store, "w").await;
    let ok = Completion {
        exit_code: Some(0),
        error: None,
    };
    store
        .append_logs(w, c.task_id, c.attempt, &[(0, 1, "line".into())])
        .await
        .unwrap();
    store
        .set_outputs(w, c.task_id, c.attempt, "outputs/old.tar.gz", 10)
        .await
        .unwrap();
    store
        .complete_task(w, c.task_id, c.attempt, &ok)
        .await
        .unwrap();
    let recent = store
        .insert_job(&spec(Accelerator::Cpu), None, None)
        .await
        .unwrap();
    sqlx::query("UPDATE jobs SET finished_at = now() - interval '2 days' WHERE id = $1")
        .bind(old)
        .execute(store.pool())
        .await
        .unwrap();
    let keys = store
        .prune_finished(Duration::from_secs(86_400), 1000)
        .await
        .unwrap();
    assert_eq!(keys, vec!["outputs/old.tar.gz".to_string()]);
    assert!(matches!(
        store.get_job(old).await,
        Err(store::StoreError::NotFound(_))
    ));
    assert_eq!(
        store.get_job(recent).await.unwrap().state,
        domain::JobState::Pending,
        "unfinished jobs stay"
    );
    assert!(
        store
            .prune_finished(Duration::from_secs(86_400), 1000)
            .await
            .unwrap()
            .is_empty()
    );
}
