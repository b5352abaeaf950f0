"""Tables from CSV or Parquet files: the ``tabular`` data set and the ``tabular_mlp`` model.

A table's rows are samples; one column is the ``target``, an optional ``split`` column says which
rows are validation rows (otherwise a seeded cut), every other column is a feature. Numeric
columns are standardised with the training split's mean and std (a missing value becomes the
mean, 0 after standardisation); text, boolean and categorical columns (and the columns named in
``categorical``) become integer codes from the training split's values (0: a value the training
split never held, or a missing one), which ``tabular_mlp`` embeds. A sample is one float32 row:
the numeric columns, then the codes.

Where the preprocessing lives: in export.json (``features``: each numeric column's mean and std,
each categorical column's vocabulary), not inside the model. A vocabulary maps strings to codes,
which no exported graph (TorchScript, ONNX) takes as input, so a consumer reads export.json for
the codes in any case; the standardisation is recorded beside them, as the other built-in data sets
record their ``normalization``, and the model stays a function of float inputs.

Classification or regression follows the target column: a float column is a regression target
(``task: regression``), integer, boolean and text columns are class labels (the default task,
classification); ``target_type`` overrides it (an integer count to regress: ``number``). A spec
whose task does not match stops in the dry build, exit 2, naming both.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import torch
from pydantic import Field
from torch import nn

from sweeper.plugin import DATA_KIND_ATTR, DATA_KINDS_ATTR, DataSplits, IntRange, TabularFeatures, Uniform
from sweeper_plugins.datasets import Fraction, TestFraction, split_with_test
from sweeper_plugins.models import Depth, Probability, Width

if TYPE_CHECKING:
    import pandas as pd

READERS = {".csv": "csv", ".tsv": "csv", ".txt": "csv", ".parquet": "parquet", ".pq": "parquet"}
# of a split column
SPLIT_VALUES = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}
MAX_CLASSES = 10_000  # more distinct integer targets than this: a regression target (target_type: number)


def read_table(path: Path) -> pd.DataFrame:
    """The table at ``path``, read by pandas (Parquet through pyarrow), by the file's suffix."""
    import pandas as pd

    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise ValueError(f"{path}: unknown table format '{path.suffix}'; expected one of {', '.join(READERS)}")
    if not path.is_file():
        raise FileNotFoundError(f"dataset.args.path: no file {path.absolute()}")
    if reader == "parquet":
        return pd.read_parquet(path)
    return pd.read_csv(path, sep="\t" if path.suffix.lower() == ".tsv" else ",")


def _is_numeric(column: pd.Series) -> bool:
    import pandas as pd

    return pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)


