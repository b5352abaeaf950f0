"""Side effects a person reads: the MLflow adapter, the typed records a sweep writes and
shows (trial record, progress event, trial.json), and the live progress display.

- mlflow.py    Tracker: a generic MLflow adapter (runs, params, tags, metrics, artifacts); resolve_uri
- records.py   TrialRecord, TrialEvent, TrialJson (schema-versioned; validated where read)
- progress.py  the rich live display and the final lines of a sweep
"""
