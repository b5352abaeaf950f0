"""The plots of a search, made with Optuna's own: optimization history, intermediate values
(each trial's learning curve, pruned ones included), parameter importances, parallel
coordinates, and slice and contour of the most important parameters; with several objectives,
the Pareto front too (the other plots show the first trainer metric, importances each objective). Each as an interactive
plotly figure (for the HTML report) and as a PNG (matplotlib, rendered offline: no browser).

A plot that needs what the sweep does not have (importances need two complete trials and a
parameter that varies; a contour two parameters) is left out with its reason."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.study import StudyDirection

TOP_PARAMS = 4  # slice: the most important parameters; contour: the first two
PNG_DPI = 100


@dataclass
class Plots:
    figures: dict[str, Any] = field(default_factory=dict)  # name -> plotly figure
    pngs: dict[str, Path] = field(default_factory=dict)  # name -> file
    skipped: dict[str, str] = field(default_factory=dict)  # name -> why


TITLES = {
    "pareto": "Pareto front",
    "history": "Optimization history",
    "intermediate": "Learning curves (intermediate values)",
    "importance": "Parameter importances",
    "parallel": "Parallel coordinates",
    "slice": "Slice of the top parameters",
    "contour": "Contour of the top two parameters",
}


def _importance_target(study: optuna.Study, objective: int) -> dict[str, Any]:
    """One objective: Optuna's defaults. Several: the primary one, signed so that smaller is
    better (Optuna's evaluator ranks the parameters that lead to low target values)."""
    if len(study.directions) == 1:
        return {}
    sign = -1.0 if study.directions[objective] == StudyDirection.MAXIMIZE else 1.0
    name = (study.metric_names or [f"Objective {objective}"] * (objective + 1))[objective]
    return {"target": lambda t: sign * t.values[objective], "target_name": name}


def top_params(study: optuna.Study, objective: int | None = None) -> list[str]:
    """The parameters by importance (Optuna's default evaluator; on objective number ``objective``), or
    in the order they appear when it cannot say."""
    complete = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    if complete < 2:  # Optuna's evaluator ranks them all equal then (and imports scikit-learn: ~1.5 s)
        return _in_order(study)
    try:
        target = None if objective is None else _importance_target(study, objective)["target"]
        with warnings.catch_warnings():  # it warns that it minimises a target, as the sign above makes it
            warnings.simplefilter("ignore", UserWarning)
            return list(optuna.importance.get_param_importances(study, target=target))[:TOP_PARAMS]
    except (ValueError, RuntimeError):
        return _in_order(study)


def _in_order(study: optuna.Study) -> list[str]:
    """The parameters in the order the trials first name them (at most TOP_PARAMS)."""
    names: list[str] = []
    for t in study.trials:
        names += [n for n in t.params if n not in names]
    return names[:TOP_PARAMS]


def make(study: optuna.Study, folder: Path | None, primary: int = 0) -> Plots:
    """Every plot as a plotly figure, and as folder/<name>.png unless ``folder`` is None (the
    objectives named as the study's metrics; ``primary``: the objective of the one-value plots)."""
    from optuna import visualization as vis
    from optuna.visualization import matplotlib as mvis

    out = Plots()
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        out.skipped = {name: "no complete trial" for name in TITLES}
        return out
    names = study.metric_names or [f"Objective {i}" for i in range(len(study.directions))]
    several = len(names) > 1
    top = top_params(study, primary if several else None)
    named: dict[str, Any] = {"target_name": names[primary]}
    if several:  # the one-value plots show the primary objective
        named["target"] = lambda t: t.values[primary]
    varied = [p for p in top if len({repr(t.params.get(p)) for t in complete}) > 1]
    makers: dict[str, tuple[Callable[..., Any], Callable[..., Any], dict[str, Any]] | str] = {
        "pareto": (vis.plot_pareto_front, mvis.plot_pareto_front, {"target_names": names})
        if several and len(names) <= 3
        else "one objective"
        if not several
        else "more than three objectives",
        "history": (vis.plot_optimization_history, mvis.plot_optimization_history, named),
        "intermediate": (vis.plot_intermediate_values, mvis.plot_intermediate_values, {})
        if any(t.intermediate_values for t in study.trials)
        else "no trial reported an epoch",
        "importance": (vis.plot_param_importances, mvis.plot_param_importances, _importance_target(study, primary))
        if len(complete) >= 2 and varied
        else "needs two complete trials and a parameter that varies",
        "parallel": (vis.plot_parallel_coordinate, mvis.plot_parallel_coordinate, {"params": top, **named})
        if top
        else "no parameters",
        "slice": (vis.plot_slice, mvis.plot_slice, {"params": top, **named}) if top else "no parameters",
        "contour": (vis.plot_contour, mvis.plot_contour, {"params": varied[:2], **named})
        if len(varied) >= 2
        else "needs two parameters that vary",
    }
    if folder is not None:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
        folder.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # Optuna's matplotlib plots are experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", UserWarning)  # the evaluator's note on a target (_importance_target)
        for name, maker in makers.items():
            if isinstance(maker, str):
                out.skipped[name] = maker
                continue
            interactive, static, kwargs = maker
            try:
                out.figures[name] = interactive(study, **kwargs)
                if folder is not None:
                    out.pngs[name] = _png(static(study, **kwargs), folder / f"{name}.png")
            except Exception as exc:  # a plot Optuna cannot draw for this study: the others still are
                out.skipped[name] = f"{type(exc).__name__}: {exc}"
    return out


def _png(axes: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    first = axes.flat[0] if hasattr(axes, "flat") else axes  # slice and contour give a grid of axes
    figure = first.figure
    figure.set_size_inches(max(figure.get_size_inches()[0], 8), max(figure.get_size_inches()[1], 5))
    figure.savefig(path, dpi=PNG_DPI, bbox_inches="tight")
    plt.close(figure)
    return path
