"""Domain types shared by every part of tctune: conv shapes, precisions and GPU targets.

This module is pure Python: it imports without a GPU, without CuPy and without the rest of
the project, so builders, the API and the search can all use it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

_KEY_RE = re.compile(r"n(\d+)_h(\d+)_w(\d+)_c(\d+)_k(\d+)_r(\d+)_s(\d+)_st(\d+)x(\d+)"
                     r"_p(\d+)x(\d+)_d(\d+)x(\d+)(?:_cat(\d+))?(_res)?(?:_b2b(\d+))?")


class Precision(StrEnum):
    """Operand precision of the convolution (what the Tensor Cores consume)."""

    FP16 = "fp16"  # fp16 in, fp32 accumulate, fp16 out
    INT8 = "int8"  # s8 in, s32 accumulate
    INT4 = "int4"  # s4 in (two per byte), s32 accumulate
    FP32_TC = "fp32_tc"  # fp32 in and out, FP32-level accuracy from FP16 Tensor Cores

    @property
    def input_bits(self) -> int:
        """Bits per element of the activations and weights in global memory."""
        return {"fp16": 16, "int8": 8, "int4": 4, "fp32_tc": 32}[self.value]

    @property
    def operand_bits(self) -> int:
        """Bits per element the Tensor Core instruction consumes."""
        return {"fp16": 16, "int8": 8, "int4": 4, "fp32_tc": 16}[self.value]

    @property
    def output_bits(self) -> int:
        """Bits per element of the tuned kernel's output (the requantized epilogue)."""
        return {"fp16": 16, "int8": 8, "int4": 4, "fp32_tc": 32}[self.value]

    @property
    def is_integer(self) -> bool:
        return self in (Precision.INT8, Precision.INT4)


@dataclass(frozen=True)
class Instruction:
    """One Tensor Core instruction tile: mma.sync.m{m}n{n}k{k}."""

    m: int
    n: int
    k: int
    # True where the hardware has no native unit and ptxas emulates the instruction.
    emulated: bool = False

    @property
    def name(self) -> str:
        return f"m{self.m}n{self.n}k{self.k}"


def instruction_shape(precision: Precision, sm: int) -> Instruction:
    """The mma.sync shape the kernel template uses for (precision, sm): the table of
    docs/design.md, "Instruction shapes"."""
    p = Precision(precision)
    if p in (Precision.FP16, Precision.FP32_TC):
        return Instruction(16, 8, 8) if sm < 80 else Instruction(16, 8, 16)
    if p is Precision.INT8:
        return Instruction(8, 8, 16) if sm < 80 else Instruction(16, 8, 32)
    if sm < 80:
        return Instruction(8, 8, 32)
    if sm >= 90:
        # No 4-bit unit on Hopper: ptxas emulates m16n8k64 (measured 3.5x slower than
        # unpacking s4 -> s8 into shared memory and running m16n8k32, which the kernel does).
        return Instruction(16, 8, 32)
    return Instruction(16, 8, 64)


@dataclass(frozen=True)
class Target:
    """A GPU model the service tunes for. Figures are datasheet values (dense Tensor Core)."""

    name: str  # lowercase key used in the API: "h200"
    model: str  # what the driver calls it: "NVIDIA H200"
    sm: int  # compute capability * 10
    sms: int
    boost_mhz: int
    mem_gib: float
    bandwidth_gbs: float
    l2_mib: float
    smem_per_sm_kib: int
    smem_per_block_kib: int  # opt-in maximum for one block
    max_threads_per_sm: int
    max_blocks_per_sm: int
    peak_tops: dict[str, float] = field(hash=False, compare=False)
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255

    @property
    def arch(self) -> str:
        return f"sm_{self.sm}"

    @property
    def measure_queue(self) -> str:
        return f"measure.{self.name}"

    def peak(self, precision: Precision) -> float:
        """Dense Tensor Core peak in TFLOP/s (TOPS for integers) for this precision."""
        return self.peak_tops[Precision(precision).value]


