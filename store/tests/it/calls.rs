//! Remote function calls in the queue: queueable calls are taken ahead of free slots, in
//! queue order and only by workers with the caller's Python; their outcomes are kept.

use crate::{one_slot_worker, store};
use domain::{Accelerator, CallOutcome, CallSpec, Digest, JobSpec};
use std::time::Duration;
use store::{Completion, FinishReport, PollRound, Store};

fn call(python: &str) -> JobSpec {
    JobSpec {
        call: Some(CallSpec {
            function: Digest::parse(&"f".repeat(64)).unwrap(),
            args: "gA==".into(),
            python: python.into(),
        }),
        ..domain::fixtures::job(Accelerator::Any)
    }
}

const KINDS: &[Accelerator] = &[Accelerator::Cpu, Accelerator::Any];

/// One poll of `worker` with no free slot and room for `room` calls; the job ids it took.
async fn poll(
    store: &Store,
    worker: i64,
    seq: u64,
    room: u32,
    finished: &[FinishReport],
) -> Vec<i64> {
    let round = PollRound {
        worker_id: worker,
        seq,
        running: &[],
        finished,
        started: &[],
        reconcile: false,
        accelerators: KINDS,
        free_slots: 0,
        track_devices: false,
        call_room: room,
        call_python: Some("3.11"),
    };
    let outcome = store
        .poll_round(&round, |_: &JobSpec, _: &[u32]| Some(vec![]))
        .await
        .unwrap();
    outcome
        .claimed
        .unwrap()
        .into_iter()
        .map(|c| c.job_id)
        .collect()
}

#[tokio::test]
async fn calls_are_taken_ahead_of_free_slots_in_queue_order_and_only_with_the_callers_python() {
    let store = store().await;
    let worker = one_slot_worker(&store, "w").await;
    let mut ids = Vec::new();
    for spec in [
        call("3.11"),
        call("3.12"),
        call("3.11"),
        domain::fixtures::job(Accelerator::Cpu),
        call("3.11"),
    ] {
        ids.push(store.insert_job(&spec, None, None).await.unwrap());
    }
    // The 3.12 call is not this worker's; the command job stops the batch: the call behind
    // it waits until the job has left the queue.
    assert_eq!(poll(&store, worker, 1, 10, &[]).await, vec![ids[0], ids[2]]);
    assert_eq!(poll(&store, worker, 2, 10, &[]).await, Vec::<i64>::new());
    store.cancel_job(ids[3], "test").await.unwrap();
    assert_eq!(poll(&store, worker, 3, 10, &[]).await, vec![ids[4]]);

    // A call's outcome is kept with its end, for its caller.
    let outcome = CallOutcome {
        ok: true,
        payload: Some("gASVBQAAAAAAAABLKi4=".into()),
        error: None,
    };
    let task: i64 = store.job_nodes(ids[0]).await.unwrap()[0].task_id;
    let end = FinishReport {
        task_id: task,
        attempt: 1,
        completion: Completion {
            exit_code: Some(0),
            error: None,
            call: Some(outcome.clone()),
        },
        started_age: Some(Duration::from_millis(2)),
        age: Duration::ZERO,
    };
    poll(&store, worker, 4, 0, &[end]).await;
    let results = store.call_results(&[ids[0], ids[2]]).await.unwrap();
    assert_eq!(results.len(), 1, "only the finished call");
    assert_eq!(results[0].job_id, ids[0]);
    assert_eq!(results[0].state, "succeeded");
    assert_eq!(results[0].ok, Some(true));
    assert_eq!(results[0].payload, outcome.payload);
}
