"""A data set for tests of a queue's finishing process (tests/test_queue.py): the smoke data set
(``synthetic``), which, built by the process that summarises and exports a queued sweep
(``python -m sweeper.queue.finish``), writes ``folder/blocked`` (its pid, atomically) and waits until
``folder/release`` exists. Built anywhere else (submission, a worker's trials) it goes through.
Installed as an entry point by the test that needs it."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from sweeper_plugins.datasets import synthetic

WAIT_POLL_S = 0.05


def held(*, folder: str, num_train: int = 256, num_val: int = 64, input_shape: tuple[int, ...] = (1, 4, 4)):
    if Path(sys.argv[0]).as_posix().endswith("sweeper/queue/finish.py"):
        Path(folder).mkdir(parents=True, exist_ok=True)
        # written whole, then renamed: a test that sees `blocked` reads the pid, never an empty file
        writing = Path(folder) / "blocked.writing"
        writing.write_text(str(os.getpid()))
        writing.replace(Path(folder) / "blocked")
        while not (Path(folder) / "release").exists():
            time.sleep(WAIT_POLL_S)
    return synthetic(num_train=num_train, num_val=num_val, input_shape=input_shape, num_classes=3)
