"""A schedule plugin for tests that kill a sweep at a known point, with no timing involved: a
constant learning rate that, in the ``build``-th schedule built under ``folder`` (counted across
processes: the build-<n> files), stops at the first optimizer step of epoch ``epoch`` (epochs
1..epoch-1 are reported by then), writes ``folder/blocked`` (its pid, atomically) and waits until
``folder/release`` exists. It blocks once per folder: a trial retried from its checkpoint, or a
re-run, goes through; so does sweeper's dry build before the first trial, which is not counted.
``fail``: raise there instead of waiting (one process of several fails: a DDP rank).
Installed by the ``gate`` fixture (conftest.py) as an entry point."""

from __future__ import annotations

import os
import time
from pathlib import Path

from torch.optim.lr_scheduler import LambdaLR

from sweeper.plugin import in_dry_build

WAIT_POLL_S = 0.05


def _constant(step: int) -> float:
    return 1.0


def _claim(folder: Path, prefix: str = "build") -> int:
    """This build's (arrival's) 1-based index among those under ``folder``: the <prefix>-<n>
    files (atomic across processes)."""
    n = 1
    while True:
        try:
            os.close(os.open(folder / f"{prefix}-{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return n
        except FileExistsError:
            n += 1


class Gate(LambdaLR):
    def __init__(self, optimizer, folder: str, block_at: int, fail: bool = False) -> None:
        self.folder, self.block_at, self.calls, self.counting, self.fail = folder, block_at, 0, False, fail
        super().__init__(optimizer, _constant)
        self.counting = True  # the constructor's own step() is not an optimizer step

    def step(self, epoch=None) -> None:
        if self.counting:
            self.calls += 1
            if self.calls == self.block_at:
                self._wait()
        super().step()

    def _wait(self) -> None:
        blocked, release = Path(self.folder) / "blocked", Path(self.folder) / "release"
        try:
            os.close(os.open(blocked.with_suffix(".claimed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return  # blocked once already
        # written whole, then renamed: a test that sees `blocked` reads the pid, never an empty file
        written = blocked.with_suffix(".writing")
        written.write_text(str(os.getpid()))
        written.replace(blocked)
        if self.fail:
            raise RuntimeError(f"the gate fails here on purpose (pid {os.getpid()}, rank {os.environ.get('RANK')})")
        while not release.exists():
            time.sleep(WAIT_POLL_S)


def gate(
    optimizer,
    *,
    epochs: int,
    steps_per_epoch: int,
    folder: str = "gate",
    build: int = 1,
    epoch: int = 1,
    fail: bool = False,
) -> Gate:
    Path(folder).mkdir(parents=True, exist_ok=True)
    if in_dry_build():  # sweeper's dry build before the first trial is no trial: not counted, never blocked
        return Gate(optimizer, str(folder), 0)
    index = _claim(Path(folder))
    return Gate(optimizer, str(folder), (epoch - 1) * steps_per_epoch + 1 if index == build else 0, fail)
