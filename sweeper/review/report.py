"""One self-contained HTML file for a sweep (`sweeper report`, and report.html on the sweep's
run): the summary, the best trial, every trial, the plots of the search (interactive: plotly's
script is inlined once), the LR range test, the export with its parity figures, the failures
with their reasons. It opens from disk, without a server or a network."""

from __future__ import annotations

import base64
import html
import json
import tempfile
import threading
from pathlib import Path
from typing import Any

from sweeper.errors import UserError
from sweeper.phases import phase
from sweeper.review import plots as search_plots
from sweeper.review.study_view import study_of
from sweeper.spec import SweepSpec
from sweeper.states import TrialState
from sweeper.track.mlflow import Tracker, resolve_uri
from sweeper.track.records import TrialRecord

STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;
font-size:.9em;vertical-align:top}th{background:#f3f3f3}.failed{color:#b00}.pruned{color:#777}
h2{border-bottom:2px solid #eee;padding-bottom:.2em;margin-top:1.6em}.note{color:#666}"""


class Drawing:
    """The plots of a sweep's trials (``summary``'s spec and trials), drawn on a thread of their
    own from the start: a sweep's end draws them while its export runs (much of the drawing
    while the export's check waits for its process; the figures: docs/reviewing.md#reporthtml);
    ``finish`` writes the report."""

    def __init__(self, summary: dict[str, Any], folder: Path) -> None:
        self.spec = SweepSpec.model_validate(summary["spec"])
        self.records = [TrialRecord.model_validate(t) for t in summary.get("trials", [])]
        self.folder, self.made = folder, search_plots.Plots()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._draw, name="sweeper-plots", daemon=True)
        self.thread.start()

    def _draw(self) -> None:
        try:
            primary = [g.metric for g in self.spec.goals].index(self.spec.objective.metric)
            with phase("plots"):
                self.made = search_plots.make(study_of(self.spec, self.records), self.folder / "plots", primary)
        except BaseException as exc:  # for finish, on the caller's thread
            self.error = exc

    def finish(self, summary: dict[str, Any], out: Path | None = None) -> list[Path]:
        """report.html (to ``out``, default folder/report.html) with the final ``summary``; returns
        it and the plots' PNGs (folder/plots)."""
        self.thread.join()
        if self.error is not None:
            raise self.error
        out = out or self.folder / "report.html"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render(summary, self.records, self.made), encoding="utf-8")
        return [out, *self.made.pngs.values()]


def write(summary: dict[str, Any], folder: Path, out: Path | None = None) -> list[Path]:
    """report.html (to ``out``, default folder/report.html) and the plots' PNGs in folder/plots;
    returns the files written."""
    return Drawing(summary, folder).finish(summary, out)


