"""Small PyTorch networks for the deploy tests: a ResNet with BasicBlock and Bottleneck blocks
(torchvision's structure, built here: torchvision is not a dependency) and odd layers.

Weights are random (PyTorch's init), and so are the BatchNorm statistics and affine
parameters (`randomize_bn`), so that folding is exercised with values far from identity.
"""

from __future__ import annotations

import torch
from torch import nn


def randomize_bn(model: nn.Module, seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            k = m.num_features
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(k, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(k, generator=g) * 1.5 + 0.5)
                m.weight.copy_(torch.rand(k, generator=g) * 0.8 + 0.6)
                m.bias.copy_(torch.randn(k, generator=g) * 0.1)
    return model


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != planes:
            self.downsample = nn.Sequential(nn.Conv2d(cin, planes, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        width = planes
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != planes * 4:
            self.downsample = nn.Sequential(nn.Conv2d(cin, planes * 4, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes * 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


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
