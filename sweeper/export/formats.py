"""Write one model file per format: TorchScript, torch.export (.pt2), ONNX, ONNX int8.

Each writer takes the eager model (eval mode, CPU) and an example batch of at least 2 rows
(torch.export specialises a dimension of size 1 to a constant) and returns what the export
report records about how the file was made: ``method``, ``warnings`` and the ``files`` written.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sweeper.spec import EXPORT_FORMATS

# ONNX files are protobufs, capped at 2 GiB; below this many bytes of weights the model is
# written as one self-contained file, above it the weights go to model.onnx.data.
ONNX_SINGLE_FILE_BYTES = 1 << 30
MAX_BATCH = 1 << 16  # upper bound of the dynamic batch dimension (torch.export needs one > 1)


@contextlib.contextmanager
def quiet_jit() -> Iterator[None]:
    # torch.jit is deprecated upstream and warns on every call; the user asked for TorchScript,
    # so keep the warning out of their output (docs/export.md records the deprecation).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.filterwarnings("ignore", message=".*TorchScript.*")
        yield


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def torchscript(model: nn.Module, example: torch.Tensor, path: Path) -> dict[str, Any]:
    """``torch.jit.script``; if scripting fails, ``torch.jit.trace`` with a warning naming why,
    and a second warning when the trace met data-dependent control flow."""
    notes: list[str] = []
    with quiet_jit():
        try:
            compiled, method = torch.jit.script(model), "script"
        except Exception as exc:  # scripting rejects some Python; tracing records one path
            method = "trace"
            notes.append(
                f"torchscript: torch.jit.script failed ({first_line(exc)}); traced with "
                f"torch.jit.trace instead, which records only the operations run on the example"
            )
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", torch.jit.TracerWarning)
                with torch.no_grad():
                    compiled = torch.jit.trace(model, example, check_trace=False)
            tracer = [str(w.message).splitlines()[0] for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
            if tracer:
                notes.append(
                    f"torchscript: the forward has data-dependent control flow ({tracer[0]}); "
                    f"the traced graph keeps only the path the example input took, so inputs "
                    f"that would take another branch get wrong results"
                )
        torch.jit.save(compiled, str(path))
    return {"method": method, "warnings": notes, "files": [path]}


def _batch_dim() -> dict[int, Any]:
    return {0: torch.export.Dim("batch", min=1, max=MAX_BATCH)}


def pt2(model: nn.Module, example: torch.Tensor, path: Path) -> dict[str, Any]:
    """``torch.export.export`` with a dynamic batch dimension, saved with ``torch.export.save``."""
    with warnings.catch_warnings():
        # nn.GRU/LSTM/RNN reassign their weight list while exporting, which torch.export reports
        # as "tensor attributes ... assigned during export"; the weights are the module's own
        warnings.filterwarnings(
            "ignore", message=r"The tensor attributes .*_flat_weights.* were assigned during export"
        )
        program = torch.export.export(model, (example,), dynamic_shapes=(_batch_dim(),))
    torch.export.save(program, str(path))
    return {"method": "torch.export", "warnings": [], "files": [path]}


def onnx(model: nn.Module, example: torch.Tensor, path: Path) -> dict[str, Any]:
    """``torch.onnx.export`` (dynamo exporter) with a dynamic batch dimension, then ``onnx.checker``."""
    import onnx as onnx_lib

    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    single = weights < ONNX_SINGLE_FILE_BYTES
    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)  # a stale weights file from an earlier, larger export
    with _quiet_onnx():
        torch.onnx.export(
            model,
            (example,),
            str(path),
            dynamo=True,
            dynamic_shapes=(_batch_dim(),),
            external_data=not single,
            verbose=False,
        )
    onnx_lib.checker.check_model(str(path), full_check=True)  # by path: also reads external data
    return {"method": "torch.onnx (dynamo)", "warnings": [], "files": [path] + ([data] if data.exists() else [])}


def quantize_onnx(src: Path, path: Path) -> dict[str, Any]:
    """Dynamic int8 quantization of the Linear layers (ONNX MatMul/Gemm) with onnxruntime: int8
    weights, activations quantized per batch at run time. For CPU serving."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet_onnx():
        quantize_dynamic(str(src), str(path), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm"])
    return {"method": "onnxruntime dynamic int8 (MatMul/Gemm)", "warnings": [], "files": [path]}


@contextlib.contextmanager
def _quiet_onnx() -> Iterator[None]:
    # The exporter and the quantizer print progress and advice (on stdout and the root logger)
    # that says nothing the export report does not; keep it out of the sweep's display.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.setLevel(level)


@dataclass(frozen=True)
class Format:
    file: str  # its name in the output folder
    write: Callable[[nn.Module, torch.Tensor, Path], dict[str, Any]]


# Every format export.formats can name (sweeper.spec.EXPORT_FORMATS is the list of names).
FORMATS = {
    "torchscript": Format("model.torchscript.pt", torchscript),
    "pt2": Format("model.pt2", pt2),
    "onnx": Format("model.onnx", onnx),
}
assert tuple(FORMATS) == EXPORT_FORMATS, "export/formats.py and spec.EXPORT_FORMATS name the same formats"
QUANTIZED, QUANTIZED_FILE = "onnx-int8", "model.int8.onnx"  # model.onnx quantized (export.quantize)


def file_name(fmt: str) -> str:
    return QUANTIZED_FILE if fmt == QUANTIZED else FORMATS[fmt].file
