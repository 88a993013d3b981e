"""bench/service_tuning.py attach: each layer's service result against a long search of the
layer alone on the same GPU model, latency against latency."""

from __future__ import annotations

import pytest

from bench.service_tuning import attach, render


def test_attach_compares_latencies(tmp_path) -> None:
    doc = {"model": "m", "trials": 32, "input_shape": "8,3,224,224", "tuning_wall_s": 100,
           "gpu": "g", "jobs": 3, "rows": [
               {"layer": "a", "task_key": "S1|int8|h100", "precision": "int8",
                "latency_us": 6.0, "baseline_us": 10.0, "speedup": 10 / 6, "zoo_us": 5.0,
                "vs_zoo": 1.2},
               {"layer": "b", "task_key": "S2|fp16|h100", "precision": "fp16",
                "latency_us": None, "baseline_us": None, "speedup": None, "zoo_us": 9.0,
                "vs_zoo": 1.0},
               {"layer": "c", "task_key": "S3|fp16|h100", "precision": "fp16",
                "latency_us": 9.0, "baseline_us": 10.0, "speedup": 10 / 9, "zoo_us": 9.0,
                "vs_zoo": 1.0}]}
    search = {"gpu": "g2", "date": "d", "strategy": "diversity", "rows": [
        {"key": "S1|int8", "best_us": 4.4, "cudnn_fp16_us": 11.0, "trials": [{}] * 500},
        {"key": "S2|fp16", "best_us": 8.0, "cudnn_fp16_us": 10.0, "trials": [{}] * 500},
        {"key": "S1|fp16", "best_us": 1.0, "cudnn_fp16_us": 10.0, "trials": [{}] * 500}]}
    out = attach(doc, search)
    a, b, c = out["rows"]
    assert a["vs_500_trials"] == pytest.approx(6.0 / 4.4, abs=1e-4)
    assert a["search_trials"] == 500 and a["search_us"] == 4.4
    assert "vs_500_trials" not in b and b["search_us"] == 8.0  # no latency of its own
    assert "search_us" not in c  # the search did not cover it
    path = tmp_path / "s.json"
    import json

    path.write_text(json.dumps(out))
    text = render(str(path))
    assert "| a | int8 | 6.00 | 500 | 4.40 | 1.36x |" in text
    assert "1 layers: geomean 1.36x, worst 1.36x, 0 within 5%." in text
