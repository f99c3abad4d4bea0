"""``launch()``: an existing PyTorch Lightning or Accelerate script runs across processes and
nodes with this one call added at its top, no torchrun. It sets what those libraries read to
recognise an external launcher — torchrun's variables; ``TORCHELASTIC_RUN_ID``, without
which Lightning silently computes ranks from ``LOCAL_RANK``/``NODE_RANK`` itself;
``ACCELERATE_USE_CPU=1`` without CUDA, without which Accelerate stays in one process on the
CPU; ``RANK`` for every process, without which two Accelerate processes both think they are
rank 0 — and starts the node's other ranks by running the script again.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any, Optional

from gpulayer.pytorch.ranks import Ranks, launched_by_someone, start
from gpulayer.pytorch.trainer import TrainerError


def launch(devices: Any = "auto", num_nodes: Optional[int] = None) -> Ranks:
    """Makes an existing Lightning or Accelerate script run as `devices` processes per node
    on `num_nodes` nodes: call it first thing. It sets what those libraries read to recognise
    an external launcher (torchrun's variables, ``TORCHELASTIC_RUN_ID`` for Lightning,
    ``ACCELERATE_USE_CPU`` without CUDA, else Accelerate stays in one process), starts the
    node's other ranks by running the script again, and makes the first process wait for
    them when the script ends (exiting non-zero when one failed)."""
    if num_nodes is None:
        num_nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1")) if launched_by_someone() else 1
    if not isinstance(num_nodes, int) or num_nodes < 1:
        raise TrainerError(f"num_nodes must be a positive whole number, not {num_nodes!r}")
    cuda = _cuda_devices()
    if devices == "auto":
        if launched_by_someone() and os.environ.get("LOCAL_WORLD_SIZE", "1") != "1":
            devices = int(os.environ["LOCAL_WORLD_SIZE"])
        else:
            devices = cuda or 1
    if not isinstance(devices, int) or devices < 1:
        raise TrainerError(f"devices must be a positive whole number or 'auto', not {devices!r}")
    if cuda and devices > cuda:
        raise TrainerError(f"devices={devices}, but this machine has {cuda} CUDA devices")
    if not cuda:
        os.environ["ACCELERATE_USE_CPU"] = "1"
    if devices * num_nodes == 1 and not launched_by_someone():
        return Ranks(0, 1, 0, 1, [])
    try:
        ranks = start(devices, num_nodes)
    except RuntimeError as e:
        raise TrainerError(str(e)) from None
    if ranks.children:
        _wait_at_exit(ranks)
    return ranks


def _cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _wait_at_exit(ranks: Ranks) -> None:
    """The first process's script ending is not the run's end: it waits for the ranks it
    started, and stops them instead when it dies of an exception."""
    previous = sys.excepthook

    def on_uncaught(kind: Any, value: Any, tb: Any) -> None:
        ranks.stop_the_others()
        previous(kind, value, tb)

    sys.excepthook = on_uncaught

    def at_exit() -> None:
        failed = ranks.wait_for_the_others()
        if failed:
            sys.stderr.write(f"gpulayer.pytorch.launch: the run's other ranks failed: {failed}\n")
            sys.stderr.flush()
            os._exit(1)

    atexit.register(at_exit)
