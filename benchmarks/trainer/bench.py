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

Usage: bench.py [--steps N] [--rounds R] [--cases mlp,tiny]
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
    "mlp": {"sizes": [784, 512, 512, 10], "batch": 256},
    "tiny": {"sizes": [32, 32, 10], "batch": 32},
}


def make_module(sizes):
    import lightning as L

    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
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


def loader(sizes, batch, steps):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch * steps, sizes[0], generator=g)
    y = torch.randint(0, sizes[-1], (batch * steps,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch)


class FirstStep:
    """Records when the first step ended."""

    def __init__(self):
        self.at = None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self.at is None:
            self.at = time.perf_counter()


def hand(module, data, steps):
    opt = module.configure_optimizers()
    model = module.net
    t0 = time.perf_counter()
    first = None
    for i, (x, y) in enumerate(data):
        if i == steps:
            break
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if first is None:
            first = time.perf_counter()
    return time.perf_counter() - t0, first - t0


def ours(module, data, steps):
    t0 = time.perf_counter()
    first = FirstStep()
    glt.Trainer(accelerator="cpu", max_steps=steps, callbacks=[first], checkpoint_dir=None).fit(module, data)
    return time.perf_counter() - t0, first.at - t0


def lightning(module, data, steps):
    import lightning as L

    class First(FirstStep, L.Callback):
        def __init__(self):
            FirstStep.__init__(self)

    t0 = time.perf_counter()
    first = First()
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[first],
    )
    trainer.fit(module, data)
    return time.perf_counter() - t0, first.at - t0


SYSTEMS = {"hand": hand, "gpulayer": ours, "lightning": lightning}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cases", default="mlp,tiny")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    out = {"steps": args.steps, "rounds": args.rounds, "threads": torch.get_num_threads(),
           "torch": torch.__version__}
    import lightning as L

    out["lightning"] = L.__version__
    for case in args.cases.split(","):
        c = CASES[case]
        torch.manual_seed(0)
        initial = make_module(c["sizes"])
        data = loader(c["sizes"], c["batch"], args.steps)
        per_step = {k: [] for k in SYSTEMS}
        startup = {k: [] for k in SYSTEMS}
        for name, run in SYSTEMS.items():  # warm-up
            run(copy.deepcopy(initial), data, min(20, args.steps))
        for _ in range(args.rounds):
            for name, run in SYSTEMS.items():
                took, first = run(copy.deepcopy(initial), data, args.steps)
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
