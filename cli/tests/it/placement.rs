//! Placement that explains itself, end to end: simulated workers (`join --inventory`), the
//! per-worker table and exit 3 at submit, dry runs, waiting reasons, device reservation.

use crate::{server, wait_for_workers};
use domain::fixtures::{cuda_inventory, inventory};
use domain::{Accelerator, FrameworkCheck, Inventory, Library, Topology};
use std::time::Duration;
use testkit::{Server, ServerOptions, Worker, wait_for};

fn check(
    library: Library,
    device: Accelerator,
    version: Option<&str>,
    usable: bool,
) -> FrameworkCheck {
    FrameworkCheck {
        library,
        device,
        version: version.map(str::to_string),
        usable,
        reason: (!usable).then(|| "recorded as unusable".to_string()),
    }
}

/// Starts a worker that advertises `inv` instead of probing.
fn simulated(server: &Server, name: &str, inv: &Inventory, extra: &[&str]) -> Worker {
    let file = server
        .data_dir
        .path()
        .join(format!("{name}.inventory.json"));
    std::fs::write(&file, serde_json::to_string(inv).unwrap()).unwrap();
    let mut args = vec!["--inventory", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    server.join(name, &args)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_no_worker_can_run_is_refused_at_submit_with_every_reason() {
    let server = server(ServerOptions::default()).await;
    let mut box1 = cuda_inventory("gpu-box-1", 1);
    box1.frameworks = vec![check(
        Library::Torch,
        Accelerator::Cuda,
        Some("2.5.1"),
        true,
    )];
    let mut mac = inventory("mac-studio", &[Accelerator::Mps]);
    mac.frameworks = vec![check(Library::Mlx, Accelerator::Mps, Some("0.21.0"), true)];
    let mut laptop = cuda_inventory("laptop", 2);
    laptop.frameworks = vec![check(
        Library::Torch,
        Accelerator::Cuda,
        Some("2.5.1+cpu"),
        false,
    )];
    let _w = [
        simulated(&server, "gpu-box-1", &box1, &[]),
        simulated(&server, "mac-studio", &mac, &[]),
        simulated(&server, "laptop", &laptop, &[]),
    ];
    let cli = server.cli();
    wait_for_workers(&cli, 3);

    let out = cli.run(&[
        "submit",
        "--accelerator",
        "cuda",
        "--devices",
        "2",
        "--framework",
        "torch>=2",
        "--",
        "true",
    ]);
    assert_eq!(out.code, 3, "{out:?}");
    let mut lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.remove(0), "scheduling: no eligible worker");
    lines.sort();
    assert_eq!(
        lines,
        [
            "  gpu-box-1   needs 2 usable cuda device(s), worker has 1",
            "  laptop      torch on this worker cannot use CUDA",
            "  mac-studio  needs 2 usable cuda device(s), worker has 0",
        ]
    );
    assert_eq!(
        cli.run(&["jobs", "--json"]).success().json()["jobs"]
            .as_array()
            .unwrap()
            .len(),
        0,
        "nothing stored"
    );

    // The same reasons as JSON, for programs and agents.
    let json = cli.run(&[
        "submit",
        "--json",
        "--accelerator",
        "mps",
        "--framework",
        "jax",
        "--",
        "true",
    ]);
    assert_eq!(json.code, 3);
    let report = json.json();
    assert_eq!(report["eligible_workers"], 0);
    let mac_verdict = report["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["worker"] == "mac-studio")
        .unwrap();
    assert_eq!(mac_verdict["reason"], "framework 'jax' not installed");
    assert_eq!(mac_verdict["temporary"], false);

    // A dry run of a job that fits names the eligible workers and stores nothing.
    let dry = cli
        .run(&[
            "submit",
            "--dry-run",
            "--accelerator",
            "cuda",
            "--framework",
            "torch",
            "--",
            "true",
        ])
        .success();
    assert!(
        dry.stdout.starts_with("scheduling: 1 eligible worker(s)"),
        "{}",
        dry.stdout
    );
    assert!(
        dry.stdout.contains("gpu-box-1   eligible"),
        "{}",
        dry.stdout
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
async fn a_waiting_job_says_why_and_jobs_get_disjoint_devices() {
    let server = server(ServerOptions::default()).await;
    let _w = simulated(
        &server,
        "gpu-box",
        &cuda_inventory("gpu-box", 2),
        &["--slots", "4"],
    );
    let cli = server.cli();
    wait_for_workers(&cli, 1);
    let show = "echo $CUDA_VISIBLE_DEVICES $GPULAYER_DEVICES; sleep 600";
    let first = cli.submit(&["--accelerator", "cuda", "--", "sh", "-c", show]);
    let second = cli.submit(&["--accelerator", "cuda", "--", "sh", "-c", show]);
    for job in [first, second] {
        wait_for("the job to run", Duration::from_secs(30), || {
            (cli.status(job)["state"] == "running").then_some(())
        });
    }
    let devices = |job: i64| cli.status(job)["devices"].clone();
    assert_eq!(devices(first), serde_json::json!([0]));
    assert_eq!(devices(second), serde_json::json!([1]));
    let out = wait_for("the first job's output", Duration::from_secs(10), || {
        let logs = cli.run(&["logs", &first.to_string()]).success().stdout;
        (!logs.is_empty()).then_some(logs)
    });
    assert_eq!(
        out.trim(),
        "GPU-gpu-box-0 0",
        "the job sees only its own GPU, by UUID"
    );

    let third = cli.submit(&["--accelerator", "cuda", "--", "true"]);
    let status = cli.run(&["status", &third.to_string()]).success();
    assert!(
        status
            .stdout
            .contains("gpu-box  needs 1 free cuda device(s), 0 free now"),
        "{}",
        status.stdout
    );

    cli.run(&["cancel", &first.to_string()]).success();
    assert_eq!(
        cli.run(&["wait", &third.to_string(), "--timeout", "30"])
            .code,
        0
    );
    assert_eq!(
        devices(third),
        serde_json::json!([0]),
        "the freed GPU goes to the waiting job"
    );
    cli.run(&["cancel", &second.to_string()]).success();
}

#[tokio::test(flavor = "multi_thread")]
async fn four_gpu_jobs_on_a_dgx1_get_its_nvlink_islands() {
    let server = server(ServerOptions::default()).await;
    let mut dgx = cuda_inventory("dgx1", 8);
    let topo = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/it/dgx1-v100.topo.txt"
    ))
    .unwrap();
    dgx.topology = Some(Topology::parse_nvidia_smi(&topo).unwrap());
    let _w = simulated(&server, "dgx1", &dgx, &["--slots", "2"]);
    let cli = server.cli();
    wait_for_workers(&cli, 1);
    let a = cli.submit(&[
        "--accelerator",
        "cuda",
        "--devices",
        "4",
        "--",
        "sleep",
        "600",
    ]);
    let b = cli.submit(&[
        "--accelerator",
        "cuda",
        "--devices",
        "4",
        "--",
        "sleep",
        "600",
    ]);
    let devices = |job: i64| {
        wait_for("the job to run", Duration::from_secs(30), || {
            let s = cli.status(job);
            (s["state"] == "running").then(|| s["devices"].clone())
        })
    };
    assert_eq!(devices(a), serde_json::json!([0, 1, 2, 3]));
    assert_eq!(devices(b), serde_json::json!([4, 5, 6, 7]));
    for job in [a, b] {
        cli.run(&["cancel", &job.to_string()]).success();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn resources_lists_simulated_workers_and_an_unparsable_inventory_is_named() {
    let server = server(ServerOptions::default()).await;
    let _w = simulated(
        &server,
        "gpu-box",
        &cuda_inventory("gpu-box", 2),
        &["--label", "zone=europe-west1-b"],
    );
    let cli = server.cli();
    wait_for_workers(&cli, 1);
    let out = cli.run(&["resources"]).success();
    assert!(out.stdout.contains("gpu-box (worker"), "{}", out.stdout);
    assert!(out.stdout.contains("SIMULATED inventory"), "{}", out.stdout);
    assert!(
        out.stdout.contains("labels: zone=europe-west1-b"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("cuda:1  gpu  16.0 GiB  free"),
        "{}",
        out.stdout
    );

    let on_label = cli.run(&[
        "submit",
        "--dry-run",
        "--where",
        "zone=us-east1-b",
        "--",
        "true",
    ]);
    assert_eq!(on_label.code, 3);
    assert!(
        on_label
            .stderr
            .contains("label zone=us-east1-b wanted, worker has zone=europe-west1-b"),
        "{}",
        on_label.stderr
    );

    let bad = server.data_dir.path().join("bad.json");
    std::fs::write(&bad, "{ not json").unwrap();
    let out = cli.run(&[
        "join",
        &server.url,
        "--token",
        &server.join_token,
        "--inventory",
        bad.to_str().unwrap(),
    ]);
    assert_ne!(out.code, 0);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("bad.json is not an inventory"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn resources_detect_reports_the_cpu_and_why_torch_cannot_use_cuda() {
    let Ok(python) = std::env::var("GPULAYER_TEST_PYTHON") else {
        eprintln!(
            "skipped: GPULAYER_TEST_PYTHON is not set (scripts/test sets it to a venv with torch installed)"
        );
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(crate::bin())
        .args([
            "resources",
            "detect",
            "--json",
            "--refresh",
            "--python",
            &python,
        ])
        .env("XDG_DATA_HOME", home.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let inv: Inventory = serde_json::from_slice(&out.stdout).unwrap();
    assert!(inv.cpus >= 1 && inv.memory_bytes > 0);
    assert!(!inv.simulated);
    let torch = inv
        .framework(Library::Torch, Accelerator::Cuda)
        .expect("torch.cuda was checked");
    assert!(
        torch.version.as_deref().is_some_and(|v| v.starts_with('2')),
        "{torch:?}"
    );
    if inv.count(Accelerator::Cuda) == 0 {
        assert!(
            !torch.usable,
            "no GPU here, so torch cannot be usable: {torch:?}"
        );
        let reason = torch.reason.as_deref().unwrap();
        assert!(
            reason.contains("cannot use CUDA") || reason.contains("CPU-only"),
            "{reason}"
        );
    }
    // A second run reads the cache (same interpreter and packages) and agrees.
    let again = std::process::Command::new(crate::bin())
        .args(["resources", "detect", "--json", "--python", &python])
        .env("XDG_DATA_HOME", home.path())
        .output()
        .unwrap();
    let cached: Inventory = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(cached.frameworks, inv.frameworks);
}
