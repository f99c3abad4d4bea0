//! The dashboard's links, sessions and job filters.

use crate::store;
use std::time::Duration;
use store::{JobFilter, Role};

#[tokio::test]
async fn a_login_link_works_once_and_a_session_ends_with_its_token() {
    let store = store().await;
    let token = store
        .insert_token("viewer", Role::ReadOnly, "glr_secret")
        .await
        .unwrap();
    store
        .create_dashboard_link(token, "code-1", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        store.redeem_dashboard_link("code-1").await.unwrap(),
        Some(token)
    );
    assert_eq!(
        store.redeem_dashboard_link("code-1").await.unwrap(),
        None,
        "used up"
    );
    assert_eq!(
        store.redeem_dashboard_link("never-made").await.unwrap(),
        None
    );
    store
        .create_dashboard_link(token, "stale", Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        store.redeem_dashboard_link("stale").await.unwrap(),
        None,
        "expired"
    );

    store
        .create_dashboard_session(token, "session-secret", "csrf-1", Duration::from_secs(3600))
        .await
        .unwrap();
    let session = store
        .find_dashboard_session("session-secret")
        .await
        .unwrap()
        .expect("a live session");
    assert_eq!((session.token.id, session.csrf.as_str()), (token, "csrf-1"));
    assert!(
        store
            .find_dashboard_session("other")
            .await
            .unwrap()
            .is_none()
    );

    // A second admin token, so that revoking this read-only one is allowed either way.
    store
        .insert_token("root", Role::Admin, "gla_x")
        .await
        .unwrap();
    store.revoke_token(token).await.unwrap();
    assert!(
        store
            .find_dashboard_session("session-secret")
            .await
            .unwrap()
            .is_none(),
        "a revoked token's sessions end with it"
    );
}

#[tokio::test]
async fn the_job_list_filters_by_state_submitter_and_page() {
    let store = store().await;
    let alice = store
        .insert_token("alice", Role::Submitter, "gls_a")
        .await
        .unwrap();
    let bob = store
        .insert_token("bob", Role::Submitter, "gls_b")
        .await
        .unwrap();
    let spec = domain::fixtures::job(domain::Accelerator::Cpu);
    let mut ids = Vec::new();
    for i in 0..10 {
        let by = if i % 2 == 0 { alice } else { bob };
        ids.push(store.insert_job(&spec, Some(by), None).await.unwrap());
    }
    let list = |f: JobFilter| {
        let store = store.clone();
        async move {
            store
                .list_jobs(&f)
                .await
                .unwrap()
                .into_iter()
                .map(|j| j.id)
                .collect::<Vec<_>>()
        }
    };
    let by_alice = list(JobFilter {
        submitted_by: Some("alice".into()),
        limit: 3,
        ..Default::default()
    })
    .await;
    assert_eq!(by_alice, vec![ids[8], ids[6], ids[4]]);
    let next = list(JobFilter {
        submitted_by: Some("alice".into()),
        before: Some(ids[4]),
        limit: 3,
        ..Default::default()
    })
    .await;
    assert_eq!(next, vec![ids[2], ids[0]]);
    let nobody = list(JobFilter {
        submitted_by: Some("carol".into()),
        limit: 50,
        ..Default::default()
    })
    .await;
    assert!(nobody.is_empty());
    let pending = list(JobFilter {
        state: Some(domain::JobState::Pending),
        worker: Some("no-such-worker".into()),
        limit: 50,
        ..Default::default()
    })
    .await;
    assert!(
        pending.is_empty(),
        "no job ran on a worker that does not exist"
    );
    let all_pending = list(JobFilter {
        state: Some(domain::JobState::Pending),
        limit: 50,
        ..Default::default()
    })
    .await;
    assert_eq!(all_pending.len(), 10);
}

#[tokio::test]
async fn a_rare_state_is_looked_for_a_window_at_a_time_and_the_page_says_how_far() {
    let store = store().await;
    let spec = domain::fixtures::job(domain::Accelerator::Cpu);
    let mut ids = Vec::new();
    for _ in 0..30 {
        ids.push(store.insert_job(&spec, None, None).await.unwrap());
    }
    store.cancel_job(ids[4], "test").await.unwrap();
    let cancelled = |before: Option<i64>| JobFilter {
        state: Some(domain::JobState::Cancelled),
        before,
        limit: 3,
        ..Default::default()
    };
    let first = store
        .list_jobs_page(&cancelled(None), Some(10))
        .await
        .unwrap();
    assert!(first.jobs.is_empty());
    assert_eq!(
        first.scanned_down_to,
        Some(ids[20]),
        "looked at the newest ten"
    );
    let second = store
        .list_jobs_page(&cancelled(first.scanned_down_to), Some(10))
        .await
        .unwrap();
    assert!(second.jobs.is_empty());
    assert_eq!(second.scanned_down_to, Some(ids[10]));
    let third = store
        .list_jobs_page(&cancelled(second.scanned_down_to), Some(10))
        .await
        .unwrap();
    assert_eq!(
        third.jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![ids[4]]
    );
    // Without a window the same filter reads until it has its page or the jobs run out.
    let whole = store.list_jobs_page(&cancelled(None), None).await.unwrap();
    assert_eq!(whole.jobs.len(), 1);
    assert_eq!(whole.scanned_down_to, None);
    // Unfiltered pages are plain keyset pages and never report a window.
    let plain = store
        .list_jobs_page(
            &JobFilter {
                limit: 5,
                before: Some(ids[10]),
                ..Default::default()
            },
            Some(10),
        )
        .await
        .unwrap();
    assert_eq!(
        plain.jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
        ids[5..10].iter().rev().copied().collect::<Vec<_>>()
    );
    assert_eq!(plain.scanned_down_to, None);
}

#[tokio::test]
async fn the_queue_is_sampled_with_what_waits_and_a_running_task_has_a_span() {
    let store = store().await;
    let spec = domain::fixtures::job(domain::Accelerator::Cpu);
    for _ in 0..3 {
        store.insert_job(&spec, None, None).await.unwrap();
    }
    let since = chrono::Utc::now() - chrono::Duration::minutes(1);
    store.record_queue_sample().await.unwrap();
    let samples = store.queue_samples(since).await.unwrap();
    assert_eq!(samples.len(), 1);
    assert_eq!(
        (samples[0].pending, samples[0].running, samples[0].finished),
        (3, 0, 0)
    );
    let (_, w, c) = crate::queue::running_job(&store, "w").await;
    let spans = store.recent_task_spans(since, 100).await.unwrap();
    assert_eq!(spans.len(), 1, "only the running task has started");
    assert_eq!((spans[0].worker_id, spans[0].job_id), (w, c.job_id));
    assert_eq!(spans[0].state, "running");
}
