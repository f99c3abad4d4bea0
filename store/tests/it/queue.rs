//! The queue's promises: one claim per task, fencing by attempt, rescue, cursors, cancels.

use domain::Accelerator;
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;
use store::{Completion, LogCursor, NewWorker, PollContext, StopReason, Store};

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

/// A claim of up to `free` cpu tasks for `worker`'s poll number `seq` (which lists `running`
/// and, with `redeliver`, asks for what an earlier answer may have lost).
async fn claim_for_poll(
    store: &Store,
    worker: i64,
    free: u32,
    seq: u64,
    running: &[i64],
    redeliver: bool,
) -> store::Result<Vec<store::Claimed>> {
    let poll = PollContext {
        seq,
        running,
        redeliver,
    };
    store
        .claim_batch(worker, CPU, free, true, poll, |_, _| Some(vec![]))
        .await
}

/// A cpu job running on a fresh worker named `name`: (job, worker, its claimed task).
pub(crate) async fn running_job(store: &Store, name: &str) -> (i64, i64, store::Claimed) {
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
        .claim_batch(w, CPU, 1, true, PollContext::default(), |_, _| Some(vec![]))
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
    // What each worker runs, as its polls list it.
    let mut held: [Vec<i64>; 3] = Default::default();
    loop {
        let claim = |i: usize, running: &[i64]| {
            let running = running.to_vec();
            let store = store.clone();
            let w = workers[i];
            async move {
                let poll = PollContext {
                    seq: 0,
                    running: &running,
                    redeliver: false,
                };
                store
                    .claim_batch(w, CPU, 3, true, poll, |_, _| Some(vec![]))
                    .await
                    .unwrap()
            }
        };
        let (a, b, c) = tokio::join!(claim(0, &held[0]), claim(1, &held[1]), claim(2, &held[2]));
        if a.is_empty() && b.is_empty() && c.is_empty() {
            break;
        }
        for (i, batch) in [a, b, c].into_iter().enumerate() {
            held[i].extend(batch.iter().map(|c| c.task_id));
            claimed.extend(batch.into_iter().map(|c| c.task_id));
        }
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
        .claim_batch(cpu_worker, CPU, 2, true, PollContext::default(), |_, _| {
            Some(vec![])
        })
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
        .claim_batch(
            gpu_worker,
            &kinds,
            4,
            true,
            PollContext::default(),
            |_, _| None,
        )
        .await
        .unwrap();
    assert!(refused.is_empty());
    let got = store
        .claim_batch(
            gpu_worker,
            &kinds,
            4,
            true,
            PollContext::default(),
            |_, _| Some(vec![]),
        )
        .await
        .unwrap();
    let jobs: HashSet<i64> = got.iter().map(|c| c.job_id).collect();
    assert!(jobs.contains(&cuda_job));
    assert_eq!(got.len(), 2, "the cuda job and the last cpu job");
}

#[tokio::test]
async fn the_hot_statements_keep_their_plans_even_with_stale_statistics() {
    let store = store().await;
    // The state a queue is in after a burst: analysed while empty, then thousands pending.
    // The planner then believes a handful of rows match and would rather read them all and
    // sort; the claims must still take the ordered index and stop early. And the reports,
    // which find tasks by id, must never read a worker's whole history.
    sqlx::query("ANALYZE tasks")
        .execute(store.pool())
        .await
        .unwrap();
    let specs = vec![spec(Accelerator::Cpu); 3000];
    store
        .insert_jobs(&specs, None, &vec![None; specs.len()])
        .await
        .unwrap();
    let plans = store
        .hot_plans(&[Accelerator::Cpu, Accelerator::Any])
        .await
        .unwrap();
    assert_eq!(plans.len(), 7);
    for (name, plan) in &plans {
        assert!(!plan.contains("Seq Scan on tasks"), "{name}: {plan}");
        assert!(!plan.contains("tasks_by_worker"), "{name}: {plan}");
        if name == "calls_ahead" {
            assert!(plan.contains("tasks_pending_calls"), "{name}: {plan}");
            assert!(plan.contains("tasks_pending_others"), "{name}: {plan}");
            assert!(!plan.contains("Sort"), "{name}: {plan}");
        } else if name.starts_with("claim") {
            assert!(
                plan.contains("Index Scan using tasks_claimable"),
                "{name}: {plan}"
            );
            assert!(!plan.contains("Sort"), "{name}: {plan}");
            assert!(!plan.contains("Bitmap"), "{name}: {plan}");
        } else {
            assert!(plan.contains("tasks_pkey"), "{name}: {plan}");
        }
    }
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
                call: None,
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
        call: None,
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
            .claim_batch(w, CPU, 1, true, PollContext::default(), |_, _| Some(vec![]))
            .await,
        Err(store::StoreError::WorkerLost(_))
    ));
    let healthy = worker(&store, "healthy", 0).await;
    let second = store
        .claim_batch(healthy, CPU, 1, true, PollContext::default(), |_, _| {
            Some(vec![])
        })
        .await
        .unwrap()
        .remove(0);
    assert_eq!((second.task_id, second.attempt), (first.task_id, 2));
    let ok = Completion {
        call: None,
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
        .claim_batch(w, CPU, 1, true, PollContext::default(), |_, _| Some(vec![]))
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
        call: None,
        exit_code: Some(1),
        error: None,
    };
    for attempt in 1..=2 {
        let c = store
            .claim_batch(w, CPU, 1, true, PollContext::default(), |_, _| Some(vec![]))
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
        .claim_batch(w, CPU, 1, true, PollContext::default(), |_, _| Some(vec![]))
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
        .claim_batch(w, CPU, 1, true, PollContext::default(), |_, _| Some(vec![]))
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

    let first = store.read_logs(job, &[], 4, None).await.unwrap();
    assert_eq!(
        first.iter().map(|l| l.seq).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    let cursor = LogCursor {
        task_id: c.task_id,
        attempt: c.attempt,
        seq: 3,
    };
    let rest = store.read_logs(job, &[cursor], 100, None).await.unwrap();
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
        .read_logs(job, &[LogCursor { seq: 7, ..cursor }], 10, None)
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
                call: None,
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
async fn an_assignment_whose_answer_was_lost_is_handed_out_again_by_the_next_poll() {
    let store = store().await;
    let lost_answer = store
        .insert_job(&spec(Accelerator::Cpu), None, None)
        .await
        .unwrap();
    let w = worker(&store, "w", 0).await;
    let first = claim_for_poll(&store, w, 2, 1, &[], true).await.unwrap();
    assert_eq!(first.len(), 1);
    let queued_later = store
        .insert_job(&spec(Accelerator::Cpu), None, None)
        .await
        .unwrap();

    // That answer never arrived: the next poll lists nothing and gets the same attempt back,
    // then new work for its other slot.
    let again = claim_for_poll(&store, w, 2, 2, &[], true).await.unwrap();
    let got: Vec<(i64, i32)> = again.iter().map(|c| (c.job_id, c.attempt)).collect();
    assert_eq!(got, vec![(lost_answer, 1), (queued_later, 1)]);

    // Once the worker runs them, they are not handed out a third time.
    let running: Vec<i64> = again.iter().map(|c| c.task_id).collect();
    let third = claim_for_poll(&store, w, 1, 3, &running, true)
        .await
        .unwrap();
    assert!(third.is_empty(), "{third:?}");
}

#[tokio::test]
async fn a_poll_the_worker_has_replaced_claims_nothing() {
    let store = store().await;
    let job = store
        .insert_job(&spec(Accelerator::Cpu), None, None)
        .await
        .unwrap();
    let w = worker(&store, "w", 0).await;
    let claim = |seq: u64| claim_for_poll(&store, w, 1, seq, &[], true);
    assert_eq!(claim(5).await.unwrap()[0].job_id, job);
    // The newest poll so far is 5: a late claim for poll 4 must not hand out the job.
    assert!(matches!(
        claim(4).await,
        Err(store::StoreError::PollSuperseded(_))
    ));
    assert_eq!(
        store.get_job(job).await.unwrap().state,
        domain::JobState::Assigned,
        "assigned by poll 5 only"
    );
    let redelivered = claim(6).await.unwrap();
    assert_eq!(redelivered[0].job_id, job);
}

#[tokio::test]
async fn running_tasks_a_worker_no_longer_lists_go_back_to_the_queue() {
    let store = store().await;
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
        .claim_batch(w, CPU, 2, true, PollContext::default(), |_, _| Some(vec![]))
        .await
        .unwrap();
    let task_of = |job: i64| claimed.iter().find(|c| c.job_id == job).unwrap().clone();
    for job in [forgotten, kept] {
        let c = task_of(job);
        store.mark_running(w, c.task_id, c.attempt).await.unwrap();
    }

    // The worker lost track of `forgotten` (its process is gone, its end never came).
    let touched = store
        .fail_forgotten_tasks(w, &[task_of(kept).task_id])
        .await
        .unwrap();
    assert_eq!(touched, 1);
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
        .claim_batch(w, CPU, 1, true, PollContext::default(), |_, _| Some(vec![]))
        .await
        .unwrap();
    assert_eq!(again[0].job_id, forgotten);
    assert_eq!(
        again[0].attempt, 2,
        "a new attempt, so the lost one is fenced off"
    );
}

#[tokio::test]
async fn a_batch_of_ends_finishes_each_job_once_dated_by_the_workers_ages() {
    let store = store().await;
    let specs = vec![spec(Accelerator::Cpu); 3];
    let jobs = store
        .insert_jobs(&specs, None, &vec![None; 3])
        .await
        .unwrap();
    let w = worker(&store, "w", 0).await;
    let mut claimed = store
        .claim_batch(w, CPU, 3, true, PollContext::default(), |_, _| Some(vec![]))
        .await
        .unwrap();
    claimed.sort_by_key(|c| c.job_id);
    // Reports date events by age, never before the assignment: let the ages fit.
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The first one's start was reported on its own; the others' starts travel with their
    // ends (short jobs), as the worker sends them.
    let reports_began = std::time::Instant::now();
    store
        .record_starts(
            w,
            &[store::StartReport {
                task_id: claimed[0].task_id,
                attempt: 1,
                age: Duration::from_millis(60),
            }],
        )
        .await
        .unwrap();
    let end = |c: &store::Claimed, code: i32| store::FinishReport {
        task_id: c.task_id,
        attempt: c.attempt,
        completion: Completion {
            call: None,
            exit_code: Some(code),
            error: None,
        },
        started_age: Some(Duration::from_millis(40)),
        age: Duration::from_millis(20),
    };
    let stale = store::FinishReport {
        attempt: 7,
        ..end(&claimed[2], 0)
    };
    let batch = vec![
        end(&claimed[0], 0),
        end(&claimed[1], 2),
        stale.clone(),
        end(&claimed[2], 0),
    ];
    let lost = store.finish_tasks(w, &batch).await.unwrap();
    // The first job ran from 60 ms before its start report to 20 ms before this end: as
    // long as the two calls were apart, plus 40 ms (a loaded machine stretches that).
    let reports_took_ms = reports_began.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(lost, vec![(claimed[2].task_id, 7)]);
    let repeated = store.finish_tasks(w, &batch).await.unwrap();
    assert_eq!(
        repeated,
        vec![(claimed[2].task_id, 7)],
        "repeats are no-ops"
    );

    let states: Vec<domain::JobState> = futures_util::future::join_all(jobs.iter().map(|&j| {
        let store = store.clone();
        async move { store.get_job(j).await.unwrap().state }
    }))
    .await;
    use domain::JobState::{Failed, Succeeded};
    assert_eq!(states, vec![Succeeded, Failed, Succeeded]);
    // Every job: assigned, one running, one end, in that order; times from the ages.
    for &job in &jobs {
        let kinds: Vec<String> = sqlx::query_scalar(
            "SELECT kind FROM events WHERE job_id = $1 AND kind <> 'submitted' ORDER BY id",
        )
        .bind(job)
        .fetch_all(store.pool())
        .await
        .unwrap();
        assert_eq!(kinds.len(), 3, "{kinds:?}");
        assert_eq!(&kinds[..2], ["assigned", "running"], "{kinds:?}");
        let (started_ms, ran_ms): (f64, f64) = sqlx::query_as(
            "SELECT extract(epoch FROM now() - t.started_at)::float8 * 1000,
                    extract(epoch FROM t.finished_at - t.started_at)::float8 * 1000
             FROM tasks t WHERE t.job_id = $1",
        )
        .bind(job)
        .fetch_one(store.pool())
        .await
        .unwrap();
        assert!(started_ms >= 40.0, "{started_ms}");
        let longest = reports_took_ms + 40.0 + 10.0;
        assert!(
            (15.0..longest).contains(&ran_ms),
            "{ran_ms} (at most {longest})"
        );
    }
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
                    .claim_batch(w, CPU, 2, true, PollContext::default(), |_, _| Some(vec![]))
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
        .claim_batch(w, &kinds, 3, true, PollContext::default(), lowest_free)
        .await
        .unwrap();
    assert_eq!(
        first.iter().map(|c| c.devices.clone()).collect::<Vec<_>>(),
        vec![vec![0], vec![1]]
    );
    let both: Vec<i64> = first.iter().map(|c| c.task_id).collect();
    let poll = PollContext {
        seq: 0,
        running: &both,
        redeliver: false,
    };
    assert!(
        store
            .claim_batch(w, &kinds, 1, true, poll, lowest_free)
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
                call: None,
                exit_code: Some(0),
                error: None,
            },
        )
        .await
        .unwrap();
    let still_running = [first[0].task_id];
    let poll = PollContext {
        seq: 0,
        running: &still_running,
        redeliver: false,
    };
    let third = store
        .claim_batch(w, &kinds, 1, true, poll, lowest_free)
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
    let (mut order, mut running) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        let poll = PollContext {
            seq: 0,
            running: &running,
            redeliver: false,
        };
        let c = store
            .claim_batch(w, CPU, 1, false, poll, |_, _| Some(vec![]))
            .await
            .unwrap();
        order.push(c[0].job_id);
        running.push(c[0].task_id);
    }
    assert_eq!(order, vec![urgent, normal_1, normal_2, low]);
}

#[tokio::test]
async fn finished_jobs_past_their_retention_are_pruned_and_nothing_else() {
    let store = store().await;
    let (old, w, c) = running_job(&store, "w").await;
    let ok = Completion {
        call: None,
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
