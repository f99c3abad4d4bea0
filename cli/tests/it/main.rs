//! End-to-end tests: real `gpulayer` server, worker and CLI processes, real PostgreSQL (a
//! fresh database per test), real `sh` and `python3` jobs.

mod bad_input;
mod batch;
mod embedded;
mod faults;
mod gangs;
mod hostile;
mod jobs;
mod placement;
mod provisioners_local;
mod s3;
mod skill;
mod tls;
mod tokens;

use std::path::PathBuf;
use std::time::Duration;
use testkit::{Server, ServerOptions};

pub(crate) fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpulayer"))
}

/// A server on a fresh database.
pub(crate) async fn server(options: ServerOptions) -> Server {
    let db = testkit::fresh_database().await;
    Server::start(&bin(), &db.url, options)
}

/// The server's OpenAPI document (served without a token).
pub(crate) async fn openapi(server: &Server) -> serde_json::Value {
    server
        .http()
        .get(format!("{}/v1/openapi.json", server.url))
        .send()
        .await
        .expect("GET /v1/openapi.json")
        .json()
        .await
        .expect("the OpenAPI document is JSON")
}

/// The repository root (for `examples/`).
pub(crate) fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli/ has a parent")
        .to_path_buf()
}

/// Submits examples/hello with its output glob and follows it to the end.
pub(crate) fn submit_hello(cli: &testkit::Cli) -> testkit::CliOutput {
    let hello = repo_root().join("examples/hello");
    let source = hello.to_str().expect("a UTF-8 path");
    cli.run(&[
        "submit",
        "--source",
        source,
        "--output",
        "hello-*.txt",
        "--follow",
        "--",
        "python3",
        "hello.py",
    ])
    .success()
}

/// Waits until `n` workers have registered, so placement sees the whole fleet.
pub(crate) fn wait_for_workers(cli: &testkit::Cli, n: usize) {
    testkit::wait_for("the workers to register", Duration::from_secs(30), || {
        let w = cli.run(&["workers", "--json"]).success().json();
        (w["workers"].as_array().unwrap().len() >= n).then_some(())
    });
}
