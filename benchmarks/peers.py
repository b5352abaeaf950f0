"""The peers a user would pick instead of sweeper (issue #47 item 2), each driving THE SAME trial
code as sweeper's own sweeps (``sweeper.trial.build.run_trial``), through a thin adapter (a
configuration and a number of epochs in, the validation metric after each epoch out), so that
only the search differs:

- smac: SMAC3's MultiFidelityFacade (random forest + Hyperband, eta 3), ``Scenario(walltime_limit,
  n_trials, min_budget=1, max_budget=EPOCHS, seed)``, ``train(config, seed, budget) -> cost``; a
  budget of b epochs is a full run of ceil(b) epochs (10/9 -> 2); cost: the objective, negated
  when maximized (SMAC min-max scales costs before its log: -acc and 1 - acc train the same forest);
- dehb: DEHB 0.1.2 (differential evolution + Hyperband), ``run(total_cost=...)``, fidelities as
  SMAC's. It pins numpy < 2: it runs with the Python of a venv of its own, ``$SWEEPER_DEHB_PYTHON``
  (default /root/.cache/dehb-venv/bin/python), made with ``python3 -m venv /root/.cache/dehb-venv &&
  /root/.cache/dehb-venv/bin/pip install -e . "numpy<2" dehb==0.1.2 torch==VERSION``, VERSION the
  caller's torch (a venv with another torch is refused: the trials would not be the same code);
- optuna-hb: Optuna's TPESampler(seed) + HyperbandPruner(min_resource=1, max_resource=EPOCHS) (the
  pair Optuna's docs name best for TPE), each epoch's value reported, ``study.optimize(timeout=...)``;
- ray-asha: Ray Tune's ASHAScheduler(max_t=EPOCHS, grace_period=1) + OptunaSearch (TPE, seeded,
  sweeper's own ``suggest`` as its define-by-run space) on a new local Ray of one CPU, one trial at
  a time (actors reused), ``tune.report`` after each epoch.

Every peer searches the hand-written space of the shipped spec (``search.space``, its ``when``
conditions included: ConfigSpace conditions for SMAC and DEHB), with the spec's seed set to the
benchmark's seed (the data split of sweeper's runs of that seed), each trial seeded by
``derive(seed, "trial", number)``, one torch CPU thread, parallel 1. The device-time budget is the
wall clock of the whole peer run: the clock starts at the launch of its process (``--launched``,
given by ``run_peer``; as a `sweeper run`'s in benchmarks/search_quality.py), so that Python's
start, the imports of torch, sweeper and the peer, Ray's start-up and the peer's model between
trials count against the budget as sweeper's own start-up does; each peer stops on that clock (SMAC through a
callback, Ray Tune through a stopper: their own limits count from later), and the run is cut at
the budget (a trial that ends after it is dropped). The benchmark's own measurement is not the
peer's: each trial's model is scored on the data set's held-out test split (never shown to the
peer; Ray's trials after every epoch, as ASHA may end them in any report), and that scoring time
is taken off the clock. A trial's ``device_s`` (the anytime curve's x) is the clock when it ended.

A peer run is a process of its own (Ray, dask and the torch settings stay out of the caller's):

    python benchmarks/peers.py smac --task digits --seed 0 --budget-s 60 --out smac.json
    python benchmarks/peers.py optuna-hb --task mnist1d --seed 1 --budget-s 300 --out hb.json train.epochs=10

``run_peer`` (what benchmarks/search_quality.py and tests/test_peers.py call) starts it with the
right Python and returns its JSON: ``trials`` in the order they ended, each with ``number``,
``params``, ``epochs`` (its fidelity), ``trained`` (epochs it ran), ``val`` (the objective's metric
after its last epoch; None for a failed trial), ``test`` (the same model's on the test split; None
without one), ``seconds`` (its training), ``device_s``, ``complete`` (ran all its epochs);
``startup_s``, ``cut``, ``wall_s``, ``scoring_s``; or ``skipped`` with the reason where the peer's
library is not there.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PEERS = ("smac", "dehb", "optuna-hb", "ray-asha")
# what each peer imports: where it is missing, the peer is skipped (DEHB: in its own venv)
LIBRARIES = {"smac": "smac", "dehb": "dehb", "optuna-hb": "optuna", "ray-asha": "ray.tune"}
DEHB_PYTHON = os.environ.get("SWEEPER_DEHB_PYTHON", "/root/.cache/dehb-venv/bin/python")
MANY = 10**6  # "no trial cap": the budget ends the run


# --- the same trial for every peer -------------------------------------------------------------


@dataclass
class Trial:
    number: int
    params: dict[str, Any]
    epochs: int  # its fidelity: a full run of this many epochs (the one-cycle schedule spans them)
    trained: int = 0  # epochs it trained (fewer: the peer stopped it, or it failed)
    val: float | None = None  # the objective's metric after its last epoch
    test: float | None = None  # that model's metric on the held-out test split
    seconds: float = 0.0  # wall time of its training (one thread: device seconds)
    end: float = 0.0  # wall seconds from the start of the peer run to its end (scoring included)
    scoring: float = 0.0  # seconds this trial's test scoring took (taken off the clock)
    error: str | None = None
    device_s: float = 0.0  # the clock when it ended: end less every scoring so far (set by account)

    @property
    def complete(self) -> bool:
        return self.error is None and self.trained == self.epochs and finite(self.val)


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


@dataclass
class Harness:
    """One task's trial: a spec (its searched values and epochs applied per trial) trained in this
    process with one torch thread, its data set kept from one trial to the next (as a sweep's
    worker keeps it); the model scored on the held-out test split after training."""

    spec: Any  # SweepSpec
    seed: int
    start: float = field(default_factory=time.time)  # the peer run's clock starts here
    trials: list[Trial] = field(default_factory=list)
    _cache: Any = None
    _test: Any = None  # the data set's splits with their test split (None: not read yet; False: none)

    @classmethod
    def load(cls, spec_path: str | Path, seed: int, overrides: list[str] = ()) -> Harness:
        from sweeper.spec.load import load

        base = ["tracking.enabled=false", "export.formats=[]", "train.cpu_threads=1", "search.parallel=1"]
        return cls(load(spec_path, [*base, f"seed={seed}", *overrides]), seed)

    @property
    def space(self) -> dict[str, Any]:
        return self.spec.search.space

    @property
    def epochs(self) -> int:
        return int(self.spec.train.epochs)

    @property
    def metric(self) -> str:
        return self.spec.objective.metric

    @property
    def maximize(self) -> bool:
        return self.spec.objective.direction == "maximize"

    def cost(self, value: float | None) -> float:
        """What a minimizing peer minimizes (inf for a failed trial)."""
        if not finite(value):
            return math.inf
        return -value if self.maximize else value

    def clock(self) -> float:
        """Seconds of the peer run so far, the benchmark's scoring excluded."""
        return time.time() - self.start - sum(t.scoring for t in self.trials)

    def run(
        self,
        params: dict[str, Any],
        epochs: int,
        number: int | None = None,
        stop: Callable[[int, dict[str, float], Trial], bool] | None = None,
        score_each_epoch: bool = False,
    ) -> Trial:
        """Train ``params`` for a full run of ``epochs`` epochs; ``stop(epoch, metrics, trial)``
        after each epoch (True: stop it there, a pruner's answer). The model is scored on the test
        split after its last epoch, or after every epoch with ``score_each_epoch`` (for a peer
        that may end the trial inside ``stop``: Ray Tune's report never returns then)."""
        import torch

        from sweeper.errors import TrialPruned
        from sweeper.trial.build import ProcessCache, TrialConfig, run_trial
        from sweeper.trial.seeding import configure_torch, trial_seed

        if self._cache is None:
            self._cache = ProcessCache()
        number = len(self.trials) if number is None else number
        trial = Trial(number, dict(params), int(epochs))
        began = time.time()
        parts: dict[str, Any] = {}

        def report(epoch: int, metrics: dict[str, float]) -> None:
            trial.trained, trial.val = epoch, metrics.get(self.metric)
            trial.seconds = time.time() - began - trial.scoring
            if score_each_epoch:
                self._score(trial, parts["parts"])
            if stop is not None and stop(epoch, metrics, trial):
                raise TrialPruned(f"stopped at epoch {epoch}")

        try:
            spec = self.spec.with_values({**params, "train.epochs": int(epochs)})
            config = TrialConfig(number, trial_seed(self.seed, number), dict(params), spec, threads=1)
            configure_torch(threads=1, deterministic=spec.train.deterministic)
            run_trial(
                config,
                report,
                torch.device("cpu"),
                before_fit=lambda built: parts.__setitem__("parts", built),
                cache=self._cache,
            )
        except TrialPruned:
            pass
        except Exception as exc:  # a failing trial never ends the peer's run: the peer sees inf
            trial.error = f"{type(exc).__name__}: {exc}"[:500]
            trial.val = trial.test = None  # as in sweeper: a failed trial has no value
        trial.seconds = time.time() - began - trial.scoring
        if not score_each_epoch and "parts" in parts and finite(trial.val):
            self._score(trial, parts["parts"])
        trial.end = time.time() - self.start
        self.trials.append(trial)
        return trial

    def _score(self, trial: Trial, parts: Any) -> None:
        """The trained model's objective metric on the test split (none when the data set has
        none); its seconds (reading the test split the first time included) go to ``scoring``."""
        began = time.perf_counter()
        try:
            data = self.test_split()
            if data is not None:
                from sweeper.trial import holdout

                scores = holdout.score(parts.model, data, parts.task, self.spec.train.eval_batch_size)
                trial.test = scores.get(holdout.PREFIX + self.metric.removeprefix("val_"))
        finally:
            trial.scoring += time.perf_counter() - began

    def test_split(self) -> Any:
        """The data-set plugin's splits with their test split, read once (a fresh call of the
        plugin, as sweeper reads it after a sweep); None when it has none."""
        if self._test is None:
            try:
                from sweeper.trial import holdout
            except ImportError:  # a sweeper without the held-out test split: no test scores
                self._test = False
            else:
                data = holdout.test_split(self.spec)
                self._test = False if data is None else data
        return None if self._test is False else self._test


