"""What a person sees while a sweep runs: a bar per running trial, a table of finished trials;
and the final lines of a sweep."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sweeper.spec import Objective, SweepSpec
from sweeper.spec.objectives import pareto_front
from sweeper.states import TrialState
from sweeper.track.records import TrialEvent, TrialRecord

SHOWN_ROWS = 12  # finished trials kept on screen while running; the final table has all
STYLE = {TrialState.COMPLETE: "green", TrialState.PRUNED: "yellow", TrialState.FAILED: "red"}


def fmt(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1e4:
        return str(int(value))  # a parameter count: every digit
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return "-" if value is None else str(value)


def trials_table(records: list[TrialRecord], goals: list[Objective], title: str = "") -> Table:
    """Finished trials: the objective and the best so far; with several objectives, each value
    and a mark on the trials of the Pareto front (of these trials)."""
    table = Table(title=title or None, title_justify="left")
    several = len(goals) > 1
    values = [g.metric for g in goals] + ["front"] if several else [goals[0].metric, "best so far"]
    for col in ("#", "state", *values, "epochs", "s", "params / reason"):
        table.add_column(col, justify="right" if col in ("#", "epochs", "s") else "left")
    ordered = sorted(records, key=lambda r: r.number)
    front = {r.number for r in pareto_front(goals, ordered, lambda r: r.values or None)} if several else set()
    best = None
    for r in ordered:
        if r.state == TrialState.COMPLETE and r.value is not None and goals[0].better(r.value, best):
            best = r.value
        detail = (
            r.reason
            if r.state != TrialState.COMPLETE and r.reason
            else ", ".join(f"{k.split('.')[-1]}={fmt(v)}" for k, v in r.params.items())
        )
        shown = (
            [fmt(r.values.get(g.metric)) for g in goals] + ["*" if r.number in front else ""]
            if several
            else [fmt(r.value), fmt(best)]
        )
        table.add_row(
            str(r.number), f"[{STYLE.get(r.state, '')}]{r.state}", *shown, str(r.epochs), fmt(r.seconds), detail
        )
    return table


def goals_of(summary: dict[str, Any]) -> list[Objective]:
    """A summary's objectives (one sweeper wrote before multi-objective sweeps: its objective)."""
    return [Objective.model_validate(g) for g in summary.get("objectives") or [summary["objective"]]]


