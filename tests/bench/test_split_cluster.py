"""bench/split_cluster.py on the CPU: the layers a whole-model run ran, each record's split
variants (valid, with what split-K cannot run reset), the table, and the records that take a
cluster variant only where it beats the record by the margin."""

from __future__ import annotations

import json
from pathlib import Path

from bench import split_cluster
from kernels.space import ScheduleSpace
from kernels.spec import ConvShape, Precision, get_target

H200 = get_target("h200")
STAGE4 = ConvShape(8, 7, 7, 512, 512, 3, 3, pad=1)
KEY = f"{STAGE4.key()}|int8|h200"
RECORD = dict(BLK_ROW_WARPS=1, BLK_COL_WARPS=1, WARP_ROW_TILES=1, WARP_COL_TILES=1, CHUNK=8,
              REORDER_INNER=1, DUP_AWARE=0, PACK_OUT=2, LAYOUT="nhwc", STAGES=6, SPLIT_K=1,
              MMA="wgmma", TMA=2, PERSIST=1)


def test_layer_keys_are_the_runs_records_in_forward_order_once(tmp_path: Path) -> None:
    rep = ("  a  schedule: given (A|int8|h200), 3 us\n  b  schedule: given (B|int8|h200)\n"
           "  c  schedule: given (A|int8|h200)\n  d  schedule: default\n")
    rows = [{"model": "resnet50", "n": 8, "report": rep},
            {"model": "resnet50", "n": 1, "report": "x schedule: given (C|fp16|h200)"},
            {"model": "resnet18", "n": 8, "report": "x schedule: given (D|fp16|h200)"}]
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"rows": rows}))
    assert split_cluster.layer_keys(run) == ["A|int8|h200", "B|int8|h200", "C|fp16|h200",
                                             "D|fp16|h200"]
    assert split_cluster.layer_keys(run, "resnet50", "8") == ["A|int8|h200", "B|int8|h200"]


def test_variants_are_valid_splits_of_the_record_both_ways() -> None:
    got = split_cluster.variants(STAGE4, Precision.INT8, H200, RECORD)
    assert got[0] == ("record", RECORD)
    space = ScheduleSpace(STAGE4, Precision.INT8, H200)
    names = [n for n, _ in got[1:]]
    assert "split2_st6_global" in names and "split4_st2_cluster" in names
    for name, s in got[1:]:
        assert space.is_valid(s), name
        assert s["PERSIST"] == 0 and s["PACK_OUT"] == 1  # what split-K cannot run, reset
        assert f"split{s['SPLIT_K']}_st{s['STAGES']}_" in name
        assert name.endswith("cluster" if s["SPLIT_CLUSTER"] else "global")
    # without sm_90's clusters: global splits only
    a100 = split_cluster.variants(STAGE4, Precision.INT8, get_target("a100"),
                                  {**RECORD, "MMA": "sync", "TMA": 0, "STAGES": 2,
                                   "PACK_OUT": 1, "PERSIST": 0})
    assert len(a100) > 1 and all(not n.endswith("cluster") for n, _ in a100)


def _run_doc(record_us: float, cluster_us: float) -> dict:
    v = dict(split_cluster.variants(STAGE4, Precision.INT8, H200, RECORD))
    times = {n: {"schedule": v[n], "status": "ok", "us": us} for n, us in (
        ("record", record_us), ("split2_st4_global", 9.0), ("split2_st4_cluster", cluster_us),
        ("split4_st4_cluster", 99.0))}
    times["split2_st2_cluster"] = {"schedule": v["split2_st2_cluster"], "status": "wrong",
                                   "us": 0.5}  # never taken
    return {"gpu": "NVIDIA H200", "date": "2026-12-01", "rows": [
        {"key": KEY, "precision": "int8", "variants": times}]}


def test_records_take_a_cluster_variant_only_past_the_margin(tmp_path: Path) -> None:
    base = tmp_path / "base.json"
    base.write_text(json.dumps({KEY: {"schedule": RECORD, "latency_us": 7.0, "source": "s"}}))
    for cluster_us, taken in ((6.0, True), (6.95, False)):
        run = tmp_path / "run.json"
        run.write_text(json.dumps(_run_doc(7.0, cluster_us)))
        out = tmp_path / "out.json"
        assert split_cluster.main(["records", str(run), "--base", str(base),
                                   "--out", str(out)]) == 0
        rec = json.loads(out.read_text())[KEY]
        assert (rec["schedule"].get("SPLIT_CLUSTER") == 1) == taken
        assert rec["latency_us"] == (cluster_us if taken else 7.0)


def test_table_compares_the_best_of_each_sum(tmp_path: Path) -> None:
    text = split_cluster.render(_run_doc(7.0, 6.3))
    assert "| 9.0 (split2_st4_global) | 6.3 (split2_st4_cluster) | 0.700 | 0.900 |" in text
    assert "1 layers: geomean cluster / global 0.700; cluster / record 0.900" in text
