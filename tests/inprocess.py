"""The real CLI (``sweeper.cli.app``) run in the test process, as ``python -m sweeper ARGS`` would
run it: the same exit code, stdout and stderr, without the ~5 s of imports (torch, MLflow,
Optuna...) that each new process pays.

What a command changes in its process that a new process would not carry into the next command
is set as in a new process before the call, or put back after it: torch's threads, numerics
flags and random generators, Python's and NumPy's random state, os.environ, sys.path, the working
folder, the root logger's handlers (none: a new process prints warnings on stderr), warnings
filters (Python's defaults, printed on stderr), SIGINT/SIGTERM handlers, the plugin registry's
caches, the test plugins' modules (a test may edit one between two runs) and sweeper's
per-process caches (FRESH). Loggers keep the levels set when their modules were imported, as in
a process that imported them. Output that bypasses sys.stdout/sys.stderr (a pool worker
process, C code) is caught at the file descriptors and added to the streams.

Ray must never start in the test process (tests/test_ray.py sets Ray's auth token before Ray
reads it, once per process): a command that imports Ray fails here, naming process=True."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path

# sweeper's per-process caches, emptied before each command: a new process starts without them
# (the data set and compiled forwards live in a trial.build.ProcessCache each command makes anew)
FRESH = (("sweeper.search.trial_runs", "_datasets_logged"),)  # (run, data set) pairs logged by this process

# Python's warnings filters in a new process started without -W, but __main__'s (each one set goes first)
DEFAULT_FILTERS = (
    ("ignore", ResourceWarning),
    ("ignore", ImportWarning),
    ("ignore", PendingDeprecationWarning),
    ("ignore", DeprecationWarning),
)

# Folders whose modules are forgotten before each command: the test plugins' (tests/conftest.py
# sets pytest's base temporary folder here)
test_folders: list[Path] = []


class CommandTimeout(BaseException):
    """A command ran past its time limit (a BaseException: sweeper's own handlers let it through)."""


def invoke(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    """``sweeper ARGS`` in this process with ``env`` added to os.environ for the call; a
    command still running after ``timeout`` seconds (a hung test) raises CommandTimeout."""
    from typer.testing import CliRunner

    from sweeper.cli import app

    def expired(signum: int, frame: object) -> None:
        raise CommandTimeout(f"sweeper {' '.join(args)} did not finish within {timeout:.0f} s")

    ray_before = "ray" in sys.modules
    with _restored(), _descriptors() as (out_fd, err_fd), _fresh_process():
        previous = signal.signal(signal.SIGALRM, expired)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            launched = {"SWEEPER_LAUNCHED_AT": str(time.time())}  # this command's launch (search.budget's clock)
            result = CliRunner().invoke(app, args, prog_name="sweeper", env={**launched, **env}, catch_exceptions=True)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    with out_fd, err_fd:
        stdout = result.stdout + out_fd.read()
        stderr = result.stderr + err_fd.read()
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        # what the real CLI prints for an uncaught exception (typer's pretty exceptions are off)
        stderr += "Traceback (most recent call last):\n" + "".join(traceback.format_exception(result.exception))
    if not ray_before and "ray" in sys.modules:
        raise AssertionError(
            f"sweeper {' '.join(args)} imported Ray in the test process: run it with sweeper(..., process=True)"
        )
    return subprocess.CompletedProcess(["sweeper", *args], result.exit_code, stdout, stderr)


@contextlib.contextmanager
def _restored() -> Iterator[None]:
    """Put back after the command whatever process-wide state it may change."""
    import numpy as np
    import torch

    environ, path, cwd = dict(os.environ), list(sys.path), os.getcwd()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    root_handlers = list(logging.root.handlers)
    flags = _torch_flags()
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    # MLflow's process-wide tracking URI: export/publish.py sets it around log_model and puts back
    # the URI it resolved (the environment's then), which a new process would not carry over
    from mlflow.tracking._tracking_service import utils as mlflow_tracking

    tracking_uri = mlflow_tracking._tracking_uri
    try:
        yield
    finally:
        mlflow_tracking._tracking_uri = tracking_uri
        os.environ.clear()
        os.environ.update(environ)
        sys.path[:] = path
        os.chdir(cwd)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        logging.root.handlers[:] = root_handlers
        _set_torch_flags(flags)
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])


@contextlib.contextmanager
def _fresh_process() -> Iterator[None]:
    """The command starts as in a new process: caches empty, test plugins imported anew,
    warnings and log records printed on stderr."""
    from sweeper.pluginhost import registry

    _empty_caches()
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None) or ""
        if any(Path(file).is_relative_to(folder) for folder in test_folders):
            del sys.modules[name]
    registry.refresh()
    logging.root.handlers[:] = []  # pytest's capture handlers: without them, logging's last resort prints
    with warnings.catch_warnings():
        warnings.resetwarnings()
        for action, category in DEFAULT_FILTERS:
            warnings.simplefilter(action, category)
        warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
        warnings.showwarning = _show_on_stderr
        try:
            yield
        finally:
            _empty_caches()  # nor does a test after it find them (a data set, compiled models)


def _empty_caches() -> None:
    for module, name in FRESH:
        cache = getattr(importlib.import_module(module), name, None)
        if cache is None:
            raise AssertionError(f"tests/inprocess.py: {module}.{name} is gone; update FRESH to what replaced it")
        cache.clear()


def _show_on_stderr(message, category, filename, lineno, file=None, line=None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


@contextlib.contextmanager
def _descriptors() -> Iterator[tuple]:
    """File descriptors 1 and 2 point to files during the command: what child processes and C
    code write there; yields those files, readable (as text) after the block."""
    sys.stdout.flush()
    sys.stderr.flush()
    files = [tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") for _ in (1, 2)]
    saved = [os.dup(fd) for fd in (1, 2)]
    try:
        for fd, file in zip((1, 2), files):
            os.dup2(file.fileno(), fd)
        try:
            yield tuple(files)
        finally:
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
            for file in files:
                file.seek(0)
    finally:
        for copy in saved:
            os.close(copy)


def _torch_flags() -> dict:
    import torch

    return {
        "threads": torch.get_num_threads(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "benchmark": torch.backends.cudnn.benchmark,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "tf32": torch.backends.cudnn.allow_tf32,
        "matmul": torch.get_float32_matmul_precision(),
    }


def _set_torch_flags(flags: dict) -> None:
    import torch

    if torch.get_num_threads() != flags["threads"]:
        torch.set_num_threads(flags["threads"])
    if (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()) != (
        flags["deterministic"],
        flags["warn_only"],
    ):
        torch.use_deterministic_algorithms(flags["deterministic"], warn_only=flags["warn_only"])
    torch.backends.cudnn.benchmark = flags["benchmark"]
    torch.backends.cudnn.deterministic = flags["cudnn_deterministic"]
    torch.backends.cudnn.allow_tf32 = flags["tf32"]
    torch.set_float32_matmul_precision(flags["matmul"])
