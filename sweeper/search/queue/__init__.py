"""One pool of workers, many sweeps: a queue of Optuna sweeps in one database (issue #31).

- table.py   the queue's rows: sweeps (owner, priority, device required, state), owners'
             weights and quotas, the workers serving it
- policy.py  which sweep a free worker serves next: priority, fair share, quota, device
- submit.py  `sweeper submit --queue`, `queue`, `cancel`, `priority`, `share`
- worker.py  `sweeper worker --queue`: serving trials from every runnable sweep; preemption; who
             finishes one
- finish.py  the finishing process beside a worker: an ended sweep's summary and export, while
             the worker trains on
- roles.py   `sweeper queue-access`: PostgreSQL roles, row-level security on the queue's rows

The queue decides which sweep a worker serves; each sweep's own batches, ledger and leases are
the ones `sweeper run` and `sweeper worker --study` use (search/optuna/).
"""
