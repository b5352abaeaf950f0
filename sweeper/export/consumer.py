"""Load an exported model file and run it on NumPy arrays, with no sweeper import.

This module is self-contained on purpose (it imports only the standard library, NumPy, torch
and onnxruntime): the parity check runs its source text in a ``python -c`` process that never imports sweeper to
prove that a consumer without sweeper gets the eager model's outputs, and ``sweeper predict``
imports it. Copy it as a starting point for serving code.

    python -c "$(cat consumer.py)" job.json   # job: {"model": PATH, "inputs": {key: x.npy}, "out": DIR}

writes ``DIR/<key>.npy`` (the model's outputs for each input) and ``DIR/result.json``.

    python -c "$(cat consumer.py)" --serve [MODULE ...]  # one job path per line on stdin, until it closes

runs each job as above and answers each line with one line on stdout: "ok", or "error: " and
the exception (the parity check keeps one such process for all the files it checks: the cost
of a new process, torch's import, is paid once; a sweep starts it with the modules to import,
torch or onnxruntime, while it trains, so that cost is off its end).

A model of padded sequences (export.json's ``input`` has a ``mask``) takes ``x`` (N, L) or
(N, C, L) and a bool ``mask`` (N, L), True where a position holds data: a job's input is then
``[x.npy, mask.npy]``; given ``x`` alone, every position holds data.
"""

import json
import os
import sys
import time
import warnings

import numpy as np

BATCH = 256  # rows per forward call: bounds memory on large validation sets


def full_mask(x, mask):
    """``mask`` as a bool array, or (no mask given) every position of ``x`` (its last axis) kept."""
    if mask is None:
        return np.ones((x.shape[0], x.shape[-1]), dtype=bool)
    return np.ascontiguousarray(mask, dtype=bool)


def load(path):
    """A function (x ndarray (N, ...) float32, mask=None) -> ndarray (N, outputs), for any exported
    format; the mask goes to a model that takes one (padded sequences) and nowhere else."""
    path = str(path)
    if path.endswith(".onnx"):
        import onnxruntime as ort

        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]

        def run_onnx(x, mask=None):
            feed = {names[0]: np.ascontiguousarray(x, dtype=np.float32)}
            if len(names) > 1:
                feed[names[1]] = full_mask(x, mask)
            return session.run(None, feed)[0]

        return run_onnx
    import torch

    if path.endswith(".pt2"):
        program = torch.export.load(path)
        takes_mask = len(program.graph_signature.user_inputs) > 1
        module = program.module()
    elif path.endswith(".pt"):
        with warnings.catch_warnings():  # torch.jit is deprecated upstream and warns on every call
            warnings.simplefilter("ignore")
            module = torch.jit.load(path, map_location="cpu")
        # forward(self, x) or forward(self, x, mask): a required mask (one with a default is optional)
        takes_mask = any(not a.has_default_value() for a in module.forward.schema.arguments[2:])
    else:
        raise ValueError(f"{path}: unknown model file type; expected .pt (TorchScript), .pt2 or .onnx")

    def run(x, mask=None):
        inputs = [torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))]
        if takes_mask:
            inputs.append(torch.from_numpy(full_mask(x, mask)))
        with torch.no_grad():
            return module(*inputs).numpy()

    return run


def predict(model, x, mask=None):
    """Outputs for every row of ``x`` (and of ``mask``, if given), ``BATCH`` rows at a time."""
    parts = [slice(i, i + BATCH) for i in range(0, len(x), BATCH)]
    return np.concatenate([model(x[p], None if mask is None else mask[p]) for p in parts])


def main(job_path):
    with open(job_path) as f:
        job = json.load(f)
    started = time.perf_counter()
    model = load(job["model"])
    loaded = time.perf_counter()
    for key, npy in job["inputs"].items():  # x.npy, or [x.npy, mask.npy]
        arrays = [np.load(f) for f in ([npy] if isinstance(npy, str) else npy)]
        np.save(os.path.join(job["out"], f"{key}.npy"), predict(model, *arrays))
    result = {
        "load_s": loaded - started,
        "run_s": time.perf_counter() - loaded,
        "sweeper_modules": sorted(m for m in sys.modules if m.split(".")[0].startswith("sweeper")),
    }
    with open(os.path.join(job["out"], "result.json"), "w") as f:
        json.dump(result, f)


def serve(warm=()):
    """Jobs from stdin, one path per line; one answer line per job on stdout. ``warm``: modules
    to import before the first job (torch, onnxruntime), while the process waits for it."""
    answers, sys.stdout = sys.stdout, sys.stderr  # what a model prints must not look like an answer
    for name in warm:
        __import__(name)
    for line in sys.stdin:
        try:
            main(line.strip())
            answer = "ok"
        except Exception as exc:  # the job's failure is its answer; the next job still runs
            answer = f"error: {type(exc).__name__}: {exc}"
        answers.write(" ".join(answer.split()) + "\n")  # one line, whatever the message
        answers.flush()


if __name__ == "__main__":
    serve(sys.argv[2:]) if sys.argv[1] == "--serve" else main(sys.argv[1])
