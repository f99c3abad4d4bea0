//! Sources and outputs in S3: a real S3-compatible server (moto's, from PyPI, which
//! scripts/test installs into the test venv), not a mock.

use crate::server;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use testkit::{ServerOptions, wait_for};

struct S3Server {
    child: Child,
    url: String,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_s3(python: &str) -> S3Server {
    let port = free_port();
    let child = Command::new(python)
        .args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start moto's S3 server");
    let url = format!("http://127.0.0.1:{port}");
    wait_for("the S3 server to answer", Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", port))
            .ok()
            .map(|_| ())
    });
    S3Server { child, url }
}

#[tokio::test(flavor = "multi_thread")]
async fn sources_and_outputs_travel_through_s3() {
    let Ok(python) = std::env::var("GPULAYER_TEST_PYTHON") else {
        eprintln!(
            "skipped: GPULAYER_TEST_PYTHON is not set (scripts/test sets it to a venv with moto's S3 server)"
        );
        return;
    };
    let s3 = start_s3(&python);
    let http = reqwest::Client::new();
    let created = http
        .put(format!("{}/gpulayer-test", s3.url))
        .send()
        .await
        .unwrap();
    assert!(
        created.status().is_success(),
        "create the bucket: {}",
        created.status()
    );
    let env: Vec<(String, String)> = [
        ("AWS_ENDPOINT", s3.url.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_REGION", "us-east-1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let server = server(ServerOptions {
        extra_args: vec!["--store".into(), "s3://gpulayer-test/cluster-a".into()],
        env,
        ..Default::default()
    })
    .await;
    let _worker = server.join("w1", &[]);
    let cli = server.cli();
    let out = crate::submit_hello(&cli);
    assert!(out.stdout.contains("line 5 of 5"));
    let job = cli
        .run(&["jobs", "--json", "--limit", "1"])
        .success()
        .json()["jobs"][0]["id"]
        .as_i64()
        .unwrap();
    let dest = server.data_dir.path().join("out");
    cli.run(&["download", &job.to_string(), dest.to_str().unwrap()])
        .success();
    assert!(dest.join("greeting.txt").exists() && dest.join(format!("hello-{job}.txt")).exists());

    // The objects are in the bucket, under the prefix; nothing went to the local directory.
    let listing = http
        .get(format!(
            "{}/gpulayer-test?list-type=2&prefix=cluster-a/",
            s3.url
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(listing.contains("cluster-a/blobs/"), "{listing}");
    assert!(
        listing.contains(&format!("cluster-a/outputs/{job}/")),
        "{listing}"
    );
    assert!(!server.data_dir.path().join("objects").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_bucket_stops_up_with_a_clear_error() {
    let db = testkit::fresh_database().await;
    let data = tempfile::tempdir().unwrap();
    let out = Command::new(crate::bin())
        .args([
            "up",
            "--json",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &db.url,
            "--store",
            "s3://no-such-bucket",
        ])
        .arg("--data-dir")
        .arg(data.path())
        .env("AWS_ENDPOINT", "http://127.0.0.1:9")
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_ACCESS_KEY_ID", "x")
        .env("AWS_SECRET_ACCESS_KEY", "x")
        .env("AWS_REGION", "us-east-1")
        .env("XDG_CONFIG_HOME", data.path().join("config"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: cannot write to s3://no-such-bucket"),
        "{stderr}"
    );
}
