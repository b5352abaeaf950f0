"""Load an exported model file and run it on NumPy arrays, with no sweeper import.

This module is self-contained on purpose (it imports only the standard library, NumPy, torch
and onnxruntime): the parity check runs its source text in a ``python -c`` process that never imports sweeper to
prove that a consumer without sweeper gets the eager model's outputs, and ``sweeper predict``
imports it. Copy it as a starting point for serving code.

    python -c "$(cat consumer.py)" job.json   # job: {"model": PATH, "inputs": {key: x.npy}, "out": DIR}

writes ``DIR/<key>.npy`` (the model's outputs for each input) and ``DIR/result.json``.

    python -c "$(cat consumer.py)" --serve    # one job path per line on stdin, until stdin closes

runs each job as above and answers each line with one line on stdout: "ok", or "error: " and
the exception (the parity check keeps one such process for all the files it checks: the cost
of a new process, torch's import, is paid once).
"""

import json
import os
import sys
import time
import warnings

import numpy as np

BATCH = 256  # rows per forward call: bounds memory on large validation sets


def load(path):
    """A function ndarray (N, ...) float32 -> ndarray (N, classes), for any exported format."""
    path = str(path)
    if path.endswith(".onnx"):
        import onnxruntime as ort

        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        return lambda x: session.run(None, {name: np.ascontiguousarray(x, dtype=np.float32)})[0]
    import torch

    if path.endswith(".pt2"):
        module = torch.export.load(path).module()
    elif path.endswith(".pt"):
        with warnings.catch_warnings():  # torch.jit is deprecated upstream and warns on every call
            warnings.simplefilter("ignore")
            module = torch.jit.load(path, map_location="cpu")
    else:
        raise ValueError(f"{path}: unknown model file type; expected .pt (TorchScript), .pt2 or .onnx")

    def run(x):
        with torch.no_grad():
            return module(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))).numpy()

    return run


def predict(model, x):
    """Outputs for every row of ``x``, ``BATCH`` rows at a time."""
    return np.concatenate([model(x[i : i + BATCH]) for i in range(0, len(x), BATCH)])


def main(job_path):
    with open(job_path) as f:
        job = json.load(f)
    started = time.perf_counter()
    model = load(job["model"])
    loaded = time.perf_counter()
    for key, npy in job["inputs"].items():
        np.save(os.path.join(job["out"], f"{key}.npy"), predict(model, np.load(npy)))
    result = {
        "load_s": loaded - started,
        "run_s": time.perf_counter() - loaded,
        "sweeper_modules": sorted(m for m in sys.modules if m.split(".")[0].startswith("sweeper")),
    }
    with open(os.path.join(job["out"], "result.json"), "w") as f:
        json.dump(result, f)


def serve():
    """Jobs from stdin, one path per line; one answer line per job on stdout."""
    answers, sys.stdout = sys.stdout, sys.stderr  # what a model prints must not look like an answer
    for line in sys.stdin:
        try:
            main(line.strip())
            answer = "ok"
        except Exception as exc:  # the job's failure is its answer; the next job still runs
            answer = f"error: {type(exc).__name__}: {exc}"
        answers.write(" ".join(answer.split()) + "\n")  # one line, whatever the message
        answers.flush()


if __name__ == "__main__":
    serve() if sys.argv[1] == "--serve" else main(sys.argv[1])
