"""Built-in tasks: classification, multilabel, regression (the ``sweeper.tasks`` contract:
sweeper/plugin.py, docs/plugins.md).

A task factory takes the spec's ``task.args``; its ``fit(data)`` checks the targets and learns
from the training split only (class weights, the targets' mean and scale), so validation data
never leaks into training.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

import torch
from pydantic import Field
from torch import nn
from torch.nn import functional as F

from sweeper.plugin import Choice, DatasetSplits, DataSplits, LogUniform

Smoothing = Annotated[float, Field(ge=0.0, lt=1.0)]  # of the target mass spread over the other classes
Positive = Annotated[float, Field(gt=0.0, le=1e6)]
Threshold = Annotated[float, Field(gt=0.0, lt=1.0)]  # a sigmoid probability


# --- classification ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Classification:
    """One class per sample: cross-entropy on logits; accuracy."""

    class_weights: Literal["balanced"] | tuple[float, ...] | None = None
    label_smoothing: float = 0.0
    metrics: ClassVar[dict[str, str]] = {"train_acc": "maximize", "val_acc": "maximize"}
    objective: ClassVar[str] = "val_acc"

    def fit(self, data: DataSplits | DatasetSplits) -> FittedClassification:
        for split in ("train", "val"):
            y = getattr(data, f"{split}_y")
            if y.dtype != torch.int64 or y.ndim != 1:
                raise ValueError(
                    f"{split}_y must hold int64 class indices of shape (N,) for task 'classification'; "
                    f"got {y.dtype} of shape {tuple(y.shape)}"
                    + ("; the data set gives float targets: set task: regression" if y.is_floating_point() else "")
                )
            if not bool(((y >= 0) & (y < data.num_classes)).all()):
                raise ValueError(f"{split}_y must hold class indices in [0, num_classes={data.num_classes})")
        weight = None
        if self.class_weights == "balanced":  # n / (classes * count): each class weighs as much in total
            counts = torch.bincount(data.train_y, minlength=data.num_classes).double()
            weight = (len(data.train_y) / (data.num_classes * counts.clamp(min=1))).float()
        elif self.class_weights is not None:
            if len(self.class_weights) != data.num_classes:
                raise ValueError(
                    f"task.args.class_weights lists {len(self.class_weights)} weights; the data set has "
                    f"{data.num_classes} classes"
                )
            weight = torch.tensor(self.class_weights, dtype=torch.float32)
        weight = weight.to(data.train_y.device) if weight is not None else None
        return FittedClassification(data.num_classes, weight, self.label_smoothing)


@dataclass(frozen=True, eq=False)
class FittedClassification:
    outputs: int
    weight: torch.Tensor | None
    label_smoothing: float

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, y, weight=self.weight, label_smoothing=self.label_smoothing)

    def meter(self, split: str) -> ClassificationMeter:
        return ClassificationMeter(split)

    def head(self) -> nn.Module | None:
        return None

    def output_info(self) -> dict[str, Any]:
        return {"shape": [None, self.outputs], "dtype": "float32", "meaning": "logits (argmax: class)"}


@dataclass(eq=False)
class ClassificationMeter:
    """Correct predictions (argmax) and, on the validation split, the plain cross-entropy (no
    weights, no smoothing: comparable between trials that search them)."""

    split: str
    loss: torch.Tensor | None = None
    correct: torch.Tensor | None = None
    n: int = 0

    def update(self, out: torch.Tensor, y: torch.Tensor) -> None:
        if self.correct is None:
            self.loss = torch.zeros((), device=out.device)
            self.correct = torch.zeros((), device=out.device, dtype=torch.int64)
        if self.split == "val":
            self.loss += F.cross_entropy(out, y, reduction="sum")
        self.correct += (out.argmax(1) == y).sum()
        self.n += len(y)

    def compute(self) -> dict[str, float]:
        assert self.loss is not None and self.correct is not None, "no batch was added"
        if self.split == "val":
            return {"val_loss": self.loss.item() / self.n, "val_acc": self.correct.item() / self.n}
        return {f"{self.split}_acc": int(self.correct.item()) / self.n}


def classification(
    *, class_weights: Literal["balanced"] | list[Positive] | None = None, label_smoothing: Smoothing = 0.0
) -> Classification:
    """Cross-entropy over ``num_classes`` logits; accuracy (``val_acc``, the default objective).
    ``class_weights``: ``balanced`` (n / (classes x count), from the training split) or one weight
    per class, for imbalanced classes; ``label_smoothing`` as torch's CrossEntropyLoss."""
    weights = tuple(class_weights) if isinstance(class_weights, list) else class_weights
    return Classification(weights, label_smoothing)


# --- outputs collected over an epoch (the metrics that do not add up batch by batch) --------------