def _train_rows(
    table: pd.DataFrame, split: str, val_fraction: float, test_fraction: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(train, val, test) row indices: from the ``split`` column when the table has one (test: its
    test rows, None without any), else a seeded cut (test: ``test_fraction`` of the rows)."""
    if split not in table.columns:
        return split_with_test(len(table), val_fraction, test_fraction, seed)
    values = table[split].astype(str).str.strip().str.lower()
    unknown = sorted(set(values) - set(SPLIT_VALUES))
    if unknown:
        raise ValueError(
            f"column '{split}' (dataset.args.split) holds {unknown[:3]}; "
            "expected train, val (valid, validation) or test"
        )
    kind = values.map(SPLIT_VALUES)
    rows = {k: torch.tensor((kind == k).to_numpy().nonzero()[0], dtype=torch.int64) for k in ("train", "val", "test")}
    if len(rows["train"]) == 0 or len(rows["val"]) == 0:
        empty = "train" if len(rows["train"]) == 0 else "val"
        raise ValueError(f"column '{split}' (dataset.args.split) leaves no {empty} rows")
    return rows["train"], rows["val"], rows["test"] if len(rows["test"]) else None


def _targets(column: pd.Series, target_type: str) -> tuple[torch.Tensor, tuple[str, ...] | None]:
    """(targets, class names): float32 for a regression target, int64 codes of the sorted labels
    (class names None for regression)."""
    if column.isna().any():
        raise ValueError(f"target column '{column.name}' is empty in {int(column.isna().sum())} row(s)")
    number = target_type == "number" or (target_type == "auto" and _is_numeric(column) and column.dtype.kind == "f")
    if number:
        if not _is_numeric(column):
            raise ValueError(f"target column '{column.name}' is not numeric ({column.dtype}); target_type: number")
        return torch.tensor(column.to_numpy(dtype="float32")), None
    labels = sorted(column.unique().tolist())
    if len(labels) > MAX_CLASSES:
        raise ValueError(
            f"target column '{column.name}' has {len(labels)} distinct values: too many classes; "
            "set dataset.args.target_type: number for a regression target"
        )
    codes = column.map({label: i for i, label in enumerate(labels)}).to_numpy(dtype="int64")
    return torch.tensor(codes), tuple(str(label) for label in labels)


def tabular(
    *,
    path: str = "data/table.csv",
    target: str = "target",
    categorical: list[str] | None = None,
    drop: list[str] | None = None,
    target_type: Literal["auto", "category", "number"] = "auto",
    split: str = "split",
    val_fraction: Fraction = 0.2,
    test_fraction: TestFraction = 0.2,
    seed: int = 0,
) -> DataSplits:
    """A CSV (``.csv``, ``.tsv``) or Parquet (``.parquet``) table; ``target`` names the column to
    predict (a float column: regression; integer, boolean or text: classification; ``target_type``
    decides otherwise). Rows go to train/val/test by the column ``split`` (train, val or test) when
    the table has it, else by a cut seeded by the sweep (``test_fraction`` of the rows held out for
    the test split, which scores the chosen trial after the sweep; 0: none). ``categorical``:
    numeric columns to treat as categories (codes, zip codes); ``drop``: columns to leave out (ids)."""
    table = read_table(Path(path))
    missing = [c for c in (target, *(categorical or []), *(drop or [])) if c not in table.columns]
    if missing:
        raise ValueError(f"no column '{missing[0]}' in {path}; its columns: {', '.join(map(str, table.columns))}")
    features = [c for c in table.columns if c not in {target, split, *(drop or [])}]
    if not features:
        raise ValueError(f"{path} has no feature columns besides the target '{target}'")
    train, val, test = _train_rows(table, split, val_fraction, test_fraction, seed)
    y, class_names = _targets(table[target], target_type)
    forced = set(categorical or [])
    numeric = [c for c in features if _is_numeric(table[c]) and c not in forced]
    coded = [c for c in features if c not in numeric]
    columns, means, stds, vocabularies = [], [], [], []
    train_rows = table.iloc[train.numpy()]
    for name in numeric:
        values = torch.tensor(table[name].to_numpy(dtype="float64", na_value=math.nan))
        seen = values[train][~values[train].isnan()]
        mean = seen.mean().item() if len(seen) else 0.0
        std = seen.std(correction=0).item() if len(seen) > 1 else 0.0
        std = std if std > 0 else 1.0  # a constant column: left unscaled
        columns.append(((values - mean) / std).nan_to_num(0.0))
        means.append(mean)
        stds.append(std)
    for name in coded:
        text = table[name].astype("string")
        vocabulary = tuple(sorted(set(train_rows[name].dropna().astype("string").tolist())))
        codes = text.map({value: i + 1 for i, value in enumerate(vocabulary)})
        columns.append(torch.tensor(codes.fillna(0).to_numpy(dtype="float64")))
        vocabularies.append(vocabulary)
    x = torch.stack(columns, 1).float()
    layout = TabularFeatures(
        numeric=tuple(map(str, numeric)),
        mean=tuple(means),
        std=tuple(stds),
        categorical=tuple(map(str, coded)),
        vocabularies=tuple(vocabularies),
    )
    return DataSplits(
        train_x=x[train],
        train_y=y[train],
        val_x=x[val],
        val_y=y[val],
        test_x=x[test] if test is not None else None,
        test_y=y[test] if test is not None else None,
        num_classes=len(class_names) if class_names else 0,
        class_names=class_names,
        features=layout,
    )


# --- the model ---------------------------------------------------------------------------------


def embedding_width(categories: int) -> int:
    """fast.ai's rule of thumb for an embedding's width: 1.6 * categories**0.56, at most 32."""
    return max(1, min(32, round(1.6 * categories**0.56)))


class TabularMLP(nn.Module):
    """Each categorical code column -> its Embedding; concatenated with the numeric columns ->
    ``depth`` x (Linear(hidden) -> BatchNorm -> ReLU -> Dropout) -> Linear(num_classes)."""

    def __init__(
        self,
        numeric: int,
        cardinalities: tuple[int, ...],
        num_classes: int,
        hidden: int,
        depth: int,
        dropout: float,
        embedding_dim: int | None,
    ) -> None:
        super().__init__()
        self.numeric = numeric
        self.embeddings = nn.ModuleList(nn.Embedding(n, embedding_dim or embedding_width(n)) for n in cardinalities)
        width = numeric + sum(e.embedding_dim for e in self.embeddings)
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.BatchNorm1d(hidden), nn.ReLU(inplace=True), nn.Dropout(dropout)]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.body = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [x[:, : self.numeric]]
        for i, embedding in enumerate(self.embeddings):
            # an unknown code (beyond the vocabulary) reads as code 0, unseen
            code = x[:, self.numeric + i].long()
            code = torch.where((code >= 0) & (code < embedding.num_embeddings), code, torch.zeros_like(code))
            parts.append(embedding(code))
        return self.body(torch.cat(parts, 1))


def tabular_mlp(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    features: TabularFeatures | None = None,
    hidden: Annotated[Width, IntRange(32, 512, log=True)] = 128,
    depth: Annotated[Depth, IntRange(1, 4)] = 2,
    dropout: Annotated[Probability, Uniform(0.0, 0.5)] = 0.1,
    embedding_dim: Annotated[int | None, Field(ge=1, le=1_024)] = None,
) -> nn.Module:
    """An MLP over a table's rows: an embedding per categorical column (``embedding_dim`` wide;
    unset: 1.6 * categories**0.56, at most 32), concatenated with the numeric columns, then
    ``depth`` hidden layers of ``hidden`` units. Its layout (which columns are codes, how many
    categories each) comes from the data set (``features``); without one, every column is numeric."""
    layout = features or TabularFeatures(numeric=tuple(str(i) for i in range(math.prod(input_shape))))
    columns = len(layout.numeric) + len(layout.categorical)
    if tuple(input_shape) != (columns,):
        raise ValueError(f"tabular_mlp takes rows of {columns} columns (the data set's features); got {input_shape}")
    return TabularMLP(len(layout.numeric), layout.cardinalities, num_classes, hidden, depth, dropout, embedding_dim)


setattr(tabular, DATA_KIND_ATTR, "table")
setattr(tabular_mlp, DATA_KINDS_ATTR, ("table",))
