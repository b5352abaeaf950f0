"""Lessons from earlier sweeps: ``search.warm_start`` seeds a new sweep's sampler with the
finished trials of an earlier one (from its output folder or its study URL), fitted to the new
space, the best few re-evaluated first; and a sweep resumed with a changed search space keeps
its old trials and records the new space as a version."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import optuna
import pytest
import sqlalchemy as sa
from conftest import SPACES, sweeper, write_spec
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState
from pg import pg_url  # noqa: F401 (a fixture: a fresh database per test)

from sweeper.search.optuna import earlier as lessons_of
from sweeper.spec import load

FAST = {"epochs": 1, "batch_size": 32, "device": "cpu"}
# one range test of 20 steps, its suggestion enqueued: the earlier sweep's cache is reused
LR_FINDER = {"enabled": True, "steps": 20, "policy": "enqueue"}
OFF = {"enabled": False}


def search(n_trials: int, **changes: object) -> dict[str, object]:
    return {
        "sampler": "tpe",
        "pruner": {"type": "none"},
        "n_trials": n_trials,
        "space": {
            "optimizer.args.lr": {"type": "float", "low": 1.0e-4, "high": 1.0e-1, "log": True},
            "model.args.hidden": {"type": "categorical", "choices": [16, 32]},
        },
        **changes,
    }


def spec(path: Path, name: str, n_trials: int, tracking: dict[str, object] = OFF, **changes: object) -> Path:
    return write_spec(
        path, name=name, train=FAST, search=search(n_trials, **changes), tracking=tracking, export={"formats": []}
    )


@pytest.fixture(scope="module")
def earlier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An earlier sweep's output folder: 3 trials (the first at the LR finder's suggestion)."""
    out = tmp_path_factory.mktemp("earlier") / "a"
    s = spec(out.parent / "a.yaml", "a", 3, lr_finder=LR_FINDER)
    sweeper("run", str(s), "--out", str(out), "-q", check=True)
    return out


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def observations(out: Path, name: str) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{out / 'optuna.db'}")
    return [t for t in study.get_trials() if "sweeper_earlier" in t.user_attrs]


def test_warm_start_from_a_folder(workdir: Path, earlier: Path):
    before = summary(earlier)
    s = spec(workdir / "b.yaml", "b", 4, lr_finder=LR_FINDER, warm_start=[str(earlier)])
    sweeper("run", str(s), "--out", "b", "-q", check=True)
    after = summary(workdir / "b")

    # every finished earlier trial is an observation of the new study, not one of its trials
    seen = observations(workdir / "b", "b")
    assert [(t.user_attrs["sweeper_earlier"]["trial"], t.params, t.value) for t in seen] == [
        (t["number"], t["params"], t["value"]) for t in before["trials"]
    ]
    assert {t.user_attrs["sweeper_earlier"]["source"] for t in seen} == {str(earlier)}
    assert len(after["trials"]) == 4  # the budget: this sweep's own trials only
    assert after["counts"]["complete"] == 4
    # the best earlier trials are re-evaluated first, with their parameters, in the order best()
    # gives them (the rule: test_the_first_re_evaluated_are_the_best_unless_a_near_best_costs_half)
    found = [
        lessons_of.Lesson(0, t["number"], TrialState.COMPLETE, t["params"], [t["value"]], None, t["device_seconds"])
        for t in before["trials"]
    ]
    ranked = lessons_of.best(load(s), found)
    assert len(ranked) == 3
    assert [t["params"] for t in after["trials"][:3]] == ranked  # then the LR finder's trial
    assert after["warm_start"]["observations"] == 3
    assert after["warm_start"]["re_evaluated"] == ranked
    assert after["best"]["number"] in {t["number"] for t in after["trials"]}  # never an observation
    # the LR warm start reused the earlier sweep's range test (same data, model, optimizer, seed)
    assert after["lr_finder"]["findings"][0]["seconds"] == before["lr_finder"]["findings"][0]["seconds"]
    # the same spec and the same earlier sweep: the same trial table
    sweeper("run", str(s), "--out", "b2", "-q", check=True)
    again = summary(workdir / "b2")
    assert [(t["number"], t["params"], t["value"]) for t in again["trials"]] == [
        (t["number"], t["params"], t["value"]) for t in after["trials"]
    ]


