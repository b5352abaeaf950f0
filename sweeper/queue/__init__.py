"""One pool of workers, many sweeps: a queue of Optuna sweeps in one database (issue #31).

The queue decides which sweep a worker serves; each sweep's own batches, ledger and leases are
the ones `sweeper run` and `sweeper worker --study` use (search/optuna/).

Its modules, one line each: docs/architecture.md (Layout), which a test checks against the tree.
"""
