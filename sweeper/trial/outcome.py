"""A trial's end as every executor reports it (trial/execute.py trains; trial/launch.py
gathers a DDP trial's ranks into one)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sweeper.states import FailureKind, TrialState

__all__ = ["Decide", "Outcome", "devices_used"]

# decide(number, epoch, metrics) -> True to stop (prune) the trial now
Decide = Callable[[int, int, dict[str, float]], bool]


@dataclass
class Outcome:
    number: int
    state: TrialState  # complete, pruned, failed; interrupted: its worker process died (the pool says so)
    history: list[dict[str, float]] = field(default_factory=list)
    reason: str | None = None
    error: str | None = None  # traceback, for the trial's MLflow run
    info: dict[str, Any] = field(default_factory=dict)  # device, data fingerprint, versions, seconds
    failure: FailureKind | None = None  # why it failed, when the search answers it (a retry, a new worker)

    @property
    def context_lost(self) -> bool:
        """Its process's CUDA context failed: the process must be replaced."""
        return self.failure == FailureKind.LOST_CONTEXT


def devices_used(device: str, threads: int, ranks: int = 1) -> int:
    """The devices a trial holds while it runs, as search.budget counts them: its GPUs on CUDA
    (one per rank: train.devices), else its torch threads (CPU cores; all its ranks' together)."""
    return ranks if device.startswith("cuda") else threads
