"""GET /schedule under load: 10,000 distinct stored tasks, looked up from a separate load
process on loopback, on the embedded default (SQLite) and on PostgreSQL.

What it does, per database:
1. creates an empty database (a SQLite file in a temporary directory, or a fresh PostgreSQL
   database), migrates it, and bulk-inserts 10,000 tasks of distinct layers, each with one
   done job, one verified measurement and its best_schedule row (no tuner involved);
2. starts the API as its own process (`tctune serve`, or uvicorn with --workers N) on a free
   loopback port, and checks a sample of lookups against what was inserted;
3. runs wrk (Debian's, one thread, a Lua script that walks the 10,000 URLs in turn) with 64
   connections: a warm-up of 2 passes per API process (it fills each process's cache, when
   on, as a fleet's first deploys would), then the measured run; any 4xx or 5xx status,
   any socket error or timeout counts as an error;
4. writes rows {db, concurrency, req_per_s, p50_ms, p99_ms, errors, ...} to
   bench/data/schedule_load.json.

wrk is closed-loop: each of the 64 connections sends its next request when the previous
answer arrives, so mean latency = 64 / throughput (Little's law).

    python bench/schedule_load.py [--db sqlite postgresql] [--tasks 10000] [--concurrency 64]
        [--duration 30] [--workers 1] [--no-cache] [--out bench/data/schedule_load.json]

Needs `wrk` (apt-get install -y wrk) and, for PostgreSQL, a server at --pg-admin-url.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
from sqlalchemy import insert, text

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._procs import (  # noqa: E402
    PG_ADMIN_URL,
    TICK,
    create_database,
    drop_database,
    free_port,
    proc_stats,
    start,
    stop,
    wait_http,
)
from kernels.space import knobs_for, schedule_hash  # noqa: E402
from kernels.spec import TARGETS, ConvShape, Precision, task_key  # noqa: E402
from store import migrate  # noqa: E402
from store.db import get_engine  # noqa: E402
from store.models import BestSchedule, Job, Measurement, Task  # noqa: E402

# wrk's Lua side: every thread walks the URL list from its own offset; requests are
# formatted once in init() so that the load generator spends its CPU on sockets.
LUA = r"""
local paths = dofile("%(paths)s")
local counter = 0
local reqs = {}
local next_id = 0

function setup(thread)
  thread:set("offset", next_id * 7919)
  next_id = next_id + 1
end

function init(args)
  for i, p in ipairs(paths) do reqs[i] = wrk.format("GET", p) end
  -- args[1]: where to start the walk (the warm-up continues where its last run stopped)
  counter = (offset or 0) + (tonumber(args[1]) or 0)
end

function request()
  counter = counter %% #reqs + 1
  return reqs[counter]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %%d, "duration_us": %%d, "connect": %%d, "read": %%d, "write": %%d, ' ..
    '"status": %%d, "timeout": %%d, "p50_us": %%.1f, "p90_us": %%.1f, "p99_us": %%.1f, ' ..
    '"max_us": %%.1f, "mean_us": %%.1f}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    latency.mean))
