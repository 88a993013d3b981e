"""bench/gpu/measure_path.py's order: a whole model's candidates as they reach one GPU, one
schedule of each (layer, precision) in turn."""

from __future__ import annotations

import json
from pathlib import Path

from bench.gpu.measure_path import interleaved


def test_interleaved_takes_one_schedule_of_each_layer_in_turn(tmp_path: Path) -> None:
    layers = [({"n": 8, "h": 7}, "int8"), ({"n": 8, "h": 7}, "fp16"), ({"n": 8, "h": 14}, "int8")]
    keys = []
    for i, (shape, precision) in enumerate(layers):
        for j in range(3 - i):  # 3, 2 and 1 schedules
            key = f"k{i}{j}"
            (tmp_path / f"{key}.json").write_text(json.dumps({"shape": shape,
                                                              "precision": precision}))
            keys.append(key)
    assert interleaved(str(tmp_path), keys) == ["k00", "k10", "k20", "k01", "k11", "k02"]
