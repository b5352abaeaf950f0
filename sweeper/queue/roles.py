"""`sweeper queue-access URL --workers ROLE --submitters A,B`: PostgreSQL roles for a shared queue.

Submitters connect as their own database role: they read the whole queue (and every sweep's
study and ledger) and queue, cancel or reprioritise their own sweeps only: row-level security on
``sweeper_queue`` lets a role insert and change only the rows whose ``owner`` is that role's name.
The workers' role may change every row, and writes the studies, ledgers and their own rows.
Run once by the database's owner (who creates the tables here, so that every role finds them).
"""

from __future__ import annotations

import re

import sqlalchemy as sa

from sweeper.errors import UserError
from sweeper.queue.table import QUEUE, Queue
from sweeper.search.optuna.study import safe_url

ROLE = re.compile(r"^[a-z_][a-z0-9_]*$")  # a plain PostgreSQL identifier: quoted by nothing


def secure(url: str, workers: str, submitters: list[str]) -> list[str]:
    """Create every table a queue needs, grant ``workers`` and ``submitters`` their rights and turn
    on row-level security on the queue's rows; the statements run, for the record."""
    import optuna

    from sweeper.search.optuna.engine import shared_engine
    from sweeper.search.optuna.ledger import METADATA as LEDGER_TABLES

    if not url.startswith("postgresql"):
        raise UserError(f"{safe_url(url)}: database roles need PostgreSQL")
    for role in [workers, *submitters]:
        if not ROLE.match(role):
            raise UserError(f"role '{role}': expected a lower-case PostgreSQL name (letters, digits, _)")
    Queue(url).close()  # the queue's tables
    optuna.storages.RDBStorage(url).engine.dispose()  # Optuna's tables (studies, trials)
    engine = shared_engine(url)
    try:
        LEDGER_TABLES.create_all(engine)  # the ledgers' tables
        queue = QUEUE.name
        statements = [
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {workers}",
            f"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO {workers}",
            # tables and sequences a later sweeper creates (as this role): the workers' too
            f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {workers}",
            f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO {workers}",
            f"ALTER TABLE {queue} ENABLE ROW LEVEL SECURITY",
            f"DROP POLICY IF EXISTS sweeper_workers ON {queue}",
            f"CREATE POLICY sweeper_workers ON {queue} FOR ALL TO {workers} USING (true) WITH CHECK (true)",
            f"DROP POLICY IF EXISTS sweeper_read ON {queue}",
            f"CREATE POLICY sweeper_read ON {queue} FOR SELECT USING (true)",
            f"DROP POLICY IF EXISTS sweeper_own_insert ON {queue}",
            f"CREATE POLICY sweeper_own_insert ON {queue} FOR INSERT WITH CHECK (owner = current_user)",
            f"DROP POLICY IF EXISTS sweeper_own_update ON {queue}",
            f"CREATE POLICY sweeper_own_update ON {queue} FOR UPDATE "
            "USING (owner = current_user) WITH CHECK (owner = current_user)",
        ]
        for submitter in submitters:
            statements += [
                f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {submitter}",
                f"GRANT INSERT, UPDATE ON {queue} TO {submitter}",
            ]
        with engine.begin() as db:
            for statement in statements:
                db.execute(sa.text(statement))
        return statements
    except sa.exc.SQLAlchemyError as exc:
        raise UserError(f"{safe_url(url)}: {str(exc).splitlines()[0]}") from None
    finally:
        engine.dispose()
