"""A transfer round over the zoo: each layer timed on its neighbours' recorded bests.

  python -m bench.zoo_transfer candidates --records R --out C.json --precisions fp16  # CPU
  python -m bench.zoo_transfer variants --records R --out C.json --set PINGPONG=1 \
      --set TMA=2 --vary PERSIST --vary STAGES                                   # CPU
  python -m bench.zoo_transfer sample --records R --out C.json --restrict HALO=1 \
      --count 26 --derive 10 --vary TMA --vary CHUNK                            # CPU
  python -m bench.zoo_transfer neighbours F.json --out C.json --top 3 --limit 36  # CPU
  python -m bench.zoo_transfer prebuild --candidates C.json --cache D               # CPU
  python -m bench.zoo_transfer run --candidates C.json --cache D --out F.json        # GPU
  python -m bench.zoo_transfer merge F.json... --records R --out R2.json            # CPU
  python -m bench.zoo_transfer table F.json

The service seeds every job's rounds with the fastest schedules of the most similar layers
measured on its target and precision (workers/seeds.py, `transfer_points`). This applies the
same rule to layers tuned before it existed: the prior is the records file's other layers of
the same precision and target (their recorded bests), each layer's candidates are the bests
of its `--seeds` nearest neighbours, and `run` checks and times the layer's own record and
each candidate in one run through the GPU worker's backend (workers/backends/cuda.py).
`variants` makes a layer's candidates of its own record instead: a new knob's value set
(`--set`), and every combination of the `--vary` knobs' values, fewest changes from the
record first (`--min-waves` / `--max-waves`: only layers whose record's tiles fill at least /
fewer than that many waves of the GPU's SMs). `sample` draws a layer's candidates from a
subspace (`--restrict`, e.g. a new knob's value): `--count` at random, and `--derive` of the
record's variants in it over the `--vary` knobs, also at random. `neighbours` takes a run's
`--top` fastest candidates of each layer within `--within` of its record and draws their
single-knob neighbours (the `--keep` knobs left as they are). `merge` writes the records with
each layer's fastest schedule of the run; `bench.retime`
then times them against cuDNN in a run of their own. R: a records file of
`bench.model_e2e records`; the layer options are `bench.zoo`'s. `--records-target`: the GPU
model R was measured on where it is not `--target`'s (its schedules are then the records
timed on the other GPU).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.cli import (
    add_records_target,
    add_table,
    commands,
    geomean,
    log,
    print_table,
    read_json,
    records_on,
)
from bench.zoo import add_layer_args, atomic_write, planned, shape_text
from kernels.spec import Precision, get_target, task_key


def records_prior(records: dict[str, Any], precision: str, target: str) -> list[Any]:
    """A records file's layers of one precision and target as a search history's prior: each
    layer's recorded best, a measurement of another layer to whichever layer asks
    (workers/seeds.py passes over the asking layer's own)."""
    from kernels.spec import ConvShape
    from search.strategy import PriorTrial

    return [PriorTrial(ConvShape.from_key(k.split("|")[0]), r["schedule"], "ok", r["latency_us"])
            for k, r in records.items()
            if k.split("|")[1:] == [precision, target] and r.get("latency_us")]


def _records(a: argparse.Namespace) -> dict[str, Any]:
    return records_on(a.records, a.target, a.records_target)


def _restrictions(specs: list[str]) -> dict[str, list[Any]]:
    """KNOB=V1,V2 options as a space restriction."""
    out: dict[str, list[Any]] = {}
    for spec in specs:
        name, vals = spec.split("=", 1)
        out[name] = [_knob_value(v) for v in vals.split(",")]
    return out


def _write_candidates(a: argparse.Namespace, records: str, rows: list[dict[str, Any]],
                      **extra: Any) -> None:
    """A candidates file (`prebuild` and `run` read it): the records it starts from, the
    target, what made it (`extra`), and per layer the record and its candidates."""
    Path(a.out).write_text(json.dumps({"records": records, "target": a.target, **extra,
                                       "rows": rows}, indent=1) + "\n")


def _recorded_layers(a: argparse.Namespace, records: dict[str, Any], target: Any
                     ) -> Iterator[tuple[Any, str, dict[str, Any], Any]]:
    """(group, key, record, space) of each planned layer the records file has."""
    from kernels.space import ScheduleSpace

    for g in planned(a):
        prec = Precision(g.precision)
        key = task_key(g.shape, prec, target)
        if key in records:
            yield g, key, records[key], ScheduleSpace(g.shape, prec, target)


def candidates(a: argparse.Namespace) -> int:
    from kernels.space import schedule_hash
    from workers.seeds import transfer_points

    records = _records(a)
    target = get_target(a.target)
    priors: dict[str, list[Any]] = {}
    rows = []
    for g, key, rec, space in _recorded_layers(a, records, target):
        prior = priors.setdefault(g.precision, records_prior(records, g.precision, target.name))
        own = {space.index_of(rec["schedule"])} if space.is_valid(rec["schedule"]) else set()
        picks = transfer_points(g.shape, space, prior, a.seeds, exclude=own)
        rows.append({"key": key, "layer": g.uses[0].layers[0], "shape": g.shape.to_dict(),
                     "precision": g.precision, "record": rec["schedule"],
                     "candidates": space.schedules(picks)})
        log(f"{key}: {len(picks)} candidates "
            f"({', '.join(schedule_hash(s) for s in space.schedules(picks))})")
    _write_candidates(a, a.records, rows, seeds=a.seeds)
    return 0


def _knob_value(text: str) -> Any:
    return int(text) if text.lstrip("-").isdigit() else text


def variants(a: argparse.Namespace) -> int:
    import itertools

    import numpy as np

    from kernels.space import with_defaults

    records = _records(a)
    target = get_target(a.target)
    fixed = dict((k, _knob_value(v)) for k, v in (kv.split("=", 1) for kv in a.set))
    rows = []
    for g, key, rec, space in _recorded_layers(a, records, target):
        if not space.is_valid(rec["schedule"]):
            continue
        record = with_defaults(space.precision, rec["schedule"])
        g0 = space.geometry(np.array([space.index_of(record)]))
        tiles = -(-g.shape.gemm_m // int(g0.block_m[0])) * -(-g.shape.gemm_n // int(g0.block_n[0]))
        if tiles < a.min_waves * target.sms or (a.max_waves and tiles >= a.max_waves * target.sms):
            continue
        picks: list[tuple[int, dict[str, Any]]] = []
        for combo in itertools.product(*(space.knobs[k] for k in a.vary)):
            s = {**record, **fixed, **dict(zip(a.vary, combo, strict=True))}
            if s != record and space.is_valid(s) and s not in [p for _, p in picks]:
                picks.append((sum(s[k] != record[k] for k in s), s))
        cands = [s for _, s in sorted(picks, key=lambda t: t[0])[:a.limit]]
        rows.append({"key": key, "layer": g.uses[0].layers[0], "shape": g.shape.to_dict(),
                     "precision": g.precision, "record": rec["schedule"], "candidates": cands})
        log(f"{key}: {len(cands)} variants")
    _write_candidates(a, a.records, rows, set=fixed, vary=a.vary)
    return 0


def sample(a: argparse.Namespace) -> int:
    import itertools

    import numpy as np

    from kernels.space import ScheduleSpace, with_defaults

    records = _records(a)
    target = get_target(a.target)
    restrict = _restrictions(a.restrict)
    fixed = {k: v[0] for k, v in restrict.items() if len(v) == 1}
    rng = np.random.default_rng(a.seed)
    rows = []
    for g, key, rec, space in _recorded_layers(a, records, target):
        if g.shape.q < a.min_width or g.shape.c < a.min_channels or \
                (a.out_channels and g.shape.k not in a.out_channels):
            continue
        sub = ScheduleSpace(g.shape, space.precision, target, restrict)
        valid = sub.valid_indices
        if not len(valid):
            continue
        record = with_defaults(space.precision, rec["schedule"])
        derived: list[dict[str, Any]] = []
        for combo in itertools.product(*(space.knobs[k] for k in a.vary)):
            s = {**record, **fixed, **dict(zip(a.vary, combo, strict=True))}
            if all(s[k] in sub.knobs[k] for k in sub.knobs) and sub.is_valid(s) and \
                    s not in derived:
                derived.append(s)
        cands = [derived[int(i)] for i in rng.permutation(len(derived))[:a.derive]]
        n_derived = len(cands)
        drawn = sub.schedules(rng.choice(valid, size=min(a.count, len(valid)), replace=False))
        cands += [s for s in drawn if s not in cands]
        rows.append({"key": key, "layer": g.uses[0].layers[0], "shape": g.shape.to_dict(),
                     "precision": g.precision, "record": rec["schedule"], "candidates": cands,
                     "derived": n_derived})
        log(f"{key}: {len(cands)} candidates ({n_derived} of the record) of {len(valid)}")
    _write_candidates(a, a.records, rows, restrict=restrict)
    return 0


def neighbours(a: argparse.Namespace) -> int:
    import numpy as np

    from kernels.space import ScheduleSpace, with_defaults
    from kernels.spec import ConvShape

    doc = read_json(a.file)
    target = get_target(a.target)
    rng = np.random.default_rng(a.seed)
    rows = []
    for r in doc["rows"]:
        own = r["times"][0]
        ok = sorted((t for t in r["times"][1:] if t["status"] == "ok"), key=lambda t: t["us"])
        if own["status"] != "ok" or not ok or ok[0]["us"] > own["us"] * a.within:
            continue
        prec = Precision(r["precision"])
        space = ScheduleSpace(ConvShape.from_dict(r["shape"]), prec, target)
        tops = [s for s in (with_defaults(prec, t["schedule"]) for t in ok[:a.top])
                if space.is_valid(s)]
        seen = [t["schedule"] for t in r["times"]]
        cands = tops[:1]
        for base in tops:
            near = [{**base, k: v} for k, vals in space.knobs.items() if k not in a.keep
                    for v in vals if v != base[k]]
            near = [s for s in near if space.is_valid(s) and s not in seen and s not in cands]
            cands += [near[int(i)] for i in rng.permutation(len(near))[:a.limit // len(tops)]]
        rows.append({"key": r["key"], "layer": r["layer"], "shape": r["shape"],
                     "precision": r["precision"], "record": own["schedule"], "candidates": cands})
        log(f"{r['key']}: {len(cands)} candidates, fastest {ok[0]['us'] / own['us']:.3f}x")
    _write_candidates(a, doc["records"], rows, around=a.file)
    return 0


def _jobs(doc: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(row, schedule) of every schedule `run` times: the record first."""
    return [(r, s) for r in doc["rows"] for s in [r["record"], *r["candidates"]]]


def prebuild(a: argparse.Namespace) -> int:
    from kernels.build import BuildJob, build_many
    from kernels.spec import ConvShape

    doc = json.loads(Path(a.candidates).read_text())
    sm = get_target(doc["target"]).sm
    jobs = [BuildJob(ConvShape.from_dict(r["shape"]), Precision(r["precision"]), sm, s)
            for r, s in _jobs(doc)]
    res = build_many(jobs, a.cache)
    log(f"{sum(r.status == 'ok' for r in res)} of {len(jobs)} built into {a.cache}")
    return 0


def run(a: argparse.Namespace) -> int:
    from kernels.spec import ConvShape
    from workers.backends.base import TaskSpec
    from workers.backends.cuda import CudaBackend

    doc = json.loads(Path(a.candidates).read_text())
    backend = CudaBackend(a.cache)
    target = backend.target
    if target is None or target.name != doc["target"]:
        raise SystemExit(f"GPU {backend.gpu_model!r} is not the candidates' {doc['target']}")
    rows: list[dict[str, Any]] = []
    out = {"gpu": backend.gpu_model, "date": dt.date.today().isoformat(),
           "candidates": a.candidates, "records": doc["records"], "rows": rows}
    try:
        for r in doc["rows"]:
            spec = TaskSpec(ConvShape.from_dict(r["shape"]), Precision(r["precision"]), target)
            times = []
            for s in [r["record"], *r["candidates"]]:
                m = backend.measure(spec, s, backend.build(spec, s))
                times.append({"schedule": s, "status": m.status, "us": m.median_us})
            rows.append({"key": r["key"], "layer": r["layer"], "shape": r["shape"],
                         "precision": r["precision"], "times": times})
            ok = [t["us"] for t in times[1:] if t["status"] == "ok"]
            log(f"{r['key']}: record {times[0]['us']} us ({times[0]['status']}), "
                f"candidates best {min(ok, default=None)} us, {len(ok)} of "
                f"{len(times) - 1} ok")
            atomic_write(Path(a.out), json.dumps(out, indent=1) + "\n")
    finally:
        backend.close()
    return 0


def fastest(row: dict[str, Any]) -> dict[str, Any] | None:
    """The row's fastest ok timing (the record's where it is one of the fastest)."""
    ok = [t for t in row["times"] if t["status"] == "ok" and t["us"] is not None]
    return min(ok, key=lambda t: t["us"]) if ok else None


def merge(a: argparse.Namespace) -> int:
    """Each layer moves to the fastest schedule of the runs where it beats the record's time
    of the same run by more than --margin (run to run, a time moves by a percent or so)."""
    records = _records(a)
    moved = set()
    for path in a.files:
        for row in read_json(path)["rows"]:
            best, own = fastest(row), row["times"][0]
            if best is None or own["status"] != "ok" or best["us"] >= own["us"] * (1 - a.margin):
                continue
            rec = records[row["key"]]
            if rec["schedule"] != own["schedule"]:  # moved by an earlier file already
                continue
            records[row["key"]] = {
                **rec, "schedule": best["schedule"], "latency_us": best["us"],
                "speedup": rec["baseline_us"] / best["us"] if rec.get("baseline_us") else None,
                "source": f"{Path(path).name}: transfer round, over {rec.get('source')}"}
            moved.add(row["key"])
    Path(a.out).write_text(json.dumps(records, indent=1) + "\n")
    log(f"{len(moved)} records moved to a neighbour's schedule -> {a.out}")
    return 0


def render(doc: dict[str, Any]) -> str:
    lines = [f"{doc['gpu']}, {doc['date']}: each layer's fastest of the transfer round over its "
             "record's time, same run", "",
             "| precision | layers | faster than the record | geomean | best | not ok |",
             "|---|---|---|---|---|---|"]
    for prec in sorted({r["precision"] for r in doc["rows"]}):
        rs = [r for r in doc["rows"] if r["precision"] == prec
              and r["times"][0]["status"] == "ok"]
        ratios = [fastest(r)["us"] / r["times"][0]["us"] for r in rs]  # type: ignore[index]
        bad = sum(t["status"] != "ok" for r in rs for t in r["times"][1:])
        lines.append(f"| {prec} | {len(rs)} | {sum(x < 1 for x in ratios)} | "
                     f"{geomean(ratios):.3f} | {min(ratios):.3f} | {bad} |")
    lines += ["", "The layers that moved (the fastest's knobs where they differ from the "
              "record's):", "",
              "| layer | shape | precision | record us | fastest us | ratio | knobs |",
              "|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        best, own = fastest(r), r["times"][0]
        if best is None or own["status"] != "ok" or best is own:
            continue
        diff = ", ".join(f"{k}={v}" for k, v in best["schedule"].items()
                         if own["schedule"].get(k) != v)
        shape = shape_text(r["shape"]) if r["shape"] else "-"
        lines.append(f"| {r['layer']} | {shape} | {r['precision']} | {own['us']:.2f} | "
                     f"{best['us']:.2f} | {best['us'] / own['us']:.3f} | {diff} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap, sub = commands("python -m bench.zoo_transfer", __doc__)

    def candidates_parser(name: str, help_text: str) -> Any:
        """A command that writes a candidates file from the records of the picked layers."""
        p = sub.add_parser(name, help=help_text)
        add_layer_args(p)
        p.add_argument("--records", required=True)
        p.add_argument("--out", required=True)
        p.add_argument("--target", default="h100")
        add_records_target(p)
        return p

    c = candidates_parser("candidates", "each layer's neighbours' bests (CPU)")
    c.add_argument("--seeds", type=int, default=8, help="neighbours per layer")
    v = candidates_parser("variants", "each layer's record with knobs set and varied (CPU)")
    v.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE")
    v.add_argument("--vary", action="append", default=[], metavar="KNOB")
    v.add_argument("--limit", type=int, default=6, help="variants per layer")
    v.add_argument("--min-waves", type=float, default=0.0,
                   help="only layers whose record has at least this many tiles per SM")
    v.add_argument("--max-waves", type=float, default=0.0,
                   help="only layers whose record's tiles fill fewer waves (0: any)")
    sm = candidates_parser("sample", "each layer's record and draws of a subspace (CPU)")
    sm.add_argument("--restrict", action="append", default=[], metavar="KNOB=V1,V2")
    sm.add_argument("--count", type=int, default=20, help="random schedules of the subspace")
    sm.add_argument("--derive", type=int, default=0, help="variants of the record in it")
    sm.add_argument("--vary", action="append", default=[], metavar="KNOB")
    sm.add_argument("--min-width", type=int, default=0, help="only layers this many columns wide")
    sm.add_argument("--min-channels", type=int, default=0)
    sm.add_argument("--out-channels", type=lambda v: [int(x) for x in v.split(",")],
                    default=[], help="only layers of these output channel counts (K1,K2)")
    sm.add_argument("--seed", type=int, default=0)
    nb = sub.add_parser("neighbours", help="single-knob neighbours of a run's fastest (CPU)")
    nb.add_argument("file")
    nb.add_argument("--out", required=True)
    nb.add_argument("--target", default="h100", help="the GPU model the run was timed on")
    nb.add_argument("--top", type=int, default=3)
    nb.add_argument("--limit", type=int, default=36, help="candidates per layer")
    nb.add_argument("--within", type=float, default=1.25,
                    help="only layers whose fastest took at most this times the record's")
    nb.add_argument("--keep", action="append", default=[], metavar="KNOB")
    nb.add_argument("--seed", type=int, default=0)
    for name, help_text in (("prebuild", "build every candidate (CPU)"),
                            ("run", "check and time each layer's record and candidates (GPU)")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--candidates", required=True)
        p.add_argument("--cache", default="/tmp/tctune-transfer")
        if name == "run":
            p.add_argument("--out", required=True)
    m = sub.add_parser("merge", help="records with each layer's fastest of runs (CPU)")
    m.add_argument("files", nargs="+")
    m.add_argument("--margin", type=float, default=0.01)
    m.add_argument("--records", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--target", default="h100")
    add_records_target(m)
    add_table(sub)
    a = ap.parse_args(argv)
    if print_table(a, render):
        return 0
    if getattr(a, "target", None):  # the name records' keys and candidates files carry
        a.target = get_target(a.target).name
    return {"candidates": candidates, "variants": variants, "sample": sample,
            "neighbours": neighbours, "prebuild": prebuild, "run": run, "merge": merge}[a.cmd](a)


if __name__ == "__main__":
    raise SystemExit(main())
