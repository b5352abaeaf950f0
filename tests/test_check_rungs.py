"""Issue #55, goal 1 on diabetes: `search.pruner.check_rungs`. The pruner stops no trial until that
many have completed, and never at an epoch whose values ranked those uncut trials unlike their
final values (a Spearman correlation under CHECKED_RHO): where early epochs do not predict the end
(an MLP that overfits), a rung there would stop good trials as often as bad ones."""

from __future__ import annotations

import json
import math
from pathlib import Path

import optuna
from conftest import SPACES, sweeper, write_spec
from optuna.trial import TrialState, create_trial

from sweeper.review.study_view import distribution
from sweeper.search.optuna.batches import CHECKED_RHO, EarlierBatches, _spearman
from sweeper.search.optuna.study import BATCH, SLOT
from sweeper.spec import load

CURVES = [  # 4 trials over 3 epochs: epoch 1 ranks them backwards, epoch 2 as they end
    [0.9, 0.2, 0.2],
    [0.8, 0.4, 0.4],
    [0.7, 0.6, 0.6],
    [0.6, 0.8, 0.8],
]


def _study(spec, curves: list[list[float]]) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    lr = distribution(spec.search.space["optimizer.args.lr"])
    for slot, curve in enumerate(curves):
        study.add_trial(
            create_trial(
                state=TrialState.COMPLETE,
                value=curve[-1],
                params={"optimizer.args.lr": 1e-3 * (slot + 1)},
                distributions={"optimizer.args.lr": lr},
                intermediate_values=dict(enumerate(curve, start=1)),
                user_attrs={SLOT: slot, BATCH: slot},
            )
        )
    return study


def test_an_epoch_that_ranks_the_uncut_trials_unlike_their_end_stops_nothing():
    spec = load(SPACES / "smoke.yaml", ["search.pruner={type: asha, check_rungs: 4}", "search.batch_size=1"])
    batches = EarlierBatches(spec, _study(spec, CURVES), [])
    assert math.isnan(batches.spared(3, 1)) and math.isnan(batches.spared(3, 2))  # 3 complete: all uncut
    batches = EarlierBatches(spec, _study(spec, CURVES), [])
    assert batches.spared(4, 1) == _spearman([0.9, 0.8, 0.7, 0.6], [0.2, 0.4, 0.6, 0.8]) == -1.0
    assert batches.spared(4, 2) is None  # epoch 2 predicts the end: its cuts stand
    assert _spearman([1, 2, 2, 3], [1, 2, 3, 4]) > CHECKED_RHO > _spearman([1, 1, 1, 1], [1, 2, 3, 4])


def test_no_trial_is_stopped_before_enough_ran_uncut_and_the_user_is_told_which_epochs(tmp_path: Path, workdir: Path):
    spec = write_spec(
        tmp_path / "check.yaml",
        train={"epochs": 9, "batch_size": 32, "device": "cpu"},
        search={
            "sampler": "random",
            "pruner": {"type": "asha", "min_epochs": 1, "reduction_factor": 3, "check_rungs": 4},
            "n_trials": 12,
            "batch_size": 1,
            "space": {"optimizer.args.lr": {"type": "float", "low": 1.0e-4, "high": 1.0e-1, "log": True}},
        },
        export={"formats": []},
    )
    ran = sweeper("run", str(spec), "--out", "out", check=True)
    trials = json.loads((tmp_path / "out" / "summary.json").read_text())["trials"]
    complete = [t["number"] for t in trials if t["state"] == "complete"]
    assert len(complete) >= 4
    assert all(t["state"] != "pruned" for t in trials if t["number"] <= complete[3])  # the first 4 ran uncut
    for line in ran.stdout.splitlines() + ran.stderr.splitlines():
        if "search.pruner.check_rungs: epoch" in line:  # an epoch spared: nobody stopped there later
            epoch = int(line.split("epoch ")[1].split("'")[0])
            assert not [t for t in trials if t["state"] == "pruned" and len(t["history"]) == epoch]
