"""Named seed streams derived from the sweep seed, and seeding every RNG a trial touches.

Every seed sweeper uses comes from ``derive(sweep_seed, stream, index)``: a SeedSequence over
(sweep seed, index) whose spawn key names the stream, so two streams never hand out the same
seed (the sampler of the batch starting at trial n and trial n itself used to share one).
"""

from __future__ import annotations

import os
import random
from typing import TYPE_CHECKING

# cuBLAS reads this when CUDA starts; deterministic GPU matmuls need it (costs ~24 MiB of workspace).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np  # noqa: E402
import torch  # noqa: E402

if TYPE_CHECKING:
    from sweeper.spec import SweepSpec

# Each stream's fixed spawn key (never renumber one: recorded seeds would change meaning).
STREAMS = {
    "trial": 1,  # index: trial number -> model init, batch order, augmentation, dropout
    "sampler": 2,  # index: first trial number of a proposed batch -> the search algorithm
    "data": 3,  # index 0 -> the data set plugin's split (the same for every trial)
    "sweep": 4,  # index 0 -> sweep-wide draws: LR range test, Ray's generator, PBT's exploits
    "rank": 5,  # from a trial's seed, index rank * 2**20 + epoch -> a DDP rank's dropout (trial/ddp.py)
}


def derive(sweep_seed: int, stream: str, index: int = 0) -> int:
    """A well-mixed 32-bit seed for (stream, index) that depends only on the sweep seed
    (not on worker, timing or order of completion)."""
    sequence = np.random.SeedSequence([sweep_seed, index], spawn_key=(STREAMS[stream],))
    return int(sequence.generate_state(1)[0])


def trial_seed(sweep_seed: int, trial_number: int) -> int:
    return derive(sweep_seed, "trial", trial_number)


def sampler_seed(sweep_seed: int, first_number: int) -> int:
    """The search algorithm's seed for the trials proposed from ``first_number`` on."""
    return derive(sweep_seed, "sampler", first_number)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (every device) before anything of a trial is built."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def cpu_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def threads_per_trial(spec: SweepSpec) -> int:
    """torch CPU threads for each trial: fixed by the spec, not by `parallel` in reproducible
    mode, because the thread count changes float rounding."""
    if spec.search.backend == "ray":  # the trial's reserved CPUs (a fraction still gets one thread)
        return spec.train.cpu_threads or max(1, int(spec.search.resources.cpu))
    share = spec.search.batch_size if spec.search.reproducible else spec.search.parallel
    return spec.train.cpu_threads or max(1, cpu_cores() // share)


def configure_torch(*, threads: int, deterministic: bool) -> None:
    """Per-trial torch settings that change numerics: thread count and kernel choice."""
    torch.set_num_threads(threads)
    if torch.are_deterministic_algorithms_enabled() != deterministic:  # the first call is slow: docs/reproducibility.md
        torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.benchmark = not deterministic  # benchmark picks kernels by timing
    torch.backends.cudnn.deterministic = deterministic
    # TF32 trades mantissa bits for speed on CUDA; deterministic mode keeps full fp32 precision
    torch.backends.cudnn.allow_tf32 = not deterministic
    torch.set_float32_matmul_precision("highest" if deterministic else "high")
