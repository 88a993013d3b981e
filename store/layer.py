"""The one validation of a conv layer (shape, precision, target) that every input path
shares: the API's request bodies and queries, and the JSON lines of POST /import."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    WithJsonSchema,
)

from kernels.spec import (
    MAX_BATCH,
    MAX_CHANNELS,
    MAX_DILATION,
    MAX_FILTER,
    MAX_SPATIAL,
    MAX_STRIDE,
    TARGETS,
    ConvShape,
    Precision,
)


def _as_pair(v: Any) -> Any:
    return [v, v] if isinstance(v, int) and not isinstance(v, bool) else v


def documented(lo: int, hi: int) -> Any:
    """Bounds shown in the schema but checked by ConvShape.problems, whose messages say which
    field and why (and which also checks what a schema cannot: the layer as a whole)."""
    return Field(json_schema_extra={"minimum": lo, "maximum": hi})


def _pair_schema(lo: int, hi: int) -> WithJsonSchema:
    one = {"type": "integer", "minimum": lo, "maximum": hi}
    return WithJsonSchema({"anyOf": [one, {"type": "array", "items": one,
                                           "minItems": 2, "maxItems": 2}]})


Batch = Annotated[StrictInt, documented(1, MAX_BATCH)]
Spatial = Annotated[StrictInt, documented(1, MAX_SPATIAL)]
Channels = Annotated[StrictInt, documented(1, MAX_CHANNELS)]
Filter = Annotated[StrictInt, documented(1, MAX_FILTER)]
# Two inputs (ConvShape.concat): the first `concat` of c channels from a second input at the
# output's resolution; 0 (the default) for one.
Concat = Annotated[StrictInt, Field(
    description="1x1 layers over two inputs: the first input's channels, at the output's "
                "resolution; 0: one input", json_schema_extra={"minimum": 0,
                                                              "maximum": MAX_CHANNELS})]
# The epilogue adds a tensor of the output's shape (ConvShape.residual); a layer of its own.
RESIDUAL_DOC = ("the layer adds a tensor of its output's shape and type in its epilogue, "
                "before the ReLU (a ResNet block's add; int8 and fp16, one input)")
Residual = Annotated[StrictBool, Field(description=RESIDUAL_DOC)]
# The kernel also runs a 1x1 conv of this many output channels over the output
# (ConvShape.b2b); a layer of its own.
B2B_DOC = ("the kernel also runs a 1x1 conv of this many output channels (a multiple of 8) over "
           "the layer's output, back to back (a ResNet bottleneck's last conv and the next "
           "block's first; int8 and fp16); 0: none")
B2b = Annotated[StrictInt, Field(description=B2B_DOC), documented(0, MAX_CHANNELS)]
# One int for both axes, or [vertical, horizontal].
Pair = Annotated[list[StrictInt], Field(min_length=2, max_length=2), BeforeValidator(_as_pair)]
Stride = Annotated[Pair, _pair_schema(1, MAX_STRIDE)]
Padding = Annotated[Pair, _pair_schema(0, MAX_FILTER)]
Dilation = Annotated[Pair, _pair_schema(1, MAX_DILATION)]


def any_case(names: Iterable[str]) -> str:
    """A JSON Schema pattern accepting `names` in any case (JSON Schema has no flags)."""
    return "^(" + "|".join("".join(f"[{ch}{ch.upper()}]" if ch.isalpha() else ch
                                   for ch in name) for name in names) + ")$"


# One rule for every input path (bodies, queries, import lines): names of targets and
# precisions are case-insensitive and stored lowercased; an unknown one is a 422.
TARGET_PATTERN = any_case(TARGETS)
PRECISIONS = tuple(p.value for p in Precision)
PRECISION_PATTERN = any_case(PRECISIONS)


def known_target(v: str) -> str:
    if v.lower() not in TARGETS:
        raise ValueError(f"unknown target {v!r}; known: {', '.join(TARGETS)}")
    return v.lower()


def known_precision(v: str) -> Precision:
    if v.lower() not in PRECISIONS:
        raise ValueError(f"unknown precision {v!r}; known: {', '.join(PRECISIONS)}")
    return Precision(v.lower())


# A GPU model the service knows, case-insensitive, lowercased once validated.
TargetName = Annotated[str, Field(max_length=32, description=f"one of {', '.join(TARGETS)}",
                                  json_schema_extra={"pattern": TARGET_PATTERN}),
                       AfterValidator(known_target)]
# A precision, case-insensitive; a Precision once validated.
PrecisionName = Annotated[str, Field(max_length=16,
                                     description=f"one of {', '.join(PRECISIONS)}",
                                     json_schema_extra={"pattern": PRECISION_PATTERN}),
                          AfterValidator(known_precision)]


class ShapeIn(BaseModel):
    """A conv layer. Integers only; stride/pad/dilation as one int or [vertical, horizontal]."""

    model_config = ConfigDict(extra="forbid")
    n: Batch
    h: Spatial
    w: Spatial
    c: Channels
    k: Channels
    r: Filter
    s: Filter
    stride: Stride = [1, 1]
    pad: Padding = [0, 0]
    dilation: Dilation = [1, 1]
    concat: Concat = 0
    residual: Residual = False
    b2b: B2b = 0

    def to_shape(self) -> ConvShape:
        return ConvShape.from_dict(self.model_dump())


class LayerIn(BaseModel):
    """A layer to tune or look up: its shape, precision and target GPU."""

    model_config = ConfigDict(extra="forbid")
    shape: ShapeIn
    precision: PrecisionName
    target: TargetName

    def problems(self) -> list[tuple[str, str]]:
        """What the schema cannot check: the layer as a whole on its target (field, why)."""
        return self.shape.to_shape().problems(Precision(self.precision), TARGETS[self.target])
