"""Plan a model's tuning: its conv layers, which are tuned, and submitting the rest.

A model is a JSON file (`tctune plan model.json`):

    {"precision": "int8", "target": "h100",
     "layers": [{"name": "layer1.0.conv2", "shape": {"n": 8, "h": 56, ...}}, ...]}

(each layer may override precision/target), or a PyTorch module (`tctune plan
torchvision:resnet50 --input-shape 8,3,224,224` or `module.path:factory`), built here and
traced once (on the meta device: shapes only) for its Conv2d layers with `conv_layers()`,
and for what deploy.optimize runs them as where an add follows (`fused_layers()`): the layers
over two inputs it merges a ResNet bottleneck's last conv and projection shortcut into, and
the convs whose epilogue adds a block's residual (tuned as such layers: ConvShape.residual).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from kernels.spec import (
    ConvShape,
    Precision,
    get_target,
    pair_layer,
    two_input_shape,
)


@dataclass(frozen=True)
class Layer:
    name: str
    shape: ConvShape
    precision: str
    target: str


def load_model(path: str | Path, precision: str | None = None,
               target: str | None = None) -> list[Layer]:
    """The layers of a model file; `precision` and `target` apply where the file names
    none (neither per layer nor at the top)."""
    try:
        spec = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("layers"), list):
        raise ValueError("a model file is an object with a list 'layers'")
    out = []
    for i, item in enumerate(spec["layers"]):
        try:
            shape = ConvShape.from_dict(item["shape"])
            prec = item.get("precision", spec.get("precision", precision))
            tgt = item.get("target", spec.get("target", target))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"layer {i}: {exc!r}") from None
        if not prec or not tgt:
            raise ValueError(f"layer {i}: precision and target are needed (per layer or top, "
                             "or --precision/--target)")
        out.append(Layer(str(item.get("name", f"conv{i}")), shape, prec, tgt))
    return out


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def is_module_spec(model: str) -> bool:
    """'torchvision:NAME' or 'module.path:factory' (and not a file that exists)."""
    mod, sep, attr = model.partition(":")
    return bool(sep and attr.isidentifier()
                and all(part.isidentifier() for part in mod.split(".")))


def parse_input_shape(text: str) -> tuple[int, ...]:
    """'8,3,224,224' -> (8, 3, 224, 224): N, C, H, W, each a positive integer."""
    try:
        dims = tuple(int(x) for x in text.replace("x", ",").split(","))
    except ValueError:
        raise ValueError(f"{text!r} is not N,C,H,W (e.g. 8,3,224,224)") from None
    if len(dims) != 4 or min(dims) < 1:
        raise ValueError(f"{text!r} is not N,C,H,W of positive integers (e.g. 8,3,224,224)")
    return dims


def build_module(spec: str) -> Any:
    """The torch.nn.Module of 'torchvision:NAME' (randomly initialised: weights=None) or of
    'module.path:factory' (called without arguments)."""
    try:
        import torch
    except ImportError:
        raise ValueError("a module model needs PyTorch (pip install torch)") from None
    mod_name, _, attr = spec.partition(":")
    if mod_name == "torchvision":
        try:
            import torchvision.models as tvm
        except ImportError:
            raise ValueError(f"{spec} needs torchvision (pip install torchvision)") from None
        factory = getattr(tvm, attr, None)
        if not callable(factory):
            raise ValueError(f"torchvision.models has no model {attr!r}")
        model = factory(weights=None)
    else:
        # The installed `tctune` script does not search the working directory; a user's
        # own model package usually lives there.
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(mod_name)
        except ImportError as exc:
            raise ValueError(f"cannot import {mod_name!r}: {_first_line(exc)}") from None
        factory = getattr(module, attr, None)
        if not callable(factory):
            raise ValueError(f"{mod_name} has no callable {attr!r}")
        try:
            model = factory()
        except Exception as exc:  # the user's code: say where it failed, in one line
            raise ValueError(f"{spec}() failed: {type(exc).__name__}: {_first_line(exc)}"
                             ) from None
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"{spec} returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def load_module_model(spec: str, input_shape: tuple[int, ...], precision: str,
                      target: str, b2b: bool = False, pixel_pairs: bool = False) -> list[Layer]:
    """The Conv2d layers of a module model (build_module), traced with an input of
    `input_shape` (N, C, H, W): on the meta device, where only shapes are computed
    (DenseNet-121 at batch 32: 1.3 s on two cores, against 5.5 s for the two passes on the
    CPU, and more for larger inputs), or, where the model does not run there (an op without
    a meta kernel, a value read in forward, an input that does not fit), on the CPU with a
    random input, whose errors say why. `b2b`: also the layers that may run the 1x1 conv
    reading their output back to back (fused_layers), where some schedule runs them on
    `target`. `pixel_pairs`: also the pair layers of the convs that deploy may run over
    pixel pairs (kernels.spec.pixel_pairs: a stem's), named "NAME over pixel pairs"."""
    import torch

    # deploy.optimize runs int8 and fp16 models: only their convs fuse an add.
    fuses = str(precision).lower() in ("int8", "fp16")

    def traced(module: Any, example: Any) -> tuple[list[dict[str, Any]], FusedLayers]:
        found = conv_layers(module, example)
        return found, fused_layers(module, example, found) if found and fuses \
            else FusedLayers([], set(), [])

    module = build_module(spec)
    try:
        found, fl = traced(module.to("meta"), torch.empty(*input_shape, device="meta"))
    except Exception:  # noqa: BLE001 - any failure on meta: the CPU run below says what
        example = torch.randn(*input_shape, generator=torch.Generator().manual_seed(0))
        try:
            found, fl = traced(build_module(spec), example)  # weights again
        except RuntimeError as exc:  # the input does not fit the model (channels, size)
            raise ValueError(f"{spec} does not run on an input of {input_shape}: "
                             f"{_first_line(exc)}") from None
    if not found:
        raise ValueError(f"{spec} has no Conv2d layer with groups=1")
    extra = fl.pairs + ([f for f in fl.b2b if _runs_b2b(f["shape"], precision, target)]
                        if b2b else []) + (_pair_layers(found, precision) if pixel_pairs else [])
    return [Layer(f["name"], replace(ConvShape.from_dict(f["shape"]),
                                     residual=f["name"] in fl.residual), precision, target)
            for f in found] + \
        [Layer(f["name"], ConvShape.from_dict(f["shape"]), precision, target) for f in extra]


def _pair_layers(found: list[dict[str, Any]], precision: str) -> list[dict[str, Any]]:
    """The pair layers of the found convs that may run over pixel pairs (stride 2 in width,
    few channels: kernels.spec.pair_layer; deploy runs a conv that reads the model's input
    so where the pair layer's record is faster)."""
    out = []
    for f in found:
        paired = pair_layer(ConvShape.from_dict(f["shape"]), precision)
        if paired is not None:
            out.append({"name": f"{f['name']} over pixel pairs", "shape": paired[0].to_dict()})
    return out


def _runs_b2b(shape: dict[str, Any], precision: str, target: str) -> bool:
    """Some schedule of the kernel runs this layer with its back-to-back conv on `target`
    (the block's tiles must hold all its output channels, and the weights of both)."""
    from kernels.space import ScheduleSpace

    return len(ScheduleSpace(ConvShape.from_dict(shape), Precision(precision),
                             get_target(target)).valid_indices) > 0


def conv_layers(module: Any, example_input: Any) -> list[dict[str, Any]]:
    """Trace a torch.nn.Module once and return its Conv2d layers as model-file entries
    (name, shape). Grouped convolutions are skipped: the kernel does groups=1."""
    import torch

    found: list[dict[str, Any]] = []
    hooks = []
    for name, sub in module.named_modules():
        if isinstance(sub, torch.nn.Conv2d) and sub.groups == 1:
            def hook(mod: Any, inputs: Any, _out: Any, name: str = name) -> None:
                n, c, h, w = inputs[0].shape
                found.append({"name": name, "shape": {
                    "n": int(n), "h": int(h), "w": int(w), "c": int(c),
                    "k": int(mod.out_channels), "r": int(mod.kernel_size[0]),
                    "s": int(mod.kernel_size[1]), "stride": list(mod.stride),
                    "pad": list(mod.padding), "dilation": list(mod.dilation)}})
            hooks.append(sub.register_forward_hook(hook))
    try:
        with torch.no_grad():
            module.eval()(example_input)
    finally:
        for h in hooks:
            h.remove()
    return found


def add_operands(node: Any) -> tuple[Any, Any] | None:
    """The two tensor operands of a plain a + b in a torch.fx graph (no alpha, no broadcast
    scalar), else None: the adds a conv's epilogue takes, here and in deploy.graph."""
    import operator

    import torch
    from torch import fx

    plain = (node.op == "call_function" and node.target in (operator.add, operator.iadd,
                                                              torch.add)) or \
        (node.op == "call_method" and node.target in ("add", "add_"))
    if not plain or node.kwargs or len(node.args) != 2:
        return None
    a, b = node.args
    if isinstance(a, fx.Node) and isinstance(b, fx.Node) and a is not b:
        return a, b
    return None


def is_relu(gm: Any, node: Any) -> bool:
    """A ReLU of one tensor in a torch.fx graph of module `gm` (module, function or method):
    what a conv's epilogue clamps; here and in deploy.graph."""
    import torch
    import torch.nn.functional as F

    if node.op == "call_module":
        return type(gm.get_submodule(str(node.target))) is torch.nn.ReLU
    if node.op == "call_function":
        return node.target in (F.relu, torch.relu, torch.relu_) and len(node.args) == 1
    if node.op == "call_method":
        return node.target in ("relu", "relu_") and len(node.args) == 1 and not node.kwargs
    return False


def foldable_bn(bn: Any, channels: int) -> bool:
    """A module deploy folds into the conv before it (deploy.fold): exactly BatchNorm2d, in
    eval mode, with running statistics, over the conv's `channels`; here and in deploy.graph."""
    import torch

    return (type(bn) is torch.nn.BatchNorm2d and bn.running_mean is not None
            and bn.num_features == channels and not bn.training)


def single_user(node: Any) -> Any:
    """A torch.fx node's only user, or None where it has several or none."""
    users = list(node.users)
    return users[0] if len(users) == 1 else None


class FusedLayers(NamedTuple):
    """`fused_layers`' answer: the layers over two inputs and the layers with a back-to-back
    conv as `conv_layers`' entries, the names of the convs whose epilogue adds a residual."""

    pairs: list[dict[str, Any]]
    residual: set[str]
    b2b: list[dict[str, Any]]


def fused_layers(module: Any, example_input: Any, found: list[dict[str, Any]]) -> FusedLayers:
    """What deploy.optimize runs a module's convs as where an add follows them: (the layers
    over two inputs (ConvShape.concat) as `conv_layers`' entries, the names of the convs
    whose epilogue adds the add's other operand (ConvShape.residual), the layers that may
    run the 1x1 conv reading their output back to back (ConvShape.b2b)). Two inputs: each add
    of two convs' outputs (each through at most one BatchNorm2d, the add's only users) whose
    shapes are one GEMM over both inputs (kernels.spec.two_input_shape: a ResNet
    bottleneck's last 1x1 conv and its projection shortcut). A residual: deploy.graph's
    rule, conv -> [BatchNorm2d it folds] -> add of a value of the same shape (on `example_input`),
    each the only user of the one before, the first such conv in graph order taking the
    add. Back to back: a layer (a conv, with its residual or as a layer over two inputs)
    whose value after its BatchNorm, add and ReLU a 1x1, stride-1, unpadded conv without a
    residual reads as its input (deploy.optimize's `_back_to_back`), named "first+second".
    `found`: conv_layers' entries of the module, for the shapes."""
    import torch
    from torch import fx
    from torch.fx.passes.shape_prop import ShapeProp

    try:
        gm = fx.symbolic_trace(module)
        with torch.no_grad():
            ShapeProp(gm).propagate(example_input)
    except Exception:  # noqa: BLE001 - an untraceable model has no such layers for deploy
        return FusedLayers([], set(), [])
    shapes = {f["name"]: ConvShape.from_dict(f["shape"]) for f in found}

    def is_conv(v: Any) -> bool:
        return v.op == "call_module" and str(v.target) in shapes

    def bn_after(v: Any, conv: Any) -> bool:
        """v is a BatchNorm deploy folds into `conv` (a conv node)."""
        return v.op == "call_module" and is_conv(conv) and \
            foldable_bn(module.get_submodule(str(v.target)), shapes[str(conv.target)].k)

    def conv_behind(v: Any) -> Any:
        if v.args and isinstance(v.args[0], fx.Node) and bn_after(v, v.args[0]):
            if len(v.users) != 1:
                return None
            v = v.args[0]
        return v if len(v.users) == 1 and is_conv(v) else None

    def value_shape(v: Any) -> Any:
        meta = v.meta.get("tensor_meta")
        return getattr(meta, "shape", None)

    pairs = []
    for node in gm.graph.nodes:
        ops = add_operands(node)
        if ops is None:
            continue
        a, b = (conv_behind(v) for v in ops)
        if a is None or b is None:
            continue
        for last, proj in ((a, b), (b, a)):
            shape = two_input_shape(shapes[str(last.target)], shapes[str(proj.target)])
            if shape is not None:
                pairs.append({"name": f"{last.target}+{proj.target}",
                              "shape": shape.to_dict()})
                break
    taken: set[Any] = set()
    residual: set[str] = set()
    for node in gm.graph.nodes:
        if not is_conv(node):
            continue
        cur = node
        nxt = single_user(cur)
        if nxt is not None and nxt not in taken and bn_after(nxt, node):
            cur = nxt
            nxt = single_user(cur)
        ops = add_operands(nxt) if nxt is not None and nxt not in taken else None
        if ops is None:
            continue
        other = ops[1] if ops[0] is cur else ops[0]
        if value_shape(cur) is not None and value_shape(other) == value_shape(cur) == \
                value_shape(nxt):
            taken.add(nxt)
            residual.add(str(node.target))
    return FusedLayers(pairs, residual, _back_to_back(gm, shapes, pairs, residual, is_conv,
                                                      bn_after))


def _back_to_back(gm: Any, shapes: dict[str, ConvShape], pairs: list[dict[str, Any]],
                  residual: set[str], is_conv: Callable[[Any], bool],
                  bn_after: Callable[[Any, Any], bool]) -> list[dict[str, Any]]:
    """fused_layers' back-to-back layers: each conv's value at the end of what its epilogue
    takes (BatchNorm, its residual's or its pair's add, ReLU), and the 1x1 conv reading it."""
    pair_of = {p["name"].split("+")[0]: ConvShape.from_dict(p["shape"]) for p in pairs}
    adds = residual | set(pair_of)  # convs whose epilogue takes the add after them
    out = []
    for node in gm.graph.nodes:
        if not is_conv(node):
            continue
        name = str(node.target)
        cur, nxt = node, single_user(node)
        if nxt is not None and bn_after(nxt, node):
            cur, nxt = nxt, single_user(nxt)
        if nxt is not None and name in adds and add_operands(nxt) is not None:
            cur, nxt = nxt, single_user(nxt)
        if nxt is not None and is_relu(gm, nxt):
            cur = nxt
        for user in cur.users:
            second = shapes.get(str(user.target)) if is_conv(user) else None
            if second is None or user.args[0] is not cur or str(user.target) in adds or \
                    (second.r, second.s, second.stride, second.pad, second.dilation) != \
                    (1, 1, (1, 1), (0, 0), (1, 1)):
                continue
            first = pair_of.get(name) or replace(shapes[name], residual=name in residual)
            out.append({"name": f"{name}+{user.target}",
                        "shape": replace(first, b2b=second.k).to_dict()})
            break
    return out


# Spreading a plan's trials ------------------------------------------------------------------

ALLOCATIONS = ("time", "even")
# One run of a layer, estimated: a floor that small convs do not go below (their kernels are
# latency-bound: ResNet-50's convs at batch 8 take 4-15 us on an H100, bench/RESULTS.md) plus
# the multiply-adds at a share of the target's Tensor Core peak.
FLOOR_US = 3.0
PEAK_SHARE = 0.3
# A layer's trials against an even split: the square root of its share of the model's time
# (a search's gap to its best closes about as 1/trials, so the model's summed gap is least
# with trials in proportion to the root of each layer's time), held within these factors.
SPREAD = (0.5, 4.0)

LayerKey = tuple[ConvShape, str, str]


def layer_key(layer: Layer) -> LayerKey:
    return layer.shape, layer.precision, layer.target


def layer_time_us(shape: ConvShape, precision: str, target: str) -> float:
    """A rough estimate of one run of the layer, for weighing it against a model's others."""
    peak = get_target(target).peak(Precision(precision)) * 1e12
    return FLOOR_US + shape.flops / (peak * PEAK_SHARE) * 1e6


def trial_budgets(layers: list[Layer], trials: int, allocate: str = "time"
                  ) -> dict[LayerKey, int]:
    """The trials of each distinct layer (shape, precision, target) of a model: `trials` each
    ("even"), or `trials` on average, more to the layers that take more of the model's time
    (its uses x `layer_time_us`, "time"; at least 1 each)."""
    if allocate not in ALLOCATIONS:
        raise ValueError(f"allocate is one of {', '.join(ALLOCATIONS)}, not {allocate!r}")
    uses = Counter(layer_key(layer) for layer in layers)
    if allocate == "even" or len(uses) < 2:
        return dict.fromkeys(uses, trials)
    weight = {k: n * layer_time_us(*k) for k, n in uses.items()}
    mean = sum(weight.values()) / len(weight)
    share = {k: min(max(math.sqrt(w / mean), SPREAD[0]), SPREAD[1]) for k, w in weight.items()}
    scale = trials * len(share) / sum(share.values())
    return {k: max(1, round(v * scale)) for k, v in share.items()}


@dataclass
class Coverage:
    layers: int
    distinct: int
    tuned: int
    running: int
    submitted: int
    rows: list[dict[str, Any]]
    # job id -> names of the layers it tunes (each distinct untuned layer has one job)
    jobs: dict[int, list[str]] = field(default_factory=dict)


# How long one submission waits, in all, for the service's limits (POST /tune per minute,
# active jobs per token) before the plan gives up: a model of a few hundred distinct layers
# passes the rate limit in a few minutes, and its jobs free active-job slots as they end.
LIMIT_PATIENCE_S = 900.0


def submit_within_limits(submit: Callable[[], dict[str, Any]],
                         on_wait: Callable[[float], None] | None = None,
                         patience_s: float = LIMIT_PATIENCE_S,
                         sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """`submit()`, asked again after each 429 as long as its Retry-After says, until
    `patience_s` of waiting is spent (then the 429 is raised, as any other error at once)."""
    from api.client import TctuneError

    waited = 0.0
    while True:
        try:
            return submit()
        except TctuneError as err:
            wait = err.retry_after
            if err.status != 429 or wait is None or waited + wait > patience_s:
                raise
            if on_wait is not None:
                on_wait(wait)
            sleep(wait)
            waited += wait


def plan(client: Any, layers: list[Layer], trials: int, submit: bool = True,
         strategy: str | None = None, strategy_options: dict[str, Any] | None = None,
         allocate: str = "time", on_wait: Callable[[float], None] | None = None) -> Coverage:
    """Look every layer up; submit the distinct untuned ones (unless `submit` is off), each
    with its share of the trials (`trial_budgets` over the untuned layers). A submission the
    service's limits refuse waits as the service says (`submit_within_limits`; `on_wait`
    hears each wait)."""
    results = client.lookup([(la.shape, la.precision, la.target) for la in layers])
    budgets = trial_budgets([la for la, res in zip(layers, results, strict=True)
                             if not res["found"]], trials, allocate)
    rows, submitted_keys, running, submitted = [], {}, 0, 0
    for layer, res in zip(layers, results, strict=True):
        state = "tuned" if res["found"] else "untuned"
        if not res["found"] and submit:
            key = res["task_key"]
            if key not in submitted_keys:
                job = submit_within_limits(partial(
                    client.tune, layer.shape, layer.precision, layer.target,
                    budgets[layer_key(layer)], strategy, strategy_options=strategy_options),
                    on_wait)
                submitted_keys[key] = job
                if job["created"]:
                    submitted += 1
                else:
                    running += 1
            state = f"job {submitted_keys[key]['job_id']}"
        job = submitted_keys.get(res["task_key"])
        # The trials this plan gives the layer's job (none where it is tuned, or where a job
        # of its task was running already, with its own budget).
        budget = None if res["found"] or (job and not job["created"]) else \
            budgets[layer_key(layer)]
        rows.append({"name": layer.name, "task_key": res["task_key"], "state": state,
                     "latency_us": res.get("latency_us"),
                     "job_id": job["job_id"] if job else None, "trials": budget})
    distinct = len({r["task_key"] for r in rows})
    tuned = len({r["task_key"] for r, res in zip(rows, results, strict=True) if res["found"]})
    jobs: dict[int, list[str]] = {}
    for r in rows:
        if r["job_id"] is not None:
            jobs.setdefault(r["job_id"], []).append(r["name"])
    return Coverage(len(layers), distinct, tuned, running, submitted, rows, jobs)
