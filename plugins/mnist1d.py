"""MNIST-1D (Greydanus 2020): ten 1-D digit templates padded, scaled, translated, sheared and
noised into sequences of 40 floats, generated procedurally by the ``mnist1d`` package (no
download). Small, real and hard enough to separate models: the paper reports logistic regression
32 %, MLP 68 %, GRU 91 %, CNN 94 % test accuracy on its 4,000/1,000 split.

Generating 5,000 samples costs ~3.5 s on a CPU (1.4 s of it importing the generator, which
imports scipy and matplotlib's pyplot), so the arrays are cached once per set of arguments in
``root`` as an .npz file; every later call, and every worker of a sweep, reads them in milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import random
from importlib.metadata import version
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
from pydantic import Field

from sweeper.files import replacing
from sweeper.plugin import DATA_KIND_ATTR, DataSplits

Samples = Annotated[int, Field(ge=1, le=1_000_000)]  # generated samples, held in memory (40 floats each)
CLASSES = 10


def mnist1d(
    *,
    num_train: Samples = 3_000,
    num_val: Samples = 1_000,
    num_test: Annotated[int, Field(ge=0, le=1_000_000)] = 1_000,  # held out for the test split (0: none)
    length: Annotated[int, Field(ge=4, le=10_000)] = 40,  # points per sequence (the benchmark's 40)
    shuffle_seq: bool = False,  # one permutation of the positions for all samples (the paper's spatial-prior test)
    root: str | None = "data/mnist1d",  # the cache folder; null: generate every time, write nothing
    seed: int = 0,
) -> DataSplits:
    """MNIST-1D's sequences as (N, length) float32 tensors, labels 0..9. ``seed`` seeds the
    generator (the samples and their order); the first ``num_train`` samples train, the next
    ``num_val`` validate and the last ``num_test`` are the test split, as the benchmark's own cut
    (its 4,000 training samples, of which validation takes 1,000 here, then its 1,000 test
    samples). The values are standardised by the generator over all samples (the benchmark's
    definition), not refitted here."""
    total = num_train + num_val + num_test
    x, y = _cached({"samples": total, "length": length, "shuffle_seq": shuffle_seq, "seed": seed}, root)
    train, val, test = slice(0, num_train), slice(num_train, num_train + num_val), slice(num_train + num_val, total)
    xt, yt = torch.from_numpy(x).float(), torch.from_numpy(y).long()
    return DataSplits(
        train_x=xt[train],
        train_y=yt[train],
        val_x=xt[val],
        val_y=yt[val],
        test_x=xt[test] if num_test else None,
        test_y=yt[test] if num_test else None,
        num_classes=CLASSES,
        class_names=tuple(str(d) for d in range(CLASSES)),
    )


def _cached(args: dict[str, Any], root: str | None) -> tuple[np.ndarray, np.ndarray]:
    """The generated (x, y) arrays for ``args``, read from the cache or generated and cached. The
    key holds the generator's version: another version may draw other samples."""
    if root is None:
        return _generate(**args)
    key = json.dumps({**args, "mnist1d": version("mnist1d")}, sort_keys=True)
    path = Path(root) / f"mnist1d-{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz"
    if path.is_file():
        with np.load(path) as saved:
            return saved["x"], saved["y"]
    x, y = _generate(**args)
    with replacing(path) as tmp, open(tmp, "wb") as handle:  # parallel workers may write it at once
        np.savez(handle, x=x, y=y)
    return x, y


def _generate(*, samples: int, length: int, shuffle_seq: bool, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``samples`` samples from ``mnist1d.data.make_dataset`` (the generator draws
    from numpy's and Python's global generators: their states are put back afterwards, so
    loading the data leaves a trial's seeded state as it was)."""
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()  # the benchmark's defaults (padding, noise, shear, ...) for the rest
    args.num_samples = -(-samples // CLASSES) * CLASSES  # the generator makes num_samples // 10 per class
    args.train_split = 1.0  # all in "x": the split is cut here, so any num_train/num_val/num_test works
    args.final_seq_length = length
    args.shuffle_seq = shuffle_seq
    args.seed = seed
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        data = make_dataset(args)
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    return data["x"][:samples].astype(np.float32), data["y"][:samples].astype(np.int64)


setattr(mnist1d, DATA_KIND_ATTR, "sequence")  # positions in order (shuffle_seq breaks that on purpose)
