"""gpulayer.pytorch's Trainer in-process on CPU, with real torch: it trains, calls the hooks a
callback defines, resumes bit for bit, and refuses bad input before anything runs."""

import os

import pytest

torch = pytest.importorskip("torch")

import gpulayer.pytorch as glt  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


class Regression(torch.nn.Module):
    """A LightningModule-shaped plain module: training_step, validation_step,
    configure_optimizers, self.log."""

    def __init__(self, hidden=16, dropout=0.0, scheduler=False):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Dropout(dropout), torch.nn.Linear(hidden, 1)
        )
        self.scheduler = scheduler

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x).float(), y)
        self.log("step_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return {"val_loss": torch.nn.functional.mse_loss(self.net(x).float(), y)}

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        if not self.scheduler:
            return opt
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
    return TensorDataset(x, y)


class Recorder(glt.Callback):
    def __init__(self):
        self.seen = []

    def on_train_start(self, trainer, module):
        self.seen.append("train_start")

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.seen.append(f"batch {batch_idx}")

    def on_validation_end(self, trainer, module):
        self.seen.append("validation_end")

    def on_save_checkpoint(self, trainer, module, checkpoint):
        checkpoint["note"] = "mine"
        self.seen.append("save")

    def on_train_end(self, trainer, module):
        self.seen.append("train_end")


def test_fit_trains_in_process_and_calls_each_hook_a_callback_defines_in_order(tmp_path):
    torch.manual_seed(0)
    module = Regression()
    loader = DataLoader(data(), batch_size=16, shuffle=True)
    with torch.no_grad():
        before = float(torch.nn.functional.mse_loss(module.net(data().tensors[0]), data().tensors[1]))
    recorder = Recorder()
    trainer = glt.Trainer(accelerator="cpu", max_epochs=5, callbacks=[recorder],
                          checkpoint_dir=str(tmp_path), log_every_n_steps=2)
    trainer.fit(module, loader, DataLoader(data(32, seed=1), batch_size=16))
    with torch.no_grad():
        after = float(torch.nn.functional.mse_loss(module.net(data().tensors[0]), data().tensors[1]))
    assert after < before / 2, (before, after)
    assert trainer.global_step == 5 * 4 and trainer.current_epoch == 5
    epoch = ["batch 0", "batch 1", "batch 2", "batch 3", "validation_end", "save"]
    assert recorder.seen == ["train_start"] + epoch * 5 + ["save", "train_end"]
    for k in ("train_loss", "step_loss", "val_loss"):
        assert isinstance(trainer.callback_metrics[k], float), k
    saved = sorted(os.listdir(tmp_path))
    assert saved == ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt", "epoch=2-step=12.ckpt",
                     "epoch=3-step=16.ckpt", "epoch=4-step=20.ckpt", "last.ckpt"]
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["note"] == "mine"


def fit_steps(steps, ckpt_dir, ckpt_path=None, precision="32-true"):
    """A run with dropout, shuffling, momentum and a per-step schedule: everything that
    makes a resumed run drift if any state is not restored."""
    torch.manual_seed(1)
    module = Regression(hidden=32, dropout=0.2, scheduler=True)
    loader = DataLoader(data(80), batch_size=16, shuffle=True)  # 5 batches an epoch
    glt.Trainer(accelerator="cpu", max_steps=steps, checkpoint_dir=str(ckpt_dir),
                precision=precision).fit(module, loader, ckpt_path=ckpt_path)
    return module


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_a_run_resumed_mid_epoch_ends_bit_for_bit_where_an_uninterrupted_run_ends(tmp_path, precision):
    straight = fit_steps(13, tmp_path / "straight", precision=precision)
    fit_steps(7, tmp_path / "first", precision=precision)  # stops in epoch 1, after 2 of its 5 batches
    # Something else uses the random generator in between, as a new process would differ.
    torch.randn(100)
    resumed = fit_steps(13, tmp_path / "second", ckpt_path=str(tmp_path / "first" / "last.ckpt"),
                        precision=precision)
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    # A run resumed with another random state (other dropout masks) does not match: the
    # comparison would catch a state left unrestored.
    tampered = torch.load(tmp_path / "first" / "last.ckpt", weights_only=False)
    tampered["rng"]["torch"] = torch.Generator().manual_seed(123).get_state()
    torch.save(tampered, tmp_path / "tampered.ckpt")
    drifted = fit_steps(13, tmp_path / "third", ckpt_path=str(tmp_path / "tampered.ckpt"), precision=precision)
    assert not all(torch.equal(a, b) for a, b in zip(straight.state_dict().values(), drifted.state_dict().values()))


