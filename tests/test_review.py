"""Reviewing a sweep: what the MLflow UI reads of it (the experiment's kind, the data set as the
sweep run's input, the search space and objective, trial runs that sort) and optuna-dashboard
served by `sweeper dashboard` over the sweep's study, with the objective named."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from conftest import children, sweeper, wait_for, write_spec
from mlflow.tracking import MlflowClient
from mlflow_server import free_port


@pytest.fixture(scope="module")
def reviewed(tmp_path_factory: pytest.TempPathFactory, mlflow_uri: str) -> Path:
    """The output folder of one tracked sweep of 3 trials, which the MLflow UI and optuna-dashboard read."""
    root = tmp_path_factory.mktemp("reviewed")
    spec = write_spec(root / "s.yaml", tracking={"experiment": "review-ui"})
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
        sweeper("run", str(spec), "search.n_trials=3", "train.epochs=2", "--out", str(root / "out"), "-q", check=True)
    return root / "out"


def test_the_mlflow_ui_reads_a_sweep_as_model_training(reviewed: Path, mlflow_uri: str):
    summary = json.loads((reviewed / "summary.json").read_text())
    client = MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name("review-ui")
    # MLflow 3's UI opens it on its training runs, not on the GenAI traces overview
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"

    parent = client.get_run(summary["mlflow"]["parent_run_id"])
    (dataset,) = [d.dataset for d in parent.inputs.dataset_inputs]  # the Dataset column
    assert dataset.name == "synthetic" and len(dataset.digest) == 16
    assert json.loads(dataset.profile) == {"train": 256, "val": 64, "classes": 3, "input_shape": [1, 4, 4]}
    assert json.loads(dataset.source)["args"]["num_train"] == 256
    params = parent.data.params
    assert params["objective"] == "val_acc" and params["direction"] == "maximize"
    assert json.loads(params["space.optimizer.args.lr"]) == {"type": "float", "low": 1e-4, "high": 0.1, "log": True}
    assert json.loads(params["space.model.args.hidden"])["choices"] == [16, 32]

    # the registered best model is logged on the sweep's run (the Models column)
    models = client.search_logged_models([experiment.experiment_id])
    assert [m.source_run_id for m in models] == [parent.info.run_id]

    trials = children(client, parent.info.run_id)
    names = sorted(r.info.run_name for r in trials)
    assert names == ["trial-00000", "trial-00001", "trial-00002"]  # zero-padded: they sort by number
    digests = {r.data.tags["sweeper.data_fingerprint"] for r in trials}
    assert digests == {dataset.digest}  # the input is the data the trials trained on


def test_dashboard_serves_the_sweeps_study_with_its_objective_named(reviewed: Path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sweeper", "dashboard", str(reviewed), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # it says where it serves before it starts
        assert f"http://127.0.0.1:{port}/dashboard/studies/" in line, line

        def answers() -> bool:
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5).status == 200
            except OSError:
                return False

        wait_for(answers, proc, what="optuna-dashboard answering")
        studies = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies").read())
        (study,) = [s for s in studies["study_summaries"] if s["study_name"] == "smoke"]
        detail = json.loads(
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/{study['study_id']}?after=0").read()
        )
        assert detail["objective_names"] == ["val_acc"]  # not "Objective 0"
        assert len(detail["trials"]) == 3
        attrs = {a["key"]: a["value"] for a in detail["user_attrs"]}
        assert "optimizer.args.lr" in json.loads(attrs["search_space"])
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_validate_estimate_times_steps_and_bounds_the_sweep(workdir: Path):
    import re

    from sweeper.plan.estimate import Estimate

    spec = write_spec(workdir / "s.yaml", tracking={"enabled": False})
    out = sweeper(
        "validate", str(spec), "search.n_trials=5", "search.parallel=2", "train.epochs=3", "--estimate", check=True
    ).stdout
    step, evaluation, steps = re.search(
        r"([\d.]+) ms a step, ([\d.]+) ms an evaluation, (\d+) steps an epoch", out
    ).groups()
    assert int(steps) == 8  # 256 training samples, batches of 32
    # smoke's splits: 320 samples of 1x4x4 float32 and their int64 classes, 22.5 KiB
    assert "# data path: tensors (whole splits on the device); the splits hold 22.5 KiB on cpu" in out
    trial = float(re.search(r"# a trial: ([\d.]+) s \(3 epochs\)", out).group(1))
    assert abs(trial - 3 * (8 * float(step) + float(evaluation)) / 1000) <= 0.1  # the printed figures' rounding
    bound = float(re.search(r"5 trials, 2 side by side\): at most ([\d.]+) s", out).group(1))
    assert abs(bound - 3 * trial) <= 0.2  # ceil(5 / 2) rounds of trials, none pruned
    # the bound's arithmetic, and search.timeout capping it
    est = Estimate("cpu", 1, step_s=0.01, eval_s=0.1, steps_per_epoch=10, epochs=4, trials=9, workers=4, timeout_s=None)
    assert est.trial_s == 4 * (10 * 0.01 + 0.1) and est.sweep_bound_s == 3 * est.trial_s
    capped = Estimate("cpu", 1, 0.01, 0.1, 10, 4, trials=None, workers=1, timeout_s=60.0)
    assert capped.sweep_bound_s == 60.0 and "(search.timeout)" in capped.describe()


def test_the_sweeps_run_holds_its_report_and_plots_and_sweeper_report_writes_it_again(workdir: Path, mlflow_uri: str):
    # a grid of 4: lr 1e12 fails (a non-finite loss); hidden varies among the complete ones, lr does not
    spec = write_spec(
        workdir / "s.yaml",
        optimizer={"plugin": "sgd", "args": {"lr": 0.1}},
        schedule={"plugin": "none"},
        search={
            "sampler": "grid",
            "n_trials": 4,
            "space": {
                "optimizer.args.lr": {"type": "categorical", "choices": [0.05, 1.0e12]},
                "model.args.hidden": {"type": "categorical", "choices": [16, 32]},
            },
        },
        tracking={"experiment": "review-report"},
    )
    sweeper("run", str(spec), "--out", "out", "-q", check=True)
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    assert summary["counts"] == {"complete": 2, "failed": 2}
    client = MlflowClient(mlflow_uri)
    parent = summary["mlflow"]["parent_run_id"]
    assert "report.html" in {a.path for a in client.list_artifacts(parent)}
    pngs = {a.path for a in client.list_artifacts(parent, "plots")}
    assert pngs == {f"plots/{n}.png" for n in ("history", "intermediate", "importance", "parallel", "slice")}
    png = Path(client.download_artifacts(parent, "plots/history.png", str(workdir)))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    page = (workdir / "out" / "report.html").read_text()
    assert "Trials (4)" in page and page.count("non-finite loss") >= 2 * 2  # the table and the failures
    assert "Left out: needs two parameters that vary" in page  # the contour: lr is the same in every complete one
    assert page.count("Plotly.newPlot(") == 5 and page.count("* plotly.js v") == 1  # its script once, inline
    assert "<script src=" not in page  # nothing fetched: it opens without a network
    assert "torchscript" in page and "max |eager - exported|" in page

    # again, from the folder and from the run: the same trial table
    sweeper("report", "out", "--out", "again.html", check=True)
    sweeper("report", parent, "--out", "from-mlflow.html", check=True)
    for name in ("again.html", "from-mlflow.html"):
        other = (workdir / name).read_text()
        assert _rows(other) == _rows(page) and other.count("Plotly.newPlot(") == 5
    wrong = sweeper("report", str(workdir / "nowhere"))
    assert wrong.returncode == 2 and "neither a folder nor a sweep's MLflow run" in wrong.stderr


def _rows(page: str) -> list[str]:
    import re

    return re.findall(r"<tr><td>\d+</td>.*?</tr>", page)


@pytest.mark.parametrize("clock_left_s", [None, 0.0])
def test_a_running_sweeps_report_is_redrawn_every_k_ended_trials(
    workdir: Path, mlflow_uri: str, clock_left_s: float | None
):
    """Every 2 ended trials the report is redrawn; none is under search.budget's clock when it
    would end past the trials' end (``clock_left_s`` 0: the final report must not wait for it)."""
    import time

    from sweeper.search.interim import InterimReview
    from sweeper.spec import load
    from sweeper.track.mlflow import Tracker
    from sweeper.track.records import TrialEvent, TrialRecord

    spec = load(write_spec(workdir / "s.yaml", tracking={"experiment": "review-interim", "review_every": 2}))
    tracker = Tracker(mlflow_uri, "review-interim", workdir / "journal", asynchronous=True)
    parent = tracker.start_run("interim", params={})
    seen: list[TrialEvent] = []

    class Inner:
        def started(self, spec, out_dir): ...
        def note(self, text): ...
        def event(self, event):
            seen.append(event)

    until = None if clock_left_s is None else time.time() + clock_left_s
    review = InterimReview(Inner(), spec, tracker, parent, until, draw_s=1.0)
    for n, (lr, hidden) in enumerate([(0.01, 16), (0.001, 32), (0.05, 32), (0.002, 16), (0.02, 16)]):
        history = [{"val_acc": 0.5 + 0.1 * epoch * (n + 1) / 5, "val_loss": 1.0 / epoch} for epoch in (1, 2, 3)]
        record = TrialRecord(
            number=n,
            state="complete",
            params={"optimizer.args.lr": lr, "model.args.hidden": hidden},
            value=history[-1]["val_acc"],
            values={"val_acc": history[-1]["val_acc"]},
            epochs=3,
            history=history,
        )
        review.event(TrialEvent.start(n))
        review.event(TrialEvent.end(record))
    assert review.close() is None
    tracker.drain()
    assert len(seen) == 10  # everything reaches the display as before
    run = MlflowClient(mlflow_uri).get_run(tracker.real_id(parent))
    if until is not None:
        assert "sweeper.review_trials" not in run.data.tags  # not one drawing: none would end in time
        return
    covered = int(run.data.tags["sweeper.review_trials"])
    assert covered in (4, 5)  # the last boundary (every 2), or the trials ended by the time it was drawn
    client = MlflowClient(mlflow_uri)
    assert {"plots/history.png", "plots/importance.png"} <= {
        a.path for a in client.list_artifacts(run.info.run_id, "plots")
    }
    page = Path(client.download_artifacts(run.info.run_id, "report.html", str(workdir))).read_text()
    assert f"running: {covered} trials so far" in page and f"Trials ({covered})" in page
