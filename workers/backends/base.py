"""The measurement backend interface: turn (task, schedule) into a stored result.

A backend builds a candidate (CPU: NVRTC, or nothing for the simulated backend) and measures
it (GPU, or the analytical model). Both steps return plain data so that they can cross
process and broker boundaries; a failure is a result with a status, never an exception.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from kernels.spec import ConvShape, Precision, Target

STATUSES = ("ok", "wrong", "compile_error", "runtime_error", "timeout")


@dataclass(frozen=True)
class TaskSpec:
    """What a backend needs to know about the layer being tuned."""

    shape: ConvShape
    precision: Precision
    target: Target

    def to_dict(self) -> dict[str, Any]:
        return {"shape": self.shape.to_dict(), "precision": self.precision.value,
                "target": self.target.name}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskSpec:
        from kernels.spec import get_target

        return cls(ConvShape.from_dict(d["shape"]), Precision(d["precision"]),
                   get_target(d["target"]))


@dataclass
class BuildOutcome:
    """Result of building one candidate. `artifact` names the cubin in the shared cache."""

    status: str  # "ok" or "compile_error"
    artifact: str | None = None
    log: str = ""
    seconds: float = 0.0


@dataclass
class MeasureOutcome:
    status: str  # one of STATUSES
    median_us: float | None = None
    iqr_us: float | None = None
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Backend(Protocol):
    """A measurement backend; `name` is stored with every result ('cuda' or 'simulated')."""

    name: str

    @property
    def gpu_model(self) -> str: ...

    def prepare(self, items: Sequence[tuple[TaskSpec, dict[str, Any]]]) -> None:
        """Called once with a chunk's (task, schedule) pairs before they are built and
        measured one by one: work that costs less for all of them at once (the simulated
        backend's model); nothing for a GPU."""
        ...

    def build(self, task: TaskSpec, schedule: dict[str, Any]) -> BuildOutcome: ...

    def measure(self, task: TaskSpec, schedule: dict[str, Any],
                build: BuildOutcome) -> MeasureOutcome: ...

    def close(self) -> None: ...
