//! Multi-node jobs end to end: a real torch DDP job (gloo, CPU) of 2 nodes × 2 processes on
//! two worker processes, a failing rank that stops every rank everywhere, nodes kept close
//! together, and the bad input of `--nodes` and `--procs-per-node`.

use crate::{server, wait_for_workers};
use std::time::{Duration, Instant};
use testkit::{ServerOptions, wait_for};

/// A DDP-style check: every rank all-reduces rank + 1 (1+2+3+4 = 10 on four ranks) and
/// checks the environment torchrun would have given it.
const DDP: &str = r#"
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"]) == 4
assert int(os.environ["LOCAL_RANK"]) == rank % 2 and os.environ["LOCAL_WORLD_SIZE"] == "2"
assert int(os.environ["GROUP_RANK"]) == int(os.environ["NODE_RANK"]) == rank // 2
assert os.environ["TORCHELASTIC_RUN_ID"] == os.environ["GPULAYER_JOB_ID"]
assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] != "True"
assert os.environ["OMP_NUM_THREADS"] == "1"
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
assert t.item() == 10.0, t
out = os.environ["GPULAYER_OUTPUT_DIR"]
open(os.path.join(out, "result.txt"), "w").write(f"{rank} {t.item()}\n")
print(f"rank {rank} of {world}: all_reduce gave {t.item():.0f}", flush=True)
dist.destroy_process_group()
"#;

/// A CPU gang job of two nodes (two workers joined to a fresh server), `procs` processes
/// each, running `script` with `python`, followed to its end.
struct GangRun {
    server: testkit::Server,
    _workers: [testkit::Worker; 2],
    out: testkit::CliOutput,
}

async fn run_gang_script(file: &str, script: &str, python: &str, procs: &str) -> GangRun {
    let server = server(ServerOptions::default()).await;
    let workers = [server.join("node-a", &[]), server.join("node-b", &[])];
    wait_for_workers(&server.cli(), 2);
    let src = server.data_dir.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join(file), script).unwrap();
    let out = server.cli().run(&[
        "submit",
        "--source",
        src.to_str().unwrap(),
        "--accelerator",
        "cpu",
        "--nodes",
        "2",
        "--procs-per-node",
        procs,
        // Loopback only here: gloo picks its interface by the host name otherwise.
        "--env",
        "GLOO_SOCKET_IFNAME=lo",
        "--follow",
        "--",
        python,
        file,
    ]);
    GangRun {
        server,
        _workers: workers,
        out,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_two_by_two_ddp_job_all_reduces_across_two_workers() {
    let Ok(python) = std::env::var("GPULAYER_TEST_PYTHON") else {
        eprintln!(
            "skipped: GPULAYER_TEST_PYTHON is not set (scripts/test sets it to a venv with torch installed)"
        );
        return;
    };
    let GangRun {
        server,
        _workers,
        out,
    } = run_gang_script("ddp.py", DDP, &python, "2").await;
    let cli = server.cli();
    assert_eq!(out.code, 0, "{out:?}");
    for rank in 0..4 {
        assert!(
            out.stdout.contains(&format!(
                "[rank {rank}] rank {rank} of 4: all_reduce gave 10"
            )),
            "{}",
            out.stdout
        );
    }
    let jobs = cli
        .run(&["jobs", "--json", "--limit", "1"])
        .success()
        .json();
    let job = jobs["jobs"][0]["id"].as_i64().unwrap();
    let status = cli.status(job);
    assert_eq!(status["state"], "succeeded");
    let nodes = status["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2);
    let workers: Vec<&str> = nodes
        .iter()
        .map(|n| n["worker"]["name"].as_str().unwrap())
        .collect();
    assert_ne!(workers[0], workers[1], "one node per worker: {workers:?}");

    // One rank's lines alone.
    let rank3 = cli
        .run(&["logs", &job.to_string(), "--rank", "3"])
        .success();
    assert!(rank3.stdout.contains("rank 3 of 4"), "{}", rank3.stdout);
    assert!(!rank3.stdout.contains("rank 2 of 4"), "{}", rank3.stdout);

    // Both nodes' outputs arrive as one tree, one directory per rank.
    let dest = server.data_dir.path().join("downloaded");
    cli.run(&["download", &job.to_string(), dest.to_str().unwrap()])
        .success();
    for rank in 0..4 {
        let got = std::fs::read_to_string(dest.join(format!("rank-{rank}/result.txt")))
            .unwrap_or_else(|e| panic!("rank {rank}'s result.txt: {e}"));
        assert_eq!(got, format!("{rank} 10.0\n"));
    }
}

/// A `gpulayer.pytorch` Trainer run across the nodes of a gang job: it joins the run the
/// job's environment describes; every rank prints its final weights and the averaged loss.
const TRAINER: &str = r#"
import os
import torch
import gpulayer.pytorch as glt
from torch.utils.data import DataLoader, TensorDataset

g = torch.Generator().manual_seed(0)
x = torch.randn(64, 4, generator=g)
y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


# Each rank starts from other weights: DDP gives every rank rank 0's.
torch.manual_seed(int(os.environ["RANK"]) + 1)
module = Linear()
trainer = glt.Trainer(accelerator="cpu", devices=1, num_nodes=2, max_epochs=2, log_every_n_steps=1)
trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=8))
w = ",".join(f"{v:.6f}" for v in module.net.weight.flatten().tolist())
print(f"trainer rank {trainer.global_rank} of {trainer.world_size}: weights {w} loss {trainer.callback_metrics['train_loss']:.6f}")
"#;

