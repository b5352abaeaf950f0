"""Multi-objective sweeps: the Pareto front and export.choose (pure functions), the model's
footprint (params, latency_ms), and whole sweeps through the real CLI on both backends: the front
in summary.json, the chosen point exported and registered, the same table with 1 and 2 workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import children, config, sweeper, write_spec
from mlflow.tracking import MlflowClient

from sweeper.spec import SweepSpec
from sweeper.spec.objectives import Choose, Objective, choose, dominates, pareto_front
from sweeper.trial import footprint
from sweeper.trial.build import build

ACC, SIZE = Objective(metric="val_acc", direction="maximize"), Objective(metric="params", direction="minimize")
POINTS = [  # (trial number, val_acc, params)
    (0, 0.90, 5000.0),
    (1, 0.95, 20000.0),
    (2, 0.96, 80000.0),
    (3, 0.94, 30000.0),
    (4, 0.95, 9000.0),
    (5, 0.70, 500.0),
    (6, 0.96, 80000.0),
]


def values(point: tuple[int, float, float]) -> dict[str, float]:
    return {"val_acc": point[1], "params": point[2]}


def numbers(points: list) -> list[int]:
    return [p[0] for p in points]


def test_the_pareto_front_keeps_exactly_the_points_nothing_beats_on_both():
    assert dominates({"val_acc": 0.95, "params": 9000}, {"val_acc": 0.95, "params": 20000}, [ACC, SIZE])
    assert not dominates({"val_acc": 0.96, "params": 80000}, {"val_acc": 0.96, "params": 80000}, [ACC, SIZE])
    # 1 loses to 4 (same accuracy, smaller); 3 loses to 4; the tie 2/6 stays (neither beats the other)
    assert numbers(pareto_front([ACC, SIZE], POINTS, values)) == [0, 2, 4, 5, 6]


def test_the_pareto_front_is_every_point_nothing_dominates_for_one_to_three_objectives():
    """pareto_front compares each point with the front found so far (in the order of its keys),
    not with every point: the same points, in their order, as the definition gives, ties, NaN
    (never dominated, dominating nothing) and repeated values included."""
    import math
    import random

    goals = [ACC, SIZE, Objective(metric="latency_ms", direction="minimize")]
    rng = random.Random(0)
    for case in range(300):
        k, n = 1 + case % 3, rng.randint(0, 40)
        grid = [0.1, 0.2, 0.3, math.nan] if case % 5 == 0 else [0.1, 0.2, 0.3, 0.4, 0.5]
        points = [(i, {g.metric: rng.choice(grid) for g in goals[:k]}) for i in range(n)]
        brute = [p for p in points if not any(dominates(q[1], p[1], goals[:k]) for q in points)]
        assert pareto_front(goals[:k], points, lambda p: p[1]) == brute, points


@pytest.mark.parametrize(
    "rule, expected",
    [
        (None, 2),  # the first objective's best; a tie goes to the lower trial number
        (Choose(prefer="params"), 5),  # the smallest model, whatever its accuracy
        (Choose(prefer="params", within={"val_acc": 0.01}), 4),  # 0.96 - 0.01: 4 (0.95) is the smallest left
        (Choose(prefer="params", within={"val_acc": "0.5%"}), 2),  # 0.96 * 0.995 = 0.9552: only 2 and 6 are left
        (Choose(prefer="params", within={"val_acc": "10%"}), 0),  # 0.864: 0 (0.90, 5000) is the smallest left
    ],
)
def test_export_choose_picks_the_point_its_rule_names(rule, expected):
    assert choose([ACC, SIZE], rule, POINTS, values)[0] == expected


def test_one_objective_chooses_its_best_as_before():
    points = [(0, 0.5), (1, 0.7), (2, 0.7)]
    assert choose([ACC], None, points, lambda p: {"val_acc": p[1]})[0] == 1
    assert choose([ACC], None, [], lambda p: {}) is None


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {
                "objectives": [{"metric": "val_acc"}, {"metric": "params", "direction": "minimize"}],
                "search.pruner.type": "median",
            },
            "a sweep with objectives trains every trial to its end",
        ),
        ({"objectives": [{"metric": "params"}, {"metric": "latency_ms"}]}, "needs no training"),
        ({"export.choose": {"prefer": "params"}}, "it needs objectives (two or more)"),
        (
            {
                "objectives": [{"metric": "val_acc"}, {"metric": "params", "direction": "minimize"}],
                "export.choose": {"within": {"latency_ms": 1}},
                "search.pruner.type": "none",
            },
            "export.choose names 'latency_ms', which is not an objective",
        ),
        (
            {
                "objectives": [{"metric": "val_acc"}, {"metric": "params", "direction": "minimize"}],
                "search.sampler": "cmaes",
                "search.pruner.type": "none",
            },
            "cmaes optimises one objective",
        ),
    ],
)
def test_bad_objectives_are_user_errors(workdir: Path, change: dict, message: str):
    args = [f"{k}={json.dumps(v)}" for k, v in change.items()]
    proc = sweeper("validate", str(write_spec(workdir / "s.yaml")), *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stdout + proc.stderr


def test_footprint_counts_parameters_and_times_a_forward_pass_when_asked():
    trial = config("model.args.hidden=16")
    parts = build(trial, torch.device("cpu"))
    assert footprint.measure(parts.model, parts.data, trial.spec) == {
        "params": float(sum(p.numel() for p in parts.model.parameters()))
    }  # no latency unless optimised
    dumped = trial.spec.model_dump()
    dumped["search"]["pruner"] = {"type": "none"}
    timed = SweepSpec.model_validate(
        {
            **dumped,
            "objective": None,
            "objectives": [{"metric": "val_acc"}, {"metric": "latency_ms", "direction": "minimize"}],
        }
    )
    measured = footprint.measure(parts.model, parts.data, timed)
    assert measured["latency_ms"] > 0 and parts.model.training  # the model's mode is given back


NSGA2 = {"sampler": "nsga2", "population": 4, "n_trials": 8, "batch_size": 4}


def pareto_spec(path: Path, experiment: str, search: dict) -> Path:
    """smoke.yaml with two objectives (accuracy, parameter count) and sizes worth trading."""
    space = {
        "optimizer.args.lr": {"type": "float", "low": 1.0e-3, "high": 1.0e-1, "log": True},
        "model.args.hidden": {"type": "categorical", "choices": [4, 16, 64]},
    }
    return write_spec(
        path,
        objective=None,
        objectives=[{"metric": "val_acc", "direction": "maximize"}, {"metric": "params", "direction": "minimize"}],
        tracking={"experiment": experiment},
        search={"pruner": {"type": "none"}, "space": space, **search},
        export={
            "formats": ["torchscript"],
            "registered_name": experiment,
            "choose": {"prefer": "params", "within": {"val_acc": 0.05}},
        },
    )


def table(summary: dict) -> list:
    return [(t["number"], t["state"], t["params"], t["values"], t["seed"]) for t in summary["trials"]]


@pytest.fixture(scope="module")
def pareto_runs(tmp_path_factory: pytest.TempPathFactory, mlflow_uri: str) -> dict[str, dict]:
    import os

    os.environ["MLFLOW_TRACKING_URI"] = mlflow_uri
    root = tmp_path_factory.mktemp("pareto")
    out = {}
    for label, parallel in (("one", 1), ("two", 2)):
        spec = pareto_spec(root / f"{label}.yaml", f"pareto-{label}", {**NSGA2, "parallel": parallel})
        sweeper("run", str(spec), "--out", str(root / label), "-q", check=True)
        out[label] = {"summary": json.loads((root / label / "summary.json").read_text()), "out": root / label}
    return out


def test_a_multi_objective_sweep_keeps_its_pareto_front_and_exports_the_chosen_point(pareto_runs, mlflow_uri: str):
    summary, out = pareto_runs["one"]["summary"], pareto_runs["one"]["out"]
    spec = SweepSpec.model_validate(summary["spec"])
    complete = [t for t in summary["trials"] if t["state"] == "complete"]
    assert len(complete) == 8
    for t in complete:  # every objective's value: the last epoch's accuracy, the model's parameter count
        assert t["values"] == {"val_acc": t["history"][-1]["val_acc"], "params": t["footprint"]["params"]}
    sizes = {t["params"]["model.args.hidden"]: t["values"]["params"] for t in complete}
    assert sizes[4] < sizes[16] < sizes[64]  # a count of the mlp's weights, not a constant

    front = [p["number"] for p in summary["pareto_front"]]
    assert front == [t["number"] for t in pareto_front(spec.goals, complete, lambda t: t["values"])]
    for t in complete:  # no trial off the front beats a front point; each one off it is beaten
        beaten = any(dominates(p["values"], t["values"], spec.goals) for p in summary["pareto_front"])
        assert beaten == (t["number"] not in front)

    best_acc = max(t["values"]["val_acc"] for t in complete)
    within = [t for t in complete if t["values"]["val_acc"] >= best_acc - 0.05 and t["number"] in front]
    chosen = min(within, key=lambda t: (t["values"]["params"], -t["values"]["val_acc"], t["number"]))
    assert summary["best"]["number"] == chosen["number"]
    assert summary["best"]["values"] == chosen["values"]
    assert summary["export"]["source"]["trial"] == chosen["number"]
    assert summary["export"]["source"]["objective"] == chosen["values"]
    # the front's checkpoints are kept (any point can be exported later), no other
    assert sorted(int(p.stem.split("-")[1]) for p in (out / "checkpoints").glob("*.pt")) == sorted(front)

    client = MlflowClient(mlflow_uri)
    parent = client.get_run(summary["mlflow"]["parent_run_id"])
    assert parent.data.tags["sweeper.pareto_front"] == ",".join(map(str, front))
    assert parent.data.params["objectives"] == "val_acc (maximize), params (minimize)"
    assert parent.data.metrics["best_params"] == chosen["values"]["params"]
    runs = {r.data.tags["sweeper.trial"]: r for r in children(client, parent.info.run_id)}
    assert runs[str(chosen["number"])].data.metrics["params"] == chosen["values"]["params"]  # a column in the UI
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "plots")}
    assert "plots/pareto.png" in artifacts
    report = (out / "report.html").read_text()
    assert f"Pareto front ({len(front)} of the complete trials)" in report
    assert "Left out" not in report.split("<h3>Pareto front</h3>")[1].split("<h3>")[0]
    version = client.get_model_version_by_alias("pareto-one", "champion")
    assert json.loads(version.tags["sweeper.objective_values"]) == chosen["values"]


def test_the_multi_objective_table_is_the_same_with_one_worker_or_two(pareto_runs):
    one, two = pareto_runs["one"]["summary"], pareto_runs["two"]["summary"]
    assert table(one) == table(two)  # NSGA-II's generations, proposals and every value, bitwise
    assert one["pareto_front"] == [
        dict(p, mlflow_run_id=q["mlflow_run_id"]) for p, q in zip(two["pareto_front"], one["pareto_front"])
    ]


def test_nsga2_breeds_its_second_generation_from_the_first(pareto_runs):
    import optuna

    study = optuna.load_study(study_name="smoke", storage=f"sqlite:///{pareto_runs['one']['out'] / 'optuna.db'}")
    # proposed in batches of the population's size (4): trials 0-3 are generation 0, 4-7 generation 1
    assert [t.system_attrs.get("NSGAIISampler:generation") for t in study.trials] == [0] * 4 + [1] * 4


def test_latency_is_an_objective_measured_on_each_trained_model(workdir: Path):
    spec = write_spec(
        workdir / "s.yaml",
        objective=None,
        tracking={"experiment": "latency"},
        objectives=[{"metric": "val_loss", "direction": "minimize"}, {"metric": "latency_ms", "direction": "minimize"}],
        search={
            "sampler": "tpe",
            "n_trials": 2,
            "pruner": {"type": "none"},
            "space": {"model.args.hidden": {"type": "categorical", "choices": [16, 32]}},
        },
    )
    sweeper("run", str(spec), "--out", "out", "-q", check=True)
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    for t in summary["trials"]:
        assert t["state"] == "complete"
        assert t["values"]["latency_ms"] == t["footprint"]["latency_ms"] > 0
        assert t["values"]["val_loss"] == t["history"][-1]["val_loss"]
    assert summary["best"]["number"] in [p["number"] for p in summary["pareto_front"]]


def test_a_ray_sweep_optimises_several_objectives(workdir: Path):
    spec = pareto_spec(
        workdir / "s.yaml",
        "pareto-ray",
        {"backend": "ray", "sampler": "tpe", "n_trials": 4, "resources": {"cpu": 1}, "ray": {"num_cpus": 2}},
    )
    sweeper("run", str(spec), "--out", "out", "-q", check=True, process=True)
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    complete = [t for t in summary["trials"] if t["state"] == "complete"]
    assert len(complete) == 4
    for t in complete:
        assert set(t["values"]) == {"val_acc", "params"} and t["values"]["params"] == t["footprint"]["params"]
        assert "params" not in t["history"][-1]  # the footprint is not an epoch's metric
    spec_model = SweepSpec.model_validate(summary["spec"])
    assert [p["number"] for p in summary["pareto_front"]] == [
        t["number"] for t in pareto_front(spec_model.goals, complete, lambda t: t["values"])
    ]
    assert (
        summary["best"]["number"]
        == choose(spec_model.goals, spec_model.export.choose, complete, lambda t: t["values"])["number"]
    )
