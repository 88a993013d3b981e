"""The whole service on GPU machines: tune ResNet-50's 3x3 layers through the API.

Run on a GPU machine (the device tool: `bash bench/gpu/run_e2e.sh --gpus 1 ...` with
`.whl`, `.redis` and `.pg` carried, see bench/gpu/fetch_deps.sh). With one GPU it starts the
embedded default (`tctune serve`, SQLite, cuda backend); with more (or `--distributed`),
Redis, the API, the explorer, a builder pool and one `tctune worker --gpu N` per GPU, on the
database of `--db`: `postgres` (the default there; the URL in TCTUNE_DATABASE_URL, which
run_e2e.sh sets after starting a carried PostgreSQL) or `sqlite` (one file shared by every
process). It POSTs every (layer, precision) job, waits through the API, fetches the
schedules and prints per job: wall time, measurements per second per GPU, the GPU idle
fraction (nvidia-smi samples), the final latency against the exhaustive best of the
recorded replay dataset and against cuDNN fp16 timed in this run with the same harness
(before the service starts).

`--simulate h200` runs the same service path on a machine without a GPU: the simulated
backend and `tctune worker --simulate h200` per "GPU", no cuDNN and no nvidia-smi (its
numbers say nothing about a GPU; it tests the processes, the broker and the database).

    python3 bench/e2e_gpu.py --gpus 1 --layers stage3 --precisions int8 --trials 64
    TCTUNE_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/tctune \
        python3 bench/e2e_gpu.py --simulate h200 --gpus 2 --db postgres --trials 32
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _procs import free_port, start, stop_all, wait_http  # noqa: E402

from kernels.spec import RESNET50_3X3  # noqa: E402


def exhaustive_best(layer: str, precision: str) -> float | None:
    """Best ok latency of the recorded replay dataset of this layer and precision."""
    best = None
    for path in sorted((REPO / "bench/data/replay").glob(f"resnet50_{layer}_n8_{precision}_*")):
        with gzip.open(path, "rt") as fh:
            next(fh)
            for line in fh:
                row = json.loads(line)
                if row["status"] == "ok" and (best is None or row["median_us"] < best):
                    best = row["median_us"]
    return best


class GpuSampler(threading.Thread):
    """nvidia-smi utilization samples while the jobs run: the idle fraction per GPU."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[list[int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu",
                                  "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True).stdout.split()
            if out:
                self.samples.append([int(x) for x in out])
            self.stop.wait(0.5)

    def idle_fraction(self) -> float | None:
        if not self.samples:
            return None
        flat = [u for s in self.samples for u in s]
        return round(sum(u == 0 for u in flat) / len(flat), 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--distributed", action="store_true",
                    help="Redis + explorer + builders + one worker per GPU also with --gpus 1 "
                         "(more than one GPU always runs distributed)")
    ap.add_argument("--db", choices=["sqlite", "postgres"], default=None,
                    help="sqlite: a file in the data directory; postgres: the database of "
                         "TCTUNE_DATABASE_URL (default: postgres when distributed, else sqlite)")
    ap.add_argument("--simulate", default=None, metavar="TARGET",
                    help="no GPU: the simulated backend of TARGET (e.g. h200), no cuDNN")
    ap.add_argument("--builders", type=int, default=None,
                    help="build processes (default: CPU cores - 2)")
    ap.add_argument("--builder-nice", type=int, default=10,
                    help="distributed: niceness of the builder processes (0: as the workers)")
    ap.add_argument("--explorer-procs", type=int, default=4,
                    help="distributed: explorer processes sharing the jobs (tctune explorer "
                         "--procs)")
    ap.add_argument("--layers", default="stage2,stage3,stage4,stage5")
    ap.add_argument("--precisions", default="int8,fp16")
    ap.add_argument("--trials", type=int, default=500)
    ap.add_argument("--strategy", default="diversity")
    ap.add_argument("--concurrent", action="store_true",
                    help="submit every job at once (default: one job at a time)")
    ap.add_argument("--out", default="bench/data/e2e_gpu.json")
    ap.add_argument("--logs", default=None, help="directory for the processes' logs")
    args = ap.parse_args()
    layers = args.layers.split(",")
    precisions = args.precisions.split(",")
    distributed = args.distributed or args.gpus > 1
    db = args.db or ("postgres" if distributed else "sqlite")
    db_url = os.environ.get("TCTUNE_DATABASE_URL", "")
    if db == "postgres" and not db_url.startswith("postgresql"):
        raise SystemExit("--db postgres needs TCTUNE_DATABASE_URL=postgresql+psycopg://... "
                         "(bench/gpu/run_e2e.sh starts a carried PostgreSQL and sets it)")
    logs = Path(args.logs or tempfile.mkdtemp(prefix="e2e_"))
    logs.mkdir(parents=True, exist_ok=True)

    if args.simulate:
        from kernels.spec import get_target

        target = get_target(args.simulate)
        gpu = f"{target.model} (simulated)"
        cudnn: dict[str, float | None] = {name: None for name in layers}
    else:
        # cuDNN first, alone on the GPU, with the kernels' own timing harness.
        import torch
        from conv_vs_cudnn import baselines

        gpu = torch.cuda.get_device_name(0)
        target = gpu_target(gpu)
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        cudnn = {name: baselines(RESNET50_3X3[name], l2)["cudnn_fp16_us"] for name in layers}
        torch.cuda.empty_cache()
        print("cuDNN fp16 (us):", cudnn, flush=True)

    data = Path(tempfile.mkdtemp(prefix="tctune_e2e_"))
    builders = args.builders or max(1, (os.cpu_count() or 2) - 2)
    env = {**os.environ, "TCTUNE_DATA_DIR": str(data), "TCTUNE_AUTH": "off",
           "TCTUNE_BACKEND": "simulated" if args.simulate else "cuda",
           "PYTHONUNBUFFERED": "1",
           "TCTUNE_BUILD_PROCESSES": str(builders), "TCTUNE_MEASURE_PROCESSES": "1"}
    if db == "sqlite":
        env.pop("TCTUNE_DATABASE_URL", None)  # the file in the data directory
    else:
        env["TCTUNE_DATABASE_URL"] = db_url
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []

    def run(name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        procs.append(start(argv, env, logs / f"{name}.log"))
        return procs[-1]

    cli = [sys.executable, "-m", "api.cli"]
    print(f"service: {'distributed' if distributed else 'embedded'}, database {db}, "
          f"{args.gpus} {'simulated ' if args.simulate else ''}GPU(s), {builders} builders, "
          f"logs in {logs}", flush=True)
    rows: list[dict[str, Any]] = []
    try:
        if db == "postgres":
            subprocess.run([*cli, "db", "upgrade"], cwd=REPO, env=env, check=True)
        if distributed:
            rport = free_port()
            env["TCTUNE_BROKER_URL"] = f"redis://127.0.0.1:{rport}/0"
            env["TCTUNE_CHUNK_SIZE"] = "4"
            run("redis", ["redis-server", "--port", str(rport), "--bind", "127.0.0.1",
                          "--save", "", "--appendonly", "no"])
            if db == "sqlite":
                subprocess.run([*cli, "db", "upgrade"], cwd=REPO, env=env, check=True)
            run("explorer", [*cli, "explorer", "--procs", str(args.explorer_procs)])
            # Builders compile at a lower CPU priority than the GPU workers' host side (the
            # launches, checks and writes that keep a GPU busy): the GPUs are what is scarce.
            run("builder", ["nice", "-n", str(args.builder_nice), *cli, "builder",
                            "-c", str(builders)])
            for g in range(args.gpus):
                run(f"worker{g}", [*cli, "worker",
                                   *(["--simulate", target.name] if args.simulate
                                     else ["--gpu", str(g)])])
        api_proc = run("api", [*cli, "serve", "--port", str(port)])
        api = f"http://127.0.0.1:{port}"
        wait_http(f"{api}/healthz", api_proc, 120, logs / "api.log", 0.5, "the service")
        sampler = GpuSampler()
        if not args.simulate:
            sampler.start()
        wall0 = time.monotonic()
        jobs = []
        for name in layers:
            for precision in precisions:
                shape = RESNET50_3X3[name]
                body = {"shape": shape.to_dict(), "precision": precision,
                        "target": target.name, "trials": args.trials,
                        "strategy": args.strategy}
                job = httpx.post(f"{api}/tune", json=body, timeout=30).json()
                jobs.append((name, precision, job["job_id"]))
                if not args.concurrent:
                    rows.append(collect(api, name, precision, job["job_id"], cudnn, args.gpus))
                    print(json.dumps(rows[-1]), flush=True)
        if args.concurrent:
            for name, precision, job_id in jobs:
                rows.append(collect(api, name, precision, job_id, cudnn, args.gpus))
                print(json.dumps(rows[-1]), flush=True)
        total_s = time.monotonic() - wall0
        sampler.stop.set()
        total = sum(r["trials"] for r in rows)
        result = {"gpu": gpu, "gpus": args.gpus, "date": datetime.now(UTC).date().isoformat(),
                  "simulated": bool(args.simulate),
                  "service": "distributed" if distributed else "embedded", "db": db,
                  "builders": builders,
                  "explorer_procs": args.explorer_procs if distributed else None,
                  "builder_nice": args.builder_nice if distributed else None,
                  "strategy": args.strategy, "concurrent": args.concurrent,
                  "total_wall_s": round(total_s, 1),
                  "measure_per_s": round(total / total_s, 3),
                  "gpu_idle_fraction": sampler.idle_fraction(), "rows": rows}
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))
        return 0
    finally:
        stop_all(procs, timeout=10)