@dataclass(eq=False)
class Collected:
    """A split's outputs and targets, kept on the device until the epoch's metrics are computed."""

    split: str
    metrics: Any  # (outputs, targets) -> dict of metrics without the split's prefix
    outs: list[torch.Tensor] = field(default_factory=list)
    ys: list[torch.Tensor] = field(default_factory=list)

    def update(self, out: torch.Tensor, y: torch.Tensor) -> None:
        if self.split == "val":  # training metrics: the trainer's train_loss only
            self.outs.append(out.detach().float())
            self.ys.append(y)

    def compute(self) -> dict[str, float]:
        if self.split != "val":
            return {}
        found = self.metrics(torch.cat(self.outs), torch.cat(self.ys))
        return {f"{self.split}_{name}": value for name, value in found.items()}


# --- regression --------------------------------------------------------------------------------

LOSSES = {"mse": F.mse_loss, "l1": F.l1_loss, "huber": F.huber_loss}


@dataclass(frozen=True)
class Regression:
    """Real-valued targets, standardised with the training split's mean and std for training;
    metrics in the data's units."""

    loss: Literal["mse", "l1", "huber"] = "mse"
    huber_delta: float = 1.0
    metrics: ClassVar[dict[str, str]] = {"val_rmse": "minimize", "val_mae": "minimize", "val_r2": "maximize"}
    objective: ClassVar[str] = "val_rmse"

    def fit(self, data: DataSplits | DatasetSplits) -> FittedRegression:
        for split in ("train", "val"):
            y = getattr(data, f"{split}_y")
            if not y.is_floating_point() or y.ndim not in (1, 2):
                raise ValueError(
                    f"{split}_y must hold float targets of shape (N,) or (N, targets) for task 'regression'; "
                    f"got {y.dtype} of shape {tuple(y.shape)}"
                    + ("; the data set gives class labels: set task: classification" if y.dtype == torch.int64 else "")
                )
            if not bool(torch.isfinite(y).all()):
                raise ValueError(f"{split}_y holds NaN or infinite targets")
        if data.train_y.shape[1:] != data.val_y.shape[1:]:
            raise ValueError(
                f"train_y and val_y differ in shape: {tuple(data.train_y.shape)} vs {tuple(data.val_y.shape)}"
            )
        y = _columns(data.train_y).double()
        mean, std = y.mean(0), y.std(0, correction=0)
        std = torch.where(std > 0, std, torch.ones_like(std))  # a constant target: left unscaled
        return FittedRegression(y.shape[1], mean.float(), std.float(), self.loss, self.huber_delta)


def _columns(y: torch.Tensor) -> torch.Tensor:
    """Targets as (N, targets)."""
    return y.reshape(len(y), -1)


