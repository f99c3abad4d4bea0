"""The Trainer: checks everything it is given before the first step, then runs a lean step
loop — no host-device sync per step (losses add up on the device and are read every
``log_every_n_steps``), callbacks called only for the hooks they define, autocast with a
GradScaler for fp16 (bf16 needs none), cuDNN autotune and batches copied on a side stream on
CUDA, gradients summed in two levels across machines — with checkpoints that resume
exactly where a run stopped, bit for bit (the data order of the interrupted epoch included).
"""

from __future__ import annotations

import gc
import os
import pickle
import random
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from gpulayer.errors import BadInput
from gpulayer.pytorch import ranks as _ranks

#: Lightning's precision names, and the autocast dtype each means (None: full precision).
PRECISIONS = ("32-true", "16-mixed", "bf16-mixed")

#: How gradients are summed across ranks: "flat" (one all-reduce over every rank, DDP's own),
#: "two-level" (inside each machine, then across machines; see `two_level_sync`), "auto"
#: (two-level when there are several machines with several ranks each).
GRADIENT_SYNCS = ("auto", "flat", "two-level")

#: The callback hooks the Trainer calls, with Lightning's signatures.
HOOKS = (
    "on_train_start",  # (trainer, module)
    "on_train_batch_end",  # (trainer, module, outputs, batch, batch_idx)
    "on_validation_end",  # (trainer, module)
    "on_save_checkpoint",  # (trainer, module, checkpoint)
    "on_train_end",  # (trainer, module)
)

#: What a checkpoint of this Trainer says it is (and which format).
CHECKPOINT_FORMAT = "gpulayer.pytorch/1"


class TrainerError(BadInput):
    """The Trainer was given something it cannot run with; nothing has started."""


