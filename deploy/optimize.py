"""optimize(): a PyTorch model -> the same model with its convs on tuned tctune kernels."""

from __future__ import annotations

import copy
import importlib.util
import operator
import re
import warnings
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import fx, nn

from deploy import calibrate, fold, graph
from deploy import plan as planning
from deploy.module import (
    BACKENDS,
    Dequantize,
    FusedConv,
    KernelGlobalAvgPool,
    KernelLinear,
    KernelMaxPool2d,
    OptimizedModel,
    Quantize,
)
from deploy.pairs import pair_weights
from deploy.plan import LayerPlan
from kernels.build import Epilogue
from kernels.launch import supports_pdl
from kernels.runtime import DefaultScheduleWarning, schedule_fits
from kernels.spec import (
    TARGETS,
    ConvShape,
    Precision,
    Target,
    get_target,
    pair_layer,
    target_for_gpu_model,
    two_input_shape,
)


def gpu_available() -> bool:
    """A CUDA device for torch and CuPy to launch the kernels."""
    return torch.cuda.is_available() and importlib.util.find_spec("cupy") is not None


def resolve_target(target: Target | str | None) -> Target:
    if isinstance(target, Target):
        return target
    if target is not None:
        return get_target(target)
    if not torch.cuda.is_available():
        raise ValueError("target=None means 'this GPU', but torch sees none; name one: "
                         + ", ".join(TARGETS))
    name = torch.cuda.get_device_name()
    t = target_for_gpu_model(name)
    if t is None:
        raise ValueError(f"GPU {name!r} is not a known target; name one: {', '.join(TARGETS)}")
    return t


def _as_args(inputs: Any) -> tuple[Any, ...]:
    return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


