//! A job's whole trip: submit, stage, run, logs, outputs, exit codes, cancel, lost workers.

use crate::server;
use std::collections::HashSet;
use std::time::{Duration, Instant};
use testkit::{ServerOptions, wait_for};

fn state_of(cli: &testkit::Cli, job: i64) -> String {
    cli.status(job)["state"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_hello_example_streams_its_logs_and_returns_its_outputs() {
    let server = server(ServerOptions::default()).await;
    let _worker = server.join("w1", &[]);
    let cli = server.cli();
    let out = crate::submit_hello(&cli);
    assert!(
        out.stdout.contains("hello from GPUlayer job"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("line 5 of 5"),
        "the last line arrives: {}",
        out.stdout
    );
    let jobs = cli
        .run(&["jobs", "--json", "--limit", "1"])
        .success()
        .json();
    let job = jobs["jobs"][0]["id"].as_i64().unwrap();
    assert_eq!(jobs["jobs"][0]["state"], "succeeded");

    let dest = server.data_dir.path().join("downloaded");
    let got = cli
        .run(&[
            "download",
            &job.to_string(),
            dest.to_str().unwrap(),
            "--json",
        ])
        .success()
        .json();
    let files: Vec<&str> = got["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert_eq!(
        files,
        vec!["greeting.txt".to_string(), format!("hello-{job}.txt")]
    );
    let hello_txt = std::fs::read_to_string(dest.join(format!("hello-{job}.txt"))).unwrap();
    assert!(
        hello_txt.starts_with(&format!("hello from job {job}")),
        "{hello_txt}"
    );

    // Logs read afterwards are the same lines, in order.
    let logs = cli.run(&["logs", &job.to_string()]).success();
    let lines: Vec<&str> = logs
        .stdout
        .lines()
        .filter(|l| l.starts_with("line "))
        .collect();
    assert_eq!(
        lines,
        [
            "line 1 of 5",
            "line 2 of 5",
            "line 3 of 5",
            "line 4 of 5",
            "line 5 of 5"
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_job_passes_its_exit_code_to_wait_and_follow() {
    let server = server(ServerOptions::default()).await;
    let _worker = server.join("w1", &[]);
    let cli = server.cli();
    let follow = cli.run(&[
        "submit",
        "--follow",
        "--",
        "sh",
        "-c",
        "echo out; echo oops >&2; exit 7",
    ]);
    assert_eq!(follow.code, 7, "{follow:?}");
    assert!(follow.stdout.contains("out"));
    assert!(follow.stderr.contains("oops"));
    assert!(
        follow.stderr.contains("exited with code 7"),
        "{}",
        follow.stderr
    );

    let job = cli.submit(&["--", "python3", "-c", "import sys; sys.exit(42)"]);
    let wait = cli.run(&["wait", &job.to_string()]);
    assert_eq!(wait.code, 42, "{wait:?}");
    let ok = cli.submit(&[
        "--env",
        "GREETING=hi there",
        "--",
        "sh",
        "-c",
        "test \"$GREETING\" = 'hi there' && test -n \"$GPULAYER_JOB_ID\"",
    ]);
    assert_eq!(cli.run(&["wait", &ok.to_string()]).code, 0);
}

/// Whether a process still runs. A killed process whose parent died stays a zombie until
/// PID 1 reaps it; it runs no more, so it counts as gone.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().next());
            state != Some("Z")
        }
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_kills_the_whole_process_group_within_a_second() {
    let server = server(ServerOptions::default()).await;
    let _worker = server.join("w1", &[]);
    let cli = server.cli();
    let pids = server.data_dir.path().join("pids");
    let script = "sleep 600 & echo $! >> $PIDS; (sleep 601 & echo $! >> $PIDS; wait) & echo $$ >> $PIDS; echo ready; wait";
    let job = cli.submit(&[
        "--env",
        &format!("PIDS={}", pids.display()),
        "--",
        "sh",
        "-c",
        script,
    ]);
    let pids: Vec<i32> = wait_for("the job's three processes", Duration::from_secs(30), || {
        let text = std::fs::read_to_string(&pids).ok()?;
        let found: Vec<i32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        (found.len() == 3).then_some(found)
    });
    assert!(pids.iter().all(|p| alive(*p)));

    let started = Instant::now();
    let out = cli.run(&["cancel", &job.to_string()]).success();
    assert!(out.stdout.contains("cancelled job"), "{}", out.stdout);
    wait_for(
        "every process of the group to be gone",
        Duration::from_secs(1),
        || pids.iter().all(|p| !alive(*p)).then_some(()),
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(state_of(&cli, job), "cancelled");
    let wait = cli.run(&["wait", &job.to_string()]);
    assert_eq!(wait.code, 130);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_without_retries_fails_when_its_worker_is_killed() {
    let server = server(ServerOptions {
        lease_seconds: 2,
        ..Default::default()
    })
    .await;
    let mut worker = server.join("doomed", &[]);
    let cli = server.cli();
    let pidfile = server.data_dir.path().join("pid");
    let job = cli.submit(&[
        "--retries",
        "0",
        "--",
        "sh",
        "-c",
        &format!("echo $$ > {}; exec sleep 600", pidfile.display()),
    ]);
    wait_for("the job to run", Duration::from_secs(30), || {
        (state_of(&cli, job) == "running").then_some(())
    });
    worker.kill_hard();

    let status = wait_for("the job to fail", Duration::from_secs(20), || {
        let s = cli.status(job);
        (s["state"] == "failed").then_some(s)
    });
    let reason = status["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("worker doomed lost: no heartbeat for"),
        "{reason}"
    );
    assert!(
        reason.ends_with("no attempts left (1 of 1 used)"),
        "{reason}"
    );
    let workers = cli.run(&["workers", "--json"]).success().json();
    assert_eq!(workers["workers"][0]["state"], "lost");

    // The orphaned process is the test's to clean up (the worker died without a word).
    if let Some(pid) = std::fs::read_to_string(&pidfile)
        .ok()
        .and_then(|p| p.trim().parse::<i32>().ok())
    {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_workers_never_run_the_same_job() {
    let server = server(ServerOptions::default()).await;
    let _a = server.join("a", &["--slots", "3"]);
    let _b = server.join("b", &["--slots", "3"]);
    let cli = server.cli();
    let ledger = server.data_dir.path().join("ledger");
    let n = 24;
    let jobs: Vec<i64> = (0..n)
        .map(|_| {
            cli.submit(&[
                "--env",
                &format!("LEDGER={}", ledger.display()),
                "--",
                "sh",
                "-c",
                "echo $GPULAYER_JOB_ID >> $LEDGER",
            ])
        })
        .collect();
    for job in &jobs {
        assert_eq!(cli.run(&["wait", &job.to_string()]).code, 0);
    }
    let runs: Vec<i64> = std::fs::read_to_string(&ledger)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(runs.len(), n, "each job ran exactly once: {runs:?}");
    assert_eq!(
        runs.iter().copied().collect::<HashSet<_>>(),
        jobs.iter().copied().collect::<HashSet<_>>()
    );
    let listed = cli
        .run(&["jobs", "--json", "--limit", "100"])
        .success()
        .json();
    let workers: HashSet<String> = listed["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["worker"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(workers.len(), 2, "both workers took work: {workers:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn jobs_submitted_before_any_worker_joins_run_once_one_does() {
    let server = server(ServerOptions::default()).await;
    let cli = server.cli();
    let job = cli.submit(&["--", "true"]);
    assert_eq!(state_of(&cli, job), "pending");
    let _worker = server.join("late", &[]);
    assert_eq!(
        cli.run(&["wait", &job.to_string(), "--timeout", "30"]).code,
        0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_openapi_document_is_served_and_health_endpoints_answer() {
    let server = server(ServerOptions::default()).await;
    let doc = crate::openapi(&server).await;
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/v1/jobs",
        "/v1/jobs/{id}/logs/ws",
        "/v1/workers/{worker}/poll",
        "/v1/blobs/{digest}",
    ] {
        assert!(
            paths.contains_key(p),
            "{p} missing from {:?}",
            paths.keys().collect::<Vec<_>>()
        );
    }
    for p in ["/healthz", "/readyz"] {
        let status = server
            .http()
            .get(format!("{}{p}", server.url))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 200, "{p}");
    }
    let unauthenticated = server
        .http()
        .get(format!("{}/v1/jobs", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthenticated.status(), 401);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chatty_job_loses_no_line_and_keeps_their_order() {
    let server = server(ServerOptions::default()).await;
    let _worker = server.join("w1", &[]);
    let cli = server.cli();
    let n = 20_000;
    let out = cli
        .run(&["submit", "--follow", "--", "seq", "1", &n.to_string()])
        .success();
    let got: Vec<u32> = out.stdout.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(got, (1..=n).collect::<Vec<u32>>());
    let job = cli
        .run(&["jobs", "--json", "--limit", "1"])
        .success()
        .json()["jobs"][0]["id"]
        .as_i64()
        .unwrap();
    let again = cli.run(&["logs", &job.to_string()]).success();
    assert_eq!(
        again.stdout, out.stdout,
        "paging through stored lines gives the same lines"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn join_with_json_announces_the_registration() {
    use std::io::BufRead;
    let server = server(ServerOptions::default()).await;
    let work = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(crate::bin())
        .args([
            "join",
            &server.url,
            "--token",
            &server.join_token,
            "--name",
            "announced",
            "--slots",
            "2",
            "--json",
            "--fingerprint",
            server.fingerprint.as_deref().unwrap(),
        ])
        .arg("--work-dir")
        .arg(work.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let announced: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(announced["name"], "announced");
    assert_eq!(announced["slots"], 2);
    assert!(announced["worker_id"].as_i64().unwrap() >= 1);

    let bad = server
        .cli()
        .run(&["join", &server.url, "--token", "glj_wrong", "--name", "x"]);
    assert_ne!(bad.code, 0);
    assert!(bad.stderr.contains("rejected the token"), "{}", bad.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_on_a_killed_worker_is_retried_on_another_worker() {
    let server = server(ServerOptions {
        lease_seconds: 2,
        ..Default::default()
    })
    .await;
    let mut doomed = server.join("doomed", &[]);
    let cli = server.cli();
    let pidfile = server.data_dir.path().join("pid");
    let childfile = server.data_dir.path().join("child");
    // The first attempt leaves a child in its process group: it must die with the worker too.
    let script = format!(
        "if [ \"$GPULAYER_ATTEMPT\" = 1 ]; then sleep 601 & echo $! > {}; echo $$ > {}; exec sleep 600; fi; echo finished on attempt $GPULAYER_ATTEMPT",
        childfile.display(),
        pidfile.display()
    );
    let job = cli.submit(&["--", "sh", "-c", &script]);
    wait_for("the job to run", Duration::from_secs(30), || {
        (state_of(&cli, job) == "running").then_some(())
    });
    let orphan: i32 = wait_for("the first attempt's pid", Duration::from_secs(10), || {
        std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|p| p.trim().parse().ok())
    });
    let child: i32 = std::fs::read_to_string(&childfile)
        .expect("the child's pid")
        .trim()
        .parse()
        .unwrap();
    assert!(alive(orphan) && alive(child));
    doomed.kill_hard();
    wait_for(
        "the first attempt and its child to die with their worker",
        Duration::from_secs(5),
        || (!alive(orphan) && !alive(child)).then_some(()),
    );
    let _healthy = server.join("healthy", &[]);
    assert_eq!(
        cli.run(&["wait", &job.to_string(), "--timeout", "60"]).code,
        0
    );
    let status = cli.status(job);
    assert_eq!(status["worker"]["name"], "healthy");
    assert_eq!(status["attempt"], 2);
    let logs = cli.run(&["logs", &job.to_string()]).success();
    assert!(
        logs.stdout.contains("finished on attempt 2"),
        "{}",
        logs.stdout
    );
    for pid in [orphan, child] {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_over_its_timeout_is_stopped_and_fails_saying_so() {
    let server = server(ServerOptions::default()).await;
    let _worker = server.join("w1", &[]);
    let cli = server.cli();
    let started = Instant::now();
    let out = cli.run(&[
        "submit",
        "--timeout",
        "1",
        "--follow",
        "--",
        "sh",
        "-c",
        "echo begun; sleep 600",
    ]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "stopped near its timeout"
    );
    assert!(out.stdout.contains("begun"));
    assert!(
        out.stderr.contains("timed out after 1 s (--timeout 1)"),
        "{}",
        out.stderr
    );
    let bad = cli.run(&["submit", "--timeout", "0", "--", "true"]);
    assert_ne!(bad.code, 0);
    assert!(
        bad.stderr.contains("--timeout must be at least 1 second"),
        "{}",
        bad.stderr
    );
}