def test_fp16_mixed_trains_with_a_grad_scaler_on_cpu():
    torch.manual_seed(0)
    module = Regression()
    trainer = glt.Trainer(accelerator="cpu", precision="16-mixed", max_epochs=3)
    trainer.fit(module, DataLoader(data(), batch_size=16))
    assert trainer.global_step == 12
    assert all(torch.isfinite(p).all() for p in module.parameters())


def test_bad_input_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(glt.TrainerError, match="unknown precision 'fp8'"):
        glt.Trainer(precision="fp8")
    cores = os.cpu_count() or 1
    with pytest.raises(glt.TrainerError, match=f"devices={cores + 1}, but this machine has {cores} CPU cores"):
        glt.Trainer(accelerator="cpu", devices=cores + 1)

    class NoStep(torch.nn.Module):
        def configure_optimizers(self):
            return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)

    with pytest.raises(glt.TrainerError, match="NoStep has no training_step"):
        glt.Trainer(accelerator="cpu").fit(NoStep(), [])

    glt.Trainer(accelerator="cpu", max_steps=2, checkpoint_dir=str(tmp_path)).fit(
        Regression(hidden=16), DataLoader(data(), batch_size=16))
    wider = Regression(hidden=8)
    started = []
    wider.training_step = lambda *a: started.append(1)
    with pytest.raises(glt.TrainerError, match="a different model than Regression: shapes differ: net.0.weight"):
        glt.Trainer(accelerator="cpu").fit(wider, DataLoader(data(), batch_size=16),
                                            ckpt_path=str(tmp_path / "last.ckpt"))
    assert not started
    with pytest.raises(glt.TrainerError, match="num_nodes=2 needs a process started on every node"):
        glt.Trainer(accelerator="cpu", num_nodes=2).fit(Regression(), DataLoader(data(), batch_size=16))
    with pytest.raises(glt.TrainerError, match="unknown target 'cloud': use 'local' or 'remote'"):
        glt.Trainer(accelerator="cpu", target="cloud")
    with pytest.raises(glt.TrainerError, match="unknown gradient_sync 'ring'"):
        glt.Trainer(accelerator="cpu", gradient_sync="ring")
    with pytest.raises(glt.TrainerError, match="no checkpoint at"):
        glt.Trainer(accelerator="cpu").fit(Regression(), [], ckpt_path=str(tmp_path / "nope.ckpt"))


#: The start of the scripts below: a linear regression's data and module.
LINEAR_SCRIPT = '''
import os
import sys
import torch
import gpulayer.pytorch as glt
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.randn(64, 4)
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

'''

DDP_SCRIPT = LINEAR_SCRIPT + '''
out, devices, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

# A seed per rank (1 for rank 0 and for the single process): DDP must start every rank from
# rank 0's weights.
torch.manual_seed(int(os.environ.get("RANK", "0")) + 1)
module = Linear()
trainer = glt.Trainer(accelerator="cpu", devices=devices, max_epochs=3, log_every_n_steps=1)
trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=batch))
torch.save({"state": module.state_dict(), "loss": trainer.callback_metrics["train_loss"],
            "world": trainer.world_size}, f"{out}/rank{trainer.global_rank}.pt")
'''


