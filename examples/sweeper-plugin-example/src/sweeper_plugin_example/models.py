"""Model plugin `gated_mlp`: an MLP of gated (GLU) residual blocks, for inputs of any shape."""

from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import nn

from sweeper.plugin import Choice, IntRange, Uniform

# The sweeper plugin API this module targets; sweeper refuses it if it implements another.
SWEEPER_PLUGIN_API = 1


class GatedBlock(nn.Module):
    """x + Dropout(Linear(value * sigmoid(gate))), value and gate from one Linear of the
    normalised input (GLU, Dauphin et al. 2017)."""

    def __init__(self, width: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * hidden)
        self.down = nn.Linear(hidden, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.up(self.norm(x)).chunk(2, dim=-1)
        return x + self.drop(self.down(value * torch.sigmoid(gate)))


def gated_mlp(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    # each with its search prior, for `search.space: auto` (the default is what a trial without it gets)
    width: Annotated[int, IntRange(16, 256, log=True)] = 64,
    depth: Annotated[int, IntRange(1, 4)] = 2,
    expansion: Annotated[int, Choice(1, 2, 4)] = 2,
    dropout: Annotated[float, Uniform(0.0, 0.5)] = 0.0,
) -> nn.Module:
    """Flatten -> Linear(width) -> ``depth`` gated residual blocks (hidden = width * expansion)
    -> LayerNorm -> Linear(num_classes).

    sweeper passes ``input_shape`` and ``num_classes`` (from the data set); every other
    keyword argument can be set in a spec's ``model.args`` and searched."""
    layers: list[nn.Module] = [nn.Flatten(), nn.Linear(math.prod(input_shape), width)]
    layers += [GatedBlock(width, width * expansion, dropout) for _ in range(depth)]
    layers += [nn.LayerNorm(width), nn.Linear(width, num_classes)]
    return nn.Sequential(*layers)
