"""Side effects a person reads: the MLflow adapter, the typed records a sweep writes and
shows (trial record, progress event, trial.json), and the live progress display.

Its modules, one line each: docs/architecture.md (Layout), which a test checks against the tree.
"""
