"""The modules of an optimized model: fused conv layers, the conversions at the edges of the
kernel's domain, and the model that holds them with its plan.

Tensors keep PyTorch's logical NCHW shape in channels_last memory, which is the kernel's NHWC
storage: `t.permute(0, 2, 3, 1)` of a channels_last tensor is the contiguous NHWC tensor the
runtime takes (no copy), and the runtime's NHWC output permuted back is channels_last. So
consecutive fused convs hand their outputs on without a layout change, and PyTorch ops in
between (pooling, adds) keep channels_last.

Two executors run a `FusedConv`:
  "cuda"       kernels.runtime.Conv2d, the tuned kernel (CUDA tensors; CuPy needed);
  "reference"  the same math with torch ops on any device: the exact integer accumulation
               (a float64 conv of int8 values, exact below 2**53) and the kernel epilogue's
               float32 steps in its order, so int8 outputs equal the kernel's bit for bit;
               fp16 accumulates in float64 rounded to float32 once (the kernel sums in
               float32), then the epilogue's float32 steps and the fp16 rounding.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import fx, nn

from deploy import calibrate, torch_op
from deploy.pairs import pair_pixels
from deploy.plan import LayerPlan
from kernels.build import Epilogue
from kernels.linear import LinearShape
from kernels.pool import GlobalPoolShape, PoolShape
from kernels.quantize import QuantizeShape
from kernels.runtime import schedule_fits
from kernels.spec import ConvShape, Precision, Target, task_key

BACKENDS = ("cuda", "reference")
_ALIGN = 16  # the runtime reads 16-byte vectors: tensors must start on such a boundary


def _f32(v: float) -> float:
    """v rounded to float32, as the kernel receives a float argument."""
    return float(np.float32(v))


def nhwc_view(t: torch.Tensor) -> torch.Tensor:
    """A [N][C][H][W] tensor as the contiguous NHWC [N][H][W][C] tensor the runtime takes:
    a view where it already is channels_last (the case between fused layers), else a copy."""
    v = t.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1)
    if not v.is_contiguous() or v.data_ptr() % _ALIGN:
        v = v.contiguous().clone()
    return v


def _to_blocked(t: torch.Tensor, vector: int) -> torch.Tensor:
    """NHWC [N][H][W][C] -> NHWCnc [N/8][H][W][C/v][8][v] (a residual of an NHWCnc op)."""
    n, h, w, c = (int(v) for v in t.shape)
    return t.reshape(n // 8, 8, h, w, c // vector, vector).permute(0, 2, 3, 4, 1, 5).contiguous()


class FusedConv(nn.Module):
    """conv (+ folded BN) (+ residual) (+ ReLU) as one tctune kernel call.

    With shape.concat = n > 0 the layer is a 1x1 conv over two inputs, forward(x, x1=x1):
    x1's n channels at the output's resolution, then x's at the layer's stride (a ResNet
    bottleneck's last conv and its projection shortcut, whose sum is one GEMM over both
    inputs: kernels.spec.ConvShape's `concat`). The weight's first n input channels are
    x1's. int8: the two parts' weights are quantized at one scale per output channel, so that
    one accumulator sums both (`set_scales`).

    Buffers: `weight` KCRS (int8 quantized per output channel, or fp16), `bias` float32 [K]
    (the epilogue's), and for int8 `scale` float32 [K] and the per-channel `weight_scale`
    (float64), with `res_scale` a float: the requant epilogue then computes
    y = clamp(round(acc*scale[k] + bias[k] + residual*res_scale)) with
    scale[k] = s_in * s_w[k] / s_out, bias[k] = b[k] / s_out, res_scale = s_res / s_out
    (`set_scales`). fp16: y = fp16(acc + bias[k] (+ residual)), ReLU before the rounding.

    `take_b2b(second)`: the layer's kernel also runs `second`, a 1x1 layer over its output,
    back to back (kernels.spec.ConvShape's `b2b`); forward then returns (y, y2), y2 second's
    output (its weights, bias, ReLU and, int8, its own requantize: `set_b2b_scale`).

    `pairs` (channels, left, right): the layer runs over pixel pairs (kernels.spec.pixel_pairs,
    deploy/pairs.py): `weight` and `shape` are the pair layer's, and an input of the original
    layer's few channels is padded to `channels` and paired by torch ops in forward (on the
    GPU the model's input quantize writes the pairs itself: Quantize.take_channels).
    """

    def __init__(self, layer: LayerPlan, precision: Precision, weight: torch.Tensor,
                 bias: torch.Tensor, shape: ConvShape, *, relu: bool, residual: bool,
                 backend: str, target: Target, schedule: dict[str, Any],
                 pdl: bool = False, cache_dir: str | Path | None = None,
                 pairs: tuple[int, int, int] | None = None) -> None:
        super().__init__()
        self.pairs = pairs
        self.concat = shape.concat
        self.shape = shape  # as planned (its residual read is the epilogue's)
        self.planned_x_shape: tuple[int, ...] | None = None  # set by take_planned_input
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.layer = layer
        self.precision = Precision(precision)
        self.stride, self.padding, self.dilation = shape.stride, shape.pad, shape.dilation
        self.out_channels = int(weight.shape[0])
        self.relu, self.residual = relu, residual
        self.backend, self.target = backend, target
        self.schedule, self.cache_dir, self.pdl = dict(schedule), cache_dir, pdl
        self.epilogue = Epilogue("default", relu, residual).resolved(self.precision)
        self.b2b, self.b2b_relu = 0, False  # take_b2b
        self.residual_ready = self.x_ready = False  # set_ready
        self.b2b_out_scale: float | None = None
        self.res_scale: float | None = None
        if self.precision is Precision.INT8:
            if self.concat:  # quantized at set_scales, with the inputs' scales
                self.register_buffer("weight_real", weight.to(torch.float64))
            ws = calibrate.weight_scales(weight)
            self.register_buffer("weight", calibrate.quantize_weight(weight, ws))
            self.register_buffer("weight_scale", ws)
            self.register_buffer("bias_real", bias.to(torch.float64))
            self.register_buffer("scale", torch.zeros(self.out_channels, dtype=torch.float32,
                                                      device=weight.device))
            self.register_buffer("bias", torch.zeros_like(self.scale))
            self.calibrated = False
            layer.weight_scale_range = (float(ws.min()), float(ws.max()))
        else:
            self.register_buffer("weight", weight.to(torch.float16))
            self.register_buffer("bias", bias.to(torch.float32))
            self.calibrated = True
        self.out_dtype = torch.int8 if self.precision is Precision.INT8 else torch.float16
        self.in_channels = int(weight.shape[1])  # with concat: x1's and x's
        self.x_channels = self.in_channels - self.concat
        # The kernel's channel count for x (set_input_channels): a narrower input is
        # zero-padded by torch ops in forward, which a compiled model fuses into the op that
        # produces the input, instead of a copy inside the kernel call.
        self.input_channels = self.x_channels
        self._ops: dict[ConvShape, Any] = {}
        self._weights: dict[tuple[str, str], torch.Tensor] = {}
        self.uid = torch_op.register(self)

    def set_scales(self, in_scale: float, out_scale: float,
                   residual_scale: float | None = None, x1_scale: float | None = None) -> None:
        """int8: the epilogue's scale, bias and residual scale from the activation scales of
        the input (and x1), the output and the residual (computed in float64, stored as
        float32)."""
        if self.precision is not Precision.INT8:
            raise ValueError("scales are for int8 layers")
        if (residual_scale is None) == self.residual:
            raise ValueError("residual_scale is needed exactly when the layer adds a residual")
        if (x1_scale is None) == bool(self.concat):
            raise ValueError("x1_scale is needed exactly when the layer reads two inputs")
        for v in (in_scale, out_scale, residual_scale or 1.0, x1_scale or 1.0):
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"activation scales must be positive and finite, got {v}")
        if self.concat:
            # acc = x1q*w1q + xq*wq needs x1_scale * s_w1[k] == in_scale * s_w[k]: both parts
            # at the larger of the two products per channel (neither part clips), as weights
            # of the scale that product divided by their input's scale.
            n = self.concat
            w1, w2 = self.weight_real[:, :n], self.weight_real[:, n:]
            t = torch.maximum(x1_scale * calibrate.weight_scales(w1),
                              in_scale * calibrate.weight_scales(w2))
            self.weight.copy_(torch.cat([calibrate.quantize_weight(w1, t / x1_scale),
                                         calibrate.quantize_weight(w2, t / in_scale)], dim=1))
            self.weight_scale.copy_(t / in_scale)
            self._weights.clear()  # the kernel's copies of the old weights
        self.scale.copy_((in_scale * self.weight_scale / out_scale).to(torch.float32))
        self.bias.copy_((self.bias_real / out_scale).to(torch.float32))
        self.res_scale = None if residual_scale is None else _f32(residual_scale / out_scale)
        self.calibrated = not self.b2b  # then set_b2b_scale
        self.layer.in_scale, self.layer.out_scale = in_scale, out_scale
        self.layer.x1_scale = x1_scale
        self.layer.residual_scale = residual_scale

    def shape_for(self, x_shape: tuple[int, ...] | torch.Size) -> ConvShape:
        """The layer's shape for inputs of this NCHW shape (zero channels past the layer's own
        count, `input_channels`, are not the layer's)."""
        n, c, h, w = (int(v) for v in x_shape)
        if self.pairs and c != self.in_channels:  # the original layer's input
            w = (w + self.pairs[1] + self.pairs[2]) // 2
        _, _, r, s = self.weight.shape
        return ConvShape(n, h, w, self.in_channels, self.out_channels, int(r), int(s),
                         stride=self.stride, pad=self.padding, dilation=self.dilation,
                         concat=self.concat, b2b=self.b2b)

    def set_input_channels(self, channels: int) -> None:
        """Take inputs padded with zero channels to `channels` (the kernel's padded count,
        `op.padded_channels`); forward pads narrower ones."""
        if channels < self.x_channels:
            raise ValueError(f"{self.layer.name}: {channels} input channels is fewer than the "
                             f"layer's {self.x_channels}")
        self.input_channels = int(channels)

    def record_key(self) -> str:
        """The task key of the record this layer's schedule answers to (kernels.spec.task_key;
        the layers of one model that share it share their schedule)."""
        return task_key(replace(self.shape, residual=self.residual, b2b=self.b2b),
                        self.precision, self.target)

    def take_b2b(self, second: FusedConv, schedule: dict[str, Any], source: str) -> None:
        """Run `second` (a 1x1, stride-1, unpadded layer of one input over this layer's
        output) in this layer's kernel from now on, on `schedule` (the record of the layer
        with it: ConvShape.b2b). Raises ValueError, the layer unchanged, where it cannot."""
        sh = second.shape
        if (sh.r, sh.s, sh.stride, sh.pad, sh.concat, second.residual) != \
                (1, 1, (1, 1), (0, 0), 0, False) or second.in_channels != self.out_channels \
                or second.precision is not self.precision:
            raise ValueError(f"{second.layer.name} is no 1x1 layer over {self.layer.name}'s "
                             "output alone")
        n2 = second.out_channels
        kept = self.b2b, self.b2b_relu, self.epilogue, self.shape
        self.b2b, self.b2b_relu = n2, second.relu
        self.epilogue = replace(self.epilogue, b2b=n2, b2b_relu=second.relu).resolved(
            self.precision)
        self.shape = replace(self.shape, b2b=n2)
        try:  # valid for the layer with it, built for the planned input, reading its channels
            self.set_schedule(schedule, source)
        except ValueError as exc:
            self.b2b, self.b2b_relu, self.epilogue, self.shape = kept
            why = str(exc).removeprefix(f"{self.layer.name}: ")
            raise ValueError(f"{self.layer.name} with {second.layer.name}: {why}") from None
        self.register_buffer("b2b_weight", second.weight.reshape(n2, -1).clone())
        if self.precision is Precision.INT8:  # requantized by set_b2b_scale
            self.register_buffer("b2b_weight_scale", second.weight_scale.clone())
            self.register_buffer("b2b_bias_real", second.bias_real.clone())
            self.register_buffer("b2b_scale", torch.zeros_like(second.scale))
            self.register_buffer("b2b_bias", torch.zeros_like(second.bias))
            self.calibrated = False
        else:
            self.register_buffer("b2b_bias", second.bias.clone())

    def set_b2b_scale(self, out_scale: float) -> None:
        """int8: the back-to-back conv's requantize from its output's activation scale (its
        input's is this layer's output scale: `set_scales` first)."""
        if self.precision is not Precision.INT8 or not self.b2b:
            raise ValueError("a back-to-back scale is for int8 layers that run one")
        if not (math.isfinite(out_scale) and out_scale > 0) or self.layer.out_scale is None:
            raise ValueError(f"{self.layer.name}: set_scales first, and a positive finite "
                             f"scale (got {out_scale})")
        self.b2b_scale.copy_((self.layer.out_scale * self.b2b_weight_scale / out_scale)
                             .to(torch.float32))
        self.b2b_bias.copy_((self.b2b_bias_real / out_scale).to(torch.float32))
        self.b2b_out_scale = out_scale
        self.calibrated = True

    def set_ready(self, residual: bool, x: bool) -> None:
        """Which inputs were complete before the kernel just before this layer's on the stream
        started (their writers ran before that one: deploy.optimize's `_ready_inputs`): the
        residual, and of a layer over two inputs x (not x1), so that with PDL the kernel reads
        them while it waits for that kernel (kernels.runtime.Conv2d's `residual_ready`,
        `x_ready`)."""
        ready = (bool(residual) and self.residual, bool(x) and self.concat > 0)
        if ready != (self.residual_ready, self.x_ready):
            self.residual_ready, self.x_ready = ready
            self._ops = {}  # rebuilt (from the build cache) with them

    # ---- the kernel --------------------------------------------------------------------
    def take_planned_input(self, x_shape: tuple[int, ...] | torch.Size) -> None:
        """Build the op for the planned input (NCHW shape) and take x padded to the channels
        its kernel reads (set_input_channels)."""
        self.planned_x_shape = tuple(int(v) for v in x_shape)
        op = self.build(self.planned_x_shape)
        self.set_input_channels(op.padded_channels - self.concat)

    def set_schedule(self, schedule: dict[str, Any], source: str) -> None:
        """Run another schedule from now on (deploy.model_select), built for the planned input.
        Raises ValueError, the layer unchanged, where it is not valid for the layer and its
        fused epilogue, or would read its input padded to another channel count (the op
        before writes that count)."""
        why = schedule_fits(self.shape, self.precision, self.target, schedule, self.epilogue)
        if why is not None:
            raise ValueError(f"{self.layer.name}: {why}")
        kept = self.schedule, self._ops, self._weights, self.layer.schedule_source
        self.schedule, self.layer.schedule_source = dict(schedule), source
        self._ops, self._weights = {}, {}
        if self.planned_x_shape is not None:
            op = self.build(self.planned_x_shape)
            if op.padded_channels - self.concat != self.input_channels:
                self.schedule, self._ops, self._weights, self.layer.schedule_source = kept
                raise ValueError(f"{self.layer.name}: the schedule reads "
                                 f"{op.padded_channels - self.concat} input channels, the "
                                 f"layer's input has {self.input_channels}")
        self.layer.schedule = dict(schedule)

    def build(self, x_shape: tuple[int, ...] | torch.Size) -> Any:
        """The runtime op for inputs of this NCHW shape, built once (NVRTC; no GPU needed).
        A shape other than the planned one reuses the schedule where it is valid there, else
        takes the default (DefaultScheduleWarning)."""
        shape = self.shape_for(x_shape)
        op = self._ops.get(shape)
        if op is None:
            from kernels.runtime import Conv2d

            fits = schedule_fits(shape, self.precision, self.target, self.schedule,
                                 self.epilogue) is None
            op = Conv2d(shape, self.precision, self.schedule if fits else None, self.target,
                        epilogue=self.epilogue, pdl=self.pdl,
                        residual_ready=self.pdl and self.residual_ready,
                        x_ready=self.pdl and self.x_ready,
                        cache_dir=self.cache_dir)
            if fits:
                op.schedule_source = self.layer.schedule_source
            self._ops[shape] = op
        return op

    def _weight_for(self, op: Any) -> tuple[torch.Tensor, bool]:
        """The weight as `op` reads it, prepared (a copy on this stream) at the op's first
        call, and whether it was prepared before this call: then it is ready (Conv2d's
        `weight_ready`)."""
        k = (str(op.key), str(self.weight.device))
        ready = k in self._weights
        if not ready:
            self._weights[k] = op.prepare_weight(self.weight, layout="kcrs")
        return self._weights[k], ready

    def kernel_call(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                    x1: torch.Tensor | None = None
                    ) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        """(op, args, kwargs) of the runtime call for these inputs: x, x1 and the residual as
        NHWC views (NHWCnc where the schedule says so), the prepared weight, the epilogue's
        scale / bias / res_scale."""
        op = self.build(x.shape)
        weight, weight_ready = self._weight_for(op)
        if x.shape[1] not in (self.x_channels, op.padded_channels - self.concat):
            x = x[:, : self.x_channels]  # padded for another shape's op: the op pads itself
        xin = op.to_input_layout(nhwc_view(x))
        res = None
        if residual is not None:
            res = nhwc_view(residual)
            if op.layout == "nhwcnc":
                res = _to_blocked(res, op.output_shape[-1])
        int8 = self.precision is Precision.INT8
        kw = {"residual": res, "res_scale": self.res_scale if int8 else None,
              "weight_ready": weight_ready}
        if self.concat:
            assert x1 is not None
            kw["x1"] = nhwc_view(x1)
        return op, (xin, weight, self.scale if int8 else None, self.bias), kw

    def _run_cuda(self, x: torch.Tensor, residual: torch.Tensor | None,
                  x1: torch.Tensor | None = None) -> Any:
        op, args, kwargs = self.kernel_call(x, residual, x1)
        if self.b2b:
            kwargs["b2b"] = (self.b2b_weight,
                             self.b2b_scale if self.precision is Precision.INT8 else None,
                             self.b2b_bias)
            y, y2 = op(*args, **kwargs)
            return op.from_output_layout(y).permute(0, 3, 1, 2), y2.permute(0, 3, 1, 2)
        y = op(*args, **kwargs)
        return op.from_output_layout(y).permute(0, 3, 1, 2)

    # ---- the reference -----------------------------------------------------------------
    def _conv64(self, x: torch.Tensor, x1: torch.Tensor | None = None) -> torch.Tensor:
        # cuDNN may pick inexact (FFT, Winograd) algorithms even in float64; the native
        # im2col path sums exactly for integer values.
        stride = self.stride
        x = x.to(torch.float64)
        if self.concat:  # one 1x1 stride-1 conv over concat(x1, x at the stride)
            assert x1 is not None
            x = torch.cat([x1.to(torch.float64), x[:, :, :: stride[0], :: stride[1]]], dim=1)
            stride = (1, 1)
        with torch.backends.cudnn.flags(enabled=False):
            return F.conv2d(x, self.weight.to(torch.float64), None, stride, self.padding,
                            self.dilation)

    def _run_reference(self, x: torch.Tensor, residual: torch.Tensor | None,
                       x1: torch.Tensor | None = None) -> torch.Tensor:
        k = (1, -1, 1, 1)
        x = x[:, : self.x_channels]  # the zero channels of a padded input
        if self.precision is Precision.INT8:
            acc = self._conv64(x, x1).round().to(torch.int32)
            v = acc.to(torch.float32) * self.scale.view(k)
            v = v + self.bias.view(k)
            if residual is not None:
                rs = torch.full((), self.res_scale, dtype=torch.float32, device=v.device)
                v = v + residual.to(torch.float32) * rs
            v = v.clamp(0.0 if self.relu else float(calibrate.QMIN_ACT), float(calibrate.QMAX))
            y = torch.round(v).to(torch.int8)  # half to even, as the kernel's cvt.rni
        else:
            v = self._conv64(x, x1).to(torch.float32) + self.bias.view(k)
            if residual is not None:
                v = v + residual.to(torch.float32)
            if self.relu:
                v = torch.clamp_min(v, 0.0)
            y = v.to(torch.float16)
        return y.contiguous(memory_format=torch.channels_last)

    def _b2b_reference(self, y: torch.Tensor) -> torch.Tensor:
        """The back-to-back conv over this layer's output y, as the kernel computes it."""
        k = (1, -1, 1, 1)
        w2 = self.b2b_weight.to(torch.float64)[:, :, None, None]
        with torch.backends.cudnn.flags(enabled=False):
            acc = F.conv2d(y.to(torch.float64), w2)
        if self.precision is Precision.INT8:
            v = acc.round().to(torch.int32).to(torch.float32) * self.b2b_scale.view(k)
            v = (v + self.b2b_bias.view(k)).clamp(
                0.0 if self.b2b_relu else float(calibrate.QMIN_ACT), float(calibrate.QMAX))
            y2 = torch.round(v).to(torch.int8)
        else:
            v = acc.to(torch.float32) + self.b2b_bias.view(k)
            y2 = (torch.clamp_min(v, 0.0) if self.b2b_relu else v).to(torch.float16)
        return y2.contiguous(memory_format=torch.channels_last)

    def reference(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                  x1: torch.Tensor | None = None) -> Any:
        """The reference executor's output, whatever the backend (to check the kernel)."""
        y = self._run_reference(x, residual, x1)
        return (y, self._b2b_reference(y)) if self.b2b else y

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                x1: torch.Tensor | None = None) -> Any:
        """The layer's output; with a back-to-back conv (take_b2b), (output, its output)."""
        want = self.out_dtype
        for name, t in (("x", x), ("residual", residual), ("x1", x1)):
            if t is not None and t.dtype != want:
                raise TypeError(f"{self.layer.name}: the fused layer takes {want} activations, "
                                f"got {t.dtype} for {name}")
        if (residual is not None) != self.residual:
            raise ValueError(f"{self.layer.name}: residual is "
                             f"{'required' if self.residual else 'not taken'}")
        if (x1 is not None) != bool(self.concat):
            raise ValueError(f"{self.layer.name}: x1 is "
                             f"{'required' if self.concat else 'not taken'}")
        if not self.calibrated:
            raise RuntimeError(f"{self.layer.name}: int8 scales were never set")
        if self.pairs and x.shape[1] != self.in_channels:  # compiled: one kernel, as below
            x = pair_pixels(x, *self.pairs)
        if x.shape[1] < self.input_channels:
            # NHWC with zero channels appended; compiled, one kernel with the op before it
            x = F.pad(x.permute(0, 2, 3, 1), (0, self.input_channels - x.shape[1]))
            x = x.permute(0, 3, 1, 2)
        if self.b2b:
            return torch_op.fused_conv_b2b(x, residual, x1, self.uid)
        return torch_op.fused_conv(x, residual, x1, self.uid)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.uid = torch_op.register(self)  # a copy is a layer of its own

    def execute(self, x: torch.Tensor, residual: torch.Tensor | None,
                x1: torch.Tensor | None = None) -> Any:
        """The layer on its executor (deploy.torch_op's custom ops call this); with a
        back-to-back conv, (output, its output)."""
        if self.backend == "cuda":
            return self._run_cuda(x, residual, x1)
        return self.reference(x, residual, x1)

    def extra_repr(self) -> str:
        return (f"{self.layer.name}, {self.precision.value}, fused={self.layer.fused}, "
                f"backend={self.backend}")


class SmallKernelModule(nn.Module):
    """A module that, with the cuda backend on a GPU tensor, runs one of the deploy path's
    small kernels (kernels/small_kernel.py) through its custom op, and torch ops elsewhere;
    it runs as the fused layers do (backend, target, PDL, build cache). Subclasses say which
    inputs the kernel runs (`kernel_shape`) and make its op (`make_op`)."""

    what = "kernel"

    def set_run(self, backend: str, target: Target | None, pdl: bool,
                cache_dir: str | Path | None) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if backend == "cuda" and target is None:
            raise ValueError("the cuda backend needs the target GPU")
        self.backend, self.target, self.pdl, self.cache_dir = backend, target, pdl, cache_dir
        if not hasattr(self, "uid"):
            self._ops: dict[Any, Any] = {}
            self.uid = torch_op.register(self)

    def run_like(self, layer: FusedConv) -> None:
        """Run as this fused layer runs (backend, target, PDL, build cache)."""
        self.set_run(layer.backend, layer.target, layer.pdl, layer.cache_dir)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.uid = torch_op.register(self)  # a copy outlives the original: an id of its own

    def kernel_shape(self, x_shape: tuple[int, ...] | torch.Size, dtype: torch.dtype
                     ) -> Any | None:
        """The kernel's shape for inputs of this shape and dtype, or None where forward does
        not run the kernel."""
        raise NotImplementedError

    def make_op(self, shape: Any, sm: int) -> Any:
        raise NotImplementedError

    def runs_kernel(self, x: torch.Tensor) -> bool:
        """Whether forward runs the kernel on x."""
        return x.is_cuda and self.kernel_shape(x.shape, x.dtype) is not None

    def build(self, x_shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> Any:
        """The kernel's op for inputs of this shape and dtype, built once (NVRTC; no GPU
        needed)."""
        shape = self.kernel_shape(x_shape, dtype)
        if shape is None:
            raise ValueError(f"the {self.what} kernel does not run {dtype} {tuple(x_shape)} "
                             f"here")
        if shape not in self._ops:
            assert self.target is not None
            self._ops[shape] = self.make_op(shape, self.target.sm)
        return self._ops[shape]

    def prebuild(self, x_shape: tuple[int, ...] | None, dtype: torch.dtype) -> None:
        """Build the kernel for the planned input where forward will run it, as the fused
        layers' kernels are built: before the first call (x_shape None: not planned)."""
        if x_shape is not None and self.kernel_shape(x_shape, dtype) is not None:
            self.build(x_shape, dtype)


class Quantize(SmallKernelModule):
    """Into the kernel's domain: float -> int8 with a per-tensor scale, or -> fp16; the
    output is channels_last (the kernel's NHWC). Where it feeds only fused layers that read
    more channels than it has (`take_channels`: a stem's 3 as 4), with the cuda backend
    on a GPU it is tctune's kernel (kernels/quantize.py, `torch.ops.tctune.quantize`: the
    zero channels written with the values, PDL; for a stem over pixel pairs, `pairs`, the
    zero pixels around each row too, its output seen as the pairs); elsewhere torch ops, and
    the fused layer pads (and pairs)."""

    def __init__(self, precision: Precision, scale: float | None = None) -> None:
        super().__init__()
        self.precision = Precision(precision)
        self.scale = scale
        if self.precision is Precision.INT8 and scale is None:
            raise ValueError("an int8 quantize needs a scale")
        self.channels: int | None = None
        self.pairs = (0, 0)  # zero pixels before and after each row (take_channels)
        self.set_run("reference", None, False, None)

    what = "quantize"

    def take_channels(self, channels: int, like: FusedConv) -> None:
        """Write `channels` channels (the fused layers' padded input), run as `like` runs;
        for a layer over pixel pairs (FusedConv.pairs), its rows' zero pixels too."""
        self.channels = int(channels)
        self.pairs = like.pairs[1:] if like.pairs else (0, 0)
        self.run_like(like)

    def kernel_shape(self, x_shape: tuple[int, ...] | torch.Size, dtype: torch.dtype
                     ) -> QuantizeShape | None:
        if self.backend != "cuda" or self.channels is None or len(x_shape) != 4 or \
                dtype not in (torch.float32, torch.float16):
            return None
        n, c, h, w = (int(v) for v in x_shape)
        shape = QuantizeShape(n, c, h, w, self.channels, dtype == torch.float16,
                              self.precision is Precision.FP16, *self.pairs)
        return shape if shape.problems() is None else None

    def make_op(self, shape: QuantizeShape, sm: int) -> Any:
        from kernels.quantize import QuantizeInput

        return QuantizeInput(shape, sm, self.pdl, self.cache_dir)

    def output_shape_for(self, x_shape: tuple[int, ...] | torch.Size) -> tuple[int, ...]:
        """The kernel's output (NCHW): with pairs, the rows' pixels seen as pairs."""
        n, c, h, w = (int(v) for v in x_shape)
        c = self.channels or c
        if self.pairs == (0, 0):
            return (n, c, h, w)
        return (n, 2 * c, h, (w + sum(self.pairs)) // 2)

    @property
    def out_dtype(self) -> torch.dtype:
        return torch.int8 if self.precision is Precision.INT8 else torch.float16

    def execute(self, x: torch.Tensor) -> torch.Tensor:
        """The kernel on x (torch.ops.tctune.quantize's body)."""
        y = self.build(x.shape, x.dtype)(x, self.scale)
        if self.pairs == (0, 0):
            return y
        n, c, h, w = self.output_shape_for(x.shape)  # the same bytes as pairs (a view)
        return y.permute(0, 2, 3, 1).reshape(n, h, w, c).permute(0, 3, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.runs_kernel(x):
            return torch.ops.tctune.quantize(x, self.uid)
        if self.precision is Precision.INT8:
            assert self.scale is not None
            q = calibrate.quantize(x, self.scale)
        else:
            q = x.to(torch.float16)
        return q.contiguous(memory_format=torch.channels_last) if q.dim() == 4 else q

    def extra_repr(self) -> str:
        return f"{self.precision.value}" + (f", scale={self.scale:.6g}" if self.scale else "")


class Dequantize(nn.Module):
    """Out of the kernel's domain, where a PyTorch op needs float: int8 * scale, or fp16 ->
    the model's float dtype."""

    def __init__(self, precision: Precision, scale: float | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.precision = Precision(precision)
        self.scale = scale
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.precision is Precision.INT8:
            assert self.scale is not None
            return calibrate.dequantize(x, self.scale, self.dtype)
        return x.to(self.dtype)

    def extra_repr(self) -> str:
        return f"{self.precision.value}" + (f", scale={self.scale:.6g}" if self.scale else "")


def max_of_windows(x: torch.Tensor, kernel_size: Any, stride: Any, padding: Any,
                   dilation: Any) -> torch.Tensor:
    """max_pool2d (ceil_mode off) as the elementwise maximum of its windows' strided views of
    x padded with the dtype's lowest value: exact in every dtype torch.maximum takes (int8
    included), and compiled, one pointwise kernel over x's own bytes."""
    ps = PoolShape.of(tuple(x.shape), kernel_size, stride, padding, dilation, False)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = ps.kernel, ps.stride, ps.padding, ps.dilation
    oh, ow = ps.out_hw
    lowest = torch.iinfo(x.dtype).min if not x.dtype.is_floating_point else float("-inf")
    xp = F.pad(x, (pw, pw, ph, ph), value=lowest)
    out: torch.Tensor | None = None
    for i in range(kh):
        for j in range(kw):
            v = xp[..., i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
            out = v if out is None else torch.maximum(out, v)
    assert out is not None
    return out.contiguous(memory_format=torch.channels_last)


class KernelMaxPool2d(SmallKernelModule):
    """Max-pool on the kernel's int8 / fp16 values: it commutes with a positive scale (and
    with rounding), so it needs no dequantization. With the cuda backend on a GPU tensor it
    is tctune's pooling kernel (kernels/pool.py, `torch.ops.tctune.max_pool`: 16-byte
    vectors, PDL beside the conv layers); elsewhere, or where a pixel's channels do not fill
    16-byte vectors, the maximum of its windows' views (`max_of_windows`; PyTorch's CUDA
    build has no int8 max-pool). Both are exact. ceil_mode goes through PyTorch's
    max-pool (int8 by way of fp16, which holds it exactly)."""

    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0,
                 dilation: Any = 1, ceil_mode: bool = False, *, backend: str = "reference",
                 target: Target | None = None, pdl: bool = False,
                 cache_dir: str | Path | None = None) -> None:
        super().__init__()
        self.args = (kernel_size, stride, padding, dilation, ceil_mode)
        self.set_run(backend, target, pdl, cache_dir)

    what = "pooling"

    def kernel_shape(self, x_shape: tuple[int, ...] | torch.Size, dtype: torch.dtype
                     ) -> PoolShape | None:
        """None for the reference backend, ceil_mode, other dtypes and channels that do not
        fill 16-byte vectors."""
        k, s, p, d, c = self.args
        if self.backend != "cuda" or c or dtype not in (torch.int8, torch.float16):
            return None
        shape = PoolShape.of(tuple(x_shape), k, s, p, d, dtype == torch.float16)
        return shape if shape.problems() is None else None

    def output_shape_for(self, x_shape: tuple[int, ...] | torch.Size) -> tuple[int, ...]:
        k, s, p, d, _ = self.args
        ps = PoolShape.of(tuple(x_shape), k, s, p, d, False)
        return (ps.n, ps.c, *ps.out_hw)

    def make_op(self, shape: PoolShape, sm: int) -> Any:
        from kernels.pool import MaxPool2d

        return MaxPool2d(shape, sm, self.pdl, self.cache_dir)

    def execute(self, x: torch.Tensor) -> torch.Tensor:
        """The pooling kernel on x (torch.ops.tctune.max_pool's body)."""
        return self.build(x.shape, x.dtype)(x.contiguous(memory_format=torch.channels_last))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, s, p, d, c = self.args
        if self.runs_kernel(x):
            return torch.ops.tctune.max_pool(x, self.uid)
        if not c:
            return max_of_windows(x, k, s, p, d)
        if x.dtype is not torch.int8:
            return F.max_pool2d(x, k, s, p, d, ceil_mode=c)
        return F.max_pool2d(x.to(torch.float16), k, s, p, d, ceil_mode=c).to(torch.int8)

    def extra_repr(self) -> str:
        k, s, p, d, c = self.args
        return f"kernel_size={k}, stride={s}, padding={p}, dilation={d}, ceil_mode={c}"


class KernelGlobalAvgPool(SmallKernelModule):
    """A global average pool (adaptive_avg_pool2d to 1 x 1) to fp16, the dtype of what stays
    in PyTorch: of a kernel's int8 values with their `scale` (no dequantize before it) or of
    fp16 values. With the cuda backend on a GPU tensor it is tctune's kernel
    (kernels/pool.py's GlobalAvgPool, `torch.ops.tctune.global_avg_pool`: PDL, the classifier
    after it let in before it waits); elsewhere the float32 mean."""

    what = "average pool"

    def __init__(self, scale: float | None = None) -> None:
        super().__init__()
        self.scale = scale
        self.set_run("reference", None, False, None)

    def kernel_shape(self, x_shape: tuple[int, ...] | torch.Size, dtype: torch.dtype
                     ) -> GlobalPoolShape | None:
        """None for the reference backend, 4-D inputs other than int8 with a scale or fp16
        without one, and channels that do not fill 16-byte vectors."""
        if self.backend != "cuda" or len(x_shape) != 4 or \
                (dtype, self.scale is None) not in ((torch.int8, False), (torch.float16, True)):
            return None
        n, c, h, w = (int(v) for v in x_shape)
        shape = GlobalPoolShape(n, h, w, c, dtype == torch.float16)
        return shape if shape.problems() is None else None

    def make_op(self, shape: GlobalPoolShape, sm: int) -> Any:
        from kernels.pool import GlobalAvgPool

        return GlobalAvgPool(shape, sm, self.pdl, self.cache_dir)

    def execute(self, x: torch.Tensor) -> torch.Tensor:
        """The kernel on x (torch.ops.tctune.global_avg_pool's body): [N, C] rows."""
        return self.build(x.shape, x.dtype)(x.contiguous(memory_format=torch.channels_last),
                                            self.scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c = (int(v) for v in x.shape[:2])
        if self.runs_kernel(x):
            # the op's [N, C] rows viewed as the pool's N x C x 1 x 1, which is contiguous
            # in both memory formats: flatten after it is a view again
            return torch.ops.tctune.global_avg_pool(x, self.uid).view(n, c, 1, 1)
        if self.scale is None:
            y = x.float().mean((2, 3))
        else:  # the kernel's steps: the exact sum, times the scale over the pixels in float32
            y = x.to(torch.int32).sum((2, 3)).float() * _f32(self.scale / (x.shape[2] * x.shape[3]))
        return y.half().view(n, c, 1, 1)

    def extra_repr(self) -> str:
        return f"scale={self.scale:.6g}" if self.scale else ""


class KernelLinear(SmallKernelModule):
    """A fully connected layer (nn.Linear) of what stays in PyTorch, on fp16 rows, its output
    in `out_dtype` (fp16, or fp32 where it is the model's float32 output: no cast after it).
    With the cuda backend on a GPU, over a few rows (a classifier after its network's
    pooling), tctune's kernel (kernels/linear.py, `torch.ops.tctune.linear`: Tensor Core sums,
    its weights prefetched before the grid-dependency wait); over the kernel's limits
    (more than 16 rows) PyTorch's fp16 F.linear; elsewhere its math in float32. The weight
    is kept in fp16, the bias in fp32."""

    what = "linear"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.register_buffer("weight", weight.detach().to(torch.float16).contiguous())
        b = bias.detach() if bias is not None else torch.zeros(weight.shape[0])
        self.register_buffer("bias", b.to(torch.float32, copy=True))
        self.out_dtype = torch.float16
        self.set_run("reference", None, False, None)

    def kernel_shape(self, x_shape: tuple[int, ...] | torch.Size, dtype: torch.dtype
                     ) -> LinearShape | None:
        """None for the reference backend, inputs other than fp16 rows of in_features, and
        shapes over the kernel's limits."""
        if self.backend != "cuda" or dtype != torch.float16 or len(x_shape) != 2 or \
                int(x_shape[1]) != self.weight.shape[1]:
            return None
        shape = LinearShape(int(x_shape[0]), int(x_shape[1]), int(self.weight.shape[0]),
                            self.out_dtype == torch.float32)
        return shape if shape.problems() is None else None

    def output_shape_for(self, x_shape: tuple[int, ...] | torch.Size) -> tuple[int, ...]:
        return (*(int(v) for v in x_shape[:-1]), int(self.weight.shape[0]))

    def make_op(self, shape: LinearShape, sm: int) -> Any:
        from kernels.linear import Linear

        return Linear(shape, sm, self.pdl, self.cache_dir)

    def execute(self, x: torch.Tensor) -> torch.Tensor:
        """The kernel on x (torch.ops.tctune.linear's body)."""
        return self.build(x.shape, x.dtype)(x.contiguous(), self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.runs_kernel(x):
            return torch.ops.tctune.linear(x, self.uid)
        if self.backend == "cuda" and x.is_cuda:  # over the kernel's limits: cuBLAS, as before
            return F.linear(x, self.weight.to(x.dtype), self.bias.to(x.dtype)).to(self.out_dtype)
        return F.linear(x.float(), self.weight.float(), self.bias).to(self.out_dtype)  # its math

    def extra_repr(self) -> str:
        return (f"in_features={self.weight.shape[1]}, out_features={self.weight.shape[0]}, "
                f"out_dtype={self.out_dtype}")


class OptimizedModel(nn.Module):
    """The rewritten model: `graph_module` runs it; `plan` lists every nn.Conv2d's fate and
    `report()` prints it."""

    def __init__(self, graph_module: fx.GraphModule, plan: list[LayerPlan],
                 precision: Precision, target: Target, backend: str) -> None:
        super().__init__()
        self.graph_module = graph_module
        self.plan = plan
        self.precision = Precision(precision)
        self.target = target
        self.backend = backend
        torch_op.register_inductor_fallbacks()  # before anyone compiles it

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        torch_op.register_inductor_fallbacks()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():  # inference only: the kernels have no backward
            return self.graph_module(*args, **kwargs)

    def set_backend(self, backend: str) -> None:
        """Run every fused layer (and the max-pools and quantizes that run kernels) on this
        executor from now on ("cuda" or "reference")."""
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        for m in self.graph_module.modules():
            if isinstance(m, FusedConv | SmallKernelModule):
                m.backend = backend
        self.backend = backend

    def modules_of(self, kind: type[nn.Module]) -> list[nn.Module]:
        return [m for m in self.graph_module.modules() if isinstance(m, kind)]

    def conversions(self) -> dict[str, int]:
        """Quantize / dequantize ops of the model's precision in the graph (fp16: casts; the
        fp16 casts at an int8 model's edges are not counted)."""
        counts = {"quantize": 0, "dequantize": 0}
        for node in self.graph_module.graph.nodes:
            if node.op == "call_module":
                m = self.graph_module.get_submodule(str(node.target))
                if isinstance(m, Quantize) and m.precision is self.precision:
                    counts["quantize"] += 1
                elif isinstance(m, Dequantize) and m.precision is self.precision:
                    counts["dequantize"] += 1
        return counts

    def report(self) -> str:
        replaced = sum(lp.replaced for lp in self.plan)
        conv = self.conversions()
        lines = [f"tctune deploy: {self.precision.value} on {self.target.name} "
                 f"({self.backend} executor): {replaced} of {len(self.plan)} conv layers "
                 f"replaced; {conv['quantize']} quantize, {conv['dequantize']} dequantize"]
        for lp in self.plan:
            if lp.replaced:
                what = f"replaced  fused={lp.fused}  schedule: {lp.schedule_source}"
                if lp.out_scale is not None:
                    what += (f"  scales in={lp.in_scale:.4g} out={lp.out_scale:.4g}"
                             + (f" res={lp.residual_scale:.4g}" if lp.residual_scale else "")
                             + (" w=[{:.3g}, {:.3g}]".format(*lp.weight_scale_range)
                                if lp.weight_scale_range else ""))
            else:
                what = f"kept      {lp.reason}"
            lines.append(f"  {lp.name:<28} {lp.shape_key or '-':<44} {what}")
            lines += [f"  {'':<28} note: {n}" for n in lp.notes]
        return "\n".join(lines)
