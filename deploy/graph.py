"""The model as a torch.fx graph: which convs the kernel can run, and the patterns it fuses.

A chain starts at an `nn.Conv2d` call and extends, while each value has exactly one user
(otherwise another op still needs it), through:
    conv -> [BatchNorm2d] -> [add(residual)] -> [ReLU]
The kernel's epilogue computes exactly this: the BN folds into weights and bias, the add is
its residual input (added before the ReLU), the ReLU its clamp. conv -> bn -> relu -> add
(the add after the ReLU) fuses up to the ReLU; the add stays a PyTorch op.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch.nn.functional as F
from torch import fx, nn

from api.plan import add_operands, is_relu, single_user
from api.plan import foldable_bn as bn_folds
from kernels.spec import ConvShape, Precision, Target


def trace(model: nn.Module) -> fx.GraphModule:
    try:
        return fx.symbolic_trace(model)
    except Exception as exc:  # noqa: BLE001 - any tracing failure is reported the same way
        raise ValueError(f"the model cannot be traced by torch.fx ({exc}); deploy needs a "
                         f"traceable forward (no data-dependent control flow)") from exc


def module_of(gm: fx.GraphModule, node: fx.Node) -> nn.Module | None:
    if node.op != "call_module":
        return None
    return gm.get_submodule(str(node.target))


def is_conv(gm: fx.GraphModule, node: fx.Node) -> bool:
    m = module_of(gm, node)
    # Exactly nn.Conv2d's forward: a subclass may compute something else (weight
    # standardization, a quantized conv); those stay in PyTorch.
    return isinstance(m, nn.Conv2d) and type(m).forward is nn.Conv2d.forward


def foldable_bn(gm: fx.GraphModule, node: fx.Node, channels: int) -> bool:
    return bn_folds(module_of(gm, node), channels)


def _pair(v: int | tuple[int, ...]) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    return (int(v[0]), int(v[-1]))


def conv_shape(conv: nn.Conv2d, in_shape: tuple[int, ...] | None
               ) -> tuple[ConvShape | None, str]:
    """The layer as the kernel sees it (NHWC/KRSC, batch and size of the example input), or
    None and why PyTorch's conv has no counterpart (before the kernel's own limits)."""
    if in_shape is None or len(in_shape) != 4:
        return None, f"input is not a 4-D batch (shape {in_shape})"
    if conv.padding_mode != "zeros":
        return None, f"padding_mode={conv.padding_mode!r} (the kernel pads with zeros)"
    r, s = _pair(conv.kernel_size)
    dil = _pair(conv.dilation)
    if isinstance(conv.padding, str):
        if conv.padding == "valid":
            pad = (0, 0)
        else:  # 'same': symmetric only where the filter's span is odd
            spans = (dil[0] * (r - 1), dil[1] * (s - 1))
            if spans[0] % 2 or spans[1] % 2:
                return None, "padding='same' would be asymmetric (the kernel pads symmetrically)"
            pad = (spans[0] // 2, spans[1] // 2)
    else:
        pad = _pair(conv.padding)
    n, c, h, w = in_shape
    return ConvShape(n, h, w, c, int(conv.out_channels), r, s, stride=_pair(conv.stride),
                     pad=pad, dilation=dil, groups=int(conv.groups)), ""


def kernel_problems(shape: ConvShape, precision: Precision, target: Target) -> str:
    """Why the kernel cannot run this layer ('' if it can): ConvShape.problems' reasons."""
    return "; ".join(f"{k}: {v}" for k, v in shape.problems(precision, target))


@dataclass
class Chain:
    """One fusable conv pattern: the nodes it covers, in order."""

    conv: fx.Node
    bn: fx.Node | None = None
    add: fx.Node | None = None
    relu: fx.Node | None = None

    @property
    def residual(self) -> fx.Node | None:
        """The add's other operand, as the graph has it now (another chain fused before
        this one may have replaced the node that computes it)."""
        if self.add is None:
            return None
        pre = self.bn if self.bn is not None else self.conv
        ops = add_operands(self.add)
        assert ops is not None
        return ops[1] if ops[0] is pre else ops[0]

    @property
    def name(self) -> str:
        return str(self.conv.target)

    @property
    def nodes(self) -> list[fx.Node]:
        return [n for n in (self.conv, self.bn, self.add, self.relu) if n is not None]

    @property
    def last(self) -> fx.Node:
        return self.nodes[-1]


