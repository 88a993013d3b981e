"""A measuring worker's CPU per measurement, alone: the fleet's worker path without Celery,
Redis or an explorer, so that its cost is not mixed with how the fleet's rounds turn out.

One process with `--threads` simulated GPU slots (as `tctune worker --simulate h200
--slots 64`) measures chunks of candidates inserted beforehand into a fresh PostgreSQL
database, through the same task function and write batcher as a fleet worker
(`workers.tasks.measure_chunk`, `workers.batcher`); each measurement sleeps `--measure-s`.
Reports this process's CPU and PostgreSQL's (every postgres process of the machine) per
measurement written, and the measurements per second.

    python3 bench/worker_path.py --chunks 600 --out F [--pre-ping on|off]

`--pre-ping`: whether pooled connections are pinged at checkout (the fleet's processes:
off; before they turned it off ahead of their first engine, they ran with it on).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _procs import comm_cpu_s, scratch_database  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=64, help="simulated GPU slots")
    ap.add_argument("--chunks", type=int, default=600, help="chunks measured in all")
    ap.add_argument("--warm-chunks", type=int, default=128,
                    help="chunks measured before the window")
    ap.add_argument("--chunk", type=int, default=8, help="candidates per chunk")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--round", type=int, default=224, help="candidates per round")
    ap.add_argument("--measure-s", type=float, default=0.034)
    ap.add_argument("--pre-ping", choices=("on", "off"), default="off")
    ap.add_argument("--label", default="", help="what the output says it measured")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    os.environ["TCTUNE_DB_PRE_PING"] = "true" if args.pre_ping == "on" else "false"
    os.environ["TCTUNE_WORKER_SLOTS"] = str(args.threads)
    with scratch_database("tctune_wpath") as url:
        try:
            return run(args, url)
        finally:
            from store.db import get_engine

            get_engine(url).dispose()


def run(args: argparse.Namespace, url: str) -> int:
    import numpy as np

    from kernels.space import ScheduleSpace
    from kernels.spec import RESNET50_3X3, TARGETS, Precision
    from store import hotpath as hp
    from store import migrate
    from store import repository as repo
    from store.db import session_scope
    from workers import tasks
    from workers.backends.simulated import SimulatedBackend
    from workers.batcher import WriteBatcher

    migrate.upgrade(url)
    h200 = TARGETS["h200"]
    rng = np.random.default_rng(0)
    per_job = -(-(args.chunks + args.warm_chunks) * args.chunk // args.jobs)
    chunks: list[list[int]] = []
    layers = list(RESNET50_3X3.values())
    for j in range(args.jobs):
        shape, precision = layers[j % len(layers)], (Precision.INT8, Precision.FP16)[j % 2]
        space = ScheduleSpace(shape, precision, h200)
        picks = rng.choice(space.valid_indices, per_job, replace=False)
        with session_scope(url) as s:
            task = repo.get_or_create_task(s, shape, precision, h200)
            job = repo.create_job(s, task, 10 * per_job, "random", 0)
            job.status = "running"
            s.flush()
            ids: list[int] = []
            for r in range(0, per_job, args.round):
                scheds = space.schedules(picks[r:r + args.round])
                ids += hp.add_candidates(s, job.id, task.id, scheds, None,
                                         [None] * len(scheds), dispatched=True)
        chunks += [ids[i:i + args.chunk] for i in range(0, len(ids), args.chunk)]
    order = rng.permutation(len(chunks))[:args.chunks + args.warm_chunks]
    todo = [chunks[i] for i in order]
    backend = SimulatedBackend(h200, delay_s=args.measure_s)
    writer = WriteBatcher(url)
    lock = threading.Lock()
    written = [0]

    def slot(n: int) -> None:
        name = f"bench/sim-h200#{n}"
        while True:
            with lock:
                if not todo:
                    return
                ids = todo.pop()
            res = tasks.measure_chunk(url, ids, backend, name, lease_s=120.0, flush_s=2.0,
                                      writer=writer)
            with lock:
                written[0] += res.written

    def all_slots() -> None:
        threads = [threading.Thread(target=slot, args=(n,)) for n in range(args.threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    # Warm-up (connections, prepared statements, each task's model state): the first
    # `--warm-chunks`, measured as the rest are, outside the window.
    measured, todo[:] = todo[args.warm_chunks:], todo[:args.warm_chunks]
    all_slots()
    todo[:] = measured
    start_written = written[0]
    cpu0, pg0, t0 = time.process_time(), comm_cpu_s("postgres"), time.monotonic()
    all_slots()
    cpu1, pg1, t1 = time.process_time(), comm_cpu_s("postgres"), time.monotonic()
    n = written[0] - start_written
    result: dict[str, Any] = {
        "label": args.label, "measurements": n, "threads": args.threads, "chunk": args.chunk,
        "measure_s": args.measure_s, "pre_ping": args.pre_ping,
        "measurements_per_s": round(n / (t1 - t0), 1),
        "worker_cpu_ms_per_measurement": round(1000 * (cpu1 - cpu0) / max(1, n), 3),
        "postgres_cpu_ms_per_measurement": round(1000 * (pg1 - pg0) / max(1, n), 3),
        "transactions_per_group": round(writer.transactions / max(1, writer.groups), 3),
        "load_before": Path("/proc/loadavg").read_text().split()[:3],
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
