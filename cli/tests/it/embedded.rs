//! `gpulayer up` with no database URL: its own PostgreSQL, kept across restarts and crashes.

use crate::bin;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Up {
    child: Child,
    ready: serde_json::Value,
}

fn start_up(data_dir: &std::path::Path, config: &std::path::Path) -> Up {
    let mut child = Command::new(bin())
        .args(["up", "--json", "--listen", "127.0.0.1:0", "--with-worker"])
        .arg("--data-dir")
        .arg(data_dir)
        .env("XDG_CONFIG_HOME", config)
        .env_remove("DATABASE_URL")
        .env_remove("GPULAYER_URL")
        .env_remove("GPULAYER_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let ready = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    Up { child, ready }
}

fn client(config: &std::path::Path, args: &[&str]) -> testkit::CliOutput {
    // No GPULAYER_URL/TOKEN: the CLI must find both in the config file `up` wrote.
    let out = Command::new(bin())
        .args(args)
        .env("XDG_CONFIG_HOME", config)
        .env_remove("GPULAYER_URL")
        .env_remove("GPULAYER_TOKEN")
        .output()
        .unwrap();
    testkit::CliOutput {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}

fn cluster_dir(data_dir: &std::path::Path) -> std::path::PathBuf {
    let cluster = std::fs::read_to_string(data_dir.join("postgres/cluster.path")).unwrap();
    std::path::PathBuf::from(cluster.trim())
}

fn pg_running(data_dir: &std::path::Path) -> bool {
    cluster_dir(data_dir).join("postmaster.pid").exists()
}

/// Waits until `pid` has exited (it is not our child; its parent reaps it).
fn wait_gone(pid: i32) {
    testkit::wait_for("the process to exit", Duration::from_secs(10), || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
        let zombie_or_gone = stat.is_none_or(|s| {
            s.rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next())
                == Some("Z")
        });
        zombie_or_gone.then_some(())
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn up_runs_its_own_postgres_and_keeps_jobs_across_a_crash_and_a_clean_stop() {
    let home = tempfile::tempdir().unwrap();
    let data_dir = home.path().join("data");
    let config = home.path().join("config");

    let mut first = start_up(&data_dir, &config);
    assert!(
        first.ready["admin_token"]
            .as_str()
            .unwrap()
            .starts_with("gla_")
    );
    let join_token = first.ready["join_token"].as_str().unwrap().to_string();
    let config_file = config.join("gpulayer/config.toml");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&config_file)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );

    let job = client(&config, &["submit", "--json", "--", "echo", "survives"])
        .success()
        .json()["id"]
        .as_i64()
        .unwrap();
    assert_eq!(client(&config, &["wait", &job.to_string()]).code, 0);

    // kill -9: PostgreSQL keeps running; the next `up` attaches to it.
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let mut second = start_up(&data_dir, &config);
    let logs = client(&config, &["logs", &job.to_string()]).success();
    assert_eq!(logs.stdout.trim(), "survives");

    // Now both die at once (a power cut): PostgreSQL leaves a stale pid file behind, and the
    // next `up` must start it again from that state.
    second.child.kill().unwrap();
    second.child.wait().unwrap();
    let pid_file = cluster_dir(&data_dir).join("postmaster.pid");
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_gone(pid);
    assert!(pid_file.exists(), "the pid file is stale, not removed");
    let mut second = start_up(&data_dir, &config);
    assert!(
        second.ready["admin_token"].is_null(),
        "the admin token is shown once"
    );
    assert_eq!(
        second.ready["join_token"],
        join_token.as_str(),
        "the join line stays the same"
    );
    let logs = client(&config, &["logs", &job.to_string()]).success();
    assert_eq!(logs.stdout.trim(), "survives");

    // SIGTERM: a clean stop takes PostgreSQL down with it.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(second.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = second.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!pg_running(&data_dir), "PostgreSQL stopped with `up`");

    // And starts again from its files.
    let mut third = start_up(&data_dir, &config);
    let again = client(&config, &["status", &job.to_string(), "--json"])
        .success()
        .json();
    assert_eq!(again["state"], "succeeded");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(third.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let _ = third.child.wait();
    std::thread::sleep(Duration::from_millis(10));
    remove_relocated_cluster(&data_dir);
}

/// Under root the cluster may live outside the data dir; don't leave it behind.
fn remove_relocated_cluster(data_dir: &std::path::Path) {
    if let Ok(path) = std::fs::read_to_string(data_dir.join("postgres/cluster.path")) {
        let path = std::path::Path::new(path.trim());
        if !path.starts_with(data_dir) {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_postgres_restart_mid_batch_is_ridden_out_by_every_component() {
    let home = tempfile::tempdir().unwrap();
    let data_dir = home.path().join("data");
    let config = home.path().join("config");
    let mut up = start_up(&data_dir, &config);
    let n = 200;
    let batch = home.path().join("jobs.jsonl");
    std::fs::write(
        &batch,
        "{\"command\": [\"sh\", \"-c\", \"sleep 0.02; echo ok\"]}\n".repeat(n),
    )
    .unwrap();
    client(&config, &["submit", "--batch", batch.to_str().unwrap()]).success();

    // The cluster `up` runs, attached to from here as `up` itself would.
    let pg = store::EmbeddedPostgres::start(&data_dir.join("postgres"))
        .await
        .unwrap();
    let options = pg.connect_options(store::embedded::EMBEDDED_DATABASE);
    let succeeded = |options: sqlx::postgres::PgConnectOptions| async move {
        let pool = sqlx::PgPool::connect_with(options).await.unwrap();
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'succeeded'")
            .fetch_one(&pool)
            .await
            .unwrap();
        pool.close().await;
        n
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while succeeded(options.clone()).await < 20 {
        assert!(
            std::time::Instant::now() < deadline,
            "the batch did not get going"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pg.stop().await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pg = store::EmbeddedPostgres::start(&data_dir.join("postgres"))
        .await
        .unwrap();

    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    while succeeded(options.clone()).await < n as i64 {
        assert!(
            std::time::Instant::now() < deadline,
            "the batch did not finish after the restart"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let pool = sqlx::PgPool::connect_with(options.clone()).await.unwrap();
    let twice: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT job_id FROM events WHERE kind = 'succeeded' GROUP BY job_id HAVING count(*) > 1) d",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(twice, 0, "no job completed twice");
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(jobs, n as i64);
    pool.close().await;
    // The API answers again, through the same `up`.
    let listed = client(&config, &["jobs", "--json", "--limit", "1"])
        .success()
        .json();
    assert_eq!(listed["jobs"][0]["state"], "succeeded");

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(up.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let _ = up.child.wait();
    let _ = pg.stop().await;
    remove_relocated_cluster(&data_dir);
}