#[tokio::test]
async fn a_trainer_run_across_two_nodes_of_a_gang_job_agrees_on_its_weights_and_brings_back_rank_zeros_checkpoint()
 {
    let Ok(python) = std::env::var("GPULAYER_TEST_PYTHON") else {
        eprintln!(
            "skipped: GPULAYER_TEST_PYTHON is not set (scripts/test sets it to a venv with torch and gpulayer installed)"
        );
        return;
    };
    let GangRun {
        server,
        _workers,
        out,
    } = run_gang_script("train.py", TRAINER, &python, "1").await;
    let cli = server.cli();
    assert_eq!(out.code, 0, "{out:?}");
    let said: Vec<&str> = (0..2)
        .map(|rank| {
            let prefix = format!("trainer rank {rank} of 2: ");
            out.stdout
                .lines()
                .find_map(|l| l.split_once(&prefix).map(|(_, rest)| rest))
                .unwrap_or_else(|| panic!("rank {rank} said nothing: {}", out.stdout))
        })
        .collect();
    assert_eq!(said[0], said[1], "the ranks disagree: {said:?}");

    // Rank 0 wrote the checkpoints into its output directory: they come back with download.
    let jobs = cli
        .run(&["jobs", "--json", "--limit", "1"])
        .success()
        .json();
    let job = jobs["jobs"][0]["id"].as_i64().unwrap();
    let dest = server.data_dir.path().join("downloaded");
    cli.run(&["download", &job.to_string(), dest.to_str().unwrap()])
        .success();
    for name in ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt", "last.ckpt"] {
        assert!(
            dest.join("rank-0/checkpoints").join(name).is_file(),
            "rank 0's {name} did not come back"
        );
    }
    assert!(
        !dest.join("rank-1/checkpoints").exists(),
        "only rank 0 writes checkpoints"
    );
}

