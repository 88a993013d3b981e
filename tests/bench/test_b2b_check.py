"""bench/gpu/b2b_check.py on a CPU: its choice of schedules (random members of the space of
the layer with its back-to-back conv, half of them wgmma where there are enough, or of one
path), its table and fit, and the records it writes for deploy."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.gpu.b2b_check import (
    PAIRS,
    _b2b_schedules,
    _near_schedules,
    _overhead_fit,
    main,
    table,
)
from kernels.build import BuildJob, defines
from kernels.space import geometry
from kernels.spec import Precision, get_target, task_key


def test_the_check_samples_schedules_that_run_the_pair() -> None:
    rng = np.random.default_rng(0)
    for _, shape, b2b in PAIRS[:2]:
        picked = _b2b_schedules(shape, Precision.INT8, b2b, 6, rng)
        assert [s["MMA"] for s in picked].count("wgmma") == 3 and len(picked) == 6
        for s in picked:  # each builds with the pair's region (defines raises where not)
            assert defines(BuildJob(replace(shape, b2b=b2b), Precision.INT8, 90, s))["TC_B2B"]
    # layer 2's fp16 pair: only with the second weights copied in after the main loop, into
    # the pipeline's dead region (both weight matrices at once do not fit)
    for s in _b2b_schedules(PAIRS[2][1], Precision.FP16, PAIRS[2][2], 6, rng):
        d = defines(BuildJob(replace(PAIRS[2][1], b2b=PAIRS[2][2]), Precision.FP16, 90, s))
        assert d["TC_B2B_AHEAD"] == 0


def test_the_neighbourhood_of_the_record_is_nearest_first() -> None:
    """`--near`: valid schedules of the b2b layer's space ordered by knobs apart from the
    layer's record (here one that is itself valid, so it comes first)."""
    _, shape, b2b = PAIRS[0]
    rng = np.random.default_rng(0)
    seed = _b2b_schedules(shape, Precision.INT8, b2b, 1, rng)[0]
    near = _near_schedules(shape, Precision.INT8, b2b, seed, 12, rng)
    assert near[0] == seed and len(near) == 12
    apart = [sum(s[k] != v for k, v in seed.items()) for s in near]
    assert apart == sorted(apart) and apart[1] >= 1


def test_the_table_compares_the_fastest_b2b_with_the_two_layers() -> None:
    row = {"pair": "p", "precision": "int8", "first_us": 8.0, "second_us": 4.0}
    doc = {"rows": [
        {**row, "b2b": {"ok": True}, "b2b_us": 11.0, "twin_us": 9.0, "ptx80": {"ok": False}},
        {**row, "b2b": {"ok": True}, "b2b_us": 9.0, "near": True},
        {**row, "b2b": {"ok": False}}]}
    last = table(doc).splitlines()[-1]
    # near builds are timed, not counted as checks; 9.0 / (8 + 4)
    assert last == "| p | int8 | 1 / 3 | 9.00 | 9.00 | 12.00 (8.00 + 4.00) | 0.75 |"


def test_the_overhead_fit_recovers_a_linear_cost_of_weight_reads() -> None:
    """`table`'s fit: (b2b - twin) µs against the MB of second weights the grid reads; a
    persistent grid (kernels.launch.launch_dims: PERSIST blocks an SM) reads them once a
    block."""
    name, shape, b2b = PAIRS[0]
    rows = []
    sms = get_target("h200").sms
    picked = _b2b_schedules(shape, Precision.INT8, b2b, 16, np.random.default_rng(3))
    assert any(s["PERSIST"] for s in picked)
    for s in picked:
        g = geometry(shape, Precision.INT8, get_target("h200"),
                     {k: np.array([v]) for k, v in s.items()}, residual=True, b2b=b2b)
        blocks = min(int(g.grid_blocks[0]), s["PERSIST"] * sms) if s["PERSIST"] else \
            int(g.grid_blocks[0])
        mb = blocks * b2b * shape.k / 1e6
        rows.append({"pair": name, "precision": "int8", "schedule": s, "twin_us": 10.0,
                     "b2b_us": 10.0 + 2.0 + 0.25 * mb})
    slope, icept, r, n = _overhead_fit(rows)
    assert (round(slope, 6), round(icept, 6), n) == (0.25, 2.0, 16) and r > 0.999


def test_one_path_only() -> None:
    """`--mma`: schedules of that path only, random or near the record."""
    _, shape, b2b = PAIRS[0]
    rng = np.random.default_rng(1)
    picked = _b2b_schedules(shape, Precision.INT8, b2b, 40, rng, "wgmma")
    assert {s["MMA"] for s in picked} == {"wgmma"} and len(picked) == 40
    near = _near_schedules(shape, Precision.INT8, b2b, picked[0], 8, rng, "sync")
    assert {s["MMA"] for s in near} == {"sync"} and len(near) == 8


def test_records_take_a_pair_only_where_it_beats_its_two_layers(tmp_path: Path) -> None:
    """`records`: the fastest right build of a pair and precision becomes the b2b layer's
    record, its baseline the two layers timed in the same run, only where it is faster."""
    (name, shape, b2b), (name2, shape2, b2b2) = PAIRS[0], PAIRS[1]
    base = {"other": {"latency_us": 1.0}}
    (tmp_path / "base.json").write_text(json.dumps(base))
    two = {"first_us": 8.0, "second_us": 4.0}
    rows = [
        {"pair": name, "precision": "int8", "schedule": {"A": 1}, "b2b": {"ok": True},
         "b2b_us": 11.0, **two},
        {"pair": name, "precision": "int8", "schedule": {"A": 2}, "b2b": {"ok": True},
         "b2b_us": 10.0, **two},
        {"pair": name, "precision": "int8", "schedule": {"A": 3}, "b2b": {"ok": False},
         "b2b_us": 5.0, **two},  # wrong: never a record
        {"pair": name, "precision": "fp16", "schedule": {"A": 4}, "b2b": {"ok": True},
         "b2b_us": 12.5, **two},  # slower than its two layers
        {"pair": name2, "precision": "int8", "schedule": {"A": 5}, "b2b": {"ok": True},
         "b2b_us": 11.5, "first_us": 8.0, "second_us": None},  # no two layers to beat
    ]
    (tmp_path / "run.json").write_text(json.dumps({"rows": rows}))
    out = tmp_path / "out.json"
    assert main(["records", str(tmp_path / "run.json"), "--base", str(tmp_path / "base.json"),
                 "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    key = task_key(replace(shape, b2b=b2b), Precision.INT8, get_target("h200"))
    assert set(got) == {"other", key}
    assert got[key]["schedule"] == {"A": 2} and got[key]["latency_us"] == 10.0
    assert got[key]["baseline_us"] == 12.0 and got[key]["speedup"] == 1.2
    assert task_key(replace(shape2, b2b=b2b2), Precision.INT8, get_target("h200")) not in got
