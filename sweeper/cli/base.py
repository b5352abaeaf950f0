"""What every module of the ``sweeper`` command shares: the typer app, the handling of user
errors (exit code 2, no traceback) and the arguments several commands take."""

from __future__ import annotations

import functools
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
