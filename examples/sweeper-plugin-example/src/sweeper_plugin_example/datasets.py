"""Data set plugin `spirals`: interleaved 2-D spirals, one class per arm. Generated, offline."""

from __future__ import annotations

import math

import torch

from sweeper.plugin import DataSplits

SWEEPER_PLUGIN_API = 1


def spirals(
    *, num_train: int = 1024, num_val: int = 256, arms: int = 3, turns: float = 1.0, noise: float = 0.05, seed: int = 0
) -> DataSplits:
    """``arms`` spirals of ``turns`` turns each, points at uniform radius in [0, 1] plus
    Gaussian ``noise`` (same units as the radius). Inputs have shape (2,).

    ``seed`` is passed by sweeper (derived from the sweep seed), so every trial sees the same points."""
    g = torch.Generator().manual_seed(seed)
    n = num_train + num_val
    label = torch.randint(0, arms, (n,), generator=g)
    radius = torch.rand(n, generator=g)
    angle = 2 * math.pi * (turns * radius + label / arms)
    x = torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=1)
    x = x + noise * torch.randn(n, 2, generator=g)
    return DataSplits(
        train_x=x[:num_train],
        train_y=label[:num_train],
        val_x=x[num_train:],
        val_y=label[num_train:],
        num_classes=arms,
        class_names=tuple(f"arm {i}" for i in range(arms)),
    )
