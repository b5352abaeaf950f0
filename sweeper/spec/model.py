"""The sweep spec as validated, frozen pydantic models (loaded from YAML by spec/load.py): the
whole spec and its sections but ``search:`` (spec/search.py), with the checks across sections.

Every default lives here or in search.py, with its unit and reason.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from sweeper.spec import space as sp
from sweeper.spec.base import MAX_BATCH, MAX_DEVICES, MAX_EPOCHS, MAX_PROCESSES, MAX_SECONDS, MAX_TRIALS, Strict
from sweeper.spec.objectives import METRICS, Choose, Objective, check_goals, with_primary
from sweeper.spec.search import SearchSpec
from sweeper.spec.storage import no_password

__all__ = ["METRICS", "Objective"]  # re-exported: the spec's vocabulary


class PluginRef(Strict):
    plugin: str = Field(min_length=1, description="entry-point name, or 'distribution:name'")
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the factory")

    @field_validator("args")
    @classmethod
    def _drop_unset(cls, args: dict[str, Any]) -> dict[str, Any]:
        # An unset value means "the plugin's own default": never pass None through.
        return {k: v for k, v in args.items() if v is not None}


class TrainSpec(Strict):
    epochs: int = Field(default=10, ge=1, le=MAX_EPOCHS)
    batch_size: int = Field(default=128, ge=1, le=MAX_BATCH, description="samples per optimizer step")
    accumulate: int = Field(default=1, ge=1, description="micro-batches per optimizer step (saves memory)")
    eval_batch_size: int = Field(default=1024, ge=1, le=MAX_BATCH)  # evaluation holds no activations for backward
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"  # auto: bf16 (or fp16) on CUDA, fp32 on CPU
    grad_clip: float | None = Field(default=None, gt=0, description="max global L2 norm of the gradients")
    label_smoothing: float = Field(default=0.0, ge=0.0, lt=1.0)
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: CUDA when available
    # torch threads per CPU trial; default: cores / search.batch_size (reproducible) or / parallel.
    # The count changes float rounding, so it is fixed independently of `parallel`.
    cpu_threads: int | None = Field(default=None, ge=1, le=MAX_PROCESSES)
    # Deterministic kernels on GPU (slower): deterministic algorithms, no cuDNN benchmark, no TF32.
    deterministic: bool = False
    # torch.compile the model's forward: compiled once per architecture, batch size and mode in each
    # process and reused by its later trials. Pays off for long trials (see docs/gpu.md).
    compile: bool = False
    # Wall time a trial may run (from its start in its process: building, training, evaluating);
    # past it the trial fails with failure "timed_out", is not retried, and the sweep goes on.
    max_trial_seconds: float | None = Field(
        default=None, gt=0, le=MAX_SECONDS, description="seconds a trial may run before it is stopped as failed"
    )
    # Processes per trial, one per device, under DistributedDataParallel (NCCL on CUDA, gloo on
    # the CPU): batch_size is the global batch, split evenly across them (trial/ddp.py)
    devices: int = Field(
        default=1, ge=1, le=MAX_DEVICES, description="devices (DDP ranks) per trial; above 1 experimental (docs/api.md)"
    )
    # BatchNorm layers as SyncBatchNorm: batch statistics over the global batch (CUDA ranks only)
    sync_batchnorm: bool = False

    @model_validator(mode="after")
    def _micro_batches(self) -> TrainSpec:
        if self.accumulate > self.batch_size:
            raise ValueError(f"accumulate ({self.accumulate}) cannot exceed batch_size ({self.batch_size})")
        if self.batch_size % self.devices:
            raise ValueError(
                f"batch_size ({self.batch_size}) is the global batch of {self.devices} devices: it must "
                f"divide evenly among them (a multiple of {self.devices})"
            )
        if self.accumulate > self.batch_size // self.devices:
            raise ValueError(
                f"accumulate ({self.accumulate}) cannot exceed a device's share of the batch "
                f"({self.batch_size} / {self.devices} devices = {self.batch_size // self.devices})"
            )
        if self.sync_batchnorm and self.devices == 1:
            raise ValueError("sync_batchnorm synchronises batch statistics across devices; train.devices is 1")
        if self.sync_batchnorm and self.device == "cpu":
            raise ValueError(
                "sync_batchnorm needs CUDA ranks (PyTorch's SyncBatchNorm does not run on the CPU); "
                "train.device is 'cpu': leave sync_batchnorm off"
            )
        return self


class DataSpec(Strict):
    """How trials read the data set (sweeper/trial/loading.py). ``auto``: whole tensors on the
    device when the plugin returns DataSplits (the fast path), a DataLoader when it returns
    DatasetSplits; ``loader``: a DataLoader always (DataSplits wrapped into datasets: checks the
    path on a tensor data set, or reads a large one from host memory)."""

    path: Literal["auto", "loader"] = "auto"
    # DataLoader worker processes of each trial; default: half the trial's torch threads, 0
    # (load in the trial's own process) when that is 1 or less, and 0 in a search.parallel worker
    # (a daemonic process cannot start workers of its own)
    num_workers: int | None = Field(default=None, ge=0, le=MAX_PROCESSES)
    # batches each worker loads ahead; default: torch's (2); only with workers
    prefetch_factor: int | None = Field(default=None, ge=1, le=1024)
    # workers live for the whole trial instead of restarting every epoch (each start forks a process)
    persistent_workers: bool = True
    # page-locked host batches copy to the GPU asynchronously; default: on when the trial's device is CUDA
    pin_memory: bool | None = None


class TrackingSpec(Strict):
    enabled: bool = True
    # Precedence: this value, else $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db (MLflow's default).
    mlflow_uri: str | None = None
    experiment: str | None = None  # default: the sweep's name
    # trials ended (in one `sweeper run`) between redraws of report.html and the plots on the
    # sweep's run while it runs (each redraw keeps one core busy a while, on a thread:
    # docs/reviewing.md#reporthtml); 0: only at its end
    review_every: int = Field(default=50, ge=0, le=MAX_TRIALS)

    @field_validator("mlflow_uri")
    @classmethod
    def _secret_free(cls, value: str | None) -> str | None:
        return no_password(
            value, "tracking.mlflow_uri", "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD instead"
        )


ExportFormat = Literal["torchscript", "pt2", "onnx"]
EXPORT_FORMATS: tuple[str, ...] = get_args(ExportFormat)


class ExportSpec(Strict):
    # torch.export (.pt2) and ONNX by default; TorchScript when asked for (deprecated upstream:
    # torch 2.14 warns on torch.jit.load; docs/export.md)
    formats: list[ExportFormat] = ["pt2", "onnx"]
    # max |eager - exported| over the outputs, at batch sizes 1 and 33 of validation rows; fp32
    atol: float = Field(default=1e-4, gt=0)
    # dynamic int8 quantization of the ONNX file's Linear layers (model.int8.onnx, CPU serving);
    # its validation accuracy change is measured, not required to be zero
    quantize: bool = False
    registered_name: str | None = Field(
        default=None, min_length=1, description="MLflow registered model; default: the sweep's name"
    )
    # retrain the chosen configuration on training + validation samples (its seed, its epochs)
    # before it is scored on the test split and exported (trial/refit.py): more data for the
    # model that ships, at one more trial's cost; the search's trial stays recorded as it was
    refit: bool = False
    # checkpoints kept after the sweep: `best` (the best trial's, always kept) or `all` (every
    # completed trial's, so `sweeper export RUN_ID` can export any of them; costs disk)
    keep_checkpoints: Literal["best", "all"] = "best"
    # objectives (several): which point of the Pareto front is exported, registered and called
    # the sweep's best (spec/objectives.py); default: the front's best on the first objective
    choose: Choose | None = None

    @model_validator(mode="after")
    def _check_formats(self) -> ExportSpec:
        if len(set(self.formats)) != len(self.formats):
            raise ValueError(f"formats {self.formats} lists a format twice")
        if self.quantize and "onnx" not in self.formats:
            raise ValueError("quantize: true quantizes the ONNX file; add onnx to export.formats")
        return self


class SweepSpec(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    # int64: the seed is recorded in Optuna's study and MLflow; NumPy's SeedSequence mixes it
    seed: int = Field(default=0, ge=0, le=2**63 - 1, description="sweep seed: data split, sampler, trial seeds")
    # objective: one trainer metric. objectives: two or more (a Pareto front), which may include
    # `params` and `latency_ms`; `objective` is then their first trainer metric (learning curves,
    # the progress table's value)
    objective: Objective = Objective()
    objectives: list[Objective] | None = None
    # what is learned: the loss, the metrics and the default objective (a sweeper.tasks plugin)
    task: PluginRef = PluginRef(plugin="classification")
    dataset: PluginRef
    model: PluginRef
    optimizer: PluginRef
    schedule: PluginRef = PluginRef(plugin="none")
    train: TrainSpec = TrainSpec()
    data: DataSpec = DataSpec()
    search: SearchSpec = SearchSpec()
    tracking: TrackingSpec = TrackingSpec()
    export: ExportSpec = ExportSpec()

    @model_validator(mode="before")
    @classmethod
    def _primary(cls, data: Any) -> Any:
        return with_primary(data)

    @model_validator(mode="after")
    def _check_objectives(self) -> SweepSpec:
        check_goals(
            self.goals, self.objectives is not None, self.search.pruner.type, self.search.sampler, self.export.choose
        )
        if self.search.population is not None and self.search.sampler != "nsga2":
            raise ValueError(f"search.population sets nsga2's generation size; sampler is '{self.search.sampler}'")
        return self

    @property
    def goals(self) -> list[Objective]:
        """What the sweep optimises: ``objectives``, or ``[objective]``."""
        return list(self.objectives) if self.objectives else [self.objective]

    @model_validator(mode="after")
    def _gpu_reserved(self) -> SweepSpec:
        if self.search.backend == "ray" and self.train.device == "cuda" and self.search.resources.gpu == 0:
            raise ValueError(
                "train.device is 'cuda' but search.resources.gpu is 0: Ray hides every GPU from a "
                "trial that reserves none; set search.resources.gpu (1, or 0.5 to share a GPU) or "
                "leave it unset (1 when the cluster has GPUs)"
            )
        return self

    @model_validator(mode="after")
    def _ray_limits(self) -> SweepSpec:
        if self.search.backend != "ray":
            return self
        if self.train.max_trial_seconds is not None:
            raise ValueError(
                "train.max_trial_seconds is enforced by the optuna backend (it kills a hung trial's "
                "worker process); search.backend: ray cannot enforce it: leave it unset or use backend optuna"
            )
        if self.search.budget is not None:
            raise ValueError(
                "search.budget is counted in the optuna backend's ledger; with search.backend: ray "
                "use search.timeout or n_trials, or use backend optuna"
            )
        return self

    @model_validator(mode="after")
    def _ranks(self) -> SweepSpec:
        devices, search = self.train.devices, self.search
        if devices == 1:
            return self
        if isinstance(search.fuse, int) and search.fuse > 1:
            raise ValueError(
                f"search.fuse: {search.fuse} trains trials as one model on one device; train.devices: "
                f"{devices} trains each trial on {devices}: set search.fuse: off (or auto)"
            )
        batch = search.space.get("train.batch_size")
        sizes = (
            batch.choices
            if isinstance(batch, sp.CategoricalParam)
            else [batch.low, batch.step]
            if isinstance(batch, sp.IntParam) and not batch.log
            else [batch.low, 1]
            if batch is not None
            else []
        )
        gpu = search.resources.gpu
        if search.backend == "ray" and gpu is not None and 0 < gpu < devices:
            raise ValueError(
                f"train.devices: {devices} runs each trial's {devices} ranks on the GPUs it reserves; "
                f"search.resources.gpu is {gpu:g}: reserve {devices} (or leave it unset)"
            )
        if any(not isinstance(v, int) or v % devices for v in sizes):
            raise ValueError(
                f"search.space train.batch_size must sample multiples of train.devices ({devices}): "
                f"each trial's global batch is split evenly across its devices"
            )
        return self

    @model_validator(mode="after")
    def _loader_workers(self) -> SweepSpec:
        workers, search = self.data.num_workers, self.search
        if workers and search.backend == "optuna" and search.parallel > 1:
            raise ValueError(
                f"data.num_workers: {workers} starts DataLoader worker processes, but with "
                f"search.parallel: {search.parallel} trials run in daemonic worker processes, which "
                f"cannot start any; set data.num_workers: 0 (or leave it unset) or search.parallel: 1"
            )
        if self.data.prefetch_factor is not None and workers == 0:
            raise ValueError("data.prefetch_factor sets what workers load ahead; data.num_workers is 0")
        return self

    def with_values(self, values: dict[str, Any]) -> SweepSpec:
        """This spec with searched values set at their dotted paths (re-validated)."""
        return SweepSpec.model_validate(sp.apply(self.model_dump(), values))

    def budget(self) -> str:
        n = self.search.trial_cap(self.search.n_trials)
        trials = f"{n} trials × ≤{self.train.epochs} epochs (≤{n * self.train.epochs} epochs)" if n else "no trial cap"
        timeout = f"{self.search.timeout:g} s" if self.search.timeout else "none"
        search = self.search
        if search.backend == "ray":
            where = search.ray.address or "a local Ray (or $RAY_ADDRESS)"
            gpu = (
                f" + {search.resources.gpu:g} GPU"
                if search.resources.gpu
                else " + 1 GPU (if the cluster has any)"
                if search.resources.gpu is None
                else ""
            )
            workers = f"Ray Tune on {where}, {search.resources.cpu:g} CPU{gpu} per trial"
        else:
            workers = f"{search.parallel} worker(s)"
        if self.train.devices > 1:
            workers += f", {self.train.devices} devices (DDP ranks) per trial"
        budget = f", budget {search.budget.device_hours:g} device-hours" if search.budget else ""
        return f"{trials}, timeout {timeout}{budget}, {workers}, pruner {search.pruner.type}"