def account(trials: list[Trial], budget_s: float) -> tuple[list[Trial], int]:
    """The trials in the order they ended, each with its ``device_s`` (its end less the scoring
    of every trial so far), those that ended within the budget; and how many were cut."""
    ordered, scoring = sorted(trials, key=lambda t: t.end), 0.0
    for trial in ordered:
        scoring += trial.scoring
        trial.device_s = trial.end - scoring
    kept = [t for t in ordered if t.device_s <= budget_s]
    return kept, len(ordered) - len(kept)


def whole(budget: float) -> int:
    """A multi-fidelity peer's budget (a float number of epochs) as whole epochs, rounded up."""
    return max(1, math.ceil(budget - 1e-9))


# --- the hand-written space in each peer's terms -----------------------------------------------


def _labels(choices: list[Any]) -> list[str]:
    """A categorical's choices as ConfigSpace labels (strings: any scalar, None and bools too)."""
    labels = [str(c) for c in choices]
    return labels if len(set(labels)) == len(labels) else [f"{i}:{c}" for i, c in enumerate(choices)]


def _grid(path: str, p: Any) -> list[Any] | None:
    """The values of a parameter on a step grid that ConfigSpace cannot express (a float with a
    step, an int with a step > 1), as sweeper's grid sampler lists them: searched as an index."""
    from sweeper.spec import space as sp

    stepped = isinstance(p, sp.FloatParam) and p.step is not None
    return sp.grid_values(path, p) if stepped or (isinstance(p, sp.IntParam) and p.step != 1) else None


