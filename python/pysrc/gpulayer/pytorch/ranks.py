"""The ranks of a multi-process run on one machine: the first process starts the others by
running the same script again (as Lightning's launcher does, and as a GPUlayer multi-node
job runs the same script everywhere), each with torchrun's environment, and every rank joins
one process group (gloo on CPU, NCCL on CUDA).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any, List, Optional

#: Set in the processes a Trainer started: their rank. Its absence marks the first process.
RANK_ENV = "GPULAYER_TRAINER_RANK"


class Ranks:
    """This process's place in the run, and (in the first process) the others."""

    def __init__(self, rank: int, world: int, local_rank: int, children: List[subprocess.Popen]) -> None:
        self.rank = rank
        self.world = world
        self.local_rank = local_rank
        self.children = children

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    def wait_for_the_others(self) -> Optional[str]:
        """In the first process: waits for the ranks it started; what went wrong, if any."""
        failed = []
        for i, child in enumerate(self.children, start=1):
            code = child.wait()
            if code != 0:
                failed.append(f"rank {i} exited with code {code}")
        return "; ".join(failed) or None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(devices: int, num_nodes: int = 1) -> Ranks:
    """Starts (first process) or joins (a started one) a run of `devices` ranks per node on
    `num_nodes` nodes. An environment that already says where this process is (torchrun's,
    a GPUlayer multi-node job's) is joined as it is, if it holds that many ranks; across
    nodes it is the only way (nothing here starts processes on other machines)."""
    world = devices * num_nodes
    if os.environ.get(RANK_ENV) is not None or os.environ.get("TORCHELASTIC_RUN_ID"):
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(devices)))
        if launched != world or per_node != devices:
            raise RuntimeError(
                f"the launcher started {launched} processes ({per_node} per node), but the Trainer "
                f"asks for devices={devices} x num_nodes={num_nodes} = {world}: make them agree "
                "(gpulayer submit --nodes N --procs-per-node M)"
            )
        return Ranks(
            int(os.environ.get("RANK", "0")),
            launched,
            int(os.environ.get("LOCAL_RANK", "0")),
            [],
        )
    if num_nodes > 1:
        raise RuntimeError(
            f"num_nodes={num_nodes} needs a process started on every node: submit the script as a "
            f"multi-node job (gpulayer submit --nodes {num_nodes} --procs-per-node {devices} -- "
            "python train.py), or run it under torchrun"
        )
    script = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c", "-") else None
    if script is None or not os.path.exists(script):
        raise RuntimeError(
            "devices > 1 starts the other ranks by running this script again: run it as a "
            "file (python train.py), not from -c or an interactive session"
        )
    base = dict(os.environ)
    base.setdefault("MASTER_ADDR", "127.0.0.1")
    base.setdefault("MASTER_PORT", str(_free_port()))
    common = {
        "WORLD_SIZE": str(devices),
        "LOCAL_WORLD_SIZE": str(devices),
        "GROUP_RANK": "0",
        "NODE_RANK": "0",
    }
    children = []
    for rank in range(1, devices):
        env = dict(base, **common, RANK=str(rank), LOCAL_RANK=str(rank), **{RANK_ENV: str(rank)})
        children.append(subprocess.Popen([sys.executable, *sys.argv], env=env))
    os.environ.update({k: base[k] for k in ("MASTER_ADDR", "MASTER_PORT")})
    os.environ.update(common, RANK="0", LOCAL_RANK="0", **{RANK_ENV: "0"})
    return Ranks(0, devices, 0, children)


def join_group(ranks: Ranks, device: Any) -> None:
    """Joins the process group of the run (the store at MASTER_ADDR:MASTER_PORT)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=ranks.rank, world_size=ranks.world)
