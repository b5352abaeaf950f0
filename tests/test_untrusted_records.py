"""A trial.json on the MLflow server is written by whoever can write there: `sweeper export RUN_ID`
reads only a checkpoint inside the sweep's output folder (after symlinks and '..') unless the user
passes --checkpoint, and writes only where the user says, into a real sweeper folder, or here."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import sweeper, write_spec
from mlflow.tracking import MlflowClient

from sweeper.errors import UserError
from sweeper.export.trial_run import export_trial
from sweeper.track.records import TRIAL_JSON


def forge(client: MlflowClient, genuine: str, **changes: str) -> str:
    """A new completed run in the genuine run's experiment whose trial.json differs by ``changes``."""
    with tempfile.TemporaryDirectory() as tmp:
        record = json.loads(Path(client.download_artifacts(genuine, TRIAL_JSON, tmp)).read_text())
    run = client.create_run(client.get_run(genuine).info.experiment_id, tags={"sweeper.state": "complete"})
    client.log_dict(run.info.run_id, {**record, **changes}, TRIAL_JSON)
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def test_export_refuses_checkpoint_paths_outside_the_sweep_folder(workdir: Path, mlflow_uri: str):
    spec = write_spec(
        workdir / "s.yaml",
        search={"n_trials": 1, "sampler": "random"},
        tracking={"experiment": "untrusted"},
        export={"formats": ["torchscript"]},
    )
    sweeper("run", str(spec), "train.epochs=1", "--out", "out", "-q", check=True)
    summary = json.loads((workdir / "out" / "summary.json").read_text())
    genuine, out = summary["trials"][0]["mlflow_run_id"], (workdir / "out").resolve()
    ckpt = out / "checkpoints" / "trial-00000.pt"
    elsewhere = workdir / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(ckpt, elsewhere / "trial.pt")  # a loadable checkpoint: only the path may stop it
    (out / "checkpoints" / "link.pt").symlink_to(elsewhere / "trial.pt")
    client = MlflowClient(mlflow_uri)
    escapes = {
        "dot-dot": f"{out}/checkpoints/../../elsewhere/trial.pt",
        "absolute": str(elsewhere / "trial.pt"),
        "symlink": str(out / "checkpoints" / "link.pt"),
    }
    before = listing(out), listing(elsewhere)
    for how, path in escapes.items():
        forged = forge(client, genuine, checkpoint=path)
        with pytest.raises(UserError) as info:
            export_trial(forged, mlflow_uri, None, None)
        assert path in str(info.value) and "outside the sweep's output folder" in str(info.value), how
        assert "--checkpoint PATH" in str(info.value)
    assert (listing(out), listing(elsewhere)) == before and not list(workdir.glob("export-trial-*"))  # nothing written

    # the CLI: exit 2 naming the path; --checkpoint (the user's choice) is trusted
    proc = sweeper("export", forged, "--out", "chosen")
    assert proc.returncode == 2 and escapes["symlink"] in proc.stderr and not (workdir / "chosen").exists()
    sweeper("export", forged, "--checkpoint", str(elsewhere / "trial.pt"), "--out", "chosen", check=True)
    assert json.loads((workdir / "chosen" / "export.json").read_text())["source"]["checkpoint"] == str(
        elsewhere / "trial.pt"
    )

    # a record whose out_dir is not a sweeper folder (no spec.yaml): the export lands here, not there
    forged = forge(client, genuine, out_dir=str(elsewhere), checkpoint=str(elsewhere / "trial.pt"))
    report = export_trial(forged, mlflow_uri, None, None)
    assert Path(report["json"]).resolve() == workdir / "export-trial-0" / "export.json"
    assert listing(elsewhere) == before[1]
    # an artifact tag leaving the run's artifacts is refused before anything is downloaded
    forged = forge(client, genuine, checkpoint=str(out / "checkpoints" / "trial-09999.pt"))
    client.set_tag(forged, "sweeper.checkpoint", "mlflow-artifacts:../../../escape.pt")
    with pytest.raises(UserError, match="leaves the run's artifacts"):
        export_trial(forged, mlflow_uri, None, workdir / "dest")
    assert not (workdir / "dest").exists()