def configspace(space: dict[str, Any], seed: int) -> tuple[Any, Callable[[Mapping[str, Any]], dict[str, Any]]]:
    """The space as a ConfigSpace ConfigurationSpace (``when`` as Equals/In conditions, several
    as their conjunction) for SMAC and DEHB, and the function that turns one of its
    configurations back into sweeper's values (only the active parameters)."""
    import ConfigSpace as CS

    from sweeper.spec import space as sp

    cs = CS.ConfigurationSpace(seed=seed)
    made: dict[str, Any] = {}
    decoders: dict[str, Callable[[Any], Any]] = {}
    encoders: dict[str, Callable[[Any], Any]] = {}
    for path, p in sp.ordered(space):
        grid = _grid(path, p)
        if isinstance(p, sp.CategoricalParam):
            labels = _labels(p.choices)
            made[path] = CS.CategoricalHyperparameter(path, labels)
            decoders[path] = lambda v, p=p, labels=labels: p.choices[labels.index(str(v))]
            encoders[path] = lambda v, p=p, labels=labels: labels[[c == v for c in p.choices].index(True)]
        elif grid is not None and len(grid) > 1:
            made[path] = CS.UniformIntegerHyperparameter(path, 0, len(grid) - 1)
            decoders[path] = lambda v, grid=grid: grid[int(v)]
            encoders[path] = lambda v, grid=grid: min(range(len(grid)), key=lambda i: abs(grid[i] - v))
        elif grid is not None or p.low == p.high:  # one value
            value = grid[0] if grid else p.low
            made[path] = CS.Constant(path, value)
            decoders[path] = encoders[path] = lambda v, value=value: value
        elif isinstance(p, sp.FloatParam):
            made[path] = CS.UniformFloatHyperparameter(path, p.low, p.high, log=p.log)
            decoders[path], encoders[path] = float, float
        else:
            made[path] = CS.UniformIntegerHyperparameter(path, p.low, p.high, log=p.log)
            decoders[path], encoders[path] = int, int
    conditions = []
    for path, p in space.items():
        parts = []
        for dep, wanted in (p.when or {}).items():
            values = [v for v in (wanted if isinstance(wanted, list) else [wanted]) if sp.drawable(space[dep], v)]
            if not values:  # sweeper's own validation refuses such a spec first
                raise ValueError(f"search.space.{path}.when: {dep} never takes {wanted!r}")
            encoded = [encoders[dep](v) for v in values]
            if len(encoded) == 1:
                parts.append(CS.EqualsCondition(made[path], made[dep], encoded[0]))
            else:
                parts.append(CS.InCondition(made[path], made[dep], encoded))
        if len(parts) == 1:
            conditions.append(parts[0])
        elif parts:
            conditions.append(CS.AndConjunction(*parts))
    cs.add(list(made.values()))
    if conditions:
        cs.add(conditions)

    def decode(config: Mapping[str, Any]) -> dict[str, Any]:
        values = dict(config)
        chosen: dict[str, Any] = {}
        for path, p in sp.ordered(space):
            if path in values and values[path] is not None and sp.active(p, chosen):
                chosen[path] = decoders[path](values[path])
        return chosen

    return cs, decode