def find_chains(gm: fx.GraphModule, convs: Iterable[fx.Node]) -> list[Chain]:
    """The chains of the given conv nodes (those that will be replaced), in graph order.

    Two chains can meet at one add (a bottleneck's main path and its downsample conv): the
    first in graph order takes it, the other ends before it and its value is the residual.
    """
    wanted = set(convs)
    taken: set[fx.Node] = set()
    chains: list[Chain] = []
    for node in gm.graph.nodes:
        if node not in wanted:
            continue
        ch = Chain(node)
        out_ch = int(module_of(gm, node).out_channels)  # type: ignore[union-attr]
        cur = node
        nxt = single_user(cur)
        if nxt is not None and nxt not in taken and foldable_bn(gm, nxt, out_ch):
            ch.bn = cur = nxt
            nxt = single_user(cur)
        ops = add_operands(nxt) if nxt is not None and nxt not in taken else None
        if ops is not None and nxt is not None:
            res = ops[1] if ops[0] is cur else ops[0]
            if cur.meta.get("deploy_shape") is not None and \
                    res.meta.get("deploy_shape") == cur.meta.get("deploy_shape") and \
                    nxt.meta.get("deploy_shape") == cur.meta.get("deploy_shape"):
                ch.add = nxt
                cur = nxt
                nxt = single_user(cur)
        if nxt is not None and nxt not in taken and is_relu(gm, nxt):
            ch.relu = nxt
        taken.update(ch.nodes)
        chains.append(ch)
    return chains


def projection_of(chain: Chain, chains: Iterable[Chain]) -> Chain | None:
    """The chain whose output `chain` adds (its residual) and nothing else follows (BN at
    most, no ReLU): with `chain` a ResNet bottleneck's last conv, its projection shortcut.
    Whether the two are one GEMM over both inputs is their shapes' to say
    (kernels.spec.two_input_shape)."""
    res = chain.residual
    if res is None:
        return None
    return next((other for other in chains if other is not chain and other.last is res
                 and other.add is None and other.relu is None), None)


def fuse_concat(gm: fx.GraphModule, chain: Chain, proj: Chain, name: str,
                module: nn.Module) -> fx.Node:
    """Replace both chains by one call of `module` on (projection input, None, chain input):
    x is the projection's input, x1 the chain's (FusedConv's concat), placed where the
    chain's last node was."""
    gm.add_submodule(name, module)
    last = chain.last
    with gm.graph.inserting_before(last):
        new = gm.graph.call_module(name, (proj.conv.args[0], None, chain.conv.args[0]))
    new.meta.update({k: v for k, v in last.meta.items() if k.startswith("deploy_")})
    last.replace_all_uses_with(new)
    for n in reversed(chain.nodes):  # the add goes first: then the projection has no users
        gm.graph.erase_node(n)
    for n in reversed(proj.nodes):
        gm.graph.erase_node(n)
    return new


def fuse(gm: fx.GraphModule, chain: Chain, name: str, module: nn.Module) -> fx.Node:
    """Replace the chain's nodes by one call of `module` (registered as `name`) on
    (conv input[, residual]), placed where the chain's last node was: every input exists
    there, the residual included."""
    gm.add_submodule(name, module)
    x = chain.conv.args[0]
    args = (x,) if chain.residual is None else (x, chain.residual)
    last = chain.last
    with gm.graph.inserting_before(last):
        new = gm.graph.call_module(name, args)
    new.meta.update({k: v for k, v in last.meta.items() if k.startswith("deploy_")})
    last.replace_all_uses_with(new)
    for n in reversed(chain.nodes):
        gm.graph.erase_node(n)
    return new


def is_global_avg_pool(gm: fx.GraphModule, node: fx.Node) -> bool:
    """An average pool of one tensor to one pixel (adaptive_avg_pool2d to 1 x 1)."""
    def one_pixel(size: object) -> bool:
        return size in (1, (1, 1), [1, 1])

    if node.op == "call_module":
        m = module_of(gm, node)
        return type(m) is nn.AdaptiveAvgPool2d and one_pixel(m.output_size) and \
            len(node.args) == 1
    if node.op == "call_function" and node.target is F.adaptive_avg_pool2d:
        size = node.args[1] if len(node.args) > 1 else node.kwargs.get("output_size")
        return one_pixel(size)
    return False


def is_max_pool(gm: fx.GraphModule, node: fx.Node) -> bool:
    """A max-pool of one tensor with constant arguments (commutes with a positive scale,
    so it may run on int8 / fp16 values)."""
    if node.op == "call_module":
        m = module_of(gm, node)
        return type(m) is nn.MaxPool2d and not m.return_indices and len(node.args) == 1
    if node.op == "call_function" and node.target is F.max_pool2d:
        rest = list(node.args[1:]) + list(node.kwargs.values())
        return not any(isinstance(a, fx.Node) for a in rest) and \
            not node.kwargs.get("return_indices", False)
    return False
