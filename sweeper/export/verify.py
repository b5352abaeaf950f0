"""Prove an exported file computes what the eager model computes, from a process without sweeper.

The eager model's outputs are computed once (``Reference``); each file is then loaded by
``consumer.py``'s source text in a ``python -c`` process that never imports sweeper (``consumer``),
which reads the inputs from .npy files and writes its outputs back as .npy, and the two are
compared here.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sweeper.errors import TrialFailed
from sweeper.export import served

if TYPE_CHECKING:  # torch is imported where a reference is computed: prestart must not wait for it
    import torch
    from torch import nn

    from sweeper.export.inputs import Cases


class ExportError(TrialFailed):
    """An export that failed or does not match the eager model; names format and numbers."""


@dataclass
class Reference:
    """The check's inputs (as .npy files in ``folder``) and the eager model's outputs for them:
    ``parity`` by case (batch sizes 1 and 33: "1", "33"; padded sequences: two lengths, as
    "ROWSxLENGTH"), and the whole validation split ("val")."""

    folder: Path
    parity: dict[str, np.ndarray]  # case -> eager outputs
    files: dict[str, list[str]]  # case or "val" -> its arrays' .npy files: [x] or [x, mask]
    val_y: np.ndarray
    val_acc: float | None  # when the targets are class indices (int64, (N,)): else not compared

    @classmethod
    def compute(cls, model: nn.Module, cases: Cases, val_y: torch.Tensor, folder: Path) -> Reference:
        import torch

        from sweeper.export.consumer import predict

        def eager(x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
            args = [torch.from_numpy(x)] + ([] if mask is None else [torch.from_numpy(mask)])
            return model(*args).numpy()

        arrays = {key: [t.detach().cpu().numpy() for t in inputs] for key, inputs in cases.parity.items()}
        arrays["val"] = [t.detach().cpu().numpy() for t in cases.val]
        files: dict[str, list[str]] = {}
        for key, parts in arrays.items():
            files[key] = [str(folder / f"{key}.{i}.npy") for i in range(len(parts))]
            for part, file in zip(parts, files[key]):
                np.save(file, part)
        with torch.no_grad():
            parity = {key: eager(*parts) for key, parts in arrays.items() if key != "val"}
            val_logits = predict(eager, *arrays["val"])
        y = val_y.detach().cpu().numpy()
        classes = val_y.dtype == torch.int64 and val_y.ndim == 1
        return cls(folder, parity, files, y, accuracy(val_logits, y) if classes else None)


def accuracy(logits: np.ndarray, y: np.ndarray) -> float:
    return float((logits.argmax(1) == y).mean())


def run_consumer(model_file: Path, ref: Reference) -> dict[str, Any]:
    """Outputs of ``model_file`` for the reference inputs, from a Python process without sweeper."""
    with tempfile.TemporaryDirectory(dir=ref.folder) as out:
        inputs = ref.files
        job = Path(out) / "job.json"
        job.write_text(json.dumps({"model": str(model_file.resolve()), "inputs": inputs, "out": out}))
        answer = consumer().run(job)
        if answer != "ok":
            raise ExportError(f"{model_file.name}: reloading in a Python process without sweeper failed ({answer})")
        result = json.loads((Path(out) / "result.json").read_text())
        result["outputs"] = {key: np.load(Path(out) / f"{key}.npy") for key in inputs}
    return result


def consumer(warm: tuple[str, ...] = ()) -> served.Served:
    """This process's consumer: consumer.py's source text in a Python process of its own
    (``--serve``) that never imports sweeper and loads and runs one exported file per job. One
    serves every check of this process (a new one costs seconds: Python, NumPy, torch)."""
    source = Path(__file__).with_name("consumer.py").read_text()
    return served.shared("consumer", [sys.executable, "-c", source, "--serve"], warm)


def prestart(formats: list[str]) -> None:
    """Start this process's consumer now, importing what checking ``formats`` loads (torch for
    TorchScript and .pt2, onnxruntime for ONNX), so a sweep's export does not wait for it: a
    new process and torch's import are 1-1.5 s on a 2-core CPU (docs/speed.md#start-up)."""
    warm = {"torch": False, "onnxruntime": False}
    for fmt in formats:
        warm["onnxruntime" if fmt.startswith("onnx") else "torch"] = True
    consumer(tuple(name for name, wanted in warm.items() if wanted))


def check(fmt: str, model_file: Path, ref: Reference, atol: float | None) -> dict[str, Any]:
    """Reload ``model_file`` without sweeper and compare with the eager model: max |diff| at each parity
    case (batch size, or length) within ``atol`` and the same validation accuracy. ``atol=None`` (a quantized file)
    measures the differences without requiring them to be small."""
    result = run_consumer(model_file, ref)
    if result["sweeper_modules"]:
        raise ExportError(
            f"{fmt}: loading {model_file.name} imported {result['sweeper_modules'][0]}; "
            f"an exported file must load without sweeper"
        )
    outputs = result["outputs"]
    parity = {case: float(np.abs(outputs[case] - expected).max()) for case, expected in ref.parity.items()}
    report = {
        "parity_max_abs_diff": parity,
        "max_abs_diff": max(parity.values()),
        "reload_s": result["load_s"],
    }
    if ref.val_acc is not None:
        report.update(val_acc=accuracy(outputs["val"], ref.val_y), eager_val_acc=ref.val_acc)
    if atol is None:
        return report
    for case, diff in parity.items():
        if not diff <= atol:  # also catches NaN
            where = f"batch size {case}" if case.isdigit() else f"batch {case} (rows x length)"
            raise ExportError(
                f"{fmt}: {model_file.name} differs from the eager model at {where}: "
                f"max |diff| {diff:.3g} > atol {atol:g} (export.atol)"
            )
    if ref.val_acc is not None and report["val_acc"] != ref.val_acc:
        raise ExportError(
            f"{fmt}: {model_file.name} has validation accuracy {report['val_acc']:.6f}, the eager "
            f"model {ref.val_acc:.6f} (max |diff| {report['max_abs_diff']:.3g}, atol {atol:g})"
        )
    return report
