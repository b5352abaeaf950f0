"""Built-in models: mlp, cnn, resnet18 (CIFAR variant). All TorchScript-scriptable."""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field
from torch import nn

from sweeper.plugin import DATA_KINDS_ATTR, IntRange, Uniform

# The ranges sweeper checks each value against before any trial (fixed or searched): far above
# any model that trains here, far below what exhausts memory while building one (a typo).
Width = Annotated[int, Field(ge=1, le=65_536)]  # units (features or channels) of a layer
Depth = Annotated[int, Field(ge=0, le=1_000)]  # repeated layers or blocks
Probability = Annotated[float, Field(ge=0.0, le=1.0)]


def mlp(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    hidden: Annotated[Width, IntRange(32, 512, log=True)] = 256,
    depth: Annotated[Depth, IntRange(1, 4)] = 2,
    dropout: Annotated[Probability, Uniform(0.0, 0.5)] = 0.0,
) -> nn.Module:
    """Flatten -> ``depth`` x (Linear(hidden) -> ReLU -> Dropout) -> Linear(num_classes)."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout)]
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def _conv_bn(c_in: int, c_out: int, stride: int = 1) -> list[nn.Module]:
    return [
        nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    ]


def cnn(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    channels: Annotated[Width, IntRange(16, 128, log=True)] = 32,
    # channels double per block: 2**16 times the first at most
    blocks: Annotated[int, Field(ge=1, le=16), IntRange(1, 3)] = 2,
    dropout: Annotated[Probability, Uniform(0.0, 0.5)] = 0.0,
) -> nn.Module:
    """``blocks`` x (2 conv3x3-BN-ReLU, channels doubling, 2x2 max-pool) -> global avg pool -> Linear.

    Pooling stops once the feature map is 2x2, so 8x8 digits and 32x32 CIFAR both work."""
    c_in, size = input_shape[0], min(input_shape[1:])
    layers: list[nn.Module] = []
    width = channels
    for _ in range(blocks):
        layers += _conv_bn(c_in, width) + _conv_bn(width, width)
        if size >= 4:
            layers.append(nn.MaxPool2d(2))
            size //= 2
        c_in, width = width, width * 2
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout), nn.Linear(c_in, num_classes)]
    return nn.Sequential(*layers)


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            *_conv_bn(c_in, c_out, stride)[:2],
            nn.ReLU(inplace=True),
            nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
        )
        self.shortcut = (
            nn.Identity()
            if stride == 1 and c_in == c_out
            else nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))
        )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.body(x) + self.shortcut(x))


def resnet18(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    width: Annotated[int, Field(ge=1, le=4096), IntRange(16, 128, log=True)] = 64,
) -> nn.Module:
    """ResNet-18 for small images: 3x3 stride-1 stem, no max-pool, stages of width
    ``width * (1, 2, 4, 8)`` with 2 basic blocks each (He et al. 2016, CIFAR variant)."""
    layers: list[nn.Module] = _conv_bn(input_shape[0], width)
    c_in = width
    for stage, mult in enumerate((1, 2, 4, 8)):
        c_out = width * mult
        layers += [BasicBlock(c_in, c_out, 1 if stage == 0 else 2), BasicBlock(c_out, c_out, 1)]
        c_in = c_out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, num_classes)]
    return nn.Sequential(*layers)


# The kinds of data each takes (sweeper.plugin.DATA_KINDS_ATTR): the MLP flattens any fixed-shape sample.
setattr(mlp, DATA_KINDS_ATTR, ("table", "sequence", "image"))
setattr(cnn, DATA_KINDS_ATTR, ("image",))
setattr(resnet18, DATA_KINDS_ATTR, ("image",))
