#!/usr/bin/env python3
"""gpulayer.pytorch's Trainer against a hand-written PyTorch loop (the floor) and PyTorch
Lightning's Trainer, on the CPU, in one process and one run, alternating.

Cases (SGD, cross-entropy, synthetic data held in memory, one LightningModule class that all
three train — the hand loop calls its `net` directly):

  mlp   784-512-512-10, fp32, batch 256: compute-bound, where a lean loop should cost ~0
  tiny  32-32-10, fp32, batch 32: per-step overhead dominates
  ddp   2 CPU processes (gloo), 64-256-256-10, fp32, batch 64 per process: each system
        starts its own ranks (hand: the script starts its second rank itself, as torchrun
        would; ours: Trainer(devices=2); Lightning: strategy="ddp", devices=2), ms/step is
        rank 0's time from the end of step 1 to the end of the last step over the steps
        between, start-up from starting the first process to the end of step 1

For each case and round, each system fits `--steps` steps from a fresh copy of the same
initial weights (the order of the three rotating from round to round); ms/step is the fit's wall time over its steps (after one warm-up fit each).
Also the start-up time: from constructing the Trainer to the end of the first step.
Lightning runs with its logger, checkpointing, progress bar and model summary off.

Prints one JSON object; benchmarks/RESULTS.md records the runs. Needs torch and lightning
(the venv ./scripts/test makes has both, and gpulayer):

    ~/.cache/gpulayer/venv/bin/python benchmarks/trainer/bench.py

or, on its own:

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
    "ddp": {"sizes": [64, 256, 256, 10], "batch": 64, "precision": "32-true", "ddp": 2},
}

DEFAULT_CASES = {"cpu": "mlp,tiny,ddp", "cuda": "mlp,mlp16,cnn16"}


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


# -- DDP: every system in processes of its own --------------------------------------------

DDP_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
           "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GPULAYER_TRAINER_RANK")


class StepTimes:
    """The end of every step, on this rank."""

    def __init__(self):
        self.ends = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.ends.append(time.time())


def ddp_data(case, steps, world):
    g = torch.Generator().manual_seed(0)
    n = case["batch"] * steps * world
    x = torch.randn(n, case["sizes"][0], generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return TensorDataset(x, y)


def ddp_run(system, steps, out):
    """One DDP fit of `system`, in this process and the ranks it (or its Trainer) starts;
    rank 0 writes its step ends to `out`."""
    import os
    import subprocess
    import sys

    case = CASES["ddp"]
    world = case["ddp"]
    torch.manual_seed(0)
    module = make_module(case)
    dataset = ddp_data(case, steps, world)
    times = StepTimes()
    rank = int(os.environ.get("RANK", "0"))
    if system == "hand":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.data import DistributedSampler

        children = []
        if "RANK" not in os.environ:
            port = str(_free_port())
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE=str(world), RANK="0")
            for r in range(1, world):
                children.append(subprocess.Popen([sys.executable, *sys.argv], env=dict(os.environ, RANK=str(r))))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        model = DistributedDataParallel(module.net)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        data = DataLoader(dataset, batch_size=case["batch"],
                          sampler=DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False))
        for x, y in data:
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            times.ends.append(time.time())
        dist.destroy_process_group()
        for c in children:
            assert c.wait() == 0
    elif system == "gpulayer":
        trainer = glt.Trainer(accelerator="cpu", devices=world, max_steps=steps, callbacks=[times])
        trainer.fit(module, DataLoader(dataset, batch_size=case["batch"]))
        rank = trainer.global_rank
    else:
        import lightning as L

        class Times(StepTimes, L.Callback):
            pass

        times = Times()
        trainer = L.Trainer(
            accelerator="cpu", devices=world, strategy="ddp", max_steps=steps, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            callbacks=[times],
        )
        trainer.fit(module, DataLoader(dataset, batch_size=case["batch"]))
        rank = trainer.global_rank
    if rank == 0:
        with open(out, "w") as f:
            json.dump(times.ends, f)


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp_case(steps, rounds):
    """Each system's DDP fits, alternating, each in fresh processes."""
    import os
    import subprocess
    import sys
    import tempfile

    env = {k: v for k, v in os.environ.items() if k not in DDP_ENV}
    # Two processes on this machine's cores: one thread each, as torchrun sets.
    env["OMP_NUM_THREADS"] = "1"
    per_step = {k: [] for k in SYSTEMS}
    startup = {k: [] for k in SYSTEMS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds + 1):  # the first round warms the file cache
            for name in rotated(r):
                out = os.path.join(tmp, f"{name}-{r}.json")
                t0 = time.time()
                subprocess.run([sys.executable, os.path.abspath(__file__), "--ddp-run", name,
                                "--steps", str(steps), "--out", out], check=True, env=env)
                with open(out) as f:
                    ends = json.load(f)
                assert len(ends) == steps, (name, len(ends))
                if r == 0:
                    continue
                per_step[name].append((ends[-1] - ends[0]) / (len(ends) - 1) * 1000)
                startup[name].append((ends[0] - t0) * 1000)
    return per_step, startup


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--accelerator", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--cases", default=None, help="default: mlp,tiny,ddp on cpu; mlp,mlp16,cnn16 on cuda")
    ap.add_argument("--ddp-run", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    if args.ddp_run:
        ddp_run(args.ddp_run, args.steps, args.out)
        return
    accel = args.accelerator
    out = {"steps": args.steps, "rounds": args.rounds, "threads": torch.get_num_threads(),
           "torch": torch.__version__, "accelerator": accel}
    if accel == "cuda":
        out["gpu"] = torch.cuda.get_device_name(0)
    import lightning as L

    out["lightning"] = L.__version__
    for case in (args.cases or DEFAULT_CASES[accel]).split(","):
        c = CASES[case]
        if c.get("ddp"):
            per_step, startup = ddp_case(args.steps, args.rounds)
        else:
            per_step, startup = in_process_case(c, args.steps, args.rounds, accel)
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


def rotated(r):
    """The systems in round r's order: each round starts with the next one, so none always
    runs first (after the previous case) or last."""
    names = list(SYSTEMS)
    k = r % len(names)
    return names[k:] + names[:k]


def in_process_case(c, steps, rounds, accel):
    """Each system's fits of one case in this process, alternating."""
    torch.manual_seed(0)
    initial = make_module(c)
    data = loader(c, steps, accel)
    per_step = {k: [] for k in SYSTEMS}
    startup = {k: [] for k in SYSTEMS}
    for name, run in SYSTEMS.items():  # warm-up
        run(copy.deepcopy(initial), data, min(20, steps), accel, c["precision"])
    for r in range(rounds):
        for name in rotated(r):
            took, first = SYSTEMS[name](copy.deepcopy(initial), data, steps, accel, c["precision"])
            per_step[name].append(took / steps * 1000)
            startup[name].append(first * 1000)
    return per_step, startup


if __name__ == "__main__":
    main()
