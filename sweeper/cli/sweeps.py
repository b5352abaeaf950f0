"""The commands of one sweep (run, worker, status, stop, submit, validate, replay, export, ...)
and of the plugins; the queue's commands, from queue.py, join them at the top level.

Heavy libraries (torch, optuna, mlflow) are imported inside the commands that need them,
so ``sweeper --help`` stays fast."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape

from sweeper.cli import queue as queue_commands
from sweeper.cli.base import AUTO, OVERRIDES, SPEC, app, err, run_app, user_errors
from sweeper.errors import UserError
from sweeper.phases import phase
from sweeper.plugin import LISTED  # cheap: no torch, no plugin

if TYPE_CHECKING:
    from sweeper.plan.resolve import Resolved
    from sweeper.spec import SweepSpec


@app.command()
@user_errors
def run(
    spec: Path = SPEC,
    overrides: list[str] | None = OVERRIDES,
    out: Path | None = typer.Option(None, "--out", help="output folder [default: runs/<name>]"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no live display (for CI)"),
    auto: bool = AUTO,
) -> None:
    """Run (or resume) a sweep."""
    from sweeper import export
    from sweeper.spec import load

    with phase("resolve"):
        sweep = load(spec, overrides or [], auto=auto)
    # the export's helper processes start before this one imports torch, to be ready by the sweep's end
    export.prestart(list(sweep.export.formats), register=sweep.tracking.enabled)
    with phase("imports"):
        from sweeper.search import runner
        from sweeper.track.progress import QuietObserver, RichObserver

    observer = QuietObserver() if quiet else RichObserver()
    summary = runner.run_sweep(sweep, out or runner.default_out_dir(sweep), observer)
    observer.finish(summary)
    if summary["best"] is None:
        raise typer.Exit(1)


@app.command()
@user_errors
def worker(
    spec: Path | None = typer.Argument(None, help="sweep spec (YAML); or give --study", show_default=False),
    overrides: list[str] | None = OVERRIDES,
    study: str | None = typer.Option(
        None,
        "--study",
        help="a storage URL holding the sweep, e.g. postgresql+psycopg://user@host/db: its spec is read from there",
    ),
    name: str | None = typer.Option(None, "--name", help="with --study: which sweep, if it holds several"),
    out: Path | None = typer.Option(
        None, "--out", help="folder for checkpoints [default: runs/<name>; with --queue: runs/<each sweep's name>]"
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no live display"),
    queue: str | None = typer.Option(
        None, "--queue", help="serve every runnable sweep of the queue in this database (`sweeper submit --queue`)"
    ),
    device: str | None = typer.Option(
        None, "--device", help="with --queue: the device offered, cpu or cuda [default: this machine's]"
    ),
    memory_gb: float | None = typer.Option(
        None, "--memory-gb", help="with --queue: the device memory offered, GB [default: this machine's]"
    ),
    devices: int | None = typer.Option(
        None,
        "--devices",
        min=1,
        help="with --queue: the GPUs offered (a sweep of train.devices N needs N) [default: the GPUs it sees]",
    ),
    drain: bool = typer.Option(
        False, "--drain", help="with --queue: exit once no sweep it can serve is open (else: serve until stopped)"
    ),
) -> None:
    """Join a sweep (search.backend optuna) and train its trials until its budget is spent; any
    number of workers on any machines share one study (search.storage). With --queue: serve the
    queue's sweeps by priority and fair share until stopped (SIGTERM: its trial stops at its
    epoch's end and is released for another worker to resume)."""
    from sweeper.search import runner
    from sweeper.search.state import Role
    from sweeper.spec import load, validate
    from sweeper.track.progress import QuietObserver, RichObserver

    if queue is not None:
        if spec is not None or study is not None:
            raise UserError("--queue serves every sweep of the queue: give no spec and no --study")
        queue_commands.serve_queue(queue, out or Path("runs"), device, memory_gb, devices, drain)
        return
    if (spec is None) == (study is None):
        raise UserError("give a spec, or --study URL (the sweep's spec is then read from that storage)")
    if study is not None:
        from sweeper.search.optuna.store import stored_spec
        from sweeper.spec import apply_overrides

        sweep = validate(apply_overrides(stored_spec(study, name), overrides or []), f"--study {name or ''}".strip())
    else:
        assert spec is not None  # one of the two is given (checked above)
        sweep = load(spec, overrides or [])
    if sweep.search.backend != "optuna":
        raise UserError(
            f"{spec}: search.backend is '{sweep.search.backend}'; `sweeper worker` serves Optuna sweeps "
            f"(a Ray sweep's workers are Ray nodes: `ray start --address ...`)"
        )
    observer = QuietObserver() if quiet else RichObserver()
    report = runner.run_sweep(sweep, out or runner.default_out_dir(sweep), observer, role=Role.WORKER)
    counts = ", ".join(f"{n} {state}" for state, n in report["counts"].items()) or "none"
    typer.echo(f"worker done: sweep '{sweep.name}' has no trial left to claim (trials: {counts})")


