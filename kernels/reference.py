"""Reference convolution, layouts, int4 packing and the epilogue, in numpy (CPU, no GPU).

Integer precisions are exact: the accumulator is computed in float64 BLAS only when every
partial sum is provably below 2**53 (then float64 is exact for integer products and sums),
otherwise in int64. Float precisions are computed in float64.

fp32_tc: `fp32_tc_exponent`, `fp32_tc_split` and `fp32_tc_reconstruct` are the kernel's
per-tensor scaling and hi/lo split in numpy (kernels/instruction_tile.cuh does the same in
CUDA); `check_output` accepts an fp32_tc result whose error against the float64 reference
is within twice FP32's (see FP32_TC_* below).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kernels.space import NHWCNC_BATCH_BLOCK, channel_vector, padded_channels
from kernels.spec import ConvShape, Precision

INT_RANGE = {"int8": (-128, 127), "int4": (-8, 7)}


# ---- the convolution ---------------------------------------------------------------------
def im2col(x: np.ndarray, shape: ConvShape) -> np.ndarray:
    """x: [N][H][W][C] -> [N*P*Q][R*S*C] in (r, s, c) order, zeros where padded."""
    n, h, w, c = x.shape
    (sh, sw), (ph, pw), (dh, dw) = shape.stride, shape.pad, shape.dilation
    p, q = shape.p, shape.q
    xp = np.zeros((n, h + 2 * ph, w + 2 * pw, c), dtype=x.dtype)
    xp[:, ph:ph + h, pw:pw + w, :] = x
    cols = np.empty((n, p, q, shape.r, shape.s, c), dtype=x.dtype)
    for r in range(shape.r):
        for s in range(shape.s):
            hs, ws = r * dh, s * dw
            cols[:, :, :, r, s, :] = xp[:, hs:hs + sh * (p - 1) + 1:sh,
                                        ws:ws + sw * (q - 1) + 1:sw, :]
    return cols.reshape(n * p * q, shape.r * shape.s * c)


def conv_ref(x: np.ndarray, w: np.ndarray, shape: ConvShape, precision: Precision) -> np.ndarray:
    """x NHWC, w KRSC (real channels) -> accumulators NHWC [N][P][Q][K].

    int8/int4: exact int64. fp16/fp32_tc: float64.
    """
    p = Precision(precision)
    a = im2col(x, shape)
    b = w.reshape(shape.k, -1)
    if p.is_integer:
        bound = float(np.abs(a).max(initial=0)) * float(np.abs(b).max(initial=0)) * a.shape[1]
        if bound < 2.0**53:
            acc = np.rint(a.astype(np.float64) @ b.astype(np.float64).T).astype(np.int64)
        else:
            acc = a.astype(np.int64) @ b.astype(np.int64).T
    else:
        acc = a.astype(np.float64) @ b.astype(np.float64).T
    return acc.reshape(shape.n, shape.p, shape.q, shape.k)


def conv_naive(x: np.ndarray, w: np.ndarray, shape: ConvShape) -> np.ndarray:
    """The definition, loop by loop (slow; tests compare conv_ref with it on small shapes)."""
    (sh, sw), (ph, pw), (dh, dw) = shape.stride, shape.pad, shape.dilation
    integer = np.issubdtype(x.dtype, np.integer)
    out = np.zeros((shape.n, shape.p, shape.q, shape.k), dtype=np.int64 if integer else np.float64)
    xw = x.astype(np.int64 if integer else np.float64)
    ww = w.astype(np.int64 if integer else np.float64)
    for n in range(shape.n):
        for p in range(shape.p):
            for q in range(shape.q):
                for r in range(shape.r):
                    ih = p * sh - ph + r * dh
                    if not 0 <= ih < shape.h:
                        continue
                    for s in range(shape.s):
                        iw = q * sw - pw + s * dw
                        if not 0 <= iw < shape.w:
                            continue
                        out[n, p, q, :] += ww[:, r, s, :] @ xw[n, ih, iw, :]
    return out


# ---- the epilogue ------------------------------------------------------------------------
def requantize(acc: np.ndarray, scale: np.ndarray, bias: np.ndarray, bits: int,
               relu: bool, residual: np.ndarray | None = None,
               res_scale: float = 1.0) -> np.ndarray:
    """y = clamp(round(acc*scale[k] + bias[k] (+ residual*res_scale))) exactly as the kernel
    does it: float32 multiply, then float32 adds in that order (no FMA), round half to even,
    clamp to the signed range."""
    lo, hi = (-128, 127) if bits == 8 else (-8, 7)
    v = acc.astype(np.int32).astype(np.float32) * scale.astype(np.float32)
    v = v + bias.astype(np.float32)
    if residual is not None:
        v = v + residual.astype(np.float32) * np.float32(res_scale)
    v = np.clip(v, 0 if relu else lo, hi)
    return np.rint(v).astype(np.int64)


def fp_epilogue(acc: np.ndarray, bias: np.ndarray | None, relu: bool,
                residual: np.ndarray | None = None) -> np.ndarray:
    v = acc.astype(np.float64)
    if bias is not None:
        v = v + bias.astype(np.float64)
    if residual is not None:
        v = v + residual.astype(np.float64)
    return np.maximum(v, 0.0) if relu else v


# ---- int4 packing and layouts ------------------------------------------------------------
def pack_int4(v: np.ndarray) -> np.ndarray:
    """Last axis (even length) of values in [-8, 7] -> bytes, element 2i in the low nibble."""
    u = (v.astype(np.int64) & 0xF).astype(np.uint8)
    return (u[..., 0::2] | (u[..., 1::2] << 4)).astype(np.uint8)


def unpack_int4(b: np.ndarray) -> np.ndarray:
    """Inverse of pack_int4: bytes -> signed values, twice as many along the last axis."""
    b = b.astype(np.uint8)
    lo = (b & 0xF).astype(np.int8)
    hi = (b >> 4).astype(np.int8)
    out = np.empty(b.shape[:-1] + (2 * b.shape[-1],), dtype=np.int8)
    out[..., 0::2] = np.where(lo > 7, lo - 16, lo)
    out[..., 1::2] = np.where(hi > 7, hi - 16, hi)
    return out


def nhwc_to_nhwcnc(x: np.ndarray, c_vec: int) -> np.ndarray:
    """[N][H][W][C] -> [N/8][H][W][C/c][8][c] (any element type, c = elements per vector)."""
    n, h, w, c = x.shape
    nb = NHWCNC_BATCH_BLOCK
    if n % nb or c % c_vec:
        raise ValueError(f"NHWCnc needs N % {nb} == 0 and C % {c_vec} == 0, got {x.shape}")
    t = x.reshape(n // nb, nb, h, w, c // c_vec, c_vec)
    return np.ascontiguousarray(t.transpose(0, 2, 3, 4, 1, 5))


def nhwcnc_to_nhwc(x: np.ndarray) -> np.ndarray:
    """[N/8][H][W][C/c][8][c] -> [N][H][W][C]."""
    nb8, h, w, cb, nb, cv = x.shape
    return np.ascontiguousarray(x.transpose(0, 4, 1, 2, 3, 5)).reshape(nb8 * nb, h, w, cb * cv)


# ---- device byte images of the tensors the kernel reads and writes -----------------------
def pad_channels(x: np.ndarray, cp: int) -> np.ndarray:
    if x.shape[-1] == cp:
        return np.ascontiguousarray(x)
    out = np.zeros(x.shape[:-1] + (cp,), dtype=x.dtype)
    out[..., : x.shape[-1]] = x
    return out


def to_device_bytes(t: np.ndarray, precision: Precision, layout: str, c_vec: int) -> np.ndarray:
    """Values (NHWC or KRSC, channels already padded) -> the uint8 image the kernel reads."""
    p = Precision(precision)
    if p is Precision.FP16:
        v = t.astype(np.float16)
    elif p is Precision.FP32_TC:
        v = t.astype(np.float32)
    elif p is Precision.INT8 or p is Precision.INT4:
        v = t.astype(np.int8)
    else:
        raise ValueError(f"no device image for {p.value}")
    if layout == "nhwcnc":
        v = nhwc_to_nhwcnc(v, c_vec)
    if p is Precision.INT4:
        return pack_int4(v).reshape(-1)
    return np.ascontiguousarray(v).view(np.uint8).reshape(-1)


def device_values(buf: np.ndarray, out_bits: int, precision: Precision) -> np.ndarray:
    """The kernel's output bytes as its elements, in the buffer's order (int4: unpacked)."""
    if out_bits == 32:
        return buf.view(np.int32) if Precision(precision).is_integer else buf.view(np.float32)
    if out_bits == 16:
        return buf.view(np.float16)
    return buf.view(np.int8) if out_bits == 8 else unpack_int4(buf)


def from_device_output(buf: np.ndarray, shape: ConvShape, out_bits: int, precision: Precision,
                       layout: str) -> np.ndarray:
    """The kernel's output bytes -> NHWC values (int64 for integers, float64 for fp16)."""
    p = Precision(precision)
    n, pp, q, k = shape.n, shape.p, shape.q, shape.k
    v = device_values(buf, out_bits, p)
    if layout == "nhwcnc":
        cv = 128 // out_bits
        v = nhwcnc_to_nhwc(v.reshape(n // NHWCNC_BATCH_BLOCK, pp, q, k // cv,
                                     NHWCNC_BATCH_BLOCK, cv))
    v = v.reshape(n, pp, q, k)
    return v.astype(np.int64) if (p.is_integer and out_bits != 16) else v.astype(np.float64)


