"""The Strategy interface: every search method proposes the next batch the same way.

The explorer rebuilds a strategy's whole input from the database (the task's measurements,
the candidates already in flight, prior measurements of the target for transfer), so a
strategy keeps no state that a restart could lose. Its random choices come from a generator
seeded by the job's seed and the size of the history, so a replayed call proposes the same.

Each strategy declares its options (`OPTIONS`, search/options.py): what a job may set, with
defaults; anything else is refused, and the class docstring lists them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from kernels.space import ScheduleSpace
from kernels.spec import ConvShape
from search.options import Option, options_doc, options_lines, resolve


@dataclass(frozen=True)
class Trial:
    """One measured schedule of this task (any job)."""

    index: int  # position in the ScheduleSpace
    status: str  # ok / wrong / compile_error / runtime_error / timeout
    median_us: float | None


@dataclass(frozen=True)
class PriorTrial:
    """A measurement of another layer on the same target and precision (for transfer)."""

    shape: ConvShape
    schedule: dict[str, Any]
    status: str
    median_us: float | None


@dataclass
class History:
    trials: list[Trial] = field(default_factory=list)
    pending: set[int] = field(default_factory=set)  # proposed, not measured yet
    prior: list[PriorTrial] = field(default_factory=list)

    @property
    def seen(self) -> set[int]:
        return {t.index for t in self.trials} | set(self.pending)


class Strategy(ABC):
    name: ClassVar[str]
    # What a job may set; a subclass extends its parent's (or re-defaults them).
    OPTIONS: ClassVar[tuple[Option, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The options section is generated, so the docstring cannot drift from what the
        # constructor accepts.
        own = (cls.__dict__.get("__doc__") or "").rstrip()
        cls.__doc__ = f"{own}\n\n{options_doc(cls.OPTIONS)}".lstrip()

    def __init__(self, space: ScheduleSpace, seed: int = 0, **options: Any) -> None:
        self.space = space
        self.seed = seed
        # Every declared option's value; an unknown option or a bad value is an OptionError.
        self.options: dict[str, Any] = resolve(self.strategy_name(), self.OPTIONS, options)

    @classmethod
    def strategy_name(cls) -> str:
        return getattr(cls, "name", cls.__name__)

    @classmethod
    def help_text(cls) -> str:
        """The name, the docstring's first line and every option (CLI and replay help)."""
        summary = (cls.__doc__ or "").strip().splitlines()[0]
        lines = options_lines(cls.OPTIONS)
        return "\n".join([f"{cls.strategy_name()}: {summary}"
                          + ("" if lines else " No options."), *lines])

    def rng(self, history: History) -> np.random.Generator:
        """Generator for one call: same seed and history size -> same proposals."""
        return np.random.default_rng([self.seed, len(history.trials), len(history.pending)])

    def footprint(self) -> int:
        """Bytes this strategy keeps between proposals beyond its space (none here)."""
        return 0

    @abstractmethod
    def propose(self, history: History, n: int) -> list[int]:
        """Up to n distinct valid indices, none measured or pending. Fewer only when the
        valid space has fewer unseen schedules left."""

    def unseen_valid(self, history: History) -> np.ndarray:
        valid = self.space.valid_indices
        seen = history.seen
        if not seen or not len(valid):
            return valid
        # By sorted lookup into `valid` (ascending): np.isin sorted the whole space each call.
        idx = np.fromiter(seen, dtype=np.int64, count=len(seen))
        pos = np.minimum(np.searchsorted(valid, idx), max(len(valid) - 1, 0))
        keep = np.ones(len(valid), dtype=bool)
        keep[pos[valid[pos] == idx]] = False
        return valid[keep]
