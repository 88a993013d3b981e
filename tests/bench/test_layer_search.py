"""bench/layer_search.py on the simulated backend: the service's first round and strategy,
per-task best-so-far curves, and a stopped run that continues as if never stopped."""

from __future__ import annotations

import json
from pathlib import Path

from bench.layer_search import by_miss, by_total_time, curve, pair_groups, run, unsearched
from bench.zoo import load_shapes, plan
from bench.zoo_transfer import records_prior
from kernels.runtime import default_schedule
from kernels.space import ScheduleSpace, schedule_hash
from kernels.spec import Precision, get_target
from search.strategy import History
from workers.backends.base import TaskSpec
from workers.backends.simulated import SimulatedBackend
from workers.seeds import TRANSFER_SEEDS, start_points

RECORDS = Path(__file__).resolve().parents[2] / "bench" / "data" / "model_e2e_records_h100.json"


def _groups() -> list:
    return plan(load_shapes(), ["resnet18"], [8], ["int8"])[1:3]


def _run(tmp: Path, name: str, trials: int, doc: dict | None = None,
         priors: dict | None = None) -> dict:
    out = tmp / name
    backend = SimulatedBackend(get_target("h100"))
    left = run(_groups(), doc if doc is not None else {}, out, backend, str(tmp / "cache"),
               trials=trials, round_size=16, parallel=2, seed=3, strategy="diversity",
               priors=priors)
    assert left == 0
    return json.loads(out.read_text())


def test_a_stopped_search_continues_as_an_uninterrupted_one(tmp_path: Path) -> None:
    whole = _run(tmp_path, "whole.json", 48)
    part = _run(tmp_path, "part.json", 32)
    resumed = _run(tmp_path, "part.json", 48, doc=part)
    assert len(whole["rows"]) == 2
    for a, b in zip(whole["rows"], resumed["rows"], strict=True):
        assert a["key"] == b["key"]
        assert [t["schedule"] for t in a["trials"]] == [t["schedule"] for t in b["trials"]]
        assert len(a["trials"]) == 48
        assert len({json.dumps(t["schedule"], sort_keys=True) for t in a["trials"]}) == 48
        assert set(a["curve"]) == {"16", "32"}
        assert a["best_us"] == min(t["median_us"] for t in a["trials"] if t["status"] == "ok")
        assert a["cudnn_fp16_us"] > 0


def test_the_first_trial_is_the_runtimes_default(tmp_path: Path) -> None:
    doc = _run(tmp_path, "d.json", 16)
    for g, row in zip(_groups(), doc["rows"], strict=True):
        default, _ = default_schedule(g.shape, g.precision, get_target("h100"))
        assert row["trials"][0]["schedule"] == {**row["trials"][0]["schedule"], **default}


def test_curve_is_the_best_so_far() -> None:
    ts = [{"status": "ok", "median_us": v} for v in (5.0, 7.0)] + \
         [{"status": "wrong", "median_us": None}] * 14 + [{"status": "ok", "median_us": 3.0}] * 20
    assert curve(ts) == {"16": 5.0, "32": 3.0}
    assert curve([{"status": "wrong", "median_us": None}] * 16) == {"16": None}


def test_tasks_are_ordered_by_their_share_of_the_model() -> None:
    gs = plan(load_shapes(), ["resnet50"], [8], ["int8"])
    zoo = {g.key: 1.0 for g in gs}
    heavy = gs[5]
    zoo[heavy.key] = 100.0
    assert by_total_time(gs, zoo)[0] is heavy


