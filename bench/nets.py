"""ResNet-18 and ResNet-50 (v1.5: the stride on the 3x3 conv) and DenseNet-121 as torchvision
builds them, for machines without torchvision, and a U-Net (`UNet`, torchvision has none);
`model(name)` prefers torchvision's own module. Weights are
PyTorch's random init, and the BatchNorm statistics and affine parameters are random too
(`randomize_bn`), so that folding them is exercised with values far from identity."""

from __future__ import annotations

from collections import OrderedDict

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


class DenseLayer(nn.Module):
    """Pre-activation: BN + ReLU + 1x1 conv to 4 x growth, BN + ReLU + 3x3 conv to growth,
    over the concatenation of every earlier feature map of the block."""

    def __init__(self, cin: int, growth: int = 32, bn_size: int = 4) -> None:
        super().__init__()
        self.norm1, self.relu1 = nn.BatchNorm2d(cin), nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2, self.relu2 = nn.BatchNorm2d(bn_size * growth), nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = self.conv1(self.relu1(self.norm1(torch.cat(features, 1))))
        return self.conv2(self.relu2(self.norm2(x)))


class DenseBlock(nn.ModuleDict):
    def __init__(self, layers: int, cin: int, growth: int = 32) -> None:
        super().__init__()
        for i in range(layers):
            self.add_module(f"denselayer{i + 1}", DenseLayer(cin + i * growth, growth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.values():
            features.append(layer(features))
        return torch.cat(features, 1)


class DenseNet(nn.Module):
    """DenseNet-121 (growth 32, blocks 6-12-24-16, 64 initial features): a 7x7 stem, max-pool,
    dense blocks joined by transitions (BN + ReLU + 1x1 conv halving the channels + 2x2
    average pool), BN, ReLU, global average pool, a linear classifier."""

    def __init__(self, blocks: tuple[int, ...] = (6, 12, 24, 16), growth: int = 32,
                 init: int = 64, classes: int = 1000) -> None:
        super().__init__()
        f: OrderedDict[str, nn.Module] = OrderedDict(
            conv0=nn.Conv2d(3, init, 7, 2, 3, bias=False), norm0=nn.BatchNorm2d(init),
            relu0=nn.ReLU(inplace=True), pool0=nn.MaxPool2d(3, 2, 1))
        ch = init
        for i, n in enumerate(blocks):
            f[f"denseblock{i + 1}"] = DenseBlock(n, ch, growth)
            ch += n * growth
            if i + 1 < len(blocks):
                f[f"transition{i + 1}"] = nn.Sequential(OrderedDict(
                    norm=nn.BatchNorm2d(ch), relu=nn.ReLU(inplace=True),
                    conv=nn.Conv2d(ch, ch // 2, 1, bias=False), pool=nn.AvgPool2d(2, 2)))
                ch //= 2
        f["norm5"] = nn.BatchNorm2d(ch)
        self.features = nn.Sequential(f)
        self.classifier = nn.Linear(ch, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.features(x))
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


LOCAL = {"resnet18": lambda: ResNet(BasicBlock, [2, 2, 2, 2]),
         "resnet50": lambda: ResNet(Bottleneck, [3, 4, 6, 3]), "densenet121": DenseNet}


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
        net, source = LOCAL[name](), "bench.nets (torchvision's structure)"
    return randomize_bn(net, seed).eval(), source
