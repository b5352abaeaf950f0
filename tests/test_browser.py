"""The review surfaces in a real browser: Debian's Chromium, headless, driven by playwright (its
own browser download is never used). An MLflow server on loopback over a finished sweep, the
link sweeper prints, optuna-dashboard from `sweeper dashboard`, and the sweep's report.html
from disk. Screenshots go to the test's folder; with $SWEEPER_SCREENSHOTS set, also there (how
docs/*.png are made: `SWEEPER_SCREENSHOTS=docs ./dev test tests/test_browser.py`).

Without Chromium the test is skipped, unless $SWEEPER_REQUIRE_BROWSER is set (.ci/run sets it
and installs Chromium): then it fails."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SPACES, sweeper, wait_for
from mlflow_server import MlflowServer, free_port, stop_group

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
EPOCHS = 3
WAIT_MS = 120_000  # a bound for a broken page only: every wait is for content to appear


@pytest.fixture
def browser():
    if CHROMIUM is None:
        if os.environ.get("SWEEPER_REQUIRE_BROWSER"):
            pytest.fail("Chromium is not installed (apt-get install chromium); $SWEEPER_REQUIRE_BROWSER is set")
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


def shot(page, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / name))
    if os.environ.get("SWEEPER_SCREENSHOTS"):
        folder = Path(os.environ["SWEEPER_SCREENSHOTS"])
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / name, folder / name)


def test_a_sweep_reviewed_in_the_mlflow_ui_optuna_dashboard_and_its_report(
    browser, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    server = MlflowServer(tmp_path / "mlflow")
    (tmp_path / "mlflow").mkdir()
    server.start()
    try:
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
        run = sweeper(
            "run",
            str(SPACES / "smoke.yaml"),
            "search.n_trials=3",
            f"train.epochs={EPOCHS}",
            "search.pruner.type=none",
            "tracking.experiment=browser",
            "--out",
            "out",
            "-q",
            check=True,
        )
        summary = json.loads((tmp_path / "out" / "summary.json").read_text())
        link = next(w for w in run.stdout.split() if w.startswith(server.url) and "workflowType" in w)
        page = browser.new_page(viewport={"width": 1600, "height": 900})
        page.set_default_timeout(WAIT_MS)

        # the link sweeper prints opens the experiment on its runs: the sweep's run, its data set
        page.goto(link)
        parent = page.locator("[role=row]", has_text="smoke").first
        parent.wait_for()
        assert "/runs" in page.url and page.get_by_text("synthetic (").count() >= 1
        # it expands to its trials' runs
        parent.locator("button[data-component-id$='runnamecellrenderer.tsx_46']").click()
        for number in range(3):
            page.get_by_text(f"trial-{number:05d}", exact=True).wait_for()
        shot(page, tmp_path, "mlflow-runs.png")

        # a trial's val_acc chart: one point an epoch
        trial = summary["trials"][0]["mlflow_run_id"]
        page.goto(
            f"{server.url}/#/experiments/{_experiment_id(link)}/runs/{trial}/model-metrics"
            "?workflowType=machine_learning"
        )
        page.get_by_placeholder("Search metric charts").fill("val_acc")  # that chart alone
        charts = page.locator(".js-plotly-plot")
        wait_for(
            lambda: charts.count() == 1 and charts.first.locator(".scatterlayer path.point").count() == EPOCHS,
            what=f"the val_acc chart alone, with {EPOCHS} points",
        )
        shot(page, tmp_path, "mlflow-trial-metrics.png")

        # the registered model carries the champion alias
        page.goto(f"{server.url}/#/models/smoke")
        page.get_by_text("champion").first.wait_for()
        shot(page, tmp_path, "mlflow-model.png")

        # optuna-dashboard on the study: its trials, the objective named
        port = free_port()
        dash = subprocess.Popen(
            [sys.executable, "-m", "sweeper", "dashboard", "out", "--port", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            url = next(w for w in dash.stdout.readline().split() if w.startswith("http://"))
            wait_for(lambda: _answers(url), dash, what="optuna-dashboard answering")
            page.goto(url)
            page.get_by_text(f"Best Trial (number={summary['best']['number']})").wait_for()
            assert page.get_by_text("val_acc").count() >= 1  # the objective named, not "Objective 0"
            history = page.locator(".js-plotly-plot").first  # the optimization history: a point a trial
            wait_for(lambda: history.locator(".scatterlayer path.point").count() == 3, what="3 trials in the history")
            shot(page, tmp_path, "optuna-dashboard.png")
        finally:
            stop_group(dash)

        # the report, from disk: every plot drawn
        report = tmp_path / "out" / "report.html"
        figures = report.read_text().count("Plotly.newPlot(")
        assert figures >= 5  # all but the contour, which needs two parameters that vary
        page.goto(report.as_uri())
        plots = page.locator(".js-plotly-plot")
        wait_for(
            lambda: plots.count() == figures and page.locator(".js-plotly-plot .main-svg").count() >= figures,
            what="the report's plots drawn",
        )
        page.get_by_text("Trials (3)").wait_for()
        shot(page, tmp_path, "report.png")
    finally:
        server.stop()


def _experiment_id(link: str) -> str:
    return link.split("/#/experiments/")[1].split("/")[0].split("?")[0]


def _answers(url: str) -> bool:
    import urllib.request

    try:
        return urllib.request.urlopen(url, timeout=5).status == 200
    except OSError:
        return False
