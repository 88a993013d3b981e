"""Per-layer decisions: which schedule each conv runs, or why it stays in PyTorch.

Schedules come from `schedules` (see `lookup_records`): a tctune service (an
`api.client.Client` or its URL, one bulk lookup), a dict of records, or None. A record is
what the service answers for a layer (`schedule`, `latency_us`, and where the task's
baseline was timed, `baseline_us` and `speedup`). Rules:
  * a layer without a record at its batch runs the schedule of its record at the nearest
    larger batch (`other_batch_records`; not its times), else the runtime's default schedule
    (DefaultScheduleWarning);
  * fp16: a record whose tuned kernel is slower than its baseline with the pass PyTorch
    runs after the conv (`latency_us` > `baseline_us` + `epilogue_pass_us`; a record with
    only its `speedup`, < 1) keeps PyTorch's conv for that layer;
  * a tuned schedule in the blocked NHWCnc layout runs as NHWC (the same knobs), because
    activations stay NHWC between layers; where that twin is invalid, or the schedule does not
    fit the layer's fused epilogue (a residual tile needs shared memory too), the default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kernels.build import Epilogue
from kernels.runtime import default_schedule, schedule_fits
from kernels.spec import ConvShape, Precision, Target, task_key

LOOKUP_BATCH = 1000  # POST /schedules/lookup takes at most this many layers
# The batches a service is asked for a layer's record at a larger batch (other_batch_records).
OTHER_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class Record:
    """A tuned schedule of one layer and what the service measured about it."""

    schedule: Mapping[str, Any]
    source: str
    latency_us: float | None = None
    baseline_us: float | None = None
    speedup: float | None = None
    simulated: bool | None = None

    def slower_than_baseline(self) -> bool:
        """The record itself says the tuned kernel lost to its baseline."""
        if self.speedup is not None and self.speedup < 1.0:
            return True
        return (self.latency_us is not None and self.baseline_us is not None
                and self.latency_us > self.baseline_us)


def _number(v: Any) -> float | None:
    return None if v is None else float(v)


def record_from_dict(d: Mapping[str, Any], source: str) -> Record | None:
    """A record as GET /schedule or POST /schedules/lookup gives it (None where it says
    found=False); a bare schedule (knob -> value) is accepted as a record without timings."""
    if d.get("found") is False:
        return None
    if "schedule" not in d:
        if "BLK_ROW_WARPS" in d:
            return Record(dict(d), source)
        raise ValueError(f"{source}: a schedule record needs a 'schedule' field, got keys "
                         f"{sorted(d)}")
    if d["schedule"] is None:
        return None
    lat, base = _number(d.get("latency_us")), _number(d.get("baseline_us"))
    speedup = _number(d.get("speedup"))
    if speedup is None and lat and base:
        speedup = base / lat
    sim = d.get("simulated")
    where = source
    if d.get("job_id") is not None:
        where += f": job {d['job_id']}"
    if lat is not None:
        where += f", {lat:g} us" + (" (simulated)" if sim else "")
    return Record(dict(d["schedule"]), where, lat, base, speedup,
                  None if sim is None else bool(sim))


def lookup_records(schedules: Any, layers: Sequence[tuple[str, ConvShape]],
                   precision: Precision, target: Target) -> list[Record | None]:
    """The record of each (name, shape), in order (None: none known).

    schedules: None; a dict keyed by layer name, task key (`shape|precision|target`) or
    ConvShape.key() (looked up in that order) of records; an `api.client.Client` (anything
    with `.lookup`, or `.schedule`); or a service URL (read with $TCTUNE_TOKEN if set)."""
    if schedules is None:
        return [None for _ in layers]
    if isinstance(schedules, Mapping):
        out: list[Record | None] = []
        for name, shape in layers:
            for key in (name, task_key(shape, precision, target), shape.key()):
                if key in schedules:
                    out.append(record_from_dict(schedules[key], f"given ({key})"))
                    break
            else:
                out.append(None)
        return out
    if isinstance(schedules, str):
        from api.client import Client

        client = Client(schedules, token=os.environ.get("TCTUNE_TOKEN"))
        try:
            return _from_client(client, layers, precision, target)
        finally:
            client.close()
    return _from_client(schedules, layers, precision, target)


def _from_client(client: Any, layers: Sequence[tuple[str, ConvShape]], precision: Precision,
                 target: Target) -> list[Record | None]:
    shapes = list(dict.fromkeys(shape for _, shape in layers))  # each distinct layer once
    found: list[Mapping[str, Any] | None] = []
    if hasattr(client, "lookup"):
        for i in range(0, len(shapes), LOOKUP_BATCH):
            found += client.lookup([(sh, precision.value, target.name)
                                    for sh in shapes[i:i + LOOKUP_BATCH]])
    elif hasattr(client, "schedule"):
        found = [client.schedule(sh, precision.value, target.name) for sh in shapes]
    else:
        raise TypeError("schedules must be None, a dict of records, a service URL or a "
                        f"client with .lookup/.schedule, got {type(client).__name__}")
    by_shape = {sh: None if res is None else record_from_dict(res, "service")
                for sh, res in zip(shapes, found, strict=True)}
    return [by_shape[shape] for _, shape in layers]


def other_batch_records(schedules: Any, layers: Sequence[tuple[str, ConvShape]],
                        precision: Precision, target: Target) -> list[Record | None]:
    """For each (name, shape): the record of the same layer at the nearest larger batch,
    where `schedules` holds one (a dict by task key or ConvShape.key(); a service asked for
    OTHER_BATCHES). Its schedule is taken, not its times or speedup (another batch's: the
    layer is decided as one without a record, on that schedule); None where there is none.
    Larger only: on an H200, ResNet-18's batch-8 records ran its forward at batch 1 12% (int8)
    and 24% (fp16) faster than the runtime's defaults, at batch 32 2% and 7% slower
    (DenseNet-121 fp16 at batch 32 7% faster; bench/RESULTS.md, "Whole models")."""
    if schedules is None or not layers:
        return [None for _ in layers]
    wanted = {_batchless(shape) for _, shape in layers}
    held: dict[ConvShape, list[tuple[int, Record]]] = {}
    if isinstance(schedules, Mapping):
        for key, d in schedules.items():
            shape = _shape_of_key(str(key), precision, target)
            if shape is not None and _batchless(shape) in wanted:
                rec = record_from_dict(d, f"given ({key})")
                if rec is not None:
                    held.setdefault(_batchless(shape), []).append((shape.n, rec))
    else:
        asked = list(dict.fromkeys((f"n{b}", replace(shape, n=b)) for _, shape in layers
                                   for b in OTHER_BATCHES if b > shape.n))
        for (_, shape), rec in zip(asked, lookup_records(schedules, asked, precision, target),
                                   strict=True):
            if rec is not None:
                held.setdefault(_batchless(shape), []).append((shape.n, rec))
    out: list[Record | None] = []
    for _, shape in layers:
        larger = [r for r in held.get(_batchless(shape), []) if r[0] > shape.n]
        if not larger:
            out.append(None)
            continue
        n, rec = min(larger, key=lambda r: r[0])
        out.append(Record(rec.schedule, f"{rec.source}, tuned at batch {n}",
                          simulated=rec.simulated))
    return out


def _batchless(shape: ConvShape) -> ConvShape:
    return replace(shape, n=1)


def _shape_of_key(key: str, precision: Precision, target: Target) -> ConvShape | None:
    """The layer a records dict's key names for this precision and target (a task key, or a
    ConvShape.key()), or None (a layer name, another precision or target)."""
    parts = key.split("|")
    if len(parts) == 3 and (parts[1], parts[2]) != (precision.value, target.name):
        return None
    if len(parts) not in (1, 3):
        return None
    try:
        return ConvShape.from_key(parts[0])
    except ValueError:
        return None


@dataclass
class LayerPlan:
    """What happened to one nn.Conv2d of the model (`OptimizedModel.plan`)."""

    name: str  # the conv's module name
    shape_key: str | None  # ConvShape.key() of its input at the example inputs
    replaced: bool = False
    reason: str = ""  # why it stays in PyTorch (kept layers)
    bn: str | None = None  # the BatchNorm folded into it
    relu: bool = False  # ReLU fused into the epilogue
    residual: str | None = None  # the value added in the epilogue (graph node name)
    # the projection conv whose GEMM runs in this layer's kernel (two inputs), or, on the
    # projection's plan, the layer that runs it
    merged: str | None = None
    # the 1x1 conv this layer's kernel runs back to back over its output (ConvShape.b2b), or,
    # on that conv's plan, the layer whose kernel runs it
    back_to_back: str | None = None
    schedule: dict[str, Any] | None = None
    schedule_source: str = ""
    default_schedule: bool = False
    latency_us: float | None = None
    baseline_us: float | None = None
    speedup: float | None = None
    in_scale: float | None = None  # int8: per-tensor activation scales
    out_scale: float | None = None
    residual_scale: float | None = None
    x1_scale: float | None = None  # int8, two inputs: the scale of the layer's own input
    weight_scale_range: tuple[float, float] | None = None  # int8: min and max of per-channel
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def fused(self) -> str:
        parts = (["bn"] if self.bn else []) + (["+residual"] if self.residual else []) + \
            ([f"+{self.merged}"] if self.merged else []) + (["relu"] if self.relu else []) + \
            ([f"then {self.back_to_back}"] if self.back_to_back else [])
        return ",".join(parts) or "-"


# A pointwise kernel's fixed cost in a compiled model, beyond its bytes at the memory's
# bandwidth: the bias + ReLU pass after each conv ResNet-50 left to cuDNN took 1.8-2.1 µs
# more (H200, bench/data/profiles/model_e2e_kernels_h200.txt).
POINTWISE_US = 1.8


def epilogue_pass_us(shape: ConvShape, target: Target) -> float:
    """What a conv left to PyTorch costs in the model beyond its record's baseline: the pass
    over its fp16 output for the bias and ReLU that a fused kernel does in its epilogue (one
    kernel in a compiled model, more eager), its output read and written at the target's
    bandwidth plus POINTWISE_US; none for a layer with its residual (ConvShape.residual),
    whose baseline times PyTorch's add after the conv (kernels.cudnn.cudnn_baseline)."""
    if shape.residual:
        return 0.0
    out_bytes = shape.n * shape.p * shape.q * shape.k * 2
    return POINTWISE_US + 2 * out_bytes / (target.bandwidth_gbs * 1e3)


