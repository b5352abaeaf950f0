"""One trial in pure PyTorch: build it from the plugins, train it, checkpoint and resume it.

No optuna, ray or mlflow here (an import-linter contract holds that): progress leaves through
a ``report(epoch, metrics)`` callable that may raise ``TrialPruned``, which is what lets the
same trial run under both backends, in a replay and in tests.

Its modules, one line each: docs/architecture.md (Layout), which a test checks against the tree.
"""
