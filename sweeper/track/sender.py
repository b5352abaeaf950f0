"""A sweep's MLflow writes sent off the caller's thread: one sender thread takes them in the
order they were made and hands each to the outbox (outbox.py: retries, then the journal while
the server is away), so a coordinator goes on proposing, claiming and telling trials meanwhile.
On this 2-core machine the writes of a trial's run (its params and tags, trial.json, its end)
were about 60% of the orchestration around a trial.

Only what needs no answer is queued: params, tags, metrics, a run's end or resumption, and text
artifacts (kept in memory until sent: their source is gone by then). Creating a run (its id is
the answer) and logging files stay with the caller. ``drain`` waits until every queued write
was handed to the outbox; the tracker drains before any read, and at the process's exit. A
failure the caller must see (the server refused the credentials) is raised by the caller's next
write or drain. Writes queued when the process is killed are lost: at most the last moments of
a sweep's MLflow records, never its trials (those are in the study). Of sweeper, it imports only
the outbox.
"""

from __future__ import annotations

import atexit
import queue
import tempfile
import threading
from pathlib import Path
from typing import Any

from sweeper.track.outbox import Outbox


class Sender:
    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self.queue: queue.Queue[tuple[dict[str, Any], tuple[str, str] | None]] = queue.Queue()
        self.error: BaseException | None = None
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
        self.queue.join()
        if raising:
            self._raise()

    def _raise(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def _run(self) -> None:
        while True:
            entry, text = self.queue.get()
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
            finally:
                self.queue.task_done()
