"""A new sqlite MLflow database begins as a copy of an empty one that this MLflow version made
before, cached under ~/.cache/sweeper: MLflow's own set-up of a new database (every schema
migration since MLflow 1.x) costs far more than the copy (docs/speed.md#start-up).
MLflow still verifies the schema when it opens the copy, and adds its Default experiment there
(the cached database has none: that experiment's artifact location depends on where it is made).

Only for ``sqlite:///PATH`` URIs whose file does not exist yet; anything unexpected (no cache
folder, a file system without hard links) leaves the database to MLflow, as before.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

PREFIX = "sqlite:///"


def cache_file() -> Path:
    from mlflow.version import VERSION

    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "sweeper" / f"mlflow-{VERSION}-empty.db"


def seed(uri: str) -> bool:
    """Put the cached empty database at ``uri``'s path if nothing is there; True if it did."""
    if not uri.startswith(PREFIX) or "?" in uri or uri[len(PREFIX) :] in ("", ":memory:"):
        return False
    target = Path(uri[len(PREFIX) :])
    if target.exists():
        return False
    try:
        cached = cache_file()
        if not cached.is_file():
            _make(cached)
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = target.with_name(f".{target.name}.{os.getpid()}.seed")
        shutil.copyfile(cached, staged)
        try:
            os.link(staged, target)  # never over a database another process made meanwhile
        except FileExistsError:
            return False
        finally:
            staged.unlink()
        return True
    except (OSError, sqlite3.Error):
        return False


def _make(cached: Path) -> None:
    """MLflow makes an empty database; its Default experiment is taken out; then it is cached."""
    from mlflow.tracking import MlflowClient

    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cached.parent) as tmp:
        made = Path(tmp) / "empty.db"
        MlflowClient(tracking_uri=f"{PREFIX}{made}").search_experiments()  # creates and migrates it
        copy = Path(tmp) / "copy.db"
        with sqlite3.connect(made) as db:
            db.execute("DELETE FROM experiment_tags WHERE experiment_id = 0")
            db.execute("DELETE FROM experiments WHERE experiment_id = 0")
        with sqlite3.connect(copy) as out:  # the backup API: whole even if commits wait in a WAL file
            db.backup(out)
            out.execute("PRAGMA journal_mode=DELETE")  # one file: a copy of it is the database
        db.close()
        out.close()
        os.replace(copy, cached)  # whole or not at all, even with another process doing the same
