"""The model's registration (publish.py) in a process of its own, started as a sweep starts.

Registering costs a sweep's end about 3 s of one core on a 2-core CPU (docs/speed.md#start-up):
importing MLflow's pytorch flavour and torch's compiler (torch.export saves the model), and
MLflow's map of every installed distribution (its check of the requirements). On the sweep's
own threads that work takes turns with the export and the report for one interpreter lock. The
registrar does it beforehand, on the other core, while the sweep trains (``prestart``); at the
end it gets the model to register as a file (``publish.Registration``, saved with torch.save in a
folder of the sweep's process) and answers with the registry's entry.

Where the registrar cannot take a model (one that does not pickle, a process that died) the
sweep's process registers it itself, as before; MLflow's own refusal is the registration's
error either way. ``python -m sweeper.export.registrar`` is the process; importing this module
imports no torch.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeper.export import served
from sweeper.phases import phase
from sweeper.track import remote, sqlite

if TYPE_CHECKING:
    from sweeper.export.publish import Registration
    from sweeper.spec import SweepSpec

FAILED, UNLOADABLE = "failed: ", "unloadable: "  # the registrar's answers besides "ok"
GRACE_S = 10.0  # at the sweep's exit: to close its MLflow store (sqlite: its log folded in the file)


def process() -> served.Served:
    """This process's registrar, started if none runs."""
    argv = [sys.executable, "-m", "sweeper.export.registrar"]
    return served.shared("registrar", argv, grace_s=GRACE_S, channel=True)


def prestart() -> None:
    """Start this process's registrar now: it imports what registering needs while the sweep trains."""
    process()


_channels: dict[int, remote.Channel] = {}  # id of a registrar's connection -> this process's channel


def tracking_channel() -> remote.Channel | None:
    """Where this process's sweep tracker can live (track/remote.py): the channel of the
    registrar started for it (prestart), which imports MLflow anyway; None when none runs."""
    running = served.running("registrar")
    if running is None or running.channel is None:
        return None
    key = id(running.channel)
    if key not in _channels:
        _channels.clear()  # an earlier registrar's, which is gone
        _channels[key] = remote.Channel(running.channel)
    return _channels[key]


@dataclass(frozen=True)
class Job:
    """The chosen model to register: its trial's data and task, the sweep's run and its values."""

    model: Any
    data: Any
    task: Any
    tracking_uri: str
    run_id: str
    values: dict[str, float]


def register_meanwhile(spec: SweepSpec, job: Job) -> Future[dict[str, Any]]:
    """``job`` registered (``register``), waited for on a thread of its own while the caller
    writes and checks the files: the registry's entry, or the error MLflow raised."""
    from sweeper.export import publish
    from sweeper.export.write import exportable

    # a copy: where this process registers it, torch.export swaps the traced module's parameters for fakes
    logged = copy.deepcopy(exportable(job.model, job.task))

    def registered() -> dict[str, Any]:
        with phase("registry"):  # on its thread: the whole registration, waits included
            made = publish.registration(
                logged, job.data, spec, job.tracking_uri, job.run_id, job.values, job.task.outputs
            )
            return register(made) if isinstance(made, publish.Registration) else made

    pool = ThreadPoolExecutor(1, thread_name_prefix="sweeper-registry")
    registering = pool.submit(registered)
    pool.shutdown(wait=False)  # its thread ends with its one job
    return registering


def register(made: Registration) -> dict[str, Any]:
    """``publish.publish(made)``, done by the registrar (here when it cannot take it); raises
    what MLflow raised."""
    import torch

    from sweeper.export import publish

    with tempfile.TemporaryDirectory(prefix="sweeper-registration-") as folder:
        job = Path(folder) / "job.pt"
        try:  # with this process's folder and environment (MLflow's credentials, say), as here
            torch.save({"made": made, "cwd": os.getcwd(), "env": dict(os.environ)}, job)
        except Exception:  # a model that does not pickle (a class in __main__, a lambda): here
            return publish.publish(made)
        answer = process().run(job)
        if answer == "ok":
            return dict(json.loads((Path(folder) / "result.json").read_text()))
        if answer.startswith(FAILED):
            raise RuntimeError(answer.removeprefix(FAILED))
    return publish.publish(made)  # not loadable there, or the registrar died: here


def _serve() -> None:
    """The registrar: warm up, then one job per line of stdin, one answer per line of stdout."""
    answers, sys.stdout = sys.stdout, sys.stderr  # what MLflow prints must not look like an answer
    from sweeper.export import publish

    if "--channel" in sys.argv:  # the sweep's tracker lives here (track/remote.py): MLflow's client first
        with phase("registrar tracker warm-up"):
            remote.prepare()
        connection = Connection(int(sys.argv[sys.argv.index("--channel") + 1]))
        threading.Thread(target=remote.host, args=(connection,), name="sweeper-tracker", daemon=True).start()
    with phase("registrar warm-up"):
        publish.warm()
    for line in sys.stdin:
        with phase("registrar job"):
            answer = _job(Path(line.strip()))
        answers.write(" ".join(answer.split()) + "\n")  # one line, whatever the message
        answers.flush()
    # stdin closed: the sweep is ending and waits for this process. Its sqlite connections closed
    # (the database whole, its log folded in), it leaves without Python's teardown (~0.5 s)
    remote.drain_hosted()
    sqlite.close_all()
    os._exit(0)


def _job(job: Path) -> str:
    import torch

    from sweeper.export import publish

    try:  # weights_only=False: the sweep's process wrote it a moment ago, in a folder of its own
        given = torch.load(job, weights_only=False)
    except Exception as exc:
        return f"error: {UNLOADABLE}{type(exc).__name__}: {exc}"
    try:
        with _as_given(given["cwd"], given["env"]):
            result = publish.publish(given["made"])
    except Exception as exc:
        return f"error: {FAILED}{type(exc).__name__}: {exc}"
    (job.parent / "result.json").write_text(json.dumps(result))
    return "ok"


@contextlib.contextmanager
def _as_given(cwd: str, env: dict[str, str]) -> Iterator[None]:
    """The job's folder and environment for the block (a registrar outlives a sweep: a test
    process's runs each their own)."""
    saved, here = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(saved)


if __name__ == "__main__":
    _serve()
