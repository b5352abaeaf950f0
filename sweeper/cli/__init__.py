"""The ``sweeper`` command: a thin typer app; each command calls one library function.

- base.py    the app, user errors (exit code 2, no traceback), arguments several commands share
- sweeps.py  the commands of one sweep and of the plugins; ``main``
- queue.py   the commands of a queue of sweeps that a pool of workers serves
"""

from sweeper.cli.base import app
from sweeper.cli.sweeps import main

__all__ = ["app", "main"]
