#!/usr/bin/env python3
"""Submit-to-start latency on an idle fleet, against this machine's own process-spawn time.

Starts `gpulayer up --with-worker` (embedded PostgreSQL) in a temporary directory, then submits
N trivial jobs one at a time, waiting for each to finish so the worker is idle (parked in its
long poll) when the next one arrives. For each job it reads the server's own timestamps:

  assign = assigned_at - created_at   (NOTIFY -> held poll wakes -> claim commits)
  start  = started_at  - created_at   (assign + the answer reaching the worker + spawn + report)

In the same run it times `subprocess.run(["true"])` (spawn + exit + reap) as the floor any
process-based queue pays. Prints one JSON object; benchmarks/RESULTS.md records the runs.

Usage: benchmarks/submit_to_start.py [--jobs N] [--bin PATH]
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime


def parse_ts(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def pct(values, p):
    values = sorted(values)
    k = max(0, min(len(values) - 1, round(p / 100 * (len(values) - 1))))
    return values[k]


def summary(ms):
    return {
        "p50_ms": round(statistics.median(ms), 2),
        "p95_ms": round(pct(ms, 95), 2),
        "max_ms": round(max(ms), 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--bin", default=os.environ.get("GPULAYER_BIN", "gpulayer"))
    args = ap.parse_args()

    home = tempfile.mkdtemp(prefix="gpulayer-bench-")
    env = dict(os.environ, XDG_CONFIG_HOME=os.path.join(home, "config"))
    env.pop("GPULAYER_URL", None)
    env.pop("GPULAYER_TOKEN", None)
    up = subprocess.Popen(
        [args.bin, "up", "--json", "--listen", "127.0.0.1:0", "--with-worker",
         "--data-dir", os.path.join(home, "data")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        json.loads(up.stdout.readline())  # ready

        def cli(*a):
            out = subprocess.run([args.bin, *a], env=env, capture_output=True, text=True, check=True)
            return out.stdout

        # Wait for the embedded worker to register.
        deadline = time.time() + 30
        while not json.loads(cli("workers", "--json"))["workers"]:
            if time.time() > deadline:
                raise SystemExit("the embedded worker never registered")
            time.sleep(0.05)

        assign_ms, start_ms = [], []
        for _ in range(args.jobs):
            job = json.loads(cli("submit", "--json", "--", "true"))["id"]
            subprocess.run([args.bin, "wait", str(job)], env=env, check=True, capture_output=True)
            view = json.loads(cli("status", str(job), "--json"))
            created = parse_ts(view["created_at"])
            assign_ms.append((parse_ts(view["assigned_at"]) - created) * 1000)
            start_ms.append((parse_ts(view["started_at"]) - created) * 1000)

        spawn_ms = []
        for _ in range(args.jobs):
            t = time.perf_counter()
            subprocess.run(["true"], check=True)
            spawn_ms.append((time.perf_counter() - t) * 1000)

        result = {
            "jobs": args.jobs,
            "submit_to_assigned": summary(assign_ms),
            "submit_to_started": summary(start_ms),
            "direct_spawn_true": summary(spawn_ms),
            "started_over_spawn_p50": round(statistics.median(start_ms) / statistics.median(spawn_ms), 1),
        }
        print(json.dumps(result, indent=2))
        return 0
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()
        # Under root the embedded cluster may live outside the temp dir; remove it too.
        pointer = os.path.join(home, "data", "postgres", "cluster.path")
        if os.path.exists(pointer):
            cluster = open(pointer).read().strip()
            if not cluster.startswith(home):
                subprocess.run(["rm", "-rf", cluster])
        subprocess.run(["rm", "-rf", home])


if __name__ == "__main__":
    sys.exit(main())
