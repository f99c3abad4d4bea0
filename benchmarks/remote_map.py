#!/usr/bin/env python3
"""Remote functions against Ray on the same machine, in the same run.

Both get the same parallelism (SLOTS, default: this machine's cores): GPUlayer as `gpulayer
up --with-worker --worker-slots SLOTS` (embedded PostgreSQL; the worker's warm runners use
this interpreter), Ray as a local cluster `ray.init(num_cpus=SLOTS)`. After a warm-up map of
200 calls on each (so both have their worker processes up), it measures, alternating:

  map     N trivial calls (`lambda x: x + 1` as a module-level function): `list(f.map(range(N)))`
          against `ray.get([f.remote(i) for i in range(N)])`; calls per second.
  single  M calls of `.remote()` one after another on the warm fleet: `f.remote(i)` against
          `ray.get(f.remote(i))`; the p50 and p95 of each call's latency.

Prints one JSON object; benchmarks/RESULTS.md records the runs. Needs `gpulayer` (the
package, built from python/) and `ray` importable by this interpreter.

Usage: benchmarks/remote_map.py [--calls N] [--singles M] [--slots S] [--rounds R]
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def inc(x):
    return x + 1


def pct(values, p):
    values = sorted(values)
    return values[max(0, min(len(values) - 1, round(p / 100 * (len(values) - 1))))]


class GpulayerFleet:
    def __init__(self, slots):
        self.home = tempfile.mkdtemp(prefix="gpulayer-remote-bench-")
        env = dict(os.environ, XDG_CONFIG_HOME=os.path.join(self.home, "config"), GPULAYER_LOG="warn")
        env.pop("GPULAYER_URL", None)
        env.pop("GPULAYER_TOKEN", None)
        binary = shutil.which("gpulayer", path=os.path.dirname(sys.executable)) or "gpulayer"
        self.up = subprocess.Popen(
            [binary, "up", "--json", "--listen", "127.0.0.1:0", "--data-dir", os.path.join(self.home, "data"),
             "--with-worker", "--worker-slots", str(slots), "--worker-python", sys.executable],
            env=env, stdout=subprocess.PIPE, text=True,
        )
        ready = json.loads(self.up.stdout.readline())
        import gpulayer as gl

        gl.connect(ready["url"], ready["admin_token"], ready.get("fingerprint"))
        deadline = time.time() + 60
        while True:
            try:
                gl.remote(inc).remote(0)
                break
            except gl.GpulayerError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        self.f = gl.remote(inc)

    def map(self, n):
        return list(self.f.map(range(n)))

    def single(self, i):
        return self.f.remote(i)

    def close(self):
        self.up.send_signal(signal.SIGTERM)
        try:
            self.up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.up.kill()
        pointer = os.path.join(self.home, "data", "postgres", "cluster.path")
        if os.path.exists(pointer):
            cluster = open(pointer).read().strip()
            if not cluster.startswith(self.home):
                shutil.rmtree(cluster, ignore_errors=True)
        shutil.rmtree(self.home, ignore_errors=True)


class RayCluster:
    def __init__(self, slots):
        import ray

        self.ray = ray
        ray.init(num_cpus=slots, include_dashboard=False, log_to_driver=False)
        self.f = ray.remote(inc)

    def map(self, n):
        return self.ray.get([self.f.remote(i) for i in range(n)])

    def single(self, i):
        return self.ray.get(self.f.remote(i))

    def close(self):
        self.ray.shutdown()


def measure(system, calls, singles):
    t = time.perf_counter()
    got = system.map(calls)
    took = time.perf_counter() - t
    assert got == [i + 1 for i in range(calls)], "wrong results"
    lat = []
    for i in range(singles):
        t = time.perf_counter()
        assert system.single(i) == i + 1
        lat.append((time.perf_counter() - t) * 1000)
    return calls / took, lat


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=10_000)
    ap.add_argument("--singles", type=int, default=200)
    ap.add_argument("--slots", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    systems = {"gpulayer": GpulayerFleet(args.slots), "ray": RayCluster(args.slots)}
    try:
        for s in systems.values():
            s.map(200)  # warm-up: worker processes up, imports done
        rate = {k: [] for k in systems}
        lat = {k: [] for k in systems}
        for _ in range(args.rounds):
            for name, s in systems.items():
                r, l = measure(s, args.calls, args.singles)
                rate[name].append(r)
                lat[name].extend(l)
        out = {"calls": args.calls, "singles": args.singles, "slots": args.slots, "rounds": args.rounds}
        for name in systems:
            out[name] = {
                "map_calls_per_s": [round(r, 1) for r in rate[name]],
                "single_p50_ms": round(statistics.median(lat[name]), 2),
                "single_p95_ms": round(pct(lat[name], 95), 2),
            }
        g, r = out["gpulayer"], out["ray"]
        out["map_rate_gpulayer_over_ray"] = round(statistics.median(rate["gpulayer"]) / statistics.median(rate["ray"]), 3)
        out["single_p50_ray_over_gpulayer"] = round(r["single_p50_ms"] / g["single_p50_ms"], 3)
        print(json.dumps(out, indent=2))
    finally:
        for s in systems.values():
            s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
