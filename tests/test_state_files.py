"""State files are written atomically (temp file, fsync, replace); what a killed writer leaves is
removed by the next `sweeper run` of the folder; a corrupt cache or checkpoint is detected and
rebuilt (the LR finder's cache) or reported clearly (a checkpoint), never a crash."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import sweeper, write_spec

from sweeper import files
from sweeper.trial import checkpoint


def temps(folder: Path) -> list[Path]:
    return sorted(folder.rglob(".*.tmp-*"))


def test_a_failed_write_leaves_the_old_file_intact_and_no_temp(workdir: Path):
    target = files.write_atomic(workdir / "summary.json", json.dumps({"version": 1}))
    with pytest.raises(RuntimeError, match="disk full"):
        with files.replacing(target) as tmp:
            tmp.write_text('{"version": 2, "trials": [')  # half of the new content...
            raise RuntimeError("disk full")  # ...then the writer fails
    assert json.loads(target.read_text()) == {"version": 1}
    assert temps(workdir) == []
    # torch.save failing mid-way (an object it cannot pickle, after the tensors): same
    path = checkpoint.save(workdir / "ckpt" / "trial-00000.pt", {"model": {"w": torch.ones(3)}, "epoch": 1})
    with pytest.raises(Exception):
        checkpoint.save(path, {"model": {"w": torch.zeros(3)}, "epoch": 2, "bad": lambda: None})
    assert checkpoint.load(path)["epoch"] == 1 and temps(workdir) == []


def test_a_killed_writer_leaves_only_a_temp_file_which_the_next_run_removes(workdir: Path):
    """A real process killed mid-write: the target keeps its old content; its temp file is kept
    while the process lives (a worker sharing the folder may be writing it), removed after."""
    target = files.write_atomic(workdir / "export.json", "old")
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"""
import sys, time
from pathlib import Path
from sweeper import files
with files.replacing(Path({str(target)!r})) as tmp:
    tmp.write_text("half of the new")
    print("writing", flush=True)
    time.sleep(600)
""",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout.readline().strip() == "writing"  # the event: the temp file exists
        [tmp] = temps(workdir)
        assert tmp.name.startswith(".export.json.tmp-") and target.read_text() == "old"
        assert files.remove_stale_temps(workdir) == [] and tmp.exists()  # its writer is alive
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    assert files.remove_stale_temps(workdir) == [tmp] and temps(workdir) == []
    assert target.read_text() == "old"


def test_a_truncated_or_garbled_checkpoint_is_a_clear_error(workdir: Path):
    path = checkpoint.save(workdir / "trial-00001.pt", {"model": {"w": torch.ones(100)}, "epoch": 3})
    whole = path.read_bytes()
    for cut in (0, 7, len(whole) // 2, len(whole) - 1):
        path.write_bytes(whole[:cut])
        with pytest.raises(checkpoint.CorruptCheckpoint, match="trial-00001.pt: unreadable checkpoint"):
            checkpoint.load(path)
    path.write_bytes(b"not a checkpoint " * 50)
    with pytest.raises(checkpoint.CorruptCheckpoint, match="trial-00001.pt"):
        checkpoint.load(path)
    with pytest.raises(FileNotFoundError):  # gone is not corrupt
        checkpoint.load(workdir / "missing.pt")


def test_run_rebuilds_a_truncated_lr_finder_cache_and_removes_stale_temps(workdir: Path):
    out = workdir / "out"
    (out / "checkpoints").mkdir(parents=True)
    (out / "lr_finder.json").write_text('{"{\\"settings\\": {\\"enabled\\": tr')  # cut mid-write
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    dead_pid = int(dead.stdout)  # a process that has exited
    stale = [out / f".summary.json.tmp-{dead_pid}-0a1b2c3d", out / "checkpoints" / f".trial-00000.pt.tmp-{dead_pid}-ff"]
    live = out / f".export.json.tmp-{os.getpid()}-abcdef12"  # this test process: alive, like a worker's
    for p in [*stale, live]:
        p.write_text("half")
    spec = write_spec(workdir / "s.yaml", tracking={"experiment": "state-files"})
    proc = sweeper(
        "run",
        str(spec),
        "search.lr_finder={enabled: true, steps: 20}",
        "search.n_trials=2",
        "--out",
        str(out),
        "-q",
        check=True,
    )
    assert "warning:" in proc.stderr and "lr_finder.json: unreadable LR finder cache" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"].get("complete") == 2 and summary["lr_finder"]["findings"]
    cache = json.loads((out / "lr_finder.json").read_text())  # rebuilt, whole
    assert [f["steps"] for f in next(iter(cache.values())).values()] == [
        f["steps"] for f in summary["lr_finder"]["findings"]
    ]
    assert temps(out) == [live]  # the dead writers' temps are gone, the live one's kept
