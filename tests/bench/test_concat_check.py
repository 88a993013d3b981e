"""bench/concat_check.py without a GPU: its plan holds only schedules the layers over two
inputs can run, `run` turns the measuring child's answers into rows (a wrong candidate is a
failed run), and `records` keeps each layer's fastest right one under its task key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import concat_check
from kernels.space import concat_problems
from kernels.spec import ConvShape, Precision, get_target, task_key


def test_the_plan_holds_schedules_of_two_inputs_only() -> None:
    items = concat_check.plan(seed=1, checks=12, tune=2, records={})
    checks = [it for it in items if it["kind"] == "check"]
    tunes = [it for it in items if it["kind"] == "tune"]
    assert len(checks) == 12 and len(tunes) == 2 * 4 * 2
    for it in items:
        shape = ConvShape.from_dict(it["shape"])
        assert shape.concat > 0
        assert concat_problems(shape, Precision(it["precision"]), 90, it["schedule"]) is None


def test_the_plan_searches_the_batches_asked_for_seeded_by_their_records() -> None:
    records = json.loads(Path("bench/data/model_e2e_records_h100.json").read_text())
    items = concat_check.plan(seed=2, checks=0, tune=1, records=records, batches=(1, 32))
    assert {it["shape"]["n"] for it in items} == {1, 32}
    assert all(it["kind"] == "tune" for it in items)
    # each (batch, layer, precision) has its two layers' records made valid, and one random
    target = get_target("h100")
    for n in (1, 32):
        for name, shape in concat_check.resnet50_shapes(n):
            for p in (Precision.INT8, Precision.FP16):
                mine = [it for it in items if it["layer"] == name and it["shape"]["n"] == n
                        and it["precision"] == p.value]
                parts = [records[task_key(part, p, target)]["schedule"]
                         for part in shape.concat_parts()]
                assert len(mine) > 1 + 1 and any(
                    it["schedule"]["CHUNK"] == part["CHUNK"] and
                    it["schedule"]["WARP_COL_TILES"] == part["WARP_COL_TILES"]
                    for it in mine for part in parts)


def test_the_plan_for_another_target_reads_its_records_and_builds_for_it() -> None:
    records = json.loads(Path("bench/data/zoo_records_h200.json").read_text())
    items = concat_check.plan(seed=3, checks=0, tune=1, records=records, target="h200")
    h200 = get_target("h200")
    assert {it["target"] for it in items} == {"h200"}
    assert {concat_check._job(it).sm for it in items} == {h200.sm}
    # seeded by the H200 records of the two layers: more than the one random schedule each
    for name, shape in concat_check.resnet50_shapes(8):
        for p in (Precision.INT8, Precision.FP16):
            mine = [it for it in items if it["layer"] == name and it["precision"] == p.value]
            assert all(task_key(part, p, h200) in records for part in shape.concat_parts())
            assert len(mine) > 1
    assert not concat_check.plan(seed=3, checks=0, tune=0, records=records, target="h100")


class FakeRunner:
    """The measuring child's answers by build key: "slow" and "fast" tune candidates, a
    "wrong" one."""

    gpu_name = "NVIDIA H100 80GB HBM3"
    calls: list[tuple[str, int | None, bool]] = []

    def measure(self, cache: str, key: str, *, seed: int | None = None,
                time_it: bool = True) -> dict[str, Any]:
        self.calls.append((key, seed, time_it))
        if key == "wrong":
            return {"status": "wrong", "median_us": None, "iqr_us": None,
                    "detail": {"check": {"mismatches": 3, "elements": 10}}}
        us = {"slow": 9.0, "fast": 7.0}.get(key)
        return {"status": "ok", "median_us": us if time_it else None,
                "iqr_us": 0.1 if time_it else None,
                "detail": {"check": {"mismatches": 0, "elements": 10}}}

    def close(self) -> None:
        pass


def test_run_rows_and_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kernels.runner

    monkeypatch.setattr(kernels.runner, "Runner", FakeRunner)
    shape = concat_check.resnet50_shapes()[1][1]
    base = {"shape": shape.to_dict(), "precision": "int8", "relu": True, "schedule": {}}
    items = [{**base, "kind": "check", "build": "ok", "key": "ok"},
             {**base, "kind": "tune", "layer": "layer2", "build": "ok", "key": "slow"},
             {**base, "kind": "tune", "layer": "layer2", "build": "ok", "key": "fast",
              "schedule": {"CHUNK": 2}},
             {**base, "kind": "check", "build": "compile_error", "key": "x"},
             {**base, "kind": "check", "build": "ok", "key": "wrong"}]
    (tmp_path / "concat_plan.json").write_text(json.dumps(items))
    out = tmp_path / "run.json"
    assert concat_check.main(["run", "--cache", str(tmp_path), "--out", str(out)]) == 1
    rows = json.loads(out.read_text())["rows"]
    assert [(r["ok"], r["status"]) for r in rows] == [
        (True, "ok"), (True, "ok"), (True, "ok"), (False, "compile_error"), (False, "wrong")]
    assert "us" not in rows[0] and rows[1]["us"] == 9.0 and rows[2]["mismatches"] == 0.0
    assert rows[4]["mismatches"] == 3.0 and "us" not in rows[4]
    # checks are not timed; every candidate gets its own inputs; nothing unbuilt is measured
    assert [(c[1], c[2]) for c in FakeRunner.calls] == [
        (100, False), (101, True), (102, True), (104, False)]

    recs = tmp_path / "records.json"
    assert concat_check.main(["records", str(out), "--out", str(recs)]) == 0
    got = json.loads(recs.read_text())
    key = task_key(shape, Precision.INT8, get_target("h100"))
    assert list(got) == [key] and key.startswith(shape.key())
    assert got[key]["latency_us"] == 7.0 and got[key]["schedule"] == {"CHUNK": 2}
