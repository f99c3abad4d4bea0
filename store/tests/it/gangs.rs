//! Gangs: every node assigned at once or none, workers kept from small jobs while a gang
//! waits, racing gangs, and a gang stopped, failed or retried as one.

use domain::{Accelerator, JobSpec, Layout, Spread};
use std::collections::BTreeMap;
use std::time::Duration;
use store::{
    Completion, FinishReport, GangChoice, NewWorker, Placer, PollContext, Store, WorkerRow,
};

async fn store() -> Store {
    let db = testkit::fresh_database().await;
    Store::open(db.options).await.expect("open store")
}

async fn worker(store: &Store, name: &str, slots: u32) -> i64 {
    store
        .register_worker(NewWorker {
            name,
            labels: &BTreeMap::new(),
            slots,
            inventory: &domain::fixtures::inventory(name, &[]),
            version: "test",
        })
        .await
        .unwrap()
}

fn gang(nodes: u32) -> JobSpec {
    JobSpec {
        layout: Layout {
            nodes,
            procs_per_node: 1,
            spread: Spread::Zone,
        },
        ..domain::fixtures::job(Accelerator::Cpu)
    }
}

const CPU: &[Accelerator] = &[Accelerator::Cpu, Accelerator::Any];

/// A stand-in for the scheduler, which the store does not know: the gang goes on the first
/// workers (by id) with a free slot, else it keeps the first ones.
struct FirstFree;

impl Placer for FirstFree {
    fn fit(&mut self, _: &JobSpec, _: &[u32]) -> Option<Vec<u32>> {
        Some(vec![])
    }
    fn gangs_due(&mut self) -> bool {
        true
    }
    fn place_gang(&mut self, spec: &JobSpec, workers: &[WorkerRow], _: &[i64]) -> GangChoice {
        let n = spec.layout.nodes as usize;
        let free: Vec<i64> = workers
            .iter()
            .filter(|w| w.busy_slots < w.slots)
            .map(|w| w.id)
            .collect();
        if free.len() >= n {
            GangChoice::Assign {
                nodes: free[..n].iter().map(|w| (*w, vec![])).collect(),
                why: format!("{n} nodes, the first free"),
            }
        } else if workers.len() >= n {
            GangChoice::Reserve(workers[..n].iter().map(|w| w.id).collect())
        } else {
            GangChoice::Wait
        }
    }
}

async fn claim(store: &Store, worker: i64, free: u32, running: &[i64]) -> Vec<store::Claimed> {
    let poll = PollContext {
        seq: 0,
        running,
        redeliver: false,
    };
    store
        .claim_with(worker, CPU, free, false, poll, FirstFree)
        .await
        .unwrap()
}

async fn state_of(store: &Store, job: i64) -> domain::JobState {
    store.get_job(job).await.unwrap().state
}

fn ended(c: &store::Claimed, code: i32) -> FinishReport {
    FinishReport {
        task_id: c.task_id,
        attempt: c.attempt,
        completion: Completion {
            call: None,
            exit_code: Some(code),
            error: None,
        },
        started_age: Some(Duration::ZERO),
        age: Duration::ZERO,
    }
}