# --- the peers ---------------------------------------------------------------------------------


def run_smac(h: Harness, budget_s: float, work: Path, max_trials: int | None) -> None:
    from smac import Callback, MultiFidelityFacade, Scenario

    cs, decode = configspace(h.space, h.seed)

    def train(config: Any, seed: int = 0, budget: float = float(h.epochs)) -> float:
        trial = h.run(decode(config), whole(budget))
        if not finite(trial.val):  # SMAC records a crash (its crash cost)
            raise RuntimeError(trial.error or "no finite validation metric")
        return h.cost(trial.val)

    class Budget(Callback):
        """Stops SMAC once the run's clock is past the budget: SMAC's own walltime_limit counts
        from optimize(), after the facade was built (that time is SMAC's overhead too)."""

        def on_tell_end(self, smbo: Any, info: Any, value: Any) -> bool | None:
            return False if h.clock() >= budget_s else None

    scenario = Scenario(
        cs,
        name=f"peer-{h.seed}",
        output_directory=work / "smac",
        deterministic=True,  # each trial is seeded by its number: one evaluation per configuration and budget
        walltime_limit=max(budget_s - h.clock(), 0.0),
        n_trials=max_trials or MANY,
        min_budget=1,
        max_budget=h.epochs,
        seed=h.seed,
    )
    MultiFidelityFacade(scenario, train, overwrite=True, logging_level=40, callbacks=[Budget()]).optimize()