FOLDER = typer.Argument(None, help="the sweep's output folder (of `sweeper run`); or give --study", show_default=False)
STUDY = typer.Option(None, "--study", help="the sweep's storage URL (search.storage)")
NAME = typer.Option(None, "--name", help="which sweep, if the storage holds several")


@app.command()
@user_errors
def status(
    folder: Path | None = FOLDER,
    study: str | None = STUDY,
    name: str | None = NAME,
    as_json: bool = typer.Option(False, "--json", help="print the status as JSON"),
) -> None:
    """Show a sweep's trials by state, which process holds which trial, throughput and time left."""
    from sweeper.search.optuna import status as sweep_status

    info = sweep_status.report(*sweep_status.locate(folder, study, name))
    if folder is not None:  # a finished sweep's chosen trial, with its held-out test score
        info["chosen"] = sweep_status.chosen(folder)
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    sweep_status.show(info, Console(highlight=False, soft_wrap=True))


@app.command()
@user_errors
def stop(folder: Path | None = FOLDER, study: str | None = STUDY, name: str | None = NAME) -> None:
    """Stop a sweep gracefully: running trials finish, no process claims a new one. `sweeper run`
    with its spec resumes it."""
    from sweeper.search.optuna import status as sweep_status

    url, sweep = sweep_status.locate(folder, study, name)
    sweep_status.stop(url, sweep)
    typer.echo(
        f"stop requested for sweep '{sweep}': running trials finish, no new trial starts; `sweeper status` follows it"
    )


@app.command()
@user_errors
def dashboard(
    folder: Path | None = FOLDER,
    study: str | None = STUDY,
    name: str | None = NAME,
    host: str = typer.Option("127.0.0.1", "--host", help="address to serve on (loopback: this machine only)"),
    port: int = typer.Option(8080, "--port"),
) -> None:
    """Serve optuna-dashboard for a sweep's study (live while it runs): history, importances,
    intermediate values, timeline. Ctrl-C stops it."""
    from sweeper.search.optuna import status as sweep_status

    sweep_status.dashboard(*sweep_status.locate(folder, study, name), host, port, typer.echo)


