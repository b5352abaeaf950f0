"""Prove an exported file computes what the eager model computes, from a process without sweeper.

The eager model's outputs are computed once (``Reference``); each file is then loaded by
``consumer.py``'s source text in a fresh ``python -c`` process, which reads the inputs from .npy
files and writes its outputs back as .npy, and the two are compared here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from sweeper.errors import TrialFailed

ODD_BATCH = 33  # the larger batch of the parity check: odd, so no power-of-two kernel path hides a bug
CHECK_TIMEOUT_S = 600  # one file's reload + run; a hang must not hold the sweep forever


class ExportError(TrialFailed):
    """An export that failed or does not match the eager model; names format and numbers."""


@dataclass
class Reference:
    """Inputs (as .npy files in ``folder``) and the eager model's outputs for them."""

    folder: Path
    batches: dict[int, np.ndarray]  # batch size -> eager outputs of the first rows of val_x
    val_y: np.ndarray
    val_acc: float | None  # when the targets are class indices (int64, (N,)): else not compared

    @classmethod
    def compute(cls, model: nn.Module, val_x: torch.Tensor, val_y: torch.Tensor, folder: Path) -> Reference:
        from sweeper.export.consumer import predict

        x, y = val_x.detach().cpu().float().numpy(), val_y.detach().cpu().numpy()
        eager = lambda a: model(torch.from_numpy(a)).numpy()  # noqa: E731
        with torch.no_grad():
            batches = {b: eager(x[:b]) for b in sorted({1, min(ODD_BATCH, len(x))})}
            val_logits = predict(eager, x)
        for b in batches:
            np.save(folder / f"batch{b}.npy", x[:b])
        np.save(folder / "val.npy", x)
        classes = val_y.dtype == torch.int64 and val_y.ndim == 1
        return cls(folder, batches, y, accuracy(val_logits, y) if classes else None)


def accuracy(logits: np.ndarray, y: np.ndarray) -> float:
    return float((logits.argmax(1) == y).mean())


def run_consumer(model_file: Path, ref: Reference) -> dict[str, Any]:
    """Outputs of ``model_file`` for the reference inputs, from a fresh Python process."""
    source = (Path(__file__).with_name("consumer.py")).read_text()
    with tempfile.TemporaryDirectory(dir=ref.folder) as out:
        inputs = {f"batch{b}": str(ref.folder / f"batch{b}.npy") for b in ref.batches}
        inputs["val"] = str(ref.folder / "val.npy")
        job = Path(out) / "job.json"
        job.write_text(json.dumps({"model": str(model_file.resolve()), "inputs": inputs, "out": out}))
        # cwd=out: nothing of this project is importable by accident from the working folder
        proc = subprocess.run(
            [sys.executable, "-c", source, str(job)], cwd=out, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S
        )
        if proc.returncode != 0:
            tail = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
            raise ExportError(f"{model_file.name}: reloading in a fresh Python process failed ({tail})")
        result = json.loads((Path(out) / "result.json").read_text())
        result["outputs"] = {key: np.load(Path(out) / f"{key}.npy") for key in inputs}
    return result


def check(fmt: str, model_file: Path, ref: Reference, atol: float | None) -> dict[str, Any]:
    """Reload ``model_file`` without sweeper and compare with the eager model: max |diff| at each
    batch size within ``atol`` and the same validation accuracy. ``atol=None`` (a quantized file)
    measures the differences without requiring them to be small."""
    result = run_consumer(model_file, ref)
    if result["sweeper_modules"]:
        raise ExportError(
            f"{fmt}: loading {model_file.name} imported {result['sweeper_modules'][0]}; "
            f"an exported file must load without sweeper"
        )
    outputs = result["outputs"]
    parity = {str(b): float(np.abs(outputs[f"batch{b}"] - expected).max()) for b, expected in ref.batches.items()}
    report = {
        "parity_max_abs_diff": parity,
        "max_abs_diff": max(parity.values()),
        "reload_s": result["load_s"],
    }
    if ref.val_acc is not None:
        report.update(val_acc=accuracy(outputs["val"], ref.val_y), eager_val_acc=ref.val_acc)
    if atol is None:
        return report
    for batch, diff in parity.items():
        if not diff <= atol:  # also catches NaN
            raise ExportError(
                f"{fmt}: {model_file.name} differs from the eager model at batch size {batch}: "
                f"max |diff| {diff:.3g} > atol {atol:g} (export.atol)"
            )
    if ref.val_acc is not None and report["val_acc"] != ref.val_acc:
        raise ExportError(
            f"{fmt}: {model_file.name} has validation accuracy {report['val_acc']:.6f}, the eager "
            f"model {ref.val_acc:.6f} (max |diff| {report['max_abs_diff']:.3g}, atol {atol:g})"
        )
    return report
