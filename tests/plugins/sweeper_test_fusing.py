"""Plugins for tests of fused trials that must not fuse: an optimizer that says so
(``sweeper_fusable = False``) and a model whose forward branches on its data, which vmap cannot
batch (it fails at the fused model's first step). Both train fine alone. Installed by the
``unfusable`` fixture (tests/test_fused_sweeps.py) as entry points."""

from __future__ import annotations

import torch
from torch import nn


def lonely_sgd(params, lr: float = 0.01, momentum: float = 0.0) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=lr, momentum=momentum)


lonely_sgd.sweeper_fusable = False  # type: ignore[attr-defined]


class Branchy(nn.Module):
    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(int(torch.tensor(input_shape).prod()), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x.flatten(1))
        if out.mean() > 100:  # data-dependent control flow: fine eagerly, refused under vmap
            out = out / 2
        return out


def branchy(*, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return Branchy(input_shape, num_classes)
