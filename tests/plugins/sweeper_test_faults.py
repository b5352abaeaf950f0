"""Model plugins for tests of what a sweep does when trials fail (tests/test_faults.py); both
build and take a tiny batch fine (the dry build before the first trial passes), then:

- ``greedy``: raises CUDA's out-of-memory error when a training micro-batch holds more than
  ``fits`` samples, as a GPU would for a model too big for its batch: a trial succeeds once
  ``train.accumulate`` has made its micro-batches small enough.
- ``broken``: raises the same RuntimeError on every training batch larger than ``above``
  samples: a bug every trial hits (the circuit breaker's case).
- ``faulting``: raises what CUDA raises after a kernel's illegal memory access (the process's
  CUDA context is then lost) on every training batch larger than ``above`` samples."""

from __future__ import annotations

import math

import torch
from torch import nn


class _Limited(nn.Module):
    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, limit: int, error: type[Exception], message: str
    ) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))
        self.limit, self.error, self.message = limit, error, message

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and len(x) > self.limit:
            raise self.error(self.message.format(n=len(x)))
        return self.net(x)


def greedy(*, input_shape: tuple[int, ...], num_classes: int, fits: int = 8) -> nn.Module:
    return _Limited(
        input_shape,
        num_classes,
        fits,
        torch.cuda.OutOfMemoryError,
        "CUDA out of memory. Tried to allocate 2.00 GiB for a micro-batch of {n} samples",
    )


def broken(*, input_shape: tuple[int, ...], num_classes: int, above: int = 16) -> nn.Module:
    return _Limited(input_shape, num_classes, above, RuntimeError, "the fused kernel failed on a batch of {n} samples")


def faulting(*, input_shape: tuple[int, ...], num_classes: int, above: int = 16) -> nn.Module:
    return _Limited(
        input_shape,
        num_classes,
        above,
        torch.AcceleratorError,
        "CUDA error: an illegal memory access was encountered (a batch of {n} samples)",
    )
