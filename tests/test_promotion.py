"""Issue #55 item 2 at the pruner's rungs: with `search.pruner.promote` a trial the pruner stops
pauses with its training state, and a later batch continues each paused trial that the pruner's
own rule, applied again to the earlier batches' trials, now keeps (ASHA's promotion), from that
state: bitwise the run it would have been uninterrupted, with the same trial table for 1 and 2
workers. Settings under which nothing could be promoted are refused before any training."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import learned, sweeper, write_spec

PROMOTE = {
    "train": {"epochs": 9, "batch_size": 32, "device": "cpu"},
    "search": {
        "sampler": "random",
        "pruner": {"type": "asha", "min_epochs": 1, "reduction_factor": 3, "promote": True},
        "n_trials": 16,
        "space": {"optimizer.args.lr": {"type": "float", "low": 1.0e-4, "high": 1.0e-1, "log": True}},
    },
    "export": {"formats": []},
}
PROMOTED = re.compile(r"promoted from trial (\d+) paused at epoch (\d+) \(resumed from its state\)")


def test_a_paused_trial_continues_from_its_state_with_one_table_for_any_workers(tmp_path: Path, workdir: Path):
    spec = write_spec(tmp_path / "promote.yaml", **PROMOTE)
    tables = {}
    for parallel in (1, 2):
        out = tmp_path / f"p{parallel}"
        sweeper("run", str(spec), f"search.parallel={parallel}", "--out", str(out), "-q", check=True)
        trials = json.loads((out / "summary.json").read_text())["trials"]
        tables[parallel] = [(t["number"], t["state"], t["params"], t["reason"], learned(t["history"])) for t in trials]
    assert tables[1] == tables[2]
    by_number = {t["number"]: t for t in trials}
    promoted = [(t, PROMOTED.search(t["reason"] or "")) for t in trials]
    promoted = [(t, by_number[int(m[1])], int(m[2])) for t, m in promoted if m]
    assert promoted, [t["reason"] for t in trials]
    for t, paused, epoch in promoted:
        assert paused["number"] < t["number"] and paused["state"] == "pruned"
        assert paused["reason"].startswith(f"pruned at epoch {epoch} by the asha pruner")
        assert t["params"] == paused["params"] and t["seed"] == paused["seed"]
        # the paused trial's epochs carried on, then trained on from the state it paused with
        assert learned(t["history"][:epoch]) == learned(paused["history"]) and len(t["history"]) > epoch
    assert len({paused["number"] for _, paused, _ in promoted}) == len(promoted)  # each paused trial once
    # resumed at the rung, bitwise the run it would have been uninterrupted: replayed from epoch 1
    # without a pause, every epoch's metrics are equal
    first = promoted[0][0]
    replayed = sweeper("replay", first["mlflow_run_id"])
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert f"trial {first['number']} reproduced" in replayed.stdout and "bitwise" in replayed.stdout


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["search.reproducible=false"], "search.pruner.promote needs search.reproducible: true"),
        (["search.pruner.type=none"], "a pruner of type auto, median, asha, hyperband (got none)"),
        (["search.backend=ray"], "search.pruner.promote is an Optuna backend option"),
        (
            ["search.pruner.promote=false", "search.pruner.check_rungs=4", "search.reproducible=false"],
            "search.pruner.check_rungs needs search.reproducible: true",
        ),
    ],
)
def test_promotion_where_nothing_could_be_promoted_is_refused(
    tmp_path: Path, workdir: Path, overrides: list[str], expected: str
):
    spec = write_spec(tmp_path / "promote.yaml", **PROMOTE)
    proc = sweeper("run", str(spec), *overrides, "--out", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in proc.stdout + proc.stderr
    assert not (tmp_path / "out" / "summary.json").exists()
