"""A long sweep reviewed while it runs: every ``tracking.review_every`` trials that end in this
`sweeper run`, the sweep's MLflow run gets report.html and plots/*.png of the trials so far
(tag ``review_trials``: how many the report covers). Drawn on a thread of its own, so that no
trial's end waits for it; boundaries passed while it draws are drawn once it is done, the latest
trials then. The sweep's end replaces them with the final report (runner.py). Under
search.budget's clock no drawing starts that would end past the trials' end: the final report
waits for the one under way, and the clock has no room for it (plan/budget_clock.py)."""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sweeper.search import checkpoints
from sweeper.search.backend import Observer
from sweeper.spec import SweepSpec
from sweeper.track.mlflow import Tracker
from sweeper.track.records import TrialEvent, TrialRecord


class InterimReview:
    """An Observer that passes everything on to ``inner`` and redraws the review as trials end."""

    def __init__(
        self,
        inner: Observer,
        spec: SweepSpec,
        tracker: Tracker,
        parent: str,
        until: float | None = None,
        draw_s: float = 0.0,
    ) -> None:
        """``until``: when the trials end (time.time() seconds; None: no clock); ``draw_s``: what
        a drawing is expected to take before one has been timed (seconds)."""
        self.inner, self.spec, self.tracker, self.parent = inner, spec, tracker, parent
        self.until, self.draw_s = until, draw_s
        self.every = spec.tracking.review_every
        self.ended: dict[int, TrialRecord] = {}
        self.wanted = 0  # the number of ended trials the next drawing should cover
        self.drawn = 0
        self.failure: str | None = None  # the last drawing's error (said once, at close)
        self.lock = threading.Condition()
        self.thread: threading.Thread | None = None  # the drawing thread while it runs

    def started(self, spec: SweepSpec, out_dir: Path) -> None:
        self.inner.started(spec, out_dir)

    def note(self, text: str) -> None:
        self.inner.note(text)

    def event(self, event: TrialEvent) -> None:
        self.inner.event(event)
        if event.kind != "end" or event.record is None or not self.every:
            return
        with self.lock:
            self.ended[event.number] = event.record
            if len(self.ended) % self.every:
                return
            self.wanted = len(self.ended)
            if self.thread is None:  # else the drawing under way draws these next
                self.thread = threading.Thread(target=self._loop, name="sweeper-interim-review", daemon=True)
                self.thread.start()

    def close(self) -> str | None:
        """Wait for the drawing under way (and those it owes); returns why one failed, if one did."""
        with self.lock:
            thread = self.thread
        if thread is not None:
            thread.join()
        return self.failure

    def _loop(self) -> None:
        while True:
            with self.lock:
                if self.drawn >= self.wanted or self._past_the_clock():
                    self.thread = None  # under the lock: a later boundary starts a new one
                    return
                records = sorted(self.ended.values(), key=lambda r: r.number)
                self.drawn = len(records)
            started = time.monotonic()
            try:
                self._draw(records)
            except Exception as exc:  # the review is a convenience: the sweep goes on
                self.failure = f"{type(exc).__name__}: {exc}"
            self.draw_s = time.monotonic() - started

    def _past_the_clock(self) -> bool:
        """Whether a drawing started now would end past the trials' end (the last one's time)."""
        return self.until is not None and time.time() + self.draw_s > self.until

    def _draw(self, records: list[TrialRecord]) -> None:
        from sweeper.review import report

        summary = summary_so_far(self.spec, records, self.parent)
        with tempfile.TemporaryDirectory(prefix="sweeper-interim-") as tmp:
            page, *pngs = report.write(summary, Path(tmp))
            self.tracker.log_files(self.parent, [page])
            self.tracker.log_files(self.parent, pngs, "plots")  # sent (or kept in the journal) before the folder goes
        self.tracker.set_tags(self.parent, {"review_trials": str(len(records))})


def summary_so_far(spec: SweepSpec, records: list[TrialRecord], parent: str) -> dict[str, Any]:
    """What the report reads, for a sweep still running (no export yet)."""
    return {
        "name": f"{spec.name} (running: {len(records)} trials so far)",
        **checkpoints.standing(spec, records),
        "spec": spec.model_dump(mode="json"),
        "mlflow": {"parent_run_id": parent},
        "trials": [r.model_dump(mode="json") for r in records],
    }