def _float_dtype(model: nn.Module) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def optimize(model: nn.Module, example_inputs: Any, precision: str = "fp16",
             target: Target | str | None = None, schedules: Any = None, *,
             backend: str = "auto", percentile: float = 100.0,
             calibration_inputs: Iterable[Any] | None = None, pdl: bool | None = None,
             cache_dir: str | Path | None = None, kernel_head: bool = True) -> OptimizedModel:
    """The model with its groups=1 nn.Conv2d layers on tuned tctune kernels (eval mode).

    model          a torch.fx-traceable nn.Module (copied: the original is not changed)
    example_inputs the forward's argument(s) (a tensor or a tuple): the kernels are built
                   for their shapes, and int8 scales are calibrated on them
    precision      "fp16" or "int8"
    target         "h100", a Target, or None for the current GPU
    schedules      a tctune service (`api.client.Client` or its URL: one bulk lookup), a
                   dict {layer name | task key | ConvShape.key(): record as the service
                   answers it}, or None (every layer on the runtime's default schedule)
    backend        "cuda" (the kernels; CuPy and a GPU), "reference" (the kernels' math in
                   torch ops, any device: what CPU tests run), "auto" (cuda where possible)
    percentile     int8 activation calibration: scale = P-th percentile of |x| / 127 over the
                   calibration inputs (100: the maximum); weights are per output channel,
                   max|W[k]| / 127
    calibration_inputs  more batches (each the forward's arguments) to calibrate on, after
                   example_inputs; their shapes do not matter
    pdl            launch the kernels with programmatic dependent launch, so that each may
                   be scheduled while the one before it finishes (kernels.runtime.Conv2d);
                   None: on for sm_90 targets (the only ones whose kernels support it)
    kernel_head    run a classifier's head on tctune's kernels too: every global average
                   pool (KernelGlobalAvgPool: a kernel's int8 values read as they are, no
                   dequantize) and fully connected layer (KernelLinear: its weights
                   prefetched before the grid-dependency wait, the model's float32 logits
                   written directly); False: PyTorch's ops

    Fused: conv -> BatchNorm2d (folded into weights and bias) -> residual add -> ReLU, each
    part optional (deploy.graph). Activations stay channels_last (NHWC) end to end; int8
    values go from fused layer to fused layer (and through max-pools) as int8, each written
    by the epilogue with its consumers' scale, and are dequantized only where a PyTorch op
    needs float. Layers the kernel cannot run, fp16 layers whose record says the kernel is
    slower than its baseline, and every other op stay in PyTorch, in fp16 channels_last (the
    inputs cast once, int8 values dequantized to fp16, the outputs cast back); `.plan` /
    `.report()`
    say what happened to each conv. A layer without a record runs the runtime's default
    schedule (one DefaultScheduleWarning names them all).
    """
    p = Precision(precision)
    if p not in (Precision.FP16, Precision.INT8):
        raise ValueError(f"precision must be 'fp16' or 'int8', got {precision!r}")
    if backend == "auto":
        backend = "cuda" if gpu_available() else "reference"
    if backend not in BACKENDS:
        raise ValueError(f"backend must be 'auto' or one of {BACKENDS}, got {backend!r}")
    tgt = resolve_target(target)
    if pdl is None:
        pdl = supports_pdl(tgt.sm)
    elif pdl and not supports_pdl(tgt.sm):
        raise ValueError(f"pdl (programmatic dependent launch) needs an sm_90 target, not "
                         f"{tgt.name} (sm_{tgt.sm})")
    model = copy.deepcopy(model).eval()
    float_dtype = _float_dtype(model)
    gm = graph.trace(model)
    batches = [_as_args(example_inputs)] + [_as_args(b) for b in calibration_inputs or ()]
    calibrate.observe(gm, batches if p is Precision.INT8 else batches[:1], percentile)

    layers, candidates = _candidates(gm, p, tgt)
    chains = graph.find_chains(gm, candidates)
    records, res_records = _records(schedules, candidates, chains, p, tgt)
    kept: dict[fx.Node, str] = {}  # fp16 layers slower than cuDNN per their record
    for node, (shape, lp) in candidates.items():
        rec = records[node]
        if rec is not None:
            lp.latency_us, lp.baseline_us, lp.speedup = rec.latency_us, rec.baseline_us, \
                rec.speedup
        after = planning.epilogue_pass_us(replace(shape, residual=node in res_records), tgt)
        why = planning.keep_for_record(rec, p, after)
        if why:
            kept[node] = why
        elif rec is not None and rec.slower_than_baseline():
            # int8 has no PyTorch conv of its precision to fall back to: say so, run it.
            lp.notes.append(f"tuned int8 kernel slower than its fp16 baseline per its "
                            f"record (speedup {rec.speedup})")
    # Layers over two inputs are decided before the kept layers leave: one of the two convs
    # may lose to cuDNN alone while the pair's one GEMM beats cuDNN's two.
    pairs = _two_input_layers(chains, candidates, records, res_records, kept, schedules, p,
                              tgt)
    paired = {n for conv, (proj, _, _) in pairs.items() for n in (conv, proj)}
    leaving = [node for node in kept if node not in paired]
    for node in leaving:
        candidates[node][1].reason = kept[node]
        del candidates[node]
    if leaving:  # their adds and ReLUs go to the chains that remain
        chains = graph.find_chains(gm, candidates)
    over_pairs = _pixel_pair_layers(candidates, records, schedules, p, tgt)

    fused: dict[fx.Node, FusedConv] = {}
    defaults: list[str] = []
    merged: set[fx.Node] = set()  # projection convs that run in another layer's kernel
    for chain in chains:
        if chain.conv in merged:
            continue
        if chain.conv in pairs:
            proj = graph.projection_of(chain, chains)
            assert proj is not None and proj.conv is pairs[chain.conv][0]
            mod = _concat_layer(gm, chain, proj, candidates, *pairs[chain.conv][1:], p, tgt,
                                backend, pdl, cache_dir)
            merged.add(proj.conv)
            fused[graph.fuse_concat(gm, chain, proj, _module_name(gm, mod.layer, fused),
                                    mod)] = mod
            continue
        shape, lp = candidates[chain.conv]
        rec = records[chain.conv]
        over = over_pairs.get(chain.conv)
        if over is not None:
            shape, rec = over.layer, over.record
        epi = Epilogue("default", chain.relu is not None, chain.residual is not None)
        try:
            sched, source, is_default, notes = planning.choose_schedule(shape, p, tgt, rec, epi)
        except ValueError as exc:
            lp.reason = f"no valid schedule: {exc}"
            continue
        w, b = fold.fold_conv_bn(*_conv_and_bn(gm, chain))
        if over is not None:
            channels, left, right = over.pairs
            w = pair_weights(w, channels)
            lp.shape_key = shape.key()
            notes = notes + [f"runs over pixel pairs ({channels} channels, {left} / {right} "
                             f"zero pixels around each row): the record of {shape.key()} is "
                             f"faster than the layer's"]
        lp.replaced, lp.schedule, lp.schedule_source = True, sched, source
        lp.default_schedule, lp.notes = is_default, lp.notes + notes
        lp.bn = str(chain.bn.target) if chain.bn is not None else None
        lp.relu = chain.relu is not None
        res = chain.residual
        lp.residual = res.name if res is not None else None
        mod = FusedConv(lp, p, w, b, shape, relu=lp.relu, residual=res is not None,
                        backend=backend, target=tgt, schedule=sched, pdl=pdl,
                        cache_dir=cache_dir, pairs=over.pairs if over is not None else None)
        if backend == "cuda":
            x_shape = chain.conv.args[0].meta["deploy_shape"]  # type: ignore[union-attr]
            mod.take_planned_input(x_shape)
        fused[graph.fuse(gm, chain, _module_name(gm, lp, fused), mod)] = mod
        if is_default:
            defaults.append(lp.name)
    if defaults:
        warnings.warn(f"no tuned schedule for {len(defaults)} layer(s) ({', '.join(defaults)}) "
                      f"{p.value} on {tgt.name}: they run the runtime's default schedule; tune "
                      f"them (tctune plan / POST /tune) for their best", DefaultScheduleWarning,
                      stacklevel=2)

    b2b_outputs = _back_to_back(gm, fused, schedules, p, tgt, pdl)
    _place_conversions(gm, fused, p, b2b_outputs, kernel_head)
    if fused and kernel_head:
        _kernel_linears(gm, next(iter(fused.values())), float_dtype)
    _run_rest_in_fp16(gm, float_dtype)
    _kernel_quantizes(gm, fused)
    _ready_inputs(fused)
    gm.delete_all_unused_submodules()
    gm.graph.lint()
    gm.recompile()
    return OptimizedModel(gm, layers, p, tgt, backend)