def from_source(source: str, out: Path | None, tracking_uri: str | None = None) -> Path:
    """The report of the sweep in folder ``source`` (its summary.json), or of MLflow run
    ``source`` (the summary.json artifact of a sweep's run); returns the file written."""
    folder = Path(source)
    if folder.is_dir():
        summary_file = folder / "summary.json"
        if not summary_file.is_file():
            raise UserError(f"{folder}: no summary.json; not the output folder of a finished `sweeper run`")
        try:
            summary = json.loads(summary_file.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise UserError(f"{summary_file}: not JSON ({exc})") from None
        return write(summary, folder, out)[0]
    tracker = Tracker(resolve_uri(tracking_uri))
    try:
        summary = tracker.read_json(source, "summary.json")
    except LookupError as exc:
        raise UserError(f"{source} is neither a folder nor a sweep's MLflow run with a summary.json: {exc}") from None
    out = out or Path(f"report-{source}.html")
    with tempfile.TemporaryDirectory(prefix="sweeper-report-") as tmp:  # the PNGs are not kept
        _fetch_lr_plots(tracker, source, summary, Path(tmp) / "lr_finder")
        return write(summary, Path(tmp), out.resolve())[0]


def _fetch_lr_plots(tracker: Tracker, run_id: str, summary: dict[str, Any], folder: Path) -> None:
    """The LR range tests' images from the sweep's run (its lr_finder/ folder) where the paths
    summary.json names are not on this machine; a missing one is left out of the report."""
    for finding in (summary.get("lr_finder") or {}).get("findings", []):
        plot = finding.get("plot")
        if plot and not Path(plot).is_file():
            try:
                finding["plot"] = str(tracker.download(run_id, f"lr_finder/{Path(plot).name}", folder))
            except LookupError:
                pass


def render(summary: dict[str, Any], records: list[TrialRecord], made: search_plots.Plots) -> str:
    objective = summary.get("objective", {})
    metric = objective.get("metric", "value")
    counts = ", ".join(f"{n} {state}" for state, n in sorted(summary.get("counts", {}).items())) or "no trials"
    parts = [
        f"<h1>Sweep {_e(summary.get('name'))}</h1>",
        f"<p>Objective: <b>{_e(metric)}</b> ({_e(objective.get('direction'))}). Trials: {_e(counts)}. "
        f"Search: {summary.get('search_seconds', 0):.1f} s.</p>",
        _kv_table(
            {
                "MLflow tracking URI": summary.get("mlflow", {}).get("tracking_uri"),
                "MLflow sweep run": summary.get("mlflow", {}).get("parent_run_id"),
                "Optuna storage": summary.get("storage"),
                "output folder": summary.get("out_dir"),
            }
        ),
    ]
    parts += _front(summary)
    parts += _best(summary.get("best"), metric)
    parts += _refit(summary.get("refit"))
    parts += _trials(records, metric)
    parts += _plots(made)
    parts += _lr_finder(summary.get("lr_finder"))
    parts += _export(summary.get("export"), summary.get("registry"))
    failed = [r for r in records if r.state == TrialState.FAILED]
    parts.append("<h2>Failures</h2>")
    parts.append(
        _table(["trial", "reason"], [[r.number, r.reason or ""] for r in failed])
        if failed
        else "<p class=note>No trial failed.</p>"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>sweeper report: {_e(summary.get('name'))}"
        f"</title><style>{STYLE}</style></head><body>{''.join(parts)}</body></html>"
    )


def _front(summary: dict[str, Any]) -> list[str]:
    """A multi-objective sweep's Pareto front, and the rule that chose the exported point."""
    front, goals = summary.get("pareto_front"), summary.get("objectives") or []
    if not front:
        return []
    names = [g["metric"] for g in goals]
    rows = [
        [
            p["number"],
            *(_short(p["values"].get(m)) for m in names),
            "<br>".join(f"{_e(k)} = {_e(_short(v))}" for k, v in p["params"].items()),
        ]
        for p in front
    ]
    rule = summary.get("choose") or {}
    said = f"prefer {rule.get('prefer') or names[0]}" + "".join(
        f", {m} within {t} of the best" for m, t in (rule.get("within") or {}).items()
    )
    listed = ", ".join(f"{g['metric']} ({g['direction']})" for g in goals)
    rows = [[_e(c) for c in row[:-1]] + row[-1:] for row in rows]  # the params cell is HTML already
    return [
        f"<h2>Pareto front ({len(front)} of the complete trials)</h2>",
        f"<p>Objectives: {_e(listed)}. Export takes the point export.choose picks: {_e(said)}.</p>",
        _table(["trial", *names, "params"], rows, escape=False),
    ]


def _best(best: dict[str, Any] | None, metric: str) -> list[str]:
    if not best:
        return ["<h2>Best trial</h2><p class=note>No trial completed.</p>"]
    shown = ", ".join(f"{m} = {v:.6g}" for m, v in (best.get("values") or {metric: best["value"]}).items())
    return [
        f"<h2>Best trial: {best['number']} ({_e(shown)})</h2>",
        _held_out(best),
        _kv_table(
            {
                **{f"param {k}": v for k, v in best.get("params", {}).items()},
                **{f"footprint {k}": f"{v:.6g}" for k, v in (best.get("footprint") or {}).items()},
                **{f"metric {k}": f"{v:.6g}" for k, v in (best.get("metrics") or {}).items()},
                "seed": best.get("seed"),
                "MLflow run": best.get("mlflow_run_id"),
                "checkpoint": best.get("checkpoint"),
            }
        ),
    ]


def _held_out(best: dict[str, Any]) -> str:
    """The chosen trial's score on the held-out test split, beside its validation score."""
    if best.get("test_error"):
        return f"<p class=note>Held-out test split: {_e(best['test_error'])}</p>"
    test = best.get("test_metrics")
    if not test:
        return (
            "<p class=note>The data set has no test split: the validation score above is the one the "
            "search selected on (biased upward).</p>"
        )
    shown = ", ".join(f"{m} = {v:.6g}" for m, v in test.items())
    return (
        f"<p>On the held-out test split ({best.get('test_samples')} samples, never seen by the search): "
        f"<b>{_e(shown)}</b></p>"
    )


def _refit(refit: dict[str, Any] | None) -> list[str]:
    """export.refit: the chosen configuration retrained on training + validation samples."""
    if not refit:
        return []
    if "error" in refit:
        return [f"<p class=note>Refit: {_e(refit['error'])}; the chosen trial's model was exported.</p>"]
    test = ", ".join(f"{m} = {v:.6g}" for m, v in (refit.get("test_metrics") or {}).items()) or "no test split"
    return [
        f"<p>Refit (exported): trial {refit['trial']}'s configuration trained again on "
        f"{refit['train_samples']} training + validation samples, seed {refit['seed']}, {refit['epochs']} "
        f"epochs: <b>{_e(test)}</b></p>"
    ]


def _trials(records: list[TrialRecord], metric: str) -> list[str]:
    rows = [
        [
            r.number,
            f"<span class={r.state}>{r.state}</span>",
            "" if r.value is None else f"{r.value:.6g}",
            r.epochs,
            "" if r.seconds is None else f"{r.seconds:.2f}",
            "<br>".join(f"{_e(k)} = {_e(_short(v))}" for k, v in r.params.items()),
            _e(r.reason or ""),
        ]
        for r in sorted(records, key=lambda r: r.number)
    ]
    return [
        f"<h2>Trials ({len(records)})</h2>",
        _table(["trial", "state", metric, "epochs", "seconds", "params", "reason"], rows, escape=False),
    ]


def _plots(made: search_plots.Plots) -> list[str]:
    out = ["<h2>The search</h2>"]
    inlined = False
    for name, title in search_plots.TITLES.items():
        out.append(f"<h3>{_e(title)}</h3>")
        if name in made.figures:
            # plotly's script once, in the first figure: the file stays whole without a network
            out.append(made.figures[name].to_html(full_html=False, include_plotlyjs=not inlined))
            inlined = True
        else:
            out.append(f"<p class=note>Left out: {_e(made.skipped.get(name, 'not made'))}</p>")
    return out


def _lr_finder(found: dict[str, Any] | None) -> list[str]:
    if not found:
        return []
    out = ["<h2>LR range test</h2>", f"<p>{_e(found.get('note', ''))} (policy: {_e(found.get('policy'))})</p>"]
    for f in found.get("findings", []):
        suggestion = f.get("suggestion")
        out.append(
            _kv_table(
                {
                    "configuration": json.dumps(f.get("config")),
                    "suggested lr": "none" if suggestion is None else f"{suggestion:.3g}",
                    "steps": f.get("steps"),
                }
            )
        )
        plot = Path(f.get("plot") or "")
        if plot.is_file():
            data = base64.b64encode(plot.read_bytes()).decode()
            out.append(f"<img alt='LR range test' src='data:image/png;base64,{data}'>")
    return out


def _export(export: dict[str, Any] | None, registry: dict[str, Any] | None) -> list[str]:
    out = ["<h2>Export</h2>"]
    if not export:
        return [*out, "<p class=note>Nothing was exported.</p>"]
    out.append(
        f"<p>Trial {export.get('source', {}).get('trial')}; parity checked on {export.get('val_size')} "
        f"validation rows, tolerance {export.get('atol')}; eager {export.get('eager_val_acc')}.</p>"
    )
    rows = [
        [
            f.get("format"),
            f.get("path", ""),
            f.get("bytes", ""),
            json.dumps(f.get("parity_max_abs_diff", {})),
            f.get("max_abs_diff", ""),
            f.get("val_acc", ""),
            f.get("error", ""),
        ]
        for f in export.get("formats", [])
    ]
    out.append(
        _table(["format", "file", "bytes", "max |eager - exported| by batch size", "max", "val_acc", "error"], rows)
    )
    if registry:
        out.append(_kv_table({f"registry {k}": v for k, v in registry.items()}))
    return out


def _table(head: list[str], rows: list[list[Any]], escape: bool = True) -> str:
    cell = _e if escape else str
    body = "".join("<tr>" + "".join(f"<td>{cell(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{''.join(f'<th>{_e(h)}</th>' for h in head)}</tr>{body}</table>"


def _kv_table(values: dict[str, Any]) -> str:
    return _table(["", ""], [[k, v] for k, v in values.items() if v is not None])


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))