/// Whether a process still runs (a zombie does not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().next())
            != Some("Z")
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_rank_stops_every_rank_on_every_node_and_the_job_names_it() {
    let server = server(ServerOptions::default()).await;
    let _n0 = server.join("node-a", &[]);
    let _n1 = server.join("node-b", &[]);
    wait_for_workers(&server.cli(), 2);
    let cli = server.cli();
    let pids = server.data_dir.path().join("pids");
    std::fs::create_dir_all(&pids).unwrap();
    // Every rank records its pid; rank 3 fails once all four run, the others would sleep.
    let script = format!(
        "echo $$ > {dir}/$RANK; \
         if [ \"$RANK\" = 3 ]; then while [ $(ls {dir} | wc -l) -lt 4 ]; do sleep 0.05; done; exit 7; fi; \
         exec sleep 600",
        dir = pids.display()
    );
    let job = cli.submit(&[
        "--accelerator",
        "cpu",
        "--nodes",
        "2",
        "--procs-per-node",
        "2",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let ranks: Vec<i32> = wait_for("all four ranks", Duration::from_secs(30), || {
        let found: Vec<i32> = (0..4)
            .filter_map(|r| std::fs::read_to_string(pids.join(r.to_string())).ok())
            .filter_map(|p| p.trim().parse().ok())
            .collect();
        (found.len() == 4).then_some(found)
    });
    let failed_at = Instant::now();
    let status = wait_for("the job to fail", Duration::from_secs(20), || {
        let s = cli.status(job);
        (s["state"] == "failed").then_some(s)
    });
    wait_for("every rank to be gone", Duration::from_secs(5), || {
        ranks.iter().all(|p| !alive(*p)).then_some(())
    });
    let stopped_in = failed_at.elapsed();
    let reason = status["reason"].as_str().unwrap();
    assert!(reason.starts_with("node 1 (worker node-"), "{reason}");
    assert!(reason.ends_with("rank 3 exited with code 7"), "{reason}");
    assert_eq!(status["exit_code"], 7);
    let other = status["nodes"][0]["reason"].as_str().unwrap();
    assert!(other.starts_with("stopped: node 1"), "{other}");
    assert!(stopped_in < Duration::from_secs(5), "{stopped_in:?}");
    assert_eq!(cli.run(&["wait", &job.to_string()]).code, 7);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gang_stays_in_the_network_group_that_can_hold_it() {
    let server = server(ServerOptions::default()).await;
    let group = domain::layout::NETWORK_GROUP_LABEL;
    let w = |name: &str, labels: &[String]| {
        let mut args: Vec<&str> = Vec::new();
        for l in labels {
            args.extend(["--label", l.as_str()]);
        }
        server.join(name, &args)
    };
    let _a = w(
        "eu-b-r1",
        &["zone=europe-west1-b".into(), format!("{group}=r1")],
    );
    let _b = w(
        "eu-c-r1",
        &["zone=europe-west1-c".into(), format!("{group}=r1")],
    );
    let _c = w(
        "eu-b-r2",
        &["zone=europe-west1-b".into(), format!("{group}=r2")],
    );
    let _d = w("us-b", &["zone=us-east1-b".into()]);
    let cli = server.cli();
    wait_for_workers(&cli, 4);
    let job = cli.submit(&["--accelerator", "cpu", "--nodes", "2", "--", "true"]);
    assert_eq!(cli.run(&["wait", &job.to_string()]).code, 0);
    let mut workers: Vec<String> = cli.status(job)["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["worker"]["name"].as_str().unwrap().to_string())
        .collect();
    workers.sort();
    assert_eq!(workers, vec!["eu-b-r1", "eu-c-r1"]);
    let shown = cli.run(&["status", &job.to_string()]).success().stdout;
    assert!(
        shown.contains("placed:      2 nodes in network group r1"),
        "{shown}"
    );

    // Three nodes: no group holds three, nor a zone; europe-west1 does.
    let job = cli.submit(&["--accelerator", "cpu", "--nodes", "3", "--", "true"]);
    assert_eq!(cli.run(&["wait", &job.to_string()]).code, 0);
    let used: Vec<String> = cli.status(job)["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["worker"]["name"].as_str().unwrap().to_string())
        .collect();
    assert!(!used.iter().any(|w| w == "us-b"), "{used:?}");
    assert!(
        cli.status(job)["placed"]
            .as_str()
            .unwrap()
            .starts_with("3 nodes in region europe-west1"),
        "{}",
        cli.status(job)
    );

    // Four nodes would split regions: refused unless --spread region.
    let refused = cli.run(&[
        "submit",
        "--accelerator",
        "cpu",
        "--nodes",
        "4",
        "--",
        "true",
    ]);
    assert_eq!(refused.code, 3, "{refused:?}");
    assert!(
        refused.stderr.contains("no region has 4 eligible workers"),
        "{}",
        refused.stderr
    );
    let job = cli.submit(&[
        "--accelerator",
        "cpu",
        "--nodes",
        "4",
        "--spread",
        "region",
        "--",
        "true",
    ]);
    assert_eq!(cli.run(&["wait", &job.to_string()]).code, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_layouts_get_one_line_errors() {
    let server = server(ServerOptions::default()).await;
    let inventory = server.data_dir.path().join("two-gpus.json");
    std::fs::write(
        &inventory,
        serde_json::to_string(&domain::fixtures::cuda_inventory("g", 2)).unwrap(),
    )
    .unwrap();
    let _a = server.join("gpu-a", &["--inventory", inventory.to_str().unwrap()]);
    let _b = server.join("gpu-b", &["--inventory", inventory.to_str().unwrap()]);
    wait_for_workers(&server.cli(), 2);
    let cli = server.cli();
    for (args, expect) in [
        (
            vec!["--nodes", "0"],
            "--nodes must be between 1 and 1024, not 0",
        ),
        (vec!["--nodes", "-2"], "--nodes must be at least 1, not -2"),
        (
            vec!["--procs-per-node", "2", "--env", "RANK=1"],
            "RANK is set by GPUlayer for each process",
        ),
        (
            vec![
                "--accelerator",
                "cuda",
                "--procs-per-node",
                "2",
                "--devices",
                "3",
            ],
            "--devices 3 cannot be shared by --procs-per-node 2",
        ),
        (
            vec!["--spread", "rack"],
            "--spread 'rack' is not zone or region",
        ),
    ] {
        let mut full = vec!["submit"];
        full.extend(args.iter().copied());
        full.extend(["--", "true"]);
        let out = cli.run(&full);
        assert_ne!(out.code, 0, "{args:?}");
        assert_eq!(out.stderr.lines().count(), 1, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(expect), "{args:?}: {}", out.stderr);
    }
    // Refused at submit, with the table: more nodes than workers, more processes than GPUs.
    let out = cli.run(&[
        "submit",
        "--accelerator",
        "cuda",
        "--nodes",
        "3",
        "--",
        "true",
    ]);
    assert_eq!(out.code, 3, "{out:?}");
    assert!(
        out.stderr.contains("needs 3 nodes, 2 eligible worker(s)"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("gpu-a"), "{}", out.stderr);
    let out = cli.run(&[
        "submit",
        "--accelerator",
        "cuda",
        "--procs-per-node",
        "4",
        "--",
        "true",
    ]);
    assert_eq!(out.code, 3, "{out:?}");
    assert!(
        out.stderr
            .contains("needs 4 usable cuda device(s), worker has 2"),
        "{}",
        out.stderr
    );
}
