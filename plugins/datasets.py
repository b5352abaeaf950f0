"""Built-in small data sets, returned whole as tensors: digits (real, offline) and synthetic for
classification, diabetes (real, offline) for regression, synthetic_multilabel for multilabel."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import Field

from sweeper.plugin import DATA_KIND_ATTR, DataSplits


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded permutation cut into (train, val) indices; the same seed gives the same split."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be between 0 and 1 (got {val_fraction})")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val = max(1, round(n * val_fraction))
    return order[n_val:], order[:n_val]


def split_with_test(
    n: int, val_fraction: float, test_fraction: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(train, val, test) indices: validation as ``split_indices`` cuts it (the same samples for
    the same seed), then ``test_fraction`` of all samples held out of the rest for the test split
    (None when 0)."""
    train, val = split_indices(n, val_fraction, seed)
    if test_fraction <= 0.0:
        return train, val, None
    if val_fraction + test_fraction >= 1.0:
        raise ValueError(f"val_fraction + test_fraction must be below 1 (got {val_fraction} + {test_fraction})")
    n_test = max(1, round(n * test_fraction))
    return train[n_test:], val, train[:n_test]


def cut(
    x: torch.Tensor,
    y: torch.Tensor,
    train: torch.Tensor,
    val: torch.Tensor,
    test: torch.Tensor | None = None,
    **fields: Any,
) -> DataSplits:
    """The splits of samples ``x`` and targets ``y`` at index tensors ``train``, ``val`` and
    (optional) ``test``."""
    held = {"test_x": x[test], "test_y": y[test]} if test is not None else {}
    return DataSplits(train_x=x[train], train_y=y[train], val_x=x[val], val_y=y[val], **held, **fields)


Fraction = Annotated[float, Field(gt=0.0, lt=1.0)]  # of the samples held out for validation
# of the samples held out for the test split, which only scores the chosen trial after the sweep
# (0: none); carved from what validation leaves, so the validation samples stay those of test_fraction 0
TestFraction = Annotated[float, Field(ge=0.0, lt=1.0)]
Samples = Annotated[int, Field(ge=1, le=10_000_000)]  # synthetic samples, held in memory


def digits(*, val_fraction: Fraction = 0.2, test_fraction: TestFraction = 0.2, seed: int = 0) -> DataSplits:
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes): real data that
    needs no download. Pixels 0..16 are scaled to 0..1, then standardised with the training
    split's mean and std. A seeded ``test_fraction`` is held out for the test split."""
    pixels, labels = _digits_arrays()
    x = torch.tensor(pixels, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    y = torch.tensor(labels, dtype=torch.int64)
    train, val, test = split_with_test(len(y), val_fraction, test_fraction, seed)
    mean, std = x[train].mean().item(), x[train].std().item()
    x = (x - mean) / std
    return cut(
        x,
        y,
        train,
        val,
        test,
        num_classes=10,
        class_names=tuple(str(d) for d in range(10)),
        normalization={"scale": 1 / 16.0, "mean": [mean], "std": [std]},
    )


def _digits_arrays() -> tuple[Any, Any]:
    """scikit-learn's digits file, read as its ``load_digits`` reads it (the same arrays), without
    importing scikit-learn: that import took 1.2 s of a sweep's 7 s start-up."""
    import numpy as np

    found = importlib.util.find_spec("sklearn")  # finds the package, does not run it
    path = Path(next(iter(found.submodule_search_locations or []), "")) / "datasets" / "data" / "digits.csv.gz"
    if not path.is_file():  # another layout of scikit-learn: its own loader
        from sklearn.datasets import load_digits

        return load_digits(return_X_y=True)
    data = np.loadtxt(path, delimiter=",")
    return data[:, :-1], data[:, -1].astype(int)


def synthetic(
    *,
    num_train: Samples = 512,
    num_val: Samples = 128,
    input_shape: tuple[int, ...] = (1, 8, 8),
    num_classes: Annotated[int, Field(ge=2, le=100_000)] = 4,
    noise: Annotated[float, Field(ge=0.0, le=1_000.0)] = 0.1,  # times the logits' std
    seed: int = 0,
) -> DataSplits:
    """Gaussian inputs labelled by a fixed random linear teacher (plus ``noise`` on the logits):
    learnable, so a sweep over it has something to find. For smoke tests; costs milliseconds."""
    g = torch.Generator().manual_seed(seed)
    shape = tuple(input_shape)
    x = torch.randn(num_train + num_val, *shape, generator=g)
    teacher = torch.randn(x[0].numel(), num_classes, generator=g)
    logits = x.flatten(1) @ teacher
    y = (logits + noise * logits.std() * torch.randn(logits.shape, generator=g)).argmax(1)
    return DataSplits(
        train_x=x[:num_train], train_y=y[:num_train], val_x=x[num_train:], val_y=y[num_train:], num_classes=num_classes
    )


def diabetes(*, val_fraction: Fraction = 0.2, test_fraction: TestFraction = 0.2, seed: int = 0) -> DataSplits:
    """scikit-learn's bundled diabetes data (442 patients, 10 features; the target: disease
    progression a year later, 25..346): real regression data that needs no download (task
    regression). Features standardised with the training split's mean and std; targets as given."""
    from sklearn.datasets import load_diabetes

    features, target = load_diabetes(return_X_y=True, scaled=False)
    x = torch.tensor(features, dtype=torch.float32)
    y = torch.tensor(target, dtype=torch.float32)
    train, val, test = split_with_test(len(y), val_fraction, test_fraction, seed)
    mean, std = x[train].mean(0), x[train].std(0)
    return cut(
        (x - mean) / std, y, train, val, test, normalization={"scale": 1.0, "mean": mean.tolist(), "std": std.tolist()}
    )


def synthetic_multilabel(
    *,
    num_samples: Annotated[int, Field(ge=10, le=1_000_000)] = 600,
    num_features: Annotated[int, Field(ge=1, le=10_000)] = 20,
    num_labels: Annotated[int, Field(ge=1, le=1_000)] = 5,
    val_fraction: Fraction = 0.2,
    test_fraction: TestFraction = 0.2,
    seed: int = 0,
) -> DataSplits:
    """scikit-learn's ``make_multilabel_classification`` (word counts drawn per sample from its
    labels' distributions): 0/1 targets (N, num_labels) for task multilabel, generated offline.
    Features standardised with the training split's mean and std."""
    from sklearn.datasets import make_multilabel_classification

    features, labels = make_multilabel_classification(
        n_samples=num_samples, n_features=num_features, n_classes=num_labels, random_state=seed % 2**32
    )
    x = torch.tensor(features, dtype=torch.float32)
    y = torch.tensor(labels, dtype=torch.float32)
    train, val, test = split_with_test(len(y), val_fraction, test_fraction, seed)
    mean, std = x[train].mean(0), x[train].std(0).clamp(min=1e-6)
    return cut((x - mean) / std, y, train, val, test, class_names=tuple(f"label{i}" for i in range(num_labels)))


# The kind of data each gives (sweeper.plugin.DATA_KIND_ATTR): what --auto chooses model families by.
# synthetic declares none: its samples take whatever shape its arguments ask for.
setattr(digits, DATA_KIND_ATTR, "image")
setattr(diabetes, DATA_KIND_ATTR, "table")
setattr(synthetic_multilabel, DATA_KIND_ATTR, "table")
