#!/usr/bin/env python3
"""Fleet load test: N simulated workers x M slots (real `gpulayer join` processes advertising a
recorded CPU inventory), K trivial `true` jobs submitted in batches, against this machine's
own limit measured in the same run.

Reports, as one JSON object:
  - throughput: jobs/s from the first submit to the last completion, read from PostgreSQL
    (jobs.created_at, tasks.finished_at), and the same number of `true` processes spawned
    directly with the same parallelism (`xargs -P N*M`), with the ratio. The direct spawn runs
    before the fleet starts and again after it stops, and the ratio is to their mean: on a
    shared machine the speed drifts within a minute;
  - submit->start latency p50/p99 on the idle fleet (jobs submitted one at a time);
  - exactly-once checks from the database: every job succeeded, none ran twice;
  - with --cpu-window S: the CPU each part of the system spent per job over S seconds of the
    throughput phase (PostgreSQL, the API, the workers, the processes they started), from
    /proc, next to the CPU per `true` of the direct spawn.

Usage:
  loadtest/fleet.py [--workers 32] [--slots 4] [--jobs 10000] [--latency-jobs 200]
                    [--cpu-window 0] [--bin PATH]
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

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_by_part():
    """CPU seconds so far of every process, by part of the system: its own and its reaped
    children's (the `true` processes a worker started are its children)."""
    parts = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline") as f:
                cmd = f.read().split("\0")
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        own, kids = int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
        if comm == "postgres":
            name = "postgres"
        elif comm == "gpulayer" and len(cmd) > 1 and cmd[1] in ("up", "join"):
            name = {"up": "api", "join": "workers"}[cmd[1]]
        else:
            continue
        parts[name] = parts.get(name, 0) + own
        if name == "workers":
            parts["their jobs"] = parts.get("their jobs", 0) + kids
    return {k: v / CLOCK_TICKS for k, v in parts.items()}


def pct(values, p):
    values = sorted(values)
    k = max(0, min(len(values) - 1, round(p / 100 * (len(values) - 1))))
    return values[k]


