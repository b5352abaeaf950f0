"""The spec's ``search:`` section: sampler, pruner, budget, backend (Optuna's storage and
workers, or Ray's cluster and resources), fusion, warm start, the searched space; each option
checked against the others, and against the backend that would otherwise ignore it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from sweeper.spec import space as sp
from sweeper.spec.base import MAX_DEVICE_HOURS, MAX_EPOCHS, MAX_FUSED, MAX_PROCESSES, MAX_SECONDS, MAX_TRIALS, Strict
from sweeper.spec.storage import check_storage_url, no_password

# Sections the search space may address; the others configure the sweep itself.
SEARCHABLE_ROOTS = ("task", "dataset", "model", "optimizer", "schedule", "train")


class PrunerSpec(Strict):
    """Early stopping (none/median/asha/hyperband), or Population Based Training (pbt, backend ray
    with sampler random): every perturbation_interval epochs, trials in the bottom quantile take
    the weights, optimizer state and epoch of a top-quantile trial and go on with its
    hyperparameters mutated (resampled from the search range, or scaled by 0.8/1.2)."""

    # auto: chosen from the epochs, the budget and the sampler (plan/strategy.py)
    type: Literal["auto", "none", "median", "asha", "hyperband", "pbt"] = "none"
    min_epochs: int = Field(default=1, ge=1, le=MAX_EPOCHS, description="no trial is stopped before this epoch")
    # asha/hyperband: keep 1/reduction_factor per rung; more than 100 keeps nobody past the first rung
    reduction_factor: int = Field(default=3, ge=2, le=100)
    startup_trials: int = Field(default=5, ge=0, le=MAX_TRIALS)  # median: trials completed before it prunes
    # median/asha/hyperband, reproducible mode: a trial the pruner stops pauses with its training
    # state, and a later batch resumes it where the pruner's own rule, applied again to the
    # earlier batches' trials, now keeps it (ASHA's promotion, Li et al. 2020); false: stopped for good
    promote: bool = False
    # median/asha/hyperband, reproducible mode: the pruner stops no trial until this many have
    # completed, and never at an epoch whose values ranked those uncut trials unlike their final
    # values (a rung that does not predict the end stops nothing; search/optuna/batches.py); 0: off
    check_rungs: int = Field(default=0, ge=0, le=MAX_TRIALS)
    perturbation_interval: int = Field(
        default=2,
        ge=1,
        le=MAX_EPOCHS,
        description="pbt: epochs between exploit/explore decisions (and between a trial's checkpoints)",
    )
    quantile_fraction: float = Field(
        default=0.25,
        gt=0,
        le=0.5,
        description="pbt: the bottom fraction of the population copies the top fraction (Ray's default)",
    )
    # pbt: search.space paths PBT mutates; default: the float parameters under optimizer.args.
    # (lr, weight_decay, ...). Only optimizer.args.* and schedule.args.*: the rest of a trial
    # (model shape, data, batch size) must match the weights it takes over.
    mutations: list[str] | None = Field(default=None, description="pbt: search.space paths to mutate")
    # pbt: every trial waits at each perturbation for the others (idle slots), so every round
    # compares the whole population; false: a trial is compared with whoever reported so far
    synch: bool = False


class LRFinderSpec(Strict):
    """LR range test before the search, to warm-start it (see sweeper/search/lr_range_tests.py)."""

    enabled: bool = False
    steps: int = Field(default=100, ge=10, le=100_000, description="optimizer steps of each range test (its cost)")
    min_lr: float | None = Field(default=None, gt=0, description="default: min(1e-6, low of the lr range)")
    max_lr: float | None = Field(default=None, gt=0, description="default: max(1.0, high of the lr range)")
    # enqueue: first trial at the suggestion; narrow: LR range [s/factor, s*factor]; both: both
    policy: Literal["enqueue", "narrow", "both"] = "both"
    factor: float = Field(default=10.0, gt=1.0)


class ResourcesSpec(Strict):
    """What one trial reserves on a Ray node (backend ray)."""

    cpu: float = Field(default=1, gt=0, description="CPU cores per trial; torch uses max(1, int(cpu)) threads")
    # Unset: 1 (train.devices) when the Ray cluster has GPUs, else 0. A trial that reserves no GPU
    # sees none (Ray hides them), so a default of 0 would train every trial on the CPU of a GPU
    # machine. A trial's DDP ranks run inside what it reserves (trial/launch.py).
    gpu: float | None = Field(
        default=None,
        ge=0,
        description="GPUs per trial; fractions share a GPU (0.5: two "
        "trials); default: 1 when the cluster has GPUs, else 0",
    )


class RaySpec(Strict):
    """Ray Tune backend settings (backend ray)."""

    # Ray cluster to join ('HOST:6379', 'auto', 'ray://HOST:10001'); default: $RAY_ADDRESS, else
    # a local Ray started for the sweep and stopped after it.
    address: str | None = None
    # Where Tune keeps trial results, checkpoints and its experiment state (what a re-run resumes
    # from). Default: <out>/ray. Multi-node clusters need storage every node reaches (s3://, gs://,
    # or file:// on a shared mount).
    storage_path: str | None = None
    max_concurrent_trials: int | None = Field(
        default=None, ge=1, le=MAX_TRIALS, description="default: as many as resources fit"
    )
    # Reusing actors between trials: a trial started in an earlier trial's actor starts far sooner
    # than in a new one (docs/ray.md#measured).
    reuse_actors: bool = True
    max_failures: int = Field(default=0, ge=0, le=1000, description="restarts of a trial whose worker or node died")
    # Local Ray only (ignored when joining a cluster): CPU cores it may use (default: all) and
    # its object store in MiB (trials pass little data through it; Ray's default is 30% of RAM).
    num_cpus: int | None = Field(default=None, ge=1, le=MAX_PROCESSES)
    object_store_mb: int = Field(default=256, ge=80, le=1 << 24)  # 16 TiB: beyond any node's memory


# The pruners whose stopped trials search.pruner.promote may resume (auto: checked once chosen).
PROMOTING = ("auto", "median", "asha", "hyperband")

# Search options that only the Optuna backend has, and what to use with backend ray instead.
OPTUNA_ONLY = {
    "parallel": "search.ray.max_concurrent_trials and search.resources",
    "reproducible": "nothing: Ray Tune schedules by completion order",
    "batch_size": "nothing: Ray Tune asks one trial at a time",
    "staleness": "nothing: Ray Tune asks one trial at a time",
    "storage": "search.ray.storage_path",
    "lr_finder": "a separate `sweeper lr-find` run, then narrow optimizer.args.lr",
    "max_retries": "search.ray.max_failures (Tune restarts a failed trial from its checkpoint)",
    "fuse": "nothing yet: Ray Tune runs one trial per actor",
    "warm_start": "nothing yet: Ray Tune starts each sweep from scratch",
    "base_first": "nothing yet: Ray Tune's first trial is its sampler's",
    "family_round": "nothing yet: Ray Tune searches every family throughout",
    "rung_model": "nothing: Ray Tune's searchers model the results they are given",
}


class BudgetSpec(Strict):
    """What the sweep may spend, counted across every process and machine in its ledger."""

    device_hours: float = Field(
        gt=0,
        le=MAX_DEVICE_HOURS,
        description="device-hours the sweep holds (GPU-hours on CUDA, core-hours of torch threads on the CPU), "
        "start-up and finish included: `sweeper run` ends within device_hours / devices of wall clock",
    )


class AutoSpaceSpec(Strict):
    """``search.space: auto`` (or ``search.auto``): the search space derived from the plugins'
    declared priors (sweeper/pluginhost/auto_space.py). Each list names the plugins to choose
    among; unset: the spec's own plugin (schedules: none or cosine when the spec names none)."""

    models: list[str] | None = Field(default=None, min_length=1)
    optimizers: list[str] | None = Field(default=None, min_length=1)
    schedules: list[str] | None = Field(default=None, min_length=1)
    # the training settings that matter too: train.batch_size, train.label_smoothing (classification)
    train: bool = True


