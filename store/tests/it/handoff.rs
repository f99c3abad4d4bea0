//! A job handed to a worker's held poll by its submit: inserted and claimed in one
//! transaction, in queue order, and never for a poll the worker has replaced.

use crate::{one_slot_worker, store};
use domain::{Accelerator, JobSpec, JobState};
use store::{PollRound, Store};

const KINDS: &[Accelerator] = &[Accelerator::Cpu, Accelerator::Any];

fn round(worker: i64, seq: u64) -> PollRound<'static> {
    PollRound {
        worker_id: worker,
        seq,
        running: &[],
        finished: &[],
        started: &[],
        reconcile: false,
        accelerators: KINDS,
        free_slots: 1,
        track_devices: false,
        call_room: 0,
        call_python: None,
    }
}

fn any_fits(_: &JobSpec, _: &[u32]) -> Option<Vec<u32>> {
    Some(vec![])
}

/// Submits `spec` to the held poll `seq` of `worker`: the job's id and the ids of the jobs
/// the claim took (None: the claim could not run).
async fn submit_to(
    store: &Store,
    worker: i64,
    seq: u64,
    spec: &JobSpec,
) -> (i64, Option<Vec<i64>>) {
    let (id, claimed) = store
        .insert_job_claiming(spec, None, None, &round(worker, seq), any_fits)
        .await
        .unwrap();
    (
        id,
        claimed.map(|c| c.into_iter().map(|c| c.job_id).collect()),
    )
}

#[tokio::test]
async fn a_job_handed_to_a_held_poll_is_assigned_by_its_submit_after_older_work_and_never_to_a_replaced_poll()
 {
    let store = store().await;
    let worker = one_slot_worker(&store, "w").await;
    let job = domain::fixtures::job(Accelerator::Cpu);

    // Nothing waits: the submit's own job is assigned before the submit returns.
    let (a, took) = submit_to(&store, worker, 1, &job).await;
    assert_eq!(took, Some(vec![a]));
    assert_eq!(store.get_job(a).await.unwrap().state, JobState::Assigned);

    // An older job waits that the worker can run: the claim takes it, in queue order, and the
    // new one waits its turn.
    let older = store.insert_job(&job, None, None).await.unwrap();
    let (b, took) = submit_to(&store, worker, 2, &job).await;
    assert_eq!(took, Some(vec![older]));
    assert_eq!(store.get_job(b).await.unwrap().state, JobState::Pending);

    // The worker has sent a newer poll: the held one claims nothing, and the job waits.
    let newer = store.poll_round(&round(worker, 5), any_fits).await.unwrap();
    assert_eq!(
        newer.claimed.unwrap().len(),
        1,
        "the newer poll takes the waiting job"
    );
    let (c, took) = submit_to(&store, worker, 4, &job).await;
    assert_eq!(took, None);
    assert_eq!(store.get_job(c).await.unwrap().state, JobState::Pending);
}
