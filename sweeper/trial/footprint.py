"""What a trained model costs, for the objectives ``params`` and ``latency_ms``
(spec/objectives.py), measured in the trial's process once it has trained.

- ``params``: the model's parameter count (every tensor of ``model.parameters()``; buffers such
  as BatchNorm statistics are not parameters).
- ``latency_ms``: the median wall time, in milliseconds, of one forward pass over the first
  evaluation batch (``train.eval_batch_size`` validation rows, fewer when the split is smaller),
  as the trainer evaluates: eval mode, inference mode, the trial's autocast and memory layout,
  on its device with its CPU threads; 3 untimed passes, then the median of 10 (CUDA synchronised
  around each). A measured time: other work on the machine changes it, so a sweep optimising it
  is not reproducible bit for bit (docs/multi-objective.md).
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from sweeper.plugin import DatasetSplits, DataSplits
from sweeper.spec import SweepSpec
from sweeper.trial import speed
from sweeper.trial.trainer import amp_dtype, autocast

WARMUP = 3  # untimed passes: first-call allocations, kernel selection, caches
TIMED = 10  # passes timed; their median is the latency


def measure(model: nn.Module, data: DataSplits | DatasetSplits, spec: SweepSpec) -> dict[str, float]:
    """The footprint of a trained model: ``params`` always (it is free), ``latency_ms`` when
    the sweep optimises it (it costs 13 forward passes)."""
    out = {"params": float(sum(p.numel() for p in model.parameters()))}
    if any(g.metric == "latency_ms" for g in spec.goals):
        out["latency_ms"] = latency_ms(model, data, spec)
    return out


def latency_ms(model: nn.Module, data: DataSplits | DatasetSplits, spec: SweepSpec) -> float:
    device = data.val_y.device
    layout = speed.channels_last(model, device)
    # (DatasetSplits: collated on the CPU; a padded sequence batch is timed without its mask)
    batch = speed.as_input(data.val_inputs(spec.train.eval_batch_size).to(device), layout)
    training = model.training
    model.eval()
    times = []
    try:
        with torch.inference_mode(), autocast(device, amp_dtype(device, spec.train.precision)):
            for i in range(WARMUP + TIMED):
                _sync(device)
                started = time.perf_counter()
                model(batch)
                _sync(device)
                if i >= WARMUP:
                    times.append(time.perf_counter() - started)
    finally:
        model.train(training)
    return statistics.median(times) * 1000.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