end
"""


# --- data -------------------------------------------------------------------------------

def layers(count: int) -> list[tuple[ConvShape, Precision, str]]:
    """`count` distinct valid (shape, precision, target) triples, in a fixed order."""
    out = []
    combos = itertools.product(
        (1, 2, 4, 8, 16, 32), (7, 14, 28, 56), (16, 32, 64, 96, 128, 256, 512),
        (16, 32, 64, 128, 256, 512), ((3, 1, 1), (1, 1, 0), (3, 2, 1)), list(Precision),
        sorted(TARGETS))
    for n, hw, c, k, (rs, stride, pad), precision, target in combos:
        shape = ConvShape(n, hw, hw, c, k, rs, rs, stride=(stride, stride), pad=(pad, pad))
        if not shape.problems(precision, TARGETS[target]):
            out.append((shape, precision, target))
            if len(out) == count:
                return out
    raise ValueError(f"only {len(out)} distinct layers; ask for fewer")


def query_of(shape: ConvShape, precision: Precision, target: str) -> str:
    d = shape.to_dict()
    params = {k: d[k] for k in ("n", "h", "w", "c", "k", "r", "s")}
    for name in ("stride", "pad", "dilation"):
        params[name] = ",".join(str(v) for v in d[name])
    return "/schedule?" + urlencode({**params, "precision": precision.value, "target": target})


def seed(url: str, count: int, rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    """Insert `count` tasks with their best schedules in one transaction (bulk SQL: the
    tuner is not involved). Returns (path, stored schedule) per task."""
    now = datetime.now(UTC)
    tasks, jobs, meas, best, out = [], [], [], [], []
    for i, (shape, precision, target) in enumerate(layers(count), start=1):
        knobs = knobs_for(precision)
        schedule = {name: rng.choice(values) for name, values in knobs.items()}
        key = task_key(shape, precision, TARGETS[target])
        tasks.append(dict(id=i, key=key, shape=shape.to_dict(), shape_key=shape.key(),
                          precision=precision.value, target=target, created_at=now))
        jobs.append(dict(id=i, task_id=i, trials=64, strategy="diversity", seed=0,
                         status="done", created_at=now, started_at=now, finished_at=now))
        meas.append(dict(id=i, task_id=i, job_id=i, schedule=schedule,
                         schedule_hash=schedule_hash(schedule), status="ok",
                         median_us=round(rng.uniform(5.0, 500.0), 3),
                         iqr_us=round(rng.uniform(0.01, 2.0), 3), backend="simulated",
                         worker="bench", created_at=now))
        best.append(dict(task_id=i, measurement_id=i, updated_at=now))
        out.append((query_of(shape, precision, target), schedule))
    with get_engine(url).begin() as conn:
        for model, rows in ((Task, tasks), (Job, jobs), (Measurement, meas),
                            (BestSchedule, best)):
            conn.execute(insert(model), rows)
        if conn.dialect.name == "postgresql":
            # Explicit ids were inserted: move the sequences past them, and give the planner
            # statistics of the new tables.
            for table in ("task", "job", "measurement"):
                conn.execute(text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                                  f"(SELECT max(id) FROM {table}))"))
            conn.execute(text("ANALYZE"))
    return out


# --- processes --------------------------------------------------------------------------

def start_server(db_url: str, data_dir: Path, port: int, workers: int, cache: bool,
                 log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TCTUNE_")}
    env.update(TCTUNE_DATA_DIR=str(data_dir), TCTUNE_BACKEND="simulated",
               PYTHONUNBUFFERED="1")
    if not db_url.startswith("sqlite"):
        env["TCTUNE_DATABASE_URL"] = db_url
    if not cache:
        env["TCTUNE_SCHEDULE_CACHE_S"] = "0"
    cmd = [sys.executable, "-m", "api.cli", "serve", "--port", str(port),
           "--data", str(data_dir), "--workers", str(workers)]
    proc = start(cmd, env, log)
    wait_http(f"http://127.0.0.1:{port}/healthz", proc, 60, log)
    return proc


def renice_session(pid: int, nice: int) -> None:
    """Set the scheduling priority of the session (autogroup) that `pid` leads. With
    autogroups every session gets an equal share of the CPUs, whatever its processes' nice
    values: on a machine shared with other work, this is what gives the benchmark the CPUs
    (root only; 0 leaves it as it is)."""
    if nice:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of the live processes of a process group."""
    return sum(int(f[11]) + int(f[12]) for _, _, f in proc_stats() if int(f[2]) == pgid) / TICK


def check_sample(base: str, entries: list[tuple[str, dict[str, Any]]], rng: random.Random
                 ) -> None:
    """A lookup returns exactly the schedule that was stored for its layer."""
    with httpx.Client(base_url=base, timeout=10) as client:
        for path, schedule in rng.sample(entries, 50):
            resp = client.get(path)
            if resp.status_code != 200 or resp.json()["schedule"] != schedule:
                raise RuntimeError(f"{path}: {resp.status_code} {resp.text[:300]}")


def warm_up(base: str, lua: Path, connections: int, requests: int, nice: int,
            cap_s: float = 120) -> int:
    """Walk the URLs with wrk, 5 s at a time, until `requests` were answered (or cap_s):
    every API process then holds the schedules it is asked for, as after a fleet's first
    deploys. Returns the requests made."""
    done = 0
    start = time.monotonic()
    while done < requests and time.monotonic() - start < cap_s:
        res = run_wrk(base, lua, connections, 5, 1, offset=done, nice=nice)
        if res["status"] or res["timeout"]:
            raise RuntimeError(f"errors during the warm-up: {res['raw']}")
        done += res["requests"]
    return done


