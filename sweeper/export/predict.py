"""``sweeper predict MODEL_FILE INPUT.npy``: predict with an exported file, as a consumer would
(the model is loaded and run by consumer.py, which needs no sweeper): a class, the labels present,
or values in the data's units, as export.json's ``output`` says the model's output means."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from sweeper.errors import UserError

SUFFIXES = (".pt", ".pt2", ".onnx")


def predict_file(model_file: Path, inputs: Path, out: Path | None) -> list[str]:
    """One line per input row: row, then the predicted class index and name (classification),
    the labels present (multilabel: export.json's ``output.threshold``) or the predicted values
    (regression, in the data's units)."""
    from sweeper.export import consumer

    if model_file.suffix not in SUFFIXES or not model_file.is_file():
        raise UserError(
            f"{model_file}: expected an exported model file ({', '.join(SUFFIXES)}) such as "
            f"runs/digits/model.onnx" + ("" if model_file.is_file() else "; no such file")
        )
    try:
        x = np.load(inputs, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise UserError(
            f"{inputs}: cannot read it as a .npy array ({exc}); expected e.g. np.save('x.npy', "
            f"batch) with a float32 batch shaped like the model's input"
        ) from None
    info = _export_info(model_file)
    x = _batch(np.asarray(x, dtype=np.float32), info, inputs)
    try:
        logits = consumer.predict(consumer.load(model_file), x)
    except Exception as exc:  # a corrupt file, or an input the model rejects
        raise UserError(
            f"{model_file}: running it on {inputs} (shape {list(x.shape)}) failed: "
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        ) from None
    if out is not None:
        np.save(out, logits)
    output = info.get("output") or {}
    if "threshold" in output:  # multilabel: the labels whose probability reaches the threshold
        labels = output.get("labels") or [str(j) for j in range(logits.shape[1])]
        present = 1 / (1 + np.exp(-logits)) >= output["threshold"]
        return [f"{i}\t" + ",".join(labels[j] for j in np.flatnonzero(row)) for i, row in enumerate(present)]
    if "argmax" not in output.get("meaning", "argmax"):  # values, e.g. a regression's
        return [f"{i}\t" + "\t".join(f"{v:.6g}" for v in row) for i, row in enumerate(logits.reshape(len(logits), -1))]
    names = info.get("class_names") or []
    return [f"{i}\t{c}" + (f"\t{names[c]}" if c < len(names) else "") for i, c in enumerate(logits.argmax(1))]


def _export_info(model_file: Path) -> dict[str, Any]:
    """export.json beside the file (input shape, class names), or {} when there is none."""
    path = model_file.with_name("export.json")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _batch(x: np.ndarray, info: dict[str, Any], source: Path) -> np.ndarray:
    shape = (info.get("input") or {}).get("shape")
    if shape is None:
        return x
    sample = tuple(shape[1:])  # None: a dynamic axis (a padded sequence's length)

    def fits(got: tuple[int, ...]) -> bool:
        return len(got) == len(sample) and all(want is None or want == n for n, want in zip(got, sample))

    if fits(x.shape):
        return x[None]  # one sample: a batch of one
    if not fits(x.shape[1:]):
        shown = ", ".join("L" if n is None else str(n) for n in sample)
        raise UserError(
            f"{source}: shape {list(x.shape)}; the model expects (N, {shown}) or one sample ({shown}), "
            f"normalised as export.json says"
        )
    return x
