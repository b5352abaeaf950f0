"""The commands of a queue of sweeps that a pool of workers serves (`sweeper submit --queue`
queues one; `sweeper worker --queue` runs :func:`serve_queue`): list, cancel, reprioritise,
share among owners, and grant a team access."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from sweeper.cli.base import user_errors
from sweeper.errors import UserError

queue_app = typer.Typer()  # merged into the sweeper app (after `submit`)


def serve_queue(
    url: str, out_root: Path, device: str | None, memory_gb: float | None, devices: int | None, drain: bool
) -> None:
    from sweeper.queue.table import Offer
    from sweeper.queue.worker import QueueWorker, detect_offer

    found = detect_offer()
    if device not in (None, "cpu", "cuda"):
        raise UserError(f"--device {device}: expected cpu or cuda")
    offer = Offer(device or found.device, found.memory_gb if memory_gb is None else memory_gb, devices or found.devices)
    worker = QueueWorker(url, out_root, offer, typer.echo, drain)
    gpus = f"{offer.devices} x " if offer.devices > 1 else ""
    typer.echo(f"worker {worker.me} serving the queue; offers {gpus}{offer.device} with {offer.memory_gb:.0f} GB")
    finished = worker.run()
    why = f"stopped on {worker.stopping}" if worker.stopping else "no open sweep it can serve"
    typer.echo(f"worker done: {why} ({worker.served} served, {finished} finished here)")


QUEUE_URL = typer.Argument(..., help="the queue's database URL (of `sweeper submit --queue`)", show_default=False)
QUEUED = typer.Argument(..., help="the queued sweep's name", show_default=False)


@queue_app.command("queue")
@user_errors
def queue_cmd(
    url: str = QUEUE_URL, as_json: bool = typer.Option(False, "--json", help="print the queue as JSON")
) -> None:
    """List the queue's sweeps: owner, priority, state, trials done, workers, device time.
    (The queue is experimental: docs/api.md.)"""
    from rich.table import Table

    from sweeper.queue.submit import listing

    rows = listing(url)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(
        "sweep", "owner", "priority", "state", "trials", "workers", "device-h used", "budget", "device",
        box=None, padding=(0, 2),
    )  # fmt: skip
    for r in rows:
        budget = "-" if r["device_hours_budget"] is None else f"{r['device_hours_budget']:.3g} h"
        trials = f"{r['trials_done']}/{r['n_trials'] or '-'}"
        table.add_row(
            r["name"], r["owner"], str(r["priority"]), r["state"], trials, str(r["workers"]),
            f"{r['device_hours_used']:.3g}", budget, r["device"],
        )  # fmt: skip
    Console(highlight=False, soft_wrap=True).print(table if rows else "the queue is empty")


@queue_app.command()
@user_errors
def cancel(url: str = QUEUE_URL, name: str = QUEUED) -> None:
    """Cancel a queued sweep: no new trial is claimed; its running trials finish."""
    from sweeper.queue.submit import cancel as cancel_sweep

    was = cancel_sweep(url, name)
    typer.echo(f"cancelled sweep '{name}' (it was {was}): running trials finish, no new trial starts")


@queue_app.command()
@user_errors
def priority(
    url: str = QUEUE_URL, name: str = QUEUED, value: int = typer.Argument(..., help="higher runs first")
) -> None:
    """Change a queued sweep's priority (workers follow it at their next claim)."""
    from sweeper.queue.submit import set_priority

    set_priority(url, name, value)
    typer.echo(f"sweep '{name}' now has priority {value}")


@queue_app.command()
@user_errors
def share(
    url: str = QUEUE_URL,
    owner: str = typer.Argument(..., help="the owner (as `sweeper submit --owner` names them)", show_default=False),
    weight: float | None = typer.Option(
        None, "--weight", help="fair share: device time in proportion to it (default 1)"
    ),
    max_devices: int | None = typer.Option(None, "--max-devices", help="quota: devices in use at once (-1: none)"),
) -> None:
    """Set an owner's fair-share weight and quota of devices."""
    from sweeper.queue.submit import share as set_share

    got = set_share(url, owner, weight, max_devices)
    quota = "no quota" if got["max_devices"] is None else f"at most {got['max_devices']} device(s) at once"
    typer.echo(f"owner '{owner}': weight {got['weight']:g}, {quota}")


@queue_app.command("queue-access")
@user_errors
def queue_access(
    url: str = QUEUE_URL,
    workers: str = typer.Option(..., "--workers", help="the database role the queue's workers connect as"),
    submitters: str = typer.Option(..., "--submitters", help="comma-separated roles of the people who submit"),
) -> None:
    """Set up a PostgreSQL queue for a team (as the database's owner): every table created, the
    workers' role may write everything, each submitter changes only the sweeps it owns."""
    from sweeper.queue.roles import secure

    names = [n.strip() for n in submitters.split(",") if n.strip()]
    for statement in secure(url, workers, names):
        typer.echo(f"{statement};")
    typer.echo(f"# {len(names)} submitter(s) may queue, cancel and reprioritise their own sweeps only")
