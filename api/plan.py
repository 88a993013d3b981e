"""Plan a model's tuning: its conv layers, which are tuned, and submitting the rest.

A model is a JSON file (`tctune plan model.json`):

    {"precision": "int8", "target": "h100",
     "layers": [{"name": "layer1.0.conv2", "shape": {"n": 8, "h": 56, ...}}, ...]}

(each layer may override precision/target), or it comes from a PyTorch module traced for
its Conv2d layers with `conv_layers()`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernels.spec import ConvShape


@dataclass(frozen=True)
class Layer:
    name: str
    shape: ConvShape
    precision: str
    target: str


def load_model(path: str | Path) -> list[Layer]:
    spec = json.loads(Path(path).read_text())
    if not isinstance(spec, dict) or not isinstance(spec.get("layers"), list):
        raise ValueError("a model file is an object with a list 'layers'")
    out = []
    for i, item in enumerate(spec["layers"]):
        try:
            shape = ConvShape.from_dict(item["shape"])
            precision = item.get("precision", spec.get("precision"))
            target = item.get("target", spec.get("target"))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"layer {i}: {exc!r}") from None
        if not precision or not target:
            raise ValueError(f"layer {i}: precision and target are needed (per layer or top)")
        out.append(Layer(str(item.get("name", f"conv{i}")), shape, precision, target))
    return out


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


@dataclass
class Coverage:
    layers: int
    distinct: int
    tuned: int
    running: int
    submitted: int
    rows: list[dict[str, Any]]


def plan(client: Any, layers: list[Layer], trials: int, submit: bool = True,
         strategy: str | None = None) -> Coverage:
    """Look every layer up; submit the distinct untuned ones (unless `submit` is off)."""
    results = client.lookup([(la.shape, la.precision, la.target) for la in layers])
    rows, submitted_keys, running, submitted = [], {}, 0, 0
    for layer, res in zip(layers, results, strict=True):
        state = "tuned" if res["found"] else "untuned"
        if not res["found"] and submit:
            key = res["task_key"]
            if key not in submitted_keys:
                job = client.tune(layer.shape, layer.precision, layer.target, trials, strategy)
                submitted_keys[key] = job
                if job["created"]:
                    submitted += 1
                else:
                    running += 1
            state = f"job {submitted_keys[key]['job_id']}"
        rows.append({"name": layer.name, "task_key": res["task_key"], "state": state,
                     "latency_us": res.get("latency_us")})
    distinct = len({r["task_key"] for r in rows})
    tuned = len({r["task_key"] for r, res in zip(rows, results, strict=True) if res["found"]})
    return Coverage(len(layers), distinct, tuned, running, submitted, rows)