def output_bytes(shape: ConvShape, out_bits: int) -> int:
    return shape.n * shape.p * shape.q * shape.k * out_bits // 8


# ---- fp32_tc: per-tensor power-of-two scaling and the hi/lo split ------------------------
# The kernel scales each tensor by 2^e so that max|t| * 2^e lies in [2^13, 2^14): the hi
# part fp16(t * 2^e) cannot overflow (fp16 max 65504; karatsuba's hi+lo sums reach 2^15)
# and the lo part stays normal fp16 for values down to ~2^-28 of max|t|. The exponents are
# computed by the kernel itself from {amax_x, amax_w}, passed in the `scale` argument (the
# harness and the runtime compute max|x| and max|w|; any upper bounds work as well).
FP32_TC_TARGET_EXP = 14  # max|t| * 2^e < 2^14
FP32_TC_LO_SCALE = 2.0**11  # lo = fp16((t*2^e - hi) * 2^11)


def fp32_tc_exponent(amax: float) -> int:
    """e with amax * 2^e in [2^13, 2^14); 0 for amax 0, inf or NaN (kernel: tc_exp_for)."""
    a = float(amax)
    if not (a > 0.0 and np.isfinite(a)):
        return 0
    return FP32_TC_TARGET_EXP - int(np.frexp(np.float64(a))[1])