class _OverPairs(NamedTuple):
    """How a conv runs over pixel pairs (kernels.spec.pixel_pairs)."""

    layer: ConvShape  # the pair layer
    pairs: tuple[int, int, int]  # (channels, left, right): FusedConv's `pairs`
    record: planning.Record  # the pair layer's


def _pixel_pair_layers(candidates: dict[fx.Node, tuple[Any, LayerPlan]],
                       records: dict[fx.Node, planning.Record | None], schedules: Any,
                       p: Precision, tgt: Target) -> dict[fx.Node, _OverPairs]:
    """The convs that run over pixel pairs (kernels.spec.pixel_pairs): those that read the
    model's input (which the input quantize writes, the pairs too) with few enough channels
    that a pair is one 8- or 16-byte word, where the record of the pair layer is faster than
    the conv's own (or it has none)."""
    found: dict[fx.Node, tuple[ConvShape, tuple[int, int, int]]] = {}
    for node, (shape, _) in candidates.items():
        x = node.args[0]
        paired = pair_layer(shape, p)
        if isinstance(x, fx.Node) and x.op == "placeholder" and paired is not None and \
                not graph.kernel_problems(paired[0], p, tgt):
            found[node] = paired
    # named apart from the layer: a dict of records by layer name holds the conv's own
    asked = [(f"{candidates[n][1].name} over pixel pairs", ps) for n, (ps, _) in found.items()]
    out: dict[fx.Node, _OverPairs] = {}
    for (node, (ps, how)), rec in zip(found.items(),
                                      planning.lookup_records(schedules, asked, p, tgt),
                                      strict=True):
        own = records[node]
        if rec is not None and rec.latency_us is not None and (
                own is None or own.latency_us is None or rec.latency_us < own.latency_us):
            out[node] = _OverPairs(ps, how, rec)
    return out


def _records(schedules: Any, candidates: dict[fx.Node, tuple[Any, LayerPlan]],
             chains: list[graph.Chain], p: Precision, tgt: Target
             ) -> tuple[dict[fx.Node, planning.Record | None], set[fx.Node]]:
    """Each candidate's record, in one lookup (then one for those at larger batches,
    plan.other_batch_records): a conv whose epilogue adds a residual takes the record of the
    layer with it (ConvShape.residual, as `tctune plan` tunes it), else that of its conv alone
    (noted: the schedule was tuned without the residual's reads).
    Also the convs whose record is their layer's with the residual (its baseline times the
    conv and PyTorch's add after it: kernels.cudnn.cudnn_baseline)."""
    with_res = [c.conv for c in chains if c.residual is not None]
    asked = [(lp.name, shape) for shape, lp in candidates.values()] + \
        [(candidates[n][1].name, replace(candidates[n][0], residual=True)) for n in with_res]
    found = planning.lookup_records(schedules, asked, p, tgt)
    # Without a record at the layer's batch, its record at a larger batch (the residual
    # layer's only where the conv has none at its own batch either).
    own = dict(zip(candidates, found[:len(candidates)], strict=True))
    missing = [i for i, rec in enumerate(found) if rec is None and
               (i < len(candidates) or own[with_res[i - len(candidates)]] is None)]
    for i, rec in zip(missing, planning.other_batch_records(
            schedules, [asked[i] for i in missing], p, tgt), strict=True):
        found[i] = rec
    records = dict(zip(candidates, found[:len(candidates)], strict=True))
    res_records: set[fx.Node] = set()
    for node, rec in zip(with_res, found[len(candidates):], strict=True):
        if rec is not None:
            records[node] = rec
            res_records.add(node)
        elif records[node] is not None:
            candidates[node][1].notes.append(
                "record of the conv without its residual; tune "
                f"{replace(candidates[node][0], residual=True).key()} for the fused layer")
    return records, res_records


def _module_name(gm: fx.GraphModule, lp: LayerPlan, fused: dict[fx.Node, FusedConv]) -> str:
    name = base = "tctune_" + re.sub(r"\W", "_", lp.name)
    while hasattr(gm, name):  # a conv module called more than once
        name = f"{base}_{len(fused)}"
    return name