async fn task_states(store: &Store, job: i64) -> Vec<(String, Option<String>)> {
    sqlx::query_as("SELECT state, reason FROM tasks WHERE job_id = $1 ORDER BY task_index")
        .bind(job)
        .fetch_all(store.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_gang_is_assigned_on_all_its_nodes_at_once_and_each_worker_gets_its_own() {
    let store = store().await;
    let job = store.insert_job(&gang(2), None, None).await.unwrap();
    let (a, b) = (worker(&store, "a", 1).await, worker(&store, "b", 1).await);

    let mine = claim(&store, a, 1, &[]).await;
    assert_eq!(mine.len(), 1, "a's own node comes back in its claim");
    assert_eq!(state_of(&store, job).await, domain::JobState::Assigned);
    let nodes: Vec<(i32, Option<i64>, i32)> = sqlx::query_as(
        "SELECT task_index, worker_id, attempt FROM tasks WHERE job_id = $1 ORDER BY task_index",
    )
    .bind(job)
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(nodes, vec![(0, Some(a), 1), (1, Some(b), 1)]);

    // b was told (pushed): its next claim, even a plain one, hands its node out, once.
    let theirs = store
        .claim_batch(b, CPU, 1, false, PollContext::default(), |_, _| {
            Some(vec![])
        })
        .await
        .unwrap();
    assert_eq!(theirs.len(), 1);
    assert_eq!(theirs[0].job_id, job);
    assert_ne!(theirs[0].task_id, mine[0].task_id);
    let again = claim(&store, b, 1, &[theirs[0].task_id]).await;
    assert!(again.is_empty(), "{again:?}");
}

#[tokio::test]
async fn a_waiting_gang_keeps_its_workers_from_small_jobs_and_starts_when_they_are_free() {
    let store = store().await;
    let small = store
        .insert_job(&domain::fixtures::job(Accelerator::Cpu), None, None)
        .await
        .unwrap();
    let (a, b) = (worker(&store, "a", 1).await, worker(&store, "b", 1).await);
    let busy = store
        .claim_batch(a, CPU, 1, false, PollContext::default(), |_, _| {
            Some(vec![])
        })
        .await
        .unwrap();
    assert_eq!(busy[0].job_id, small);

    let job = store.insert_job(&gang(2), None, None).await.unwrap();
    // b is free, a is not: the gang keeps both.
    assert!(claim(&store, b, 1, &[]).await.is_empty());
    assert_eq!(state_of(&store, job).await, domain::JobState::Pending);
    // A stream of small jobs does not get past it on b.
    let later = store
        .insert_job(&domain::fixtures::job(Accelerator::Cpu), None, None)
        .await
        .unwrap();
    assert!(claim(&store, b, 1, &[]).await.is_empty());
    assert_eq!(state_of(&store, later).await, domain::JobState::Pending);

    // a ends its job: the gang starts at a's next claim, on both.
    store.finish_tasks(a, &[ended(&busy[0], 0)]).await.unwrap();
    let node = claim(&store, a, 1, &[]).await;
    assert_eq!(node.len(), 1);
    assert_eq!(node[0].job_id, job);
    assert_eq!(state_of(&store, job).await, domain::JobState::Assigned);
    let kept: Vec<Option<i64>> = sqlx::query_scalar("SELECT reserved_for FROM worker_heartbeats")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert!(kept.iter().all(Option::is_none), "{kept:?}");
}

#[tokio::test]
async fn racing_gangs_neither_deadlock_nor_hold_parts_of_the_fleet() {
    let store = store().await;
    let first = store.insert_job(&gang(2), None, None).await.unwrap();
    let second = store.insert_job(&gang(2), None, None).await.unwrap();
    let workers = [
        worker(&store, "a", 1).await,
        worker(&store, "b", 1).await,
        worker(&store, "c", 1).await,
    ];
    for _ in 0..3 {
        let (x, y, z) = tokio::join!(
            claim(&store, workers[0], 1, &[]),
            claim(&store, workers[1], 1, &[]),
            claim(&store, workers[2], 1, &[]),
        );
        let _ = (x, y, z);
    }
    let assigned: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT job_id, count(*) FROM tasks WHERE state = 'assigned' GROUP BY job_id",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(
        assigned,
        vec![(first, 2)],
        "the first gang whole, the second not at all"
    );
    assert_eq!(state_of(&store, second).await, domain::JobState::Pending);
}

#[tokio::test]
async fn a_failed_node_stops_the_whole_gang_and_the_job_names_it() {
    let store = store().await;
    let job = store.insert_job(&gang(2), None, None).await.unwrap();
    let (a, b) = (worker(&store, "a", 1).await, worker(&store, "b", 1).await);
    let on_a = claim(&store, a, 1, &[]).await.remove(0);
    let on_b = claim(&store, b, 1, &[]).await.remove(0);

    let lost = store.finish_tasks(b, &[ended(&on_b, 3)]).await.unwrap();
    assert!(lost.is_empty());
    let row = store.get_job(job).await.unwrap();
    assert_eq!(row.state, domain::JobState::Failed);
    assert_eq!(row.exit_code, Some(3));
    assert_eq!(
        row.reason.as_deref(),
        Some("node 1 (worker b): exited with code 3")
    );
    assert_eq!(
        task_states(&store, job).await,
        vec![
            (
                "failed".into(),
                Some("stopped: node 1 (worker b) failed first".into())
            ),
            (
                "failed".into(),
                Some("node 1 (worker b): exited with code 3".into())
            ),
        ]
    );
    // a is told to kill its node.
    let stop = store
        .stop_orders(a, &[(on_a.task_id, on_a.attempt)])
        .await
        .unwrap();
    assert_eq!(stop.len(), 1);
    // a's own end, coming afterwards, changes nothing.
    store.finish_tasks(a, &[ended(&on_a, 0)]).await.unwrap();
    assert_eq!(state_of(&store, job).await, domain::JobState::Failed);
}

#[tokio::test]
async fn the_job_succeeds_when_its_last_node_does() {
    let store = store().await;
    let job = store.insert_job(&gang(2), None, None).await.unwrap();
    let (a, b) = (worker(&store, "a", 1).await, worker(&store, "b", 1).await);
    let on_a = claim(&store, a, 1, &[]).await.remove(0);
    let on_b = claim(&store, b, 1, &[]).await.remove(0);
    store.finish_tasks(a, &[ended(&on_a, 0)]).await.unwrap();
    assert_ne!(state_of(&store, job).await, domain::JobState::Succeeded);
    store.finish_tasks(b, &[ended(&on_b, 0)]).await.unwrap();
    assert_eq!(state_of(&store, job).await, domain::JobState::Succeeded);
    let ends: i64 =
        sqlx::query_scalar("SELECT count(*) FROM events WHERE job_id = $1 AND kind = 'succeeded'")
            .bind(job)
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(ends, 1);
}

#[tokio::test]
async fn a_lost_node_sends_the_whole_gang_back_to_the_queue() {
    let store = store().await;
    let job = store.insert_job(&gang(2), None, None).await.unwrap();
    let (a, b) = (worker(&store, "a", 1).await, worker(&store, "b", 1).await);
    let on_a = claim(&store, a, 1, &[]).await.remove(0);
    claim(&store, b, 1, &[]).await;
    store
        .mark_running(a, on_a.task_id, on_a.attempt)
        .await
        .unwrap();
    // b goes silent; a keeps beating.
    tokio::time::sleep(Duration::from_millis(300)).await;
    store.heartbeat(a).await.unwrap();
    let lost = store
        .rescue_lost_workers(Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(lost.len(), 1);
    let row = store.get_job(job).await.unwrap();
    assert_eq!(row.state, domain::JobState::Pending);
    let reason = row.reason.unwrap();
    assert!(
        reason.starts_with("node 1 (worker b): worker b lost"),
        "{reason}"
    );
    assert!(
        reason.ends_with("retrying the whole gang (attempt 2 of 4)"),
        "{reason}"
    );
    assert!(
        task_states(&store, job)
            .await
            .iter()
            .all(|(s, _)| s == "pending")
    );
    // a's node is no longer a's.
    let stop = store
        .stop_orders(a, &[(on_a.task_id, on_a.attempt)])
        .await
        .unwrap();
    assert_eq!(stop.len(), 1);
}
