"""Write one model file per format: TorchScript, torch.export (.pt2), ONNX, ONNX int8.

Each writer takes the eager model (eval mode, CPU), an example batch of at least 2 rows
(torch.export specialises a dimension of size 1 to a constant): ``x``, or ``(x, mask)`` for padded
sequences, and the ``Signature`` saying which axes are dynamic (inputs.py; default: x alone, the
batch axis), and returns what the export report records about how the file was made: ``method``,
``warnings`` and the ``files`` written.
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

from sweeper.export.inputs import Inputs, Signature
from sweeper.spec import EXPORT_FORMATS

# ONNX files are protobufs, capped at 2 GiB; below this many bytes of weights the model is
# written as one self-contained file, above it the weights go to model.onnx.data.
ONNX_SINGLE_FILE_BYTES = 1 << 30
Example = torch.Tensor | Inputs  # x, or (x, mask)


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


def _inputs(example: Example, signature: Signature | None) -> tuple[Inputs, Signature]:
    args = example if isinstance(example, tuple) else (example,)
    return args, signature if signature is not None else Signature(tuple(args[0].shape[1:]))


def fixed_length(model: nn.Module) -> str | None:
    """Why torch.export cannot keep the length axis of ``model``'s inputs dynamic, or None:
    it decomposes a recurrent layer (nn.GRU, nn.LSTM, nn.RNN) into one step per position, which
    fixes the number of positions to the example's."""
    rnn = next((type(m).__name__ for m in model.modules() if isinstance(m, nn.RNNBase)), None)
    if rnn is None:
        return None
    return (
        f"torch.export unrolls the model's nn.{rnn} into one step per position of the example, "
        f"which fixes the sequence length; padded sequences need a dynamic length"
    )


def torchscript(model: nn.Module, example: Example, path: Path, signature: Signature | None = None) -> dict[str, Any]:
    """``torch.jit.script``; if scripting fails, ``torch.jit.trace`` with a warning naming why,
    and a second warning when the trace met data-dependent control flow."""
    args, _ = _inputs(example, signature)
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
                    compiled = torch.jit.trace(model, args, check_trace=False)
            tracer = [str(w.message).splitlines()[0] for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
            if tracer:
                notes.append(
                    f"torchscript: the forward has data-dependent control flow ({tracer[0]}); "
                    f"the traced graph keeps only the path the example input took, so inputs "
                    f"that would take another branch get wrong results"
                )
        torch.jit.save(compiled, str(path))
    return {"method": method, "warnings": notes, "files": [path]}


def pt2(model: nn.Module, example: Example, path: Path, signature: Signature | None = None) -> dict[str, Any]:
    """``torch.export.export`` with a dynamic batch dimension (and length, for padded
    sequences), saved with ``torch.export.save``."""
    args, signature = _inputs(example, signature)
    reason = fixed_length(model) if signature.masked else None
    if reason is not None:
        raise ValueError(reason)
    with warnings.catch_warnings():
        # nn.GRU/LSTM/RNN reassign their weight list while exporting, which torch.export reports
        # as "tensor attributes ... assigned during export"; the weights are the module's own
        warnings.filterwarnings(
            "ignore", message=r"The tensor attributes .*_flat_weights.* were assigned during export"
        )
        program = torch.export.export(model, args, dynamic_shapes=signature.dynamic_shapes())
    torch.export.save(program, str(path))
    return {"method": "torch.export", "warnings": [], "files": [path]}


def onnx(model: nn.Module, example: Example, path: Path, signature: Signature | None = None) -> dict[str, Any]:
    """``torch.onnx.export`` (dynamo exporter) with a dynamic batch dimension (and length, for
    padded sequences), then ``onnx.checker``. A recurrent model on padded sequences goes through
    the TorchScript-based exporter instead, which writes nn.GRU/LSTM/RNN as ONNX's own GRU/LSTM/RNN
    operator over any length (dynamo unrolls them: see fixed_length)."""
    import onnx as onnx_lib

    args, signature = _inputs(example, signature)

    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    single = weights < ONNX_SINGLE_FILE_BYTES
    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)  # a stale weights file from an earlier, larger export
    recurrent = signature.masked and fixed_length(model) is not None
    with _quiet_onnx():
        if recurrent:  # TorchScript-based: one ONNX recurrent operator, any number of positions
            torch.onnx.export(
                model,
                args,
                str(path),
                dynamo=False,
                input_names=list(signature.names),
                output_names=["output"],
                dynamic_axes=signature.dynamic_axes(),
                verbose=False,
            )
        else:
            torch.onnx.export(
                model,
                args,
                str(path),
                dynamo=True,
                dynamic_shapes=signature.dynamic_shapes(),
                external_data=not single,
                verbose=False,
            )
    onnx_lib.checker.check_model(str(path), full_check=True)  # by path: also reads external data
    method = "torch.onnx (TorchScript-based: a recurrent layer, dynamic length)" if recurrent else "torch.onnx (dynamo)"
    return {"method": method, "warnings": [], "files": [path] + ([data] if data.exists() else [])}


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
    write: Callable[[nn.Module, Example, Path, Signature | None], dict[str, Any]]


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
