"""sweeper's search space as Ray Tune sample domains: one mapping, used by Ray's basic generator
(random, grid) and by PBT's mutations, honouring log scales and steps."""

from __future__ import annotations

from typing import Any

from sweeper.spec import space as sp


def domain(param: sp.Param) -> Any:
    """The Tune domain that samples what ``param`` declares (bounds inclusive, as in Optuna)."""
    from ray import tune

    if isinstance(param, sp.CategoricalParam):
        return tune.choice(param.choices)
    if isinstance(param, sp.IntParam):  # randint's upper bound is exclusive, qrandint's inclusive
        if param.log:
            return tune.lograndint(param.low, param.high + 1)
        return (
            tune.qrandint(param.low, param.high, param.step)
            if param.step != 1
            else tune.randint(param.low, param.high + 1)
        )
    if param.log:
        return tune.loguniform(param.low, param.high)
    return tune.quniform(param.low, param.high, param.step) if param.step else tune.uniform(param.low, param.high)


def param_space(space: dict[str, sp.Param], grid: bool) -> dict[str, Any]:
    """Tune's param_space for the basic generator: every point of the grid, or one domain each."""
    from ray import tune

    if grid:
        return {path: tune.grid_search(sp.grid_values(path, p)) for path, p in space.items()}
    return {path: domain(p) for path, p in space.items()}


def mutation(param: sp.Param) -> Any:
    """What PBT resamples a mutated parameter from: a categorical's choices (Ray may also shift to
    a neighbouring one), else its domain."""
    return list(param.choices) if isinstance(param, sp.CategoricalParam) else domain(param)