def run_dehb(h: Harness, budget_s: float, work: Path, max_trials: int | None) -> None:
    from dehb import DEHB

    cs, decode = configspace(h.space, h.seed)

    def f(config: Any, fidelity: float, **kwargs: Any) -> dict[str, Any]:
        trial = h.run(decode(config), whole(fidelity))
        return {"fitness": h.cost(trial.val), "cost": trial.seconds}

    dehb = DEHB(
        f=f,
        cs=cs,
        dimensions=len(list(cs.values())),
        min_fidelity=1,
        max_fidelity=h.epochs,
        n_workers=1,
        seed=h.seed,
        output_path=work / "dehb",
        log_level="WARNING",
        save_freq="end",
    )
    if max_trials:  # run() takes one of fevals and total_cost: both through its ask/tell
        while len(h.trials) < max_trials and h.clock() < budget_s:
            job = dehb.ask()
            dehb.tell(job, f(job["config"], job["fidelity"]))
    else:
        dehb.run(total_cost=max(budget_s - h.clock(), 0.0))


def run_optuna_hb(h: Harness, budget_s: float, work: Path, max_trials: int | None) -> None:
    import optuna

    from sweeper.spec import space as sp

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        direction="maximize" if h.maximize else "minimize",
        sampler=optuna.samplers.TPESampler(seed=h.seed),
        pruner=optuna.pruners.HyperbandPruner(min_resource=1, max_resource=h.epochs),
    )

    def objective(ot: optuna.Trial) -> float:
        params = sp.suggest(h.space, ot)

        def stop(epoch: int, metrics: dict[str, float], trial: Trial) -> bool:
            if not finite(trial.val):
                return False  # the trainer fails a non-finite loss itself
            ot.report(trial.val, epoch)
            return ot.should_prune()

        trial = h.run(params, h.epochs, ot.number, stop)
        if trial.error is not None:
            raise RuntimeError(trial.error)  # a FAIL trial (caught below)
        if trial.trained < trial.epochs:
            raise optuna.TrialPruned()
        return trial.val

    study.optimize(
        objective,
        n_trials=max_trials,
        timeout=max(budget_s - h.clock(), 0.0),
        catch=(RuntimeError,),
        gc_after_trial=False,
    )


@dataclass(frozen=True)
class RayContext:
    """What each Ray trial needs from the driver (shipped once through tune.with_parameters)."""

    spec: Any
    seed: int
    start: float  # the driver's clock start (time.time(): one machine)


_WORKER: dict[str, Harness] = {}  # this Ray worker's harness: its data set kept across trials (reuse_actors)


def ray_trainable(config: dict[str, Any], ctx: RayContext) -> None:
    from ray import tune

    from sweeper.spec import space as sp

    key = f"{ctx.seed}@{ctx.start}"  # this run's (ctx is a new copy in each trial)
    h = _WORKER.get(key)
    if h is None:
        _WORKER.clear()
        h = _WORKER[key] = Harness(ctx.spec, ctx.seed, start=ctx.start)
    params: dict[str, Any] = {}
    for path, p in sp.ordered(h.space):
        if path in config and sp.active(p, params):
            params[path] = config[path]

    def stop(epoch: int, metrics: dict[str, float], trial: Trial) -> bool:
        # a trial ASHA stops never returns from this report: everything is in each one
        tune.report(
            {
                h.metric: trial.val if finite(trial.val) else (-math.inf if h.maximize else math.inf),
                "trial": {**asdict(trial), "end": time.time() - h.start},
            }
        )
        return False

    h.run(params, h.epochs, int(config["number"]), stop, score_each_epoch=True)