def _peaks(fp16: float, int8: float, int4: float) -> dict[str, float]:
    # fp32_tc runs on the fp16 units; the split costs 3-4 products per output (kernel side).
    return {"fp16": fp16, "int8": int8, "int4": int4, "fp32_tc": fp16}


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("t4", "Tesla T4", 75, 40, 1590, 15.0, 320, 4, 64, 64, 1024, 16,
               _peaks(65, 130, 260)),
        Target("a100", "NVIDIA A100", 80, 108, 1410, 80.0, 2039, 40, 164, 163, 2048, 32,
               _peaks(312, 624, 1248)),
        Target("a10", "NVIDIA A10", 86, 72, 1695, 24.0, 600, 6, 100, 99, 1536, 16,
               _peaks(125, 250, 500)),
        Target("l4", "NVIDIA L4", 89, 58, 2040, 24.0, 300, 48, 100, 99, 1536, 24,
               _peaks(121, 242, 485)),
        # Hopper: no 4-bit Tensor Core unit; int4 is unpacked to s8 and runs at the s8 rate.
        Target("h100", "NVIDIA H100", 90, 132, 1980, 80.0, 3350, 50, 228, 227, 2048, 32,
               _peaks(989, 1979, 1979)),
        Target("h200", "NVIDIA H200", 90, 132, 1980, 141.0, 4800, 60, 228, 227, 2048, 32,
               _peaks(989, 1979, 1979)),
    )
}


def get_target(name: str) -> Target:
    try:
        return TARGETS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; known: {', '.join(TARGETS)}") from None


def target_for_gpu_model(model: str) -> Target | None:
    """Map a driver's device name ('NVIDIA H100 80GB HBM3') to a known target."""
    low = model.lower()
    # Longest name first so that 'a100' is not taken for 'a10'.
    for t in sorted(TARGETS.values(), key=lambda t: -len(t.name)):
        if t.name in low.replace("tesla ", "").split() or low.startswith(t.model.lower()):
            return t
    for t in sorted(TARGETS.values(), key=lambda t: -len(t.name)):
        if t.name in low:
            return t
    return None


# Bounds that keep a request sane before it reaches a GPU. The kernel indexes with 32-bit
# integers, so no tensor may hold 2**31 elements or more.
MAX_BATCH = 4096
MAX_SPATIAL = 16384
MAX_CHANNELS = 65536
MAX_FILTER = 15
MAX_STRIDE = 8
MAX_DILATION = 8
MAX_ELEMENTS = 2**31 - 1


def pair(v: Any) -> tuple[int, int]:
    """PyTorch's int-or-pair size argument as a pair."""
    if isinstance(v, int):
        return (v, v)
    a, b = v
    return (int(a), int(b))


