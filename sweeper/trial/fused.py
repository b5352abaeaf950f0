"""Fused trials: several trials of one architecture trained as one model on one device.

Each member is built exactly as its solo trial is (seeded, from the plugins: its own model, optimizer
and schedule), then its parameters and buffers become views into stacked tensors of shape
(members, ...). A step runs the forward and backward of every member at once (fused_forward.py:
the layered layout, one grouped kernel per layer, where the model allows; else ``vmap`` over
``grad`` of a ``functional_call``), then steps every member's optimizer and schedule (one stacked
update where their optimizers allow, fused_optim.py): the update math is torch's own, per member,
so a member follows its solo run up to float rounding (tests/test_fused.py checks it; the
figures: docs/fused-trials.md#correctness).

What stays each member's own: initialisation (its seed), batch order and augmentation draws (its
generators), learning rate, weight decay, momentum/betas and any other optimizer setting, LR
schedule, its task (the loss and metrics of its task plugin, with its own arguments: label
smoothing, class weights, a regression's loss), gradient clipping, BatchNorm statistics, its
per-epoch metrics (epoch.py ends its epochs, as the solo trainer's) and its non-finite guard (a
member whose loss is not finite fails alone; a pruned member leaves and the others go on).
Dropout masks are drawn per member (each its own elements of the draw) but not from the solo
run's stream: members with dropout match their solo run in distribution, not bitwise.

Pure PyTorch like the trainer: no optuna, mlflow or ray here.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from torch import nn

from sweeper.errors import TrialFailed, TrialPruned
from sweeper.plugin import FUSABLE_ATTR, DataSplits, Meter
from sweeper.pluginhost import registry
from sweeper.states import TrialState
from sweeper.trial import checkpoint, fused_forward, speed
from sweeper.trial.batching import eval_batches, steps_per_epoch
from sweeper.trial.build import ProcessCache, TrialConfig, TrialParts, build
from sweeper.trial.epoch import (
    EpochClock,
    Schedule,
    TrainSums,
    check_now,
    close_epoch,
    run_epochs,
    steps_per_step,
)
from sweeper.trial.fused_forward import NotFusable
from sweeper.trial.fused_optim import StackedOptimizer, why_not_stacked
from sweeper.trial.time_limit import TrialTimedOut
from sweeper.trial.trainer import amp_dtype, resolve_device

T = TypeVar("T")
# each member's numbers by its row: its place in FusedGroup.members (the order of the configs)
ByRow = dict[int, T]
# report(member index, epoch, metrics): may raise TrialPruned for that member only
MemberReport = Callable[[int, int, dict[str, float]], None]
# Settings every member of a group must share: they fix the shapes and the sequence of steps.
SHARED = ("batch_size", "accumulate", "epochs", "eval_batch_size", "precision", "device", "deterministic")


@dataclass
class Member:
    """One trial inside a fused group: its built parts, generators and progress."""

    config: TrialConfig
    parts: TrialParts
    order: torch.Generator  # batch order (CPU), as the solo trainer's
    augment: torch.Generator  # augmentation draws, on the device
    base_lrs: list[float] = field(default_factory=list)  # the param groups' LRs before training
    history: list[dict[str, float]] = field(default_factory=list)
    state: TrialState = TrialState.RUNNING  # then complete, pruned or failed
    reason: str | None = None
    engine: str = ""  # how the group computed: "layered" or "vmap" (fused_forward.py)

    def training_state(self) -> checkpoint.State:
        """The member's training state, as the solo trainer saves it (its own storage: call after
        FusedGroup.release)."""
        parts = self.parts
        return checkpoint.capture(
            model=parts.model,
            optimizer=parts.optimizer,
            scheduler=parts.scheduler,
            scaler=torch.amp.GradScaler("cpu", enabled=False),
            generators={"order": self.order, "augment": self.augment},
            epoch=len(self.history),
            history=self.history,
            base_lrs=self.base_lrs,
        )


def fusable(kind: str, plugin: str) -> bool:
    """A model or optimizer plugin may opt out of fusing with ``sweeper_fusable = False`` on its
    factory: a model whose forward branches on its data (vmap cannot batch it), an optimizer
    whose step needs a closure or looks at other parameters than its own."""
    return bool(getattr(registry.get(kind, plugin), FUSABLE_ATTR, True))


def fuse_key(config: TrialConfig) -> str:
    """Trials with equal keys may share a fused model: what fixes shapes and the step sequence."""
    spec = config.spec
    return repr(([getattr(spec.train, name) for name in SHARED], spec.dataset.model_dump(), spec.model.model_dump()))


def plan(configs: list[TrialConfig], size: int) -> tuple[list[list[TrialConfig]], list[str]]:
    """Split ``configs`` (in order) into fused groups of at most ``size`` trials and solo trials
    (groups of one); returns the groups and why trials run alone (for the log)."""
    groups: dict[str, list[TrialConfig]] = {}
    for config in configs:
        groups.setdefault(fuse_key(config), []).append(config)
    out: list[list[TrialConfig]] = []
    notes: list[str] = []
    for same in groups.values():
        chunks = [same[i : i + size] for i in range(0, len(same), size)]
        for chunk in chunks:
            reason = why_not_fused(chunk) if len(chunk) > 1 else None
            if reason is None:
                out.append(chunk)
                continue
            out.extend([c] for c in chunk)
            notes.append(f"trials {', '.join(str(c.number) for c in chunk)} train one at a time: {reason}")
    if len(groups) > 1:
        shapes = "; ".join(", ".join(str(c.number) for c in same) for same in groups.values())
        notes.append(
            f"this batch trains as {len(groups)} fused models, one per architecture (trials {shapes}): "
            f"the model, data set or a shared train setting differs between them"
        )
    return out, notes


def why_not_fused(configs: list[TrialConfig]) -> str | None:
    """None if these trials can train as one fused model; else the reason (for the log)."""
    first = configs[0].spec
    for config in configs[1:]:
        spec = config.spec
        for name in SHARED:
            if getattr(spec.train, name) != getattr(first.train, name):
                return f"train.{name} differs ({getattr(first.train, name)!r} vs {getattr(spec.train, name)!r})"
        if spec.dataset != first.dataset:
            return "the data set differs"
        if spec.model != first.model:
            return "the model differs (plugin or architecture arguments: other shapes)"
        if spec.task.plugin != first.task.plugin:  # its arguments may differ: each member's loss is its own
            return "the task plugin differs"
    if first.data.path == "loader":
        return "data.path is loader (fused trials batch whole tensors by index on the device)"
    if any(config.resume is not None for config in configs):
        return "a trial resumes a saved state (fused trials start together at epoch 1)"
    refs = [("models", first.model.plugin)] + sorted({("optimizers", c.spec.optimizer.plugin) for c in configs})
    for kind, plugin in refs:  # each member steps its own optimizer: they may differ
        if not fusable(kind, plugin):
            return f"the {kind[:-1]} plugin '{plugin}' says it cannot be fused ({FUSABLE_ATTR} = False)"
    if first.train.compile:
        return "train.compile is on (a fused model is compiled as a whole, not per trial)"
    device = resolve_device(first.train.device)
    if amp_dtype(device, first.train.precision) is torch.float16:
        return "fp16 needs a loss scaler per member (not done yet; bf16 and fp32 fuse)"
    return None


class FusedGroup:
    """The members' stacked parameters and buffers, the members' views into them, and the
    stacked optimizer that steps them all (or None: each member's optimizer steps its slice)."""

    def __init__(self, members: list[Member], stacked: bool = True) -> None:
        shapes = {speed.architecture(m.parts.model) for m in members}  # what a compiled forward keys on too
        if len(shapes) != 1:
            raise ValueError("fused members must have the same parameter and buffer shapes")
        self.members = members
        self.template = copy.deepcopy(members[0].parts.model).to("meta")  # structure only
        self.stepper: StackedOptimizer | None = None
        self.engine: fused_forward.Engine | None = None  # set by fit_fused, which has a batch to check it on
        self.why_per_member = "asked for" if not stacked else why_not_stacked([m.parts.optimizer for m in members])
        if self.why_per_member is None:
            model, optimizer = members[0].parts.model, members[0].parts.optimizer
            stepped = {id(p) for p in optimizer.param_groups[0]["params"]}
            names = [n for n, p in model.named_parameters() if id(p) in stepped]
            self.stepper = StackedOptimizer([m.parts.optimizer for m in members], names)
        self.stacked: list[Member] = []  # the members in the stacked tensors, in order
        self.restack()

    @property
    def active(self) -> list[Member]:
        return [m for m in self.members if m.state == TrialState.RUNNING]

    def restack(self) -> None:
        """Stack the running members' tensors and point each member's parameters and buffers at
        its slice (again after a member left)."""
        active = self.active
        if self.stepper is not None and self.stacked:
            self.stepper.keep([self.stacked.index(m) for m in active])
        self.stacked = active
        models = [m.parts.model for m in active]
        self.params = {
            n: torch.stack([dict(m.named_parameters())[n].detach() for m in models])
            for n, _ in models[0].named_parameters()
        }
        self.buffers = {
            n: torch.stack([dict(m.named_buffers())[n] for m in models]) for n, _ in models[0].named_buffers()
        }
        for k, model in enumerate(models):
            for name, param in model.named_parameters():
                param.data = self.params[name][k]
            for name, _ in model.named_buffers():
                module, _, attr = name.rpartition(".")
                model.get_submodule(module)._buffers[attr] = self.buffers[name][k]

    def step(self, members: list[Member], grads: dict[str, torch.Tensor]) -> torch.Tensor:
        """One optimizer step of every member (and of its schedule); returns each member's
        gradient norm before clipping, (members,)."""
        device = next(iter(grads.values())).device
        if self.stepper is None:
            norms = []
            for k, m in enumerate(members):
                model, optimizer = m.parts.model, m.parts.optimizer
                for name, param in model.named_parameters():
                    param.grad = grads[name][k]
                params = [p for p in model.parameters() if p.requires_grad]
                clip = m.config.spec.train.grad_clip
                norms.append(
                    nn.utils.clip_grad_norm_(params, clip)
                    if clip is not None
                    else nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
                )
                optimizer.step()
            norm = torch.stack(norms).float()
        else:
            names = self.stepper.names
            norm = torch.stack([grads[n].flatten(1).float().norm(dim=1) for n in names], dim=1).norm(dim=1)
            clips = [m.config.spec.train.grad_clip for m in members]
            if any(c is not None for c in clips):  # as clip_grad_norm_: scaled by max_norm / (norm + 1e-6), at most 1
                limit = torch.tensor([math.inf if c is None else c for c in clips], device=device)
                scale = (limit / (norm + 1e-6)).clamp(max=1.0)
                grads = {n: grads[n] * scale.view((-1,) + (1,) * (grads[n].ndim - 1)).to(grads[n].dtype) for n in names}
            self.stepper.step(self.params, grads)
        for m in members:
            if steps_per_step(m.parts.scheduler):
                m.parts.scheduler.step()
        return norm

    def release(self) -> None:
        """Give each member's model (and optimizer state) storage of its own (the fused tensors go)."""
        if self.stepper is not None and self.stacked:
            self.stepper.write_back([dict(m.parts.model.named_parameters()) for m in self.stacked])
        for member in self.members:
            model = member.parts.model
            for param in model.parameters():
                param.data = param.data.clone()
            for name, buffer in list(model.named_buffers()):
                module, _, attr = name.rpartition(".")
                model.get_submodule(module)._buffers[attr] = buffer.clone()


def fit_fused(
    configs: list[TrialConfig],
    device: torch.device,
    report: MemberReport,
    stacked: bool = True,
    layered: bool = True,
    cache: ProcessCache | None = None,
) -> list[Member]:
    """Train ``configs`` (one architecture, see ``why_not_fused``) as one fused model; returns
    the members with their history and end state. Each member's model keeps its weights.
    ``stacked``: one update for all members where their optimizers allow (fused_optim.py);
    False steps each member's own torch optimizer (the reference the tests compare with).
    ``layered``: the layered layout where the model allows (fused_forward.py); False: vmap.
    ``cache``: the process's data set (every member's), kept for its next trials."""
    reason = why_not_fused(configs)
    if reason is not None:
        raise ValueError(f"these trials cannot be fused: {reason}")
    members = []
    cache = cache if cache is not None else ProcessCache()
    for config in configs:  # each built exactly as its solo trial is
        parts = build(config, device, cache)
        if not isinstance(parts.data, DataSplits):
            raise NotFusable("the data set returns DatasetSplits (read through a DataLoader, one trial at a time)")
        members.append(
            Member(
                config,
                parts,
                torch.Generator().manual_seed(config.seed),
                torch.Generator(device=device).manual_seed(config.seed + 1),
                [group["lr"] for group in parts.optimizer.param_groups],
            )
        )
    group = FusedGroup(members, stacked)
    train, data = configs[0].spec.train, _tensors(members[0])
    dtype = amp_dtype(device, train.precision)
    try:
        group.engine = fused_forward.engine(  # layered where the model allows, checked on 32 validation samples
            group.template,
            group.params,
            group.buffers,
            data.inputs(data.val_x[:32]),
            lambda: torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext(),
            layered,
        )
        for member in members:
            member.engine = group.engine.kind
        run_epochs(_Members(group, report, device), range(1, train.epochs + 1))
    except Exception as exc:  # the members that had left (pruned, failed) keep their end: the caller's to read
        exc.fused_members = members  # type: ignore[attr-defined]
        raise
    finally:
        group.release()
    for member in members:
        if member.state == TrialState.RUNNING:
            member.state = TrialState.COMPLETE
    return members


def _tensors(member: Member) -> DataSplits:
    """A member's whole-tensor splits (fit_fused refuses DatasetSplits before training)."""
    assert isinstance(member.parts.data, DataSplits)
    return member.parts.data


@dataclass
class _Members:
    """A fused model's running members as epoch.py's loop drives them (a Trainee): each epoch's
    steps and validation are the group's; each member ends its epoch as a solo trial does and
    reports it, and a member pruned or failed leaves while the others go on."""

    group: FusedGroup
    report: MemberReport
    device: torch.device

    def running(self) -> bool:
        return bool(self.group.active)

    def train_epoch(self, epoch: int) -> ByRow[TrainSums]:
        return _train_epoch(self.group, epoch)

    def validate(self) -> ByRow[dict[str, float]]:
        return _validate(self.group)

    def end_epoch(self, epoch: int, sums: ByRow[TrainSums], val: ByRow[dict[str, float]], clock: EpochClock) -> None:
        group, left = self.group, False
        for member in group.active:
            row = group.members.index(member)
            try:
                schedule = Schedule(member.parts.optimizer, member.parts.scheduler)
                metrics = close_epoch(epoch, sums[row], val[row], schedule, clock)  # the group's seconds
                member.history.append(metrics)
                self.report(row, epoch, metrics)
            except TrialPruned as exc:
                member.state, member.reason, left = TrialState.PRUNED, str(exc), True
            except TrialTimedOut:  # the fused model's time is up: every running member stops (execute.py)
                raise
            except TrialFailed as exc:
                member.state, member.reason, left = TrialState.FAILED, str(exc), True
        if left and group.active:
            group.restack()


def _train_epoch(group: FusedGroup, epoch: int) -> ByRow[TrainSums]:
    """One epoch's optimizer steps of the running members (each its own batch order, as solo);
    their sums, by row (place in group.members), for those still running at its end."""
    data, train = _tensors(group.active[0]), group.active[0].config.spec.train
    device, n = data.train_x.device, data.train_x.shape[0]
    orders = torch.zeros(len(group.members), n, dtype=torch.int64)  # row k: group.members[k]'s order
    for m in group.active:
        orders[group.members.index(m)] = torch.randperm(n, generator=m.order)
    orders = orders.to(device)
    loss, norm = torch.zeros(len(group.members), device=device), torch.zeros(len(group.members), device=device)
    meters = {group.members.index(m): m.parts.task.meter("train") for m in group.active}
    steps = steps_per_epoch(data, train.batch_size)
    seen, running = 0, list[int]()  # the ids of the members ``rows`` is for (it changes when one leaves)
    for step in range(steps):
        members = group.active
        if not members:
            return {}
        if [id(m) for m in members] != running:
            running = [id(m) for m in members]
            rows = torch.tensor([group.members.index(m) for m in members], device=device)
        batch = orders[rows, step * train.batch_size : (step + 1) * train.batch_size]
        grads: dict[str, torch.Tensor] = {}
        for micro in batch.tensor_split(train.accumulate, dim=1):  # the solo trainer's micro-batches
            share = micro.shape[1] / batch.shape[1]
            micro_grads, micro_loss = _micro_step(group, members, micro, share, meters, epoch == 1 and step == 0)
            grads = {k: grads[k] + g for k, g in micro_grads.items()} if grads else micro_grads
            loss.index_add_(0, rows, micro_loss.float() * micro.shape[1])
        seen += batch.shape[1]
        norm.index_add_(0, rows, group.step(members, grads))
        if check_now(device, step + 1):
            _fail_non_finite(group, loss, epoch, step + 1)
    _fail_non_finite(group, loss, epoch, steps)
    losses, norms = loss.tolist(), norm.tolist()  # one copy to the host for every member's numbers
    return {
        row: TrainSums(losses[row], norms[row], seen, steps, meters[row].compute())
        for row in (group.members.index(m) for m in group.active)
    }


def _micro_step(
    group: FusedGroup,
    members: list[Member],
    micro: torch.Tensor,
    weight: float,
    meters: ByRow[Meter],
    first: bool,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The forward and backward of one micro-batch, ``micro`` (members, samples) the rows of
    each member's: (gradients, each member's loss); each member's training meter gets its
    outputs. A failure of the ``first`` step is the fused model's (NotFusable: train alone)."""
    engine, data = group.engine, _tensors(members[0])
    assert engine is not None  # fit_fused sets it before the first epoch
    x, y = data.train_x[micro], data.train_y[micro]
    if data.train_transform is not None:
        x = torch.stack([data.train_transform(x[k], m.augment) for k, m in enumerate(members)])
    x = data.inputs(x.flatten(0, 1)).unflatten(0, (len(members), micro.shape[1]))
    tasks = [m.parts.task for m in members]

    def losses(out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:  # each member's task's loss
        return torch.stack([task.loss(out[k], targets[k]) for k, task in enumerate(tasks)])

    try:
        grads, loss, out = engine.step(group.params, group.buffers, x, y, losses, weight)
    except (torch.cuda.OutOfMemoryError, TrialTimedOut):  # not the fused model's fault
        raise
    except Exception as exc:
        if first:
            raise NotFusable.because(exc) from exc
        raise
    for k, member in enumerate(members):
        meters[group.members.index(member)].update(out[k], y[k])
    return grads, loss


def _fail_non_finite(group: FusedGroup, loss: torch.Tensor, epoch: int, step: int) -> None:
    """A member whose summed loss is not finite fails; the others go on without it."""
    finite = torch.isfinite(loss).tolist()  # one look (one sync on a GPU) for every member
    gone = False
    for member in group.active:
        if not finite[group.members.index(member)]:
            member.state, member.reason = TrialState.FAILED, f"non-finite loss at epoch {epoch}, step {step}"
            gone = True
    if gone and group.active:
        group.restack()


def _validate(group: FusedGroup) -> ByRow[dict[str, float]]:
    """Each running member's validation metrics (its task's meter), by row: every member
    predicts the same batches, as the solo trainer's evaluate."""
    engine, members = group.engine, group.active
    assert engine is not None  # fit_fused sets it before the first epoch
    data, train = _tensors(members[0]), members[0].config.spec.train
    meters = [m.parts.task.meter("val") for m in members]
    with torch.inference_mode(), engine.autocast():
        for part in eval_batches(data.val_x.shape[0], train.eval_batch_size):
            out = engine.predict(group.params, group.buffers, data.inputs(data.val_x[part])).float()
            for k, meter in enumerate(meters):
                meter.update(out[k], data.val_y[part])
    return {group.members.index(m): meter.compute() for m, meter in zip(members, meters)}
