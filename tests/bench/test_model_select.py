"""bench/model_select.py on the CPU: the candidates file (the fastest right schedules per task
key, from search and concat files) and the prebuild of every candidate a model's records
could take."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bench import model_select
from kernels.spec import ConvShape, Precision, get_target, task_key

SHAPE = ConvShape(8, 14, 14, 64, 64, 1, 1)
CAT = ConvShape(8, 14, 14, 96, 64, 1, 1, stride=(2, 2), concat=32)


def sched(i: int) -> dict[str, int]:
    return {"BLK_ROW_WARPS": 1, "STAGES": i}


def test_candidates_are_each_keys_fastest_right_schedules(tmp_path: Path) -> None:
    search = {"rows": [{"shape": SHAPE.to_dict(), "precision": "int8", "trials": [
        {"schedule": sched(1), "status": "ok", "median_us": 5.0},
        {"schedule": sched(2), "status": "ok", "median_us": 4.0},
        {"schedule": sched(3), "status": "wrong", "median_us": 1.0},  # never a candidate
        {"schedule": sched(4), "status": "ok", "median_us": 6.0},
        {"schedule": sched(1), "status": "ok", "median_us": 4.5},  # again: its fastest
    ]}]}
    concat = {"rows": [
        {"kind": "tune", "shape": CAT.to_dict(), "precision": "fp16", "schedule": sched(2),
         "ok": True, "us": 7.0},
        {"kind": "tune", "shape": CAT.to_dict(), "precision": "fp16", "schedule": sched(3),
         "ok": False, "us": 3.0},
        {"kind": "check", "shape": CAT.to_dict(), "precision": "fp16", "schedule": sched(4),
         "ok": True},
    ]}
    (tmp_path / "s.json").write_text(json.dumps(search))
    with gzip.open(tmp_path / "c.json.gz", "wt") as f:
        json.dump(concat, f)
    out = tmp_path / "cands.json"
    assert model_select.main(["candidates", str(tmp_path / "s.json"),
                              str(tmp_path / "c.json.gz"), "--target", "h200", "--top", "2",
                              "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    h200 = get_target("h200")
    assert got == {
        task_key(SHAPE, Precision.INT8, h200): [{"schedule": sched(2), "latency_us": 4.0},
                                                {"schedule": sched(1), "latency_us": 4.5}],
        task_key(CAT, Precision.FP16, h200): [{"schedule": sched(2), "latency_us": 7.0}]}


@pytest.mark.parametrize("cmd", ["prebuild", "run"])
def test_the_model_commands_need_records_candidates_and_their_target(cmd: str) -> None:
    with pytest.raises(SystemExit):
        model_select.main([cmd, "--cache", "c", "--schedules", "r.json", "--candidates",
                           "c.json"])