def fp32_tc_amax(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The kernel's `scale` argument for fp32_tc: float32 [max|x|, max|w|]."""
    return np.array([np.abs(x).max(initial=0.0), np.abs(w).max(initial=0.0)], dtype=np.float32)


def fp32_tc_split(t: np.ndarray, e: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 values -> (hi, lo) float16 with t * 2^e = hi + lo * 2^-11 (to ~2^-22).

    Exactly the kernel's arithmetic: the scaling is exact (a power of two, applied in two
    steps because |e| may exceed float32's exponent range), hi rounds to nearest, t - hi is
    exact in float32 and so is its product by 2^11; lo rounds to nearest."""
    e1, e2 = int(e / 2), e - int(e / 2)
    ts = (t.astype(np.float32) * np.float32(2.0**e1)) * np.float32(2.0**e2)
    hi = ts.astype(np.float16)
    lo = ((ts - hi.astype(np.float32)) * np.float32(FP32_TC_LO_SCALE)).astype(np.float16)
    return hi, lo


def fp32_tc_reconstruct(hi: np.ndarray, lo: np.ndarray, e: int) -> np.ndarray:
    """(hi + lo * 2^-11) * 2^-e in float64: the value the Tensor Core products see."""
    v = hi.astype(np.float64) + lo.astype(np.float64) / FP32_TC_LO_SCALE
    return np.ldexp(v, -e)


# The check of an fp32_tc result, derived from the goal "error <= 2x that of FP32": an FP32
# conv accumulating the K = R*S*C products one after another (FFMA, as each thread of an
# FP32 implicit-GEMM kernel does) has a relative L2 error of about 0.3 * u * sqrt(K) on
# uniform inputs (u = 2^-24; emulated in numpy for K = 64..8192: 0.30-0.31). The split
# itself resolves inputs to 2^-22 (22 significant bits), which is the floor at small K.
FP32_U = 2.0**-24
FP32_TC_SEQ_COEF = 0.3
FP32_TC_FLOOR = 2.0**-22
FP32_TC_GOAL_FACTOR = 2.0


def fp32_tc_rel_tol(gemm_k: int) -> float:
    """Relative L2 error an fp32_tc result may have: 2 x max(FP32 model, split floor)."""
    model = FP32_TC_SEQ_COEF * FP32_U * float(np.sqrt(max(gemm_k, 1)))
    return FP32_TC_GOAL_FACTOR * max(model, FP32_TC_FLOOR)


def fp32_tc_elem_tol(gemm_k: int) -> float:
    """Per element, relative to sum_i |x_i w_i|: twice the worst case of any FP32 summation
    order (K * u) plus the split's representation (2^-18 covers hi, lo and karatsuba's
    rounded sums). A guard against unwritten or misplaced outputs, not an accuracy goal."""
    return FP32_TC_GOAL_FACTOR * (max(gemm_k, 1) * FP32_U + 2.0**-18)


# ---- random problems ---------------------------------------------------------------------
@dataclass
class Problem:
    """Inputs of one check: values (NHWC / KRSC, real channels) and epilogue parameters."""

    shape: ConvShape
    precision: Precision
    x: np.ndarray
    w: np.ndarray
    scale: np.ndarray  # float32 [K] (fp32_tc: float32 [2] = max|x|, max|w|)
    bias: np.ndarray  # float32 [K]
    acc: np.ndarray  # reference accumulators NHWC (int64 or float64)
    abs_acc: np.ndarray | None = None  # fp32_tc: conv of |x| and |w| (per-element bound)
    x1: np.ndarray | None = None  # two inputs (shape.concat): x1 [N][P][Q][concat]
    _residual: tuple[np.ndarray, float] | None = field(default=None, repr=False)
    # Derived arrays (expected outputs, device bytes), computed once: every candidate of a
    # task is checked against the same ones.
    _memo: dict[tuple[Any, ...], Any] = field(default_factory=dict, repr=False)

    def expected(self, epilogue_mode: str, relu: bool, residual: bool = False) -> np.ndarray:
        """The output of an epilogue; `residual`: with `residual()` added (int8: scaled)."""
        key = ("expected", epilogue_mode, relu, residual)
        if key not in self._memo:
            out = self._expected(epilogue_mode, relu, residual)
            self._memo[key] = out if out is self.acc else _frozen(out)
        return self._memo[key]

    def _expected(self, epilogue_mode: str, relu: bool, residual: bool) -> np.ndarray:
        p = self.precision
        res, rs = self.residual() if residual else (None, 1.0)
        if p.is_integer:
            if epilogue_mode == "acc":
                return self.acc
            return requantize(self.acc, self.scale, self.bias, p.input_bits, relu, res, rs)
        return fp_epilogue(self.acc, self.bias if epilogue_mode == "bias" else None, relu, res)

    def expected_image(self, epilogue_mode: str, relu: bool, residual: bool, layout: str,
                       out_bits: int) -> np.ndarray | None:
        """`expected`, flat in the order of the kernel's output buffer (`layout`), for a check
        against `device_values` of that buffer with no conversion of it: 8-bit outputs as
        int8 (requantized values lie in its range), 16-bit as float64, 32-bit integers as
        int64. None for the others (int4, fp32 outputs, fp32_tc): they go through
        `from_device_output`."""
        p = self.precision
        if p is Precision.FP32_TC or out_bits not in (8, 16) and not (out_bits == 32 and
                                                                     p.is_integer):
            return None
        key = ("image", epilogue_mode, relu, residual, layout, out_bits)
        if key not in self._memo:
            v = self.expected(epilogue_mode, relu, residual)
            v = v.astype(np.int8) if out_bits == 8 else v.astype(
                np.float64 if out_bits == 16 else np.int64, copy=False)
            if layout == "nhwcnc":
                v = nhwc_to_nhwcnc(v, 128 // out_bits)
            self._memo[key] = _frozen(np.ascontiguousarray(v).reshape(-1))
        return self._memo[key]

    @property
    def nbytes(self) -> int:
        """Host memory the problem holds, its derived arrays included."""
        arrays = [self.x, self.w, self.scale, self.bias, self.acc, self.abs_acc, self.x1,
                  *(self._residual or ())[:1]]
        for v in self._memo.values():
            arrays += list(v) if isinstance(v, tuple) else [v]
        held = {id(a): a for a in arrays if isinstance(a, np.ndarray)}
        return sum(int(a.nbytes) for a in held.values())

    def residual(self) -> tuple[np.ndarray, float]:
        """A residual input of the output's shape and type (NHWC values) and its scale:
        int8 over the whole range with a scale that moves outputs by up to ~20 steps, fp16 in
        [-1, 1). Fixed per problem, as the inputs are."""
        if self._residual is None:
            rng = np.random.default_rng(shape_seed(self.shape, self.precision, salt=1))
            out = (self.shape.n, self.shape.p, self.shape.q, self.shape.k)
            if self.precision.is_integer:
                lo, hi = INT_RANGE[self.precision.value]
                self._residual = (rng.integers(lo, hi + 1, size=out, dtype=np.int8), 0.15625)
            else:
                self._residual = (rng.uniform(-1, 1, size=out).astype(np.float16), 1.0)
        return self._residual

    def device_inputs(self, layout: str, c_padded: int | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
        """(x bytes, w bytes) as the kernel reads them; weights are always KRSC. `c_padded`:
        the build's channel padding (launch metadata; FOLD_TAPS builds pad to a tap vector)."""
        cp = c_padded or padded_channels(self.shape, self.precision)
        key = ("device_inputs", layout, cp)
        if key not in self._memo:
            cv = channel_vector(self.precision)
            xb = to_device_bytes(pad_channels(self.x, cp - self.shape.concat), self.precision,
                                 layout, cv)
            wb = to_device_bytes(pad_channels(self.w, cp), self.precision, "nhwc", cv)
            self._memo[key] = (_frozen(xb), _frozen(wb))
        return self._memo[key]

    def b2b_ref(self, relu: bool, residual: bool, b2b_relu: bool) -> B2bRef:
        """The back-to-back conv of the layer (shape.b2b) over its output with this epilogue:
        its random weights and expected output (`make_b2b`), once."""
        key = ("b2b", relu, residual, b2b_relu)
        if key not in self._memo:
            self._memo[key] = make_b2b(self, self.shape.b2b, relu, residual, b2b_relu)
        return self._memo[key]

    def device_x1(self) -> np.ndarray:
        """x1's bytes (two inputs: its channels fill whole 16-byte vectors)."""
        assert self.x1 is not None
        return to_device_bytes(self.x1, self.precision, "nhwc", channel_vector(self.precision))


def _frozen(a: np.ndarray) -> np.ndarray:
    """A memoized array, read-only: a caller that wrote into it would change every later
    check of the task."""
    a.flags.writeable = False
    return a


def concat_equivalent(shape: ConvShape) -> ConvShape:
    """What a layer over two inputs (ConvShape.concat) computes: a 1x1, stride-1 layer at the
    output's resolution over all shape.c channels of concat(x1, x[:, ::stride_h, ::stride_w])."""
    return ConvShape(shape.n, shape.p, shape.q, shape.c, shape.k, 1, 1)


def split_concat(x_cat: np.ndarray, shape: ConvShape, seed: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(x1, x) of a layer over two inputs whose concatenation at the output's pixels is
    `x_cat` ([N][P][Q][C], NHWC): x1 its first shape.concat channels, x [N][H][W][C - concat]
    its other channels at the layer's stride and random values (of x_cat's) at the pixels
    between, which the layer must not read."""
    sh, sw = shape.stride
    concat = shape.concat
    x1 = np.ascontiguousarray(x_cat[..., :concat])
    rest = x_cat[..., concat:]
    rng = np.random.default_rng(seed)
    x = rng.choice(rest.reshape(-1), size=(shape.n, shape.h, shape.w, shape.c - concat))
    x[:, : shape.p * sh : sh, : shape.q * sw : sw] = rest
    return x1, np.ascontiguousarray(x)


def shape_seed(shape: ConvShape, precision: Precision, salt: int = 0) -> int:
    """A fixed seed per (shape, precision): the same inputs every time a layer is checked."""
    import hashlib

    h = hashlib.sha256(f"{shape.key()}|{Precision(precision).value}|{salt}".encode()).digest()
    return int.from_bytes(h[:8], "little")


def make_problem(shape: ConvShape, precision: Precision, seed: int | None = None) -> Problem:
    """Random inputs (never zeros) and the exact reference accumulators. A layer over two
    inputs (shape.concat) gets those of its one-input equivalent, split (split_concat)."""
    p = Precision(precision)
    if shape.concat:
        eq = make_problem(concat_equivalent(shape), p, seed)
        x1, x = split_concat(eq.x, shape, shape_seed(shape, p) if seed is None else seed)
        return Problem(shape, p, x, eq.w, eq.scale, eq.bias, eq.acc, x1=x1)
    rng = np.random.default_rng(shape_seed(shape, p) if seed is None else seed)
    xs = (shape.n, shape.h, shape.w, shape.c)
    ws = (shape.k, shape.r, shape.s, shape.c)
    if p.is_integer:
        lo, hi = INT_RANGE[p.value]
        x = rng.integers(lo, hi + 1, size=xs, dtype=np.int8)
        w = rng.integers(lo, hi + 1, size=ws, dtype=np.int8)
    elif p is Precision.FP32_TC:
        x = rng.uniform(-1, 1, size=xs).astype(np.float32)
        w = rng.uniform(-1, 1, size=ws).astype(np.float32)
    else:
        x = rng.uniform(-1, 1, size=xs).astype(np.float16)
        w = rng.uniform(-1, 1, size=ws).astype(np.float16)
    acc = conv_ref(x, w, shape, p)
    if p.is_integer:
        # Scale so that outputs spread over the range (a few saturate): the check then sees
        # every accumulator through a fine quantization step.
        qmax = INT_RANGE[p.value][1]
        std = acc.reshape(-1, shape.k).astype(np.float64).std(axis=0) + 1.0
        scale = (qmax * 0.4 / std * rng.uniform(0.8, 1.25, size=shape.k)).astype(np.float32)
        bias = rng.uniform(-0.3 * qmax, 0.3 * qmax, size=shape.k).astype(np.float32)
    elif p is Precision.FP32_TC:
        scale = fp32_tc_amax(x, w)
        bias = rng.uniform(-0.5, 0.5, size=shape.k).astype(np.float32)
        abs_acc = conv_ref(np.abs(x), np.abs(w), shape, p)
        return Problem(shape, p, x, w, scale, bias, acc, abs_acc)
    else:
        scale = np.ones(shape.k, dtype=np.float32)
        bias = rng.uniform(-0.5, 0.5, size=shape.k).astype(np.float32)
    return Problem(shape, p, x, w, scale, bias, acc)


@dataclass(frozen=True)
class B2bRef:
    """A back-to-back 1x1 conv over a layer's output (kernels/build.py: Epilogue.b2b): its
    inputs as the kernel reads them and its expected output."""

    w: np.ndarray  # [b2b][K] int8 / fp16 values
    scale: np.ndarray  # float32 [b2b] (fp16: ones, unused)
    bias: np.ndarray  # float32 [b2b]
    expected: np.ndarray  # NHWC [N][P][Q][b2b]: int64 (int8) or float64 (fp16)
    relu: bool  # the back-to-back conv's ReLU

    def device_weights(self) -> np.ndarray:
        return np.ascontiguousarray(self.w).reshape(-1).view(np.uint8)

    def over(self, y: np.ndarray) -> np.ndarray:
        """The expected output over the layer's output `y` as the kernel wrote it (check `y`
        first). fp16: the kernel reduces its own rounded output, which is one ulp off the
        reference's wherever fp32 and float64 sums round apart, and a 256-channel reduction
        of such ulps exceeds the output's tolerance; int8: `y` is exact, so `expected`."""
        if np.issubdtype(self.expected.dtype, np.integer):
            return self.expected
        return _fp16_b2b(y.reshape(-1, self.w.shape[1]), self.w, self.bias,
                         self.relu).reshape(self.expected.shape)


