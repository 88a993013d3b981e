"""ResNet-18 and ResNet-50 as torchvision builds them (v1.5: the stride on the 3x3 conv),
for machines without torchvision, and a U-Net (`UNet`, torchvision has none); `model(name)`
prefers torchvision's own module. Weights are
PyTorch's random init, and the BatchNorm statistics and affine parameters are random too
(`randomize_bn`), so that folding them is exercised with values far from identity."""

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


def _down(cin: int, cout: int, stride: int) -> nn.Module | None:
    if stride == 1 and cin == cout:
        return None
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = _down(cin, planes, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torchvision's order: the shortcut after the main path
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x if self.downsample is None else self.downsample(x)
        return self.relu(out)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _down(cin, planes * 4, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += x if self.downsample is None else self.downsample(x)
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int],
                 classes: int = 1000, width: int = 64) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin, stages = width, []
        for i, n in enumerate(layers):
            planes = width * 2 ** i
            blocks = []
            for j in range(n):
                blocks.append(block(cin, planes, 2 if (j == 0 and i > 0) else 1))
                cin = planes * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class DoubleConv(nn.Module):
    """A U-Net level's two 3x3 convs (pad 1, no bias: BatchNorm follows), each + BN + ReLU."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x))))))


class UNet(nn.Module):
    """The usual U-Net: `levels` 2x2 max-pool steps down (width 64 -> 64 * 2**levels
    channels: 64-1024 with 4), each level a double 3x3 conv; back up by 2x2 stride-2
    transposed convs (halving the channels), the skip concatenated, a double conv; a final
    1x1 conv to `classes`. Spatial sizes must divide by 2**levels (256x256 in bench.zoo)."""

    def __init__(self, cin: int = 3, classes: int = 2, width: int = 64, levels: int = 4
                 ) -> None:
        super().__init__()
        ch = [width * 2 ** i for i in range(levels + 1)]
        self.inc = DoubleConv(cin, ch[0])
        self.pool = nn.MaxPool2d(2)
        self.down = nn.ModuleList(DoubleConv(ch[i], ch[i + 1]) for i in range(levels))
        self.up = nn.ModuleList(nn.ConvTranspose2d(ch[i + 1], ch[i], 2, 2)
                                for i in reversed(range(levels)))
        self.dec = nn.ModuleList(DoubleConv(2 * ch[i], ch[i]) for i in reversed(range(levels)))
        self.outc = nn.Conv2d(ch[0], classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inc(x)
        skips = []
        for down in self.down:
            skips.append(x)
            x = down(self.pool(x))
        for up, dec in zip(self.up, self.dec, strict=True):
            x = dec(torch.cat([skips.pop(), up(x)], dim=1))
        return self.outc(x)


LOCAL = {"resnet18": (BasicBlock, [2, 2, 2, 2]), "resnet50": (Bottleneck, [3, 4, 6, 3])}


def model(name: str, seed: int = 0) -> tuple[nn.Module, str]:
    """(eval-mode module with random weights and BatchNorm statistics, where it came from)."""
    torch.manual_seed(seed)
    try:
        import torchvision

        net, source = getattr(torchvision.models, name)(weights=None), "torchvision"
    except ImportError:
        if name not in LOCAL:
            raise SystemExit(f"{name} needs torchvision (local builds: {', '.join(LOCAL)})"
                             ) from None
        block, layers = LOCAL[name]
        net, source = ResNet(block, layers), "bench.nets (torchvision's structure)"
    return randomize_bn(net, seed).eval(), source
