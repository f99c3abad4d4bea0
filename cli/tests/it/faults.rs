//! Faults at small scale: workers killed with `kill -9` in the middle of a batch. Checked from
//! the database: every job succeeds, none is lost, none completes twice.

use crate::bin;
use std::time::Duration;
use testkit::{Server, ServerOptions};

#[tokio::test(flavor = "multi_thread")]
async fn killing_a_quarter_of_the_workers_mid_batch_loses_and_duplicates_nothing() {
    let db = testkit::fresh_database().await;
    let server = Server::start(
        &bin(),
        &db.url,
        ServerOptions {
            lease_seconds: 2,
            ..Default::default()
        },
    );
    let mut workers: Vec<_> = (0..8)
        .map(|i| server.join(&format!("w{i}"), &["--slots", "2"]))
        .collect();
    let cli = server.cli();
    let n = 2000;
    let path = server.data_dir.path().join("jobs.jsonl");
    std::fs::write(
        &path,
        "{\"command\": [\"sh\", \"-c\", \"sleep 0.01\"]}\n".repeat(n),
    )
    .unwrap();
    cli.run(&["submit", "--batch", path.to_str().unwrap()])
        .success();

    let pool = sqlx::PgPool::connect_with(db.options.clone())
        .await
        .unwrap();
    let count = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    // Kill two of the eight once the batch is well under way.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while count("SELECT count(*) FROM jobs WHERE state = 'succeeded'").await < (n / 4) as i64 {
        assert!(
            std::time::Instant::now() < deadline,
            "the batch did not get going"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for w in workers.iter_mut().take(2) {
        w.kill_hard();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    loop {
        let open = count(
            "SELECT count(*) FROM jobs WHERE state NOT IN ('succeeded', 'failed', 'cancelled')",
        )
        .await;
        if open == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{open} jobs still open"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        count("SELECT count(*) FROM jobs").await,
        n as i64,
        "none lost, none added"
    );
    assert_eq!(
        count("SELECT count(*) FROM jobs WHERE state = 'succeeded'").await,
        n as i64,
        "every job succeeded"
    );
    let completed_twice = count(
        "SELECT count(*) FROM (SELECT job_id FROM events WHERE kind = 'succeeded' GROUP BY job_id HAVING count(*) > 1) d",
    )
    .await;
    assert_eq!(completed_twice, 0, "no job completed twice");
    let lost_workers = count("SELECT count(*) FROM workers WHERE state = 'lost'").await;
    assert_eq!(lost_workers, 2);
    let retried = count("SELECT count(*) FROM tasks WHERE attempt > 1").await;
    assert!(
        retried >= 1,
        "the killed workers were running jobs, which ran again elsewhere"
    );
    eprintln!("{retried} job(s) were retried after their worker was killed");
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_one_of_two_api_replicas_loses_no_accepted_job() {
    let db = testkit::fresh_database().await;
    let options = ServerOptions {
        lease_seconds: 3,
        ..Default::default()
    };
    let mut a = Server::start(&bin(), &db.url, options.clone());
    let b = Server::start(&bin(), &db.url, options);
    let both = format!("{},{}", a.url, b.url);
    let _worker = a.join_to(&both, "w", &["--slots", "4"]);
    let cli = testkit::Cli {
        url: both.clone(),
        ..a.cli()
    };
    let mut accepted: Vec<i64> = (0..10)
        .map(|_| cli.submit(&["--", "sh", "-c", "sleep 0.2; echo done"]))
        .collect();

    a.kill_hard();
    // The same client and worker carry on through the other replica.
    accepted.extend((0..10).map(|_| cli.submit(&["--", "sh", "-c", "sleep 0.2; echo done"])));
    for job in &accepted {
        let wait = cli.run(&["wait", &job.to_string(), "--timeout", "60"]);
        assert_eq!(wait.code, 0, "job {job}: {wait:?}");
    }
    let follow = cli
        .run(&["logs", &accepted[0].to_string(), "--follow"])
        .success();
    assert_eq!(
        follow.stdout.trim(),
        "done",
        "logs stream from the surviving replica"
    );
    let pool = sqlx::PgPool::connect_with(db.options.clone())
        .await
        .unwrap();
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'succeeded'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(jobs, 20, "every accepted job ran, none twice");
}