def test_warm_start_from_a_study_url_fits_the_trials_to_the_new_space(workdir: Path, earlier: Path):
    before = summary(earlier)
    # sqlite's backup API: the study may still be in optuna.db-wal (WAL mode, track/sqlite.py)
    source, copy = sqlite3.connect(earlier / "optuna.db"), sqlite3.connect(workdir / "copy.db")
    source.backup(copy)
    source.close(), copy.close()
    url = f"sqlite:///{workdir / 'copy.db'}#a"
    narrower = {
        "optimizer.args.lr": {"type": "float", "low": 1.0e-3, "high": 1.0e-2, "log": True},
        "model.args.hidden": {"type": "categorical", "choices": [32, 64]},
    }
    s = spec(workdir / "c.yaml", "c", 1, space=narrower, warm_start=[url])
    sweeper("run", str(s), "--out", "c", "-q", check=True)
    after = summary(workdir / "c")

    kept = [t for t in before["trials"] if t["params"]["model.args.hidden"] == 32]  # 16 is no longer offered
    seen = observations(workdir / "c", "c")
    assert [t.user_attrs["sweeper_earlier"]["trial"] for t in seen] == [t["number"] for t in kept]
    for obs, t in zip(seen, kept):  # learning rates clipped into the new range
        assert obs.params["optimizer.args.lr"] == min(max(t["params"]["optimizer.args.lr"], 1.0e-3), 1.0e-2)
    assert after["warm_start"]["sources"] == [
        {"source": url, "study": "a", "used": len(kept), "not_fitting": 3 - len(kept)}
    ]
    assert len(after["trials"]) == 1 and after["trials"][0]["params"] == seen[0].params  # the best one, fitted

    # resumed once the source is gone: the sweep read it when it began
    (workdir / "copy.db").unlink()
    sweeper("run", str(s), "search.n_trials=2", "--out", "c", "-q", check=True)
    assert len(summary(workdir / "c")["trials"]) == 2 and len(observations(workdir / "c", "c")) == len(kept)


def test_a_sweep_resumed_with_a_changed_space_keeps_its_old_trials(workdir: Path, mlflow_uri: str):
    tracking = {"experiment": "changed-space"}
    s = spec(workdir / "d.yaml", "d", 2, tracking=tracking)
    sweeper("run", str(s), "--out", "d", "-q", check=True)
    first = summary(workdir / "d")
    assert first["space_version"] == 1

    wider = search(3)["space"]
    wider["optimizer.args.lr"] = {"type": "float", "low": 1.0e-5, "high": 0.3, "log": True}  # type: ignore[index]
    wider["model.args.depth"] = {"type": "int", "low": 1, "high": 2}  # type: ignore[index]
    s = spec(workdir / "d.yaml", "d", 3, tracking=tracking, space=wider)
    sweeper("run", str(s), "--out", "d", "-q", check=True)
    second = summary(workdir / "d")

    assert [t["params"] for t in second["trials"][:2]] == [t["params"] for t in first["trials"]]  # kept
    assert len(second["trials"]) == 3 and "model.args.depth" in second["trials"][2]["params"]
    assert second["space_version"] == 2
    assert [(v["version"], v["first_slot"]) for v in second["space_versions"]] == [(1, 0), (2, 2)]
    engine = sa.create_engine(f"sqlite:///{workdir / 'd' / 'optuna.db'}")
    with engine.connect() as db:
        assert db.execute(sa.text("SELECT count(*) FROM sweeper_spaces WHERE study = 'd'")).scalar() == 2
    engine.dispose()
    study = optuna.load_study(study_name="d", storage=f"sqlite:///{workdir / 'd' / 'optuna.db'}")
    assert study.user_attrs["search_space"]["model.args.depth"] == {
        "type": "int",
        "low": 1,
        "high": 2,
        "log": False,
        "step": 1,
    }
    parent = MlflowClient(mlflow_uri).get_run(second["mlflow"]["parent_run_id"])
    assert parent.data.tags["sweeper.space_version"] == "2"

    # a change the study cannot hold beside the old trials: refused, naming the parameter
    changed = {**wider, "model.args.hidden": {"type": "categorical", "choices": [16, 64]}}
    s = spec(workdir / "d.yaml", "d", 4, tracking=tracking, space=changed)
    proc = sweeper("run", str(s), "--out", "d", "-q")
    assert proc.returncode == 2
    assert "search.space.model.args.hidden: its choices changed from [16, 32] to [16, 64]" in proc.stderr
    assert "search.warm_start" in proc.stderr


