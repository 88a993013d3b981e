"""deploy.model_select: the layers that share a record form one group, each group gets the
fastest of its candidates as the forward's time says (here a cost of the schedules in place,
on the CPU; on the GPU, bench/model_select.py times the real forward), and a layer takes a new
schedule only where it is valid for it and reads the same input."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from torch import nn

from api.client import Client
from bench.nets import BasicBlock, randomize_bn
from deploy import FusedConv, OptimizedModel, optimize
from deploy.model_select import candidates_from_service, choose_in_model, layer_groups
from kernels.runtime import DefaultScheduleWarning, schedule_fits
from kernels.space import knobs_for, with_defaults
from kernels.spec import get_target
from tests.deploy.test_deploy_plan import _store, service  # noqa: F401 - the fixture

H100 = get_target("h100")
X = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(4))


class Repeated(nn.Module):
    """A stem and two identical BasicBlocks: their first convs share a record, and so do
    their second ones (each with its residual)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.relu = nn.ReLU()
        self.layer = nn.Sequential(BasicBlock(32, 32), BasicBlock(32, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(self.relu(self.bn1(self.conv1(x))))


def optimized(backend: str = "reference", cache_dir: Path | None = None) -> OptimizedModel:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        return optimize(randomize_bn(Repeated()).eval(), X, "int8", "h100", backend=backend,
                        cache_dir=cache_dir)


def alternatives(mod: FusedConv, count: int, **fixed: Any) -> list[dict[str, Any]]:
    """Schedules valid for the layer other than its own, one knob changed."""
    out: list[dict[str, Any]] = []
    for knob, values in knobs_for(mod.precision).items():
        for v in values:
            s = {**mod.schedule, **fixed, knob: v}
            if s != mod.schedule and s not in out and \
                    schedule_fits(mod.shape, mod.precision, H100, s, mod.epilogue) is None:
                out.append(s)
                if len(out) == count:
                    return out
    return out


def test_layers_that_share_a_record_are_one_group() -> None:
    opt = optimized()
    groups = layer_groups(opt)
    assert sorted((len(m), k.split("|")[0].endswith("_res")) for k, m in groups.items()) == \
        [(1, False), (2, False), (2, True)]
    names = {k: [m.layer.name for m in mods] for k, mods in groups.items()}
    assert ["layer.0.conv1", "layer.1.conv1"] in names.values()
    assert ["layer.0.conv2", "layer.1.conv2"] in names.values()
    for key, mods in groups.items():
        assert key.endswith("|int8|h100")
        assert all(m.record_key() == key and m.schedule == mods[0].schedule for m in mods)


def test_each_record_takes_its_fastest_candidate_where_it_beats_the_one_in_place() -> None:
    opt = optimized()
    groups = layer_groups(opt)
    stem, first, second = (groups[k] for k in sorted(groups, key=lambda k: len(groups[k][0]
                                                                              .layer.name)))
    assert stem[0].layer.name == "conv1"
    sources = {m.layer.name: m.layer.schedule_source for m in opt.modules_of(FusedConv)}
    cost: dict[str, float] = {}

    def set_cost(mods: list[FusedConv], schedule: dict[str, Any], us: float) -> None:
        cost[json.dumps(schedule, sort_keys=True) + mods[0].record_key()] = us

    calls = []

    def forward_us() -> float:
        calls.append(1)
        return sum(cost[json.dumps(m.schedule, sort_keys=True) + m.record_key()]
                   for m in opt.modules_of(FusedConv))

    candidates: dict[str, list[dict[str, Any]]] = {}
    plan = {  # per group: the one in place, then its candidates' costs per layer
        "stem": (stem, 10.0, [10.5, 9.0, 9.5]),  # the second candidate wins
        "first": (first, 10.0, [11.0, 12.0]),  # none is faster: kept
        "second": (second, 10.0, [9.99, 10.2]),  # 0.04% of the forward: under the margin
    }
    for mods, in_place, costs in plan.values():
        set_cost(mods, mods[0].schedule, in_place)
        alts = alternatives(mods[0], len(costs))
        assert len(alts) == len(costs)
        for s, us in zip(alts, costs, strict=True):
            set_cost(mods, s, us)
        bad = {**mods[0].schedule, "BLK_ROW_WARPS": 3}  # not of the space
        # the one in place with its later knobs at their defaults named: the same kernel
        same = with_defaults(mods[0].precision, mods[0].schedule)
        assert same != mods[0].schedule
        candidates[mods[0].record_key()] = [*alts, bad, mods[0].schedule, same, alts[0]]
    before = {k: dict(mods[0].schedule) for k, mods in groups.items()}
    choices = choose_in_model(opt, candidates, forward_us, margin=0.002, confirm=2)

    by_key = {c.key: c for c in choices}
    stem_choice = by_key[stem[0].record_key()]
    assert stem_choice.changed and stem_choice.schedule == candidates[stem_choice.key][1]
    assert stem[0].schedule == stem_choice.schedule
    assert stem[0].layer.schedule == stem_choice.schedule
    assert stem[0].layer.schedule_source == "chosen in the model"
    # tried: the one in place, then each distinct candidate once; the bad one refused
    assert [us for _, us in stem_choice.tried] == [50.0, 50.5, 49.0, 49.5]
    assert len(stem_choice.refused) == 1 and "BLK_ROW_WARPS" in stem_choice.refused[0]
    assert stem_choice.confirm_best_us == [49.0, 49.0]
    for name in ("first", "second"):
        mods = plan[name][0]
        c = by_key[mods[0].record_key()]
        assert not c.changed and c.schedule == before[c.key]
        assert all(m.schedule == before[c.key] for m in mods)
        assert all(m.layer.schedule_source == sources[m.layer.name] for m in mods)
    assert not by_key[first[0].record_key()].confirm_best_us  # never confirmed: slower
    assert by_key[second[0].record_key()].confirm_best_us  # confirmed, under the margin
    assert len(calls) == 3 * 1 + (3 + 2 + 2) + 2 * 2 * 2


@pytest.mark.parametrize("confirm,taken", [(1, True), (3, False)])
def test_one_outlying_timing_does_not_make_an_equal_candidate_win(confirm: int,
                                                                  taken: bool) -> None:
    """The candidate runs as fast as the schedule in place; one timing of the one in place
    comes out 2% slow (as a forward's timing does at times). A single confirming timing takes
    the candidate on it; the median of three (the default) does not."""
    opt = optimized()
    stem = layer_groups(opt)[opt.modules_of(FusedConv)[0].record_key()]  # type: ignore[union-attr]
    candidate = alternatives(stem[0], 1)[0]
    timings = iter([100.0, 99.9] + [102.0, 99.9] + [100.0, 99.9] * 2)

    def forward_us() -> float:
        return next(timings)

    (choice, *_) = choose_in_model(opt, {stem[0].record_key(): [candidate]}, forward_us,
                                   confirm=confirm)
    assert choice.changed is taken
    assert stem[0].schedule == (candidate if taken else choice.tried[0][0])


def test_the_search_is_refused_bad_arguments() -> None:
    opt = optimized()
    with pytest.raises(ValueError, match="margin"):
        choose_in_model(opt, {}, lambda: 1.0, margin=1.0)
    with pytest.raises(ValueError, match="confirm"):
        choose_in_model(opt, {}, lambda: 1.0, confirm=0)
    assert all(not c.tried for c in choose_in_model(opt, {}, lambda: 1.0))


def test_a_new_schedule_is_built_for_the_planned_input_or_refused_unchanged(
        tmp_path: Path) -> None:
    """On the cuda executor (NVRTC builds, no GPU needed): the layer's op for its planned input
    runs the new schedule; one that is not valid, or would read the input padded to another
    channel count than the op before writes, leaves the layer as it was."""
    opt = optimized("cuda", tmp_path)
    mods = {m.layer.name: m for m in opt.modules_of(FusedConv)}
    layer = mods["layer.0.conv1"]
    new = alternatives(layer, 1)[0]
    layer.set_schedule(new, "test")
    (op,) = layer._ops.values()
    assert op.schedule == new and layer.schedule == new and layer.layer.schedule_source == "test"

    stem = mods["conv1"]
    was, ops = dict(stem.schedule), dict(stem._ops)
    with pytest.raises(ValueError, match="BLK_ROW_WARPS"):
        stem.set_schedule({**was, "BLK_ROW_WARPS": 3}, "test")
    assert stem.schedule == was and stem._ops == ops
    wider = [s for s in alternatives(stem, 40, FOLD_TAPS=0) if s.get("FOLD_TAPS") == 0]
    assert stem.input_channels == 4 and wider, stem.schedule  # folded taps read C as 4
    with pytest.raises(ValueError, match="input channels"):
        stem.set_schedule(wider[0], "test")
    assert stem.schedule == was and stem._ops == ops and stem.layer.schedule_source != "test"


def test_the_candidates_are_each_records_runners_up_in_the_service(
        service: tuple[TestClient, str]) -> None:  # noqa: F811
    """One bulk lookup with runners_up: per record its next fastest schedules in the service,
    fastest first, less fp16 ones slower alone than the record's cuDNN baseline with the
    pass after it."""
    app, db = service
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        opt = optimize(randomize_bn(Repeated()).eval(), X, "fp16", "h100", backend="reference")
    groups = layer_groups(opt)
    stem, first, second = (groups[k][0] for k in sorted(groups, key=lambda k: len(groups[k][0]
                                                                                  .layer.name)))
    want: dict[str, list[dict[str, Any]]] = {}
    for mod, baseline in ((second, None), (first, 10.0)):  # the second with its residual
        shape = replace(mod.shape, residual=mod.residual)
        alts = alternatives(mod, 3)
        for s, us in zip([mod.schedule, *alts], [8.0, 9.0, 9.5, 13.0], strict=True):
            _store(db, shape, s, us, baseline)
        # fp16 with a baseline of 10 us: the one at 13 us would leave the layer to cuDNN
        # (slower than its 10 us with the pass after it, deploy.plan.epilogue_pass_us)
        want[mod.record_key()] = alts if baseline is None else alts[:2]
    client = Client("http://testserver")
    client.http.close()
    client.http = app  # the app's real routes, in process
    got = candidates_from_service(client, opt, 3)
    assert got == want  # the stem's record is not in the service: no candidates
    assert stem.record_key() not in got and second.record_key().split("|")[0].endswith("_res")
    assert candidates_from_service(client, opt, 1) == {k: v[:1] for k, v in want.items()}


def test_the_compiled_forward_runs_a_schedule_set_after_compiling() -> None:
    """deploy.measure.model_ruler compiles the model once (inference freezing) and times it
    after each schedule change: the compiled graph's op finds the layer when it runs
    (deploy.torch_op), so the schedule set after compiling is the one it runs."""
    from deploy import torch_op
    from deploy.measure import compile_for_inference

    opt = optimized()
    fn = compile_for_inference(opt, X)
    mod = opt.modules_of(FusedConv)[0]
    assert isinstance(mod, FusedConv)
    ran: list[dict[str, Any]] = []

    class Watched:  # the registry's entry for the layer: records the schedule each run uses
        def __getattr__(self, name: str) -> Any:
            return getattr(mod, name)

        def execute(self, *args: Any) -> torch.Tensor:
            ran.append(dict(mod.schedule))
            return mod.execute(*args)

    watched = Watched()  # (the registry holds it weakly)
    torch_op._LAYERS[mod.uid] = watched
    try:
        want = opt(X)
        new = alternatives(mod, 1)[0]
        mod.set_schedule(new, "chosen in the model")
        with torch.no_grad():
            got = fn(X)
        assert ran and ran[-1] == new
        # the reference executor gives any schedule's result; compiling moves the float ops
        # around the layers by a rounding or two
        torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    finally:
        torch_op._LAYERS[mod.uid] = mod
