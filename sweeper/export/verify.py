"""Prove an exported file computes what the eager model computes, from a process without sweeper.

The eager model's outputs are computed once (``Reference``); each file is then loaded by
``consumer.py``'s source text in a ``python -c`` process that never imports sweeper (``Consumer``),
which reads the inputs from .npy files and writes its outputs back as .npy, and the two are
compared here.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from sweeper.errors import TrialFailed
from sweeper.export.inputs import Cases

CHECK_TIMEOUT_S = 600  # one file's reload + run; a hang must not hold the sweep forever


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
        answer = Consumer.shared().run(job)
        if answer != "ok":
            raise ExportError(f"{model_file.name}: reloading in a Python process without sweeper failed ({answer})")
        result = json.loads((Path(out) / "result.json").read_text())
        result["outputs"] = {key: np.load(Path(out) / f"{key}.npy") for key in inputs}
    return result


class Consumer:
    """consumer.py's source text running in its own Python process (``--serve``), which never
    imports sweeper: it loads and runs one exported file per job. One process serves every
    check of this process (a new one costs seconds: Python, NumPy, torch), and a new one is
    started after one that died or hung."""

    _shared: Consumer | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        # cwd: an empty folder of its own, so nothing of this project is importable by accident
        self.owner = os.getpid()
        self.folder = Path(tempfile.mkdtemp(prefix="sweeper-consumer-"))
        self.log = open(self.folder / "stderr.log", "w+b")  # noqa: SIM115 (closed in close())
        source = Path(__file__).with_name("consumer.py").read_text()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", source, "--serve"],
            cwd=self.folder,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )

    @classmethod
    def shared(cls) -> Consumer:
        """This process's consumer, started on first use and stopped when the process exits."""
        with cls._lock:
            mine = cls._shared is not None and cls._shared.owner == os.getpid()  # not a forked copy
            if cls._shared is None or not mine or cls._shared.proc.poll() is not None:
                if cls._shared is None:
                    atexit.register(cls._close_shared)
                elif mine:
                    cls._shared.close()
                cls._shared = cls()
            return cls._shared

    @classmethod
    def _close_shared(cls) -> None:
        if cls._shared is not None and cls._shared.owner == os.getpid():
            cls._shared.close()

    def run(self, job: Path) -> str:
        """The answer to one job: "ok", or why it failed. A consumer that dies or does not
        answer within CHECK_TIMEOUT_S is stopped (the next job gets a new one)."""
        with self._lock:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            try:
                self.proc.stdin.write(f"{job}\n")
                self.proc.stdin.flush()
            except OSError:
                return self._died()
            ready, _, _ = select.select([self.proc.stdout], [], [], CHECK_TIMEOUT_S)
            if not ready:
                self.close()
                return f"no answer within {CHECK_TIMEOUT_S} s"
            answer = self.proc.stdout.readline().strip()
            return answer.removeprefix("error: ") if answer else self._died()

    def _died(self) -> str:
        code = self.proc.wait()
        self.log.seek(0)
        lines = self.log.read().decode(errors="replace").strip().splitlines()
        self.close()
        return lines[-1] if lines else f"exit {code}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.log):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        shutil.rmtree(self.folder, ignore_errors=True)


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