@app.command()
@user_errors
def submit(
    spec: Path = SPEC,
    overrides: list[str] | None = OVERRIDES,
    address: str | None = typer.Option(None, "--address", help="Ray dashboard URL, e.g. http://HEAD:8265"),
    queue: str | None = typer.Option(
        None, "--queue", help="queue the sweep in this database, e.g. postgresql+psycopg://user@host/db"
    ),
    priority: int = typer.Option(0, "--priority", help="with --queue: higher runs first"),
    owner: str | None = typer.Option(
        None, "--owner", help="with --queue: whose sweep [default: $SWEEPER_OWNER or your login]"
    ),
    device: str | None = typer.Option(
        None, "--device", help="with --queue: the device a worker must offer, any|cpu|cuda [default: from train.device]"
    ),
    min_memory_gb: float = typer.Option(
        0.0, "--min-memory-gb", help="with --queue: device memory a worker must offer, GB"
    ),
    out: str | None = typer.Option(
        None, "--out", help="with --address: output folder on the head node [default: /tmp/sweeper/runs/<name>]"
    ),
    python: str = typer.Option(sys.executable, "--python", help="the head node's Python with sweeper installed"),
) -> None:
    """Queue the sweep for a pool of workers (--queue; `sweeper worker --queue` serves it), or
    submit it (search.backend: ray) as a Ray job (--address)."""
    if (address is None) == (queue is None):
        raise UserError("give --queue URL (a queue of sweeps) or --address URL (a Ray cluster)")
    if queue is not None:
        from sweeper.queue.submit import default_owner
        from sweeper.queue.submit import submit as queue_sweep
        from sweeper.search.optuna.study import safe_url

        entry = queue_sweep(spec, overrides or [], queue, owner or default_owner(), priority, device, min_memory_gb)
        typer.echo(
            f"queued sweep '{entry.name}' (owner {entry.owner}, priority {entry.priority}, device {entry.device})\n"
            f"list:    sweeper queue {safe_url(queue)}\n"
            f"workers: sweeper worker --queue {safe_url(queue)}"
        )
        return
    from sweeper.search.ray.submit import submit as submit_job

    assert address is not None
    job = submit_job(spec, overrides or [], address, out, python)
    typer.echo(
        f"submitted Ray job {job.job_id}; output on the head node: {job.out}\n"
        f"follow:  {job.follow}\n"
        f"status:  ray job status --address {address} {job.job_id}\n"
        f"stop:    ray job stop --address {address} {job.job_id}"
    )


@app.command()
@user_errors
def validate(
    spec: Path = SPEC,
    overrides: list[str] | None = OVERRIDES,
    estimate: bool = typer.Option(
        False,
        "--estimate",
        help="also time a few training steps of the base "
        "configuration: the time a trial takes and a bound for the sweep",
    ),
    auto: bool = AUTO,
) -> None:
    """Check a spec and its plugins without training; print the resolved spec, its search space
    with where each entry comes from, and the budget."""
    import yaml

    from sweeper.plan import budget_clock, sized_space
    from sweeper.plan.resolve import resolve_sweep
    from sweeper.pluginhost.auto_space import provenance_lines
    from sweeper.pluginhost.binding import provenance
    from sweeper.spec import load

    with phase("resolve"):
        loaded = load(spec, overrides or [], auto=auto)
        resolved = resolve_sweep(loaded, size=sized_space.size, before_build=_check_earlier)  # as `sweeper run` does
    sweep = resolved.spec
    typer.echo(yaml.safe_dump(sweep.model_dump(mode="json"), sort_keys=False).rstrip())
    typer.echo("# search space:" if sweep.search.space else "# search space: empty")
    for line in provenance_lines(resolved.space):
        typer.echo(f"#   {line}")
    for line in _family_lines(resolved):
        typer.echo(line)
    if resolved.sized is not None:
        typer.echo("# sized to the budget (timed here; `sweeper run` sizes again on its machine):")
        for change in resolved.sized or ["search.space: nothing dropped, every choice fits"]:
            typer.echo(f"#   {change}")
    typer.echo(f"# budget: {sweep.budget()}")
    if (clock := budget_clock.clock(sweep)) is not None:
        typer.echo(f"#   search.budget {clock.describe()}")
    if resolved.choices:
        typer.echo("# strategy (search.sampler/pruner: auto; docs/strategy.md):")
        for choice in resolved.choices:
            typer.echo(f"#   {choice.describe()}")
    typer.echo(f"# plugins: {', '.join(f'{k}={v}' for k, v in provenance(sweep).items())}")
    assert resolved.dry is not None
    typer.echo(f"# dry build: {resolved.dry.summary()}")
    for warning in resolved.warnings():  # settings that cannot take effect: said, not refused
        err.print("[yellow]warning:[/]", escape(warning), soft_wrap=True)
    if estimate:
        from sweeper.plan.estimate import estimate as time_steps

        typer.echo(time_steps(sweep).describe())


