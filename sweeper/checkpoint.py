"""Trial checkpoints: model + optimizer + scheduler + epoch, written atomically, read safely."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch


def save(path: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
         epoch: int, extra: dict[str, Any] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict() if scheduler is not None else None,
             "epoch": epoch, **(extra or {})}
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # a reader never sees half a file
    return path


def load(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """weights_only=True: tensors and plain containers only, no arbitrary code from the file."""
    return torch.load(path, map_location=map_location, weights_only=True)


def trial_path(out_dir: Path, number: int) -> Path:
    """Where a sweep keeps trial ``number``'s checkpoint (the best trial's is kept for export)."""
    return out_dir / "checkpoints" / f"trial-{number:05d}.pt"
