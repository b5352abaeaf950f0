"""The ``sweeper`` command: a thin typer app; each command calls one library function.

Its modules, one line each: docs/architecture.md (Layout), which a test checks against the tree.
"""

from sweeper.cli.base import app
from sweeper.cli.sweeps import main

__all__ = ["app", "main"]
