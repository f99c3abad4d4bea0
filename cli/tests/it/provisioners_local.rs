//! The local provisioner starts real workers that take jobs, and stops them cleanly.

use crate::{bin, server};
use provisioners::local::LocalProvisioner;
use provisioners::{JoinTarget, Provisioner, WorkerRequest};
use std::time::Duration;
use testkit::{ServerOptions, wait_for};

#[tokio::test(flavor = "multi_thread")]
async fn a_locally_provisioned_worker_runs_jobs_and_deregisters_when_released() {
    let server = server(ServerOptions::default()).await;
    let cli = server.cli();
    let mut local = LocalProvisioner::new(bin(), server.data_dir.path().join("workers"));
    let target = JoinTarget {
        url: server.url.clone(),
        join_token: server.join_token.clone(),
        fingerprint: server.fingerprint.clone(),
    };
    let request = WorkerRequest {
        name: "local-1".into(),
        slots: 2,
        labels: [("pool".to_string(), "test".to_string())].into(),
    };
    local.provision(&target, &request).await.unwrap();
    assert_eq!(local.running(), vec!["local-1".to_string()]);

    let job = cli.submit(&["--", "echo", "provisioned"]);
    assert_eq!(
        cli.run(&["wait", &job.to_string(), "--timeout", "30"]).code,
        0
    );
    let workers = cli.run(&["workers", "--json"]).success().json();
    assert_eq!(workers["workers"][0]["name"], "local-1");
    assert_eq!(workers["workers"][0]["labels"]["pool"], "test");
    assert_eq!(workers["workers"][0]["slots"], 2);

    local.release("local-1").await.unwrap();
    wait_for("the worker to deregister", Duration::from_secs(10), || {
        let w = cli.run(&["workers", "--json"]).success().json();
        (w["workers"][0]["state"] == "stopped").then_some(())
    });
    assert!(matches!(
        local.release("local-1").await,
        Err(provisioners::ProvisionError::Unknown(_))
    ));
}
