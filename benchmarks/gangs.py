#!/usr/bin/env python3
"""Multi-node jobs: launch overhead against torchrun by hand, and how fast a failing gang stops.

launch   The same 2 nodes x 2 processes torch DDP job (gloo, CPU) started two ways on this
         machine, alternating, ROUNDS times each after one discarded warm-up of each:
           gpulayer  `gpulayer submit --nodes 2 --procs-per-node 2 -- python init.py` on a
                     fleet of two idle `gpulayer join` workers (embedded PostgreSQL);
           torchrun  two `torchrun --nnodes 2 --nproc-per-node 2 --node-rank K
                     --master-addr 127.0.0.1 --master-port P init.py`, started together as a
                     person would on two hosts (static rendezvous, torchrun's defaults otherwise).
         The figure is from the moment the command is started to the last of the four ranks
         returning from `init_process_group` (each rank appends its wall clock to a file).
         Both pay the same `import torch` in every rank; what differs is everything around it.
         A third way gives the machine's floor: the four rank processes spawned directly with
         MASTER_ADDR/PORT, RANK and WORLD_SIZE set (what any launcher must at least do).

failure  NODES simulated nodes (`gpulayer join` workers with a recorded CPU inventory), one
         gang job of NODES x 1 processes whose every rank sleeps except one, which exits 1 once
         all are running. The figure is from that rank's exit (its own clock, just before
         `os._exit`) to the last other rank's process being gone (polled in /proc every ms),
         and to the job being marked failed (the server's `finished_at`).

Prints one JSON object per mode; benchmarks/RESULTS.md records the runs.

Usage: benchmarks/gangs.py launch  [--rounds N] [--python PY] [--bin PATH]
       benchmarks/gangs.py failure [--rounds N] [--nodes N] [--bin PATH]
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "loadtest"))
from fleet import Fleet  # noqa: E402  (the load test's fleet of real `gpulayer join` workers)

INIT = """
import os, sys, time, torch.distributed as dist
dist.init_process_group("gloo")
t = time.time()
with open(sys.argv[1], "a") as f:
    f.write(f"{os.environ['RANK']} {t}\\n")
dist.destroy_process_group()
"""

FAIL = """
import os, sys, time
marks, nodes = sys.argv[1], int(sys.argv[2])
with open(os.path.join(marks, os.environ["RANK"]), "w") as f:
    f.write(str(os.getpid()))
