"""A sweep's MLflow writes sent off the caller's thread: one sender thread takes them in the
order they were made and hands each to the outbox (outbox.py: retries, then the journal while
the server is away), so a coordinator goes on proposing, claiming and telling trials meanwhile:
the writes of a trial's run (its params and tags, trial.json, its end) were most of the
orchestration around a trial (docs/speed.md#overhead-against-a-hand-written-loop).

Only what needs no answer is queued: params, tags, metrics, a run's end or resumption, text
artifacts (kept in memory until sent: their source is gone by then) and the creation of a run
whose caller named it by a placeholder (Tracker.start_run). Logging files stays with the caller.
The sender gathers what is queued within
LINGER_S and sends a run's consecutive log_batch writes as one call (``coalesce``). ``drain``
waits until every queued write was handed to the outbox; the tracker drains before any read,
and at the process's exit. A failure the caller must see (the server refused the credentials)
is raised by the caller's next write or drain. Writes queued when the process is killed are
lost: at most the last moments of a sweep's MLflow records, never its trials (those are in the
study). Of sweeper, it imports only the outbox.
"""

from __future__ import annotations

import atexit
import queue
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sweeper.track.outbox import Outbox

# How long the sender gathers writes before it sends them (s): a run's log_batch writes queued
# meanwhile (its params and tags, each epoch's metrics, its final tags) go as one call: each call
# costs MLflow's store milliseconds, and a trial made one per epoch and a few more
# (docs/speed.md#orchestration-timed-directly).
LINGER_S = 0.5
# MLflow's caps on one log_batch: entities in all, params, tags
MAX_ENTITIES, MAX_PARAMS, MAX_TAGS = 1000, 100, 100

Item = tuple[dict[str, Any], tuple[str, str] | None]  # a write and its text artifact (name, content)


class Sender:
    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self.queue: queue.Queue[Item] = queue.Queue()
        self.error: BaseException | None = None
        self.hurry = threading.Event()  # a drain waits: send what is queued without lingering
        # a daemon thread: the process's exit does not wait for it, but drains it first (atexit
        # runs before daemon threads stop)
        self.thread = threading.Thread(target=self._run, name="sweeper-mlflow", daemon=True)
        self.thread.start()
        atexit.register(self.drain, raising=False)

    def put(self, entry: dict[str, Any], text: tuple[str, str] | None = None) -> None:
        """Queue one write (``text``: the file name and content of a log_artifact)."""
        self._raise()
        self.queue.put((entry, text))

    def drain(self, raising: bool = True) -> None:
        """Wait until every queued write was handed to the outbox."""
        self.hurry.set()
        self.queue.join()
        self.hurry.clear()
        if raising:
            self._raise()

    def _raise(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def _gather(self) -> list[Item]:
        """The next writes: the first one queued, and those queued within LINGER_S after it."""
        items = [self.queue.get()]
        deadline = time.monotonic() + LINGER_S
        while not self.hurry.is_set() and (left := deadline - time.monotonic()) > 0:
            try:  # short waits, so that a drain is not kept waiting for the whole linger
                items.append(self.queue.get(timeout=min(left, 0.05)))
            except queue.Empty:
                continue
        while True:  # what is queued already goes too
            try:
                items.append(self.queue.get_nowait())
            except queue.Empty:
                return items

    def _run(self) -> None:
        while True:
            items = self._gather()
            for entry, text in coalesce(items):
                try:
                    if text is None:
                        self.outbox.write(entry)
                    else:
                        with tempfile.TemporaryDirectory(prefix="sweeper-artifact-") as tmp:
                            file = Path(tmp) / text[0]
                            file.write_text(text[1])
                            self.outbox.write(entry, file=file)
                except BaseException as exc:  # for the caller (the outbox already keeps what it can)
                    if self.error is None:
                        self.error = exc
            for _ in items:
                self.queue.task_done()


def coalesce(items: list[Item]) -> list[Item]:
    """The same writes in fewer calls: a run's log_batch writes merged into its first one, until
    a change of the run's status (its end) comes between, or MLflow's caps would be passed. A
    run's batches and status changes keep their order; params and tags set twice keep the later
    value; artifacts go where they were queued (a file does not depend on params or metrics)."""
    out: list[Item] = []
    open_batch: dict[Any, int] = {}  # run -> index in out of its log_batch that may still grow
    for entry, text in items:
        run = entry.get("run")
        if entry["op"] != "log_batch" or text is not None:
            if entry["op"] != "log_artifact":  # a file is independent of params, tags and metrics
                open_batch.pop(run, None)
            out.append((entry, text))
            continue
        at = open_batch.get(run)
        if at is not None and _fits(out[at][0], entry):
            out[at] = (_merged(out[at][0], entry), None)
        else:
            open_batch[run] = len(out)
            out.append((entry, None))
    return out


def _merged(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {
        **a,
        "metrics": [*a.get("metrics", []), *b.get("metrics", [])],
        "params": {**a.get("params", {}), **b.get("params", {})},
        "tags": {**a.get("tags", {}), **b.get("tags", {})},
    }


def _fits(a: dict[str, Any], b: dict[str, Any]) -> bool:
    merged = _merged(a, b)
    params, tags = len(merged["params"]), len(merged["tags"])
    return params <= MAX_PARAMS and tags <= MAX_TAGS and len(merged["metrics"]) + params + tags <= MAX_ENTITIES
