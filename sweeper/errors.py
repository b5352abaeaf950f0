"""Exceptions that cross module boundaries (public API: docs/api.md).

UserError is anything the user can fix (spec, override, plugin name): the CLI prints its
message and exits 2 without a traceback; a plugin raises it for arguments it refuses. SweepStopped
is a sweep that stopped itself (its trials all failed alike): one paragraph, exit 1, no
traceback. The other three travel from the trainer up to the backend, which owns the trial's
state; a plugin raises TrialFailed to fail its trial with a reason of its own.
"""

__all__ = ["SweepStopped", "TrialFailed", "TrialPreempted", "TrialPruned", "UserError"]


class UserError(Exception):
    """Bad input: the message names the YAML path or plugin and what was expected."""


class SweepStopped(Exception):
    """The sweep stopped before its budget was spent; the message says why and what to do."""


class TrialPruned(Exception):
    """Raised by a backend's report() callable when the pruner stops the trial."""


class TrialPreempted(Exception):
    """Raised by a backend's report() callable when the trial's device is wanted by a sweep of
    higher priority (a queue's worker): the trial stops after this epoch, its state saved, and is
    continued later from it. str(self) says for which sweep."""


class TrialFailed(Exception):
    """The trial cannot go on; str(self) is the reason recorded for it."""
