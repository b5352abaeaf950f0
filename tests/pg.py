"""PostgreSQL for tests: a fresh database per use, dropped afterwards.

The server is $SWEEPER_TEST_PG, a SQLAlchemy URL without a database name (default
``postgresql+psycopg://postgres@127.0.0.1:5432``; the user must be allowed CREATE DATABASE).
A test that needs PostgreSQL fails, naming SWEEPER_TEST_PG, when the server cannot be reached:
a missing server must not pass as a skipped test.

Use it from a test module (tests/ is on sys.path, as for conftest)::

    from pg import pg_database, pg_url  # noqa: F401 (pg_url is a fixture: importing registers it)

    def test_storage(pg_url: str): ...  # one fresh database's URL for this test

    with pg_database("mlflow") as url: ...  # several, or in a fixture of a broader scope

A URL names the psycopg 3 driver unless SWEEPER_TEST_PG names another.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ENV = "SWEEPER_TEST_PG"
DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432"


def server_url():
    """$SWEEPER_TEST_PG (or the default) as a sqlalchemy URL."""
    from sqlalchemy.engine import make_url

    return make_url(os.environ.get(ENV) or DEFAULT)


def _admin():
    """An autocommit connection to the server's maintenance database (CREATE/DROP DATABASE cannot
    run in a transaction); a failed test naming SWEEPER_TEST_PG when there is no server."""
    import psycopg

    url = server_url()
    try:
        return psycopg.connect(
            host=url.host,
            port=url.port,
            user=url.username,
            password=url.password,
            dbname="postgres",
            autocommit=True,
            connect_timeout=10,
        )
    except psycopg.OperationalError as exc:
        reason = str(exc).strip().splitlines()[0]
    # outside the except clause: the message alone, without psycopg's traceback chained to it
    pytest.fail(
        f"no PostgreSQL server at {url.render_as_string(hide_password=True)} ({reason}); start one, "
        f"or point {ENV} at one, e.g. {ENV}=postgresql+psycopg://USER:PASSWORD@HOST:5432",
        pytrace=False,
    )


@contextlib.contextmanager
def pg_database(prefix: str = "test") -> Iterator[str]:
    """A new, empty database (a unique name: tests may run in parallel or share a server);
    yields its SQLAlchemy URL, then drops it, closing the connections left open to it."""
    name = f"sweeper_{prefix}_{uuid.uuid4().hex[:12]}"
    with _admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield server_url().set(database=name).render_as_string(hide_password=False)
    finally:
        with _admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh database's SQLAlchemy URL, dropped after the test."""
    with pg_database() as url:
        yield url


class OwnCluster:
    """A PostgreSQL cluster of the test's own (initdb in a temporary folder, its own port on
    loopback, trust auth), for what must never happen to the machine's shared server: a restart
    under running processes. PostgreSQL refuses to run as root: as root, its programs run as the
    ``postgres`` user, who owns the folder."""

    def __init__(self) -> None:
        import glob
        import socket
        import tempfile

        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        if not found:
            pytest.fail("no PostgreSQL server programs under /usr/lib/postgresql/*/bin", pytrace=False)
        self.bin = Path(found[-1]).parent
        # a folder of its own in /tmp (pytest's are private to root, closed to the postgres user)
        self.root = Path(tempfile.mkdtemp(prefix="sweeper-pg-"))
        self.data, self.log = self.root / "pgdata", self.root / "postgres.log"
        with socket.socket() as probe:  # a free port (the cluster takes it a moment later)
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        if os.getuid() == 0:
            shutil.chown(self.root, "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        self._ctl("start")

    def database(self, name: str) -> str:
        """A new database ``name`` on the cluster: its SQLAlchemy URL."""
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True
        ) as db:
            db.execute(f'CREATE DATABASE "{name}"')
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    def restart(self) -> None:
        """Every connection cut (a fast shutdown: sessions terminated, transactions rolled back),
        then the server started again; returns once it accepts connections."""
        self._ctl("restart", "-m", "fast")

    def stop(self) -> None:
        self._ctl("stop", "-m", "immediate")

    def _ctl(self, *args: str) -> None:
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", *args)

    def _run(self, program: str, *args: str) -> None:
        import subprocess

        as_postgres = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
        done = subprocess.run([*as_postgres, str(self.bin / program), *args], capture_output=True, text=True)
        if done.returncode:
            pytest.fail(
                f"{program} {' '.join(args)} failed ({done.returncode}): {done.stdout}{done.stderr}", pytrace=False
            )


@contextlib.contextmanager
def own_cluster() -> Iterator[OwnCluster]:
    """A started OwnCluster, stopped and removed afterwards."""
    cluster = OwnCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        with contextlib.suppress(BaseException):
            cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


@contextlib.contextmanager
def pgbouncer(url: str, server_connections: int) -> Iterator[str]:
    """Debian's pgbouncer in front of the server of ``url`` (a database of pg_database's), in
    transaction pooling with at most ``server_connections`` to the server for that database and
    user, on its own port; yields ``url`` through it. As root it runs as the ``postgres`` user
    (it refuses root). Without pgbouncer the test is skipped, except where
    SWEEPER_REQUIRE_PGBOUNCER is set (CI installs it: .ci/run)."""
    import socket
    import subprocess
    import tempfile

    from sqlalchemy.engine import make_url

    program = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
    if program is None:
        if os.environ.get("SWEEPER_REQUIRE_PGBOUNCER"):
            pytest.fail("pgbouncer is not installed (apt-get install pgbouncer)", pytrace=False)
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    target = make_url(url)
    root = Path(tempfile.mkdtemp(prefix="sweeper-pgbouncer-"))  # readable by the postgres user
    with socket.socket() as probe:  # a free port (pgbouncer takes it a moment later)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (root / "users.txt").write_text(f'"{target.username}" ""\n')
    (root / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={target.host} port={target.port or 5432}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {root / 'users.txt'}\n"
        f"pool_mode = transaction\ndefault_pool_size = {server_connections}\nmax_client_conn = 1000\n"
        f"logfile = {root / 'pgbouncer.log'}\n"
    )
    if os.getuid() == 0:
        shutil.chown(root, "postgres")
        for path in root.iterdir():
            shutil.chown(path, "postgres")
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
    process = subprocess.Popen(
        [*as_postgres, program, str(root / "pgbouncer.ini")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _until_it_listens(port, process, root / "pgbouncer.log")
        yield target.set(port=port).render_as_string(hide_password=False)
    finally:
        process.terminate()
        process.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def _until_it_listens(port: int, process, log: Path) -> None:
    """Return once something accepts connections on ``port`` (an event, not a wait for a time)."""
    import socket
    import time

    while True:
        if process.poll() is not None:
            pytest.fail(f"pgbouncer exited ({process.returncode}): {log.read_text() if log.exists() else ''}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
