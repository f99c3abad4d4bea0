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
    with pytest.raises(glt.TrainerError, match="target='remote' is not in this release yet"):
        glt.Trainer(accelerator="cpu", target="remote")
    with pytest.raises(glt.TrainerError, match="no checkpoint at"):
        glt.Trainer(accelerator="cpu").fit(Regression(), [], ckpt_path=str(tmp_path / "nope.ckpt"))


DDP_SCRIPT = '''
import sys
import torch
import gpulayer.pytorch as glt
from torch.utils.data import DataLoader, TensorDataset

out, devices, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
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


# A seed per rank (1 for rank 0 and for the single process): DDP must start every rank from
# rank 0's weights.
import os
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
