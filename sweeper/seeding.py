"""Sweep seed -> trial seeds; seeding every RNG a trial touches."""

from __future__ import annotations

import random

import numpy as np
import torch


def trial_seed(sweep_seed: int, trial_number: int) -> int:
    """A well-mixed 32-bit seed that depends only on the sweep seed and the trial number
    (not on worker, timing or order of completion)."""
    return int(np.random.SeedSequence([sweep_seed, trial_number]).generate_state(1)[0])


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (every device) before anything of a trial is built."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
