"""MLflow as sweeper uses it, and nothing of sweeper's own: runs (optionally nested under a
parent), params, sweeper's tags (under ``sweeper.``), metrics batched one call per step, JSON
and file artifacts, and reading them back. Callers decide what a run means (a sweep, a trial).

Uses ``MlflowClient`` with explicit run ids (no global active run), so worker processes and Ray
actors can log their own runs under the same parent. A disabled tracker (no URI) does nothing.
Writes go through an outbox (outbox.py): tried again while the server does not answer, then
kept in a journal in ``journal_dir`` (journal.py) until it is back; tracking never stops a
sweep. A tracking server that refuses the credentials (HTTP 401) or their rights (403) is the
user's to fix: any call raises TrackingRefused, a UserError (sweeper.errors: the CLI shows it as
one paragraph, exit 2). Of sweeper, this adapter imports only errors, the outbox, the journal,
the sender, empty_db (a new sqlite database as a copy of a cached empty one) and sqlite (WAL).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, overload
from urllib.parse import urlsplit

from sweeper.errors import UserError
from sweeper.track import empty_db, sqlite
from sweeper.track.journal import Journal, is_local, local_id
from sweeper.track.outbox import JOURNAL_TAG, Away, Outbox, Rejected, brief, first_line, http_status
from sweeper.track.sender import Sender

DEFAULT_URI = "sqlite:///mlflow.db"  # MLflow's own default, in the current directory
TAG = "sweeper."  # sweeper's tag namespace
MAX_PARAM = 6000  # characters MLflow keeps of a param value
MAX_TAG = 5000  # characters of a tag value sweeper writes (MLflow allows 8,000)
# MLflow 3's UI opens an experiment without a kind on its GenAI pages (traces); this kind opens it
# on its training runs
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
METRICS_PER_CALL = 1000  # MLflow's cap on metrics in one log_batch
# Set for the process unless the user set them: MLflow's own HTTP retries (default 7, backoff
# factor 2: minutes per call on a dead server) off and a 10 s socket timeout (default 120 s),
# so the outbox's retries are the only ones; no download progress bars (small files).
MLFLOW_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    # a SQL store's connections (MLflow's default pool keeps 5, and 10 more at once): one thread
    # writes (the outbox's sender), the sweep's start and end a few more
    "MLFLOW_SQLALCHEMYSTORE_POOL_SIZE": "1",
    "MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW": "2",
}


def resolve_uri(explicit: str | None = None) -> str:
    """The tracking URI: ``explicit`` (the spec's tracking.mlflow_uri, or a command's option),
    else $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db. A relative sqlite path becomes absolute:
    worker processes and Ray actors run in other folders."""
    uri = explicit or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + str(Path(uri.removeprefix("sqlite:///")).resolve())
    return uri


def configure() -> None:
    """MLflow in this process as sweeper uses it: MLFLOW_ENV's settings (unless the user set them),
    its INFO logs of the database set-up and its SQL store's error tracebacks silenced (the
    sweep's own display and the outbox say what matters),
    sqlite stores in WAL mode (a commit without a sync to disk)."""
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # MLflow's SQL store logs each database error with its traceback, then raises it; the outbox
    # (outbox.py) retries it and says once when the store is away: a database restart under a
    # sweep would print a traceback per write
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    for key, value in MLFLOW_ENV.items():
        os.environ.setdefault(key, value)
    sqlite.install()


class TrackingRefused(UserError):
    """The tracking server refused sweeper's requests: bad or missing credentials, or no permission."""


@overload
def redact(uri: str) -> str: ...
@overload
def redact(uri: None) -> None: ...
def redact(uri: str | None) -> str | None:
    """A tracking URI as sweeper records it: without a password (http://user:pw@host -> user:***)."""
    from urllib.parse import urlsplit, urlunsplit

    if not uri:
        return uri
    try:
        parts = urlsplit(uri)
        if not parts.password:
            return uri
        return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")))
    except ValueError:
        return uri