if os.environ["RANK"] == str(nodes // 2):
    while len(os.listdir(marks)) < nodes:
        time.sleep(0.005)
    with open(os.path.join(marks, "..", "failed_at"), "w") as f:
        f.write(repr(time.time()))
    os._exit(1)
time.sleep(600)
"""


def parse_ts(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def stats(values):
    return {
        "min_s": round(min(values), 3),
        "median_s": round(statistics.median(values), 3),
        "max_s": round(max(values), 3),
        "runs": [round(v, 3) for v in values],
    }


def last_rank_ready(path: str, ranks: int, timeout: float = 120) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path):
            lines = open(path).read().split()
            if len(lines) == 2 * ranks:
                return max(float(t) for t in lines[1::2])
        time.sleep(0.002)
    raise SystemExit(f"not every rank reached init_process_group within {timeout} s ({path})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args) -> dict:
    torchrun = shutil.which("torchrun", path=os.path.dirname(args.python)) or shutil.which("torchrun")
    if not torchrun:
        raise SystemExit(f"no torchrun next to {args.python} nor on PATH")
    fleet = Fleet(args.bin, 2, 2)
    try:
        src = os.path.join(fleet.home, "src")
        os.makedirs(src)
        with open(os.path.join(src, "init.py"), "w") as f:
            f.write(INIT)
        env = dict(fleet.env, GLOO_SOCKET_IFNAME="lo")

        def by_gpulayer(marks):
            t0 = time.time()
            job = json.loads(fleet.cli(
                "submit", "--json", "--source", src, "--accelerator", "cpu", "--nodes", "2",
                "--procs-per-node", "2", "--env", "GLOO_SOCKET_IFNAME=lo", "--",
                args.python, "init.py", marks))["id"]
            ready = last_rank_ready(marks, 4)
            fleet.cli("wait", str(job), check=False)
            state = json.loads(fleet.cli("status", str(job), "--json"))["state"]
            if state != "succeeded":
                raise SystemExit(f"job {job} {state}: {fleet.cli('logs', str(job))}")
            return ready - t0

        def started_together(what, commands, marks):
            """Starts (argv, env) pairs at once; seconds until every rank is initialized."""
            t0 = time.time()
            procs = [subprocess.Popen(argv, env=e, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True) for argv, e in commands]
            ready = last_rank_ready(marks, 4)
            for p in procs:
                if p.wait(timeout=60) != 0:
                    raise SystemExit(f"{what} failed: {p.stderr.read()}")
            return ready - t0

        def by_torchrun(marks):
            port = str(free_port())
            return started_together("torchrun", [
                ([torchrun, "--nnodes", "2", "--nproc-per-node", "2", "--node-rank", str(k),
                  "--master-addr", "127.0.0.1", "--master-port", port,
                  os.path.join(src, "init.py"), marks], env)
                for k in range(2)
            ], marks)

        def by_hand(marks):
            port = str(free_port())
            return started_together("a rank started by hand", [
                ([args.python, os.path.join(src, "init.py"), marks],
                 dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(r),
                      WORLD_SIZE="4", LOCAL_RANK=str(r % 2), OMP_NUM_THREADS="1"))
                for r in range(4)
            ], marks)

        times = {"gpulayer": [], "torchrun": [], "processes": []}
        runs = (("torchrun", by_torchrun), ("gpulayer", by_gpulayer), ("processes", by_hand))
        for i in range(args.rounds + 1):
            for name, run in runs:
                marks = os.path.join(fleet.home, f"{name}-{i}.txt")
                took = run(marks)
                if i > 0:  # round 0 warms the page cache for torch's import
                    times[name].append(took)
        g, t = statistics.median(times["gpulayer"]), statistics.median(times["torchrun"])
        return {
            "mode": "launch",
            "layout": "2 nodes x 2 processes, gloo, CPU",
            "gpulayer_submit_to_all_ranks_initialized": stats(times["gpulayer"]),
            "torchrun_start_to_all_ranks_initialized": stats(times["torchrun"]),
            "processes_alone_start_to_all_ranks_initialized": stats(times["processes"]),
            "gpulayer_over_torchrun_median": round(g / t, 3),
            "gpulayer_over_processes_alone_median": round(g / statistics.median(times["processes"]), 3),
            "saved_median_s": round(t - g, 3),
        }
    finally:
        fleet.close()


def alive(pid: int) -> bool:
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def failure(args) -> dict:
    fleet = Fleet(args.bin, args.nodes, 1)
    try:
        script = os.path.join(fleet.home, "fail.py")
        with open(script, "w") as f:
            f.write(FAIL)
        stopped, marked = [], []
        for i in range(args.rounds):
            run = os.path.join(fleet.home, f"run-{i}")
            marks = os.path.join(run, "marks")
            os.makedirs(marks)
            job = json.loads(fleet.cli(
                "submit", "--json", "--nodes", str(args.nodes), "--", sys.executable, script,
                marks, str(args.nodes)))["id"]
            failed_path = os.path.join(run, "failed_at")
            deadline = time.time() + 60
            while not os.path.exists(failed_path):
                if time.time() > deadline:
                    raise SystemExit(f"job {job}'s ranks never all started: {fleet.cli('status', str(job))}")
                time.sleep(0.001)
            failing = str(args.nodes // 2)
            pids = [int(open(os.path.join(marks, r)).read()) for r in os.listdir(marks) if r != failing]
            while any(alive(p) for p in pids):
                if time.time() > deadline:
                    raise SystemExit(f"job {job}'s ranks still run a minute on")
                time.sleep(0.001)
            gone = time.time()
            failed_at = float(open(failed_path).read())
            fleet.cli("wait", str(job), check=False)
            view = json.loads(fleet.cli("status", str(job), "--json"))
            if view["state"] != "failed" or f"rank {failing} exited with code 1" not in (view["reason"] or ""):
                raise SystemExit(f"job {job}: {view['state']}: {view['reason']}")
            stopped.append(gone - failed_at)
            marked.append(parse_ts(view["finished_at"]) - failed_at)
            reason = view["reason"]
        return {
            "mode": "failure",
            "nodes": args.nodes,
            "rank_exit_to_last_rank_gone": stats(stopped),
            "rank_exit_to_job_failed": stats(marked),
            "reason": reason,
        }
    finally:
        fleet.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["launch", "failure"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--python", default=os.environ.get("GPULAYER_TEST_PYTHON", sys.executable))
    ap.add_argument("--bin", default=os.environ.get("GPULAYER_BIN", "gpulayer"))
    args = ap.parse_args()
    result = launch(args) if args.mode == "launch" else failure(args)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
