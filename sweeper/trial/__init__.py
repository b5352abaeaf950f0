"""One trial in pure PyTorch: build it from the plugins, train it, checkpoint and resume it.

No optuna, ray or mlflow here (an import-linter contract holds that): progress leaves through
a ``report(epoch, metrics)`` callable that may raise ``TrialPruned``, which is what lets the
same trial run under both backends, in a replay and in tests.

- states.py      TrialState and FailureKind: the one vocabulary of a trial's life, for every module
- build.py       TrialConfig; seed and build data set, model, optimizer, schedule; run_trial; rebuild;
                 ProcessCache (the data set and compiled forwards a process keeps between trials)
- holdout.py     the chosen trial scored once on the data set's held-out test split, after the search
- refit.py       export.refit: the chosen configuration trained again on training + validation, seeded
- trainer.py     the training loop (train/eval modes, AMP, accumulation, clipping, NaN guard);
                 epoch_metrics, the one builder of an epoch's metrics (solo and fused)
- execute.py     one trial to an Outcome, never raising for the trial's own failure
- time_limit.py  train.max_trial_seconds: a watchdog that raises TrialTimedOut in the training thread
- checkpoint.py  the training state: save atomically, load with weights_only, resume bitwise
- batching.py    index batches over whole-tensor splits
- seeding.py     named seed streams; seeding every RNG; torch thread and kernel settings
- lr_finder.py   the learning-rate range test
- preflight.py   before the first trial: prepare the data once, dry-build every plugin choice on the CPU
- estimate.py    a trial's time from a few timed steps (`validate --estimate`)
- sized_space.py --auto with a device-time budget: the derived space's too costly choices dropped
"""