class Tracker:
    """One MLflow tracking server (or store) and experiment; ``uri=None``: disabled.
    ``journal_dir``: where writes wait while the server is away (None: a failed write raises);
    ``journal``: one to send (sync.py); ``asynchronous``: writes that need no answer are sent by
    a thread of their own (sender.py), a sweep's coordinator does not wait for them."""

    def __init__(
        self,
        uri: str | None,
        experiment: str | None = None,
        journal_dir: Path | None = None,
        *,
        journal: Journal | None = None,
        asynchronous: bool = False,
    ) -> None:
        self.uri, self.experiment, self.journal_dir = uri, experiment, journal_dir
        self._client: _Guarded | None = None
        self._outbox: Outbox | None = None
        self.sender: Sender | None = None
        if uri is not None:
            from mlflow.tracking import MlflowClient

            configure()
            empty_db.seed(uri)
            self._client = _Guarded(MlflowClient(tracking_uri=uri), self)
            self._outbox = Outbox(
                self._client,
                lambda: self._experiment_id,
                redact(uri),
                journal_dir,
                {"uri": redact(uri), "experiment": experiment},
                journal,
            )
            self.sender = Sender(self.outbox) if asynchronous else None

    @property
    def enabled(self) -> bool:
        return self._client is not None

    @property
    def outbox(self) -> Outbox:
        """Where this tracker's writes go (tracking on: check ``enabled`` first)."""
        if self._outbox is None:
            raise RuntimeError("tracking is off (no tracking URI): there is no outbox")
        return self._outbox

    @property
    def _mlflow(self) -> _Guarded:
        """The MLflow client (tracking on: check ``enabled`` first)."""
        if self._client is None:
            raise RuntimeError("tracking is off (no tracking URI): there is no MLflow client")
        return self._client

    @functools.cached_property
    def _experiment_id(self) -> str:
        """The experiment's id; made if new, and tagged as model training where it says no kind."""
        found = self._mlflow.get_experiment_by_name(self.experiment)
        if found is None:
            return self._mlflow.create_experiment(self.experiment, tags=EXPERIMENT_KIND)
        for key, value in EXPERIMENT_KIND.items():
            if key not in found.tags:
                self._mlflow.set_experiment_tag(found.experiment_id, key, value)
        return found.experiment_id

    @property
    def experiment_id(self) -> str | None:
        """The experiment's id; None when tracking is off or MLflow cannot say now."""
        try:
            return self._experiment_id if self.enabled else None
        except Exception:  # the server is away: the id is not known here
            return None

    def drain(self) -> None:
        """Wait until every write made so far was handed to the outbox (an asynchronous tracker)."""
        if self.sender is not None:
            self.sender.drain()

    def _write(self, entry: dict[str, Any]) -> None:
        """A write that needs no answer: queued for the sender thread, or sent now."""
        if self.sender is not None:
            self.sender.put(entry)
        else:
            self.outbox.write(entry)

    @property
    def offline(self) -> bool:
        """Writes wait in a journal: the server did not answer."""
        return self.enabled and self.outbox.journal is not None

    def real_id(self, run_id: str | None) -> str | None:
        """The MLflow id of a run: a placeholder's once its journal is sent, else the id given."""
        self.drain()
        try:
            return self.outbox.real(run_id, ask_mlflow=self.outbox.journal is None) if self.enabled else run_id
        except Exception:  # not sent yet, or MLflow cannot say now: the placeholder stays
            return run_id

    def found_ids(self, run_ids: list[str | None], parent: str | None) -> list[str | None]:
        """The MLflow ids of runs (nested under ``parent``), placeholders made by any process's
        sender or journal looked up in one search of ``parent``'s runs. While MLflow is away a
        placeholder stays (its writes wait with it); None for one MLflow does not have (its
        process died before creating it)."""
        self.drain()
        if not self.enabled:
            return run_ids
        unknown = [r for r in run_ids if is_local(r) and self.outbox.created(r) == r]
        if len(unknown) > 1 and parent is not None and not self.offline:
            try:
                runs = self.outbox.retrying(
                    lambda: self._mlflow.search_runs(
                        [self._experiment_id],
                        f"tags.mlflow.parentRunId = '{self.outbox.real(parent)}'",
                        max_results=50000,
                    )
                )
                self.outbox.learn({r.data.tags[JOURNAL_TAG]: r.info.run_id for r in runs if JOURNAL_TAG in r.data.tags})
            except Exception:  # MLflow cannot say now: each is looked up alone
                pass
        found = [self.real_id(r) for r in run_ids]
        return [None if is_local(r) and not self.offline else r for r in found]

    # --- writing (see outbox.py for the entries) ----------------------------------------------

    def new_run_id(self) -> str | None:
        """An id for a run to create without waiting (``start_run(run_id=...)``): a placeholder
        that later writes may name; None where runs are created at once (no sender thread)."""
        return local_id() if self.sender is not None else None

    def start_run(
        self,
        name: str,
        *,
        parent: str | None = None,
        tags: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
        run_id: str | None = None,
    ) -> str | None:
        """A new run in the experiment (nested under ``parent`` if given); returns its id (a
        placeholder while the server is away, None if MLflow rejected it). With ``run_id`` (from
        new_run_id) the sender thread creates it, so MLflow's create_run does not hold the
        coordinator (its share of a trial: docs/speed.md#orchestration-timed-directly). Until then
        the run is known by that placeholder (its tag JOURNAL_TAG: any process finds it);
        ``created`` gives the MLflow id once made."""
        if not self.enabled:
            return None
        entry = {"op": "create_run", "name": name, "parent": parent, "time": _now_ms()}
        if run_id is not None and self.sender is not None:
            self.sender.put({**entry, "run": run_id, "live": True})
        else:
            run_id = self.outbox.write(entry)
        self._batch(run_id, params=params, tags=tags)
        return run_id

    def created(self, run_id: str | None) -> str | None:
        """The MLflow id of a run this tracker has created by now, else ``run_id`` (no waiting)."""
        return self.outbox.created(run_id) if self.enabled else run_id

    def resume_run(self, run_id: str | None, tags: dict[str, str] | None = None) -> None:
        """A finished or interrupted run goes on: RUNNING again (with these tags)."""
        if run_id is None:
            return
        self._write({"op": "update_run", "run": run_id, "status": "RUNNING"})
        self._batch(run_id, tags=tags)

    def log_params(self, run_id: str | None, params: dict[str, Any]) -> None:
        self._batch(run_id, params=params)

    def set_tags(self, run_id: str | None, tags: dict[str, Any]) -> None:
        self._batch(run_id, tags=tags)

    def log_metrics(self, run_id: str | None, step: int, metrics: dict[str, float]) -> None:
        """One step's metrics, in one call."""
        if run_id is not None:
            self.log_history(run_id, [metrics], first_step=step)

    def log_history(self, run_id: str | None, history: list[dict[str, float]], first_step: int = 1) -> None:
        """Steps first_step, first_step+1, ... at once, within MLflow's batch cap; each metric
        keeps the time it was logged at, also when it is sent later from a journal."""
        if run_id is None:
            return
        now = _now_ms()
        metrics = [[k, float(v), now, step] for step, h in enumerate(history, first_step) for k, v in h.items()]
        for i in range(0, len(metrics), METRICS_PER_CALL):
            self._write({"op": "log_batch", "run": run_id, "metrics": metrics[i : i + METRICS_PER_CALL]})

    def log_dataset(
        self,
        run_id: str | None,
        name: str,
        digest: str,
        source: dict[str, Any],
        profile: dict[str, Any],
        context: str = "training",
    ) -> None:
        """A data set as an input of the run (the MLflow UI's Dataset column): its ``name``,
        ``digest`` (a fingerprint of its content), ``source`` and ``profile`` (sizes), as JSON."""
        if run_id is not None:
            self._write(
                {
                    "op": "log_inputs",
                    "run": run_id,
                    "context": context,
                    "dataset": {
                        "name": name,
                        "digest": digest,
                        "source_type": "sweeper",
                        "source": json.dumps(source, sort_keys=True, default=str),
                        "profile": json.dumps(profile, sort_keys=True),
                    },
                }
            )

    def log_dict(self, run_id: str | None, data: dict[str, Any], path: str) -> None:
        """``data`` as the JSON artifact ``path`` (e.g. "trial.json", "reports/a.json")."""
        self.log_text(run_id, json.dumps(data, indent=2), path)

    def log_text(self, run_id: str | None, text: str, path: str) -> None:
        if run_id is None:
            return
        if self.sender is not None:
            self.sender.put(
                {"op": "log_artifact", "run": run_id, "folder": str(Path(path).parent) if "/" in path else None},
                text=(Path(path).name, text),
            )
            return
        with tempfile.TemporaryDirectory(prefix="sweeper-artifact-") as tmp:
            file = Path(tmp) / Path(path).name
            file.write_text(text)
            self.log_files(run_id, [file], str(Path(path).parent) if "/" in path else None)

    def log_files(self, run_id: str | None, paths: list[Path], folder: str | None = None) -> None:
        if run_id is not None and paths:
            self.drain()  # after the run's queued writes (its creation among them)
        for path in paths if run_id is not None else []:
            self.outbox.write({"op": "log_artifact", "run": run_id, "folder": folder}, file=Path(path))

    def end_run(self, run_id: str | None, status: str = "FINISHED") -> None:
        """status: FINISHED, FAILED or KILLED."""
        if run_id is not None:
            self._write({"op": "set_terminated", "run": run_id, "status": status, "time": _now_ms()})

    def _batch(
        self, run_id: str | None, params: dict[str, Any] | None = None, tags: dict[str, Any] | None = None
    ) -> None:
        if run_id is None or not (params or tags):
            return
        self._write(
            {
                "op": "log_batch",
                "run": run_id,
                "params": {k: str(v)[:MAX_PARAM] for k, v in (params or {}).items()},
                "tags": {f"{TAG}{k}": str(v)[:MAX_TAG] for k, v in (tags or {}).items()},
            }
        )

    # --- reading ---------------------------------------------------------------------------

    def open_children(self, parent: str | None, tags: dict[str, str] | None = None) -> list[str]:
        """Ids of ``parent``'s nested runs still RUNNING (with these sweeper tags, if given);
        [] with a warning when MLflow does not answer (runs created offline are not listed)."""
        if parent is None or not self.enabled:
            return []
        self.drain()
        having = "".join(f" and tags.`{TAG}{k}` = '{v}'" for k, v in (tags or {}).items())
        try:
            run_id = self.outbox.real(parent)
            exp = self.outbox.retrying(lambda: self._mlflow.get_run(run_id).info.experiment_id)
            runs = self.outbox.retrying(
                lambda: self._mlflow.search_runs(
                    [exp],
                    filter_string=f"tags.mlflow.parentRunId = '{run_id}' and attributes.status = 'RUNNING'{having}",
                )
            )
        except (Away, Rejected) as exc:
            if self.journal_dir is None:
                raise exc.__cause__ or exc from None
            print(
                f"warning: MLflow at {redact(self.uri)} could not list the open runs under {parent} ({brief(exc)}): "
                "they stay as they are",
                file=sys.stderr,
            )
            return []
        return [r.info.run_id for r in runs]

    def trial_run_ids(self, parent: str, numbers: list[int]) -> dict[int, str]:
        """The newest nested run of ``parent`` for each trial number (tag sweeper.trial), any status."""
        self.drain()
        run_id = self.outbox.real(parent)
        exp = self.outbox.retrying(lambda: self._mlflow.get_run(run_id).info.experiment_id)
        found: dict[int, str] = {}
        for number in numbers:
            query = f"tags.mlflow.parentRunId = '{run_id}' and tags.`{TAG}trial` = '{number}'"
            runs = self.outbox.retrying(
                functools.partial(
                    self._mlflow.search_runs,
                    [exp],
                    filter_string=query,
                    order_by=["attributes.start_time DESC"],
                    max_results=1,
                )
            )
            if runs:
                found[number] = runs[0].info.run_id
        return found

    def get_run(self, run_id: str) -> Any:
        """The run (info, params, tags, last metrics); LookupError when it cannot be read."""
        from mlflow.exceptions import MlflowException

        self.drain()
        try:
            return self._mlflow.get_run(self.outbox.real(run_id))
        except (MlflowException, Away, Rejected) as exc:
            raise LookupError(f"run {run_id} at {self.uri}: {first_line(exc)}") from None

    def read_json(self, run_id: str, path: str) -> Any:
        """A JSON artifact of the run, parsed; LookupError when it is not there or not JSON."""
        from mlflow.exceptions import MlflowException

        try:
            with tempfile.TemporaryDirectory() as tmp:
                return json.loads(Path(self._mlflow.download_artifacts(self.real_id(run_id), path, tmp)).read_text())
        except (MlflowException, OSError, ValueError) as exc:
            raise LookupError(f"run {run_id} at {self.uri}: no readable {path} ({first_line(exc)})") from None

    def download(self, run_id: str, path: str, dst: Path) -> Path:
        """Artifact ``path`` of the run into folder ``dst``; LookupError when it is not there."""
        from mlflow.exceptions import MlflowException

        dst.mkdir(parents=True, exist_ok=True)
        try:
            return Path(self._mlflow.download_artifacts(self.real_id(run_id), path, str(dst)))
        except (MlflowException, OSError) as exc:
            raise LookupError(f"run {run_id} at {self.uri}: no artifact {path} ({first_line(exc)})") from None

    def metric_history(self, run_id: str, key: str) -> list[Any]:
        self.drain()
        return self._mlflow.get_metric_history(self.real_id(run_id), key)


