//! Batch submit: thousands of jobs in one request, all or none, each run exactly once.

use crate::server;
use std::collections::HashMap;
use std::fmt::Write;
use testkit::ServerOptions;

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_file_runs_every_job_exactly_once() {
    let server = server(ServerOptions::default()).await;
    let _a = server.join("a", &["--slots", "4"]);
    let _b = server.join("b", &["--slots", "4"]);
    let cli = server.cli();
    let ledger = server.data_dir.path().join("ledger");
    let n = 300;
    let mut file = String::new();
    for i in 0..n {
        let spec = serde_json::json!({
            "name": format!("shard-{i}"),
            "command": ["sh", "-c", "echo $GPULAYER_JOB_ID >> \"$LEDGER\""],
            "env": [{"name": "LEDGER", "value": ledger.display().to_string()}],
        });
        writeln!(file, "{spec}").unwrap();
    }
    let path = server.data_dir.path().join("jobs.jsonl");
    std::fs::write(&path, file).unwrap();
    let out = cli
        .run(&["submit", "--batch", path.to_str().unwrap(), "--json"])
        .success();
    let ids: Vec<i64> = out.json()["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(ids.len(), n);
    for id in &ids {
        assert_eq!(
            cli.run(&["wait", &id.to_string(), "--timeout", "120"]).code,
            0,
            "job {id}"
        );
    }
    let mut runs: HashMap<i64, usize> = HashMap::new();
    for line in std::fs::read_to_string(&ledger).unwrap().lines() {
        *runs.entry(line.parse().unwrap()).or_default() += 1;
    }
    assert_eq!(runs.len(), n, "every job ran");
    assert!(runs.values().all(|&c| c == 1), "no job ran twice");
    assert!(ids.iter().all(|id| runs.contains_key(id)));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_with_one_bad_line_is_refused_whole_with_the_line_number() {
    let server = server(ServerOptions::default()).await;
    let cli = server.cli();
    let path = server.data_dir.path().join("jobs.jsonl");
    std::fs::write(&path, "{\"command\": [\"true\"]}\n\n{\"command\": []}\n").unwrap();
    let out = cli.run(&["submit", "--batch", path.to_str().unwrap()]);
    assert_ne!(out.code, 0);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("jobs.jsonl line 3: no command given"),
        "{}",
        out.stderr
    );
    assert_eq!(
        cli.run(&["jobs", "--json"]).success().json()["jobs"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_api_refuses_oversized_batches_and_reused_keys_for_other_jobs() {
    let server = server(ServerOptions::default()).await;
    let http = server.http();
    let post = |path: &str, key: &str, body: serde_json::Value| {
        http.post(format!("{}{path}", server.url))
            .bearer_auth(&server.admin_token)
            .header("idempotency-key", key)
            .json(&body)
            .send()
    };
    let job = serde_json::json!({"command": ["true"], "accelerator": "any"});
    let too_many = serde_json::json!({"jobs": vec![job.clone(); 10_001]});
    let resp = post("/v1/jobs/batch", "big", too_many).await.unwrap();
    assert_eq!(resp.status(), 413);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(
        body["message"],
        "a batch of 10001 jobs exceeds the limit of 10000 per request: split it"
    );

    let bad = serde_json::json!({"jobs": [job.clone(), {"command": [], "accelerator": "any"}]});
    let resp = post("/v1/jobs/batch", "bad", bad).await.unwrap();
    assert_eq!(resp.status(), 400);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("job 2: no command given"),
        "{body}"
    );

    let first = post("/v1/jobs", "same-key", serde_json::json!({"spec": job}))
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    let again = post("/v1/jobs", "same-key", serde_json::json!({"spec": job}))
        .await
        .unwrap();
    assert_eq!(
        again.status(),
        200,
        "the same request again is the same job"
    );
    let other = serde_json::json!({"spec": {"command": ["false"], "accelerator": "any"}});
    let conflict = post("/v1/jobs", "same-key", other).await.unwrap();
    assert_eq!(conflict.status(), 409);
    let body: serde_json::Value = conflict.json().await.unwrap();
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("was used for job 1 with a different spec"),
        "{body}"
    );
}
