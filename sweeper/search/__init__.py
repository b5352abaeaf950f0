"""Who runs which trial: the runner (the same for every backend), the Backend protocol and its
two implementations, the local worker pool, the LR-finder warm start, and how trials and the
sweep are recorded in MLflow.

Its modules, one line each: docs/architecture.md (Layout), which a test checks against the tree.
"""