def test_pixel_pairs_are_the_stems_pair_layers_with_their_uses() -> None:
    """--pixel-pairs: the layers deploy would run over pixel pairs, as those pair layers
    (ResNet's 7x7/2 stem and MobileNet's 3x3/2 one), their uses kept."""
    gs = plan(load_shapes(), ["resnet50", "mobilenet_v2"], [8], ["int8", "fp16"])
    pairs = pair_groups(gs)
    assert sorted({(g.shape.key(), g.precision) for g in pairs}) == [
        ("n8_h224_w113_c8_k32_r3_s2_st2x1_p1x0_d1x1", "fp16"),
        ("n8_h224_w113_c8_k32_r3_s2_st2x1_p1x0_d1x1", "int8"),
        ("n8_h224_w113_c8_k64_r7_s4_st2x1_p3x1_d1x1", "fp16"),
        ("n8_h224_w113_c8_k64_r7_s4_st2x1_p3x1_d1x1", "int8")]
    stem = next(g for g in pairs if g.shape.k == 64)
    assert [(u.model, u.layers) for u in stem.uses] == [("resnet50", ("conv1",))]


def test_misses_are_the_layers_over_their_goal_furthest_first() -> None:
    """--misses: int8 over 0.7x and fp16 over 1.0x of cuDNN fp16, by how far over."""
    gs = plan(load_shapes(), ["resnet18"], [8], ["int8", "fp16"])

    def row(g, ratio: float) -> dict:
        return {"shape": g.shape.to_dict(), "precision": g.precision, "ours_us": ratio * 10,
                "cudnn_fp16_us": 10.0}
    i8 = [g for g in gs if g.precision == "int8"]
    f16 = [g for g in gs if g.precision == "fp16"]
    retimed = {"rows": [row(i8[0], 0.69), row(i8[1], 0.77), row(f16[0], 1.05),
                        row(f16[1], 0.99), {**row(f16[2], 2.0), "ours_us": None}]}
    assert by_miss(gs, retimed) == [i8[1], f16[0]]  # 1.1x its goal, then 1.05x


def test_skip_leaves_out_the_tasks_earlier_runs_searched(tmp_path: Path) -> None:
    """--skip: a (layer, precision) an earlier run's file holds is not searched again; the same
    layer in the other precision is."""
    gs = plan(load_shapes(), ["resnet18"], [8], ["int8", "fp16"])
    earlier = _run(tmp_path, "earlier.json", 16)  # two int8 layers
    left = unsearched(gs, [earlier])
    assert len(left) == len(gs) - 2
    searched = {r["key"] for r in earlier["rows"]}
    assert not searched & {g.key for g in left}
    assert {f"{k.split('|')[0]}|fp16" for k in searched} <= {g.key for g in left}
    assert unsearched(gs, []) == gs


def test_render_summarizes_each_mark_against_the_final_best() -> None:
    from bench.layer_search import render

    shape = _groups()[0].shape.to_dict()
    row = {"layers": ["resnet18 a"], "count": 1, "shape": shape, "precision": "int8",
           "trials": [{}] * 500, "wrong": 0,
           "curve": {"16": 2.0, "32": 1.5, "64": 1.04, "128": 1.0, "256": 1.0, "500": 1.0}}
    text = render({"gpu": "g", "strategy": "diversity", "round": 32, "date": "d",
                   "rows": [row, {**row, "curve": {**row["curve"], "16": 8.0}},
                            {**row, "curve": {"16": 3.0}, "trials": [{}] * 16}]})
    assert "| 16 | 4.000x | 8.00x | 0/2 |" in text
    assert "| 64 | 1.040x | 1.04x | 2/2 |" in text
    assert "Over the 2 tasks searched to 500 trials" in text


def test_a_prior_seeds_each_round_with_the_nearest_records(tmp_path: Path) -> None:
    """--prior: the records' nearest other layers' bests follow the default in round one."""
    records = json.loads(RECORDS.read_text())
    prior = records_prior(records, "int8", "h100")
    doc = _run(tmp_path, "p.json", 16, priors={"int8": prior})
    for g, row in zip(_groups(), doc["rows"], strict=True):
        spec = TaskSpec(g.shape, Precision.INT8, get_target("h100"))
        space = ScheduleSpace(g.shape, Precision.INT8, get_target("h100"))
        seeds = start_points(spec, space, History(prior=prior))
        assert len(seeds) > TRANSFER_SEEDS // 2  # the default and its neighbours' bests
        got = [schedule_hash(t["schedule"]) for t in row["trials"][:len(seeds)]]
        assert got == [schedule_hash(space.schedule_at(i)) for i in seeds]
