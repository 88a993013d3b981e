"""Small PyTorch networks for the deploy tests: a ResNet with BasicBlock and Bottleneck blocks
(torchvision's, as bench/nets.py builds them: torchvision is not a dependency) and odd layers.

Weights are random (PyTorch's init), and so are the BatchNorm statistics and affine
parameters (`randomize_bn`), so that folding is exercised with values far from identity.
"""

from __future__ import annotations

import torch
from torch import nn

from bench.nets import BasicBlock, Bottleneck, randomize_bn


class SmallResNet(nn.Module):
    """stem (7x7/2 conv, BN, ReLU, 3x3/2 max-pool), two BasicBlocks, two Bottlenecks,
    average pool and a linear classifier."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = nn.Sequential(BasicBlock(32, 32), BasicBlock(32, 64, stride=2))
        self.layer2 = nn.Sequential(Bottleneck(64, 32, stride=2), Bottleneck(128, 32))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(128, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def small_resnet(seed: int = 0) -> SmallResNet:
    torch.manual_seed(seed)
    return randomize_bn(SmallResNet(), seed).eval()  # type: ignore[return-value]