def keep_for_record(record: Record | None, precision: Precision, pass_us: float = 0.0) -> str:
    """Why a layer stays in PyTorch because of its record ('' where it is replaced): fp16
    whose tuned kernel is slower than cuDNN's conv (the record's baseline) with the pass
    PyTorch runs after it (`pass_us`: epilogue_pass_us); a record with no times but its
    speedup, slower than cuDNN's conv alone."""
    if record is None or precision is not Precision.FP16:
        return ""
    lat, base = record.latency_us, record.baseline_us
    if lat is not None and base is not None:
        if lat <= base + pass_us:
            return ""
        return (f"tuned kernel slower than its baseline with the pass after it ({lat:g} us > "
                f"{base:g} + {pass_us:.2g} us): PyTorch's conv kept")
    if not record.slower_than_baseline():
        return ""
    sp = f"{record.speedup:.3g}x" if record.speedup is not None else f"{lat:g} us > {base:g} us"
    return f"tuned kernel slower than its baseline ({sp}): PyTorch's conv kept"


def choose_schedule(shape: ConvShape, precision: Precision, target: Target,
                    record: Record | None, epilogue: Epilogue
                    ) -> tuple[dict[str, Any], str, bool, list[str]]:
    """(schedule, source, is_default, notes) for a layer and its fused epilogue. Raises
    ValueError when no schedule of the space is valid (the layer then stays in PyTorch)."""
    notes: list[str] = []
    if record is not None:
        sched = dict(record.schedule)
        if sched.get("LAYOUT") == "nhwcnc":
            flat = {**sched, "LAYOUT": "nhwc"}
            why = schedule_fits(shape, precision, target, flat, epilogue)
            if why is None:
                notes.append("tuned LAYOUT nhwcnc run as nhwc (activations stay NHWC)")
                return flat, record.source, False, notes
            notes.append(f"tuned nhwcnc schedule has no valid nhwc twin ({why})")
        else:
            why = schedule_fits(shape, precision, target, sched, epilogue)
            if why is None:
                return sched, record.source, False, notes
            notes.append(f"tuned schedule is not valid for this layer and its fused epilogue "
                         f"({why})")
    sched, src = default_schedule(shape, precision, target, epilogue)
    return sched, f"default: {src}", True, notes
