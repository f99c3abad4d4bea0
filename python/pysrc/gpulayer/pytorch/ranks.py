"""The ranks of a multi-process run: the first process on a machine starts the others by
running the same script again (as Lightning's launcher does, and as a GPUlayer multi-node
job runs the same script everywhere), each with torchrun's environment, and every rank joins
one process group (gloo on CPU, NCCL on CUDA). Used by the Trainer and by ``launch()``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from typing import Any, Dict, List, Optional, Tuple

#: Set in the processes this module started: their rank. Its absence marks the first process.
RANK_ENV = "GPULAYER_TRAINER_RANK"


class Ranks:
    """This process's place in the run, and (in a node's first process) the others it started."""

    def __init__(
        self, rank: int, world: int, local_rank: int, per_node: int,
        children: List[Tuple[int, subprocess.Popen]],
    ) -> None:
        self.rank = rank
        self.world = world
        self.local_rank = local_rank
        #: Ranks per node: the run's ranks are numbered node by node (node n holds
        #: n*per_node .. (n+1)*per_node-1), as torchrun and GPUlayer's gang jobs number them.
        self.per_node = per_node
        #: The ranks this process started: (global rank, process).
        self.children = children

    @property
    def nodes(self) -> int:
        return self.world // self.per_node

    @property
    def node(self) -> int:
        return self.rank // self.per_node

    @property
    def is_first(self) -> bool:
        return self.local_rank == 0

    def wait_for_the_others(self) -> Optional[str]:
        """In a node's first process: waits for the ranks it started; what went wrong, if any."""
        failed = []
        for rank, child in self.children:
            code = child.wait()
            if code != 0:
                failed.append(f"rank {rank} exited with code {code}")
        return "; ".join(failed) or None

    def stop_the_others(self) -> None:
        """In a node's first process that failed: the ranks it started would wait for it in
        their next collective until its timeout; they stop now."""
        for _, child in self.children:
            if child.poll() is None:
                child.terminate()
        for _, child in self.children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In a started rank (Linux): it goes when the process that started it goes, however that
    one ends, instead of waiting for it forever in a collective."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def launched_by_someone() -> bool:
    """Whether the environment already says where this process is (torchrun's, a GPUlayer
    multi-node job's, or this module's own started ranks)."""
    return os.environ.get(RANK_ENV) is not None or bool(os.environ.get("TORCHELASTIC_RUN_ID"))


def _script_argv() -> List[str]:
    script = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c", "-") else None
    if script is None or not os.path.exists(script):
        raise RuntimeError(
            "more than one process per node starts the others by running this script again: run "
            "it as a file (python train.py), not from -c or an interactive session"
        )
    return [sys.executable, *sys.argv]


def _rank_env(rank: int, local_rank: int, world: int, per_node: int, node: int) -> Dict[str, str]:
    """torchrun's variables for one rank (what Lightning, Accelerate and torch.distributed's
    ``env://`` read)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(per_node),
        "GROUP_RANK": str(node),
        "GROUP_WORLD_SIZE": str(world // per_node),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world),
        "NODE_RANK": str(node),
        RANK_ENV: str(rank),
    }


def start(devices: int, num_nodes: int = 1) -> Ranks:
    """Starts (a node's first process) or joins (a started one) a run of `devices` ranks per
    node on `num_nodes` nodes.

    An environment that already says where this process is (torchrun's, a GPUlayer multi-node
    job's) is joined as it is when it holds that many ranks, `devices` per node; one that
    holds one process per node (a job submitted with one process per node) is widened here:
    each node's process starts the node's other ranks. Across nodes a launcher is the only
    way (nothing here starts processes on other machines)."""
    world = devices * num_nodes
    if launched_by_someone():
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(devices)))
        if launched == world and per_node == devices:
            return Ranks(
                int(os.environ.get("RANK", "0")),
                launched,
                int(os.environ.get("LOCAL_RANK", "0")),
                per_node,
                [],
            )
        if not (per_node == 1 and launched == num_nodes and os.environ.get(RANK_ENV) is None):
            raise RuntimeError(
                f"the launcher started {launched} processes ({per_node} per node), but the run "
                f"asks for devices={devices} x num_nodes={num_nodes} = {world}: make them agree "
                "(gpulayer submit --nodes N --procs-per-node M)"
            )
        node = int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", os.environ.get("RANK", "0"))))
        return _start_node(devices, num_nodes, node, dict(os.environ))
    if num_nodes > 1:
        raise RuntimeError(
            f"num_nodes={num_nodes} needs a process started on every node: submit the script as a "
            f"multi-node job (gpulayer submit --nodes {num_nodes} --procs-per-node {devices} -- "
            "python train.py), or run it under torchrun"
        )
    base = dict(os.environ)
    base.setdefault("MASTER_ADDR", "127.0.0.1")
    base.setdefault("MASTER_PORT", str(_free_port()))
    # Lightning recognises an external launcher by this (without it, it computes ranks from
    # LOCAL_RANK and NODE_RANK itself).
    base.setdefault("TORCHELASTIC_RUN_ID", f"gpulayer-{uuid.uuid4().hex[:12]}")
    return _start_node(devices, 1, 0, base)


def _start_node(devices: int, num_nodes: int, node: int, base: Dict[str, str]) -> Ranks:
    """Starts this node's ranks after the first (this process) and gives this process the
    first one's environment."""
    world = devices * num_nodes
    first = node * devices
    children = []
    if devices > 1:
        argv = _script_argv()
        for local in range(1, devices):
            env = dict(base, **_rank_env(first + local, local, world, devices, node))
            children.append((first + local, subprocess.Popen(argv, env=env, preexec_fn=_die_with_parent)))
    for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        if k in base:
            os.environ[k] = base[k]
    os.environ.update(_rank_env(first, 0, world, devices, node))
    return Ranks(first, world, 0, devices, children)


def join_group(ranks: Ranks, device: Any) -> None:
    """Joins the process group of the run (the store at MASTER_ADDR:MASTER_PORT)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=ranks.rank, world_size=ranks.world)
