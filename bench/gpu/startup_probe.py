"""Where the first seconds of a model's tuning go on a GPU host: importing torch, the
service's start, `tctune plan` tracing a model, and from a plan's submission to the first
proposal and the first measurements (the embedded service, SQLite, an empty database).

    (GPU host, from the repository root, the wheels of bench/gpu/wheels.sh installed)
    python3 bench/gpu/startup_probe.py --out F.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

URL = "http://127.0.0.1:8000"
PLAN = ["plan", "--target", "h200", "--precision", "int8", "--server", URL]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--wait-s", type=float, default=75.0)
    args = ap.parse_args()
    env = {**os.environ, "TCTUNE_AUTH": "off"}
    t0 = time.monotonic()
    steps: list[dict[str, Any]] = []

    def stamp(what: str, seconds: float | None = None) -> None:
        at = round(time.monotonic() - t0, 2)
        steps.append({"at_s": at, "what": what, **({"seconds": round(seconds, 2)}
                                                    if seconds is not None else {})})
        print(f"{at:7.2f} s  {what}" + (f": {seconds:.2f} s" if seconds else ""), flush=True)

    def timed(what: str, argv: list[str]) -> None:
        s = time.monotonic()
        subprocess.run(argv, check=True, capture_output=True, env=env)
        stamp(what, time.monotonic() - s)

    py = [sys.executable, "-c", "import torch, torchvision"]
    timed("import torch, torchvision (first)", py)
    timed("import torch, torchvision (again)", py)
    data = tempfile.mkdtemp()
    log_path = f"{data}/serve.log"
    with open(log_path, "w") as log:
        srv = subprocess.Popen([sys.executable, "-m", "api.cli", "serve", "--data", data,
                                "--port", "8000"], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        while True:
            try:
                urllib.request.urlopen(f"{URL}/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        stamp("service healthy")
        cli = [sys.executable, "-m", "api.cli"]
        timed("tctune plan torchvision:densenet121 at 32,3,224,224, --dry-run",
              [*cli, *PLAN, "torchvision:densenet121", "--input-shape", "32,3,224,224",
               "--dry-run"])
        timed("tctune plan torchvision:resnet50 at 8,3,224,224, submitted (8 trials a layer)",
              [*cli, *PLAN, "torchvision:resnet50", "--input-shape", "8,3,224,224",
               "--trials", "8"])
        submitted, seen = time.monotonic(), set()
        while time.monotonic() - submitted < args.wait_s:
            if "proposal" not in seen and "proposal job" in Path(log_path).read_text():
                seen.add("proposal")
                stamp("first proposal", time.monotonic() - submitted)
            jobs = json.load(urllib.request.urlopen(f"{URL}/jobs?limit=100"))
            done = sum(j["trials_done"] for j in jobs)
            if done and "measured" not in seen:
                seen.add("measured")
                stamp("first measurement", time.monotonic() - submitted)
            if done >= 50:
                stamp(f"{done} measured", time.monotonic() - submitted)
                break
            time.sleep(0.25)
    finally:
        srv.terminate()
        srv.wait(30)
    import torch

    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
                   "date": datetime.now(UTC).date().isoformat(), "steps": steps}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