def _two_input_layers(chains: list[graph.Chain],
                      candidates: dict[fx.Node, tuple[Any, LayerPlan]],
                      records: dict[fx.Node, planning.Record | None],
                      res_records: set[fx.Node], kept: dict[fx.Node, str], schedules: Any,
                      p: Precision, tgt: Target
                      ) -> dict[fx.Node, tuple[fx.Node, ConvShape, planning.Record]]:
    """A bottleneck's last conv and its projection shortcut that run as one layer over both
    inputs (kernels.spec.two_input_shape): last conv -> (projection conv, the layer's shape,
    its record). A pair is merged where a record of that layer has a schedule valid for it
    and is faster than what the two would otherwise run as: each its record, or cuDNN where
    the record loses to it (`kept`, fp16); fp16 also where its own record says it beats its
    baseline (cuDNN's two layers) with the pass after them. The pairs' records come in one
    lookup."""
    found: list[tuple[graph.Chain, graph.Chain, ConvShape]] = []
    for chain in chains:
        proj = graph.projection_of(chain, chains)
        if proj is None:
            continue
        shape = two_input_shape(candidates[chain.conv][0], candidates[proj.conv][0])
        if shape is not None:
            found.append((chain, proj, shape))
    recs = planning.lookup_records(
        schedules, [(f"{candidates[c.conv][1].name}+{candidates[j.conv][1].name}", shape)
                    for c, j, shape in found], p, tgt) if found else []
    out: dict[fx.Node, tuple[fx.Node, ConvShape, planning.Record]] = {}
    for (chain, proj, shape), rec in zip(found, recs, strict=True):
        if rec is None:
            continue
        otherwise = [_runs_as_us(records[n], replace(candidates[n][0], residual=n in res_records),
                                 tgt, n in kept) for n in (chain.conv, proj.conv)]
        if rec.latency_us and all(otherwise) and \
                rec.latency_us >= sum(t for t in otherwise if t is not None):
            continue
        # fp16: slower than cuDNN's two convs and the one pass after them
        if planning.keep_for_record(rec, p, planning.epilogue_pass_us(shape, tgt)):
            continue
        why = schedule_fits(shape, p, tgt, rec.schedule,
                            Epilogue("default", chain.relu is not None))
        if why:
            lp, lp_b = candidates[chain.conv][1], candidates[proj.conv][1]
            lp.notes.append(f"not one GEMM with {lp_b.name}: its record's schedule {why}")
            continue
        out[chain.conv] = (proj.conv, shape, rec)
    return out


def _runs_as_us(rec: planning.Record | None, shape: ConvShape, tgt: Target,
                kept: bool) -> float | None:
    """A layer's time as deploy would otherwise run it: its record's, or where it stays in
    PyTorch cuDNN's (the record's baseline, or its latency times its speedup) with the pass
    after it (plan.epilogue_pass_us)."""
    if rec is None:
        return None
    if not kept:
        return rec.latency_us
    base = rec.baseline_us if rec.baseline_us is not None else \
        rec.latency_us * rec.speedup if rec.latency_us and rec.speedup else None
    return None if base is None else base + planning.epilogue_pass_us(shape, tgt)


def _concat_layer(gm: fx.GraphModule, chain: graph.Chain, proj: graph.Chain,
                  candidates: dict[fx.Node, tuple[Any, LayerPlan]], shape: ConvShape,
                  rec: planning.Record, p: Precision, tgt: Target, backend: str, pdl: bool,
                  cache_dir: str | Path | None) -> FusedConv:
    """The op of a pair `_two_input_layers` merges: both convs' folded weights side by side
    (the last conv's channels first, as x1 precedes x), one bias."""
    lp, lp_b = candidates[chain.conv][1], candidates[proj.conv][1]
    w_a, b_a = fold.fold_conv_bn(*_conv_and_bn(gm, chain))
    w_b, b_b = fold.fold_conv_bn(*_conv_and_bn(gm, proj))
    lp.replaced, lp.schedule, lp.schedule_source = True, dict(rec.schedule), rec.source
    lp.latency_us, lp.baseline_us, lp.speedup = rec.latency_us, rec.baseline_us, rec.speedup
    lp.bn = str(chain.bn.target) if chain.bn is not None else None
    lp.relu, lp.merged = chain.relu is not None, lp_b.name
    lp.notes.append(f"one GEMM with {lp_b.name} over both inputs ({shape.key()})")
    lp_b.replaced, lp_b.merged = True, lp.name
    lp_b.bn = str(proj.bn.target) if proj.bn is not None else None
    lp_b.schedule, lp_b.schedule_source = dict(rec.schedule), rec.source
    lp_b.latency_us = lp_b.baseline_us = lp_b.speedup = None
    lp_b.notes.append(f"runs in {lp.name}'s kernel (two inputs)")
    mod = FusedConv(lp, p, torch.cat([w_a, w_b], dim=1), b_a + b_b, shape, relu=lp.relu,
                    residual=False, backend=backend, target=tgt, schedule=lp.schedule,
                    pdl=pdl, cache_dir=cache_dir)
    if backend == "cuda":
        x_shape = proj.conv.args[0].meta["deploy_shape"]  # type: ignore[union-attr]
        mod.take_planned_input(x_shape)
    return mod