class RichObserver:
    """Live display on the terminal; also prints the final summary."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self.bars = Progress(
            TextColumn("trial {task.fields[number]:>3}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("epochs {task.fields[metric]}"),
            TimeElapsedColumn(),
            console=self.console,
        )
        self.tasks: dict[int, Any] = {}
        self.records: list[TrialRecord] = []
        self.live: Live | None = None
        self.spec: SweepSpec | None = None

    def started(self, spec: SweepSpec, out_dir: Path) -> None:
        self.spec = spec
        self.console.print(f"[bold]{spec.name}[/]: {spec.budget()}; output in [cyan]{out_dir}[/]")
        self.live = Live(self._view(), console=self.console, refresh_per_second=4, transient=True)
        self.live.start()

    def note(self, text: str) -> None:
        self.console.print(text)

    def _started(self) -> SweepSpec:
        assert self.spec is not None, "started() comes before any event"
        return self.spec

    def _view(self) -> Group:
        recent = sorted(self.records, key=lambda r: r.number)[-SHOWN_ROWS:]
        return Group(trials_table(recent, self._started().goals), self.bars)

    def event(self, event: TrialEvent) -> None:
        spec = self._started()
        n = event.number
        if event.kind == "start":
            self.tasks[n] = self.bars.add_task("", total=spec.train.epochs, number=n, metric="")
        elif event.kind == "epoch" and n in self.tasks:
            metric = spec.objective.metric
            self.bars.update(self.tasks[n], completed=event.epoch, metric=f"{metric}={fmt(event.metrics.get(metric))}")
        elif event.kind == "end" and event.record is not None:
            if n in self.tasks:
                self.bars.remove_task(self.tasks.pop(n))
            self.records.append(event.record)
        if self.live:
            self.live.update(self._view())

    def finish(self, summary: dict[str, Any]) -> None:
        if self.live:
            self.live.stop()
        trials = [TrialRecord.model_validate(t) for t in summary["trials"]]
        self.console.print(trials_table(trials, goals_of(summary), title="trials"))
        print_result(self.console, summary)


def print_result(console: Console, summary: dict[str, Any]) -> None:
    counts = ", ".join(f"{n} {state}" for state, n in sorted(summary["counts"].items()))
    console.print(f"trials: {counts or 'none'}")
    best = summary["best"]
    if best and summary.get("pareto_front"):
        front = summary["pareto_front"]
        console.print(f"Pareto front: {len(front)} trial(s): {', '.join(str(p['number']) for p in front)}")
    if best:
        params = ", ".join(f"{k}={fmt(v)}" for k, v in best["params"].items())
        values = ", ".join(
            f"{m}={fmt(v)}" for m, v in (best.get("values") or {summary["objective"]["metric"]: best["value"]}).items()
        )
        label = "chosen" if summary.get("pareto_front") else "best"
        console.print(f"[bold green]{label}[/]: trial {best['number']} {values} seed={best['seed']} {params}")
        print_held_out(console, best, summary.get("refit"))
    else:
        console.print("[bold red]no trial completed[/]")
    if "export" in summary:
        print_export(console, summary["export"])
    registry = summary.get("registry")
    if registry and "error" in registry:
        console.print(f"[red]registry[/]: {registry['error']}")
    elif registry and "skipped" in registry:
        console.print(f"[yellow]registry[/]: {registry['name']} {registry['skipped']}", soft_wrap=True)
    elif registry:
        console.print(
            f"registered: {registry['model_uri']}; {'[green]champion[/]' if registry['champion'] else 'not champion'}"
            f" ({registry['reason']})"
        )
    mlflow = summary["mlflow"]
    if mlflow["tracking_uri"]:
        console.print(f"MLflow: experiment '{mlflow['experiment']}', run {mlflow['parent_run_id']}")
        uri, where = mlflow["tracking_uri"], mlflow.get("experiment_id")
        # MLflow 3.17's UI opens any experiment on its GenAI pages unless the link says otherwise
        # (its GenAI / Model training switch, not the experiment's kind, decides)
        page = f"/#/experiments/{where}/runs?workflowType=machine_learning" if where else ""
        if uri.startswith(("http://", "https://")):
            console.print(f"open: {uri}{page}", soft_wrap=True)
        else:
            console.print(
                f"browse with: mlflow ui --backend-store-uri {uri}"
                + (f" and open http://127.0.0.1:5000{page}" if page else ""),
                soft_wrap=True,
            )
    console.print(f"output: {summary['out_dir']}")


def print_held_out(console: Console, best: dict[str, Any], refit: dict[str, Any] | None) -> None:
    """The chosen trial's score on the held-out test split (and the refit model's), or why none."""
    if best.get("test_error"):
        console.print(f"[red]test split[/]: {best['test_error']}")
    elif best.get("test_metrics"):
        scores = ", ".join(f"{m}={fmt(v)}" for m, v in best["test_metrics"].items())
        console.print(f"held-out test split ({best['test_samples']} samples, never seen by the search): {scores}")
    if refit and "error" in refit:
        console.print(f"[red]refit[/]: {refit['error']}")
    elif refit:
        scores = ", ".join(f"{m}={fmt(v)}" for m, v in (refit.get("test_metrics") or {}).items()) or "no test split"
        console.print(f"refit on {refit['train_samples']} training + validation samples (exported): {scores}")


def print_export(console: Console, report: dict[str, Any]) -> None:
    """One line per exported format: file, size, parity, accuracy; or why it failed."""
    if "error" in report:
        console.print(f"[red]export failed[/]: {report['error']}")
        return
    for e in report["formats"]:
        for warning in e.get("warnings", []):
            console.print(f"[yellow]warning:[/] {warning}", soft_wrap=True)
        if "error" in e:
            console.print(f"[red]export {e['format']} failed[/]: {e['error']}", soft_wrap=True)
            continue
        change = f", change {e['val_acc_change']:+.4f}" if "val_acc_change" in e else ""
        accuracy = f"; val_acc {e['val_acc']:.4f}{change}" if "val_acc" in e else ""
        console.print(
            f"export {e['format']}: {e['path']} ({e['bytes'] / 1024:.0f} KiB; max |diff| "
            f"{e['max_abs_diff']:.2g} at batch {'/'.join(e['parity_max_abs_diff'])}{accuracy})"
        )
    console.print(f"export report: {report['json']}")


class QuietObserver:
    """--quiet: no live display; only the final lines."""

    def started(self, spec: SweepSpec, out_dir: Path) -> None:
        pass

    def event(self, event: TrialEvent) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def finish(self, summary: dict[str, Any]) -> None:
        print_result(Console(highlight=False), summary)


def print_replay(out: Console, report: Any) -> bool:
    """`sweeper replay`'s verdict (a replay.ReplayReport); True when every metric matched."""
    for warning in report.warnings:
        out.print(f"[yellow]warning:[/] {warning}")
    how = "bitwise" if report.tolerance == 0 else f"within relative {report.tolerance:g}"
    if report.matches:
        largest = f" (largest relative difference {report.max_difference:.2g})" if report.tolerance else ""
        group = f" (trained again fused with trials {report.fused_with})" if report.fused_with else ""
        out.print(
            f"[green]trial {report.number} reproduced[/]{group}: {report.epochs} epoch(s), every metric equal "
            f"{how}{largest}"
        )
        return True
    table = Table("epoch", "metric", "recorded", "replayed", title=f"trial {report.number}: metrics differ ({how})")
    for epoch, metric, old, new in report.mismatches[:40]:
        table.add_row(str(epoch), metric, fmt(old), fmt(new))
    out.print(table)
    if report.fused_alone:
        out.print(
            f"It trained fused and was replayed alone: the batched kernels' float rounding differs, and this "
            f"trial's training amplifies it (largest relative difference {report.max_difference:.2g}). "
            f"Without --solo it trains again with its fused model's members."
        )
    return False
