"""How a tracker's writes reach MLflow, so that tracking never stops a sweep.

A write is a small dict (an "entry": the same whether it is sent at once or from a journal):
  create_run    name, parent (run id or placeholder), time (ms); also run (its placeholder) from a
                journal, or with live: true from a caller that did not wait for the id (sender.py)
  log_batch     run, metrics [[key, value, timestamp ms, step], ...], params {k: v}, tags {k: v}
  update_run    run, status                 set_terminated  run, status, time (ms)
  log_inputs    run, context, dataset {name, digest, source_type, source, profile}
  log_artifact  run, folder (artifact path or None); from a journal also file (its copy)

A write that fails for want of a server (no connection, a timeout, HTTP 5xx/408/429) is tried
again after each of RETRY_DELAYS_S. Past that, with a journal folder, the outbox goes offline:
this write and every later one is appended to a journal (journal.py), in order; a run created
meanwhile gets a placeholder id. At most every OFFLINE_RETRY_S a write first tries to send the
journal; once all of it is sent the outbox is live again. A write MLflow rejects (another 4xx:
a bug, not a hiccup) is left out with a warning; a refusal of the credentials (TrackingRefused,
a UserError) is raised, as it is the user's to fix. Without a journal folder (interactive
commands) a failed write raises. Imports nothing of sweeper but errors and the journal.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sweeper.errors import UserError
from sweeper.track.journal import Journal, is_local, known_ids, local_id

# Waits between the 4 attempts of a write (s): ~10 s ride out a server restart or a network
# blip; a longer outage goes to the journal instead of stalling the sweep.
RETRY_DELAYS_S = (1.0, 3.0, 6.0)
# While offline, how often a write first tries to send the journal (s): a dead server costs
# one refused (or timed out, see mlflow.py: MLFLOW_ENV) call a minute, not one per write.
OFFLINE_RETRY_S = 60.0
# on a run created from a journal, or by a sender thread (live): the placeholder it was known by
# before MLflow made it; any process finds it by that (never two runs from one journal entry)
JOURNAL_TAG = "sweeper.journal_id"


class Away(Exception):
    """MLflow did not take a call for want of a server (after the retries)."""


class Unsent(Away):
    """A write names a run created while the server was away whose journal is not sent yet."""


class Rejected(Exception):
    """MLflow refused a call in a way another try would meet again (HTTP 4xx)."""


class Outbox:
    """The writes of one tracker: ``client`` (an MlflowClient whose refusals of the credentials
    raise a UserError), its experiment's id (a callable: looked up when first needed),
    ``where`` (the server, for messages; no password) and the journal ``folder``."""

    def __init__(
        self,
        client: Any,
        experiment_id: Callable[[], str],
        where: str,
        folder: Path | None,
        header: dict[str, Any],
        journal: Journal | None = None,
    ) -> None:
        self.client, self._experiment_id, self.where, self.folder = client, experiment_id, where, folder
        self.header = header  # what a journal records first: the URI (no password), the experiment
        self.journal = journal  # set while offline (given: a journal to send, see sync.py)
        self.sent = 0  # journaled writes sent so far
        self.blocked = ""  # why the journal could not be sent, last time it was tried
        self._next_try = 0.0  # monotonic time of the next attempt to send the journal
        self._ids: dict[str, str | None] = {}  # placeholder -> run id (None: MLflow rejected the run)
        self._lock = threading.RLock()  # one write (or flush) at a time: the journal keeps their order

    def write(self, entry: dict[str, Any], file: Path | None = None) -> str | None:
        """Deliver one write (``file``: the artifact of a log_artifact); returns the id of the
        run a create_run made: a placeholder while offline, None if MLflow rejected it."""
        with self._lock:
            if self.journal is not None:
                if not self.flush():
                    return self._keep(self.journal, entry, file)
                _say(f"MLflow at {self.where} answers again: the writes that waited were sent", "note")
            try:
                return self.retrying(lambda: self._send(entry, file))
            except (Away, Rejected) as exc:
                if self.folder is None:  # an interactive command: its user sees the error
                    raise exc.__cause__ or exc from None
                if isinstance(exc, Rejected):
                    if entry.get("live"):
                        self._ids[entry["run"]] = None
                    _say(f"MLflow at {self.where} rejected a write ({_what(entry)}): {brief(exc)}; it is left out")
                    return None
                self.journal = Journal.create(self.folder, self.header)
                self._next_try = time.monotonic() + OFFLINE_RETRY_S
                _say(
                    f"MLflow at {self.where} does not answer ({brief(exc)}): its writes wait in {self.journal.path} "
                    "and are sent when it answers again"
                )
                return self._keep(self.journal, entry, file)

    def retrying(self, call: Callable[[], Any]) -> Any:
        """``call``, tried again after each of RETRY_DELAYS_S while the server does not answer
        (once only while offline); Away or Rejected when it fails."""
        for delay in (*(RETRY_DELAYS_S if self.journal is None else ()), None):
            try:
                return call()
            except (UserError, Away):  # a refusal of the credentials; a run not sent yet
                raise
            except Exception as exc:
                if not transient(exc):
                    raise Rejected(first_line(exc)) from exc
                if delay is None:
                    raise Away(first_line(exc)) from exc
                time.sleep(delay)
        raise AssertionError("unreachable")

    def flush(self, force: bool = False) -> bool:
        """Send the journal, one attempt per write (not before OFFLINE_RETRY_S since the last
        try, unless ``force``); True once all of it is sent and the outbox live again."""
        with self._lock:
            if self.journal is None:
                return True
            if not force and time.monotonic() < self._next_try:
                return False
            for index, entry in self.journal.pending():
                try:
                    made = self._send(entry, None)
                except UserError:
                    raise
                except Exception as exc:
                    if isinstance(exc, Away) or (not isinstance(exc, Rejected) and transient(exc)):
                        self._next_try = time.monotonic() + OFFLINE_RETRY_S
                        self.blocked = brief(exc)
                        return False
                    _say(
                        f"MLflow at {self.where} rejected a journaled write ({_what(entry)}): "
                        f"{brief(exc)}; it is left out"
                    )
                    made = None
                created = {entry["run"]: made} if entry["op"] == "create_run" else None
                self._ids.update(created or {})
                # a crash before this line sends this write again: the same metrics, params, tags,
                # status or file change nothing, and a run made from a journal is found by JOURNAL_TAG
                self.journal.mark_sent(index, created)
                self.sent += 1
            self.journal.close()
            self.journal = None
            return True

    def waiting(self) -> int:
        return self.journal.waiting() if self.journal is not None else 0

    def real(self, run_id: str | None, ask_mlflow: bool = True) -> str | None:
        """The MLflow id of a run; Unsent for a placeholder whose creation is not sent yet.
        A placeholder another outbox made is looked up in this folder's journals, then (if
        ``ask_mlflow``) in MLflow: a run made from a journal carries it (another machine's)."""
        if not is_local(run_id):
            return run_id
        if run_id not in self._ids:
            self._ids.update(known_ids(self.folder))
        if run_id not in self._ids and ask_mlflow and self.header.get("experiment"):
            made = self._made_from(run_id)
            if made:
                self._ids[run_id] = made
        if run_id not in self._ids:
            raise Unsent(f"run {run_id} was created while MLflow was away; its journal is not sent yet")
        if self._ids[run_id] is None:
            raise Rejected(f"MLflow rejected the creation of run {run_id}")
        return self._ids[run_id]

    def _made_from(self, placeholder: str) -> str | None:
        """The id of the run a journal made for ``placeholder``, if one did."""
        found = self.client.search_runs([self._experiment_id()], f"tags.`{JOURNAL_TAG}` = '{placeholder}'")
        return found[0].info.run_id if found else None

    def _send(self, entry: dict[str, Any], file: Path | None) -> str | None:
        """One attempt at one write (a journal's, or a live one with its ``file``)."""
        op, client = entry["op"], self.client
        if op == "create_run":
            return self._create(entry)
        run_id = self.real(entry["run"])
        if op == "log_batch":
            from mlflow.entities import Metric, Param, RunTag

            client.log_batch(
                run_id,
                metrics=[Metric(*m) for m in entry.get("metrics", [])],
                params=[Param(k, v) for k, v in entry.get("params", {}).items()],
                tags=[RunTag(k, v) for k, v in entry.get("tags", {}).items()],
            )
        elif op == "log_inputs":
            from mlflow.entities import Dataset, DatasetInput, InputTag

            client.log_inputs(
                run_id,
                datasets=[
                    DatasetInput(Dataset(**entry["dataset"]), [InputTag("mlflow.data.context", entry["context"])])
                ],
            )
        elif op == "update_run":
            client.update_run(run_id, status=entry["status"])
        elif op == "set_terminated":
            client.set_terminated(run_id, status=entry["status"], end_time=entry["time"])
        elif op == "log_artifact":
            if file is None:  # a journal's write: its artifact was kept beside the journal
                if self.journal is None:
                    raise Rejected(f"an artifact write without its file: {entry}")
                file = self.journal.files / entry["file"]
            client.log_artifact(run_id, str(file), entry.get("folder"))
        else:
            raise Rejected(f"unknown write {op!r}")
        return None

    def created(self, run_id: str | None) -> str | None:
        """The MLflow id of a run this outbox has created by now (None: MLflow rejected it), else
        ``run_id`` as given; does not wait or ask MLflow."""
        return self._ids.get(run_id, run_id) if is_local(run_id) else run_id

    def learn(self, ids: dict[str, str]) -> None:
        """Placeholders' MLflow ids found elsewhere (a search of runs by JOURNAL_TAG)."""
        with self._lock:
            self._ids.update({k: v for k, v in ids.items() if k not in self._ids})

    def _create(self, entry: dict[str, Any]) -> str:
        tags = {"mlflow.parentRunId": self.real(entry["parent"])} if entry.get("parent") else {}
        if "run" in entry:  # its placeholder: any process finds the run by it (real)
            tags[JOURNAL_TAG] = entry["run"]
            # from a journal: a crash after sending it may have left the run there already
            made = None if entry.get("live") else self._made_from(entry["run"])
            if made:
                return made
        made = self.client.create_run(
            self._experiment_id(), start_time=entry["time"], tags=tags, run_name=entry["name"]
        ).info.run_id
        if entry.get("live"):
            self._ids[entry["run"]] = made
        return made

    def _keep(self, journal: Journal, entry: dict[str, Any], file: Path | None) -> str | None:
        """Journal a write; returns the placeholder of the run a create_run made."""
        if entry["op"] == "create_run":  # a live one keeps its placeholder: its writes name it
            entry = {k: v for k, v in entry.items() if k != "live"}
            entry["run"] = entry.get("run") or local_id()
        if file is not None:
            try:
                entry["file"] = journal.keep_file(file)  # the source may be a temporary file
            except OSError as exc:
                _say(f"artifact {file} could not be kept for MLflow ({exc}): it is left out")
                return None
        journal.append(entry)
        return entry.get("run") if entry["op"] == "create_run" else None


def transient(exc: BaseException) -> bool:
    """A failure another try may not meet: no connection or answer, a server error, a busy
    server or store. A local file that is not there, or another 4xx, is no hiccup."""
    if isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
        return False
    status = http_status(exc)
    return status is None or status >= 500 or status in (408, 429)


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of a failed MLflow call: REST calls raise MlflowException (its error code
    maps to one), artifact uploads to the server a requests HTTPError."""
    from mlflow.exceptions import MlflowException

    if isinstance(exc, MlflowException):
        return exc.get_http_status_code()
    return getattr(getattr(exc, "response", None), "status_code", None)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def brief(exc: BaseException, chars: int = 160) -> str:
    """An error in a few words: MLflow's connection errors run to 400 characters and end with
    the system's reason ("[Errno 111] Connection refused")."""
    text = first_line(exc)
    reasons = re.findall(r"\[Errno -?\d+\] [^'\")]+", text)
    if reasons:
        return reasons[-1]
    return text if len(text) <= chars else text[:chars] + "..."


def _what(entry: dict[str, Any]) -> str:
    return f"{entry['op']} of run {entry.get('run') or entry.get('name')}"


def _say(text: str, kind: str = "warning") -> None:
    """A line on stderr: the live display (rich) prints it above itself."""
    print(f"{kind}: {text}", file=sys.stderr, flush=True)