class DefineByRun:
    """OptunaSearch's space: sweeper's own ``suggest`` on Optuna's trial (conditions included)."""

    def __init__(self, space: dict[str, Any]) -> None:
        self.space = space

    def __call__(self, ot: Any) -> dict[str, Any]:
        from sweeper.spec import space as sp

        sp.suggest(self.space, ot)
        return {"number": ot.number}


def run_ray_asha(h: Harness, budget_s: float, work: Path, max_trials: int | None) -> None:
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
    import optuna
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # OptunaSearch's study

    class Budget(tune.Stopper):
        """Tune's time_budget_s on the run's clock: from before Ray's import, less the test scoring
        each trial reports (done in the trial after every epoch, it is the benchmark's)."""

        def __init__(self) -> None:
            self.scoring: dict[str, float] = {}

        def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
            if isinstance(result.get("trial"), dict):
                self.scoring[trial_id] = result["trial"]["scoring"]
            return False

        def stop_all(self) -> bool:
            return time.time() - h.start - sum(self.scoring.values()) >= budget_s

    # a new local Ray ("local": never a cluster found on the machine), one CPU: one trial at a time
    ray.init(
        address="local",
        num_cpus=1,
        include_dashboard=False,
        object_store_memory=200 * 2**20,  # Tune's results only (Ray's default: 30 % of the memory)
        log_to_driver=False,
        logging_level="WARNING",
        _system_config={"worker_niceness": 0},
    )
    try:
        mode = "max" if h.maximize else "min"
        tuner = tune.Tuner(
            tune.with_resources(
                tune.with_parameters(ray_trainable, ctx=RayContext(h.spec, h.seed, h.start)), {"cpu": 1}
            ),
            tune_config=tune.TuneConfig(
                metric=h.metric,
                mode=mode,
                search_alg=OptunaSearch(DefineByRun(h.space), metric=h.metric, mode=mode, seed=h.seed),
                scheduler=ASHAScheduler(max_t=h.epochs, grace_period=1),
                num_samples=max_trials or -1,
                max_concurrent_trials=1,
                reuse_actors=True,
            ),
            run_config=tune.RunConfig(name="peer", storage_path=str(work / "ray"), verbose=0, stop=Budget()),
        )
        grid = tuner.fit()
        for result in grid:
            last = (result.metrics or {}).get("trial")
            if last is not None:
                h.trials.append(Trial(**last))
    finally:
        ray.shutdown()


RUNNERS = {"smac": run_smac, "dehb": run_dehb, "optuna-hb": run_optuna_hb, "ray-asha": run_ray_asha}


