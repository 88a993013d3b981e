"""Schedules chosen in the model's own context.

A record is the fastest schedule of a layer timed alone, its inputs rotating past L2 and each
launch waiting for the one before. In a model the layer's input was just written by the layer
before (it is in L2) and, on sm_90, its blocks start while that layer finishes (programmatic
dependent launch), so a runner-up of the layer's search can be faster there. `choose_in_model`
times the whole forward with each candidate of a record in turn, every layer that shares the
record running it, and keeps the fastest where it beats the schedule in place in a second,
alternating timing too; one record after another, each timed with the choices before it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from deploy.module import FusedConv, OptimizedModel
from deploy.plan import epilogue_pass_us
from kernels.space import schedule_hash
from kernels.spec import Precision


@dataclass
class Choice:
    """What `choose_in_model` did with one record: the forward's time with each schedule
    tried (µs, the one in place first), the confirming timings, and the schedule kept."""

    key: str
    layers: list[str]
    tried: list[tuple[dict[str, Any], float]] = field(default_factory=list)
    confirm_in_place_us: list[float] = field(default_factory=list)
    confirm_best_us: list[float] = field(default_factory=list)
    schedule: dict[str, Any] = field(default_factory=dict)
    changed: bool = False
    refused: list[str] = field(default_factory=list)  # candidates not valid here, and why

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def layer_groups(model: OptimizedModel) -> dict[str, list[FusedConv]]:
    """The model's fused layers by the record they run (FusedConv.record_key), in the
    model's order."""
    groups: dict[str, list[FusedConv]] = {}
    for m in model.modules_of(FusedConv):
        assert isinstance(m, FusedConv)
        groups.setdefault(m.record_key(), []).append(m)
    return groups


def worth_trying(precision: Precision, latency_us: float | None,
                 baseline_us: float | None, pass_us: float = 0.0) -> bool:
    """Whether a candidate may stand for its record: in fp16 not one slower alone than the
    record's cuDNN baseline with the pass PyTorch runs after it (`pass_us`:
    deploy.plan.epilogue_pass_us), for which deploy would keep PyTorch's conv
    (deploy.plan.keep_for_record)."""
    return Precision(precision) is not Precision.FP16 or latency_us is None or \
        baseline_us is None or latency_us <= baseline_us + pass_us


def candidates_from_service(client: Any, model: OptimizedModel, k: int
                            ) -> dict[str, list[dict[str, Any]]]:
    """Each record's next `k` fastest schedules after its best, as a tctune service holds
    them (`api.client.Client`; one POST /schedules/lookup), less those not worth trying."""
    groups = layer_groups(model)
    firsts = [mods[0] for mods in groups.values()]
    found = client.lookup([(replace(m.shape, residual=m.residual), m.precision.value,
                            m.target.name) for m in firsts], runners_up=k)
    return {key: [r["schedule"] for r in item.get("runners_up") or ()
                  if worth_trying(m.precision, r["latency_us"], item.get("baseline_us"),
                                  epilogue_pass_us(replace(m.shape, residual=m.residual),
                                                   m.target))]
            for key, m, item in zip(groups, firsts, found, strict=True) if item.get("found")}


def _apply(model: OptimizedModel, mods: Sequence[FusedConv], schedule: dict[str, Any],
           source: str) -> None:
    for m in mods:
        m.set_schedule(schedule, source)
        for lp in model.plan:  # a projection or a 1x1 conv that runs in this layer's kernel
            if m.layer.name in (lp.merged, lp.back_to_back) and lp is not m.layer:
                lp.schedule, lp.schedule_source = dict(schedule), source


def choose_in_model(model: OptimizedModel, candidates: Mapping[str, Sequence[Mapping[str, Any]]],
                    forward_us: Callable[[], float], *, margin: float = 0.003,
                    confirm: int = 3,
                    progress: Callable[[Choice], None] | None = None) -> list[Choice]:
    """Give each record of the model the fastest of its candidates in the model.

    candidates  {record key (FusedConv.record_key): schedules to try}; a record without
                any keeps its schedule
    forward_us  the model's forward time as the model now stands (µs), e.g. a CUDA graph
                of forwards timed by kernels.timing
    margin      a candidate replaces the schedule in place only where, timed `confirm`
                times more alternately with it, its median is this share faster (a forward
                timed twice moves by up to about 0.5% on an H200 with an outlying timing;
                a median of three resists one)

    The model's layers run the chosen schedules from then on; returns what was tried per
    record, each also handed to `progress` once it is done.
    """
    if not 0 <= margin < 1:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    if confirm < 1:
        raise ValueError(f"confirm must be at least 1, got {confirm}")
    out: list[Choice] = []
    for key, mods in layer_groups(model).items():
        in_place = dict(mods[0].schedule)
        source = mods[0].layer.schedule_source
        choice = Choice(key, [m.layer.name for m in mods], schedule=in_place)
        out.append(choice)
        tries: list[dict[str, Any]] = []
        seen = {schedule_hash(in_place)}  # one kernel, whichever later knobs a dict names
        for c in candidates.get(key, ()):
            if schedule_hash(c) not in seen:
                seen.add(schedule_hash(c))
                tries.append(dict(c))
        if tries:
            _choose(model, mods, choice, tries, forward_us, margin, confirm, source)
        if progress:
            progress(choice)
    return out


def _choose(model: OptimizedModel, mods: list[FusedConv], choice: Choice,
            tries: list[dict[str, Any]], forward_us: Callable[[], float], margin: float,
            confirm: int, source: str) -> None:
    in_place = choice.schedule
    choice.tried.append((in_place, forward_us()))
    for c in tries:
        try:
            _apply(model, mods, c, "chosen in the model")
        except ValueError as exc:
            choice.refused.append(str(exc))
            _apply(model, mods, in_place, source)
            continue
        choice.tried.append((c, forward_us()))
    best = min(choice.tried[1:], key=lambda t: t[1], default=None)
    if best is None or best[1] >= choice.tried[0][1]:
        _apply(model, mods, in_place, source)
        return
    for _ in range(confirm):
        _apply(model, mods, in_place, source)
        choice.confirm_in_place_us.append(forward_us())
        _apply(model, mods, best[0], "chosen in the model")
        choice.confirm_best_us.append(forward_us())
    if statistics.median(choice.confirm_best_us) < \
            statistics.median(choice.confirm_in_place_us) * (1 - margin):
        choice.schedule, choice.changed = dict(best[0]), True
    else:
        _apply(model, mods, in_place, source)
