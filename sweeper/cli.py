"""The ``sweeper`` command: a thin typer app; each command calls one library function.

Heavy libraries (torch, optuna, mlflow) are imported inside the commands that need them,
so ``sweeper --help`` stays fast."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Callable, Optional

import typer
from rich.console import Console

from sweeper.errors import UserError

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Plugin-based hyperparameter sweeps for PyTorch.")
err = Console(stderr=True, highlight=False)

SPEC = typer.Argument(..., help="sweep spec (YAML), e.g. search_spaces/digits.yaml", show_default=False)
OVERRIDES = typer.Argument(None, help="dotted.path=value overrides, e.g. train.epochs=3", show_default=False)


def user_errors(fn: Callable) -> Callable:
    """A UserError is the user's to fix: one paragraph on stderr, exit code 2, no traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            err.print(f"[bold red]error:[/] {exc}", soft_wrap=True)
            raise typer.Exit(2) from None
    return wrapper


@app.command()
@user_errors
def run(spec: Path = SPEC, overrides: Optional[list[str]] = OVERRIDES,
        out: Optional[Path] = typer.Option(None, "--out", help="output folder [default: runs/<name>]"),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="no live display (for CI)")) -> None:
    """Run (or resume) a sweep."""
    from sweeper import runner, spec as spec_mod
    from sweeper.progress import QuietObserver, RichObserver

    sweep = spec_mod.load(spec, overrides or [])
    observer = QuietObserver() if quiet else RichObserver()
    summary = runner.run_sweep(sweep, out or runner.default_out_dir(sweep), observer)
    observer.finish(summary)
    if summary["best"] is None:
        raise typer.Exit(1)


@app.command()
@user_errors
def submit(spec: Path = SPEC, overrides: Optional[list[str]] = OVERRIDES,
           address: str = typer.Option(..., "--address", help="Ray dashboard URL, e.g. http://HEAD:8265"),
           out: Optional[str] = typer.Option(None, "--out", help="output folder on the head node "
                                                                  "[default: /tmp/sweeper/runs/<name>]"),
           python: str = typer.Option(sys.executable, "--python", help="the head node's Python with sweeper installed")) -> None:
    """Submit the sweep (search.backend: ray) as a Ray job; print how to follow it."""
    from sweeper.jobs import submit as submit_job

    job = submit_job(spec, overrides or [], address, out, python)
    typer.echo(f"submitted Ray job {job.job_id}; output on the head node: {job.out}\n"
               f"follow:  {job.follow}\n"
               f"status:  ray job status --address {address} {job.job_id}\n"
               f"stop:    ray job stop --address {address} {job.job_id}")


@app.command()
@user_errors
def validate(spec: Path = SPEC, overrides: Optional[list[str]] = OVERRIDES) -> None:
    """Check a spec and its plugins without training; print the resolved spec and budget."""
    import yaml

    from sweeper import resolve, spec as spec_mod

    sweep = spec_mod.load(spec, overrides or [])
    resolve.check_plugins(sweep)
    typer.echo(yaml.safe_dump(sweep.model_dump(mode="json"), sort_keys=False).rstrip())
    typer.echo(f"# budget: {sweep.budget()}")
    typer.echo(f"# plugins: {', '.join(f'{k}={v}' for k, v in resolve.provenance(sweep).items())}")


@app.command("lr-find")
@user_errors
def lr_find(spec: Path = SPEC, overrides: Optional[list[str]] = OVERRIDES,
            out: Optional[Path] = typer.Option(None, "--out", help="folder for the plot [default: runs/<name>]")) -> None:
    """Run the LR range test alone on the spec's base config; print the suggestion and the plot."""
    from sweeper import resolve, runner, spec as spec_mod, warm_start
    from sweeper.lr_finder import plot
    from sweeper.seeding import configure_torch, threads_per_trial
    from sweeper.trainer import resolve_device

    sweep = spec_mod.load(spec, overrides or [])
    resolve.check_plugins(sweep)
    configure_torch(threads=threads_per_trial(sweep), deterministic=sweep.train.deterministic)
    result = warm_start.find(sweep, {}, resolve_device(sweep.train.device))
    path = plot(result, (out or runner.default_out_dir(sweep)) / "lr_finder.png")
    lrs = f"{result.lrs[0]:.3g}..{result.lrs[-1]:.3g}" if result.lrs else "no finite point"
    found = f"{result.suggestion:.4g}" if result.suggestion is not None else "none (no reliable signal)"
    typer.echo(f"suggested lr: {found}\nrange: {lrs} over {result.steps} steps in {result.seconds:.1f} s "
               f"(stopped: {result.stopped})\nplot: {path}")


@app.command()
@user_errors
def replay(run_id: str = typer.Argument(..., help="MLflow run id of a trial (a nested run of a sweep)"),
           tracking_uri: Optional[str] = typer.Option(None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")) -> None:
    """Train a recorded trial again and check every per-epoch metric against its MLflow run."""
    import os

    from rich.table import Table

    from sweeper.progress import fmt
    from sweeper.replay import replay as replay_trial
    from sweeper.tracking import DEFAULT_URI

    out = Console(highlight=False)
    report = replay_trial(run_id, tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI)
    for warning in report.warnings:
        out.print(f"[yellow]warning:[/] {warning}")
    how = "bitwise" if report.tolerance == 0 else f"within relative {report.tolerance:g}"
    if report.matches:
        out.print(f"[green]trial {report.number} reproduced[/]: {report.epochs} epoch(s), every metric equal {how}")
        return
    table = Table("epoch", "metric", "recorded", "replayed", title=f"trial {report.number}: metrics differ ({how})")
    for epoch, metric, old, new in report.mismatches[:40]:
        table.add_row(str(epoch), metric, fmt(old), fmt(new))
    out.print(table)
    raise typer.Exit(1)


@app.command()
def schema(out: Optional[Path] = typer.Option(None, "--out", help="write to a file instead of stdout")) -> None:
    """Print the spec's JSON schema (for editor autocompletion)."""
    from sweeper.spec import json_schema

    text = json.dumps(json_schema(), indent=2)
    if out:
        out.write_text(text + "\n")
    else:
        typer.echo(text)


@app.command()
@user_errors
def plugins(kind: Optional[str] = typer.Argument(None, help="datasets, models, optimizers or schedules")) -> None:
    """List installed plugins (reads package metadata; imports none of them)."""
    from rich.table import Table

    from sweeper.plugin import KINDS
    from sweeper.registry import list_plugins

    if kind is not None and kind not in KINDS:
        raise UserError(f"unknown plugin kind '{kind}'; expected one of: {', '.join(KINDS)}")
    table = Table("kind", "name", "distribution", "version", "target")
    for p in list_plugins(kind):
        table.add_row(p.kind, p.name, p.distribution, p.version, p.target)
    Console().print(table)


def main() -> None:
    app(prog_name="sweeper")


if __name__ == "__main__":
    sys.exit(main())