class Fleet:
    def __init__(self, bin_path, workers, slots):
        self.bin = bin_path
        self.home = tempfile.mkdtemp(prefix="gpulayer-fleet-")
        self.env = dict(os.environ, XDG_CONFIG_HOME=os.path.join(self.home, "config"), GPULAYER_LOG="warn")
        self.env.pop("GPULAYER_URL", None)
        self.env.pop("GPULAYER_TOKEN", None)
        self.data = os.path.join(self.home, "data")
        self.up = subprocess.Popen(
            [self.bin, "up", "--json", "--listen", "127.0.0.1:0", "--data-dir", self.data],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        ready = json.loads(self.up.stdout.readline())
        self.url, self.join_token = ready["url"], ready["join_token"]
        # Workers and CLI runs pin the server's self-signed certificate.
        if ready.get("fingerprint"):
            self.env["GPULAYER_FINGERPRINT"] = ready["fingerprint"]
        inventory = os.path.join(self.home, "inventory.json")
        with open(inventory, "w") as f:
            json.dump({"hostname": "sim", "os": "linux", "arch": "x86_64", "cpus": slots,
                       "memory_bytes": 8 << 30, "devices": []}, f)
        self.workers = []
        for i in range(workers):
            work = os.path.join(self.home, f"w{i}")
            self.workers.append(subprocess.Popen(
                [self.bin, "join", self.url, "--token", self.join_token, "--name", f"sim-{i}",
                 "--slots", str(slots), "--work-dir", work, "--inventory", inventory],
                env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))
        deadline = time.time() + 60
        while len(self.cli_json("workers", "--json")["workers"]) < workers:
            if time.time() > deadline:
                raise SystemExit("the fleet did not register within 60 s")
            time.sleep(0.1)

    def cli(self, *args, check=True):
        return subprocess.run([self.bin, *args], env=self.env, capture_output=True, text=True, check=check).stdout

    def cli_json(self, *args):
        return json.loads(self.cli(*args))

    def sql(self, query):
        cluster = open(os.path.join(self.data, "postgres", "cluster.path")).read().strip()
        # The socket lives in the cluster dir unless that path was too long.
        out = subprocess.run(
            ["psql", "-h", cluster, "-U", "gpulayer", "-d", "gpulayer", "-At", "-F", ",", "-c", query],
            capture_output=True, text=True,
        )
        if out.returncode != 0:
            raise SystemExit(f"psql failed: {out.stderr}")
        return [line.split(",") for line in out.stdout.strip().splitlines()]

    def close(self):
        for w in self.workers:
            w.send_signal(signal.SIGTERM)
        for w in self.workers:
            try:
                w.wait(timeout=20)
            except subprocess.TimeoutExpired:
                w.kill()
        self.up.send_signal(signal.SIGTERM)
        try:
            self.up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.up.kill()
        pointer = os.path.join(self.data, "postgres", "cluster.path")
        if os.path.exists(pointer):
            cluster = open(pointer).read().strip()
            if not cluster.startswith(self.home):
                subprocess.run(["rm", "-rf", cluster])
        subprocess.run(["rm", "-rf", self.home])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=32)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=10000)
    ap.add_argument("--latency-jobs", type=int, default=200)
    ap.add_argument("--cpu-window", type=float, default=0.0)
    ap.add_argument("--bin", default=os.environ.get("GPULAYER_BIN", "gpulayer"))
    args = ap.parse_args()
    parallel = args.workers * args.slots

    # The machine's own limit: the same processes spawned directly, same parallelism.
    def direct_spawn_rate():
        t = time.time()
        subprocess.run(f"seq {args.jobs} | xargs -P {parallel} -n 1 true", shell=True, check=True)
        return args.jobs / (time.time() - t)

    def direct_spawn_cpu_ms():
        before = os.times()
        subprocess.run(f"seq {args.jobs} | xargs -P {parallel} -n 1 true", shell=True, check=True)
        after = os.times()
        cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
        return cpu * 1000 / args.jobs

    direct_before = direct_spawn_rate()
    fleet = Fleet(args.bin, args.workers, args.slots)
    try:
        # 1. Latency on the idle fleet: one job at a time.
        lat = []
        for _ in range(args.latency_jobs):
            job = fleet.cli_json("submit", "--json", "--", "true")["id"]
            fleet.cli("wait", str(job))
        rows = fleet.sql(
            "SELECT extract(epoch FROM t.started_at - j.created_at) * 1000 FROM jobs j JOIN tasks t ON t.job_id = j.id ORDER BY j.id"
        )
        lat = [float(r[0]) for r in rows]

        # 2. Throughput: all jobs at once, in batch files.
        batch = os.path.join(fleet.home, "jobs.jsonl")
        with open(batch, "w") as f:
            for _ in range(args.jobs):
                f.write('{"command": ["true"]}\n')
        first_id = int(fleet.sql("SELECT coalesce(max(id), 0) FROM jobs")[0][0]) + 1
        t0 = time.time()
        submit = subprocess.Popen([fleet.bin, "submit", "--batch", batch], env=fleet.env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        cpu = None
        if args.cpu_window > 0:
            # A window in the steady middle: after the first jobs run, before the tail.
            time.sleep(2.0)
            done = f"SELECT count(*) FROM tasks WHERE state = 'succeeded' AND job_id >= {first_id}"
            n0, c0 = int(fleet.sql(done)[0][0]), cpu_by_part()
            time.sleep(args.cpu_window)
            n1, c1 = int(fleet.sql(done)[0][0]), cpu_by_part()
            cpu = {"jobs_in_window": n1 - n0}
            cpu.update({k: round((c1[k] - c0.get(k, 0)) * 1000 / max(1, n1 - n0), 3) for k in c1})
        if submit.wait() != 0:
            raise SystemExit(f"submit --batch failed: {submit.stderr.read()}")
        deadline = t0 + 1800
        while True:
            left = int(fleet.sql(f"SELECT count(*) FROM jobs WHERE id >= {first_id} AND state NOT IN ('succeeded','failed','cancelled')")[0][0])
            if left == 0:
                break
            if time.time() > deadline:
                raise SystemExit(f"{left} jobs unfinished after 30 min")
            # Each check is a psql connection: ask rarely, the timestamps give the real span.
            time.sleep(1.0)
        (span,) = fleet.sql(
            f"SELECT extract(epoch FROM max(t.finished_at) - min(j.created_at)) FROM jobs j JOIN tasks t ON t.job_id = j.id WHERE j.id >= {first_id}"
        )[0]
        (ok, failed, reran) = fleet.sql(
            f"SELECT count(*) FILTER (WHERE j.state = 'succeeded'), count(*) FILTER (WHERE j.state <> 'succeeded'), "
            f"count(*) FILTER (WHERE t.attempt <> 1) FROM jobs j JOIN tasks t ON t.job_id = j.id WHERE j.id >= {first_id}"
        )[0]
        gpulayer_rate = args.jobs / float(span)
    finally:
        fleet.close()

    direct_after = direct_spawn_rate()
    direct_rate = (direct_before + direct_after) / 2
    if cpu is not None:
        cpu["direct_spawn_per_true"] = round(direct_spawn_cpu_ms(), 3)

    print(json.dumps({
        "workers": args.workers, "slots": args.slots, "jobs": args.jobs,
        "throughput_jobs_per_s": round(gpulayer_rate, 1),
        "direct_spawn_jobs_per_s": round(direct_rate, 1),
        "direct_spawn_before_after": [round(direct_before, 1), round(direct_after, 1)],
        "ratio_to_direct": round(gpulayer_rate / direct_rate, 3),
        "submit_to_start_ms": {"p50": round(statistics.median(lat), 2), "p99": round(pct(lat, 99), 2),
                               "max": round(max(lat), 2), "n": len(lat)},
        "exactly_once": {"succeeded": int(ok), "not_succeeded": int(failed), "ran_more_than_once": int(reran)},
        **({"cpu_ms_per_job": cpu} if cpu is not None else {}),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