def spec_path(task: str) -> Path:
    path = Path(task)
    return path if path.suffix in (".yaml", ".yml") else ROOT / "search_spaces" / f"{task}.yaml"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("peer", choices=PEERS)
    parser.add_argument("--task", default="digits", help="a shipped spec's name (search_spaces/NAME.yaml) or a path")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-s", type=float, required=True, help="device seconds (wall: one thread, parallel 1)")
    parser.add_argument("--max-trials", type=int, default=None, help="also stop after this many trials")
    parser.add_argument("--out", type=Path, required=True, help="the result, as JSON")
    parser.add_argument("--work", type=Path, default=None, help="the peer's own files (default: a temp folder)")
    parser.add_argument("--launched", type=float, default=None, help="time.time() at launch: the clock's start")
    parser.add_argument("overrides", nargs="*", help="dotted overrides of the spec (train.epochs=5)")
    args = parser.parse_intermixed_args(argv)

    h = Harness.load(spec_path(args.task), args.seed, args.overrides)
    work = args.work or Path(tempfile.mkdtemp(prefix=f"peer_{args.peer}_"))
    result: dict[str, Any] = {"peer": args.peer, "task": args.task, "seed": args.seed, "budget_s": args.budget_s}
    result.update(epochs=h.epochs, metric=h.metric, maximize=h.maximize)
    try:
        import torch  # noqa: F401  (imported before the clock, as a `sweeper run` has before its trials)

        import sweeper.trial.build  # noqa: F401

        h.start = args.launched or time.time()  # the clock: from the process's launch (run_peer)
        try:
            __import__(LIBRARIES[args.peer])
        except ImportError as exc:
            result["skipped"] = f"{LIBRARIES[args.peer]} does not import here ({sys.executable}): {exc}"
        else:
            try:
                RUNNERS[args.peer](h, args.budget_s, work, args.max_trials)
            except Exception:
                result["error"] = traceback.format_exc()[-4000:]
        result["wall_s"] = time.time() - h.start
        result["scoring_s"] = sum(t.scoring for t in h.trials)
        kept, cut = account(h.trials, args.budget_s)
        result["cut"] = cut
        # the peer's overhead before its first trial started (its import, Ray's start-up, ...)
        result["startup_s"] = kept[0].device_s - kept[0].seconds if kept else None
        result["trials"] = [{**asdict(t), "complete": t.complete} for t in kept]
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))


# --- the caller's side -------------------------------------------------------------------------


def python_for(peer: str) -> tuple[str | None, str | None]:
    """(the Python that runs ``peer``, None) or (None, why it cannot run here)."""
    if peer != "dehb":
        return sys.executable, None
    if not Path(DEHB_PYTHON).exists():
        return None, (
            f"no DEHB venv at {DEHB_PYTHON} (dehb 0.1.2 pins numpy < 2: python3 -m venv that path, then "
            f'pip install -e {ROOT} "numpy<2" dehb==0.1.2 "torch=={version("torch")}"; or set SWEEPER_DEHB_PYTHON)'
        )
    probe = "import dehb, sweeper.trial.build, importlib.metadata as m; print(m.version('torch'))"
    check = subprocess.run([DEHB_PYTHON, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    if check.returncode != 0:
        return None, f"{DEHB_PYTHON} cannot import dehb and sweeper: {check.stderr.strip().splitlines()[-1:]}"
    theirs, ours = check.stdout.strip(), version("torch")
    if theirs != ours:  # the same trial code: a torch of another version trains to other numbers, at another speed
        return None, (
            f"the DEHB venv's torch is {theirs}, not this one's {ours}: "
            f'{Path(DEHB_PYTHON).parent}/pip install "torch=={ours}"'
        )
    return DEHB_PYTHON, None


def run_peer(
    peer: str,
    task: str,
    seed: int,
    budget_s: float,
    overrides: list[str] = (),
    max_trials: int | None = None,
    work: Path | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """One peer run in a process of its own: its JSON result (see the module's doc), or
    ``{"skipped": reason}``. Raises RuntimeError when the run itself failed."""
    python, why = python_for(peer)
    if python is None:
        return {"peer": peer, "skipped": why}
    with tempfile.TemporaryDirectory(prefix="peer_") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [python, str(Path(__file__).resolve()), peer, "--task", task, "--seed", str(seed)]
        cmd += ["--budget-s", str(budget_s), "--out", str(out)]
        cmd += (["--max-trials", str(max_trials)] if max_trials else []) + (["--work", str(work)] if work else [])
        done = subprocess.run(
            [*cmd, "--launched", repr(time.time()), *overrides],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout or budget_s * 3 + 180,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
            )
        result = json.loads(out.read_text())
    if "error" in result:
        raise RuntimeError(f"peer {peer} failed:\n{result['error']}")
    return result


if __name__ == "__main__":
    # run as a script, this folder leads sys.path, and its distributed.py would shadow dask's
    # `distributed` (which SMAC and DEHB import): the peers import nothing from here
    HERE = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
    main()