def _fp16_b2b(y: np.ndarray, w: np.ndarray, bias: np.ndarray, relu: bool) -> np.ndarray:
    """fp16 back-to-back output in float64 over rows `y` [M][K] (fp16 values)."""
    return fp_epilogue(y.astype(np.float64) @ w.astype(np.float64).T, bias, relu)


def make_b2b(prob: Problem, b2b: int, relu: bool, residual: bool, b2b_relu: bool,
             seed: int | None = None) -> B2bRef:
    """Random weights of a back-to-back conv of `b2b` output channels over the output of
    `prob`'s layer with its epilogue (int8 requant / fp16 bias, `relu`, `residual`), and its
    exact output: int8 reduced in integers and requantized as the kernel does, fp16 over the
    output rounded to fp16 (what the kernel stages), in float64."""
    p = prob.precision
    rng = np.random.default_rng(shape_seed(prob.shape, p, salt=2) if seed is None else seed)
    k = prob.shape.k
    if p is Precision.INT8:
        y = prob.expected("requant", relu, residual).reshape(-1, k)
        w = rng.integers(-128, 128, size=(b2b, k), dtype=np.int8)
        # float64 products and sums are exact here (|acc| < 2^53), and BLAS-fast
        acc = np.rint(y.astype(np.float64) @ w.astype(np.float64).T).astype(np.int64)
        std = acc.astype(np.float64).std(axis=0) + 1.0
        scale = (127 * 0.4 / std * rng.uniform(0.8, 1.25, size=b2b)).astype(np.float32)
        bias = rng.uniform(-38, 38, size=b2b).astype(np.float32)
        out = requantize(acc, scale, bias, 8, b2b_relu)
    elif p is Precision.FP16:
        y = prob.expected("bias", relu, residual).astype(np.float16).reshape(-1, k)
        w = rng.uniform(-1, 1, size=(b2b, k)).astype(np.float16)
        scale = np.ones(b2b, dtype=np.float32)
        bias = rng.uniform(-0.5, 0.5, size=b2b).astype(np.float32)
        out = _fp16_b2b(y, w, bias, b2b_relu)
    else:
        raise ValueError(f"a back-to-back conv is for int8 and fp16, not {p.value}")
    sh = prob.shape
    return B2bRef(w, scale, bias, out.reshape(sh.n, sh.p, sh.q, b2b), b2b_relu)


