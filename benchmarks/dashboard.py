#!/usr/bin/env python3
"""Dashboard page times with many jobs in the database.

Runs N jobs to the end on a fleet of simulated workers (the load test's `Fleet`: real
`gpulayer up` with its embedded PostgreSQL and real `gpulayer join` processes), a share of
them submitted by a second token, logs in with a one-time link (`gpulayer dashboard`), then
times each page over one keep-alive HTTPS connection, in the same run as `/healthz` on that
connection (the floor: TLS, HTTP and the round trip, no page). Prints one JSON object.

    python3 benchmarks/dashboard.py --bin "$CARGO_TARGET_DIR/release/gpulayer" --jobs 100000
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import ssl
import statistics
import subprocess
import sys
import time
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "loadtest"))
from fleet import Fleet, pct  # noqa: E402  (the load test's fleet of real `gpulayer join` workers)


def run_jobs(fleet: Fleet, n: int, env: dict) -> None:
    batch = os.path.join(fleet.home, "jobs.jsonl")
    with open(batch, "w") as f:
        for i in range(n):
            f.write('{"command": ["true"], "name": "bench-%d"}\n' % i)
    subprocess.run([fleet.bin, "submit", "--batch", batch], env=env, check=True,
                   stdout=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("GPULAYER_BIN", "gpulayer"))
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--requests", type=int, default=200, help="timed requests per page")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--slots", type=int, default=64)
    args = ap.parse_args()

    fleet = Fleet(args.bin, args.workers, args.slots)
    try:
        agent = fleet.cli_json("token", "create", "--role", "submitter", "--name", "bench-agent", "--json")["secret"]
        t0 = time.time()
        # Nine in ten by the admin token, one in ten by the agent's.
        run_jobs(fleet, args.jobs - args.jobs // 10, fleet.env)
        run_jobs(fleet, args.jobs // 10, dict(fleet.env, GPULAYER_URL=fleet.url, GPULAYER_TOKEN=agent))
        while True:
            done = int(fleet.sql("SELECT count(*) FROM jobs WHERE state = 'succeeded'")[0][0])
            if done >= args.jobs:
                break
            if time.time() - t0 > 3600:
                raise SystemExit(f"only {done} of {args.jobs} jobs ran within an hour")
            time.sleep(1)
        ran_s = time.time() - t0
        fleet.sql("ANALYZE")

        link = fleet.cli_json("dashboard", "--no-browser", "--json")["url"]
        parsed = urllib.parse.urlsplit(link)
        ctx = ssl.create_default_context(cafile=os.path.join(fleet.data, "server-cert.pem"))
        conn = http.client.HTTPSConnection(parsed.hostname, parsed.port, context=ctx)
        conn.request("GET", f"{parsed.path}?{parsed.query}")
        resp = conn.getresponse()
        resp.read()
        cookie = resp.getheader("set-cookie").split(";")[0]
        assert resp.status == 303 and cookie.startswith("gpulayer_session="), (resp.status, cookie)

        middle = int(fleet.sql("SELECT id FROM jobs ORDER BY id OFFSET %d LIMIT 1" % (args.jobs // 2))[0][0])
        pages = {
            "/healthz (floor)": "/healthz",
            "jobs, newest": "/dashboard/jobs",
            "jobs, state=succeeded": "/dashboard/jobs?state=succeeded",
            # None failed: the page reads its window of 10,000 jobs and says so.
            "jobs, state=failed (none)": "/dashboard/jobs?state=failed",
            "jobs, by the agent token": "/dashboard/jobs?by=bench-agent",
            "jobs, on one worker": "/dashboard/jobs?worker=sim-1",
            "jobs, a page deep in": f"/dashboard/jobs?before={middle}",
            "one job": f"/dashboard/jobs/{middle}",
            "workers": "/dashboard/workers",
        }
        results = {}
        for name, path in pages.items():
            times = []
            for i in range(10 + args.requests):
                start = time.perf_counter()
                conn.request("GET", path, headers={"Cookie": cookie})
                resp = conn.getresponse()
                body = resp.read()
                took = (time.perf_counter() - start) * 1000
                assert resp.status == 200, (path, resp.status, body[:200])
                if i >= 10:
                    times.append(took)
            results[name] = {"p50_ms": round(statistics.median(times), 2),
                             "p90_ms": round(pct(times, 90), 2), "bytes": len(body)}
        floor = results["/healthz (floor)"]["p50_ms"]
        for name, r in results.items():
            r["over_floor_p50_ms"] = round(r["p50_ms"] - floor, 2)
        print(json.dumps({"jobs": args.jobs, "jobs_ran_in_s": round(ran_s, 1),
                          "requests_per_page": args.requests, "pages": results}, indent=2))
    finally:
        fleet.close()


if __name__ == "__main__":
    main()
