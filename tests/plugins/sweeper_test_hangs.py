"""Plugins for tests of train.max_trial_seconds (tests/test_budgets.py): trials that hang on
purpose where a trial really hangs; both build and take the dry build's tiny batch fine.

- model ``sleepy``: with ``hang: native``, its training forward sleeps for an hour inside one
  native call (``time.sleep``), as a collective waiting for a dead peer: no Python runs in that
  thread, so only killing its process stops it. ``hang: "no"`` trains normally.
- data set ``stuck_reader``: DataLoader path (DatasetSplits); the first sample read in any
  DataLoader worker process hangs for ever (as a read from a dead network share), every other
  read returns at once. ``marker``: a file the hanging read creates (atomically: one read hangs).
"""

from __future__ import annotations

import math
import os
import threading
import time

import torch
from torch import nn
from torch.utils.data import Dataset, get_worker_info

from sweeper.plugin import DatasetSplits


class _Sleepy(nn.Module):
    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hang: str) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))
        self.hang = hang

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.hang == "native" and len(x) > 4:
            time.sleep(3600)
        return self.net(x)


def sleepy(*, input_shape: tuple[int, ...], num_classes: int, hang: str = "no") -> nn.Module:
    return _Sleepy(input_shape, num_classes, hang)


class _Reader(Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor, marker: str) -> None:
        self.x, self.y, self.marker = x, y, marker

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.marker and get_worker_info() is not None:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                threading.Event().wait()  # for ever
        return self.x[i], self.y[i]


def stuck_reader(*, marker: str = "", num_train: int = 128, num_val: int = 32) -> DatasetSplits:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(num_train + num_val, 1, 4, 4, generator=g)
    y = (x.flatten(1) @ torch.randn(16, 3, generator=g)).argmax(1)
    return DatasetSplits(
        train=_Reader(x[:num_train], y[:num_train], marker),
        val=_Reader(x[num_train:], y[num_train:], ""),
        train_y=y[:num_train],
        val_y=y[num_train:],
        sample_shape=(1, 4, 4),
        num_classes=3,
    )