def test_two_ddp_processes_started_by_the_trainer_match_one_process_on_their_combined_batches(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(DDP_SCRIPT)
    (tmp_path / "ddp").mkdir()
    (tmp_path / "one").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT", "TORCHELASTIC_RUN_ID")}
    subprocess.run([sys.executable, str(script), str(tmp_path / "ddp"), "2", "8"], check=True, env=env, timeout=300)
    subprocess.run([sys.executable, str(script), str(tmp_path / "one"), "1", "16"], check=True, env=env, timeout=300)
    rank0 = torch.load(tmp_path / "ddp" / "rank0.pt", weights_only=False)
    rank1 = torch.load(tmp_path / "ddp" / "rank1.pt", weights_only=False)
    one = torch.load(tmp_path / "one" / "rank0.pt", weights_only=False)
    assert rank0["world"] == 2 and one["world"] == 1
    # The ranks hold the same weights, the ones a single process reaches on the same steps'
    # combined batches (each rank's half, gradients averaged).
    for k in one["state"]:
        assert torch.equal(rank0["state"][k], rank1["state"][k]), k
        assert torch.allclose(rank0["state"][k], one["state"][k], atol=1e-6), k
    assert abs(rank0["loss"] - rank1["loss"]) < 1e-6


TWO_LEVEL_SCRIPT = '''
import os
import sys
import torch
import gpulayer.pytorch as glt
from torch.utils.data import DataLoader, TensorDataset

out, sync, devices, nodes, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.manual_seed(0)
x = torch.randn(64, 4, dtype=torch.float64)
y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]], dtype=torch.float64)
grads = []


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).double()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.05)
        # The gradients as the optimizer sees them: after the sync.
        opt.register_step_pre_hook(lambda o, a, k: grads.append([p.grad.clone() for p in self.parameters()]))
        return opt


torch.manual_seed(1)
module = Net()
trainer = glt.Trainer(accelerator="cpu", devices=devices, num_nodes=nodes, max_steps=3, gradient_sync=sync)
trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=batch))
torch.save({"grads": grads, "sync": trainer.gradient_sync, "rank": trainer.global_rank,
            "world": trainer.world_size, "buckets": trainer.two_level.buckets if trainer.two_level else 0},
           f"{out}/rank{trainer.global_rank}.pt")
'''


def _clean_env():
    return {k: v for k, v in os.environ.items()
            if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                         "GROUP_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
                         "TORCHELASTIC_RUN_ID", "GPULAYER_TRAINER_RANK", "ACCELERATE_USE_CPU")}


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_as_nodes(script, args, nodes, timeout=300):
    """Runs `script` as a multi-node job with one process per node runs it (the environment a
    GPUlayer gang job gives each node's process), every node on this machine."""
    import subprocess
    import sys

    port = str(_free_port())
    procs = []
    for node in range(nodes):
        env = dict(_clean_env(), RANK=str(node), LOCAL_RANK="0", WORLD_SIZE=str(nodes), LOCAL_WORLD_SIZE="1",
                   GROUP_RANK=str(node), GROUP_WORLD_SIZE=str(nodes), NODE_RANK=str(node),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, TORCHELASTIC_RUN_ID="test-run",
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(script), *args], env=env))
    codes = [p.wait(timeout=timeout) for p in procs]
    assert codes == [0] * nodes


