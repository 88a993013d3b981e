"""Replay datasets recorded before a knob existed: the knob is held at its first value.

The kernel space gains knobs over time (e.g. an `MMA` knob, "sync" = today's kernel, first);
a dataset recorded before names it neither in `fixed` nor in its rows. The knob table is
extended here with monkeypatch, so the test does not depend on kernels/ having the knob.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import kernels.space as kspace
from kernels.space import ScheduleSpace, knobs_for
from kernels.spec import RESNET50_3X3, TARGETS, Precision
from search.datasets import ReplaySpace, load_dataset, write_dataset
from search.features import columns_from_schedules, feature_names, space_features
from search.registry import make_strategy
from search.strategy import History

REPLAY = Path(__file__).resolve().parents[2] / "bench" / "data" / "replay"
NEW_KNOB = ("MMA", ("sync", "wgmma"))
FIXED = {"DUP_AWARE": 1, "PACK_OUT": 1, "LAYOUT": "nhwc", "STAGES": 2, "SPLIT_K": 1,
         "REORDER_INNER": 1}


@pytest.fixture
def mma_knob(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's knob table with one more enum knob (as the MMA change will add it)."""
    monkeypatch.setitem(kspace.EXTRA_KNOBS, NEW_KNOB[0], NEW_KNOB[1])
    assert knobs_for(Precision.INT8)[NEW_KNOB[0]] == NEW_KNOB[1]


def _record(path: Path, rows_schedules: list[dict], fixed: dict) -> None:
    rows = [{"schedule": s, "status": "ok", "median_us": 10.0 + j, "iqr_us": 0.1}
            for j, s in enumerate(rows_schedules)]
    meta = {"dataset": path.name.split(".")[0], "shape": RESNET50_3X3["stage4"].to_dict(),
            "precision": "int8", "target": "h100", "gpu": "test", "simulated": True,
            "fixed": fixed, "date": "2026-01-01"}
    write_dataset(path, meta, rows)


def _old_schedules() -> list[dict]:
    """Schedules of the space before the new knob: what an older recording holds."""
    old = ScheduleSpace(RESNET50_3X3["stage4"], Precision.INT8, TARGETS["h100"],
                        restrict={k: [v] for k, v in FIXED.items()})
    return old.schedules(old.valid_indices[::3])


def test_a_knob_the_file_never_names_is_held_at_its_first_value(
        tmp_path: Path, mma_knob: None) -> None:
    scheds = _old_schedules()  # taken with the patched table: drop the new knob again
    scheds = [{k: v for k, v in s.items() if k != NEW_KNOB[0]} for s in scheds]
    path = tmp_path / "old.jsonl.gz"
    _record(path, scheds, FIXED)
    ds = load_dataset(path)
    assert ds.defaulted == {"MMA": "sync"}
    assert ds.space.knobs["MMA"] == ("sync",)
    assert len(ds.space.valid_indices) == len(scheds)
    # Every recorded schedule is found, as the kernel it ran as (MMA = sync).
    got = ds.space.schedules(ds.space.valid_indices)
    assert all(s["MMA"] == "sync" for s in got)
    def canon(s: dict) -> str:
        return str(sorted(s.items()))

    assert sorted(canon({**s, "MMA": "sync"}) for s in scheds) == sorted(map(canon, got))
    assert ds.best_us == 10.0
    # Strategies and features work on it: the one-hot columns of the held knob are constant.
    batch = make_strategy("diversity", ds.space, seed=0, iters=30, rounds=20).propose(
        History(trials=[ds.measure(int(i)) for i in ds.space.valid_indices[:40]]), 16)
    assert len(set(batch)) == 16 and set(batch) <= set(ds.space.valid_indices.tolist())
    X = space_features(ds.space, ds.space.valid_indices)
    names = feature_names(Precision.INT8)
    assert (X[:, names.index("MMA=sync")] == 1).all()
    assert (X[:, names.index("MMA=wgmma")] == 0).all()


def test_a_knob_the_file_varies_or_fixes_is_not_defaulted(tmp_path: Path,
                                                          mma_knob: None) -> None:
    base = [{k: v for k, v in s.items() if k != "MMA"} for s in _old_schedules()[:40]]
    varied = [{**s, "MMA": ("sync", "wgmma")[j % 2]} for j, s in enumerate(base)]
    _record(tmp_path / "varied.jsonl.gz", varied, FIXED)
    ds = load_dataset(tmp_path / "varied.jsonl.gz")
    assert ds.defaulted == {}
    assert ds.space.knobs["MMA"] == ("sync", "wgmma")
    assert {s["MMA"] for s in ds.space.schedules(ds.space.valid_indices)} == {"sync", "wgmma"}

    fixed = [{**s, "MMA": "wgmma"} for s in base]
    _record(tmp_path / "fixed.jsonl.gz", fixed, {**FIXED, "MMA": "wgmma"})
    ds = load_dataset(tmp_path / "fixed.jsonl.gz")
    assert ds.defaulted == {}
    assert ds.space.knobs["MMA"] == ("wgmma",)