class Destandardize(nn.Module):
    """The exported model's last step: standardised outputs back to the data's units."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("mean", mean.detach().cpu().clone())
        self.register_buffer("std", std.detach().cpu().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.std + self.mean


@dataclass(frozen=True, eq=False)
class FittedRegression:
    outputs: int
    mean: torch.Tensor  # (targets,), the training split's, in the data's units
    std: torch.Tensor
    kind: str
    huber_delta: float

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        target = (_columns(y).float() - self.mean) / self.std
        if self.kind == "huber":
            return F.huber_loss(out, target, delta=self.huber_delta)
        return LOSSES[self.kind](out, target)

    def meter(self, split: str) -> Collected:
        return Collected(split, self.metrics)

    def metrics(self, out: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """loss (standardised, as trained), rmse and mae (the data's units, over every target
        value), r2 (the mean over targets of 1 - SSE/SST, as scikit-learn's r2_score)."""
        return regression_metrics(out * self.std + self.mean, _columns(y).float()) | {"loss": self.loss(out, y).item()}

    def head(self) -> nn.Module | None:
        return Destandardize(self.mean, self.std)

    def output_info(self) -> dict[str, Any]:
        return {
            "shape": [None, self.outputs],
            "dtype": "float32",
            "meaning": "predictions in the data's units (the exported model ends with "
            "output * target_std + target_mean)",
            "target_mean": self.mean.tolist(),
            "target_std": self.std.tolist(),
        }


def regression_metrics(pred: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """rmse, mae and r2 of predictions ``pred`` for targets ``y``, both (N, targets)."""
    err = (pred - y).double()
    sse = (err**2).sum(0)
    sst = ((y.double() - y.double().mean(0)) ** 2).sum(0)
    r2 = torch.where(sst > 0, 1 - sse / sst.clamp(min=1e-300), torch.zeros_like(sse))  # constant target: 0
    return {"rmse": math.sqrt((err**2).mean().item()), "mae": err.abs().mean().item(), "r2": r2.mean().item()}


def regression(
    *,
    # a derived space (--auto) chooses the loss too: with outliers among the targets, the mean of
    # squares follows them and l1 or huber keep to the bulk (the outlier task, benchmarks/search_quality.py)
    loss: Annotated[Literal["mse", "l1", "huber"], Choice("mse", "huber", "l1")] = "mse",
    # outliers inflate the targets' std, so the bulk's noise may be a small fraction of it
    huber_delta: Annotated[Positive, LogUniform(0.05, 2.0, when={"loss": "huber"})] = 1.0,
) -> Regression:
    """Float targets (N,) or (N, targets): ``loss`` ``mse``, ``l1`` or ``huber`` (``huber_delta`` in
    standard deviations of the target) on targets standardised with the training split's mean and
    std; ``val_rmse`` (the default objective), ``val_mae`` and ``val_r2`` in the data's units. The
    exported model predicts in the data's units."""
    return Regression(loss, huber_delta)


# --- multilabel --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Multilabel:
    """Any number of labels per sample: binary cross-entropy on one logit per label."""

    threshold: float = 0.5
    metrics: ClassVar[dict[str, str]] = {"val_f1_macro": "maximize", "val_map": "maximize"}
    objective: ClassVar[str] = "val_map"

    def fit(self, data: DataSplits | DatasetSplits) -> FittedMultilabel:
        for split in ("train", "val"):
            y = getattr(data, f"{split}_y")
            if y.ndim != 2 or not bool(((y == 0) | (y == 1)).all()):
                raise ValueError(
                    f"{split}_y must be 0/1 of shape (N, labels) for task 'multilabel'; got {y.dtype} of shape "
                    f"{tuple(y.shape)}" + ("" if y.ndim != 2 else " with values other than 0 and 1")
                )
        labels = data.train_y.shape[1]
        if data.val_y.shape[1] != labels:
            raise ValueError(f"train_y has {labels} labels, val_y {data.val_y.shape[1]}")
        names = data.class_names if data.class_names and len(data.class_names) == labels else None
        return FittedMultilabel(labels, self.threshold, names)


@dataclass(frozen=True, eq=False)
class FittedMultilabel:
    outputs: int
    threshold: float
    names: tuple[str, ...] | None

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(out, y.to(out.dtype))

    def meter(self, split: str) -> Collected:
        return Collected(split, self.metrics)

    def metrics(self, out: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """loss (mean binary cross-entropy), f1 per label (f1_<label>: predicted where
        sigmoid >= threshold), f1_macro (their mean) and map (mean average precision over the
        labels with a positive sample)."""
        f1 = f1_per_label(torch.sigmoid(out) >= self.threshold, y.bool())
        labels = [metric_name(n) for n in self.names or ()]
        if len(set(labels)) != self.outputs:  # no names, or two that read alike as metric names
            labels = [str(i) for i in range(self.outputs)]
        aps = [average_precision(out[:, j], y[:, j].bool()) for j in range(self.outputs) if bool(y[:, j].any())]
        return {
            "loss": self.loss(out, y).item(),
            "f1_macro": float(f1.mean().item()),
            "map": sum(aps) / len(aps) if aps else 0.0,
            **{f"f1_{name}": float(v) for name, v in zip(labels, f1.tolist())},
        }

    def head(self) -> nn.Module | None:
        return None

    def output_info(self) -> dict[str, Any]:
        return {
            "shape": [None, self.outputs],
            "dtype": "float32",
            "meaning": f"one logit per label (label present where sigmoid(logit) >= {self.threshold})",
            "threshold": self.threshold,
            "labels": list(self.names) if self.names else None,
        }


def f1_per_label(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """F1 of each label (column) of boolean predictions and targets; 0 where a label has neither
    a positive nor a predicted positive (scikit-learn's zero_division=0)."""
    tp = (pred & y).sum(0).double()
    wrong = (pred ^ y).sum(0).double()  # false positives + false negatives
    return torch.where(tp > 0, 2 * tp / (2 * tp + wrong).clamp(min=1), torch.zeros_like(tp))


def average_precision(scores: torch.Tensor, positive: torch.Tensor) -> float:
    """Average precision (scikit-learn's average_precision_score): the precision at each distinct
    score threshold, weighted by the recall it adds; ``positive`` has at least one True."""
    order = torch.argsort(scores, descending=True, stable=True)
    s, hit = scores[order], positive[order].double()
    tp, seen = hit.cumsum(0), torch.arange(1, len(s) + 1, device=s.device, dtype=torch.float64)
    last = torch.ones(len(s), dtype=torch.bool, device=s.device)  # the last sample of each distinct score
    last[:-1] = s[1:] != s[:-1]
    tp, seen = tp[last], seen[last]
    recall = tp / tp[-1]
    gained = torch.diff(recall, prepend=recall.new_zeros(1))
    return float((gained * tp / seen).sum().item())


def metric_name(label: str) -> str:
    """A label as part of a metric name (MLflow keys: letters, digits, _ - . / and spaces)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_") or "label"


def multilabel(*, threshold: Threshold = 0.5) -> Multilabel:
    """0/1 targets (N, labels): binary cross-entropy with logits; ``val_f1_macro``, ``val_f1_<label>``
    (a label is predicted where sigmoid(logit) >= ``threshold``) and ``val_map`` (mean average
    precision, the default objective: it needs no threshold)."""
    return Multilabel(threshold)