def _now_ms() -> int:
    return int(time.time() * 1000)


class _Guarded:
    """The MlflowClient, whose calls raise TrackingRefused when the server answers 401 or 403
    (an error of setup, not of the sweep: it must not read as a failed trial or a missing run)."""

    def __init__(self, client: Any, tracker: Tracker) -> None:
        self._client, self._tracker = client, tracker

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not the client's API (and no recursion on a copy's bare instance)
            raise AttributeError(name)
        method = getattr(self._client, name)

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except Exception as exc:
                status = http_status(exc)
                if status in (401, 403):
                    raise TrackingRefused(_refusal(self._tracker, status)) from None
                raise

        return call


def _refusal(tracker: Tracker, status: int) -> str:
    """What to fix; names the account, never its password (not even one written into the URI)."""
    parts = urlsplit(tracker.uri or "")
    where = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
    user = os.environ.get("MLFLOW_TRACKING_USERNAME")
    if status == 401:
        given = f"the credentials of user {user!r}" if user else "a request without credentials"
        return (
            f"the MLflow tracking server at {where} refused {given} (HTTP 401): set "
            f"MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to an account of that server"
        )
    who = f"user {user!r}" if user else "anonymous requests"
    return (
        f"the MLflow tracking server at {where} refused {who} access to experiment {tracker.experiment!r} "
        f"(HTTP 403, permission denied): ask the server's admin for EDIT permission on it, log to another "
        f"experiment, or set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to another account"
    )