def test_recorded_datasets_load_the_same_with_a_new_knob(mma_knob: None) -> None:
    path = REPLAY / "resnet50_stage4_n8_fp16_h200.jsonl.gz"
    with_knob = load_dataset(path)
    assert with_knob.defaulted["MMA"] == "sync"  # (and any later knob at its first value)
    # Same schedules and results as without the knob (undo the patch by hand to compare;
    # the table's order is restored too: it orders the space's knobs for later tests).
    table = dict(kspace.EXTRA_KNOBS)
    del kspace.EXTRA_KNOBS["MMA"]
    try:
        without = load_dataset(path)
    finally:
        kspace.EXTRA_KNOBS.clear()
        kspace.EXTRA_KNOBS.update(table)
    assert without.defaulted == {k: v for k, v in with_knob.defaulted.items() if k != "MMA"}
    assert len(with_knob.space.valid_indices) == len(without.space.valid_indices)
    assert with_knob.best_us == without.best_us
    np.testing.assert_array_equal(
        np.sort(with_knob.median_us[with_knob.space.valid_indices]),
        np.sort(without.median_us[without.space.valid_indices]))


def test_a_recorded_compile_error_the_rules_now_admit_is_left_out(tmp_path: Path) -> None:
    """A recording marks what its rules rejected as compile_error; where the rules widen
    (a schedule now valid), it is unknown, not a failed trial the replay could propose."""
    scheds = _old_schedules()[:6]
    rows = [{"schedule": s, "status": "ok", "median_us": 10.0 + j, "iqr_us": 0.1}
            for j, s in enumerate(scheds[:4])]
    rows += [{"schedule": s, "status": st, "median_us": None, "iqr_us": None}
             for s, st in zip(scheds[4:], ("compile_error", "runtime_error"), strict=True)]
    meta = {"dataset": "widened", "shape": RESNET50_3X3["stage4"].to_dict(),
            "precision": "int8", "target": "h100", "gpu": "test", "simulated": True,
            "fixed": FIXED, "date": "2026-01-01"}
    write_dataset(tmp_path / "widened.jsonl.gz", meta, rows)
    ds = load_dataset(tmp_path / "widened.jsonl.gz")
    got = ds.space.schedules(ds.space.valid_indices)
    def canon(s: dict) -> str:
        return str(sorted(s.items()))

    # the four that ran and the runtime failure (a real trial's outcome), not the unbuilt one
    assert sorted(map(canon, got)) == sorted(canon({**ds.defaulted, **s})
                                             for s in scheds[:4] + scheds[5:])


def test_prior_schedules_stored_before_the_knob_read_as_its_first_value(
        mma_knob: None) -> None:
    cols = columns_from_schedules(Precision.INT8, [
        {**s, "MMA": "wgmma"} if j == 0 else {k: v for k, v in s.items() if k != "MMA"}
        for j, s in enumerate(_old_schedules()[:3])])
    assert cols["MMA"].tolist() == ["wgmma", "sync", "sync"]


def _diversity_schedules(path: Path, batches: int) -> list[dict]:
    ds = load_dataset(path)
    strat = make_strategy("diversity", ds.space, seed=3)
    h = History()
    out: list[dict] = []
    for _ in range(batches):
        picks = strat.propose(h, 32)
        h.trials.extend(ds.measure(p) for p in picks)
        out += ds.space.schedules(picks)
    return out


def test_a_new_knob_does_not_change_the_search_on_old_data(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """A knob added to the kernel is held at its first value in older recordings: the space
    it adds is not searched there, and the task model leaves out the constant columns, so
    the explorer proposes the same schedules (the bags' column draws see the same columns)."""
    path = REPLAY / "resnet50_stage4_n8_fp16_h200.jsonl.gz"
    before = _diversity_schedules(path, 3)
    monkeypatch.setitem(kspace.EXTRA_KNOBS, "LATER", (0, 1))
    after = _diversity_schedules(path, 3)
    assert all(s["LATER"] == 0 for s in after)
    assert [{k: v for k, v in s.items() if k != "LATER"} for s in after] == before


def test_a_replay_space_holds_what_the_dataset_holds() -> None:
    # A recorded schedule the rules now reject stays proposable in its dataset's space, and
    # the plain space with the same restriction keeps the rules' answer (enumerated spaces
    # are cached per process by shape, precision, target and knob values).
    shape, target = RESNET50_3X3["stage3"], TARGETS["h100"]
    restrict = {"MMA": ["sync"], "TMA": [0], "PERSIST": [0], "FOLD_TAPS": [0]}
    plain = ScheduleSpace(shape, Precision.INT8, target, restrict)
    rejected = np.flatnonzero(~plain.valid_mask(np.arange(plain.size)))[:3]
    present = np.concatenate([plain.valid_indices[:5], rejected])
    replay = ReplaySpace(shape, Precision.INT8, target, restrict, present)
    np.testing.assert_array_equal(replay.valid_indices, np.sort(present))
    again = ScheduleSpace(shape, Precision.INT8, target, restrict)
    assert not np.isin(rejected, again.valid_indices).any()
    assert len(again.valid_indices) == len(plain.valid_indices)
