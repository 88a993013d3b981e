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


def _retime(records: str, times: dict[tuple[str, str], float | None]) -> dict:
    """A `bench.retime run` document: one row per (layer, precision); None: a failed run."""
    shapes = {"a": {"n": 8, "h": 56, "w": 56, "c": 64, "k": 256, "r": 1, "s": 1},
              "b": {"n": 8, "h": 14, "w": 14, "c": 256, "k": 256, "r": 3, "s": 3,
                    "pad": [1, 1]}}
    return {"gpu": "g", "date": "d", "records": records, "rows": [
        {"layer": layer, "shape": shapes[layer], "precision": p, "ours_us": us,
         "status": "ok" if us else "no record"} for (layer, p), us in times.items()]}


def test_versus_takes_each_layer_over_its_fastest_reference() -> None:
    from bench.service_tuning import render_versus, versus

    service = [_retime("S", {("a", "int8"): 7.0, ("b", "int8"): 5.0, ("b", "fp16"): 8.0,
                             ("a", "fp16"): 3.0}),
               _retime("S", {("a", "int8"): 7.2, ("b", "int8"): 5.2, ("b", "fp16"): 8.2})]
    search = [_retime("L", {("a", "int8"): 6.0, ("b", "int8"): None, ("b", "fp16"): 9.0})]
    known = [_retime("K", {("a", "int8"): 6.9, ("b", "int8"): 5.0, ("b", "fp16"): 8.0}),
             _retime("K", {("a", "int8"): 7.1, ("b", "int8"): 5.0, ("b", "fp16"): 8.0})]
    doc = versus(service, [search, known])
    by = {(r["layer"], r["precision"]): r for r in doc["rows"]}
    assert ("a", "fp16") not in by  # no reference timed it
    # a: the search's 6.0 beats the records' mean 7.0; the service's mean is 7.1
    assert by["a", "int8"]["vs_best"] == pytest.approx(7.1 / 6.0, abs=1e-4)
    assert by["a", "int8"]["best_from"] == "L"
    # b int8: the search failed to run it, so the records' 5.0 is the reference
    assert by["b", "int8"]["vs_best"] == pytest.approx(5.1 / 5.0, abs=1e-4)
    assert by["b", "fp16"]["best_from"] == "K"
    text = render_versus(doc)
    assert "| int8 | 2 | " in text and "Past 5%: a int8 1.183x" in text


def test_records_carry_the_service_schedules() -> None:
    from bench.service_tuning import records

    sched = {"MMA": "wgmma", "STAGES": 4}
    doc = {"trials": 48, "rows": [
        {"layer": "a", "task_key": "K1|int8|h200", "schedule": sched, "latency_us": 7.0},
        {"layer": "b", "task_key": "K2|int8|h200", "schedule": None, "latency_us": None},
        {"layer": "c", "task_key": "K3|fp16|h200", "schedule": sched, "latency_us": 9.0,
         "baseline_us": 8.0}]}
    recs = records(doc)
    assert recs["K1|int8|h200"] == {"schedule": sched, "latency_us": 7.0,
                                    "source": "service, 48 trials: a"}
    assert "K2|int8|h200" not in recs
    # the baseline goes with the record, so deploy keeps cuDNN where the kernel lost to it
    from deploy.plan import record_from_dict

    assert recs["K3|fp16|h200"]["baseline_us"] == 8.0
    assert record_from_dict(recs["K3|fp16|h200"], "R").slower_than_baseline()