def gpu_target(name: str) -> Any:
    from kernels.spec import target_for_gpu_model

    target = target_for_gpu_model(name)
    if target is None:
        raise SystemExit(f"GPU {name!r} is not a known target")
    return target


def collect(api: str, layer: str, precision: str, job_id: int,
            cudnn: dict[str, float | None], gpus: int) -> dict[str, Any]:
    while True:
        state = httpx.get(f"{api}/jobs/{job_id}", params={"after": 10**9}, timeout=30).json()
        if state["status"] in ("done", "failed", "cancelled"):
            break
        time.sleep(1.0)
    start = datetime.fromisoformat(state["created_at"])
    end = datetime.fromisoformat(state["finished_at"]) if state["finished_at"] else start
    wall = (end - start).total_seconds()
    ex = exhaustive_best(layer, precision)
    final = state["best_us"]
    return {"layer": layer, "precision": precision, "job_id": job_id,
            "status": state["status"], "trials": state["trials_done"],
            "wall_s": round(wall, 1),
            "measure_per_s": round(state["trials_done"] / wall / gpus, 3) if wall else None,
            "final_us": final, "exhaustive_best_us": ex,
            "vs_exhaustive": round(final / ex, 3) if final and ex else None,
            "cudnn_fp16_us": cudnn[layer],
            "vs_cudnn_fp16": round(final / cudnn[layer], 3) if final and cudnn[layer] else None}


if __name__ == "__main__":
    sys.exit(main())
