"""bench/knob_variants.py: records with knobs changed where the space admits them, and the
merge that keeps a variant only where it beat its record in the same run."""

from __future__ import annotations

import json
from pathlib import Path

from bench import knob_variants
from kernels.spec import ConvShape, Precision, get_target, task_key

H200 = get_target("h200")
REDUCE = ConvShape(8, 56, 56, 256, 64, 1, 1)
STEM = ConvShape(8, 224, 224, 3, 64, 7, 7, stride=2, pad=3)
WG = dict(BLK_ROW_WARPS=1, BLK_COL_WARPS=1, WARP_ROW_TILES=1, WARP_COL_TILES=2, CHUNK=2,
          REORDER_INNER=0, DUP_AWARE=0, PACK_OUT=1, LAYOUT="nhwc", STAGES=4, SPLIT_K=1,
          MMA="wgmma", TMA=0)


def _rec(schedule: dict, us: float) -> dict:
    return {"schedule": schedule, "latency_us": us, "baseline_us": 2 * us,
            "baseline": "cuDNN fp16", "speedup": 2.0, "source": "test"}


def _records(tmp: Path) -> tuple[Path, dict]:
    recs = {
        task_key(REDUCE, Precision.INT8, H200): _rec(WG, 5.0),
        # WARP_COL_TILES 1: no whole 64-channel instruction, so no swapped variant
        task_key(REDUCE, Precision.FP16, H200): _rec({**WG, "WARP_COL_TILES": 1}, 6.0),
        task_key(STEM, Precision.INT8, H200): _rec({**WG, "MMA": "sync"}, 14.0),  # not wgmma
    }
    path = tmp / "records.json"
    path.write_text(json.dumps(recs))
    return path, recs


def test_variants_change_what_the_space_admits_and_keep_the_rest(tmp_path: Path) -> None:
    path, recs = _records(tmp_path)
    out = tmp_path / "v"
    assert knob_variants.main(["variants", "--records", str(path), "--out-dir", str(out),
                               "--variant", "swap:SWAP_AB=1",
                               "--variant", "tall:SWAP_AB=1,WARP_ROW_TILES=4"]) == 0
    base = json.loads((out / "rec_base.json").read_text())
    assert set(base) == {task_key(REDUCE, p, H200) for p in (Precision.INT8, Precision.FP16)}
    swap = json.loads((out / "rec_swap.json").read_text())
    tall = json.loads((out / "rec_tall.json").read_text())
    k8, k16 = task_key(REDUCE, Precision.INT8, H200), task_key(REDUCE, Precision.FP16, H200)
    assert swap[k8]["schedule"] == {**WG, "SWAP_AB": 1}
    assert tall[k8]["schedule"] == {**WG, "SWAP_AB": 1, "WARP_ROW_TILES": 4}
    assert swap[k16] == recs[k16] and tall[k16] == recs[k16]  # invalid there: the record


def test_merge_keeps_a_variant_only_where_it_won_by_the_margin(tmp_path: Path) -> None:
    path, recs = _records(tmp_path)
    out = tmp_path / "v"
    knob_variants.main(["variants", "--records", str(path), "--out-dir", str(out), "--variant",
                        "swap:SWAP_AB=1", "--variant", "tall:SWAP_AB=1,WARP_ROW_TILES=4"])

    def row(shape: ConvShape, prec: str, us: dict) -> dict:
        return {"shape": shape.to_dict(), "precision": prec, "us": us,
                "status": {k: "ok" for k in us}}

    run = {"labels": ["base", "swap", "tall"], "rows": [
        row(REDUCE, "int8", {"base": 5.0, "swap": 4.9, "tall": 4.5}),
        # the fp16 record has no variant: its labels time the record itself
        row(REDUCE, "fp16", {"base": 6.0, "swap": 5.0, "tall": 5.0})]}
    ab = tmp_path / "ab.json"
    ab.write_text(json.dumps(run))
    merged = tmp_path / "merged.json"
    assert knob_variants.main(["merge", str(ab), "--out-dir", str(out), "--records", str(path),
                               "--out", str(merged)]) == 0
    got = json.loads(merged.read_text())
    k8, k16 = task_key(REDUCE, Precision.INT8, H200), task_key(REDUCE, Precision.FP16, H200)
    assert got[k8]["schedule"] == {**WG, "SWAP_AB": 1, "WARP_ROW_TILES": 4}
    assert got[k8]["latency_us"] == 4.5 and "tall, 0.900x" in got[k8]["source"]
    assert got[k16] == recs[k16]
    # a variant within the margin (0.98x) is not taken
    run["rows"][0]["us"] = {"base": 5.0, "swap": 4.9, "tall": 5.2}
    ab.write_text(json.dumps(run))
    knob_variants.main(["merge", str(ab), "--out-dir", str(out), "--records", str(path),
                        "--out", str(merged)])
    assert json.loads(merged.read_text())[k8] == recs[k8]
