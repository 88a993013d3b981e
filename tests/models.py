"""Small PyTorch models for the tests of `tctune plan` on a module (`tests.models:NAME`)."""

from __future__ import annotations

import torch
from torch import nn

from bench.nets import BasicBlock


class SmallResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 7, stride=2, padding=3, bias=False),
                                  nn.BatchNorm2d(16), nn.ReLU())
        self.layer1 = nn.Sequential(BasicBlock(16, 16), BasicBlock(16, 16))
        self.layer2 = nn.Sequential(BasicBlock(16, 32, stride=2), BasicBlock(32, 32))
        self.grouped = nn.Conv2d(32, 32, 3, padding=1, groups=4)  # left out: groups=1 only
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.grouped(self.layer2(self.layer1(self.stem(x))))
        return self.head(x.mean(dim=(2, 3)))


def small_resnet() -> nn.Module:
    """10 convs with groups=1 at input 2,3,32,32, of 5 distinct shapes: the 3-channel 7x7
    stride-2 stem, layer1's four 3x3 convs (one shape), layer2's strided 3x3, its three
    3x3 convs at 32 channels (one shape) and its 1x1 strided projection; 7 distinct layers
    to tune for int8 and fp16, where each block's second conv adds the block's residual
    (ConvShape.residual)."""
    return SmallResNet()


def not_a_model() -> str:
    return "a string"


class ReadsAValue(nn.Module):
    """Reads a value in forward (`.item()`), which no meta tensor has: planned on the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y * 2 if y.abs().max().item() > 1e9 else y


def reads_a_value() -> nn.Module:
    return ReadsAValue()
