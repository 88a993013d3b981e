"""bench/zoo_transfer.py: the service's transfer rule applied to recorded layers, and the
merge of a run's timings back into the records."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from bench import zoo_transfer
from bench.zoo import SHAPES_FILE, planned
from kernels.space import ScheduleSpace, schedule_hash, with_defaults
from kernels.spec import ConvShape, Precision, get_target, task_key

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "bench" / "data" / "model_e2e_records_h100.json"
H100 = get_target("h100")


def test_candidates_are_the_nearest_layers_bests_not_the_own(tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    assert zoo_transfer.main(["candidates", "--records", str(RECORDS), "--out", str(out),
                              "--models", "resnet18", "--precisions", "fp16",
                              "--seeds", "3"]) == 0
    doc = json.loads(out.read_text())
    records = json.loads(RECORDS.read_text())
    fp16_bests = {schedule_hash(r["schedule"]) for k, r in records.items()
                  if k.endswith("|fp16|h100")}
    layers = planned(argparse.Namespace(shapes=str(SHAPES_FILE), models="resnet18", batches="",
                                        precisions="fp16"))
    assert [r["key"] for r in doc["rows"]] == \
        [task_key(g.shape, Precision.FP16, H100) for g in layers]
    for row in doc["rows"]:
        shape = ConvShape.from_dict(row["shape"])
        space = ScheduleSpace(shape, Precision.FP16, H100)
        assert row["record"] == records[row["key"]]["schedule"]
        assert 0 < len(row["candidates"]) <= 3
        for s in row["candidates"]:
            h = schedule_hash(s)
            assert h != schedule_hash(row["record"]) and space.is_valid(s) and h in fp16_bests


def test_variants_set_a_knob_and_vary_others_nearest_first(tmp_path: Path) -> None:
    out = tmp_path / "v.json"
    assert zoo_transfer.main(["variants", "--records", str(RECORDS), "--out", str(out),
                              "--models", "resnet50", "--batches", "8", "--precisions", "int8",
                              "--set", "PINGPONG=1", "--set", "TMA=2", "--vary", "PERSIST",
                              "--vary", "STAGES", "--limit", "4", "--min-waves", "2"]) == 0
    doc = json.loads(out.read_text())
    records = json.loads(RECORDS.read_text())
    assert doc["rows"] and doc["set"] == {"PINGPONG": 1, "TMA": 2}
    for row in doc["rows"]:
        shape = ConvShape.from_dict(row["shape"])
        space = ScheduleSpace(shape, Precision.INT8, H100)
        record = records[row["key"]]["schedule"]
        assert row["record"] == record
        # only layers whose record's tiles fill two waves of the H100's 132 SMs
        g = space.geometry(np.array([space.index_of(record)]))
        bm, bn = int(g.block_m[0]), int(g.block_n[0])
        assert -(-shape.gemm_m // bm) * -(-shape.gemm_n // bn) >= 2 * 132
        changed = []
        for s in row["candidates"]:
            assert space.is_valid(s) and s["PINGPONG"] == 1 and s["TMA"] == 2
            assert {k for k in s if s[k] != record.get(k, 0)} <= {"PINGPONG", "TMA", "PERSIST",
                                                                  "STAGES"}
            changed.append(sum(s[k] != record.get(k, 0) for k in s))
        assert len(row["candidates"]) <= 4 and changed == sorted(changed)


def _run(tmp_path: Path, name: str, rows: list[tuple[str, list[float | None]]],
         records: dict) -> Path:
    """A run file: per layer key, the record's time then each candidate's (None: failed)."""
    doc = {"gpu": "test", "date": "2026-01-01", "rows": []}
    for key, times in rows:
        own = records[key]["schedule"]
        others = [{**own, "STAGES": st} for st in (4, 6, 8)]
        doc["rows"].append({"key": key, "layer": key, "shape": {}, "precision": "fp16",
                            "times": [{"schedule": s, "status": "ok" if us else "error",
                                       "us": us}
                                      for s, us in zip([own, *others], times, strict=False)]})
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def test_merge_moves_a_record_only_past_the_margin(tmp_path: Path) -> None:
    records = json.loads(RECORDS.read_text())
    a, b, c = [k for k in records if k.endswith("|fp16|h100")][:3]
    first = _run(tmp_path, "r1.json", [(a, [10.0, 9.5, 12.0]),  # 5% faster: moves
                                       (b, [10.0, 9.95, None]),  # 0.5%: within the margin
                                       (c, [None, 5.0])], records)  # the record failed
    out = tmp_path / "rec.json"
    assert zoo_transfer.main(["merge", str(first), "--records", str(RECORDS),
                              "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert merged[a]["schedule"] == {**records[a]["schedule"], "STAGES": 4}
    assert merged[a]["latency_us"] == 9.5 and merged[a]["source"].startswith("r1.json")
    assert merged[b] == records[b] and merged[c] == records[c]
    assert {k: v for k, v in merged.items() if k != a} == \
        {k: v for k, v in records.items() if k != a}
    # A later run made from the merged records moves it on; one from the old records (its
    # own schedule no longer the record's) does not.
    second = _run(tmp_path, "r2.json", [(a, [9.0, 10.0, 10.0, 8.0])], merged)
    stale = _run(tmp_path, "r0.json", [(a, [10.0, 1.0])], records)
    assert zoo_transfer.main(["merge", str(first), str(stale), str(second),
                              "--records", str(RECORDS), "--out", str(out)]) == 0
    again = json.loads(out.read_text())
    assert again[a]["latency_us"] == 8.0 and again[a]["source"].startswith("r2.json")
    # the table: one line per precision, counted over the layers whose record ran
    table = zoo_transfer.render(json.loads(first.read_text()))
    assert "| fp16 | 2 | 2 | " in table


def test_sample_draws_the_subspace_and_variants_of_the_record_on_another_gpu(
        tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    assert zoo_transfer.main(["sample", "--records", str(RECORDS), "--records-target", "h100",
                              "--target", "h200", "--out", str(out), "--models", "resnet50",
                              "--batches", "8", "--precisions", "int8", "--restrict", "HALO=1",
                              "--restrict", "TMA=1,2", "--count", "5", "--derive", "3",
                              "--vary", "CHUNK", "--vary", "STAGES", "--min-width", "28"]) == 0
    doc = json.loads(out.read_text())
    records = json.loads(RECORDS.read_text())
    h200 = get_target("h200")
    # the H100's records, keyed and timed as the H200's; only stride-1 layers >= 28 wide
    assert doc["target"] == "h200" and len(doc["rows"]) == 2
    for row in doc["rows"]:
        assert row["key"].endswith("|int8|h200")
        assert row["record"] == records[row["key"].removesuffix("h200") + "h100"]["schedule"]
        space = ScheduleSpace(ConvShape.from_dict(row["shape"]), Precision.INT8, h200)
        assert 5 <= len(row["candidates"]) <= 8
        for s in row["candidates"]:
            assert space.is_valid(s) and s["HALO"] == 1 and s["TMA"] in (1, 2)
        record = with_defaults(Precision.INT8, row["record"])
        assert row["derived"] <= 3
        for s in row["candidates"][:row["derived"]]:  # HALO set, CHUNK and STAGES varied
            assert {k for k in s if s[k] != record[k]} <= {"HALO", "CHUNK", "STAGES"}


def test_sample_keeps_the_layers_of_the_output_channel_counts_asked(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    assert zoo_transfer.main(["sample", "--records", str(RECORDS), "--records-target", "h100",
                              "--target", "h200", "--out", str(out), "--models", "resnet50",
                              "--batches", "8", "--precisions", "int8", "--restrict",
                              "SWAP_AB=1", "--count", "2", "--out-channels", "64,128"]) == 0
    ks = sorted(ConvShape.from_dict(r["shape"]).k for r in json.loads(out.read_text())["rows"])
    # ResNet-50's distinct layers of 64 output channels (the stem and three more) and of 128
    assert ks == [64] * 4 + [128] * 4


def test_neighbours_change_one_knob_of_a_runs_fastest(tmp_path: Path) -> None:
    records = json.loads(RECORDS.read_text())
    key = next(k for k in records if k.startswith("n8_h28_w28_c128_k128_r3_s3") and "|int8|" in k)
    rec = records[key]["schedule"]
    fast = {**rec, "STAGES": 4}
    run = {"gpu": "test", "date": "2026-01-01", "records": str(RECORDS), "rows": [
        {"key": key, "layer": "l", "shape": ConvShape.from_key(key.split("|")[0]).to_dict(),
         "precision": "int8", "times": [{"schedule": rec, "status": "ok", "us": 10.0},
                                        {"schedule": fast, "status": "ok", "us": 9.0}]}]}
    (tmp_path / "run.json").write_text(json.dumps(run))
    out = tmp_path / "n.json"
    assert zoo_transfer.main(["neighbours", str(tmp_path / "run.json"), "--out", str(out),
                              "--top", "1", "--limit", "6", "--keep", "MMA",
                              "--keep", "TMA"]) == 0
    row = json.loads(out.read_text())["rows"][0]
    space = ScheduleSpace(ConvShape.from_dict(row["shape"]), Precision.INT8, H100)
    fast = with_defaults(Precision.INT8, fast)
    assert row["candidates"][0] == fast and 1 < len(row["candidates"]) <= 7
    for s in row["candidates"][1:]:
        changed = {k for k in s if s[k] != fast[k]}
        assert len(changed) == 1 and not changed & {"MMA", "TMA"} and space.is_valid(s)