def _back_to_back(gm: fx.GraphModule, fused: dict[fx.Node, FusedConv], schedules: Any,
                  p: Precision, tgt: Target, pdl: bool) -> dict[fx.Node, fx.Node]:
    """Run a fused 1x1 layer in the kernel of the fused layer whose output it reads
    (ConvShape.b2b: a ResNet bottleneck's last conv and the next block's first) where the
    record of the two as one layer is faster than their two records; the pairs' records come
    in one lookup. The first layer's node then yields (its output, the second's): each use
    reads one of them (getitem nodes). Returns {first layer's node: the second's output}.
    Not with `pdl`: the records are timed with plain launches, and with PDL the second
    layer's own kernel sets up while the first finishes, which they do not see (a pair faster
    than its two layers alone made the model slower: docs/decisions.md)."""
    found: list[tuple[fx.Node, fx.Node, ConvShape]] = []
    taken: set[fx.Node] = set()
    for node, mod in fused.items():
        if node in taken or mod.b2b:
            continue
        for user in node.users:
            second = fused.get(user)
            if second is None or user in taken or user.args[0] is not node or \
                    len(user.args) > 1 and any(a is not None for a in user.args[1:]):
                continue
            sh = second.shape
            if (sh.r, sh.s, sh.stride, sh.pad, sh.concat) == (1, 1, (1, 1), (0, 0), 0) and \
                    second.in_channels == mod.out_channels:
                found.append((node, user, replace(mod.shape, residual=mod.residual,
                                                  b2b=second.out_channels)))
                taken.update((node, user))
                break
    if not found:
        return {}
    recs = planning.lookup_records(
        schedules, [(f"{fused[a].layer.name}+{fused[b].layer.name}", shape)
                    for a, b, shape in found], p, tgt)
    out: dict[fx.Node, fx.Node] = {}
    for (a, b, shape), rec in zip(found, recs, strict=True):
        first, second = fused[a], fused[b]
        alone = [first.layer.latency_us, second.layer.latency_us]
        if rec is None or not rec.latency_us or None in alone or \
                rec.latency_us >= sum(t for t in alone if t is not None):
            continue
        if pdl:
            first.layer.notes.append(
                f"not back to back with {second.layer.name}: launched with PDL, its own kernel "
                f"overlaps this one's end, which the pair's record (faster alone) does not see")
            continue
        try:
            first.take_b2b(second, dict(rec.schedule), rec.source)
        except ValueError as exc:
            first.layer.notes.append(f"not back to back with {second.layer.name}: {exc}")
            continue
        lp, lp_b = first.layer, second.layer
        lp.latency_us, lp.baseline_us, lp.speedup = rec.latency_us, rec.baseline_us, rec.speedup
        lp.back_to_back, lp_b.back_to_back = lp_b.name, lp.name
        lp.notes.append(f"runs {lp_b.name} back to back ({shape.key()})")
        lp_b.schedule, lp_b.schedule_source = dict(rec.schedule), rec.source
        lp_b.latency_us = lp_b.baseline_us = lp_b.speedup = None
        lp_b.notes.append(f"runs in {lp.name}'s kernel (back to back)")
        g = gm.graph
        with g.inserting_after(a):
            y = g.call_function(operator.getitem, (a, 0))
        with g.inserting_after(y):
            y2 = g.call_function(operator.getitem, (a, 1))
        y.meta.update({k: v for k, v in a.meta.items() if k.startswith("deploy_")})
        y2.meta.update({k: v for k, v in b.meta.items() if k.startswith("deploy_")})
        a.replace_all_uses_with(y, delete_user_cb=lambda u, ends=(y, y2): u not in ends)
        b.replace_all_uses_with(y2)
        g.erase_node(b)
        del fused[b]
        out[a] = y2
    return out


def _conv_and_bn(gm: fx.GraphModule, chain: graph.Chain
                 ) -> tuple[torch.Tensor, torch.Tensor | None, nn.BatchNorm2d | None]:
    conv = gm.get_submodule(str(chain.conv.target))
    bn = gm.get_submodule(str(chain.bn.target)) if chain.bn is not None else None
    assert isinstance(conv, nn.Conv2d)
    return conv.weight, conv.bias, bn  # type: ignore[return-value]