def test_two_level_sync_over_two_nodes_of_two_processes_gives_the_gradients_of_a_flat_all_reduce(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(TWO_LEVEL_SCRIPT)
    for name in ("two", "flat", "one"):
        (tmp_path / name).mkdir()
    # Each node's one process widens itself to two ranks: 2 nodes x 2 processes.
    _run_as_nodes(script, [str(tmp_path / "two"), "auto", "2", "2", "4"], nodes=2)
    _run_as_nodes(script, [str(tmp_path / "flat"), "flat", "2", "2", "4"], nodes=2)
    subprocess.run([sys.executable, str(script), str(tmp_path / "one"), "flat", "1", "1", "16"],
                   check=True, env=_clean_env(), timeout=300)
    two = [torch.load(tmp_path / "two" / f"rank{r}.pt", weights_only=False) for r in range(4)]
    flat = [torch.load(tmp_path / "flat" / f"rank{r}.pt", weights_only=False) for r in range(4)]
    one = torch.load(tmp_path / "one" / "rank0.pt", weights_only=False)
    assert [t["world"] for t in two] == [4] * 4 and [t["rank"] for t in two] == [0, 1, 2, 3]
    # "auto" chose two-level for several machines of several ranks, and its hook summed
    # every bucket of every step; "flat" left it to DDP.
    assert all(t["sync"] == "two-level" and t["buckets"] >= 3 for t in two)
    assert all(t["sync"] == "flat" and t["buckets"] == 0 for t in flat)
    for step in range(3):
        for i, g in enumerate(two[0]["grads"][step]):
            for r in range(1, 4):
                assert torch.equal(g, two[r]["grads"][step][i]), (step, i, r)
            assert torch.allclose(g, flat[0]["grads"][step][i], rtol=1e-12, atol=1e-15), (step, i)
            # ... and both are the gradient one process computes on the four ranks' batches.
            assert torch.allclose(g, one["grads"][step][i], rtol=1e-10, atol=1e-13), (step, i)
    assert not torch.allclose(two[0]["grads"][0][0], two[0]["grads"][2][0])


LIGHTNING_SCRIPT = '''
import os
import sys

import gpulayer.pytorch as glt

glt.launch(devices=2)

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Linear(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.seen = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen += len(x)
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


torch.manual_seed(0)
x = torch.randn(64, 4)
y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
torch.manual_seed(int(os.environ["RANK"]) + 1)
module = Linear()
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=8))
torch.save({"rank": trainer.global_rank, "world": trainer.world_size, "seen": module.seen, "pid": os.getpid(),
            "environment": type(trainer.strategy.cluster_environment).__name__,
            "state": module.state_dict()}, f"{sys.argv[1]}/rank{trainer.global_rank}.pt")
'''

ACCELERATE_SCRIPT = '''
import os
import sys

import gpulayer.pytorch as glt

glt.launch(devices=2)

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

accelerator = Accelerator()
torch.manual_seed(0)
x = torch.randn(64, 4)
y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
torch.manual_seed(accelerator.process_index + 1)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(TensorDataset(x, y), batch_size=8))
seen = 0
for epoch in range(2):
    for xb, yb in loader:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        seen += len(xb)
torch.save({"rank": accelerator.process_index, "world": accelerator.num_processes, "seen": seen,
            "pid": os.getpid(), "type": str(accelerator.distributed_type),
            "state": accelerator.unwrap_model(model).state_dict()}, f"{sys.argv[1]}/rank{accelerator.process_index}.pt")
'''


@pytest.mark.parametrize("library", ["lightning", "accelerate"])
def test_a_real_script_with_launch_added_runs_as_two_processes_that_agree(tmp_path, library):
    import subprocess
    import sys

    pytest.importorskip(library)
    script = tmp_path / "train.py"
    script.write_text(LIGHTNING_SCRIPT if library == "lightning" else ACCELERATE_SCRIPT)
    subprocess.run([sys.executable, str(script), str(tmp_path)], check=True, env=_clean_env(), timeout=300)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert [r["rank"] for r in ranks] == [0, 1] and [r["world"] for r in ranks] == [2, 2]
    assert ranks[0]["pid"] != ranks[1]["pid"]
    if library == "lightning":
        # Recognised as launched from outside (not ranks computed from LOCAL_RANK).
        assert ranks[0]["environment"] == "TorchElasticEnvironment"
    else:
        # Distributed on the CPU, not two single processes that both think they are rank 0.
        assert ranks[0]["type"] == "DistributedType.MULTI_CPU"
    # Each process read half of the 64 samples per epoch, and their weights agree.
    assert [r["seen"] for r in ranks] == [64, 64]
    for k in ranks[0]["state"]:
        assert torch.equal(ranks[0]["state"][k], ranks[1]["state"][k]), k


def test_launch_exits_non_zero_when_a_rank_it_started_fails(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "fail.py"
    script.write_text(
        "import os, sys\nimport gpulayer.pytorch as glt\nglt.launch(devices=2)\n"
        "if os.environ['RANK'] == '1':\n    sys.exit(3)\n"
    )
    done = subprocess.run([sys.executable, str(script)], env=_clean_env(), timeout=120,
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert "the run's other ranks failed: rank 1 exited with code 3" in done.stderr


REMOTE_SCRIPT = LINEAR_SCRIPT + '''
module = Linear()
trainer = glt.Trainer(accelerator="cpu", num_nodes=2, max_epochs=2, target="remote", log_every_n_steps=1)
trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=8))
w = ",".join(f"{v:.6f}" for v in module.net.weight.flatten().tolist())
where = f"in job {os.environ['GPULAYER_JOB_ID']} rank {trainer.global_rank} of {trainer.world_size}" if os.environ.get("GPULAYER_JOB_ID") else "here"
print(f"{where}: step {trainer.global_step} weights {w} outputs {trainer.outputs} last {trainer.last_checkpoint}", flush=True)
'''


def test_a_remote_fit_submits_its_script_as_a_two_node_job_and_brings_the_trained_weights_back(bare_server, tmp_path):
    import subprocess
    import sys

    bare_server.join("node-a", slots=1)
    bare_server.join("node-b", slots=1)
    bare_server.wait_for_workers(2)
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(REMOTE_SCRIPT)
    env = dict(_clean_env(), XDG_CONFIG_HOME=bare_server.env["XDG_CONFIG_HOME"],
               GPULAYER_URL=bare_server.url, GPULAYER_TOKEN=bare_server.token,
               GPULAYER_FINGERPRINT=bare_server.fingerprint)
    env.pop("GPULAYER_JOB_ID", None)
    done = subprocess.run([sys.executable, "project/train.py"], cwd=tmp_path, env=env, timeout=300,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    in_job = {r: next((l for l in lines if f"rank {r} of 2: step 8 weights " in l), None) for r in (0, 1)}
    assert all(in_job.values()), done.stdout + done.stderr
    here = next(l for l in lines if l.startswith("here: "))
    weights = in_job[0].split(" weights ")[1].split(" outputs ")[0]
    # Both nodes trained the same weights; the submitting process got them back (from rank
    # 0's last checkpoint, downloaded with the job's outputs), and its step count.
    assert in_job[1].split(" weights ")[1].split(" outputs ")[0] == weights
    assert here.startswith(f"here: step 8 weights {weights} outputs job-")
    outputs = tmp_path / here.split(" outputs ")[1].split(" last ")[0]
    assert (outputs / "rank-0" / "checkpoints" / "last.ckpt").is_file()
    assert here.endswith("rank-0/checkpoints/last.ckpt")
    assert "fitting as job" in done.stderr


#: The resumed run's module (the script's, and the test's own for the checks before any start).
RESUME_NET = '''
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                       torch.nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.02, momentum=0.9)
'''

DDP_RESUME_SCRIPT = '''
import os
import sys
import torch
import gpulayer.pytorch as glt
from torch.utils.data import DataLoader, TensorDataset

out, ckpts, max_steps, resume = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
torch.manual_seed(0)
x = torch.randn(96, 4)
y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])


''' + RESUME_NET + '''


module = Net()
# Each rank's own seed (the first process's is 7; DDP starts every rank from its weights):
# their dropout masks differ, so each rank's random state must come back as it was.
torch.manual_seed(7 + int(os.environ.get("RANK", "0")))
trainer = glt.Trainer(accelerator="cpu", devices=2, max_epochs=3, checkpoint_dir=ckpts,
                      max_steps=int(max_steps) if max_steps != "none" else None)
trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True),
            ckpt_path=None if resume == "none" else resume)
torch.save({"state": module.state_dict(), "step": trainer.global_step}, f"{out}/rank{trainer.global_rank}.pt")
'''


def test_a_ddp_run_resumed_mid_epoch_ends_bit_for_bit_where_an_uninterrupted_one_ends(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(DDP_RESUME_SCRIPT)
    for d in ("whole", "first", "second", "ck-whole", "ck-cut"):
        (tmp_path / d).mkdir()

    def run(out, ckpts, max_steps, resume):
        subprocess.run([sys.executable, str(script), str(tmp_path / out), str(tmp_path / ckpts), max_steps, resume],
                       check=True, env=dict(_clean_env(), OMP_NUM_THREADS="1"), timeout=300)

    # 96 samples, 2 ranks of batch 8: 6 steps an epoch, 18 in all; cut after 8 (epoch 1, step 2).
    run("whole", "ck-whole", "none", "none")
    run("first", "ck-cut", "8", "none")
    cut = torch.load(tmp_path / "ck-cut" / "last.ckpt", weights_only=False)
    assert (cut["global_step"], cut["epoch"], cut["batches_done"], cut["world_size"]) == (8, 1, 2, 2)
    assert len(cut["rng_per_rank"]) == 2
    assert not torch.equal(cut["rng_per_rank"][0]["torch"], cut["rng_per_rank"][1]["torch"])
    run("second", "ck-cut", "none", str(tmp_path / "ck-cut" / "last.ckpt"))
    whole = [torch.load(tmp_path / "whole" / f"rank{r}.pt", weights_only=False) for r in range(2)]
    resumed = [torch.load(tmp_path / "second" / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert [w["step"] for w in whole] == [18, 18] and [r["step"] for r in resumed] == [18, 18]
    for r in range(2):
        for k, v in whole[r]["state"].items():
            assert torch.equal(v, resumed[r]["state"][k]), (r, k)
    # A checkpoint of 2 processes does not resume in 1.
    with pytest.raises(glt.TrainerError, match="written by a run of 2 process.es., this one has 1"):
        glt.Trainer(accelerator="cpu").fit(resume_net(), DataLoader(data(), batch_size=8),
                                            ckpt_path=str(tmp_path / "ck-cut" / "last.ckpt"))


def resume_net():
    scope = {"torch": torch}
    exec(RESUME_NET, scope)
    return scope["Net"]()