def run_wrk(base: str, lua: Path, connections: int, duration_s: int, threads: int,
            offset: int = 0, nice: int = 0) -> dict[str, Any]:
    cmd = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{duration_s}s",
           "--timeout", "10s", "-s", str(lua), base, "--", str(offset)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    renice_session(proc.pid, nice)
    out, _ = proc.communicate(timeout=duration_s + 60)
    text_out = out.decode()
    line = next((ln for ln in text_out.splitlines() if ln.startswith("WRKJSON ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {text_out}")
    result: dict[str, Any] = json.loads(line.removeprefix("WRKJSON "))
    result["raw"] = text_out
    return result


# --- one database ---------------------------------------------------------------------------

def bench_db(kind: str, args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    data_dir = workdir / kind
    data_dir.mkdir()
    if kind == "sqlite":
        url = f"sqlite:///{(data_dir / 'tctune.db').resolve()}"
    else:
        url = create_database("tctune_bench", args.pg_admin_url)
    rows = []
    try:
        migrate.upgrade(url)
        t0 = time.perf_counter()
        entries = seed(url, args.tasks, rng)
        get_engine(url).dispose()
        print(f"[{kind}] seeded {len(entries)} tasks in {time.perf_counter() - t0:.1f} s",
              flush=True)
        lua_paths = workdir / f"{kind}-paths.lua"
        order = [p for p, _ in entries]
        rng.shuffle(order)  # neighbouring requests hit unrelated rows
        lua_paths.write_text("return {\n" + "".join(f'  "{p}",\n' for p in order) + "}\n")
        lua = workdir / f"{kind}.lua"
        lua.write_text(LUA % {"paths": lua_paths})
        for nice, workers, cache in itertools.product(args.renice, args.workers, args.cache):
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            log = workdir / f"{kind}-w{workers}-c{int(cache)}-n{nice}.log"
            proc = start_server(url, data_dir, port, workers, cache, log)
            try:
                check_sample(base, entries, rng)
                renice_session(proc.pid, nice)
                warmed = warm_up(base, lua, args.concurrency,
                                 args.warmup_passes * (workers if cache else 1) * len(order),
                                 nice)
                load_before = os.getloadavg()[0]
                cpu0 = group_cpu_s(proc.pid)
                res = run_wrk(base, lua, args.concurrency, args.duration, args.threads,
                              nice=nice)
                server_cpu = group_cpu_s(proc.pid) - cpu0
            finally:
                stop(proc)
            secs = res["duration_us"] / 1e6
            errors = sum(res[k] for k in ("connect", "read", "write", "status", "timeout"))
            row = {
                "db": kind, "concurrency": args.concurrency,
                "req_per_s": round(res["requests"] / secs, 1),
                "p50_ms": round(res["p50_us"] / 1000, 2),
                "p99_ms": round(res["p99_us"] / 1000, 2),
                "errors": errors,
                "workers": workers, "cache": cache, "requests": res["requests"],
                "duration_s": round(secs, 1), "p90_ms": round(res["p90_us"] / 1000, 2),
                "max_ms": round(res["max_us"] / 1000, 2),
                "server_cpu_s_per_s": round(server_cpu / secs, 2),
                "loadavg_1m_before": round(load_before, 2),
                "server_cpu_ms_per_req": round(1000 * server_cpu / res["requests"], 3),
                "warmup_requests": warmed, "renice": nice,
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        get_engine(url).dispose()
        if kind != "sqlite":
            drop_database(url, args.pg_admin_url)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", nargs="+", default=["sqlite", "postgresql"],
                    choices=["sqlite", "postgresql"])
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--duration", type=int, default=30, help="seconds of the measured run")
    ap.add_argument("--threads", type=int, default=1, help="wrk threads")
    ap.add_argument("--workers", type=int, nargs="+", default=[1],
                    help="API processes (tctune serve --workers)")
    ap.add_argument("--cache", type=lambda s: s.lower() in ("1", "on", "true", "yes"),
                    nargs="+", default=[True],
                    help="the server's schedule cache on/off, e.g. --cache on off")
    ap.add_argument("--warmup-passes", type=int, default=2,
                    help="warm-up requests = passes x workers x tasks")
    ap.add_argument("--renice", type=int, nargs="+", default=[0],
                    help="nice values of the server's and wrk's sessions (autogroups) to run "
                         "with, e.g. 0 -10 on a machine shared with other work (root)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pg-admin-url", default=PG_ADMIN_URL)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "data" / "schedule_load.json")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: apt-get install -y wrk")
    rows = []
    with tempfile.TemporaryDirectory(prefix="tctune-load-") as tmp:
        for kind in args.db:
            rows += bench_db(kind, args, Path(tmp))
    wrk_version = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout
    doc = {
        "command": "python " + " ".join([str(Path(sys.argv[0]))] + sys.argv[1:]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "cpu": _cpu_model(),
                    "python": platform.python_version(), "platform": platform.platform()},
        "load_generator": (wrk_version.strip().splitlines() or ["wrk"])[0]
        + f", {args.threads} thread(s), Lua walk over {args.tasks} URLs, closed loop",
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