def _candidates(gm: fx.GraphModule, p: Precision, tgt: Target
                ) -> tuple[list[LayerPlan], dict[fx.Node, tuple[Any, LayerPlan]]]:
    """Every nn.Conv2d call's plan, and those the kernel can run (node -> (shape, plan))."""
    layers: list[LayerPlan] = []
    out: dict[fx.Node, tuple[Any, LayerPlan]] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (F.conv2d, torch.conv2d):
            layers.append(LayerPlan(node.name, None, reason="a functional conv2d call (deploy "
                                    "replaces nn.Conv2d modules)"))
            continue
        if not isinstance(graph.module_of(gm, node), nn.Conv2d):
            continue
        lp = LayerPlan(str(node.target), None)
        layers.append(lp)
        if not graph.is_conv(gm, node):
            lp.reason = "a Conv2d subclass with its own forward"
            continue
        x = node.args[0]
        meta = x.meta if isinstance(x, fx.Node) else {}
        dtype = meta.get("deploy_dtype")
        if dtype is None or not dtype.is_floating_point:
            lp.reason = f"input is not a float tensor ({dtype})"
            continue
        shape, why = graph.conv_shape(gm.get_submodule(str(node.target)),  # type: ignore[arg-type]
                                      meta.get("deploy_shape"))
        if shape is None:
            lp.reason = why
            continue
        lp.shape_key = shape.key()
        why = graph.kernel_problems(shape, p, tgt)
        if why:
            lp.reason = f"the kernel cannot run it: {why}"
            continue
        out[node] = (shape, lp)
    return layers, out


def _place_conversions(gm: fx.GraphModule, fused: dict[fx.Node, FusedConv], p: Precision,
                       b2b_outputs: dict[fx.Node, fx.Node], kernel_head: bool) -> None:
    """Give every value a domain (the kernel's, or float); max-pools of kernel values stay in
    the kernel's domain, and with `kernel_head` global average pools run on kernels
    (KernelGlobalAvgPool: a kernel value read as it is, fp16 out). int8: insert one Quantize
    per float value a fused layer reads and one Dequantize (to fp16, the dtype of what stays
    in PyTorch) per kernel value a PyTorch op reads, and set every fused layer's epilogue
    scales from the activation scales of its input, residual and output."""
    g = gm.graph
    int8 = p is Precision.INT8
    kernel: dict[fx.Node, float | None] = {}  # kernel-domain value -> its int8 scale
    pooled: set[fx.Node] = set()  # global average pools, which read kernel values as they are

    def scale_of(v: fx.Node) -> float | None:
        if not int8:
            return None
        amax = v.meta.get("deploy_amax")
        if amax is None:
            raise ValueError(f"no calibrated magnitude for {v.name}")
        return calibrate.activation_scale(float(amax))

    for node in list(g.nodes):
        if node in fused or _output_of_fused(node, fused):
            kernel[node] = scale_of(node)
        elif graph.is_max_pool(gm, node) and node.args[0] in kernel:
            src = kernel[node.args[0]]  # type: ignore[index]
            kernel[_kernel_max_pool(gm, node, next(iter(fused.values())))] = src
        elif fused and kernel_head and graph.is_global_avg_pool(gm, node):
            x = node.args[0]
            assert isinstance(x, fx.Node)
            pooled.add(_kernel_avg_pool(gm, node, next(iter(fused.values())),
                                        kernel.get(x) if int8 else None))

    # fp16: none between layers; what stays in PyTorch runs in fp16 too, and the model's
    # inputs and outputs are cast once at its edges (_run_rest_in_fp16).
    if int8:
        quant: dict[fx.Node, fx.Node] = {}
        dequant: dict[fx.Node, fx.Node] = {}
        count = [0]

        def add_module(prefix: str, mod: nn.Module, after: fx.Node, arg: fx.Node) -> fx.Node:
            count[0] += 1
            name = f"tctune_{prefix}_{count[0]}"
            gm.add_submodule(name, mod)
            if after.op == "placeholder":  # placeholders stay first
                first = next(n for n in g.nodes if n.op != "placeholder")
                ctx = g.inserting_before(first)
            else:
                ctx = g.inserting_after(after)
            with ctx:
                return g.call_module(name, (arg,))

        for node in list(g.nodes):
            if node in fused:
                for v in node.all_input_nodes:
                    if v in kernel:
                        continue
                    if v not in quant:
                        s = scale_of(v)
                        quant[v] = add_module("quantize", Quantize(p, s), v, v)
                        kernel[quant[v]] = s
                    node.replace_input_with(v, quant[v])
            elif node in kernel or node in pooled:
                continue  # a max-pool of a kernel value, or a pool that reads it as it is
            else:
                for v in node.all_input_nodes:
                    if v in kernel:
                        if v not in dequant:
                            dequant[v] = add_module("dequantize", Dequantize(
                                p, kernel[v], torch.float16), v, v)
                        node.replace_input_with(v, dequant[v])
    for node, mod in fused.items():
        x, res, x1 = (list(node.args) + [None, None])[:3]
        if res is not None:
            mod.layer.residual = _describe(gm, res, fused)  # type: ignore[arg-type]
        if int8:
            mod.set_scales(kernel[x], kernel[node],  # type: ignore[index, arg-type]
                           None if res is None else kernel[res],  # type: ignore[index]
                           None if x1 is None else kernel[x1])  # type: ignore[index]
            if node in b2b_outputs:
                mod.set_b2b_scale(kernel[b2b_outputs[node]])  # type: ignore[arg-type]