class Callback:
    """Base class for callbacks (any object with some of the hook methods works too)."""

    def on_train_start(self, trainer: "Trainer", module: Any) -> None: ...

    def on_train_batch_end(
        self, trainer: "Trainer", module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None: ...

    def on_validation_end(self, trainer: "Trainer", module: Any) -> None: ...

    def on_save_checkpoint(self, trainer: "Trainer", module: Any, checkpoint: Dict[str, Any]) -> None: ...

    def on_train_end(self, trainer: "Trainer", module: Any) -> None: ...


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise TrainerError(
            "gpulayer.pytorch needs torch: install the build for this machine (https://pytorch.org)"
        ) from None
    return torch


def _defines(callback: Any, hook: str) -> bool:
    """Whether `callback` does something on `hook` (a Callback's inherited no-op does not)."""
    method = getattr(type(callback), hook, None)
    return callable(method) and method is not getattr(Callback, hook, None)


class Trainer:
    """Fits a module shaped like a LightningModule.

    accelerator: "cpu", "cuda", "mps" or "auto" (CUDA, then MPS, then CPU).
    devices: how many devices; more than 1 runs DDP, one process per device (the first
        process starts the others by running the same script again).
    precision: "32-true", "16-mixed" or "bf16-mixed".
    max_steps / max_epochs: when to stop (either; without both, one epoch).
    callbacks: objects with any of ``HOOKS``.
    checkpoint_dir: where checkpoints go (default: ``$GPULAYER_OUTPUT_DIR/checkpoints`` in a
        GPUlayer job, so they come back with ``gpulayer download``; else none): one per epoch
        (``epoch=E-step=S.ckpt``) and ``last.ckpt`` when fitting ends.
    log_every_n_steps: how often the summed losses are read from the device.
    target: "local", or "remote": ``fit`` submits the calling script as a job of
        ``num_nodes`` x ``devices`` processes, follows it, downloads its outputs and loads
        rank 0's last weights into the module (inside that job, the same line trains).
    gradient_sync: one of ``GRADIENT_SYNCS``; after ``fit`` starts, the one in use.
    """

    def __init__(
        self,
        accelerator: str = "auto",
        devices: Any = 1,
        num_nodes: int = 1,
        precision: str = "32-true",
        max_steps: Optional[int] = None,
        max_epochs: Optional[int] = None,
        callbacks: Optional[Sequence[Any]] = None,
        checkpoint_dir: Optional[str] = None,
        target: str = "local",
        log_every_n_steps: int = 50,
        gradient_sync: str = "auto",
    ) -> None:
        if str(precision) not in PRECISIONS:
            raise TrainerError(
                f"unknown precision {precision!r}: use one of {', '.join(map(repr, PRECISIONS))}"
            )
        if accelerator not in ("cpu", "cuda", "mps", "auto"):
            raise TrainerError(f"unknown accelerator {accelerator!r}: use 'cpu', 'cuda', 'mps' or 'auto'")
        if target not in ("local", "remote"):
            raise TrainerError(f"unknown target {target!r}: use 'local' or 'remote'")
        for name, value in (("max_steps", max_steps), ("max_epochs", max_epochs)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise TrainerError(f"{name} must be a positive whole number, not {value!r}")
        if gradient_sync not in GRADIENT_SYNCS:
            raise TrainerError(
                f"unknown gradient_sync {gradient_sync!r}: use one of {', '.join(map(repr, GRADIENT_SYNCS))}"
            )
        if not isinstance(log_every_n_steps, int) or log_every_n_steps < 1:
            raise TrainerError(f"log_every_n_steps must be a positive whole number, not {log_every_n_steps!r}")
        self.precision = str(precision)
        self.max_steps = max_steps
        self.max_epochs = max_epochs if max_epochs is not None or max_steps is not None else 1
        self.callbacks: List[Any] = list(callbacks or [])
        # Inside a GPUlayer job checkpoints belong in the output directory, which comes back
        # with `gpulayer download` (the job's working directory does not).
        #: Where rank 0's checkpoints are inside its output directory (a remote fit finds
        #: them there in what comes back).
        self._checkpoints_in_outputs = (
            "checkpoints" if checkpoint_dir is None else None if os.path.isabs(checkpoint_dir) else checkpoint_dir
        )
        output_dir = os.environ.get("GPULAYER_OUTPUT_DIR")
        if output_dir and checkpoint_dir is None:
            checkpoint_dir = os.path.join(output_dir, "checkpoints")
        elif output_dir and not os.path.isabs(checkpoint_dir):
            checkpoint_dir = os.path.join(output_dir, checkpoint_dir)
        self.checkpoint_dir = checkpoint_dir
        self.log_every_n_steps = log_every_n_steps
        self.gradient_sync = gradient_sync
        #: Whether fit() submits this script as a job instead of training here: target
        #: "remote" outside a GPUlayer job (inside it, the job's processes train).
        self.remote = target == "remote" and not os.environ.get("GPULAYER_JOB_ID")
        self.accelerator = accelerator
        if self.remote:
            self._check_counts(devices, num_nodes)
            self.device = None
        else:
            self.device = self._choose_device(accelerator, devices, num_nodes)
        self.devices = 1 if devices == "auto" else int(devices)
        #: After a remote fit: the job, and where its outputs were downloaded.
        self.job: Any = None
        self.outputs: Optional[str] = None
        #: After a remote fit: the downloaded last.ckpt whose weights `module` now holds.
        self.last_checkpoint: Optional[str] = None
        self.num_nodes = num_nodes
        #: This process's rank and how many there are (0 and 1 in-process).
        self.global_rank = 0
        self.world_size = 1
        self._ranks: Optional[_ranks.Ranks] = None
        #: The groups of the two-level gradient sync when it is in use (its ``buckets`` count
        #: the buckets it has summed), else None.
        self.two_level: Optional[TwoLevelGroups] = None
        self.global_step = 0
        self.current_epoch = 0
        self.should_stop = False
        #: Metrics as last read from the device: ``train_loss`` (mean since the last read),
        #: what the module logged with ``self.log``, and validation means.
        self.callback_metrics: Dict[str, float] = {}
        self._hooks: Dict[str, List[Callable[..., Any]]] = {
            hook: [getattr(cb, hook) for cb in self.callbacks if _defines(cb, hook)] for hook in HOOKS
        }

    # -- set-up --------------------------------------------------------------------------

    @staticmethod
    def _check_counts(devices: Any, num_nodes: int) -> None:
        if devices != "auto" and (not isinstance(devices, int) or devices < 1):
            raise TrainerError(f"devices must be a positive whole number or 'auto', not {devices!r}")
        if not isinstance(num_nodes, int) or num_nodes < 1:
            raise TrainerError(f"num_nodes must be a positive whole number, not {num_nodes!r}")

    @staticmethod
    def _choose_device(accelerator: str, devices: Any, num_nodes: int) -> Any:
        torch = _torch()
        if accelerator == "auto":
            if torch.cuda.is_available():
                accelerator = "cuda"
            elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
                accelerator = "mps"
            else:
                accelerator = "cpu"
        if accelerator == "cuda":
            available = torch.cuda.device_count()
        elif accelerator == "mps":
            available = 1 if torch.backends.mps.is_available() else 0
        else:
            available = os.cpu_count() or 1
        if available == 0:
            raise TrainerError(
                f"accelerator={accelerator!r}, but this machine has no {accelerator} device: "
                "use accelerator='auto' (or 'cpu'), or run on a machine that has one"
            )
        if devices == "auto":
            devices = 1
        if not isinstance(devices, int) or devices < 1:
            raise TrainerError(f"devices must be a positive whole number or 'auto', not {devices!r}")
        if devices > available:
            unit = "CPU cores" if accelerator == "cpu" else f"{accelerator} devices"
            raise TrainerError(f"devices={devices}, but this machine has {available} {unit}")
        if not isinstance(num_nodes, int) or num_nodes < 1:
            raise TrainerError(f"num_nodes must be a positive whole number, not {num_nodes!r}")
        return torch.device(accelerator)

    @staticmethod
    def _check_module(module: Any) -> None:
        missing = [m for m in ("training_step", "configure_optimizers") if not callable(getattr(module, m, None))]
        if missing:
            raise TrainerError(
                f"{type(module).__name__} has no {' or '.join(missing)}: a module needs "
                "training_step(batch, batch_idx) and configure_optimizers()"
            )

    @staticmethod
    def _optimizers(configured: Any) -> Tuple[Any, List[Tuple[Any, str, int]]]:
        """configure_optimizers()'s answer in Lightning's shapes: the optimizer and its
        schedulers as (scheduler, interval, frequency)."""
        torch = _torch()
        optimizers: List[Any] = []
        schedulers: List[Tuple[Any, str, int]] = []

        def scheduler(s: Any) -> None:
            if isinstance(s, dict):
                schedulers.append((s["scheduler"], s.get("interval", "epoch"), int(s.get("frequency", 1))))
            else:
                schedulers.append((s, "epoch", 1))

        if isinstance(configured, torch.optim.Optimizer):
            optimizers = [configured]
        elif isinstance(configured, dict):
            optimizers = [configured["optimizer"]]
            if configured.get("lr_scheduler") is not None:
                scheduler(configured["lr_scheduler"])
        elif isinstance(configured, (list, tuple)) and len(configured) == 2 and all(
            isinstance(x, (list, tuple)) for x in configured
        ):
            optimizers = list(configured[0])
            for s in configured[1]:
                scheduler(s)
        elif isinstance(configured, (list, tuple)):
            optimizers = list(configured)
        if len(optimizers) != 1 or not isinstance(optimizers[0], torch.optim.Optimizer):
            raise TrainerError(
                "configure_optimizers() must return one optimizer (alone, in a list, as "
                "{'optimizer': ..., 'lr_scheduler': ...} or as ([optimizer], [schedulers])); "
                f"got {type(configured).__name__} with {len(optimizers)} optimizer(s)"
            )
        return optimizers[0], schedulers

    def _load_checkpoint(self, path: str, module: Any) -> Dict[str, Any]:
        torch = _torch()
        if not os.path.isfile(path):
            raise TrainerError(f"no checkpoint at {path}")
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e:  # noqa: BLE001 - any unreadable file is the same mistake
            raise TrainerError(f"{path} is not a checkpoint torch can read: {e}") from None
        if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
            raise TrainerError(f"{path} is not a gpulayer.pytorch checkpoint (no state_dict)")
        mine = module.state_dict()
        theirs = checkpoint["state_dict"]
        missing = sorted(set(mine) - set(theirs))
        unexpected = sorted(set(theirs) - set(mine))
        reshaped = [
            f"{k} {tuple(theirs[k].shape)} here {tuple(mine[k].shape)}"
            for k in mine
            if k in theirs and hasattr(theirs[k], "shape") and tuple(theirs[k].shape) != tuple(mine[k].shape)
        ]
        if missing or unexpected or reshaped:
            parts = []
            if missing:
                parts.append(f"missing {', '.join(missing[:5])}")
            if unexpected:
                parts.append(f"unexpected {', '.join(unexpected[:5])}")
            if reshaped:
                parts.append(f"shapes differ: {'; '.join(reshaped[:5])}")
            raise TrainerError(
                f"{path} is a checkpoint of a different model than {type(module).__name__}: {'; '.join(parts)}"
            )
        if checkpoint.get("format") != CHECKPOINT_FORMAT:
            raise TrainerError(
                f"{path} was not written by gpulayer.pytorch's Trainer ({CHECKPOINT_FORMAT}): "
                "load its weights with module.load_state_dict() and fit without ckpt_path"
            )
        return checkpoint

    # -- the loop ------------------------------------------------------------------------

    def fit(
        self,
        module: Any,
        train_data: Iterable[Any],
        val_data: Optional[Iterable[Any]] = None,
        ckpt_path: Optional[str] = None,
    ) -> None:
        """Trains `module` on `train_data` (any iterable of batches; a DataLoader usually),
        validating on `val_data` after each epoch when the module has ``validation_step``;
        from the checkpoint `ckpt_path` when given (weights, optimizer, schedulers, scaler,
        counters and random state: the run goes on as if never interrupted)."""
        torch = _torch()
        self._check_module(module)
        if not hasattr(train_data, "__iter__"):
            raise TrainerError(f"train_data must be iterable (a DataLoader), not {type(train_data).__name__}")
        world = self.devices * self.num_nodes
        checkpoint = self._load_checkpoint(ckpt_path, module) if ckpt_path else None
        if checkpoint is not None and checkpoint.get("world_size", 1) != world:
            raise TrainerError(
                f"{ckpt_path} was written by a run of {checkpoint.get('world_size', 1)} process(es), "
                f"this one has {world} (devices x num_nodes): resume with the same numbers, or load "
                "its weights with module.load_state_dict() and fit without ckpt_path"
            )
        if self.remote:
            self._fit_remotely(module, ckpt_path)
            return
        ranks = None
        if world > 1:
            try:
                ranks = _ranks.start(self.devices, self.num_nodes)
            except RuntimeError as e:
                raise TrainerError(str(e)) from None
        try:
            if ranks is not None:
                if self.device.type == "cuda":
                    self.device = torch.device("cuda", ranks.local_rank)
                    torch.cuda.set_device(self.device)
                _ranks.join_group(ranks, self.device)
                self._ranks = ranks
                self.global_rank, self.world_size = ranks.rank, ranks.world
                train_data = _shard(train_data, ranks)
                if val_data is not None:
                    val_data = _shard(val_data, ranks)
            self._fit(module, train_data, val_data, checkpoint)
        except BaseException:
            if ranks is not None:
                ranks.stop_the_others()
            raise
        finally:
            if ranks is not None:
                import torch.distributed as dist

                if dist.is_initialized():
                    # The DDP wrapper holds the process group and sits in reference cycles:
                    # collected now, the group really goes here — left to the interpreter's
                    # teardown, gloo's threads outlive it and the process aborts at exit.
                    gc.collect()
                    dist.destroy_process_group()
        if ranks is not None and ranks.is_first:
            failed = ranks.wait_for_the_others()
            if failed:
                raise RuntimeError(f"the run's other ranks failed: {failed}")

    def _fit_remotely(self, module: Any, ckpt_path: Optional[str]) -> None:
        """Submits the script that called fit() as a job of `num_nodes` nodes with `devices`
        processes each (the same command, its directory as the source), follows its output,
        downloads its outputs into ``job-ID-outputs`` (``self.outputs``) and loads the
        weights of rank 0's last checkpoint into `module`. Raises ``JobFailed`` if it failed."""
        import sys

        import gpulayer as gl

        argv = sys.argv
        script = argv[0] if argv and argv[0] not in ("", "-c", "-") else None
        if script is None or not os.path.isfile(script):
            raise TrainerError(
                "target='remote' submits the script that calls fit(): run it as a file "
                "(python train.py), not from -c or an interactive session"
            )
        source = os.path.dirname(os.path.abspath(script))
        if ckpt_path and os.path.relpath(os.path.abspath(ckpt_path), source).startswith(".."):
            raise TrainerError(
                f"ckpt_path {ckpt_path} is outside {source}, the directory that is shipped with "
                "target='remote': put the checkpoint there and give its path relative to it"
            )
        requirements: Dict[str, Any] = {
            "accelerator": "any" if self.accelerator == "auto" else self.accelerator,
            "frameworks": {"torch": None},
            "nodes": self.num_nodes,
            "procs_per_node": self.devices,
            "name": os.path.basename(script),
        }
        if self.accelerator in ("cuda", "mps"):
            requirements["devices"] = self.devices
        command = ["python", os.path.relpath(os.path.abspath(script), source), *argv[1:]]
        job = gl.submit(command, source=source, **requirements)
        self.job = job
        print(f"gpulayer.pytorch: fitting as job {job.id} ({self.num_nodes} node(s) x {self.devices} "
              "process(es))", file=sys.stderr, flush=True)
        job.logs(follow=True)
        job.wait()
        self.outputs = f"job-{job.id}-outputs"
        job.download(self.outputs)
        inside = self._checkpoints_in_outputs
        last = next(
            (p for p in (os.path.join(self.outputs, d, inside or "", "last.ckpt") for d in ("rank-0", ""))
             if inside is not None and os.path.isfile(p)),
            None,
        )
        if last is None:
            return
        self.last_checkpoint = last
        torch = _torch()
        checkpoint = torch.load(last, map_location="cpu", weights_only=False)
        module.load_state_dict(checkpoint["state_dict"])
        self.global_step = checkpoint["global_step"]
        self.current_epoch = checkpoint["epoch"]
        self.callback_metrics.update(checkpoint.get("callback_metrics", {}))

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    def _fit(self, module: Any, train_data: Iterable[Any], val_data: Optional[Iterable[Any]],
             checkpoint: Optional[Dict[str, Any]]) -> None:
        torch = _torch()
        device = self.device
        module.to(device)
        if not hasattr(module, "log"):
            module.log = self._log  # what a LightningModule calls; plain modules get ours
        try:
            module.trainer = self
        except (AttributeError, TypeError):
            pass
        optimizer, schedulers = self._optimizers(module.configure_optimizers())
        autocast_dtype = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}.get(self.precision)
        scaler = torch.amp.GradScaler(device.type) if self.precision == "16-mixed" else None
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = True
        self._logged: Dict[str, Any] = {}
        #: The steps' losses since the last read, detached, still on the device.
        self._losses: List[Any] = []
        batches_done = 0
        epoch_rng = None
        resumed_rng = None
        if checkpoint is not None:
            module.load_state_dict(checkpoint["state_dict"])
            optimizer.load_state_dict(checkpoint["optimizer_states"][0])
            for (s, _, _), state in zip(schedulers, checkpoint.get("lr_schedulers", [])):
                s.load_state_dict(state)
            if scaler is not None and checkpoint.get("scaler"):
                scaler.load_state_dict(checkpoint["scaler"])
            self.global_step = checkpoint["global_step"]
            self.current_epoch = checkpoint["epoch"]
            batches_done = checkpoint.get("batches_done", 0)
            # Every rank goes on from its own random state (its dropout masks differ).
            epoch_rng = checkpoint.get("epoch_rng_per_rank", [checkpoint.get("epoch_rng")])[self.global_rank]
            resumed_rng = checkpoint.get("rng_per_rank", [checkpoint["rng"]])[self.global_rank]

        self._epoch_rng: Optional[Dict[str, Any]] = None
        self._batches_done = 0

        # Under DDP the steps go through the wrapper's forward, which is what prepares the
        # gradients' all-reduce (in buckets, written straight into the gradients).
        step = module.training_step
        if self.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel

            wrapped = DistributedDataParallel(
                _wrap_steps(module),
                device_ids=[device.index] if device.type == "cuda" else None,
                gradient_as_bucket_view=True,
            )
            sync = self.gradient_sync
            if sync == "auto":
                sync = "two-level" if self._ranks.nodes > 1 and self._ranks.per_node > 1 else "flat"
            if sync == "two-level":
                self.two_level = _two_level_groups(self._ranks)
                wrapped.register_comm_hook(self.two_level, two_level_sync)
            self.gradient_sync = sync
            step = wrapped
        self._fire("on_train_start", module)
        module.train()
        while not self._finished():
            # The epoch's data order comes from the random state at its start: a run resumed
            # mid-epoch starts from that state again and skips what the interrupted run did,
            # then goes on from the state it stopped with.
            skipped = 0
            sampler = getattr(train_data, "sampler", None)
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(self.current_epoch)
            if checkpoint is not None and batches_done > 0 and epoch_rng is not None:
                _set_rng(epoch_rng)
                self._epoch_rng = epoch_rng
                batches = iter(train_data)
                for _ in range(batches_done):
                    next(batches)
                skipped = batches_done
                _set_rng(resumed_rng)
            else:
                if checkpoint is not None:
                    _set_rng(resumed_rng)
                # Only a checkpoint needs it (taking it costs ~80 us: numpy's state is large).
                self._epoch_rng = _rng_state() if self.checkpoint_dir else None
                batches = iter(train_data)
            checkpoint = None
            self._batches_done = skipped
            # What every step reads, looked up once (a tiny model's step is ~300 us, of
            # which each attribute lookup and call here is a part).
            losses = self._losses
            after_step = self._hooks["on_train_batch_end"]
            step_schedulers = [(s, every) for s, interval, every in schedulers if interval == "step"]
            stop_at = self.max_steps if self.max_steps is not None else float("inf")
            log_every = self.log_every_n_steps
            for batch_idx, batch in enumerate(_on_device(batches, device), start=skipped):
                if autocast_dtype is None:
                    outputs = step(batch, batch_idx)
                else:
                    with torch.autocast(device.type, dtype=autocast_dtype):
                        outputs = step(batch, batch_idx)
                loss = outputs["loss"] if isinstance(outputs, dict) else outputs
                if not isinstance(loss, torch.Tensor):
                    raise TrainerError(
                        f"training_step returned {type(outputs).__name__}: return the loss tensor or a dict with 'loss'"
                    )
                if scaler is not None:
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    loss.backward()
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                self.global_step = global_step = self.global_step + 1
                for s, every in step_schedulers:
                    if global_step % every == 0:
                        s.step()
                losses.append(loss.detach())
                if global_step % log_every == 0:
                    self._read_metrics()
                for hook in after_step:
                    hook(self, module, outputs, batch, batch_idx)
                if global_step >= stop_at or self.should_stop:
                    self._batches_done = batch_idx + 1
                    break
            else:
                self._end_epoch(module, schedulers, val_data, optimizer, scaler)
                batches_done = 0
                continue
            break
        self._read_metrics()
        self._save(module, optimizer, schedulers, scaler, "last.ckpt")
        self._fire("on_train_end", module)

    def _finished(self) -> bool:
        if self.should_stop:
            return True
        if self.max_steps is not None and self.global_step >= self.max_steps:
            return True
        return self.max_epochs is not None and self.current_epoch >= self.max_epochs

    def _end_epoch(self, module: Any, schedulers: List[Tuple[Any, str, int]], val_data: Any,
                   optimizer: Any, scaler: Any) -> None:
        for s, interval, every in schedulers:
            if interval == "epoch" and (self.current_epoch + 1) % every == 0:
                s.step()
        if val_data is not None and callable(getattr(module, "validation_step", None)):
            self._validate(module, val_data)
        self.current_epoch += 1
        self._batches_done = 0
        self._save(module, optimizer, schedulers, scaler,
                   f"epoch={self.current_epoch - 1}-step={self.global_step}.ckpt")

    def _validate(self, module: Any, val_data: Iterable[Any]) -> None:
        torch = _torch()
        module.eval()
        sums: Dict[str, Any] = {}
        n = 0
        with torch.no_grad():
            for batch_idx, batch in enumerate(val_data):
                out = module.validation_step(_to_device(batch, self.device), batch_idx)
                n += 1
                values = out if isinstance(out, dict) else ({"val_loss": out} if out is not None else {})
                for k, v in values.items():
                    if isinstance(v, torch.Tensor):
                        sums[k] = sums.get(k, 0) + v.detach().float()
        if self.world_size > 1:
            import torch.distributed as dist

            keys = sorted(sums)
            total = torch.stack([torch.as_tensor(sums[k], device=self.device) for k in keys]
                                + [torch.tensor(float(n), device=self.device)])
            dist.all_reduce(total)
            sums = {k: total[i] for i, k in enumerate(keys)}
            n = int(total[-1])
        for k, v in sums.items():
            self.callback_metrics[k] = float(v / max(n, 1))
        self._read_metrics()
        module.train()
        self._fire("on_validation_end", module)

    def _log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        """``self.log`` for modules that are not LightningModules: kept on the device until
        the next read."""
        torch = _torch()
        self._logged[name] = value.detach() if isinstance(value, torch.Tensor) else value

    def _read_metrics(self) -> None:
        """The one host-device sync: every ``log_every_n_steps`` and at the end."""
        torch = _torch()
        if self.world_size > 1:
            # Every rank reads at the same steps: the mean over all of them.
            import torch.distributed as dist

            summed = torch.stack(self._losses).float().sum() if self._losses else torch.zeros((), device=self.device)
            total = torch.stack([summed, torch.tensor(float(len(self._losses)), device=self.device)])
            dist.all_reduce(total)
            if total[1] > 0:
                self.callback_metrics["train_loss"] = float(total[0] / total[1])
        elif self._losses:
            self.callback_metrics["train_loss"] = float(torch.stack(self._losses).float().mean())
        self._losses.clear()
        for k, v in self._logged.items():
            self.callback_metrics[k] = float(v) if isinstance(v, torch.Tensor) else v

    def _fire(self, hook: str, module: Any, *args: Any) -> None:
        for h in self._hooks[hook]:
            h(self, module, *args)

    def _save(self, module: Any, optimizer: Any, schedulers: List[Tuple[Any, str, int]], scaler: Any,
              name: str) -> Optional[str]:
        if not self.checkpoint_dir:
            return None
        torch = _torch()
        rng = _rng_state()
        if self.world_size > 1:
            # Rank 0 writes every rank's random state (each rank's dropout masks differ);
            # every rank saves at the same points, so this gather is met on all of them.
            everyone = [pickle.loads(b) for b in _gather_bytes(pickle.dumps((self._epoch_rng, rng)), self.device)]
            if self.global_rank != 0:
                return None
            epoch_rngs, rngs = [e for e, _ in everyone], [r for _, r in everyone]
        else:
            epoch_rngs, rngs = [self._epoch_rng], [rng]
        checkpoint: Dict[str, Any] = {
            "format": CHECKPOINT_FORMAT,
            "state_dict": module.state_dict(),
            "optimizer_states": [optimizer.state_dict()],
            "lr_schedulers": [s.state_dict() for s, _, _ in schedulers],
            "scaler": scaler.state_dict() if scaler is not None else None,
            "epoch": self.current_epoch,
            "global_step": self.global_step,
            "batches_done": self._batches_done,
            "epoch_rng": self._epoch_rng,
            "rng": rng,
            "epoch_rng_per_rank": epoch_rngs,
            "rng_per_rank": rngs,
            "world_size": self.world_size,
            "precision": self.precision,
            "callback_metrics": dict(self.callback_metrics),
        }
        for h in self._hooks["on_save_checkpoint"]:
            h(self, module, checkpoint)
        os.makedirs(self.checkpoint_dir, exist_ok=True)
        path = os.path.join(self.checkpoint_dir, name)
        partial = f"{path}.partial-{os.getpid()}"
        torch.save(checkpoint, partial)
        os.replace(partial, path)
        if name != "last.ckpt":
            # The newest epoch's checkpoint is also the one to resume from.
            last = os.path.join(self.checkpoint_dir, "last.ckpt")
            torch.save(checkpoint, f"{last}.partial-{os.getpid()}")
            os.replace(f"{last}.partial-{os.getpid()}", last)
        return path


class TwoLevelGroups:
    """The process groups of a two-level sync, and how many buckets it has summed."""

    def __init__(self, node: Any, across: Any, per_node: int, local_rank: int, world: int) -> None:
        self.node = node
        self.across = across
        self.per_node = per_node
        self.local_rank = local_rank
        self.world = world
        self.buckets = 0


def _two_level_groups(ranks: Any) -> TwoLevelGroups:
    import torch.distributed as dist

    # Every rank creates every group, in the same order (a collective of its own).
    node, _ = dist.new_subgroups_by_enumeration(
        [list(range(n * ranks.per_node, (n + 1) * ranks.per_node)) for n in range(ranks.nodes)]
    )
    across, _ = dist.new_subgroups_by_enumeration(
        [list(range(j, ranks.world, ranks.per_node)) for j in range(ranks.per_node)]
    )
    return TwoLevelGroups(node, across, ranks.per_node, ranks.local_rank, ranks.world)


def two_level_sync(groups, bucket):  # type: ignore[no-untyped-def]
    """A DDP communication hook: a bucket's gradients summed inside the machine first (fast
    links), then across machines by one all-reduce per slice — each of a machine's ranks
    carries its own 1/per_node of the bucket to the same rank of the other machines, so all
    of the machines' links work at once and each carries a fraction of the bucket — then the
    slices gathered back inside the machine, and the sum averaged as DDP's own does.

    The collectives are issued in bucket order on every rank (DDP calls hooks in that order)
    and wait in turn; on NCCL a wait only orders the GPU streams, not the host. (No
    annotations: DDP accepts only dist.GradBucket and Future[Tensor] there, or none.)"""
    torch = _torch()
    import torch.distributed as dist

    flat = bucket.buffer()
    dist.all_reduce(flat, group=groups.node)
    n = flat.numel()
    chunk = -(-n // groups.per_node)
    padded = flat.new_zeros(chunk * groups.per_node)
    padded[:n].copy_(flat)
    mine = padded[groups.local_rank * chunk:(groups.local_rank + 1) * chunk]
    dist.all_reduce(mine, group=groups.across)
    slices = [torch.empty_like(mine) for _ in range(groups.per_node)]
    dist.all_gather(slices, mine, group=groups.node)
    flat.copy_(torch.cat(slices)[:n]).div_(groups.world)
    groups.buckets += 1
    done: Any = torch.futures.Future()
    done.set_result(flat)
    return done


def _steps_class() -> Any:
    torch = _torch()

    class Steps(torch.nn.Module):
        """The module as DDP wraps it: its forward is a training step."""

        def __init__(self, module: Any) -> None:
            super().__init__()
            self.module = module

        def forward(self, batch: Any, batch_idx: int) -> Any:
            return self.module.training_step(batch, batch_idx)

    return Steps


def _wrap_steps(module: Any) -> Any:
    return _steps_class()(module)


def _shard(data: Any, ranks: Any) -> Any:
    """A DataLoader as this rank reads it: the same loader over its share of the dataset
    (shuffled the same way on every rank when the original was). Other iterables are the
    caller's to shard."""
    from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

    if not isinstance(data, DataLoader) or data.batch_size is None:
        return data
    sampler = DistributedSampler(
        data.dataset,
        num_replicas=ranks.world,
        rank=ranks.rank,
        shuffle=isinstance(data.sampler, RandomSampler),
        seed=0,  # the same on every rank, whatever each process's own seed
        drop_last=data.drop_last,
    )
    return DataLoader(
        data.dataset,
        batch_size=data.batch_size,
        sampler=sampler,
        num_workers=data.num_workers,
        collate_fn=data.collate_fn,
        pin_memory=data.pin_memory,
        drop_last=data.drop_last,
    )


def _gather_bytes(payload: bytes, device: Any) -> List[bytes]:
    """Every rank's `payload`, in rank order, on every rank: each rank fills its own row of
    a zeroed table and an all-reduce adds the rows up. (Not all_gather_object, nor gloo's
    all_gather: with either, a rank that goes on to exit sometimes aborts in the
    interpreter's teardown, "terminate called without an active exception".)"""
    torch = _torch()
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    lengths = torch.zeros(world, dtype=torch.long, device=device)
    lengths[rank] = len(payload)
    dist.all_reduce(lengths)
    table = torch.zeros(world, int(lengths.max()), dtype=torch.uint8, device=device)
    table[rank, : len(payload)] = torch.tensor(list(payload), dtype=torch.uint8, device=device)
    dist.all_reduce(table)
    return [bytes(table[r, : int(n)].tolist()) for r, n in enumerate(lengths.tolist())]


def _on_device(batches: Iterable[Any], device: Any) -> Iterable[Any]:
    """The batches as the steps take them. On the CPU as they come (there is nothing to move,
    and the per-step walk through a batch is what a tiny model would notice). On CUDA each
    batch is copied on a side stream when the loop asks for it — while the GPU still runs the
    previous step, which the host has only queued (no per-step sync) — and the step's stream
    waits for that copy alone, so the copy overlaps the previous step instead of queueing
    behind it (asynchronous from the host with ``pin_memory=True`` in the DataLoader).
    Taking batches only when asked keeps the order of the random draws of a run without the
    prefetch, so resume stays exact."""
    if device.type == "cpu":
        return batches
    if device.type != "cuda":
        return (_to_device(b, device) for b in batches)
    return _copied_on_a_side_stream(batches, device)


def _copied_on_a_side_stream(batches: Iterable[Any], device: Any) -> Iterator[Any]:
    torch = _torch()
    side = torch.cuda.Stream(device)
    for batch in batches:
        main = torch.cuda.current_stream(device)
        with torch.cuda.stream(side):
            moved = _to_device(batch, device)
        main.wait_stream(side)
        # Memory made on the side stream and used on the main one: the allocator must not
        # reuse it until the main stream is done with it.
        for t in _tensors(moved):
            t.record_stream(main)
        yield moved


def _tensors(batch: Any) -> Iterator[Any]:
    torch = _torch()
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, (list, tuple)):
        for b in batch:
            yield from _tensors(b)
    elif isinstance(batch, dict):
        for b in batch.values():
            yield from _tensors(b)


def _to_device(batch: Any, device: Any) -> Any:
    torch = _torch()
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, (list, tuple)):
        moved = [_to_device(b, device) for b in batch]
        return type(batch)(moved) if not hasattr(batch, "_fields") else type(batch)(*moved)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


def _rng_state() -> Dict[str, Any]:
    torch = _torch()
    state: Dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    # (is_initialized alone: is_available asks NVML each time, a millisecond at every epoch.)
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy

        state["numpy"] = numpy.random.get_state()
    except ImportError:
        pass
    return state


def _set_rng(state: Dict[str, Any]) -> None:
    torch = _torch()
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        try:
            import numpy

            numpy.random.set_state(state["numpy"])
        except ImportError:
            pass


__all__ = ["Callback", "Trainer", "TrainerError", "PRECISIONS", "HOOKS", "GRADIENT_SYNCS", "two_level_sync"]
