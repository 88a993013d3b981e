"""Each record of a whole model chosen among its layer's searched schedules by timing the model
(deploy.model_select), then the records that came out of it.

  python -m bench.model_select candidates FILE... --target T --top K --out C.json  # CPU
  python -m bench.model_select prebuild --cache D --schedules R.json --candidates C.json  # CPU
      [--schedules-target T] [--models ...] [--batches ...] [--precisions ...]
  python -m bench.model_select run (the same options) --out OUT.json --records-out R2.json
      [--compiled]

`candidates`: per task key the K fastest distinct schedules measured right in the files
(bench/layer_search.py's rows and bench/concat_check.py's tuned rows), with their latencies.
`run` (GPU): per (model, batch, precision) the model through `deploy.optimize` with
programmatic dependent launch, each forward timed as one CUDA graph of back-to-back forwards
(deploy.measure.forward_us, over two input sets; `--compiled`: the model compiled with inference
freezing, as bench/model_e2e.py's compiled variant runs it); then `choose_in_model`; OUT.json holds
every timing, R2.json the records with the schedules chosen (each with its latency measured
alone, from the candidates), both written after each record. bench/model_e2e.py then times
the models on both records files.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from bench.cli import commands, log, read_json
from kernels.spec import ConvShape, Precision, get_target, task_key


def _measured(doc: dict[str, Any]) -> list[tuple[dict[str, Any], str, dict[str, Any], float]]:
    """(shape, precision, schedule, µs) of every right measurement in a results file."""
    out = []
    for r in doc.get("rows", []):
        for t in r.get("trials", []):  # bench/layer_search.py
            if t.get("status") == "ok" and t.get("median_us"):
                out.append((r["shape"], r["precision"], t["schedule"], t["median_us"]))
        if r.get("kind") == "tune" and r.get("ok") and r.get("us"):  # bench/concat_check.py
            out.append((r["shape"], r["precision"], r["schedule"], r["us"]))
    return out


def cmd_candidates(a: argparse.Namespace) -> int:
    target = get_target(a.target)
    seen: dict[str, dict[str, float]] = {}  # key -> schedule JSON -> fastest µs
    for path in a.files:
        for shape, precision, sched, us in _measured(read_json(path)):
            key = task_key(ConvShape.from_dict(shape), Precision(precision), target)
            js = json.dumps(sched, sort_keys=True)
            mine = seen.setdefault(key, {})
            mine[js] = min(us, mine.get(js, us))
    out = {k: [{"schedule": json.loads(js), "latency_us": us}
               for js, us in sorted(v.items(), key=lambda kv: kv[1])[:a.top]]
           for k, v in sorted(seen.items())}
    Path(a.out).write_text(json.dumps(out, indent=1))
    log(f"{len(out)} task keys, {sum(map(len, out.values()))} candidates -> {a.out}")
    return 0


def _models(a: argparse.Namespace) -> Any:
    """(name, batch, precision, optimized model, input) per combination asked for."""
    import torch

    from bench.model_e2e import _optimize, _schedules
    from bench.nets import model

    gpu = torch.cuda.is_available()
    for name in a.models.split(","):
        for n in (int(b) for b in a.batches.split(",")):
            net, _ = model(name)
            x = torch.randn(n, 3, 224, 224, generator=torch.Generator().manual_seed(1))
            if gpu:
                net, x = net.cuda(), x.cuda().contiguous(memory_format=torch.channels_last)
            for p in a.precisions.split(","):
                yield name, n, p, _optimize(net, x, p, a.schedules_target, _schedules(
                    a.schedules), a.cache, "cuda", pdl=True), x


def _candidates(a: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """The candidates file's schedules per key, less those not worth trying
    (deploy.model_select.worth_trying: fp16 ones slower alone than the record's baseline
    with the pass after it)."""
    from deploy.model_select import worth_trying
    from deploy.plan import epilogue_pass_us

    records = json.loads(Path(a.schedules).read_text())
    out = {}
    for k, v in read_json(a.candidates).items():
        shape_key, prec, target = k.split("|")
        pass_us = epilogue_pass_us(ConvShape.from_key(shape_key), get_target(target))
        out[k] = [c["schedule"] for c in v
                  if worth_trying(Precision(prec), c["latency_us"],
                                  records.get(k, {}).get("baseline_us"), pass_us)]
    return out


def cmd_prebuild(a: argparse.Namespace) -> int:
    """Build every candidate of every record the models run (NVRTC, no GPU)."""
    from deploy.model_select import layer_groups

    cands = _candidates(a)
    for name, n, p, opt, _ in _models(a):
        built = refused = 0
        for key, mods in layer_groups(opt).items():
            in_place, source = dict(mods[0].schedule), mods[0].layer.schedule_source
            for c in cands.get(key, ()):
                try:
                    mods[0].set_schedule(c, "prebuild")
                    built += 1
                except ValueError as exc:
                    refused += 1
                    log(f"  {key}: {exc}")
            mods[0].set_schedule(in_place, source)
        log(f"{name} n={n} {p}: {built} candidates built, {refused} not valid")
    return 0


def _log_choice(c: Any) -> None:
    if c.tried:
        best = min(us for _, us in c.tried[1:]) if len(c.tried) > 1 else float("nan")
        log(f"  {c.key}: in place {c.tried[0][1]:.1f} us, best of {len(c.tried) - 1} "
            f"{best:.1f} us{', taken' if c.changed else ''}")


def cmd_run(a: argparse.Namespace) -> int:
    import torch

    from deploy.measure import model_ruler
    from deploy.model_select import choose_in_model

    cands = _candidates(a)
    cold = {k: {json.dumps(c["schedule"], sort_keys=True): c["latency_us"] for c in v}
            for k, v in read_json(a.candidates).items()}
    records = json.loads(Path(a.schedules).read_text())
    doc: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0),
                           "date": dt.date.today().isoformat(), "schedules": a.schedules,
                           "candidates": a.candidates, "margin": a.margin,
                           "confirm": a.confirm, "compiled": a.compiled, "rows": []}
    for name, n, p, opt, x in _models(a):
        xin = x.float().contiguous(memory_format=torch.channels_last)
        # Two input sets: what stays in L2 between layers is the model's own activations;
        # the input only feeds the first kernel, the same whatever the layers' schedules.
        inputs = [xin.clone() for _ in range(2)]
        timed = model_ruler(opt, inputs, a.compiled)

        row: dict[str, Any] = {"model": name, "n": n, "precision": p,
                               "before_us": timed(), "choices": []}
        doc["rows"].append(row)

        def done(c: Any, name: str = name, n: int = n, row: dict[str, Any] = row) -> None:
            """Log the record's choice and write both files (a run cut short keeps them)."""
            _log_choice(c)
            row["choices"].append(c.to_dict())
            if c.changed:
                rec = dict(records[c.key])
                rec.update(schedule=c.schedule,
                           latency_us=cold[c.key][json.dumps(c.schedule, sort_keys=True)],
                           source=f"bench.model_select: chosen in {name} n={n} from "
                                  f"{len(c.tried)} ({rec.get('source', '')})")
                if rec.get("baseline_us"):
                    rec["speedup"] = rec["baseline_us"] / rec["latency_us"]
                records[c.key] = rec
            Path(a.out).write_text(json.dumps(doc, indent=1))
            Path(a.records_out).write_text(json.dumps(records, indent=1))

        choices = choose_in_model(opt, cands, timed, margin=a.margin, confirm=a.confirm,
                                  progress=done)
        row["after_us"] = timed()
        Path(a.out).write_text(json.dumps(doc, indent=1))
        log(f"{name} n={n} {p}: {row['before_us']:.1f} -> {row['after_us']:.1f} us a forward, "
            f"{sum(c.changed for c in choices)} of {len(choices)} records changed")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap, sub = commands("python -m bench.model_select", __doc__)
    c = sub.add_parser("candidates")
    c.add_argument("files", nargs="+")
    c.add_argument("--target", required=True)
    c.add_argument("--top", type=int, default=8)
    c.add_argument("--out", required=True)
    for cmd in ("prebuild", "run"):
        s = sub.add_parser(cmd)
        s.add_argument("--cache", required=True)
        s.add_argument("--schedules", required=True)
        s.add_argument("--schedules-target", required=True,
                       help="the GPU model whose records these are, e.g. h200")
        s.add_argument("--candidates", required=True)
        s.add_argument("--models", default="resnet50")
        s.add_argument("--batches", default="8")
        s.add_argument("--precisions", default="int8")
        if cmd == "run":
            s.add_argument("--margin", type=float, default=0.003)
            s.add_argument("--confirm", type=int, default=3)
            s.add_argument("--compiled", action="store_true",
                           help="time the forward compiled (deploy.measure.model_ruler), as "
                                "the model runs compiled; PyTorch's ops around the kernels "
                                "then weigh what they do compiled, not eager")
            s.add_argument("--out", required=True)
            s.add_argument("--records-out", required=True)
    a = ap.parse_args(argv)
    return {"candidates": cmd_candidates, "prebuild": cmd_prebuild, "run": cmd_run}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