def test_warm_start_sources_that_cannot_be_read_are_refused(workdir: Path, earlier: Path):
    cases = {
        "missing": (["nowhere"], "search.warm_start[0]: 'nowhere': no such folder"),
        "not a sweep": ([str(workdir)], "not a sweep's output folder"),
        "no such study": ([f"sqlite:///{earlier / 'optuna.db'}#zz"], "holds no study 'zz'; it holds: a"),
        "no database": ([f"sqlite:///{workdir / 'none.db'}"], "search.warm_start[0]: no study database at"),
        "no experiment": (["mlflow:nowhere"], "search.warm_start[0]: no MLflow experiment 'nowhere' at"),
        "unnamed experiment": (["mlflow:"], "name the MLflow experiment (mlflow:EXPERIMENT)"),
    }
    for case, (sources, message) in cases.items():
        s = spec(workdir / "e.yaml", "e", 1, warm_start=sources)
        proc = sweeper("validate", str(s))
        assert proc.returncode == 2 and message in proc.stderr, case
        assert not (workdir / "none.db").exists()
    # the sweep itself: refused by `sweeper run`, before anything runs
    s = spec(workdir / "a.yaml", "a", 4, warm_start=[str(earlier)])
    proc = sweeper("run", str(s), "--out", str(earlier), "-q")
    assert proc.returncode == 2 and "that is this sweep's own study" in proc.stderr
    # another objective: its values do not compare
    s = spec(workdir / "e.yaml", "e", 1, warm_start=[str(earlier)])
    proc = sweeper("validate", str(s), "objective={metric: val_loss, direction: minimize}")
    assert proc.returncode == 2 and "its values do not compare" in proc.stderr
    s = spec(workdir / "e.yaml", "e", 1, warm_start=[str(earlier)], backend="ray")
    proc = sweeper("validate", str(s))
    assert proc.returncode == 2 and "search.warm_start is an Optuna backend option" in proc.stderr
    s = spec(workdir / "e.yaml", "e", 1, warm_start=[str(earlier)], sampler="grid")
    proc = sweeper("validate", str(s))
    assert proc.returncode == 2 and "the grid sampler visits each point of its grid once" in proc.stderr


def test_an_earlier_trial_is_fitted_to_the_new_space():
    from sweeper.spec import space as sp

    space = {
        "a": sp.IntParam(type="int", low=2, high=10, step=2),
        "b": sp.FloatParam(type="float", low=0.0, high=1.0, step=0.25),
        "c": sp.CategoricalParam(type="categorical", choices=["x", "y"]),
        "d": sp.FloatParam(type="float", low=1.0, high=2.0, when={"c": "y"}),
    }
    assert sp.fit(space, {"a": 7.6, "b": 0.6, "c": "x", "d": 1.5, "gone": 3}) == {"a": 8, "b": 0.5, "c": "x"}
    assert sp.fit(space, {"a": 99, "b": -1.0, "c": "y", "d": 5.0}) == {"a": 10, "b": 0.0, "c": "y", "d": 2.0}
    assert sp.fit(space, {"a": 4, "c": "z"}) is None  # a choice no longer offered: says nothing here
    assert sp.fit(space, {"a": 4, "c": True}) is None and sp.fit(space, {"gone": 1}) is None
    assert sp.fit(space, {"b": 0.3}) == {"b": 0.25}  # a parameter it lacks: the sampler draws it


def test_an_earlier_sweep_in_postgresql_gives_the_same_lessons(workdir: Path, earlier: Path, pg_url: str):
    optuna.copy_study(from_study_name="a", from_storage=f"sqlite:///{earlier / 'optuna.db'}", to_storage=pg_url)
    from_folder = load(spec(workdir / "f.yaml", "f", 1, warm_start=[str(earlier)]), [])
    from_pg = load(spec(workdir / "g.yaml", "g", 1, warm_start=[f"{pg_url}#a"]), [])
    folder_lessons, _ = lessons_of.lessons(from_folder)
    pg_lessons, read = lessons_of.lessons(from_pg)
    assert [(x.number, x.params, x.values) for x in pg_lessons] == [
        (x.number, x.params, x.values) for x in folder_lessons
    ]
    assert read["sources"] == [{"source": f"{pg_url}#a", "study": "a", "used": 3}]
    proc = sweeper("validate", str(workdir / "g.yaml"), f"search.warm_start=['{pg_url}#zz']")
    assert proc.returncode == 2 and "search.warm_start[0]: " in proc.stderr and "holds no study 'zz'" in proc.stderr


