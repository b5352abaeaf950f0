"""What every module of the ``sweeper`` command shares: the typer app, the handling of user
errors (exit code 2, no traceback) and the arguments several commands take."""

from __future__ import annotations

import atexit
import functools
import os
import sys
from collections.abc import Callable

import typer
from rich.console import Console
from rich.markup import escape

from sweeper.errors import SweepStopped, UserError

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Plugin-based hyperparameter sweeps for PyTorch.",
)
err = Console(stderr=True, highlight=False)

SPEC = typer.Argument(..., help="sweep spec (YAML), e.g. search_spaces/digits.yaml", show_default=False)
OVERRIDES = typer.Argument(None, help="dotted.path=value overrides, e.g. train.epochs=3", show_default=False)
AUTO = typer.Option(
    False,
    "--auto",
    help="derive the search space from the plugins' declared priors (search.space: auto); "
    "entries written in search.space win",
)


def user_errors(fn: Callable) -> Callable:
    """A UserError is the user's to fix: one paragraph on stderr, exit code 2, no traceback. A
    sweep its circuit breaker stopped (SweepStopped): its message, exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            err.print("[bold red]error:[/]", escape(str(exc)), soft_wrap=True)  # [..] in a message is text
            raise typer.Exit(2) from None
        except OSError as exc:  # a path the user gave that cannot be read or written (a missing folder, ...)
            if exc.filename is None:
                raise
            err.print("[bold red]error:[/]", escape(f"{exc.filename}: {exc.strerror or exc}"), soft_wrap=True)
            raise typer.Exit(2) from None
        except SweepStopped as exc:  # the sweep's own trials stopped it: nothing to fix in the input
            err.print("[bold red]stopped:[/]", escape(str(exc)), soft_wrap=True, highlight=False)
            raise typer.Exit(1) from None

    return wrapper


def run_app(prog_name: str) -> None:
    """Run the app as the `sweeper` command, and leave without Python's teardown of every
    module: with torch loaded that teardown is 0.4-0.7 s of every command on a 2-core CPU
    (docs/speed.md#start-up), and frees nothing the operating system would not. What must run
    still runs: Python first waits for the command's threads, then every exit handler (the
    tracker's sender drains, the export check's process stops, temp folders go), and
    ``_leave`` last, as it is registered first."""
    atexit.register(_leave)  # before any other handler: atexit runs the last registered first
    try:
        app(prog_name=prog_name)
    except SystemExit as exc:
        _EXIT.append(exc.code if isinstance(exc.code, int) else int(exc.code is not None))
        raise
    except KeyboardInterrupt:  # Python ends it as killed by SIGINT: leave that to Python
        atexit.unregister(_leave)
        raise
    except BaseException:  # its traceback is printed before the exit handlers run
        _EXIT.append(1)
        raise
    _EXIT.append(0)


_EXIT: list[int] = []  # the command's exit status, once it has one


def _leave() -> None:
    if not _EXIT:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a broken pipe: nothing more can be said
            pass
    os._exit(_EXIT[0])
