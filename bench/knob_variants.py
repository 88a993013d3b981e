"""Each layer's record with some knobs changed, timed beside the record by bench.kernel_ab,
and the faster kept: how a new knob is tried on records searched before it existed.

  python -m bench.knob_variants variants --records R --out-dir D \\
      --variant s_same:SWAP_AB=1 --variant s_t2:SWAP_AB=1,WARP_ROW_TILES=2,WARP_COL_TILES=2
    writes D/rec_base.json (the records the variants apply to: wgmma, no HALO by default
    --where) and D/rec_NAME.json per variant: the record with the changes where the space
    admits them, the record itself elsewhere (every label then has every layer)
  python -m bench.kernel_ab build --label NAME --records D/rec_NAME.json ...   (each label)
  python -m bench.kernel_ab run --labels base,NAME,... --records D/rec_base.json --out F
  python -m bench.knob_variants merge F --out-dir D --records R --out R2
    R2: R with each layer's fastest variant where it took under --keep (0.97) of the
    record's time in F
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.cli import commands, log, read_json
from kernels.space import ScheduleSpace
from kernels.spec import ConvShape, Precision, get_target


def _value(v: str) -> Any:
    try:
        return int(v)
    except ValueError:
        return v


def parse_changes(spec: str) -> tuple[str, dict[str, Any]]:
    """NAME:K=V,K=V -> (NAME, {K: V})."""
    name, _, body = spec.partition(":")
    if not name or not body:
        raise SystemExit(f"--variant {spec!r}: expected NAME:KNOB=VALUE[,KNOB=VALUE]")
    changes = {}
    for kv in body.split(","):
        k, _, v = kv.partition("=")
        changes[k.strip()] = _value(v.strip())
    return name, changes


def variants(a: argparse.Namespace) -> int:
    records = json.loads(Path(a.records).read_text())
    where = dict(parse_changes(f"where:{a.where}")[1]) if a.where else {}
    specs = [parse_changes(v) for v in a.variant]
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = {k: r for k, r in records.items()
            if k.endswith(f"|{a.target}") and all(r["schedule"].get(n, 0) == v
                                                  for n, v in where.items())}
    target = get_target(a.target)
    docs: dict[str, dict[str, Any]] = {name: {} for name, _ in specs}
    for key, rec in base.items():
        shape_key, prec, _ = key.split("|")
        space = ScheduleSpace(ConvShape.from_key(shape_key), Precision(prec), target)
        for name, changes in specs:
            s = {**rec["schedule"], **changes}
            docs[name][key] = {**rec, "schedule": s} if space.is_valid(s) else rec
    (out / "rec_base.json").write_text(json.dumps(base, indent=1) + "\n")
    for name, doc in docs.items():
        (out / f"rec_{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
        changed = sum(doc[k]["schedule"] != base[k]["schedule"] for k in doc)
        log(f"{name}: {changed} of {len(doc)} records changed")
    return 0


def merge(a: argparse.Namespace) -> int:
    run = read_json(a.file)
    labels = [lb for lb in run["labels"] if lb != "base"]
    docs = {lb: json.loads((Path(a.out_dir) / f"rec_{lb}.json").read_text()) for lb in labels}
    base = json.loads((Path(a.out_dir) / "rec_base.json").read_text())
    out = json.loads(Path(a.records).read_text())
    kept = 0
    for key, rec in base.items():
        row = next((r for r in run["rows"]
                    if f"{ConvShape.from_dict(r['shape']).key()}|{r['precision']}|"
                    f"{key.rsplit('|', 1)[1]}" == key), None)
        if row is None or row["status"].get("base") != "ok":
            continue
        cands = [(row["us"][lb], lb) for lb in labels if row["status"].get(lb) == "ok"
                 and docs[lb][key]["schedule"] != rec["schedule"]]
        if not cands:
            continue
        us, lb = min(cands)
        if us < a.keep * row["us"]["base"]:
            old = out[key]
            out[key] = {**old, "schedule": docs[lb][key]["schedule"], "latency_us": us,
                        "speedup": old["baseline_us"] / us,
                        "source": f"{Path(a.file).name}: {lb}, {us / row['us']['base']:.3f}x "
                                  "the record's time in the same run"}
            kept += 1
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    log(f"{kept} records replaced -> {a.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap, sub = commands("python -m bench.knob_variants", __doc__)
    v = sub.add_parser("variants", help="records files of the changed schedules (CPU)")
    v.add_argument("--records", required=True)
    v.add_argument("--out-dir", required=True)
    v.add_argument("--target", default="h200")
    v.add_argument("--variant", action="append", required=True, help="NAME:KNOB=V[,KNOB=V]")
    v.add_argument("--where", default="MMA=wgmma,HALO=0",
                   help="only records whose schedule has these values (absent knobs: 0)")
    m = sub.add_parser("merge", help="the records with the variants that won (CPU)")
    m.add_argument("file", help="a bench.kernel_ab run of the variants' labels")
    m.add_argument("--out-dir", required=True)
    m.add_argument("--records", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--keep", type=float, default=0.97)
    a = ap.parse_args(argv)
    return {"variants": variants, "merge": merge}[a.cmd](a)


if __name__ == "__main__":
    raise SystemExit(main())
