"""search.storage checked before a run: a URL that Optuna's RDBStorage can open with the
database drivers installed here, in the form SQLAlchemy reads (``dialect[+driver]://...``).

Only the form and the driver are checked (no connection: `validate` works offline, and the
server may not be up yet); messages never show a password. No URL in a spec (storage, warm
start, MLflow) may hold one: the spec is recorded.
"""

from __future__ import annotations

from urllib.parse import urlsplit

# The databases Optuna's RDBStorage supports (its documentation and tests), with the URL to write.
DATABASES = {
    "sqlite": "sqlite:///PATH/optuna.db",
    "postgresql": "postgresql+psycopg://USER@HOST/DB",
    "mysql": "mysql+pymysql://USER@HOST/DB",
}
SHOWN = 120  # characters of the URL quoted in a message (hostile input can be a megabyte)
EXPECTED = f"expected a URL such as {', '.join(DATABASES.values())}"


def check_storage_url(url: str) -> None:
    """Raise ValueError naming search.storage when ``url`` is not a URL Optuna can open here."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    shown = _without_password(url)
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise ValueError(f"search.storage: '{shown}' is not a database URL; {EXPECTED}") from None
    backend = parsed.get_backend_name()
    if backend not in DATABASES:
        raise ValueError(
            f"search.storage: '{shown}' names the database '{backend}', which Optuna's storage does not "
            f"support; {EXPECTED}"
        )
    try:
        dialect = parsed.get_dialect()
    except NoSuchModuleError:
        raise ValueError(
            f"search.storage: '{shown}' names the driver '{parsed.get_driver_name()}', which SQLAlchemy does "
            f"not know for {backend}; {EXPECTED}"
        ) from None
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        raise ValueError(
            f"search.storage: '{shown}' needs the Python package {exc.name or parsed.get_driver_name()}, which "
            f"is not installed here (for PostgreSQL: pip install sweeper[postgres])"
        ) from None


def _without_password(url: str) -> str:
    """``url`` as it may be printed: a password, if any, replaced by ***."""
    from sqlalchemy.engine import make_url

    try:
        shown = make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL: whatever follows an @ (a password would precede it)
        shown = url.rsplit("@", 1)[-1]
    return shown if len(shown) <= SHOWN else f"{shown[: SHOWN - 3]}..."


def no_password(value: str | None, field: str, instead: str) -> str | None:
    """A spec is recorded (spec.yaml, summary.json, MLflow, the study's ledger): no secret in it."""
    try:
        password = urlsplit(value).password if value else None
    except ValueError:
        password = None
    if password:
        raise ValueError(
            f"{field} holds a password; the spec is recorded in summary.json, MLflow and the "
            f"study's database: {instead}"
        )
    return value