def _family_lines(resolved: Resolved) -> list[str]:
    """`validate`'s lines on the model families: the candidates, the refused, the first round."""
    families, sweep = resolved.space.families, resolved.spec
    if families is None or not (families.added or families.refused):
        return []
    kind = f"the data set gives {families.kind}s" if families.kind else "the data set declares no kind of data"
    lines = [f"# model families ({kind}; docs/strategy.md#model-families):"]
    lines += [f"#   {line}" for line in families.lines()]
    round_ = sweep.search.family_round
    if round_ is not None and round_.drops:
        lines.append(
            f"#   first round: each family for {round_.epochs} of {sweep.train.epochs} epochs, "
            f"then the search within the best {round_.keep}"
        )
    elif round_ is not None:
        lines.append(
            f"#   first round: each family once, for all {sweep.train.epochs} epochs (under 9 epochs no "
            "fidelity is cheap), then the search over all of them"
        )
    return lines


def _check_earlier(spec: SweepSpec) -> None:
    """Each earlier sweep of search.warm_start is there and measured the same objective."""
    if spec.search.warm_start:
        from sweeper.search.optuna import earlier

        earlier.check(spec, None)


@app.command("lr-find")
@user_errors
def lr_find(
    spec: Path = SPEC,
    overrides: list[str] | None = OVERRIDES,
    out: Path | None = typer.Option(None, "--out", help="folder for the plot [default: runs/<name>]"),
) -> None:
    """Run the LR range test alone on the spec's base config; print the suggestion and the plot."""
    from sweeper.plan.resolve import resolve_sweep
    from sweeper.search import lr_range_tests, runner
    from sweeper.spec import load
    from sweeper.trial.lr_finder import plot

    sweep = resolve_sweep(load(spec, overrides or [])).spec  # a broken plugin: exit 2, as for `sweeper run`
    result = lr_range_tests.find_alone(sweep)
    path = plot(result, (out or runner.default_out_dir(sweep)) / "lr_finder.png")
    lrs = f"{result.lrs[0]:.3g}..{result.lrs[-1]:.3g}" if result.lrs else "no finite point"
    found = f"{result.suggestion:.4g}" if result.suggestion is not None else "none (no reliable signal)"
    detail = (
        f" (steepest descent {result.steepest:.3g}, lowest loss at {result.min_loss_lr:.3g})"
        if result.steepest is not None and result.min_loss_lr is not None
        else ""
    )
    typer.echo(
        f"suggested lr: {found}{detail}\nrange: {lrs} over {result.steps} steps in {result.seconds:.1f} s "
        f"(stopped: {result.stopped})\nplot: {path}"
    )


@app.command()
@user_errors
def sync(
    folder: Path = typer.Argument(..., help="a sweep's output folder, e.g. runs/<name>", show_default=False),
    tracking_uri: str | None = typer.Option(None, help="default: the URI each journal was written for"),
) -> None:
    """Send to MLflow what a sweep logged while its tracking server was away (the folder's
    mlflow-journal); exit 2 if the server still does not answer."""
    from sweeper.track.sync import sync_folder

    report = sync_folder(folder, tracking_uri)
    held = f"; {len(report.held)} journal(s) are held by running processes, which send them" if report.held else ""
    Console(highlight=False).print(f"sent {report.sent} MLflow write(s) from {folder}{held}")


