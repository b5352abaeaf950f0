"""Export a trained model to every asked format, verify each file, describe them in export.json."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from sweeper import files
from sweeper.export import formats, verify
from sweeper.export.inputs import Cases, Masked, Signature
from sweeper.export.verify import ExportError
from sweeper.plugin import DatasetSplits, DataSplits, FittedTask
from sweeper.spec import ExportSpec

EXAMPLE_ROWS = 8  # rows of the example batch the exporters trace (>= 2: see formats.py)


def export_model(
    model: nn.Module,
    data: DataSplits | DatasetSplits,
    out_dir: Path,
    spec: ExportSpec,
    names: list[str] | None = None,
    source: dict[str, Any] | None = None,
    task: FittedTask | None = None,
    test: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write, reload and check each format in ``names`` (default ``spec.formats``) into
    ``out_dir``; a format that fails gets an ``error`` entry and the others still run. Writes
    and returns the report (``out_dir/export.json``). ``task``: the trial's task, whose head
    ends the exported model and whose ``output_info`` says what its output means (default:
    classification logits). ``test``: the eager model's score on the held-out test split
    (``metrics`` named ``test_*``, ``samples``), recorded beside the validation figures."""
    signature = Signature.of(data)
    model = exportable(model, task, signature).eval().cpu()
    out_dir.mkdir(parents=True, exist_ok=True)
    cases = Cases.of(data, signature, EXAMPLE_ROWS)  # model inputs (input_transform applied)
    entries: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sweeper-export-") as tmp:
        ref = verify.Reference.compute(model, cases, data.val_y, Path(tmp))
        for fmt in names or spec.formats:
            entries.append(_one(fmt, _writer(fmt, model, cases.example, signature), out_dir, ref, spec.atol))
        onnx_ok = any(e["format"] == "onnx" and "error" not in e for e in entries)
        if spec.quantize and onnx_ok:
            src = out_dir / formats.FORMATS["onnx"].file
            entry = _one(formats.QUANTIZED, lambda p: formats.quantize_onnx(src, p), out_dir, ref, None)
            if "error" not in entry and ref.val_acc is not None:
                entry["val_acc_change"] = entry["val_acc"] - ref.val_acc
                side = Path(entry["path"] + ".json")  # the accuracy change, next to the file
                kept = ("val_acc", "eager_val_acc", "val_acc_change", "max_abs_diff")
                files.write_atomic(side, json.dumps({k: entry[k] for k in kept}, indent=2))
                entry["files"].append(str(side))
            entries.append(entry)
    report: dict[str, Any] = {
        "source": source or {},
        "input": signature.describe(),
        "output": task.output_info()
        if task is not None
        else {"shape": [None, data.num_classes], "dtype": "float32", "meaning": "logits (argmax: class)"},
        "normalization": data.normalization,  # already applied by the data set: apply it before calling
        # a tabular data set's preprocessing (standardisation, category codes): apply it before calling
        **({"features": data.features.as_dict()} if data.features is not None else {}),
        "class_names": list(data.class_names) if data.class_names else None,
        "atol": spec.atol,
        **({"eager_val_acc": ref.val_acc} if ref.val_acc is not None else {}),
        "val_size": int(len(data.val_y)),
        **({"test": test} if test is not None else {}),
        "formats": entries,
    }
    path = out_dir / "export.json"
    files.write_atomic(path, json.dumps(report, indent=2))
    report["json"] = str(path)
    return report


def exportable(model: nn.Module, task: FittedTask | None, signature: Signature | None = None) -> nn.Module:
    """``model`` as exported: followed by its task's head when it has one (a regression's
    standardised outputs back to the data's units); taking ``(x, mask)`` when ``signature`` says
    the data is padded."""
    head = task.head() if task is not None else None
    if signature is not None and signature.masked:
        return Masked(model, head)
    return model if head is None else nn.Sequential(model, head)


def _writer(fmt: str, model: Any, example: Any, signature: Signature) -> Callable[[Path], dict[str, Any]]:
    """Writes ``model`` in ``fmt`` to a path (the format is looked up when it writes: an unknown
    one is the entry's error)."""
    return lambda path: formats.FORMATS[fmt].write(model, example, path, signature)


def _one(
    fmt: str, write: Callable[[Path], dict[str, Any]], out_dir: Path, ref: verify.Reference, atol: float | None
) -> dict[str, Any]:
    """Write one file and check it; failures become the entry's ``error``."""
    path = out_dir / formats.file_name(fmt)
    entry: dict[str, Any] = {"format": fmt, "path": str(path)}
    started = time.perf_counter()
    try:
        made = write(path)
        entry["export_s"] = time.perf_counter() - started
        files = [Path(f) for f in made.pop("files")]
        entry.update(made, files=[str(f) for f in files], bytes=sum(f.stat().st_size for f in files))
        started = time.perf_counter()
        entry.update(verify.check(fmt, path, ref, atol))
        entry["check_s"] = time.perf_counter() - started
    except ExportError as exc:
        entry["error"] = str(exc)
    except Exception as exc:  # one failed format must not lose the sweep or the others
        entry["error"] = f"{fmt}: export failed ({formats.first_line(exc)})"
    return entry


def artifacts(report: dict[str, Any]) -> list[Path]:
    """The files worth logging: export.json and every verified file."""
    files = [Path(report["json"])]
    for e in report["formats"]:
        if "error" not in e:
            files += [Path(f) for f in e["files"]]
    return files
