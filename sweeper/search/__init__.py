"""Who runs which trial: the runner (the same for every backend), the Backend protocol and its
two implementations, the local worker pool, the LR-finder warm start, and how trials and the
sweep are recorded in MLflow.

- runner.py       run_sweep: check, warm start, search, keep checkpoints, summary, export
- backend.py      the Backend protocol, SearchContext, SearchResult, Observer
- optuna/         the Optuna backend (a coordinator in this process, seeded batches)
- ray/            the Ray Tune backend (local Ray or a cluster; PBT; Ray jobs)
- pool.py         trials in this process or in local worker processes
- trial_runs.py   the sweep's and its trials' MLflow runs, trial.json's one writer
- checkpoints.py  which trials' checkpoints a sweep keeps
- warm_start.py   LR range tests before the search
"""
