"""search.pruner as a Ray Tune scheduler (epochs are Tune's training iterations), and what each
scheduler asks of the trials' checkpoints.

Early stopping: ASHA, asynchronous Hyperband, median stopping. Population Based Training: Ray's
``PopulationBasedTraining`` over the mutated search-space paths. On an exploit, Tune restarts the
weak trial with the strong trial's latest checkpoint and a mutated copy of its config; the worker
(search/ray/trial.py) takes the weights, optimizer buffers and epoch from that checkpoint and
applies its own new hyperparameters (trial/checkpoint.py: ``Resume(new_hyperparameters=True)``).
"""

from __future__ import annotations

import math
from typing import Any

from sweeper.search.ray.space import mutation
from sweeper.spec import SweepSpec
from sweeper.spec import space as sp

# Checkpoints Tune keeps per trial. A retry needs only the latest. Under PBT a weak trial may start
# from a strong trial's checkpoint some perturbations after it was chosen (when it waited for a
# free slot), so a few more are kept (Ray's PBT guide uses 4; it warns at 2 or fewer).
KEEP_CHECKPOINTS = 1
KEEP_CHECKPOINTS_PBT = 4


def make_scheduler(spec: SweepSpec) -> Any:
    """search.pruner as a Tune scheduler; epochs are Tune's training iterations."""
    from ray.tune import schedulers as s

    p, epochs = spec.search.pruner, spec.train.epochs
    if p.type == "asha":
        return s.ASHAScheduler(
            time_attr="training_iteration", max_t=epochs, grace_period=p.min_epochs, reduction_factor=p.reduction_factor
        )
    if p.type == "hyperband":  # the asynchronous variant: Tune's HyperBand pauses trials
        brackets = int(math.log(max(1, epochs / p.min_epochs), p.reduction_factor)) + 1
        return s.AsyncHyperBandScheduler(
            time_attr="training_iteration",
            max_t=epochs,
            grace_period=p.min_epochs,
            reduction_factor=p.reduction_factor,
            brackets=brackets,
        )
    if p.type == "median":
        return s.MedianStoppingRule(
            time_attr="training_iteration", grace_period=p.min_epochs, min_samples_required=max(1, p.startup_trials)
        )
    if p.type == "pbt":
        return _pbt(spec)
    return s.FIFOScheduler()


def checkpoint_every(spec: SweepSpec) -> int:
    """Epochs between a trial's checkpoints while it trains; 0: only its final state. PBT needs
    one at each perturbation; a retry (search.ray.max_failures) resumes from the latest one."""
    if spec.search.pruner.type == "pbt":
        return spec.search.pruner.perturbation_interval
    return 1 if spec.search.ray.max_failures > 0 else 0


def checkpoints_kept(spec: SweepSpec) -> int:
    return KEEP_CHECKPOINTS_PBT if spec.search.pruner.type == "pbt" else KEEP_CHECKPOINTS


class FitToSpace:
    """PBT's ``custom_explore_fn``: a value scaled by 0.8/1.2 is put back on its declared grid
    (``step``) and inside its range (a class, not a closure: Tune pickles the scheduler with its
    experiment state)."""

    def __init__(self, params: dict[str, sp.Param]) -> None:
        self.params = params

    def __call__(self, config: dict[str, Any]) -> dict[str, Any]:
        for path, p in self.params.items():
            if path not in config or isinstance(p, sp.CategoricalParam):
                continue
            value = config[path]
            step = p.step if isinstance(p, sp.FloatParam) else (p.step if p.step != 1 else None)
            if step:
                value = p.low + round((value - p.low) / step) * step
            config[path] = type(p.low)(min(max(value, p.low), p.high))
            if isinstance(p, sp.FloatParam) and step:
                config[path] = round(config[path], 12)  # as sp.grid_values writes grid points
        return config


def _pbt(spec: SweepSpec) -> Any:
    from ray.tune.schedulers import PopulationBasedTraining

    p, space = spec.search.pruner, spec.search.space
    mutations = {path: mutation(space[path]) for path in spec.search.pbt_mutations()}
    return PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=p.perturbation_interval,
        quantile_fraction=p.quantile_fraction,
        hyperparam_mutations=mutations,
        custom_explore_fn=FitToSpace({k: space[k] for k in mutations}),
        synch=p.synch,
    )
