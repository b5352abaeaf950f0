"""A sweep's tracker kept in a helper process, so that the sweep's own process never imports
MLflow: importing it and its SQL store costs 2.5-3 s of one core on a 2-core CPU, and the helper
that registers the model (export/registrar.py) imports it anyway (docs/speed.md#start-up).

``RemoteTracker`` is a Tracker whose every public method and property runs on the helper's
Tracker, with the same arguments (paths made absolute: the helper runs in a folder of its own)
and the same answer or exception, over a ``Channel`` (one pickled message each way: a call
costs a tenth of a millisecond; writes that need no answer are still sent by the helper's
sender thread, sender.py). ``host`` is the helper's side. When the helper is gone (killed, or
it died), the RemoteTracker goes on with a Tracker of its own in this process, with a warning:
the writes the helper had queued and not sent are lost, as a killed sweep's are (sender.py);
runs it created are found by their placeholder's tag (outbox.JOURNAL_TAG).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from sweeper.track.mlflow import Tracker

SYNC = "sync_tracker"  # a call of sync.sync_tracker on the helper's tracker (it reads the outbox)


class Gone(Exception):
    """The helper process does not answer any more."""


class Channel:
    """This process's end of a helper's connection; one call at a time."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.lock = threading.Lock()
        self.next_key = 0

    def call(self, key: int, name: str, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        """``name(*args, **kwargs)`` of tracker ``key`` on the helper; its answer, or its exception
        raised here. Gone when the helper does not answer."""
        with self.lock:
            try:
                self.connection.send((key, name, _absolute(args), _absolute(kwargs or {})))
                ok, answer, said = self.connection.recv()
            except (OSError, EOFError) as exc:
                raise Gone(f"{type(exc).__name__}: {exc}") from None
        for line in said:  # the helper tracker's warnings, on this process's stderr (the live display's)
            print(line, file=sys.stderr, flush=True)
        if not ok:
            raise answer
        return answer

    def key(self) -> int:
        with self.lock:
            self.next_key += 1
            return self.next_key


class RemoteTracker(Tracker):
    """``Tracker(uri, experiment, journal_dir, asynchronous=...)`` made and used on the helper
    at the other end of ``channel``."""

    def __init__(
        self, channel: Channel, uri: str, experiment: str | None, journal_dir: Path | None, asynchronous: bool
    ) -> None:
        # not Tracker.__init__: this process imports no MLflow; the tracker is the helper's
        self.uri, self.experiment, self.journal_dir = uri, experiment, journal_dir
        self._made = (uri, experiment, journal_dir, asynchronous)
        self._channel: Channel | None = channel
        self._local: Tracker | None = None
        self._lock = threading.Lock()
        self._key = channel.key()
        # the helper's folder and environment are the sweep's (MLflow's credentials, say)
        self._on_helper("__init__", self._made, {"cwd": os.getcwd(), "env": dict(os.environ)})

    def _on_helper(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        channel = self._channel
        if channel is not None:
            try:
                return channel.call(self._key, name, args, kwargs)
            except Gone as exc:
                self._take_over(exc)
                if name == "__init__":
                    return None
        assert self._local is not None
        return _call(self._local, name, args, kwargs)

    def _take_over(self, gone: Gone) -> None:
        """The helper is gone: a Tracker in this process from now on (once, whichever thread saw it)."""
        with self._lock:
            if self._local is not None:
                return
            print(
                f"warning: the MLflow helper process stopped ({gone}): this process tracks the sweep "
                "from now on; writes it had not sent yet are lost",
                file=sys.stderr,
            )
            uri, experiment, journal_dir, asynchronous = self._made
            self._local = Tracker(uri, experiment, journal_dir, asynchronous=asynchronous)
            self._channel = None

    @property
    def enabled(self) -> bool:
        return True

    @property
    def outbox(self) -> Any:
        raise RuntimeError("a RemoteTracker's outbox is in the MLflow helper's process: use synced()")

    def synced(self) -> Any:
        """sync.sync_tracker of the helper's tracker (its outbox is there)."""
        return self._on_helper(SYNC, (), {})


def _forwarded(name: str, member: Any) -> Any:
    if isinstance(member, (property, functools.cached_property)):
        return property(lambda self: self._on_helper(name, (), {}))

    @functools.wraps(member)
    def call(self: RemoteTracker, *args: Any, **kwargs: Any) -> Any:
        return self._on_helper(name, args, kwargs)

    return call


# every public method and property of Tracker runs on the helper (but what this class defines)
for _name, _member in vars(Tracker).items():
    if not _name.startswith("_") and _name not in vars(RemoteTracker):
        setattr(RemoteTracker, _name, _forwarded(_name, _member))


def _absolute(value: Any) -> Any:
    """``value`` with its paths made absolute (nested in lists, tuples and dicts)."""
    if isinstance(value, Path):
        return value.absolute()
    if isinstance(value, (list, tuple)):
        return type(value)(_absolute(v) for v in value)
    if isinstance(value, dict):
        return {k: _absolute(v) for k, v in value.items()}
    return value


# --- the helper's side ------------------------------------------------------------------------

_hosted: dict[int, Tracker] = {}


def prepare() -> None:
    """Import what a Tracker of a database store imports when it is made (MLflow's client, its SQL
    store: ~2.5 s of one core), before the helper's other work: the sweep waits for its tracker."""
    from mlflow.store.tracking import sqlalchemy_store  # noqa: F401
    from mlflow.tracking import MlflowClient  # noqa: F401


class _Said:
    """The helper's stderr, whose lines in sweeper's own form ("warning: ...", "note: ...": the
    outbox's and the tracker's) are also kept for the sweep's process, which prints them."""

    KINDS = ("warning: ", "note: ")

    def __init__(self, stream: Any) -> None:
        self.stream, self.lines, self.partial = stream, list[str](), ""
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            *done, self.partial = (self.partial + text).split("\n")
            self.lines += [line for line in done if line.startswith(self.KINDS)]
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def take(self) -> list[str]:
        with self.lock:
            taken, self.lines = self.lines, []
            return taken

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def host(connection: Connection) -> None:
    """Serve a RemoteTracker's calls until the other end closes (on a thread of the helper)."""
    said = sys.stderr = _Said(sys.stderr)
    while True:
        try:
            key, name, args, kwargs = connection.recv()
        except (OSError, EOFError):
            return
        try:
            ok, answer = True, _answer(key, name, args, kwargs)
        except BaseException as exc:
            ok, answer = False, exc
        try:
            connection.send((ok, answer, said.take()))
        except (OSError, EOFError):
            return
        except Exception as exc:  # an answer or exception that does not pickle
            connection.send((False, RuntimeError(f"{name}: {type(exc).__name__}: {exc}"), []))


def _answer(key: int, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if name == "__init__":
        os.environ.clear()
        os.environ.update(kwargs["env"])
        os.chdir(kwargs["cwd"])
        uri, experiment, journal_dir, asynchronous = args
        _hosted[key] = Tracker(uri, experiment, journal_dir, asynchronous=asynchronous)
        return None
    return _call(_hosted[key], name, args, kwargs)


def _call(tracker: Tracker, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``tracker``'s method ``name`` called (or its property read), or SYNC: what both the
    helper and a RemoteTracker that took over in its own process do with a call."""
    if name == SYNC:
        from sweeper.track.sync import sync_tracker

        return sync_tracker(tracker)
    found = getattr(tracker, name)
    return found(*args, **kwargs) if callable(found) else found


def drain_hosted() -> None:
    """Hand every hosted tracker's queued writes to MLflow (the helper is about to exit)."""
    for tracker in _hosted.values():
        try:
            tracker.drain()
        except Exception as exc:  # the sweep is over: say it, as a sender's exit does
            print(f"warning: MLflow writes at exit: {exc}", file=sys.stderr)
