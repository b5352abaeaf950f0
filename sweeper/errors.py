"""Exceptions that cross module boundaries.

UserError is anything the user can fix (spec, override, plugin name): the CLI prints its
message and exits 2 without a traceback. SweepStopped is a sweep that stopped itself (its
trials all failed alike): one paragraph, exit 1, no traceback. The other two travel from the trainer up to the
backend, which owns the trial's state.
"""


class UserError(Exception):
    """Bad input: the message names the YAML path or plugin and what was expected."""


class SweepStopped(Exception):
    """The sweep stopped before its budget was spent; the message says why and what to do."""


class TrialPruned(Exception):
    """Raised by a backend's report() callable when the pruner stops the trial."""


class TrialFailed(Exception):
    """The trial cannot go on; str(self) is the reason recorded for it."""