def _ready_inputs(fused: dict[fx.Node, FusedConv]) -> None:
    """Mark the inputs of fused layers that are complete before the kernel just before theirs
    starts: the layer's main input (x1 of a layer over two inputs, else x) comes from another
    fused layer's kernel (one launch on the stream, in graph order, which data order keeps)
    that itself depends on them. Every kernel of the model waits for the one before it before
    it lets the next be scheduled (PDL), so when such a layer's kernel starts, everything that
    ran before its main input's kernel has finished: the writers of the residual (a ResNet
    block's input, two or three convs back) and of a bottleneck's input that its last conv and
    projection read as x among it."""
    for node, mod in fused.items():
        x, res, x1 = (list(node.args) + [None, None])[:3]
        main = x1 if mod.concat else x
        src = main.args[0] if isinstance(main, fx.Node) and _output_of_fused(main, fused) \
            else main
        if src not in fused:
            mod.set_ready(residual=False, x=False)
            continue
        mod.set_ready(residual=isinstance(res, fx.Node) and _depends_on(src, res),
                      x=bool(mod.concat) and isinstance(x, fx.Node) and _depends_on(src, x))


def _depends_on(node: fx.Node, value: fx.Node) -> bool:
    """Whether `value` is among the inputs of `node`, directly or through other nodes."""
    seen: set[fx.Node] = set()
    todo = list(node.all_input_nodes)
    while todo:
        v = todo.pop()
        if v is value:
            return True
        if v not in seen:
            seen.add(v)
            todo.extend(v.all_input_nodes)
    return False


def _output_of_fused(node: fx.Node, fused: dict[fx.Node, FusedConv]) -> bool:
    """One of the outputs of a fused layer with a back-to-back conv (a getitem of it)."""
    return node.op == "call_function" and node.target is operator.getitem and \
        node.args[0] in fused


def _run_rest_in_fp16(gm: fx.GraphModule, float_dtype: torch.dtype) -> None:
    """What stays in PyTorch runs in fp16 channels_last (a kept conv is cuDNN's fp16 conv,
    the baseline its record was compared with; int8 models dequantize to fp16), so no casts
    sit between fused layers and PyTorch ops: the model casts its inputs to fp16 once (int8
    quantizes read them as they are) and its outputs back to the model's own float dtype."""
    g = gm.graph
    ours = {name for name, m in gm.named_modules()
            if isinstance(m, (FusedConv, KernelMaxPool2d, KernelLinear))}
    for name, m in gm.named_modules():
        if any(name == o or name.startswith(o + ".") for o in ours):
            continue  # the kernels' fp32 scale and bias stay as they are
        for group in (m._parameters, m._buffers):  # each module's own, not its children's
            for t in group.values():
                if t is not None and t.is_floating_point():
                    t.data = t.data.half()
        if isinstance(m, nn.Conv2d):
            m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last)
    def int8_quantize(user: fx.Node) -> bool:
        m = gm.get_submodule(str(user.target)) if user.op == "call_module" else None
        return isinstance(m, Quantize) and m.precision is Precision.INT8

    for node in [n for n in g.nodes if n.op == "placeholder"]:
        if all(int8_quantize(u) for u in node.users):
            continue
        name = f"tctune_quantize_input_{node.name}"
        gm.add_submodule(name, Quantize(Precision.FP16))
        with g.inserting_after(node):
            cast = g.call_module(name, (node,))
        node.replace_all_uses_with(
            cast, delete_user_cb=lambda user, c=cast: user is not c and not int8_quantize(user))
    out = next(n for n in g.nodes if n.op == "output")
    gm.add_submodule("tctune_dequantize_output", Dequantize(Precision.FP16, None, float_dtype))

    def back(v: fx.Node) -> fx.Node:
        m = gm.get_submodule(str(v.target)) if v.op == "call_module" else None
        if isinstance(m, KernelLinear) and m.out_dtype == float_dtype:
            return v  # it writes the model's dtype itself (_kernel_linears)
        with g.inserting_before(out):
            return g.call_module("tctune_dequantize_output", (v,))

    out.args = (fx.node.map_arg(out.args[0], back),)


def _describe(gm: fx.GraphModule, v: fx.Node, fused: dict[fx.Node, FusedConv]) -> str:
    """A residual for the report: the fused layer that computes it, else the original
    graph's value (seen through the Quantize in front of it)."""
    if v.op == "call_module" and isinstance(gm.get_submodule(str(v.target)), Quantize):
        v = v.args[0]  # type: ignore[assignment]
    if v in fused:
        return fused[v].layer.name
    if _output_of_fused(v, fused):  # one of the outputs of a layer with a back-to-back conv
        mod = fused[v.args[0]]  # type: ignore[index]
        return mod.layer.name if v.args[1] == 0 else str(mod.layer.back_to_back)
    return str(v.meta.get("deploy_origin", v.name))