def check_output(got: np.ndarray, want: np.ndarray, precision: Precision,
                 out_bits: int, *, gemm_k: int | None = None,
                 abs_ref: np.ndarray | None = None) -> tuple[bool, dict[str, float]]:
    """Integers: exactly equal. fp16 outputs: relative L2 error within FP16_REL_TOL.
    fp32_tc (needs `gemm_k`, the reduction length R*S*C): relative L2 error within
    fp32_tc_rel_tol(gemm_k), and, given `abs_ref` (the conv of |x| and |w|), every element
    within fp32_tc_elem_tol(gemm_k) * abs_ref."""
    p = Precision(precision)
    if p.is_integer:
        bad = int(np.count_nonzero(got != want))
        return bad == 0, {"mismatches": bad, "elements": int(want.size)}
    if not np.all(np.isfinite(got)):
        return False, {"rel_err": float("inf")}
    if p is Precision.FP32_TC:
        if gemm_k is None:
            raise ValueError("fp32_tc checks need gemm_k (R*S*C)")
        d = got.astype(np.float64) - want
        rel = float(np.linalg.norm(d)) / (float(np.linalg.norm(want)) or 1.0)
        tol = fp32_tc_rel_tol(gemm_k)
        stats = {"rel_err": rel, "rel_tol": tol,
                 "max_abs_err": float(np.abs(d).max(initial=0.0))}
        ok = rel <= tol
        if abs_ref is not None:
            # abs_ref has no bias: |bias| adds one rounding of the output at most.
            bound = fp32_tc_elem_tol(gemm_k) * abs_ref + 2 * FP32_U * np.abs(want)
            bad = int(np.count_nonzero(np.abs(d) > bound))
            stats["bad_elements"] = bad
            ok = ok and bad == 0
        return ok, stats
    denom = float(np.linalg.norm(want)) or 1.0
    d = got - want
    rel = float(np.linalg.norm(d)) / denom
    # Per element: fp16 rounding of the output plus fp32 accumulation, scaled to the data.
    # (In place: on a model's largest outputs each temporary cost milliseconds.)
    scale = np.abs(want)
    scale += 1e-2 * (denom / np.sqrt(want.size))
    np.abs(d, out=d)
    d /= scale
    worst = float(np.max(d))
    return rel <= FP16_REL_TOL and worst <= FP16_ELEM_TOL, {"rel_err": rel, "worst_elem": worst}


# fp16 output rounding alone gives ~3e-4 relative; the accumulation is fp32.
FP16_REL_TOL = 2e-3
FP16_ELEM_TOL = 2e-2
