"""Exhaustively measured schedule spaces (replay datasets): reading and writing them.

Format (gzip JSON lines): a first line `{"meta": {...}}` with dataset, shape, precision,
target, gpu, simulated, fixed (knob -> value held fixed) and date; then one line per
schedule `{"schedule": {...}, "status": ..., "median_us": ..., "iqr_us": ...}`.
The replay space is the kernel's space restricted to the fixed knobs; a schedule absent from
the file counts as invalid there, so strategies never propose what was not measured.

A knob of today's kernel that the file does not mention at all (neither in `fixed` nor in
its rows: the knob was added after the recording) is held at its first value, which is by
convention the kernel as it was before the knob existed; the dataset says which knobs it
defaulted so (`ReplayDataset.defaulted`).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from kernels.space import ScheduleSpace, knobs_for
from kernels.spec import ConvShape, Precision, Target, get_target
from search.strategy import Trial


class ReplaySpace(ScheduleSpace):
    """A restricted space whose valid schedules are the ones `present` marks: what the
    dataset holds and the explorer could have proposed (see `load_dataset`)."""

    def __init__(self, shape: ConvShape, precision: Precision, target: Target,
                 restrict: Mapping[str, Iterable[Any]] | None, present: np.ndarray) -> None:
        super().__init__(shape, precision, target, restrict)
        self._present = np.zeros(self.size, dtype=bool)
        self._present[present] = True

    def valid_mask(self, indices: np.ndarray) -> np.ndarray:
        return self._present[np.asarray(indices, dtype=np.int64)]

    @cached_property
    def valid_indices(self) -> np.ndarray:
        """What the dataset holds (not the kernel's rules, nor the spaces' shared cache)."""
        return np.flatnonzero(self._present)


@dataclass
class ReplayDataset:
    name: str
    path: Path
    meta: dict[str, Any]
    space: ReplaySpace
    status: np.ndarray  # per space index; "" where absent
    median_us: np.ndarray  # per space index; inf where absent or failed
    # Knobs the file does not mention, held at their first value (see the module doc).
    defaulted: dict[str, Any] = field(default_factory=dict)

    @property
    def simulated(self) -> bool:
        return bool(self.meta.get("simulated", False))

    @property
    def best_us(self) -> float:
        return float(self.median_us[self.space.valid_indices].min())

    def measure(self, index: int) -> Trial:
        """The recorded outcome of one schedule, as the explorer would have stored it."""
        st = str(self.status[index])
        us = float(self.median_us[index])
        return Trial(index=int(index), status=st, median_us=us if st == "ok" else None)

    def throughput(self, indices: np.ndarray) -> np.ndarray:
        """best latency / latency (1.0 at the optimum, 0 for failures)."""
        lat = self.median_us[np.asarray(indices, dtype=np.int64)]
        return np.where(np.isfinite(lat), self.best_us / lat, 0.0)


def load_dataset(path: str | Path) -> ReplayDataset:
    path = Path(path)
    with gzip.open(path, "rt") as f:
        meta = json.loads(f.readline())["meta"]
        rows = [json.loads(line) for line in f if line.strip()]
    shape = ConvShape.from_dict(meta["shape"])
    precision = Precision(meta["precision"])
    target = get_target(meta["target"])
    fixed = dict(meta.get("fixed") or {})
    defaulted = unmentioned_knobs(precision, fixed, (r["schedule"] for r in rows))
    restrict = {k: [v] for k, v in {**fixed, **defaulted}.items()}
    probe = ScheduleSpace(shape, precision, target, restrict)
    idx = np.array([probe.index_of({**defaulted, **r["schedule"]}) for r in rows],
                   dtype=np.int64)
    ok = np.array([r["status"] == "ok" for r in rows], dtype=bool)
    unbuilt = np.array([r["status"] == "compile_error" for r in rows], dtype=bool)
    # Proposable: what the kernel's space accepts (the explorer never proposes the rest, so
    # a recorded compile_error of a schedule it rejects is no trial), plus every schedule
    # that ran ok, so that the replay's optimum stays reachable if the validity rules
    # tighten after the recording. A recording marks what its day's rules rejected as a
    # compile_error (no recorded space has a compile_error its rules admitted): where the
    # rules widen later, such a schedule is unknown, not a failure, and is left out.
    proposable = ok | (probe.valid_mask(idx) & ~unbuilt)
    space = ReplaySpace(shape, precision, target, restrict, idx[proposable])
    status = np.full(space.size, "", dtype=object)
    median = np.full(space.size, np.inf)
    for i, r in zip(idx, rows, strict=True):
        status[i] = r["status"]
        if r["status"] == "ok" and r.get("median_us") is not None:
            median[i] = float(r["median_us"])
    name = meta.get("dataset") or path.name.split(".")[0]
    return ReplayDataset(name=name, path=path, meta=meta, space=space, status=status,
                         median_us=median, defaulted=defaulted)


def unmentioned_knobs(precision: Precision, fixed: Mapping[str, Any],
                      schedules: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Knob -> its first value, for every knob of the precision's space that neither `fixed`
    nor any of the schedules names (a knob added to the kernel after the recording)."""
    named = set(fixed)
    for sched in schedules:
        named.update(sched)
    return {k: values[0] for k, values in knobs_for(precision).items() if k not in named}


def write_dataset(path: str | Path, meta: Mapping[str, Any],
                  rows: Iterable[Mapping[str, Any]]) -> int:
    """Write a dataset; returns the number of schedule lines."""
    count = 0
    with gzip.open(path, "wt", compresslevel=9) as f:
        f.write(json.dumps({"meta": dict(meta)}, separators=(",", ":")) + "\n")
        for r in rows:
            f.write(json.dumps(dict(r), separators=(",", ":")) + "\n")
            count += 1
    return count