def test_an_earlier_sweep_in_mlflow_gives_the_same_lessons_as_its_folder(workdir: Path, mlflow_uri: str):
    """``mlflow:EXPERIMENT`` reads the trial runs an earlier sweep logged: the same lessons (numbers,
    parameters typed by the space, values) as its study, which may be gone."""
    tracked = {"enabled": True, "mlflow_uri": mlflow_uri, "experiment": "earlier-in-mlflow"}
    sweeper("run", str(spec(workdir / "m.yaml", "m", 3, tracking=tracked)), "--out", "m", "-q", check=True)
    from_folder = load(spec(workdir / "f.yaml", "f", 1, warm_start=["m"]), [])
    from_mlflow = load(spec(workdir / "g.yaml", "g", 1, warm_start=["mlflow:earlier-in-mlflow"]), [])
    folder_lessons, _ = lessons_of.lessons(from_folder)
    shutil.rmtree("m")  # the study is gone: MLflow still has what it learnt
    mlflow_lessons, read = lessons_of.lessons(from_mlflow)
    assert len(folder_lessons) == 3
    assert [(x.number, x.state, x.params, x.values) for x in mlflow_lessons] == [
        (x.number, x.state, x.params, x.values) for x in folder_lessons
    ]
    assert read["sources"] == [{"source": "mlflow:earlier-in-mlflow", "experiment": "earlier-in-mlflow", "used": 3}]
    # a sweep that logs to that very experiment would learn from itself
    own = spec(workdir / "h.yaml", "h", 1, tracking=tracked, warm_start=["mlflow:earlier-in-mlflow"])
    proc = sweeper("validate", str(own))
    assert proc.returncode == 2 and "is where this sweep logs its own trials" in proc.stderr
    # and a sweep warm-started from it runs, its first trial the best earlier one
    s = spec(
        workdir / "w.yaml", "w", 2, tracking=tracked | {"experiment": "w"}, warm_start=["mlflow:earlier-in-mlflow"]
    )
    sweeper("run", str(s), "--out", "w", "-q", check=True)
    assert summary(Path("w"))["warm_start"]["observations"] == 3


def test_the_first_re_evaluated_are_the_best_unless_a_near_best_costs_half():
    spec = load(SPACES / "smoke.yaml")  # maximizes val_acc

    def lesson(number: int, value: float, seconds: float | None) -> lessons_of.Lesson:
        return lessons_of.Lesson(0, number, TrialState.COMPLETE, {"x": number}, [value], None, seconds)

    found = [
        lesson(0, 0.90, 1.0),
        lesson(1, 0.990, 30.0),
        lesson(2, 0.985, 5.0),  # near-best at a quarter of the best's cost: first
        lesson(3, 0.992, 20.0),  # the best; 1 % below it: 0.982
        lesson(4, 0.95, 0.5),  # cheapest of all, but not near-best
        lesson(5, 0.991, None),  # near-best, its cost not recorded (an MLflow source): by its value
        lesson(7, 0.989, 15.0),  # cheaper than the best by less than half (timing noise): not before it
        lessons_of.Lesson(0, 6, TrialState.PRUNED, {"x": 6}, [0.999], 2, 0.1),  # pruned: never re-evaluated
    ]
    assert lessons_of.best(spec, found) == [{"x": 2}, {"x": 3}, {"x": 5}]
    # 7 costs half of 1: before it; then the others, best first
    assert lessons_of.best(spec, found, k=7) == [{"x": n} for n in (2, 3, 5, 7, 1, 4, 0)]
    # trials that recorded no time (0 s) end the walk down to cheaper ones: it never loops
    free = [lesson(8, 0.99, 0.0), lesson(9, 0.99, 0.0), lesson(10, 0.991, 3.0)]
    assert lessons_of.best(spec, free) == [{"x": 8}, {"x": 9}, {"x": 10}]
    # the sweep's own first trials (its base point, ...) that an earlier trial measured are not run again
    assert lessons_of.unmeasured(found, [{"x": 4}, {"x": 9}]) == [{"x": 9}]


def test_a_warm_started_sweep_runs_the_base_point_once(workdir: Path):
    """Both sweeps start at the base point (search.base_first): the earlier one measured it, so
    the new one re-evaluates it among the best and does not enqueue it again on its own."""
    s = spec(workdir / "p.yaml", "p", 2, base_first=True)
    sweeper("run", str(s), "--out", "p", "-q", check=True)
    base = summary(workdir / "p")["trials"][0]["params"]
    assert base == {"optimizer.args.lr": 1.0e-2, "model.args.hidden": 32}  # smoke's own values
    s = spec(workdir / "q.yaml", "q", 3, base_first=True, warm_start=[str(workdir / "p")])
    sweeper("run", str(s), "--out", "q", "-q", check=True)
    after = summary(workdir / "q")
    assert after["warm_start"]["measured_already"] == [base]
    assert after["warm_start"]["re_evaluated"] == [t["params"] for t in after["trials"][:2]]
    assert [t["params"] for t in after["trials"]].count(base) == 1
