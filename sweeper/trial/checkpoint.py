"""Trial checkpoints: a training state that continues bitwise where it stopped, written
atomically (sweeper/files.py) and read with ``weights_only=True`` (tensors and plain containers
only); a file that cannot be read back raises CorruptCheckpoint.

A state holds model, optimizer, scheduler, epoch, the per-epoch history so far, the trainer's
generators (batch order, augmentation), the grad scaler, the global RNGs (Python, NumPy, torch,
CUDA when started) and the param groups' learning rates at the start of training (``base_lrs``).
Pure PyTorch, like the trainer that captures and restores it.
"""

from __future__ import annotations

import errno
import pickle
import random
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from sweeper import files

State = dict[str, Any]


@dataclass(frozen=True)
class Resume:
    """Where a trainer starts instead of epoch 1."""

    state: State
    # False: the same trial again (a retry), everything restored. True: another trial's state with
    # this trial's own hyperparameters (PBT's exploit): weights, per-parameter optimizer buffers,
    # epoch and RNGs come from the state; the optimizer's settings and the LR schedule stay this
    # trial's, the schedule brought to the state's step.
    new_hyperparameters: bool = False


class CorruptCheckpoint(Exception):
    """A checkpoint file that exists but cannot be read back (truncated, overwritten, not a
    checkpoint). str(self) names the file and why: a trial that was to resume from it fails with
    that reason (never a crash of the sweep), an export asks for another checkpoint."""


def save(path: Path, state: State) -> Path:
    with files.replacing(path) as tmp:  # a reader, or a crash, never sees half a file
        torch.save(state, tmp)
    return path


def load(path: Path, map_location: str | torch.device = "cpu") -> State:
    """weights_only=True: tensors and plain containers only, no arbitrary code from the file.
    A file that is there but unreadable raises CorruptCheckpoint (a missing one: OSError)."""
    if not path.is_file():
        raise FileNotFoundError(errno.ENOENT, "no checkpoint file", str(path))
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:  # weights_only refused something: not a state this code wrote
        raise CorruptCheckpoint(f"{path}: not a sweeper checkpoint ({_first_line(exc)})") from exc
    except (FileNotFoundError, PermissionError):
        raise
    except Exception as exc:  # a truncated or garbled zip/pickle stream: RuntimeError, OSError, EOFError...
        raise CorruptCheckpoint(
            f"{path}: unreadable checkpoint, truncated or corrupt ({type(exc).__name__}: {_first_line(exc)})"
        ) from exc
    if not isinstance(state, dict):
        raise CorruptCheckpoint(
            f"{path}: not a sweeper checkpoint (holds a {type(state).__name__}, expected a dict of training state)"
        )
    return state


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]


def trial_path(out_dir: Path, number: int) -> Path:
    """Where a sweep keeps trial ``number``'s checkpoint (the best trial's is kept for export)."""
    return out_dir / "checkpoints" / f"trial-{number:05d}.pt"


def capture(
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: Any,
    generators: dict[str, torch.Generator],
    epoch: int,
    history: list[dict[str, float]],
    base_lrs: list[float],
) -> State:
    """The training state after ``epoch`` (references to live tensors: save it before training on)."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "epoch": epoch,
        "history": [dict(h) for h in history],
        "base_lrs": list(base_lrs),
        "scaler": scaler.state_dict(),
        "generators": {k: g.get_state() for k, g in generators.items()},
        "rng": rng_state(),
    }


def restore(
    resume: Resume,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: Any,
    generators: dict[str, torch.Generator],
) -> list[float]:
    """Load ``resume.state`` into freshly built parts; returns the base LRs to carry on with."""
    state = resume.state
    model.load_state_dict(state["model"])
    base_lrs = list(state["base_lrs"])
    if resume.new_hyperparameters:
        base_lrs = _adopt(state, optimizer, scheduler)
    else:
        optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None:
            scheduler.load_state_dict(state["scheduler"])
    _match_layouts(optimizer)
    if state["scaler"]:  # empty when saved by a disabled scaler (no fp16)
        scaler.load_state_dict(state["scaler"])
    for name, gen in generators.items():
        gen.set_state(state["generators"][name].cpu())  # generator states are CPU byte tensors
    set_rng_state(state["rng"])
    return base_lrs


def _match_layouts(optimizer: torch.optim.Optimizer) -> None:
    """Per-parameter buffers in their parameter's memory layout: a state saved in NCHW (on the
    CPU) resumes on CUDA in channels_last, where fused kernels want buffers laid out like params."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            for key, value in optimizer.state.get(param, {}).items():
                if (
                    isinstance(value, torch.Tensor)
                    and value.shape == param.shape
                    and value.ndim == 4
                    and value.stride() != param.stride()
                ):
                    optimizer.state[param][key] = torch.empty_like(param, dtype=value.dtype).copy_(value)


def _adopt(state: State, optimizer: torch.optim.Optimizer, scheduler: Any) -> list[float]:
    """Per-parameter buffers (momentum, Adam moments, step counts) from the state, settings (lr,
    weight decay, ...) from this optimizer; the schedule at the state's step."""
    own = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    base_lrs = [g["lr"] for g in optimizer.param_groups]
    optimizer.load_state_dict(state["optimizer"])
    donor_lrs = [g["lr"] for g in optimizer.param_groups]
    for group, settings in zip(optimizer.param_groups, own):
        group.update(settings)
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        # its progress is counters plus the LR cuts so far: keep the counters, apply the same cut
        for key in ("best", "num_bad_epochs", "cooldown_counter", "last_epoch"):
            setattr(scheduler, key, state["scheduler"][key])
        for group, base, donor, donor_base, floor in zip(
            optimizer.param_groups, base_lrs, donor_lrs, state["base_lrs"], scheduler.min_lrs
        ):
            group["lr"] = max(floor, base * donor / donor_base)
        scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
    elif scheduler is not None:
        # Schedules own the LR (one-cycle, cosine, step: the new lr is their new peak/base): replay
        # this schedule's steps up to the state's, so it continues from the same point of its curve.
        with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()": on purpose
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(state["scheduler"]["last_epoch"] - scheduler.last_epoch):
                scheduler.step()
    return base_lrs


def rng_state() -> dict[str, Any]:
    """Python, NumPy, torch (and CUDA, when started) RNG states as tensors and plain lists, which
    a ``weights_only`` load accepts (NumPy's state holds an ndarray, Python's a tuple)."""
    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    return {
        "python": [version, list(words), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    version, words, gauss = state["python"]
    random.setstate((version, tuple(words), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.cpu().numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"] is not None and torch.cuda.is_available():
        # one state per GPU that was visible; a resume may see fewer (or more): set those it has
        for index, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state.cpu(), index)
