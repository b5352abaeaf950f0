"""The sweep's planning: from a spec as loaded to the sweep every process runs, before any trial.

Its modules, one line each: docs/architecture.md (Layout), which a test checks against the tree.
"""
