"""Fleet at scale, by simulation: many simulated GPU workers against one explorer,
a Redis broker and PostgreSQL, all on this machine.

Workers are `tctune worker --simulate h200 --slots S` processes: each thread is one
simulated GPU with its own lease identity that sleeps `--measure-s` per measurement (what a
real GPU's check-and-time loop takes) and writes through the same task functions as a GPU
worker. The driver submits many tuning jobs through the API and samples, over a window
after warm-up: measurements written per second (database), the explorer's proposal
latency (its log), and the measure queue's depth (Redis).

    python3 bench/fleet_sim.py --workers 256 --strategy diversity --warmup 150 --seconds 90 \
        --measure-s 0.034 [--threads N] [--out run.json]

It also reports CPU milliseconds per measurement written, per role of process (workers,
explorer, builder, PostgreSQL, ...), from /proc over the same window. `--jobs` jobs run at
all times: a job that ends is replaced by a new one (a new task), and the first jobs'
budgets are spread up to `--trials`, so that jobs of every age share the window.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from sqlalchemy import create_engine, text

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from _procs import (  # noqa: E402
    TICK,
    comm_cpu_s,
    create_database,
    drop_database,
    free_port,
    kill,
    proc_stats,
    start,
    stop_all,
    wait_http,
)

LAYERS = [  # ResNet-50's 3x3 layers
    (56, 64), (28, 128), (14, 256), (7, 512)]


def job_request(j: int) -> dict[str, Any]:
    """The j-th job: ResNet-50's 3x3 layers in both precisions at batches 1..128 (the
    first 64), then at 3x, 5x, ... those batches, so that every job is a task of its own."""
    hw, c = LAYERS[j % len(LAYERS)]
    n = 2 ** (j // len(LAYERS) // 2 % 8) * (1 + 2 * (j // (len(LAYERS) * 16)))
    return {"shape": {"n": n, "h": hw, "w": hw, "c": c, "k": c, "r": 3, "s": 3, "pad": 1},
            "precision": ("int8", "fp16")[(j // len(LAYERS)) % 2], "target": "h200"}


def group_cpu_s() -> dict[int, float]:
    """CPU seconds (user + system, with reaped children) per process group, from /proc."""
    out: dict[int, float] = {}
    for _, _, fields in proc_stats():
        pgrp = int(fields[2])
        out[pgrp] = out.get(pgrp, 0.0) + sum(int(x) for x in fields[11:15]) / TICK
    return out


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine so far (every core), from /proc/stat."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(x) for x in Path("/proc/stat").read_text().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / TICK


def cpu_by_role(roles: dict[int, str]) -> dict[str, float]:
    """CPU seconds so far of each role (our process groups), PostgreSQL (every postgres
    process of the machine), the driver itself and the whole machine."""
    groups = group_cpu_s()
    out: dict[str, float] = {}
    for pgid, role in roles.items():
        out[role] = out.get(role, 0.0) + groups.get(pgid, 0.0)
    out["postgres"] = comm_cpu_s("postgres")
    out["driver"] = groups.get(os.getpgrp(), 0.0)
    out["machine"] = machine_busy_s()
    return out


def tctune(*args: str) -> list[str]:
    return [sys.executable, "-m", "api.cli", *args]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=256, help="simulated GPUs")
    ap.add_argument("--slots", type=int, default=64, help="simulated GPUs per process")
    ap.add_argument("--measure-s", type=float, default=0.25,
                    help="seconds one simulated measurement takes")
    ap.add_argument("--jobs", type=int, default=64)
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--strategy", default="diversity")
    ap.add_argument("--batch", type=int, default=32, help="candidates per explorer round")
    ap.add_argument("--max-round", type=int, default=256,
                    help="rounds grow up to this while GPUs wait (TCTUNE_MAX_ROUND)")
    ap.add_argument("--chunk", type=int, default=8, help="candidates per measure message")
    ap.add_argument("--explorers", type=int, default=1,
                    help="separate `tctune explorer` processes (each with its sweeper)")
    ap.add_argument("--procs", type=int, default=1,
                    help="tctune explorer --procs: explorer pool processes of one explorer")
    ap.add_argument("--threads", type=int, default=None,
                    help="tctune explorer --threads (default: the explorer's own)")
    ap.add_argument("--rounds-in-flight", type=int, default=2,
                    help="tctune explorer --rounds-in-flight (1: no pipelining)")
    ap.add_argument("--prior-refresh-s", type=float, default=30.0,
                    help="tctune explorer --prior-refresh-s (0: re-read every proposal)")
    ap.add_argument("--builders", type=int, default=2, help="tctune builder -c")
    ap.add_argument("--warmup", type=float, default=30)
    ap.add_argument("--seconds", type=float, default=90)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    load_before = Path("/proc/loadavg").read_text().split()[:3]
    tmp = Path(tempfile.mkdtemp(prefix="fleet_sim_"))
    db_url = create_database("tctune_fleet")
    redis_port, api_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TCTUNE_")}
    env.update({
        "PYTHONUNBUFFERED": "1", "TCTUNE_DATABASE_URL": db_url,
        "TCTUNE_BROKER_URL": f"redis://127.0.0.1:{redis_port}/0",
        "TCTUNE_BACKEND": "simulated", "TCTUNE_SIM_DELAY_S": str(args.measure_s),
        "TCTUNE_BATCH_SIZE": str(args.batch), "TCTUNE_CHUNK_SIZE": str(args.chunk),
        "TCTUNE_MAX_ROUND": str(args.max_round),
        "TCTUNE_AUTH": "off", "TCTUNE_HEARTBEAT_S": "10",
    })
    procs: list[subprocess.Popen[bytes]] = []
    try:
        subprocess.run(tctune("db", "upgrade"), cwd=REPO, env=env, check=True,
                       capture_output=True)
        procs.append(start(["redis-server", "--port", str(redis_port), "--save", "",
                            "--appendonly", "no"], env, tmp / "redis.log"))
        procs.append(start(tctune("serve", "--port", str(api_port)), env, tmp / "api.log"))
        roles: dict[int, str] = {procs[0].pid: "redis", procs[1].pid: "api"}
        for i in range(args.explorers):
            procs.append(start(tctune(
                "explorer", "--procs", str(args.procs),
                *(["--threads", str(args.threads)] if args.threads else []),
                "--rounds-in-flight", str(args.rounds_in_flight),
                "--prior-refresh-s", str(args.prior_refresh_s)), env, tmp / f"explorer{i}.log"))
            roles[procs[-1].pid] = "explorer"
        procs.append(start(tctune("builder", "-c", str(args.builders)), env,
                           tmp / "builder.log"))
        roles[procs[-1].pid] = "builder"
        left = args.workers
        while left > 0:
            n = min(args.slots, left)
            procs.append(start(tctune("worker", "--simulate", "h200", "--slots", str(n)), env,
                               tmp / f"worker{len(procs)}.log"))
            roles[procs[-1].pid] = "workers"
            left -= n
        api = f"http://127.0.0.1:{api_port}"
        wait_http(f"{api}/healthz", procs[1], timeout=60, log=tmp / "api.log",
                  what="tctune serve")
        submitted = 0

        def submit(count: int) -> None:
            nonlocal submitted
            for _ in range(count):
                j = submitted
                # The first jobs' budgets are spread over (0, --trials] (in an order unlike
                # their layers'), so that jobs end and new ones start throughout: the window
                # sees the mix of young and old jobs of a service with a queue, not one
                # generation of jobs that all start, and end, together.
                trials = args.trials if j >= args.jobs else \
                    max(32, args.trials * (1 + j * 29 % args.jobs) // args.jobs)
                r = httpx.post(f"{api}/tune", json={**job_request(j), "trials": trials,
                                                    "strategy": args.strategy}, timeout=30)
                r.raise_for_status()
                submitted += 1

        submit(args.jobs)
        engine = create_engine(db_url)

        def measurements() -> tuple[float, int]:
            with engine.connect() as c:
                n = int(c.execute(text("SELECT count(*) FROM measurement")).scalar() or 0)
            return time.monotonic(), n

        depths: list[int] = []  # measure queue depth every 2 s in the window
        t0 = time.monotonic()
        cpu0: dict[str, float] | None = None
        first: tuple[float, int] | None = None
        while time.monotonic() - t0 < args.warmup + args.seconds:
            if cpu0 is None and time.monotonic() - t0 >= args.warmup:
                cpu0 = cpu_by_role(roles)
                # Counted at the window's two ends only: a count of the whole table every
                # poll was PostgreSQL's work for the benchmark, not for the fleet.
                first = measurements()
            with engine.connect() as c:
                active = int(c.execute(text(
                    "SELECT count(*) FROM job WHERE status IN ('queued', 'running')")).scalar()
                    or 0)
            # A finished job is replaced by a new one: the fleet stays as loaded as a
            # service with a queue of jobs (a window in which jobs run out is no rate).
            submit(args.jobs - active)
            if first is not None:
                depth = subprocess.run(["redis-cli", "-p", str(redis_port), "llen",
                                        "measure.h200"], capture_output=True,
                                       text=True).stdout.strip()
                depths.append(int(depth or 0))
            time.sleep(2.0)
        cpu1 = cpu_by_role(roles)
        end = measurements()
        assert cpu0 is not None and first is not None
        written = end[1] - first[1]
        rate = written / (end[0] - first[0])
        # CPU milliseconds per measurement written in the window, per role of process.
        cpu_ms = {k: round(1000 * (cpu1[k] - cpu0[k]) / max(1, written), 3) for k in cpu1}
        logged = [(int(n), float(sec)) for i in range(args.explorers)
                  for n, sec in re.findall(r"proposal job=\d+ strategy=\S+ n=(\d+) .* "
                                           r"seconds=([0-9.]+)",
                                           (tmp / f"explorer{i}.log").read_text())]
        proposals = [sec for _, sec in logged]
        with engine.connect() as c:
            workers = int(c.execute(text(
                "SELECT count(DISTINCT worker) FROM measurement")).scalar() or 0)
            dups = int(c.execute(text(
                "SELECT count(*) - count(DISTINCT (task_id, schedule_hash)) FROM measurement"))
                .scalar() or 0)
        engine.dispose()
        result: dict[str, Any] = {
            "workers": args.workers, "measurements_per_s": round(rate, 1),
            "proposal_p50_s": round(float(np.percentile(proposals, 50)), 4) if proposals else None,
            "proposal_p99_s": round(float(np.percentile(proposals, 99)), 4) if proposals else None,
            "proposals": len(proposals), "workers_seen": workers, "duplicates": dups,
            "round_mean": round(float(np.mean([n for n, _ in logged])), 1) if logged else None,
            "max_round": args.max_round,
            "queue_depth_max": max(depths), "strategy": args.strategy,
            "measure_s": args.measure_s, "jobs": args.jobs, "jobs_submitted": submitted,
            "explorers": args.explorers,
            "window_s": args.seconds, "machine": f"{os.cpu_count()} cores",
            "procs": args.procs, "threads": args.threads, "rounds_in_flight": args.rounds_in_flight,
            "prior_refresh_s": args.prior_refresh_s, "chunk": args.chunk,
            "cpu_ms_per_measurement": cpu_ms, "load_before": load_before,
        }
        print(json.dumps(result, indent=2))
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        return 0
    finally:
        stop_all(procs, timeout=3)
        for p in procs:  # what a leader left behind in its group (pool children)
            kill(p)
        drop_database(db_url)
        print(f"logs in {tmp}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