@dataclass(frozen=True)
class ConvShape:
    """A 2-D convolution layer, NHWC activations and KRSC weights, groups=1.

    `concat` > 0: a 1x1 unpadded layer over two inputs concatenated along the channels, the
    first `concat` of the c channels from x1 ([N][P][Q][concat], at the output's resolution)
    and the rest from x, read at the stride (a ResNet bottleneck's last conv and its
    projection shortcut as one GEMM). Its key ends in `_cat{concat}`; 0 changes nothing.

    `residual`: the layer's epilogue adds a tensor of the output's shape and type before its
    ReLU (a ResNet block's add; int8 and fp16, one input). It reads an output's worth of bytes
    more and stages them in shared memory, so it is a layer of its own to tune: deploy runs the
    conv before a block's add with it. Its key ends in `_res`.

    `b2b` > 0: the same kernel then runs a 1x1 conv of `b2b` output channels over the
    layer's output (kernels/b2b.cuh: a ResNet bottleneck's last conv and the next block's
    first), with weights [b2b][k]; a second output [N][P][Q][b2b]. Its tiles must cover all
    k output channels, so it is a layer of its own to tune. Its key ends in `_b2b{b2b}`.
    """

    n: int
    h: int
    w: int
    c: int
    k: int
    r: int
    s: int
    stride: tuple[int, int] = (1, 1)
    pad: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    concat: int = 0
    residual: bool = False
    b2b: int = 0

    def __post_init__(self) -> None:
        for name in ("stride", "pad", "dilation"):
            object.__setattr__(self, name, pair(getattr(self, name)))

    # Output extents.
    @property
    def p(self) -> int:
        span = self.dilation[0] * (self.r - 1) + 1
        return (self.h + 2 * self.pad[0] - span) // self.stride[0] + 1

    @property
    def q(self) -> int:
        span = self.dilation[1] * (self.s - 1) + 1
        return (self.w + 2 * self.pad[1] - span) // self.stride[1] + 1

    # Implicit GEMM view: M output pixels x N output channels, reduced over K = R*S*C.
    @property
    def gemm_m(self) -> int:
        return self.n * self.p * self.q

    @property
    def gemm_n(self) -> int:
        return self.k

    @property
    def gemm_k(self) -> int:
        return self.r * self.s * self.c

    @property
    def flops(self) -> int:
        """Multiply-adds counted as two operations (a back-to-back conv's too)."""
        return 2 * self.gemm_m * (self.gemm_n * self.gemm_k + self.b2b * self.k)

    def tensor_elements(self) -> dict[str, int]:
        """Elements of each tensor the layer reads or writes ("residual": 0 without one; a
        back-to-back conv's weights and output are counted with the weights and the output)."""
        out = self.n * self.p * self.q * self.k
        return {
            "input": self.n * self.h * self.w * (self.c - self.concat)
            + self.n * self.p * self.q * self.concat,
            "weight": self.k * self.r * self.s * self.c + self.b2b * self.k,
            "output": out + self.n * self.p * self.q * self.b2b,
            "residual": out if self.residual else 0,
        }

    def tensor_bytes(self, precision: Precision) -> int:
        """Bytes of input, weights, the residual (as wide as the output) and the widest
        output (int32/fp32) on the device."""
        el = self.tensor_elements()
        in_bits = Precision(precision).input_bits
        return (el["input"] + el["weight"]) * in_bits // 8 + \
            (el["output"] + el["residual"]) * 4

    def key(self) -> str:
        """Canonical, human-readable identity of the layer."""
        return (
            f"n{self.n}_h{self.h}_w{self.w}_c{self.c}_k{self.k}_r{self.r}_s{self.s}"
            f"_st{self.stride[0]}x{self.stride[1]}_p{self.pad[0]}x{self.pad[1]}"
            f"_d{self.dilation[0]}x{self.dilation[1]}"
            + (f"_cat{self.concat}" if self.concat else "")
            + ("_res" if self.residual else "")
            + (f"_b2b{self.b2b}" if self.b2b else "")
        )

    @classmethod
    def from_key(cls, key: str) -> ConvShape:
        """The shape whose `key()` this is."""
        m = _KEY_RE.fullmatch(key)
        if m is None:
            raise ValueError(f"not a layer key: {key!r}")
        *nums, cat, res, b2b = m.groups()
        v = [int(x) for x in nums]
        return cls(*v[:7], stride=(v[7], v[8]), pad=(v[9], v[10]), dilation=(v[11], v[12]),
                   concat=int(cat or 0), residual=res is not None, b2b=int(b2b or 0))

    def short_hash(self) -> str:
        return hashlib.sha256(self.key().encode()).hexdigest()[:10]

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n, "h": self.h, "w": self.w, "c": self.c, "k": self.k,
            "r": self.r, "s": self.s,
            "stride": list(self.stride), "pad": list(self.pad), "dilation": list(self.dilation),
            **({"concat": self.concat} if self.concat else {}),
            **({"residual": True} if self.residual else {}),
            **({"b2b": self.b2b} if self.b2b else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ConvShape:
        return cls(
            n=int(d["n"]), h=int(d["h"]), w=int(d["w"]), c=int(d["c"]), k=int(d["k"]),
            r=int(d["r"]), s=int(d["s"]),
            stride=pair(d.get("stride", (1, 1))), pad=pair(d.get("pad", (0, 0))),
            dilation=pair(d.get("dilation", (1, 1))), concat=int(d.get("concat", 0)),
            residual=bool(d.get("residual", False)), b2b=int(d.get("b2b", 0)),
        )

    def problems(self, precision: Precision | None = None,
                 target: Target | None = None) -> list[tuple[str, str]]:
        """Every reason this layer cannot be tuned, as (field, reason) pairs; empty if fine."""
        out: list[tuple[str, str]] = []
        limits = {"n": MAX_BATCH, "h": MAX_SPATIAL, "w": MAX_SPATIAL, "c": MAX_CHANNELS,
                  "k": MAX_CHANNELS, "r": MAX_FILTER, "s": MAX_FILTER}
        for name, hi in limits.items():
            v = getattr(self, name)
            if v < 1:
                out.append((name, f"must be a positive integer, got {v}"))
            elif v > hi:
                out.append((name, f"must be at most {hi}, got {v}"))
        for name, lo, hi in (("stride", 1, MAX_STRIDE), ("pad", 0, MAX_FILTER),
                             ("dilation", 1, MAX_DILATION)):
            for v in getattr(self, name):
                if not lo <= v <= hi:
                    out.append((name, f"each value must be between {lo} and {hi}, got {v}"))
                    break
        if self.groups != 1:
            out.append(("groups", "only groups=1 is supported"))
        # Two inputs and a residual are paths of the int8 and fp16 kernels only.
        other = None if precision is None or \
            Precision(precision) in (Precision.INT8, Precision.FP16) else Precision(precision).value
        if self.concat:
            if not 0 < self.concat < self.c:
                out.append(("concat", f"must be between 0 and c ({self.c}), got {self.concat}"))
            elif (self.r, self.s, self.pad, self.dilation) != (1, 1, (0, 0), (1, 1)):
                out.append(("concat", "two inputs are for 1x1 layers without padding or "
                                      "dilation"))
            elif other:
                out.append(("concat", f"two inputs are for int8 and fp16, not {other}"))
        if self.b2b:
            if self.b2b < 0 or self.b2b % 8 or self.b2b > MAX_CHANNELS:
                out.append(("b2b", f"the back-to-back conv's output channels must be a multiple "
                                     f"of 8 up to {MAX_CHANNELS}, got {self.b2b}"))
            elif other:
                out.append(("b2b", f"a back-to-back conv follows the int8 and fp16 epilogues, not "
                                     f"{other}'s"))
        if self.residual:
            if self.concat:
                out.append(("residual", "a layer over two inputs adds its shortcut itself "
                                        "(concat): no residual"))
            elif other:
                out.append(("residual", "a residual is added by the int8 and fp16 epilogues, "
                                        f"not {other}'s"))
        if out:
            return out
        if self.p < 1 or self.q < 1:
            out.append(("shape", "the filter does not fit the padded input: "
                                 f"output {self.p}x{self.q}"))
            return out
        for tensor, count in self.tensor_elements().items():
            if count > MAX_ELEMENTS:
                out.append(("shape", f"the {tensor} tensor has {count} elements; "
                                     f"the kernel indexes with 32-bit integers (< 2^31)"))
        if precision is not None:
            p = Precision(precision)
            if p is Precision.INT4:
                for name in ("c", "k"):
                    if getattr(self, name) % 2:
                        out.append((name, "int4 packs two channels per byte: must be even, "
                                          f"got {getattr(self, name)}"))
            if target is not None:
                need = self.tensor_bytes(p)
                have = int(target.mem_gib * 0.9 * 2**30)
                if need > have:
                    out.append(("shape", f"the layer needs {need / 2**30:.1f} GiB of tensors; "
                                         f"{target.name} has {target.mem_gib:g} GiB"))
        return out

    def b2b_parts(self) -> tuple[ConvShape, ConvShape]:
        """The two layers a layer with a back-to-back conv replaces: itself without it, and
        the 1x1 conv of `b2b` output channels over its output."""
        return (replace(self, b2b=0), ConvShape(self.n, self.p, self.q, self.k, self.b2b, 1, 1))

    def concat_parts(self) -> tuple[ConvShape, ConvShape]:
        """The two one-input 1x1 layers a layer over two inputs replaces: x1's (stride 1, at
        the output's resolution) and x's (at the layer's stride)."""
        return (ConvShape(self.n, self.p, self.q, self.concat, self.k, 1, 1),
                ConvShape(self.n, self.h, self.w, self.c - self.concat, self.k, 1, 1,
                          stride=self.stride))


def two_input_shape(last: ConvShape, projection: ConvShape) -> ConvShape | None:
    """The layer over two inputs that a 1x1 stride-1 conv (a ResNet bottleneck's last) and a
    1x1 conv whose output it is added to (the projection shortcut) are together: the
    projection's input and stride, both layers' channels, `concat` the last conv's. None
    where they are not one GEMM (a filter, padding, dilation or stride of the last, unequal
    outputs). Planning (api.plan) and the rewrite (deploy) share this rule and its key."""
    plain = all((s.r, s.s, s.pad, s.dilation, s.groups) == (1, 1, (0, 0), (1, 1), 1)
                for s in (last, projection))
    if not (plain and last.stride == (1, 1) and last.k == projection.k
            and (last.n, last.h, last.w) == (projection.n, projection.p, projection.q)):
        return None
    return ConvShape(projection.n, projection.h, projection.w, last.c + projection.c,
                     projection.k, 1, 1, stride=projection.stride, concat=last.c)


def pair_channels(shape: ConvShape, precision: Precision | str) -> int | None:
    """The channels a pixel is padded to for a layer over pixel pairs (`pixel_pairs`): 4 or
    8, so that a pair is one 8- or 16-byte word of int8 or fp16; None for more channels
    (its taps are whole vectors already) and other precisions."""
    size = {Precision.INT8: 1, Precision.FP16: 2}.get(Precision(precision))  # not int4
    if size is None:
        return None
    return next((c for c in (4, 8) if shape.c <= c and 2 * c * size <= 16), None)


def pixel_pairs(shape: ConvShape, channels: int) -> tuple[ConvShape, int, int] | None:
    """The layer over pixel pairs: a conv of stride 2 in width over an input of `channels`
    channels a pixel (a stem's few, padded to a word) is a conv of stride 1 in width over
    the same bytes seen as half as many pixels of twice the channels, once each row has
    `left` zero pixels before it and `right` after it (its pairs: pixels 2k - left and
    2k + 1 - left). Filter tap s of the layer is tap s // 2 of the pair's half s % 2, so
    the pair layer has ceil(S / 2) taps of twice the channels, and padding (PW - left) / 2
    with left = PW % 2; the right zeros make its output as wide as the layer's. A stem
    then reads whole 8- or 16-byte pairs of taps, half as many as its 4- or 8-byte taps.
    Returns (the pair layer, left, right), or None where the layer is not such a conv
    (stride 2 and undilated in width, one input, no epilogue reads)."""
    if shape.stride[1] != 2 or shape.dilation[1] != 1 or shape.groups != 1 or shape.concat \
            or shape.residual or shape.b2b or channels < shape.c:
        return None
    left = shape.pad[1] % 2
    pw, taps = (shape.pad[1] - left) // 2, (shape.s + 1) // 2
    pairs = shape.q - 1 - 2 * pw + taps
    right = 2 * pairs - shape.w - left
    if right < 0:
        return None
    paired = ConvShape(shape.n, shape.h, pairs, 2 * channels, shape.k, shape.r, taps,
                       stride=(shape.stride[0], 1), pad=(shape.pad[0], pw),
                       dilation=(shape.dilation[0], 1))
    return paired, left, right


def pair_layer(shape: ConvShape, precision: Precision | str
               ) -> tuple[ConvShape, tuple[int, int, int]] | None:
    """The layer over pixel pairs that `shape` may run as (`pixel_pairs` over the input
    padded to `pair_channels`), with (channels, left, right); None where it may not."""
    channels = pair_channels(shape, precision)
    paired = pixel_pairs(shape, channels) if channels else None
    return None if paired is None else (paired[0], (channels, paired[1], paired[2]))


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def gemm_distance(a: ConvShape, b: ConvShape) -> float:
    """How far apart two layers' implicit GEMMs are: octaves of M, N and K, summed."""
    return sum(abs(math.log2(x) - math.log2(y)) for x, y in
               ((a.gemm_m, b.gemm_m), (a.gemm_n, b.gemm_n), (a.gemm_k, b.gemm_k)))


def task_key(shape: ConvShape, precision: Precision, target: Target) -> str:
    """Identity of a tuning task: one best schedule is kept per key."""
    return f"{shape.key()}|{Precision(precision).value}|{target.name}"


# ResNet-50's 3x3 layers (the paper's table 1), at batch 8. The paper: Choi, Kwon, Lee, Choi and
# Lim, "Learning from Distinctive Candidates to Optimize Reduced-Precision Convolution Program
# on Tensor Cores", 2022 (docs/design.md, "Sources").
RESNET50_3X3 = {
    "stage2": ConvShape(8, 56, 56, 64, 64, 3, 3, pad=(1, 1)),
    "stage3": ConvShape(8, 28, 28, 128, 128, 3, 3, pad=(1, 1)),
    "stage4": ConvShape(8, 14, 14, 256, 256, 3, 3, pad=(1, 1)),
    "stage5": ConvShape(8, 7, 7, 512, 512, 3, 3, pad=(1, 1)),
}