@app.command()
@user_errors
def replay(
    run_id: str = typer.Argument(..., help="MLflow run id of a trial (a nested run of a sweep)"),
    tracking_uri: str | None = typer.Option(None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db"),
    solo: bool = typer.Option(
        False,
        "--solo",
        help="a fused trial: train it alone, not with its fused model's members (compared within a relative 1e-5)",
    ),
) -> None:
    """Train a recorded trial again and check every per-epoch metric against its MLflow run.
    A trial trained fused with others trains again with them, fused as before."""
    from sweeper.replay import replay as replay_trial
    from sweeper.track.mlflow import resolve_uri
    from sweeper.track.progress import print_replay

    if not print_replay(Console(highlight=False), replay_trial(run_id, resolve_uri(tracking_uri), solo)):
        raise typer.Exit(1)


@app.command()
@user_errors
def report(
    source: str = typer.Argument(..., help="a sweep's output folder, or the MLflow run id of a sweep"),
    out: Path | None = typer.Option(None, "--out", help="[default: FOLDER/report.html, or ./report-RUN_ID.html]"),
    tracking_uri: str | None = typer.Option(None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db"),
) -> None:
    """Write one self-contained HTML report of a sweep: summary, every trial, the plots of the
    search, the LR range test, the export and its parity, the failures. It opens without a server."""
    from sweeper.review.report import from_source

    typer.echo(f"report: {from_source(source, out, tracking_uri)}")


@app.command("export")
@user_errors
def export_cmd(
    run_id: str = typer.Argument(..., help="MLflow run id of a completed trial"),
    formats: list[str] | None = typer.Option(
        None, "--formats", help="torchscript, pt2, onnx (repeat or comma-separate) [default: the spec's]"
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="[default: <sweep out>/export-trial-<N> when that folder is on this machine, else ./export-trial-<N>]",
    ),
    checkpoint: Path | None = typer.Option(
        None,
        "--checkpoint",
        help="the trial's checkpoint file [default: the one its run records, if inside its sweep's folder]",
    ),
    tracking_uri: str | None = typer.Option(None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db"),
) -> None:
    """Export a finished trial from its checkpoint; verify every file; write export.json."""
    from sweeper.export.trial_run import export_trial, parse_formats
    from sweeper.track.mlflow import resolve_uri
    from sweeper.track.progress import print_export

    names = parse_formats(formats)
    report = export_trial(run_id, resolve_uri(tracking_uri), names, out, checkpoint)
    print_export(Console(highlight=False), report)
    if any("error" in e for e in report["formats"]):
        raise typer.Exit(1)


@app.command()
@user_errors
def predict(
    model_file: Path = typer.Argument(..., help="model.torchscript.pt, model.pt2 or model.onnx"),
    inputs: Path = typer.Argument(
        ..., help=".npy array: one sample, or a batch (N, ...) of them, normalised as export.json says"
    ),
    out: Path | None = typer.Option(None, "--out", help="also save the outputs (logits) as .npy"),
) -> None:
    """Run an exported model on a .npy file, the way a consumer without sweeper does."""
    from sweeper.export.predict import predict_file

    for line in predict_file(model_file, inputs, out):
        typer.echo(line)


@app.command()
@user_errors
def schema(out: Path | None = typer.Option(None, "--out", help="write to a file instead of stdout")) -> None:
    """Print the spec's JSON schema (for editor autocompletion)."""
    from sweeper.spec import json_schema

    text = json.dumps(json_schema(), indent=2)
    if out:
        out.write_text(text + "\n")
    else:
        typer.echo(text)


plugins_app = typer.Typer(
    no_args_is_help=False, help=("List installed plugins (reads package metadata; imports none of them), or show one.")
)
app.add_typer(queue_commands.queue_app)  # queue, cancel, priority, share, queue-access: at the top level
app.add_typer(plugins_app, name="plugins")
ARGS = typer.Option(False, "--args", help="also import each plugin and show its arguments and defaults")


@plugins_app.callback(invoke_without_command=True)
@user_errors
def plugins(ctx: typer.Context, args: bool = ARGS) -> None:
    """List installed plugins of every kind: `sweeper plugins [KIND]`, `sweeper plugins show NAME`."""
    ctx.obj = args  # `sweeper plugins --args models` means the same as `plugins models --args`
    if ctx.invoked_subcommand is None:
        _list_plugins(None, args)


def _list_plugins(kind: str | None, with_args: bool) -> None:
    from sweeper.pluginhost import listing

    if not listing.show(kind, with_args):  # a plugin failed to import: listed, then exit 1
        raise typer.Exit(1)


def _kind_command(kind: str) -> Callable:
    def command(ctx: typer.Context, args: bool = ARGS) -> None:
        _list_plugins(kind, args or bool(ctx.obj))

    command.__doc__ = f"List the {kind.replace('_', ' ')} plugins."
    return user_errors(command)


for _kind in LISTED:
    plugins_app.command(name=_kind)(_kind_command(_kind))


@plugins_app.command()
@user_errors
def show(
    name: str = typer.Argument(..., help="plugin name, or 'distribution:name'"),
    kind: str | None = typer.Option(None, "--kind", help="only this kind (when a name has several)"),
) -> None:
    """Import one plugin and show where it comes from, its API version and its arguments."""
    import inspect

    from rich.table import Table

    from sweeper import PLUGIN_API_VERSION
    from sweeper.plugin import INJECTED
    from sweeper.pluginhost import binding, registry
    from sweeper.pluginhost.priors import annotated_priors, prior_text

    if kind is not None and kind not in LISTED:
        raise UserError(f"unknown plugin kind '{kind}'; expected one of: {', '.join(LISTED)}")
    matches = registry.matching(name, kind)
    out = Console(highlight=False, soft_wrap=True)
    for p in matches:
        out.print(f"[bold]{registry.singular(p.kind)} plugin '{p.name}'[/]")
        out.print(f"  distribution  {p.distribution} {p.version}")
        out.print(f"  entry point   {p.name} = {p.target}   (group sweeper.{p.kind})")
        if p.kind == "search_spaces":
            out.print(f"  copy it       sweeper init --from {p.qualified}")
            continue
        factory = registry.get(p.kind, p.qualified)
        declared = registry.declared_api(p.kind, p.qualified)
        out.print(
            f"  plugin API    {'not declared' if declared is None else declared} (this sweeper: {PLUGIN_API_VERSION})"
        )
        doc = (inspect.getdoc(factory) or "").strip().split("\n\n")[0].replace("\n", " ")
        if doc:
            out.print(f"  about         {doc}")
        accepted = binding.accepted_args(factory)  # None: **kwargs, takes whatever sweeper passes
        injected = [a for a in INJECTED[p.kind] if accepted is None or a in accepted]
        out.print(f"  set by sweeper: {', '.join(injected) or 'nothing'}")
        priors = annotated_priors(factory, p.kind)
        table = Table("argument", "default", "type", "search prior", title=None, box=None, padding=(0, 2))
        for row in binding.describe_args(p.kind, factory):
            table.add_row(*row, prior_text(priors[row[0]]) if row[0] in priors else "")
        out.print(table)
        out.print(
            f"  search one in a spec under search.space as {p.kind[:-1]}.args.<argument>; "
            f"search.space: auto searches each over its prior"
        )


@app.command()
@user_errors
def init(
    source: str = typer.Option(..., "--from", help="a search space, or a plugin whose distribution ships one"),
    out: Path | None = typer.Option(None, "--out", "-o", help="spec to write [default: ./<name>.yaml]"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing file"),
) -> None:
    """Start a spec from a search space a plugin distribution ships."""
    from sweeper.pluginhost.templates import init as init_spec

    path, template = init_spec(source, out, force)
    typer.echo(
        f"wrote {path} (search space '{template.name}' from {template.distribution} {template.version}); "
        f"next: sweeper validate {path}  then  sweeper run {path}"
    )


def main() -> None:
    run_app("sweeper")


if __name__ == "__main__":
    main()
