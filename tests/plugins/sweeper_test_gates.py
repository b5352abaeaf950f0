"""Two gates in one sweep, for tests that act at two known points (no timing involved): a
constant learning rate whose schedules, at the first optimizer step of epoch ``epoch``, count
their arrivals under ``folder`` (across processes: the arrived-<n> files); the ``first``-th to
arrive writes ``folder/1/blocked`` and waits for ``folder/1/release``, the ``second``-th the same
under ``folder/2``. A dry build (one step) never arrives at an epoch > 1. Installed with
sweeper_test_gate.py (its Gate) by tests that need it."""

from __future__ import annotations

from pathlib import Path

from sweeper_test_gate import Gate, _claim


class Gates(Gate):
    def __init__(self, optimizer, folder: str, block_at: int, first: int, second: int) -> None:
        self.root, self.points = Path(folder), {first: "1", second: "2"}
        super().__init__(optimizer, folder, block_at)

    def _wait(self) -> None:
        point = self.points.get(_claim(self.root, "arrived"))
        if point is not None:
            self.folder = str(self.root / point)
            Path(self.folder).mkdir(exist_ok=True)
            super()._wait()


def gates(
    optimizer,
    *,
    epochs: int,
    steps_per_epoch: int,
    folder: str = "gates",
    epoch: int = 2,
    first: int = 1,
    second: int = 2,
) -> Gates:
    Path(folder).mkdir(parents=True, exist_ok=True)
    return Gates(optimizer, folder, (epoch - 1) * steps_per_epoch + 1, first, second)
