"""Export a trained model and prove the file computes what the eager model computes."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sweeper.errors import TrialFailed


class ExportError(TrialFailed):
    """An export that failed or does not match the eager model; names format and numbers."""


@contextlib.contextmanager
def _quiet_jit() -> Iterator[None]:
    # torch.jit is deprecated upstream and warns on every call; the user asked for TorchScript,
    # so keep the warning out of their output (README records the deprecation).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.filterwarnings("ignore", message=".*TorchScript.*")
        yield


def torchscript(model: nn.Module, example: torch.Tensor, path: Path, atol: float) -> dict[str, Any]:
    """Script (or, if scripting fails, trace) the model, save it, reload it, compare outputs."""
    model = model.eval().cpu()
    example = example.cpu()
    with _quiet_jit():
        method = "script"
        try:
            compiled = torch.jit.script(model)
        except Exception as exc:  # scripting rejects some Python; tracing records one path
            method = f"trace (script failed: {str(exc).splitlines()[0]})"
            with torch.inference_mode(False), torch.no_grad():
                compiled = torch.jit.trace(model, example)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.jit.save(compiled, str(path))
        reloaded = torch.jit.load(str(path), map_location="cpu")
    with torch.no_grad():
        expected, got = model(example), reloaded(example)
    max_diff = (expected - got).abs().max().item()
    if not max_diff <= atol:
        raise ExportError(f"torchscript export of {path.name} differs from the eager model: "
                          f"max |diff| {max_diff:.3g} > atol {atol:g}")
    return {"format": "torchscript", "path": str(path), "method": method, "bytes": path.stat().st_size,
            "max_abs_diff": max_diff, "batch": int(example.shape[0])}
