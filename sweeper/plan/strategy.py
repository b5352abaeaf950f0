"""The search strategy chosen from the budget (``search.sampler: auto``, ``search.pruner: auto``),
and the settings that cannot take effect as written.

``choose`` turns a spec that asks for ``auto`` into a concrete one (the spec every process
records and runs) and says why each value was chosen, with the numbers it used; ``sweeper
validate`` prints it. When the strategy is asked for, the settings it shapes that the spec leaves
unwritten (search.batch_size, search.fuse, search.lr_finder, search.base_first) are chosen with it; a written one is
kept. ``notes`` lists what a spec sets that cannot take effect (a fused model larger than a
batch, a pruner with one epoch to judge, ...), for every spec, ``auto`` or not.

Each rule's reason is given at its constant, which cites the docs section holding its figures
(docs/strategy.md, mostly).
Pure: the facts beyond the spec (the device, what the plugins allow) are found out by the
resolve step (resolve.py), which applies the strategy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sweeper.spec import SweepSpec
from sweeper.spec import space as sp
from sweeper.spec.search import PROMOTING

# TPE draws its first trials at random until this many have finished (Optuna's TPESampler
# n_startup_trials default, which sweeper keeps): a sweep that proposes no trial after this many
# results gains nothing from TPE over random sampling.
TPE_STARTUP = 10
# MedianPruner prunes only once this many trials have finished (search.pruner.startup_trials's
# default, Optuna's too): fewer earlier results than this and a median pruner never stops a trial.
MEDIAN_STARTUP = 5
# Successive halving / Hyperband keep 1 trial in REDUCTION of each rung; rungs sit at epochs
# 1, 3, 9, ... (min_epochs x REDUCTION^k; Li et al. 2018, Optuna's and Ray's default). With fewer
# than REDUCTION epochs there is one rung, so "pruning" is a single cut after epoch 1 of a curve
# that has barely started.
REDUCTION = 3
# A rung judges a trial only while a cut there saves at least 1/reduction_factor of its epochs: past
# epochs x (1 - 1/reduction_factor) a pruned trial had almost all its cost paid and is lost as a
# candidate: with 10 epochs Optuna's rungs are 1, 3 and 9 (what that cost:
# docs/strategy.md#against-the-peers). Hyperband itself (Li et al. 2018), SMAC3 and DEHB place their top rung at
# max / reduction_factor.
# search.pruner.check_rungs under auto: the pruner stops no trial until CHECKED_TRIALS have
# completed, and cuts only at epochs whose values rank those trials like their final ones. Worth it
# where those trials cost at most 1/CHECKED_SHARE of the sweep's: on diabetes (~200 trials in its
# 1-minute budget) 8 of them lifted the test score from 56.81 to 55.98 (MAE), level with every
# peer, and left digits at 0.994 (docs/strategy.md#rungs-that-predict-searchprunercheck_rungs).
CHECKED_TRIALS = 8
CHECKED_SHARE = 10


def rungs(min_epochs: int, reduction_factor: int, epochs: int) -> list[int]:
    """The epochs at which successive halving and Hyperband judge a trial (bracket 0's; a later
    bracket's are the tail of these): min_epochs x reduction_factor^k, while a cut there saves at
    least 1/reduction_factor of the epochs."""
    last = last_rung(reduction_factor, epochs)
    out, rung = [], min_epochs
    while rung <= last:
        out.append(rung)
        rung *= reduction_factor
    return out


def last_rung(reduction_factor: int, epochs: int) -> int:
    """The last epoch at which a pruner may stop a trial (``rungs``)."""
    return math.floor(epochs * (1 - 1 / reduction_factor))


# Fusing pays from this many members of one architecture per fused model. CPU: the smallest group
# that ran faster than solo end to end through the CLI (`python benchmarks/gpu_check.py --cpu
# fused`); smaller groups stayed within the run-to-run spread. CUDA: where the fused engine alone
# (benchmarks/fused.py) already pays well on a CPU, since one small trial leaves a GPU idle; the
# CPU's figure until benchmarks/gpu_check.py has run on a GPU. The figures:
# docs/strategy.md#when-fusing-pays.
FUSE_PAYS_FROM = {"cpu": 16, "cuda": 8}
# Fusing proposes parallel x members trials per batch, each proposed without the others' results:
# fuse only when the budget holds at least this many such batches, where TPE keeps most of its
# gain over random sampling (in 2 batches, about half of it). The figures (`python
# benchmarks/strategy.py`): docs/strategy.md#what-batches-cost-the-sampler.
FUSED_BATCHES_AT_LEAST = 4
# The LR range test narrows optimizer.args.lr to [s/10, s*10] (lr_finder.factor's default): 2
# decades. A declared range of 2 decades or less is not narrowed, so the test would only cost; it
# is used from 3 decades, where it cuts at least a third of the range. What it bought on digits
# over 5 decades: docs/lr-finder.md#does-it-pay.
LR_MIN_DECADES = 3.0
# A range test costs about half a trial per configuration (sweeper/search/lr_range_tests.py), and on
# digits it did not pay for its time (docs/lr-finder.md#does-it-pay). Turned on only where its
# cost is under 5% of the budget: trials >= 10 x configurations.
LR_TEST_TRIALS = 0.5
LR_TEST_SHARE = 0.05
# search.base_first: the sampler's first trials are random (TPE's startup, or random sampling),
# and a random point of a derived space can be a large, slow model; the base point is the one a
# user would try first. Without it, --auto at a small budget spent it on such trials and never
# reached the target (docs/strategy.md#how-the-strategies-compare-on-real-sweeps).
BASE_FIRST_REASON = (
    "the first trial is the base point (the spec's values, else the plugins' defaults, else the "
    "ranges' centres): a known reasonable trial before the sampler's random start"
)
# search.staleness with several workers: benchmarks/scale.py's simulated workers, busy with and without it
STALENESS_MEASURED = "docs/many-machines.md#reproducible-and-busy"
# The benchmark against the peers a user would pick instead (benchmarks/search_quality.py: SMAC3,
# DEHB, Optuna TPE + Hyperband and Ray ASHA, each scored on held-out test data at equal device
# time): where it measured the rule that chose a setting, `validate` cites this section, which holds
# the figures (the rules for fusing, batches and the LR test were measured by their own benchmarks).
AGAINST_PEERS = "docs/strategy.md#against-the-peers"
# Spec paths that split a batch into several fused models when they differ between trials:
# trial/fused.py fuse_key (its SHARED train settings, the data set and the whole model).
FUSE_SPLITTING = ("model.", "dataset.") + tuple(
    f"train.{name}"
    for name in ("batch_size", "accumulate", "epochs", "eval_batch_size", "precision", "device", "deterministic")
)


@dataclass(frozen=True)
class Facts:
    """What the strategy needs to know beyond the spec (resolve.py finds it out)."""

    cuda: bool  # trials train on a CUDA device (train.device is not cpu and one is present)
    unfusable: str | None = None  # why the spec's trials cannot train fused (a plugin opts out, ...)
    trial_s: float | None = None  # device-seconds of one full trial at the base point (sizing timed it)


@dataclass(frozen=True)
class Choice:
    setting: str  # the spec path, e.g. search.sampler
    value: str  # as the resolved spec holds it
    reason: str  # one line, with the numbers used
    measured: str | None = None  # where the peer benchmark measured the rule (AGAINST_PEERS), if it did

    def describe(self) -> str:
        """One line for `sweeper validate`: the value, why, and whether the peers measured the rule."""
        evidence = (
            f"rule measured against the peers: {self.measured}"
            if self.measured
            else "rule not measured against the peers"
        )
        return f"{self.setting}: {self.value} — {self.reason} [{evidence}]"


@dataclass(frozen=True)
class Strategy:
    spec: SweepSpec  # nothing left on auto that the strategy resolves
    choices: tuple[Choice, ...]  # empty when the spec asks for no auto


def wanted(spec: SweepSpec) -> bool:
    """Whether ``spec`` asks for the strategy (sampler or pruner auto)."""
    return spec.search.sampler == "auto" or spec.search.pruner.type == "auto"


def choose(spec: SweepSpec, machine: Facts) -> Strategy:
    """``spec`` with its ``auto`` strategy settings resolved, and why (unchanged if none)."""
    if not wanted(spec):
        return Strategy(spec, ())
    search = spec.search
    written = search.model_fields_set
    n = _trial_cap(spec)
    tree = spec.model_dump()
    out = tree["search"]
    choices: list[Choice] = []
    batched = search.backend == "optuna" and search.reproducible
    if batched:
        members, why = _fuse(spec, machine, n, None if "batch_size" not in written else search.batch_size)
        if "fuse" not in written:
            out["fuse"] = members if members > 1 else "off"
            choices.append(Choice("search.fuse", str(out["fuse"]), why))
        if "batch_size" not in written:
            fused = members if "fuse" not in written else search.fuse if isinstance(search.fuse, int) else 1
            out["batch_size"], reason = _batch_size(search.parallel, fused, n)
            choices.append(Choice("search.batch_size", str(out["batch_size"]), reason))
        if "staleness" not in written:
            out["staleness"], reason = _staleness(search.parallel)
            choices.append(Choice("search.staleness", str(out["staleness"]), reason))
    # trials in flight without each other's results: a batch, and the search.staleness batches before it
    batch = out["batch_size"] * (out["staleness"] + 1) if batched else search.parallel
    if search.sampler == "auto":
        out["sampler"], reason = _sampler(spec, n, batch)
        measured = AGAINST_PEERS if out["sampler"] == "tpe" else None
        choices.append(Choice("search.sampler", out["sampler"], reason, measured))
    if search.pruner.type == "auto":
        pruner, reason = _pruner(spec, n, batch, out["sampler"])
        out["pruner"] = {**out["pruner"], **pruner}
        if pruner["type"] not in PROMOTING:  # nothing is stopped: none to promote, no rung to check
            out["pruner"].update(promote=False, check_rungs=0)
        elif batched and "check_rungs" not in search.pruner.model_fields_set:
            checked, why = _check_rungs(spec, n, machine.trial_s)
            out["pruner"]["check_rungs"] = checked
            reason = f"{reason}; {why}"
        measured = AGAINST_PEERS if pruner["type"] == "hyperband" else None
        choices.append(Choice("search.pruner", _describe_pruner(out["pruner"]), reason, measured))
    if search.backend == "optuna" and "base_first" not in written:
        out["base_first"] = True
        choices.append(Choice("search.base_first", "true", BASE_FIRST_REASON, AGAINST_PEERS))
    if search.backend == "optuna" and "lr_finder" not in written:
        enabled, reason = _lr_finder(spec, n)
        out["lr_finder"] = {**out["lr_finder"], "enabled": enabled}
        choices.append(Choice("search.lr_finder.enabled", str(enabled).lower(), reason))
    return Strategy(SweepSpec.model_validate(tree), tuple(choices))


def _trial_cap(spec: SweepSpec) -> int | None:
    search = spec.search
    if search.sampler == "auto":  # a grid's size caps the budget only once grid is chosen
        return search.n_trials
    return search.trial_cap(search.n_trials)


def architectures(space: dict[str, sp.Param]) -> tuple[float, list[str]]:
    """How many distinct fused models the searched values can make (inf: a continuous value
    splits every trial from the others), and the paths that split them."""
    count: float = 1
    paths = []
    for path, param in space.items():
        if not path.startswith(FUSE_SPLITTING):
            continue
        paths.append(path)
        try:
            count *= sp.grid_count(path, param)
        except ValueError:  # a continuous value: each trial its own shapes or step sequence
            count = math.inf
    return count, paths


def _fuse(spec: SweepSpec, machine: Facts, n: int | None, batch_size: int | None) -> tuple[int, str]:
    """Members per fused task of one worker (1: no fusing), and why."""
    parallel = spec.search.parallel
    device = "cuda" if machine.cuda else "cpu"
    pays = FUSE_PAYS_FROM[device]
    if machine.unfusable is not None:
        return 1, f"no trial of this spec can train fused: {machine.unfusable}"
    if spec.train.devices > 1:
        return 1, f"train.devices is {spec.train.devices}: each trial trains on its own devices (DDP), not fused"
    count, paths = architectures(spec.search.space)
    if math.isinf(count):
        return 1, (
            f"the parameters that shape the model ({', '.join(paths)}) take a continuous range or more than "
            f"a grid's {sp.MAX_GRID_POINTS:,} combinations: trials rarely share a fused model's shapes"
        )
    kinds = int(count)
    members = pays * kinds  # per worker's task: about `pays` per architecture
    shared = f"{kinds} architectures ({', '.join(paths)})" if kinds > 1 else "one architecture"
    measured = f"fusing pays from {pays} members of one architecture on {device} (docs/strategy.md)"
    if batch_size is not None:
        per_worker = batch_size // parallel
        if per_worker // kinds < pays:
            return 1, (
                f"search.batch_size {batch_size} over {parallel} worker(s) gives {per_worker} trials a task, "
                f"{per_worker / kinds:.1f} per fused model of {shared}; {measured}"
            )
        return per_worker, f"{per_worker / kinds:.1f} trials per fused model of {shared} a task; {measured}"
    need = FUSED_BATCHES_AT_LEAST * parallel * members
    if n is None or n < need:
        budget = f"{n} trials" if n is not None else "no trial cap"
        return 1, (
            f"{budget} < {need} ({FUSED_BATCHES_AT_LEAST} batches of {parallel} worker(s) x {members} trials, "
            f"{pays} per fused model of {shared}); {measured}"
        )
    return members, f"{n} trials hold {n // (parallel * members)} batches of {parallel} x {members}; {measured}"


def _batch_size(parallel: int, members: int, n: int | None) -> tuple[int, str]:
    size = parallel * members
    if members > 1:
        why = f"{parallel} worker(s) x {members} fused trials: every worker trains one fused task a batch"
    else:
        why = (
            f"= search.parallel ({parallel}): every worker busy, and each trial proposed "
            f"knowing every result but those of its own batch"
        )
    if n is not None and size > max(n, parallel):  # never below parallel: the spec refuses idle workers
        return max(n, parallel), f"{why}; capped at the {n} trials"
    return size, why


def _staleness(parallel: int) -> tuple[int, str]:
    if parallel == 1:
        return 0, "one worker trains one trial at a time: each batch knows every earlier result at no wait"
    return 1, (
        f"{parallel} workers: a batch is proposed while the one before it still runs, so a worker waits "
        f"only for a batch two back (without: for the slowest trial of its batch; {STALENESS_MEASURED})"
    )


def _sampler(spec: SweepSpec, n: int | None, batch: int) -> tuple[str, str]:
    search = spec.search
    space = search.space
    if search.pruner.type == "pbt":
        return "random", "search.pruner.type pbt picks new values itself and needs random"
    if not space:
        return "random", "search.space is empty: there is nothing to model"
    grid = _grid_size(space)
    if grid is not None and n is not None and grid <= n:
        return "grid", f"the space has {grid} points, n_trials {n}: each point once, none drawn twice"
    if n is not None and n - batch < TPE_STARTUP:
        return "random", (
            f"at most {max(0, n - batch)} trials finish before the last {batch} are proposed; TPE "
            f"samples at random until {TPE_STARTUP} have (its n_startup_trials)"
        )
    several = f"; {len(spec.goals)} objectives (TPE models each)" if len(spec.goals) > 1 else ""
    return "tpe", (
        f"{'no trial cap' if n is None else f'{n} trials'}, {batch} at a time without each other's results: "
        f"TPE models the results after its {TPE_STARTUP} random startup trials; with limited parallelism it is "
        f"the method Optuna recommends (Ozaki et al. 2020), categorical and conditional parameters included{several}"
    )


def _grid_size(space: dict[str, sp.Param]) -> int | None:
    if any(param.when for param in space.values()):
        return None  # a grid enumerates every combination, conditions ignored
    try:
        return sp.grid_size(space)
    except ValueError:
        return None


def _pruner(spec: SweepSpec, n: int | None, batch: int, sampler: str) -> tuple[dict[str, Any], str]:
    epochs = spec.train.epochs
    if len(spec.goals) > 1:
        return {"type": "none"}, f"{len(spec.goals)} objectives: a pruner compares one metric"
    if epochs < REDUCTION:
        return {"type": "none"}, (
            f"train.epochs {epochs} < {REDUCTION}: one rung (epoch 1) to judge at, a cut on a curve "
            f"that has barely started"
        )
    if n is not None and n - batch < MEDIAN_STARTUP:
        return {"type": "none"}, (
            f"at most {max(0, n - batch)} trials finish before the last batch; a pruner compares with "
            f"at least {MEDIAN_STARTUP} earlier ones"
        )
    source = "Optuna's benchmarks (kurobako): best pruner for"
    if sampler == "random":
        return {"type": "median", "min_epochs": 1, "startup_trials": MEDIAN_STARTUP}, (
            f"{source} random sampling; prunes after {MEDIAN_STARTUP} trials have finished"
        )
    at = ", ".join(str(r) for r in rungs(1, REDUCTION, epochs))
    return {"type": "hyperband", "min_epochs": 1, "reduction_factor": REDUCTION}, (
        f"{source} TPE; rungs at epochs {at} of {epochs} (none past {last_rung(REDUCTION, epochs)}: a later "
        f"cut saves under 1/{REDUCTION} of a trial), 1 in {REDUCTION} kept at each"
    )


def _check_rungs(spec: SweepSpec, n: int | None, trial_s: float | None) -> tuple[int, str]:
    """search.pruner.check_rungs under auto: CHECKED_TRIALS uncut trials where they cost at most
    1/CHECKED_SHARE of the trials the sweep is expected to run (its cap, or its budget over one
    base-point trial: pruned trials cost less, so more run), else none."""
    budget = spec.search.budget
    by_budget = None if budget is None or not trial_s else int(budget.device_hours * 3600 / trial_s)
    expected = min((e for e in (n, by_budget) if e is not None), default=None)
    if expected is None:
        return CHECKED_TRIALS, f"check_rungs {CHECKED_TRIALS}: no cap on the trials, the first {CHECKED_TRIALS} uncut"
    if expected < CHECKED_SHARE * CHECKED_TRIALS:
        return 0, (
            f"no rung checked: ~{expected} trials expected, {CHECKED_TRIALS} uncut would cost over "
            f"1/{CHECKED_SHARE} of them"
        )
    return CHECKED_TRIALS, (
        f"check_rungs {CHECKED_TRIALS}: ~{expected} trials expected, the first {CHECKED_TRIALS} uncut cost "
        f"under 1/{CHECKED_SHARE} of them and tell which rungs predict the end"
    )


def _describe_pruner(p: dict[str, Any]) -> str:
    promote = ", promote" if p.get("promote") else ""
    promote += f", check_rungs {p['check_rungs']}" if p.get("check_rungs") else ""
    if p["type"] == "median":
        return f"median (min_epochs {p['min_epochs']}, startup_trials {p['startup_trials']}{promote})"
    if p["type"] in ("asha", "hyperband"):
        return f"{p['type']} (min_epochs {p['min_epochs']}, reduction_factor {p['reduction_factor']}{promote})"
    return str(p["type"])


def _lr_finder(spec: SweepSpec, n: int | None) -> tuple[bool, str]:
    lr = spec.search.space.get("optimizer.args.lr")
    if not isinstance(lr, sp.FloatParam):
        return False, "optimizer.args.lr is not searched as a float"
    decades = math.log10(lr.high / lr.low) if lr.low > 0 else math.inf
    if decades < LR_MIN_DECADES:
        return False, (
            f"the lr range spans {decades:.1f} decades; the test narrows it to 2, which pays from "
            f"{LR_MIN_DECADES:g} (docs/strategy.md)"
        )
    configs = _lr_configs(spec.search.space)
    need = math.ceil(configs * LR_TEST_TRIALS / LR_TEST_SHARE)
    if n is None or n < need:
        return False, (
            f"{configs} range test(s) cost about {configs * LR_TEST_TRIALS:g} trials, more than "
            f"{LR_TEST_SHARE:.0%} of {n if n is not None else 'an uncapped number of'} trials "
            f"(on digits it cost 1.08x the time and found 0.99 no sooner: docs/lr-finder.md)"
        )
    return True, (
        f"lr spans {decades:.1f} decades; {configs} range test(s) cost about {configs * LR_TEST_TRIALS:g} "
        f"trials, under {LR_TEST_SHARE:.0%} of {n}"
    )


def _lr_configs(space: dict[str, sp.Param]) -> int:
    """Range tests the warm start runs: one per distinct (dataset, model, optimizer plugin, batch
    size), at most 8 (search/lr_range_tests.py CONFIG_PATHS and MAX_CONFIGS; else one)."""
    count = 1
    for path in ("dataset.plugin", "model.plugin", "optimizer.plugin", "train.batch_size"):
        param = space.get(path)
        if isinstance(param, sp.CategoricalParam):
            count *= len(param.choices)
    return count if count <= 8 else 1


def notes(spec: SweepSpec, machine: Facts) -> list[str]:
    """What ``spec`` sets that cannot take effect as written, each with the fix (for every spec,
    auto or not; `sweeper validate` and `sweeper run` print them as warnings)."""
    search, train = spec.search, spec.train
    out: list[str] = []
    n = search.trial_cap(search.n_trials) if search.sampler != "auto" else search.n_trials
    batched = search.backend == "optuna" and search.reproducible
    if batched:
        out += _fuse_notes(spec, machine)
    if search.backend == "optuna" and n is not None and search.parallel > n:
        out.append(f"search.parallel {search.parallel} > the {n} trials: {search.parallel - n} worker(s) never train")
    if search.pruner.type not in ("none", "auto", "pbt"):
        if train.epochs == 1:
            out.append(
                f"search.pruner.type {search.pruner.type} with train.epochs 1: a trial is judged after an "
                f"epoch, and after its only one nothing is left to save; set search.pruner.type: none"
            )
        elif search.pruner.min_epochs >= train.epochs:
            out.append(
                f"search.pruner.min_epochs {search.pruner.min_epochs} >= train.epochs {train.epochs}: no "
                f"trial is stopped before its last epoch; lower min_epochs"
            )
        elif search.pruner.type in ("asha", "hyperband") and not rungs(
            search.pruner.min_epochs, search.pruner.reduction_factor, train.epochs
        ):
            last = last_rung(search.pruner.reduction_factor, train.epochs)
            out.append(
                f"search.pruner.min_epochs {search.pruner.min_epochs}: the {search.pruner.type} pruner judges "
                f"no rung past epoch {last} of {train.epochs} (a later cut saves under "
                f"1/{search.pruner.reduction_factor} of a trial), so it stops no trial; lower min_epochs"
            )
        elif search.pruner.type == "median" and n is not None and search.pruner.startup_trials >= n:
            out.append(
                f"search.pruner.startup_trials {search.pruner.startup_trials} >= the {n} trials: the median "
                f"pruner never has enough finished trials to prune"
            )
    if search.sampler == "tpe" and n is not None and batched and n - search.unseen < TPE_STARTUP:
        out.append(
            f"search.sampler tpe samples at random until {TPE_STARTUP} trials have finished; with {n} "
            f"trials, {search.unseen} at a time without each other's results, it never models: use random "
            f"(or sampler: auto)"
        )
    if search.sampler == "grid" and search.n_trials is not None and n is not None and n < search.n_trials:
        out.append(f"search.n_trials {search.n_trials}: the grid has {n} points, so {n} trials run")
    return out


def _fuse_notes(spec: SweepSpec, machine: Facts) -> list[str]:
    search = spec.search
    fuse = search.fuse
    if fuse == "off" or (fuse == "auto" and not machine.cuda) or spec.train.devices > 1:
        return []
    size = search.fuse_size(machine.cuda)
    if size <= 1:
        return []
    out = []
    if isinstance(fuse, int) and fuse > search.batch_size:
        out.append(
            f"search.fuse {fuse} with search.batch_size {search.batch_size}: a fused model holds trials of "
            f"one batch, so no more than {search.batch_size}; set search.batch_size >= {fuse * search.parallel} "
            f"({search.parallel} worker(s) x {fuse})"
        )
    tasks = -(-search.batch_size // size)  # a batch is cut into tasks of `size` trials, one per worker
    if tasks < search.parallel:
        out.append(
            f"search.fuse {size} cuts a batch of {search.batch_size} into {tasks} task(s) for "
            f"{search.parallel} workers: {search.parallel - tasks} worker(s) wait each batch; set "
            f"search.fuse <= {max(1, search.batch_size // search.parallel)} or search.batch_size >= "
            f"{size * search.parallel}"
        )
    if machine.unfusable is not None:
        out.append(f"search.fuse {fuse}: each trial trains alone, {machine.unfusable}; set search.fuse: off")
        return out
    count, paths = architectures(search.space)
    per_model = min(size, search.batch_size) / count
    pays = FUSE_PAYS_FROM["cuda" if machine.cuda else "cpu"]
    if per_model < pays:
        kinds = "a different one each trial" if math.isinf(count) else f"{int(count)}"
        shared = f"{', '.join(paths)} make(s) {kinds} architectures: " if paths else ""
        out.append(
            f"search.fuse {fuse}: {shared}about {per_model:.1f} trials per fused model, and fusing pays "
            f"from {pays} on {'cuda' if machine.cuda else 'cpu'} (docs/strategy.md); set search.fuse: off, "
            f"or a larger search.batch_size"
        )
    return out
