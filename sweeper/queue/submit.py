"""`sweeper submit SPEC --queue URL`, `sweeper queue`, `sweeper cancel`, `sweeper priority`,
`sweeper share`: the queue as its users change and read it."""

from __future__ import annotations

import getpass
import os
from pathlib import Path
from typing import Any

from sweeper.errors import UserError
from sweeper.queue.table import DEVICES, LIVE_S, Entry, Queue
from sweeper.search.optuna.ledger import Ledger, studies
from sweeper.search.optuna.study import safe_url
from sweeper.states import TrialState

DONE = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAILED)  # trials that count as done


def default_owner() -> str:
    """Who submits: $SWEEPER_OWNER, else the login name."""
    return os.environ.get("SWEEPER_OWNER") or getpass.getuser()


def submit(
    spec_path: Path,
    overrides: list[str],
    url: str,
    owner: str,
    priority: int,
    device: str | None,
    min_memory_gb: float,
) -> Entry:
    """Check the spec as `sweeper run` would (plugins bound, data prepared, each plugin choice
    built on the CPU; a UserError for what is wrong), then queue it in the database at ``url``,
    which also holds its study. ``device`` None: what train.device asks (cuda, cpu, or any)."""
    from sweeper.plan.resolve import resolve_sweep
    from sweeper.search.optuna import earlier
    from sweeper.spec import load

    if device is not None and device not in DEVICES:
        raise UserError(f"--device {device}: expected one of {', '.join(DEVICES)}")
    spec = load(spec_path, [*overrides, f"search.storage={url}", "search.parallel=1"])
    if spec.search.backend != "optuna":
        raise UserError(
            f"{spec_path}: search.backend is '{spec.search.backend}'; the queue serves Optuna sweeps "
            f"(a Ray sweep goes to its cluster: `sweeper submit SPEC --address http://HEAD:8265`)"
        )
    queue = Queue(url)
    try:
        if spec.name in studies(url, safe_url):
            raise UserError(
                f"{safe_url(url)} holds a sweep named '{spec.name}' already; give this one another name: name=..."
            )
        # resolved as its workers will (the earlier sweeps checked): what is wrong stops here
        resolve_sweep(spec, before_build=lambda sweep: earlier.check(sweep, None))
        wanted = device or {"cuda": "cuda", "cpu": "cpu"}.get(spec.train.device, "any")
        queue.add(spec.name, owner, priority, spec.model_dump(mode="json"), wanted, min_memory_gb, spec.train.devices)
        return queue.entry(spec.name)
    finally:
        queue.close()


def listing(url: str) -> list[dict[str, Any]]:
    """Every sweep of the queue with its owner, priority, state, progress and device time
    (``sweeper queue --json`` prints it as is)."""
    from sweeper.search.optuna.status import report

    queue = Queue(url)
    try:
        entries, spent = queue.entries(), queue.spent()
        serving: dict[str, int] = {}
        for w in queue.workers(LIVE_S):
            if w["serving"]:
                serving[w["serving"]] = serving.get(w["serving"], 0) + 1
    finally:
        queue.close()
    known = set(studies(url, safe_url))
    rows = []
    for e in entries:
        info = report(url, e.name) if e.name in known else None
        counts = info["counts"] if info else {}
        done = sum(n for state, n in counts.items() if state in DONE)  # an interrupted attempt is retried
        budget = e.spec["search"].get("budget")
        rows.append(
            {
                "name": e.name,
                "owner": e.owner,
                "priority": e.priority,
                "state": e.state,
                "trials_done": done,
                "n_trials": e.spec["search"].get("n_trials"),
                "counts": counts,
                "workers": serving.get(e.name, 0),
                "device_hours_used": spent.get(e.name, 0.0) / 3600,
                "device_hours_budget": None if budget is None else budget["device_hours"],
                "device": (f"{e.devices} x " if e.devices > 1 else "")
                + (e.device if not e.min_memory_gb else f"{e.device} >= {e.min_memory_gb:g} GB"),
                "note": e.note,
            }
        )
    return rows


def cancel(url: str, name: str) -> str:
    """Stop new claims of the sweep; its running trials finish. The state it was in."""
    queue = Queue(url)
    try:
        entry = queue.entry(name)
        if entry.state not in ("queued", "running"):
            raise UserError(f"sweep '{name}' is {entry.state}: nothing to cancel")
        import time

        import sqlalchemy as sa

        if not queue.move(name, ("queued", "running"), state="cancelled", ended_at=time.time()):
            if queue.entry(name).state in ("queued", "running"):
                raise queue.not_yours(entry)
            raise UserError(f"sweep '{name}' is {queue.entry(name).state}: nothing to cancel")
        if name in studies(url, safe_url):  # started: its ledger stops claims (as `sweeper stop`)
            ledger = Ledger(url, name, grace_s=0)
            try:
                ledger.request_stop()
            except sa.exc.ProgrammingError:  # a submitter's role may not write ledgers: the queue's
                pass  # workers leave a cancelled sweep before their next claim all the same
            finally:
                ledger.close()
        return entry.state
    finally:
        queue.close()


def set_priority(url: str, name: str, priority: int) -> None:
    queue = Queue(url)
    try:
        queue.set_priority(name, priority)
    finally:
        queue.close()


def share(url: str, owner: str, weight: float | None, max_devices: int | None) -> dict[str, Any]:
    if weight is not None and weight <= 0:
        raise UserError(f"--weight {weight}: expected a positive number (device time in proportion to it)")
    queue = Queue(url)
    try:
        queue.set_owner(owner, weight, max_devices)
        return queue.owners()[owner]
    finally:
        queue.close()
