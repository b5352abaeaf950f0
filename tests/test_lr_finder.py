"""LR range test: a sensible suggestion, state restored, and the warm start inside a sweep."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from conftest import SPACES, learned, sweeper, write_spec
from mlflow.tracking import MlflowClient

from sweeper import spec as spec_mod
from sweeper.trial.build import TrialConfig, run_trial
from sweeper.trial.lr_finder import range_test, steepest, suggest

CPU = torch.device("cpu")


def test_suggestion_is_the_steepest_descent_and_none_without_signal():
    lrs = [10 ** (-6 + 6 * i / 99) for i in range(100)]
    # loss falls fastest around 1e-3 (a logistic drop in log-lr), then blows up past 1e-1
    losses = [2.0 - 1.5 / (1 + math.exp(-4 * (math.log10(lr) + 3))) + (5 * (lr - 0.1) if lr > 0.1 else 0) for lr in lrs]
    assert 5e-4 < suggest(lrs, losses) < 2e-3
    assert suggest(lrs, [2.0] * 100) is None  # flat: no signal
    assert suggest(lrs[:5], losses[:5]) is None  # too few points


def test_suggestion_is_capped_at_a_tenth_of_the_lowest_loss():
    """A test that trains as it goes: the loss falls fastest right before its minimum (0.3),
    where training is on the edge; the suggestion is then the minimum's LR / 10."""
    lrs = [10 ** (-6 + 6 * i / 99) for i in range(100)]
    losses = [
        2.0 - 1.5 / (1 + math.exp(-6 * (math.log10(lr) + 0.7))) + (20 * (lr - 0.3) if lr > 0.3 else 0) for lr in lrs
    ]
    assert 0.1 < steepest(lrs, losses) < 0.3
    lowest = lrs[losses.index(min(losses))]
    assert math.isclose(suggest(lrs, losses), lowest / 10)


def test_range_test_restores_model_optimizer_and_rng():
    """A trial with the finder run (and its result ignored) equals the trial without it."""
    spec = spec_mod.load(SPACES / "smoke.yaml", ["model.args.dropout=0.2", "train.epochs=2"])
    cfg = TrialConfig(0, 7, {}, spec)
    plain = run_trial(cfg, lambda e, m: None, CPU)
    results = []

    def finder(parts):
        results.append(
            range_test(parts.model, parts.optimizer, parts.data, spec.train, min_lr=1e-5, max_lr=10.0, steps=30, seed=3)
        )

    with_finder = run_trial(cfg, lambda e, m: None, CPU, before_fit=finder)
    assert results[0].steps > 10  # it really trained (and changed weights) in between
    assert learned(with_finder.history) == learned(plain.history)


def test_range_test_works_with_accumulation_and_stops_on_divergence():
    spec = spec_mod.load(
        SPACES / "smoke.yaml", ["optimizer.plugin=sgd", "optimizer.args={lr: 0.1}", "train.accumulate=4"]
    )
    from sweeper.trial.build import build

    parts = build(TrialConfig(0, 1, {}, spec), CPU)
    result = range_test(parts.model, parts.optimizer, parts.data, spec.train, min_lr=1e-4, max_lr=1e4, steps=100)
    assert result.stopped in ("diverged", "non-finite") and result.steps < 100
    assert result.suggestion is None or 1e-4 <= result.suggestion <= 1e4


def test_warm_start_in_a_sweep(workdir: Path, mlflow_uri: str):
    spec = write_spec(workdir / "s.yaml", tracking={"experiment": "lr-finder"})
    args = [
        "search.lr_finder={enabled: true, steps: 40, policy: both, factor: 3.0}",
        "search.space.optimizer.args.lr={type: float, low: 1.0e-5, high: 1.0, log: true}",
        "search.space.optimizer.plugin={type: categorical, choices: [adam, sgd]}",
        "search.n_trials=3",
        "--out",
        "out",
        "-q",
    ]
    sweeper("run", str(spec), *args, check=True)
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    findings = summary["lr_finder"]["findings"]
    # one test per optimizer; model.args.hidden (a width) shares it
    assert [f["config"] for f in findings] == [{"optimizer.plugin": "adam"}, {"optimizer.plugin": "sgd"}]
    suggestions = [f["suggestion"] for f in findings]
    assert all(s is not None for s in suggestions)
    # enqueue: the first trials run at the suggestions, other params at their base values
    first = summary["trials"][:2]
    assert [t["params"]["optimizer.args.lr"] for t in first] == suggestions
    # narrow: the LR range is [min/3, max*3] clipped to the declared range
    lr = summary["spec"]["search"]["space"]["optimizer.args.lr"]
    assert math.isclose(lr["low"], max(1e-5, min(suggestions) / 3)) and math.isclose(
        lr["high"], min(1.0, max(suggestions) * 3)
    )
    assert all(lr["low"] <= t["params"]["optimizer.args.lr"] <= lr["high"] for t in summary["trials"])
    # MLflow: curves as images and the suggestions as params on the sweep's run
    client = MlflowClient(mlflow_uri)
    parent = summary["mlflow"]["parent_run_id"]
    assert {"lr_finder/lr_finder_0.png", "lr_finder/lr_finder.json"} <= {
        a.path for a in client.list_artifacts(parent, "lr_finder")
    }
    assert client.get_run(parent).data.params["lr_finder.policy"] == "both"
    # the report from the run alone (another machine: the out folder's images are not there)
    moved = workdir / "elsewhere"
    (workdir / "out").rename(moved)
    sweeper("report", parent, "--out", "from-run.html", check=True)
    assert (workdir / "from-run.html").read_text().count("<img alt='LR range test'") == 2  # one per optimizer
    moved.rename(workdir / "out")
    # resumed: the cached result is reused, not recomputed
    cache = workdir / "out" / "lr_finder.json"
    stamp = cache.stat().st_mtime_ns
    sweeper("run", str(spec), *[a if a != "search.n_trials=3" else "search.n_trials=4" for a in args], check=True)
    assert cache.stat().st_mtime_ns == stamp
    assert len(json.loads((workdir / "out" / "summary.json").read_text())["trials"]) == 4


def test_lr_find_command_prints_suggestion_and_plot(workdir: Path):
    proc = sweeper("lr-find", str(SPACES / "smoke.yaml"), "--out", "o", check=True)
    assert "suggested lr:" in proc.stdout and (workdir / "o" / "lr_finder.png").stat().st_size > 1000


def test_lr_finder_needs_a_searched_lr():
    proc = sweeper(
        "validate",
        str(SPACES / "smoke.yaml"),
        "search.lr_finder.enabled=true",
        "search.space={model.args.hidden: {type: categorical, choices: [16]}}",
    )
    assert proc.returncode == 2 and "lr_finder needs optimizer.args.lr in search.space" in proc.stderr


def test_the_warm_start_gives_back_its_data_unless_trials_train_in_this_process(tmp_path: Path):
    from sweeper.search import lr_range_tests
    from sweeper.trial.build import ProcessCache

    lr = "search.space.optimizer.args.lr={type: float, low: 1.0e-4, high: 1.0, log: true}"
    for parallel, kept in ((2, False), (1, True)):  # parallel 1: the trials reuse this process's data set
        spec = spec_mod.load(
            SPACES / "smoke.yaml", [lr, "search.lr_finder={enabled: true, steps: 10}", f"search.parallel={parallel}"]
        )
        cache = ProcessCache()  # the sweep process's
        lr_range_tests.prepare(spec, tmp_path / str(parallel), cache)
        assert bool(cache.data.held) is kept
