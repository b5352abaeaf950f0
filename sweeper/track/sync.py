"""Sending the MLflow journals of an output folder: the tracker's own (at the start and end of a
sweep) and those that stopped processes left (a worker, a Ray actor, a sweep that ended while
the server was away), for ``sweeper run`` and ``sweeper sync``. Generic MLflow, like the
tracker: of sweeper it imports only errors and the tracker's modules."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sweeper.errors import UserError
from sweeper.track.journal import FOLDER, Journal, journals
from sweeper.track.mlflow import Tracker, redact


@dataclass
class SyncReport:
    """What sending a folder's journals did."""

    sent: int = 0  # writes that reached MLflow
    waiting: int = 0  # writes still in journals
    unreachable: list[str] = field(default_factory=list)  # "URI (why)" of the journals that could not be sent
    held: list[str] = field(default_factory=list)  # journals a live process holds (it sends them itself)
    need_uri: list[str] = field(default_factory=list)  # journals of a URI whose password is not recorded


def send_journals(folder: Path, uri: str | None = None, fallback: str | None = None) -> SyncReport:
    """Send every journal in ``folder`` that no live process holds, in order, each to ``uri``
    or else to the URI it was written for (``fallback`` gives the password that a recorded URI
    lacks, when it is that URI). Repeats while a pass sends something: a journal may name runs
    that another one creates."""
    sent, done = 0, set()
    while True:
        report = SyncReport(sent=sent)
        for path in journals(folder):
            if path in done:
                continue
            journal = Journal.adopt(path)
            if journal is None:
                report.held.append(path.name)
                continue
            try:
                if not journal.waiting():  # all sent, or cut short by a crash before its first write
                    continue
                header = journal.header
                target = uri or (fallback if fallback and redact(fallback) == header["uri"] else header["uri"])
                if not target or ":***@" in target:
                    report.need_uri.append(path.name)
                    report.waiting += journal.waiting()
                    continue
                outbox = Tracker(target, header["experiment"], folder, journal=journal).outbox
                if outbox.flush(force=True):
                    done.add(path)
                else:
                    report.waiting += journal.waiting()
                    report.unreachable.append(f"{redact(target)} ({outbox.blocked})")
                report.sent += outbox.sent
            finally:
                journal.close()
        if report.sent == sent:  # this pass sent nothing more
            return report
        sent = report.sent


def sync_tracker(tracker: Tracker) -> SyncReport:
    """The tracker's journal sent now, then the others in its folder (to the tracker's server,
    when they were written for it)."""
    if not tracker.enabled or tracker.journal_dir is None:
        return SyncReport()
    tracker.drain()  # the writes its sender thread holds come first
    before = tracker.outbox.sent
    live = tracker.outbox.flush(force=True)
    report = send_journals(tracker.journal_dir, fallback=tracker.uri)
    report.sent += tracker.outbox.sent - before
    if not live:
        report.waiting += tracker.outbox.waiting()
        report.unreachable.append(f"{redact(tracker.uri)} ({tracker.outbox.blocked})")
    return report


def sync_folder(out_dir: Path, uri: str | None = None) -> SyncReport:
    """``sweeper sync``: send the journals of a sweep's output folder (or of a journal folder);
    a UserError if some could not be sent."""
    folder = out_dir / FOLDER if (out_dir / FOLDER).is_dir() else out_dir
    if not out_dir.is_dir():
        raise UserError(f"{out_dir}: no such folder (give a sweep's output folder, e.g. runs/<name>)")
    report = send_journals(folder, uri)
    if report.unreachable:
        raise UserError(
            f"{folder}: MLflow at {', '.join(sorted(set(report.unreachable)))} did not take the "
            f"journaled writes; {report.sent} were sent, {report.waiting} still wait: run `sweeper sync "
            f"{out_dir}` again once it answers"
        )
    if report.need_uri:
        raise UserError(
            f"{folder}: {', '.join(report.need_uri)} were written for a tracking URI with a password, "
            "which the journal does not record: give it with --tracking-uri"
        )
    return report
