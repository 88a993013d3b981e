"""One kernel change, everything else fixed: each layer's recorded schedule built from two or
more versions of the kernel sources and timed alternately in one run.

  git archive BASE kernels | tar -x -C DIR                                 # the old sources
  python -m bench.kernel_ab build --label base --sources DIR --records R --cache C  # CPU
  python -m bench.kernel_ab build --label new --records R --cache C          # this checkout's
  python -m bench.kernel_ab run --labels base,new --records R --cache C --out F    # GPU
  python -m bench.kernel_ab table F
`build` compiles with the `kernels` package under --sources (default: this checkout's) and
notes each layer's build key under its label in the cache (`--residual`: every layer with
the residual epilogue, as a bottleneck's last conv runs); `run` checks and times every
label's build of a layer back to back, the labels' order turned by one from layer
to layer, so that drift over the run falls on all of them alike. R: a records file of
`bench.model_e2e records`; the layer options are `bench.zoo`'s.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.cli import add_table, commands, geomean, log, print_table
from bench.zoo import add_layer_args, atomic_write, planned
from kernels.spec import Precision, task_key


def _keys_file(cache: str, label: str) -> Path:
    return Path(cache) / f"ab_{label}.json"


def build(a: argparse.Namespace) -> int:
    import kernels
    from kernels.build import DEFAULT_EPILOGUE, BuildJob, Epilogue, build_many
    from kernels.spec import get_target

    records = json.loads(Path(a.records).read_text())
    target = get_target(a.target)
    # --residual: a bottleneck's last conv as deploy.optimize builds it (+ residual, ReLU).
    epilogue = Epilogue(relu=True, residual=True) if a.residual else DEFAULT_EPILOGUE
    tasks, jobs = [], []
    for g in planned(a):
        key = task_key(g.shape, Precision(g.precision), target)
        if key in records:
            tasks.append(key)
            jobs.append(BuildJob(g.shape, Precision(g.precision), target.sm,
                                 records[key]["schedule"], epilogue))
    res = build_many(jobs, a.cache)
    keys = {t: {"key": r.key, "status": r.status} for t, r in zip(tasks, res, strict=True)}
    _keys_file(a.cache, a.label).write_text(json.dumps(
        {"sources": str(Path(kernels.__file__).parent), "builds": keys}, indent=1) + "\n")
    log(f"{a.label}: {sum(r.status == 'ok' for r in res)} of {len(jobs)} built from "
        f"{Path(kernels.__file__).parent} into {a.cache}")
    return 0


def run(a: argparse.Namespace) -> int:
    from workers.backends.base import BuildOutcome, TaskSpec
    from workers.backends.cuda import CudaBackend

    labels = a.labels.split(",")
    records = json.loads(Path(a.records).read_text())
    builds = {lb: json.loads(_keys_file(a.cache, lb).read_text()) for lb in labels}
    backend = CudaBackend(a.cache)
    target = backend.target
    if target is None:
        raise SystemExit(f"no target for GPU {backend.gpu_model!r}")
    rows: list[dict[str, Any]] = []
    doc: dict[str, Any] = {"gpu": backend.gpu_model, "date": dt.date.today().isoformat(),
                           "records": a.records, "labels": labels,
                           "sources": {lb: builds[lb]["sources"] for lb in labels}, "rows": rows}
    try:
        for g in planned(a):
            prec = Precision(g.precision)
            tkey = task_key(g.shape, prec, target)
            if tkey not in records or any(tkey not in builds[lb]["builds"] for lb in labels):
                continue
            spec = TaskSpec(g.shape, prec, target)
            schedule = records[tkey]["schedule"]
            row: dict[str, Any] = {"layer": g.uses[0].layers[0], "shape": g.shape.to_dict(),
                                   "precision": g.precision, "schedule": schedule,
                                   "us": {}, "status": {}}
            turn = len(rows) % len(labels)
            for lb in labels[turn:] + labels[:turn]:
                b = builds[lb]["builds"][tkey]
                m = backend.measure(spec, schedule, BuildOutcome(b["status"], artifact=b["key"]))
                row["us"][lb] = m.median_us
                row["status"][lb] = m.status
            rows.append(row)
            log(f"{g.shape.key()} {g.precision}: " +
                ", ".join(f"{lb} {row['us'][lb]} us ({row['status'][lb]})" for lb in labels))
            atomic_write(Path(a.out), json.dumps(doc, indent=1) + "\n")
    finally:
        backend.close()
    return 0


def _is_1x1(shape: dict[str, Any]) -> bool:
    return shape["r"] == 1 and shape["s"] == 1


def render(doc: dict[str, Any]) -> str:
    labels = doc["labels"]
    base = labels[0]
    lines = [f"{doc['gpu']}, {doc['date']}: time of each label's build over {base}'s, same "
             "schedule, geometric mean over the layers (best, worst)", "",
             "| precision | class | layers | " + " | ".join(labels[1:]) + " |",
             "|---|---|---|" + "---|" * (len(labels) - 1)]
    for prec in sorted({r["precision"] for r in doc["rows"]}):
        for cls, pick in (("1x1", True), ("others", False)):
            rs = [r for r in doc["rows"] if r["precision"] == prec and _is_1x1(r["shape"]) == pick
                  and all(r["status"].get(lb) == "ok" for lb in labels)]
            if not rs:
                continue
            cells = []
            for lb in labels[1:]:
                ratios = [r["us"][lb] / r["us"][base] for r in rs]
                cells.append(f"{geomean(ratios):.3f} ({min(ratios):.3f}, {max(ratios):.3f})")
            lines.append(f"| {prec} | {cls} | {len(rs)} | " + " | ".join(cells) + " |")
    bad = [(r["layer"], r["precision"], r["status"]) for r in doc["rows"]
           if any(s != "ok" for s in r["status"].values())]
    lines += ["", f"{len(doc['rows'])} layers, {len(bad)} with a build not ok: {bad[:5]}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap, sub = commands("python -m bench.kernel_ab", __doc__)
    b = sub.add_parser("build", help="build with this checkout's kernels or --sources' (CPU)")
    b.add_argument("--label", required=True)
    b.add_argument("--target", default="h100")
    b.add_argument("--sources", default="", help="a directory holding another `kernels` tree")
    b.add_argument("--residual", action="store_true",
                   help="build with the residual epilogue (+ residual, ReLU)")
    r = sub.add_parser("run", help="check and time every label's builds on this GPU")
    r.add_argument("--labels", required=True, help="comma-separated, the first the baseline")
    r.add_argument("--out", required=True)
    for p in (b, r):
        p.add_argument("--records", required=True)
        p.add_argument("--cache", default="/tmp/tctune-ab")
        add_layer_args(p, batches="8")
    add_table(sub)
    a = ap.parse_args(argv)
    if print_table(a, render):
        return 0
    if a.cmd == "build" and a.sources:
        import kernels

        src = Path(a.sources).resolve()
        if Path(kernels.__file__).resolve().parent != src / "kernels":
            if not (src / "kernels" / "build.py").is_file():
                raise SystemExit(f"--sources {a.sources}: no kernels package there")
            # The same command in a child process whose first import path is the other
            # tree: its `kernels` package builds there.
            args = list(argv if argv is not None else sys.argv[1:])
            code = (f"import sys; sys.path.insert(0, {str(src)!r}); "
                    f"from bench.kernel_ab import main; raise SystemExit(main({args!r}))")
            return subprocess.run([sys.executable, "-c", code], check=False).returncode
    return build(a) if a.cmd == "build" else run(a)


if __name__ == "__main__":
    raise SystemExit(main())