def _kernel_quantizes(gm: fx.GraphModule, fused: dict[fx.Node, FusedConv]) -> None:
    """A Quantize that feeds only fused layers reading more channels than it has (or over
    pixel pairs), each as its x, all as many (a stem's 3 as 4), writes them itself: on the
    GPU one kernel writes the values and the zero channels (and pixels: Quantize.
    take_channels), built for its planned input."""
    for node in gm.graph.nodes:
        q = gm.get_submodule(str(node.target)) if node.op == "call_module" else None
        if not isinstance(q, Quantize) or not node.users:
            continue
        layers = [fused.get(u) for u in node.users]
        if any(m is None for m in layers) or any(u.args[0] is not node for u in node.users):
            continue
        channels = {m.pairs[0] if m.pairs else m.input_channels for m in layers if m is not None}
        over_pairs = {m.pairs for m in layers if m is not None}
        x_shape = node.args[0].meta.get("deploy_shape")  # type: ignore[union-attr]
        if len(channels) != 1 or len(over_pairs) != 1 or x_shape is None or \
                (channels == {int(x_shape[1])} and over_pairs == {None}):
            continue
        like = layers[0]
        assert like is not None
        q.take_channels(channels.pop(), like)
        x_dtype = node.args[0].meta.get("deploy_dtype", torch.float32)  # type: ignore[union-attr]
        q.prebuild(x_shape, x_dtype)


def _kernel_linears(gm: fx.GraphModule, like: FusedConv, float_dtype: torch.dtype) -> None:
    """Every fully connected layer (an nn.Linear module) as a KernelLinear run as the fused
    layer `like` runs (backend, target, PDL, build cache), in fp16 as what stays in PyTorch;
    one whose only use is the model's output writes the model's float dtype itself. Its
    kernel is built for its planned input where it runs one."""
    for node in list(gm.graph.nodes):
        m = gm.get_submodule(str(node.target)) if node.op == "call_module" else None
        if not isinstance(m, nn.Linear) or len(node.args) != 1:
            continue
        mod = KernelLinear(m.weight, m.bias)
        if [u.op for u in node.users] == ["output"] and \
                float_dtype in (torch.float16, torch.float32):
            mod.out_dtype = float_dtype
        mod.run_like(like)
        x_shape = node.args[0].meta.get("deploy_shape")  # type: ignore[union-attr]
        mod.prebuild(x_shape, torch.float16)
        _replace(gm, node, mod, f"tctune_linear_{node.name}")


def _kernel_avg_pool(gm: fx.GraphModule, node: fx.Node, like: FusedConv, scale: float | None
                     ) -> fx.Node:
    """The global average pool node as a KernelGlobalAvgPool call on its input as it is (a
    kernel's int8 value with this scale; with none, fp16), run as the fused layer `like`
    runs."""
    mod = KernelGlobalAvgPool(scale)
    mod.run_like(like)
    mod.prebuild(node.args[0].meta.get("deploy_shape"),  # type: ignore[union-attr]
                 torch.float16 if scale is None else torch.int8)
    return _replace(gm, node, mod, f"tctune_avgpool_{node.name}", (node.args[0],))


def _replace(gm: fx.GraphModule, node: fx.Node, mod: nn.Module, name: str,
             args: tuple[Any, ...] | None = None) -> fx.Node:
    """The node as a call of `mod` (added as `name`) on `args` (the node's own by default),
    its users moved to the call."""
    gm.add_submodule(name, mod)
    with gm.graph.inserting_before(node):
        new = gm.graph.call_module(name, node.args if args is None else args)
    new.meta.update(node.meta)
    new.meta["deploy_origin"] = node.name
    node.replace_all_uses_with(new)
    gm.graph.erase_node(node)
    return new


def _kernel_max_pool(gm: fx.GraphModule, node: fx.Node, like: FusedConv) -> fx.Node:
    """The max-pool node as a KernelMaxPool2d call (same arguments), run as the fused layer
    `like` runs (backend, target, PDL, build cache)."""
    if node.op == "call_module":
        m = gm.get_submodule(str(node.target))
        assert isinstance(m, nn.MaxPool2d)
        mod = KernelMaxPool2d(m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode)
    else:
        assert node.target is F.max_pool2d
        names = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")
        vals: dict[str, Any] = dict(zip(names, node.args[1:], strict=False))
        vals.update({k: v for k, v in node.kwargs.items() if k in names})
        mod = KernelMaxPool2d(**vals)
    mod.run_like(like)
    mod.prebuild(node.args[0].meta.get("deploy_shape"), like.out_dtype)  # type: ignore[union-attr]
    return _replace(gm, node, mod, f"tctune_maxpool_{node.name}", (node.args[0],))

