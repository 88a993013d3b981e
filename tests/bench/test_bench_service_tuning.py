"""bench/service_tuning.py on a CPU: a model's jobs from the service's plan output, one row
per task (layers of one shape share it), each against the zoo's best of its layer."""

from __future__ import annotations

import json
from pathlib import Path

from bench import service_tuning

KEY = "n8_h56_w56_c64_k256_r1_s1_st1x1_p0x0_d1x1"
SHAPE = {"n": 8, "h": 56, "w": 56, "c": 64, "k": 256, "r": 1, "s": 1, "stride": [1, 1],
         "pad": [0, 0], "dilation": [1, 1]}


def test_summary_has_one_row_per_task_against_the_zoo_best(tmp_path: Path) -> None:
    zoo = tmp_path / "zoo.json"
    zoo.write_text(json.dumps({"rows": [{"shape": SHAPE, "precision": "int8", "ours_us": 8.0},
                                        {"shape": SHAPE, "precision": "fp16", "ours_us": 9.0}]}))
    (tmp_path / "tuning.json").write_text(json.dumps({
        "model": "m", "trials": 32, "input_shape": "8,3,224,224", "tuning_wall_s": 159.0,
        "gpu": "g"}))
    for p, us in (("int8", 10.0), ("fp16", 9.0)):
        res = {"task_key": f"{KEY}|{p}|h100", "latency_us": us, "baseline_us": 8.0,
               "speedup": 8.0 / us}
        (tmp_path / f"plan_{p}.json").write_text(json.dumps({"results": [
            {"name": "a", **res}, {"name": "b", **res}]}))  # two layers, one task
    doc = service_tuning.summarize(tmp_path, zoo)
    assert doc["jobs"] == 2 and doc["tuning_wall_s"] == 159.0
    by = {r["precision"]: r for r in doc["rows"]}
    assert by["int8"]["vs_zoo"] == 10.0 / 8.0 and by["fp16"]["vs_zoo"] == 1.0
    (tmp_path / "s.json").write_text(json.dumps(doc))
    table = service_tuning.render(str(tmp_path / "s.json"))
    assert "2 jobs tuned in 159 s" in table
    assert "| int8 | 1 | 0.80x | 0 | 1.25x | 1.25x | 0 |" in table
    assert "| fp16 | 1 | 0.89x | 0 | 1.00x | 1.00x | 1 |" in table
