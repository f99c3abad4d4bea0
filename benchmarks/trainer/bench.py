#!/usr/bin/env python3
"""gpulayer.pytorch's Trainer against a hand-written PyTorch loop (the floor) and PyTorch
Lightning's Trainer, on the CPU, in one process and one run, alternating.

Cases (SGD, cross-entropy, synthetic data held in memory, one LightningModule class that all
three train — the hand loop calls its `net` directly):

  mlp   784-512-512-10, fp32, batch 256: compute-bound, where a lean loop should cost ~0
  tiny  32-32-10, fp32, batch 32: per-step overhead dominates

For each case and round, each system fits `--steps` steps from a fresh copy of the same
initial weights; ms/step is the fit's wall time over its steps (after one warm-up fit each).
Also the start-up time: from constructing the Trainer to the end of the first step.
Lightning runs with its logger, checkpointing, progress bar and model summary off.

Prints one JSON object; benchmarks/RESULTS.md records the runs. Needs torch and lightning:

    python3 -m venv ~/.cache/gpulayer/trainer-venv
    ~/.cache/gpulayer/trainer-venv/bin/pip install torch lightning ./python
    ~/.cache/gpulayer/trainer-venv/bin/python benchmarks/trainer/bench.py

On a machine with an NVIDIA GPU, the CUDA cases (MLP fp32, MLP fp16 mixed, CNN fp16 mixed
batch 128):

    ~/.cache/gpulayer/trainer-venv/bin/python benchmarks/trainer/bench.py --accelerator cuda

Usage: bench.py [--accelerator cpu|cuda] [--steps N] [--rounds R] [--cases mlp,tiny,...]
"""

import argparse
import copy
import json
import statistics
import time
import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.pytorch as glt

CASES = {
    "mlp": {"sizes": [784, 512, 512, 10], "batch": 256, "precision": "32-true"},
    "tiny": {"sizes": [32, 32, 10], "batch": 32, "precision": "32-true"},
    # The CUDA cases (run with --accelerator cuda; the defaults there).
    "mlp16": {"sizes": [784, 512, 512, 10], "batch": 256, "precision": "16-mixed"},
    "cnn": {"cnn": True, "batch": 128, "precision": "32-true"},
    "cnn16": {"cnn": True, "batch": 128, "precision": "16-mixed"},
}

DEFAULT_CASES = {"cpu": "mlp,tiny", "cuda": "mlp,mlp16,cnn16"}


def make_module(case):
    import lightning as L

    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            if case.get("cnn"):
                # A small CNN on 3x32x32 images (CIFAR-sized).
                nn = torch.nn
                self.net = nn.Sequential(
                    nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                    nn.MaxPool2d(2), nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
                    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
                )
                return
            sizes = case["sizes"]
            layers = []
            for a, b in zip(sizes, sizes[1:]):
                layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
            self.net = torch.nn.Sequential(*layers[:-1])

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Classifier()


def loader(case, steps, accelerator):
    g = torch.Generator().manual_seed(0)
    batch = case["batch"]
    shape = (3, 32, 32) if case.get("cnn") else (case["sizes"][0],)
    x = torch.randn(batch * steps, *shape, generator=g)
    y = torch.randint(0, 10, (batch * steps,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch, pin_memory=accelerator == "cuda")


def synchronize(accelerator):
    if accelerator == "cuda":
        torch.cuda.synchronize()


class FirstStep:
    """Records when the first step ended."""

    def __init__(self):
        self.at = None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self.at is None:
            self.at = time.perf_counter()


def hand(module, data, steps, accelerator, precision):
    """The floor: what a careful person writes by hand (autocast and a GradScaler for fp16,
    batches copied without blocking, no per-step sync)."""
    t0 = time.perf_counter()
    device = torch.device(accelerator)
    model = module.net.to(device)
    opt = module.configure_optimizers()
    fp16 = precision == "16-mixed"
    scaler = torch.amp.GradScaler(accelerator) if fp16 else None
    if accelerator == "cuda":
        torch.backends.cudnn.benchmark = True
    first = None
    for i, (x, y) in enumerate(data):
        if i == steps:
            break
        if accelerator != "cpu":
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        if fp16:
            with torch.autocast(accelerator, dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        if first is None:
            synchronize(accelerator)
            first = time.perf_counter()
    synchronize(accelerator)
    return time.perf_counter() - t0, first - t0


def ours(module, data, steps, accelerator, precision):
    t0 = time.perf_counter()
    first = FirstStep()
    glt.Trainer(accelerator=accelerator, precision=precision, max_steps=steps, callbacks=[first],
                checkpoint_dir=None).fit(module, data)
    synchronize(accelerator)
    return time.perf_counter() - t0, first.at - t0


def lightning(module, data, steps, accelerator, precision):
    import lightning as L

    class First(FirstStep, L.Callback):
        def __init__(self):
            FirstStep.__init__(self)

    t0 = time.perf_counter()
    first = First()
    trainer = L.Trainer(
        accelerator=accelerator, devices=1, precision=precision, max_steps=steps, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[first],
    )
    trainer.fit(module, data)
    synchronize(accelerator)
    return time.perf_counter() - t0, first.at - t0


SYSTEMS = {"hand": hand, "gpulayer": ours, "lightning": lightning}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--accelerator", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--cases", default=None, help="default: mlp,tiny on cpu; mlp,mlp16,cnn16 on cuda")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    accel = args.accelerator
    out = {"steps": args.steps, "rounds": args.rounds, "threads": torch.get_num_threads(),
           "torch": torch.__version__, "accelerator": accel}
    if accel == "cuda":
        out["gpu"] = torch.cuda.get_device_name(0)
    import lightning as L

    out["lightning"] = L.__version__
    for case in (args.cases or DEFAULT_CASES[accel]).split(","):
        c = CASES[case]
        torch.manual_seed(0)
        initial = make_module(c)
        data = loader(c, args.steps, accel)
        per_step = {k: [] for k in SYSTEMS}
        startup = {k: [] for k in SYSTEMS}
        for name, run in SYSTEMS.items():  # warm-up
            run(copy.deepcopy(initial), data, min(20, args.steps), accel, c["precision"])
        for _ in range(args.rounds):
            for name, run in SYSTEMS.items():
                took, first = run(copy.deepcopy(initial), data, args.steps, accel, c["precision"])
                per_step[name].append(took / args.steps * 1000)
                startup[name].append(first * 1000)
        med = {k: statistics.median(v) for k, v in per_step.items()}
        out[case] = {
            "ms_per_step": {k: [round(x, 3) for x in v] for k, v in per_step.items()},
            "median_ms_per_step": {k: round(v, 3) for k, v in med.items()},
            "gpulayer_over_hand": round(med["gpulayer"] / med["hand"], 3),
            "lightning_over_hand": round(med["lightning"] / med["hand"], 3),
            "lightning_over_gpulayer": round(med["lightning"] / med["gpulayer"], 3),
            "median_ms_to_first_step": {k: round(statistics.median(v), 1) for k, v in startup.items()},
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
