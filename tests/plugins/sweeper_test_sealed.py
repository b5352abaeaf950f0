"""A data set whose test split may be read only by the scoring after the sweep (tests/test_holdout.py).

``sealed``: the smoke spec's synthetic data plus a test split whose tensors are ``Sealed``: any
torch operation on them (even ``.shape``, ``.to``, slicing) from a call stack without
sweeper/trial/holdout.py in it raises, and writes ``folder/early`` first (naming who touched
them), so a trial, the dry build, a sampler or the export touching them fails loudly. A read
from holdout.py writes ``folder/read``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from sweeper.plugin import DataSplits

HOLDOUT = str(Path("sweeper") / "trial" / "holdout.py")


class Sealed(torch.Tensor):
    folder = ""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        frame, callers = sys._getframe(1), []
        while frame is not None:
            callers.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")
            frame = frame.f_back
        folder = Path(cls.folder)
        if not any(HOLDOUT in c for c in callers):
            (folder / "early").write_text("\n".join(callers))
            raise RuntimeError(f"the test split was touched before the sweep ended ({func})")
        (folder / "read").touch()
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def sealed(*, folder: str, num_train: int = 256, num_val: int = 64, num_test: int = 96, seed: int = 0) -> DataSplits:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_train + num_val + num_test, 1, 4, 4, generator=g)
    teacher = torch.randn(16, 3, generator=g)
    y = (x.flatten(1) @ teacher).argmax(1)
    Sealed.folder = folder
    test = slice(num_train + num_val, None)
    return DataSplits(
        train_x=x[:num_train],
        train_y=y[:num_train],
        val_x=x[num_train : num_train + num_val],
        val_y=y[num_train : num_train + num_val],
        test_x=torch.Tensor._make_subclass(Sealed, x[test]),
        test_y=torch.Tensor._make_subclass(Sealed, y[test]),
        num_classes=3,
    )