# The family round: trials of a ninth of the epochs, half the families kept; under 9 epochs each
# family once, whole, none dropped (FamilyRound.at_low_fidelity).
ROUND_FRACTION = 9
ROUND_KEEP = 2


class FamilyRound(Strict):
    """The first round across model families (set by ``search.auto`` when the data brought
    several, pluginhost/auto_space.py): trial k of the sweep, for k < len(families), trains
    family k at its base point for ``epochs`` epochs and stops there (none of the run's epochs:
    it runs whole); then the search goes on within the ``keep`` families whose round trial
    scored best (its objective at its last epoch; all of them: nothing dropped). Decided from
    those trials' results only, so the same for 1 or N workers."""

    families: list[str] = Field(min_length=2)
    epochs: int = Field(ge=1, le=MAX_EPOCHS)
    keep: int = Field(ge=1)

    @model_validator(mode="after")
    def _keep_fewer(self) -> FamilyRound:
        if self.keep > len(self.families):
            raise ValueError(
                f"search.family_round.keep ({self.keep}) must be at most the number of families ({len(self.families)})"
            )
        return self

    def holds(self, slot: int) -> bool:
        """True if the sweep's trial at ``slot`` is one of the round's (the sweep's first slots)."""
        return slot < len(self.families)

    @property
    def drops(self) -> bool:
        """True if the round drops families (false: each runs once, whole, and all are searched)."""
        return self.keep < len(self.families)

    def within(self, choices: list[Any]) -> FamilyRound | None:
        """This round over those of its families still among ``choices`` (after sizing dropped
        some); None where fewer than two are left."""
        left = [f for f in self.families if f in choices]
        if len(left) < 2:
            return None
        keep = len(left) if not self.drops else min(self.keep, len(left) - 1)
        return self.model_copy(update={"families": left, "keep": keep})

    @classmethod
    def at_low_fidelity(cls, families: list[str], epochs: int) -> FamilyRound | None:
        """The round the auto space sets: each family for a ninth of the epochs (Hyperband's
        lowest rung at reduction factor 3, two rungs below the full run), and half the families
        kept, rounded up (of 2 or 3 families, 1 or 2; of 4, 2): successive halving's first cut,
        no deeper, as a ranking at a ninth of the run is noisy. A run of fewer than 9 epochs has
        no fidelity that cheap (one epoch is a third of a 3-epoch run, and a ranking after one
        epoch misjudges the models that start slow): each family then runs once, whole, and
        none is dropped."""
        if epochs < ROUND_FRACTION:
            return cls(families=list(families), epochs=epochs, keep=len(families))
        return cls(families=list(families), epochs=-(-epochs // ROUND_FRACTION), keep=-(-len(families) // ROUND_KEEP))


class SearchSpec(Strict):
    backend: Literal["optuna", "ray"] = "optuna"
    # auto: chosen from the space, the budget and the device (plan/strategy.py), said by `validate`
    sampler: Literal["auto", "tpe", "random", "grid", "cmaes", "gp", "nsga2"] = "tpe"
    population: int | None = Field(
        default=None,
        ge=2,
        le=MAX_TRIALS,
        description="nsga2: trials per generation (default: Optuna's 50; the first generation is random)",
    )
    pruner: PrunerSpec = PrunerSpec()
    n_trials: int | None = Field(default=20, ge=1, le=MAX_TRIALS, description="total, counting trials already done")
    timeout: float | None = Field(
        default=None,
        gt=0,
        le=MAX_SECONDS,
        description="seconds from the start (or resume) of the sweep by `sweeper run`; no trial is claimed after it",
    )
    # `sweeper run`: the sweep ends within budget / devices of wall clock from its launch
    # (plan/budget_clock.py); every process: no trial is claimed once the finished trials' device
    # time reaches it (with n_trials and timeout: whichever comes first).
    budget: BudgetSpec | None = None
    parallel: int = Field(default=1, ge=1, le=MAX_PROCESSES, description="worker processes on this machine")
    # Reproducible: trials are proposed in batches of batch_size and pruned against the trials of
    # earlier batches only, so the trial table does not depend on `parallel` or timing.
    reproducible: bool = True
    batch_size: int = Field(default=4, ge=1, le=MAX_FUSED, description="trials proposed together (reproducible mode)")
    # Bounded staleness (reproducible mode): a batch is proposed, and its trials pruned, knowing the
    # results of every batch but its own and the `staleness` batches before it, so it can start
    # while those run; a worker waits only while a batch older than that still runs. 0: each batch
    # waits for every earlier one (docs/many-machines.md#reproducible-and-busy).
    staleness: int = Field(
        default=0, ge=0, le=MAX_TRIALS, description="batches proposed before the earlier ones end (reproducible mode)"
    )
    # Fused trials (trial/fused.py): the trials of a proposed batch that share an architecture train
    # as one model in one process. N: up to N per fused model; off: never; auto: on CUDA only, the
    # batch split evenly over the workers (on a CPU, groups that small ran no faster than solo beyond
    # the run-to-run spread; on a GPU one small trial leaves it mostly idle). When fusing pays, and
    # the thresholds the auto strategy uses: plan/strategy.py FUSE_PAYS_FROM, docs/strategy.md#when-fusing-pays.
    fuse: Literal["off", "auto"] | int = Field(
        default="auto",
        description="trials fused into one model: off, auto (on CUDA) or a number; experimental (docs/api.md)",
    )
    storage: str | None = Field(
        default=None,
        description="Optuna storage URL shared by every process serving "
        "the sweep, e.g. postgresql+psycopg://user@host/db; default: sqlite in --out",
    )
    # Leases: a process renews the lease of each trial it trains every heartbeat_s; a trial whose
    # lease is older than lease_s (its process or machine stopped) is retried elsewhere.
    heartbeat_s: int = Field(default=10, ge=1, le=3600, description="seconds between lease renewals")
    lease_s: int = Field(
        default=60, ge=2, le=7 * 24 * 3600, description="seconds without renewal after which a trial is retried"
    )
    # Circuit breaker: when the first N trials all fail with the same error (none completed), the
    # sweep stops with it instead of spending the budget on it. 3: one bad draw is no pattern.
    max_failures_in_a_row: int = Field(
        default=3, ge=0, le=MAX_TRIALS, description="first trials failing alike that stop the sweep (0: never stop)"
    )
    # A trial out of memory, or whose worker process or machine was lost, is run again (out of
    # memory: with train.accumulate doubled) at most this many times; then it stays failed.
    max_retries: int = Field(
        default=3, ge=0, le=100, description="retries of a trial lost to out-of-memory or a dead worker or machine"
    )
    artifact_root: str | None = Field(
        default=None,
        description="a folder every machine reaches (a shared "
        "mount) for trial checkpoints; default: the trials' MLflow runs when "
        "search.storage is set",
    )
    lr_finder: LRFinderSpec = LRFinderSpec()
    # The sweep's first trial is the base point (sweeper/pluginhost/base_point.py): each searched
    # parameter at the spec's value, else the plugin's default, else its range's centre. A known
    # reasonable trial first: the sampler's random start may open with slow or weak points.
    base_first: bool = False
    family_round: FamilyRound | None = None
    # Reproducible mode: while fewer than 10 trials are complete, the sampler models the trials at
    # the highest epoch that 10 reached, pruned ones included (BOHB's rule: search/optuna/batches.py)
    rung_model: bool = Field(
        default=False, description="model pruned and low-fidelity trials at the highest rung enough reached (BOHB)"
    )
    # Earlier sweeps whose finished trials seed this one (search/optuna/earlier.py): an output
    # folder, a storage URL with #study_name, or mlflow:EXPERIMENT. Read once, when the sweep starts.
    warm_start: list[str] = Field(
        default_factory=list,
        description="earlier sweeps to learn from: output folders, storage URLs (sqlite:///f.db#study), mlflow:NAME",
    )
    resources: ResourcesSpec = ResourcesSpec()  # backend ray
    ray: RaySpec = RaySpec()  # backend ray
    space: dict[str, sp.Param] = Field(default_factory=dict)
    # Derive the space from the plugins' priors; entries written in `space` win entry by entry.
    # `space: auto` means `auto: true` with no entry written. Replaced by the derived space before
    # the first trial (a resolved spec has no `auto`).
    auto: AutoSpaceSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _space_auto(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("space") == "auto":
            data = {**data, "space": {}, "auto": data.get("auto") or True}
        return data

    @field_validator("auto", mode="before")
    @classmethod
    def _auto_switch(cls, value: Any) -> Any:
        return {True: {}, False: None}.get(value, value) if isinstance(value, bool) else value

    @field_validator("pruner", mode="before")
    @classmethod
    def _pruner_word(cls, value: Any) -> Any:
        return {"type": value} if isinstance(value, str) else value  # `pruner: auto` for {type: auto}

    @field_validator("fuse", mode="before")
    @classmethod
    def _fuse_words(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare off/on as a boolean
        return {False: "off", True: "auto"}.get(value, value) if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _check_space(self) -> SearchSpec:
        for path in self.space:
            root = path.split(".")[0]
            if root not in SEARCHABLE_ROOTS:
                raise ValueError(f"'{path}' cannot be searched; paths start with one of {', '.join(SEARCHABLE_ROOTS)}")
        if "task.plugin" in self.space:
            raise ValueError(
                "'task.plugin' cannot be searched: the task fixes the metrics the objective compares; "
                "search its arguments (task.args.*) or run one sweep per task"
            )
        if self.auto is None:  # auto: written entries may refer to derived ones (model.plugin); checked once derived
            sp.ordered(self.space)  # raises on unknown 'when' targets and cycles
            for path in self.space:
                sp.enabling(self.space, path)  # raises on a condition no draw satisfies
        lr = self.space.get("optimizer.args.lr")
        if self.lr_finder.enabled and not isinstance(lr, sp.FloatParam) and self.auto is None:
            raise ValueError("lr_finder needs optimizer.args.lr in search.space as a float parameter")
        self._check_backend_options()
        if self.pruner.type == "pbt" and self.auto is None:  # auto: checked on the derived space
            self._check_pbt()
        no_password(self.storage, "search.storage", "put it in $PGPASSWORD or ~/.pgpass instead (psycopg reads both)")
        if self.storage is not None:
            check_storage_url(self.storage)
        for i, source in enumerate(self.warm_start):
            _check_warm_start(i, source)
        if self.warm_start and self.sampler == "grid":
            raise ValueError(
                "warm_start: the grid sampler visits each point of its grid once, whatever earlier sweeps "
                "found; use another sampler (tpe), or leave warm_start out"
            )
        if self.lease_s <= self.heartbeat_s:
            raise ValueError(
                f"lease_s ({self.lease_s}) must exceed heartbeat_s ({self.heartbeat_s}): a lease "
                f"would run out between two renewals"
            )
        if isinstance(self.fuse, int) and not 1 <= self.fuse <= MAX_FUSED:
            raise ValueError(f"fuse must be off, auto or a number of trials from 1 to {MAX_FUSED} (got {self.fuse})")
        if isinstance(self.fuse, int) and self.fuse > 1 and not self.reproducible:
            raise ValueError(
                "fuse needs proposed batches (search.reproducible: true): it fuses the trials of one batch"
            )
        for option in ("promote", "check_rungs"):
            if getattr(self.pruner, option) and (not self.reproducible or self.pruner.type not in PROMOTING):
                raise ValueError(
                    f"search.pruner.{option} needs search.reproducible: true and a pruner of type "
                    f"{', '.join(PROMOTING)} (got {self.pruner.type}): it is decided between batches, "
                    f"on the pruner's own cuts"
                )
        if self.reproducible and self.parallel > self.unseen:
            raise ValueError(
                f"parallel ({self.parallel}) > batch_size ({self.batch_size}) x (staleness ({self.staleness}) + 1): "
                f"workers would idle; raise search.batch_size or search.staleness, or set search.reproducible: false"
            )
        if self.sampler == "grid":
            for path, param in self.space.items():
                sp.grid_values(path, param)
        elif self.n_trials is None and self.timeout is None:
            raise ValueError("set n_trials, timeout, or both: the sweep needs a budget")
        return self

    def fuse_size(self, cuda: bool) -> int:
        """Trials per fused model (1: each trial alone) on a machine with CUDA or without."""
        if self.fuse == "off" or not self.reproducible or (self.fuse == "auto" and not cuda):
            return 1
        if self.fuse == "auto":
            return -(-self.batch_size // self.parallel)  # the batch shared evenly by the workers
        return self.fuse

    @property
    def unseen(self) -> int:
        """Reproducible mode: the trials a batch is proposed without the results of (its own and
        the search.staleness batches before it): as many as can run at once without waiting."""
        return self.batch_size * (self.staleness + 1)

    def trial_cap(self, n_trials: int | None) -> int | None:
        """The most trials a budget of ``n_trials`` (None: none, until the timeout) runs: the grid
        sampler visits each point of its grid once, so no more than the grid's size."""
        if self.sampler != "grid":
            return n_trials
        size = sp.grid_size(self.space)
        return size if n_trials is None else min(n_trials, size)

    def pbt_mutations(self) -> list[str]:
        """The search.space paths PBT mutates (search.pruner.mutations, or its default)."""
        if self.pruner.mutations is not None:
            return list(self.pruner.mutations)
        return [
            p for p, param in self.space.items() if p.startswith("optimizer.args.") and isinstance(param, sp.FloatParam)
        ]

    def _check_pbt(self) -> None:
        if self.sampler not in ("random", "auto"):
            raise ValueError(
                f"search.pruner.type: 'pbt' needs search.sampler: random (got '{self.sampler}'): "
                f"PBT picks new values itself, and Ray Tune cannot combine it with Optuna's"
            )
        mutations = self.pbt_mutations()
        if not mutations:
            raise ValueError(
                "search.pruner.type: 'pbt' has nothing to mutate: search.space has no float "
                "parameter under optimizer.args. (e.g. optimizer.args.lr); add one, or list "
                "search.pruner.mutations"
            )
        for path in mutations:
            if path not in self.space:
                raise ValueError(
                    f"search.pruner.mutations: '{path}' is not a search.space parameter; "
                    f"expected one of: {', '.join(self.space)}"
                )
            if not path.startswith(("optimizer.args.", "schedule.args.")):
                raise ValueError(
                    f"search.pruner.mutations: '{path}' cannot change mid-training (a trial "
                    f"takes over another's weights); expected optimizer.args.* or "
                    f"schedule.args.* paths"
                )

    def _check_backend_options(self) -> None:
        """Options the chosen backend would silently ignore are errors. Compared with their
        defaults (not "was it written"): specs are dumped and re-validated on the way."""
        defaults = SearchSpec.model_fields
        if self.backend == "ray":
            given = [
                k
                for k in OPTUNA_ONLY
                if getattr(self, k) != defaults[k].get_default(call_default_factory=True)
                and (k != "lr_finder" or self.lr_finder.enabled)
            ]
            if given:
                raise ValueError(
                    f"search.{given[0]} is an Optuna backend option and backend is 'ray'; use {OPTUNA_ONLY[given[0]]}"
                )
            if self.pruner.promote or self.pruner.check_rungs:
                option = "promote" if self.pruner.promote else "check_rungs"
                raise ValueError(
                    f"search.pruner.{option} is an Optuna backend option and backend is 'ray': Ray Tune's "
                    f"schedulers make their own cuts"
                )
        else:
            if self.pruner.type == "pbt":
                raise ValueError(
                    f"search.pruner.type: 'pbt' is a Ray Tune scheduler and backend is "
                    f"'{self.backend}'; set search.backend: ray and search.sampler: random"
                )
            given = [k for k in ("ray", "resources") if getattr(self, k) != defaults[k].get_default()]
            if given:
                raise ValueError(
                    f"search.{given[0]} configures the Ray backend, but backend is "
                    f"'{self.backend}'; set search.backend: ray or remove search.{given[0]}"
                )


def _check_warm_start(i: int, source: str) -> None:
    """The form of search.warm_start[i]; that it exists is checked where it is read."""
    where = f"warm_start[{i}]: {source!r}"
    if source.startswith("mlflow:"):
        if not source.removeprefix("mlflow:").strip():
            raise ValueError(f"{where}: name the MLflow experiment (mlflow:EXPERIMENT)")
        return
    if not source.strip():
        raise ValueError(f"{where}: empty; give an output folder or a storage URL (sqlite:///f.db#study)")
    if "://" in source:
        try:
            check_storage_url(source.split("#")[0])
        except ValueError as exc:
            raise ValueError(f"{where}: {str(exc).removeprefix('search.storage: ')}") from None
        no_password(source, f"search.warm_start[{i}]", "put it in $PGPASSWORD or ~/.pgpass instead")
