"""What every section of the sweep spec shares: the strict base model and the upper bounds of
the counts it holds."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """A spec section: unknown keys refused (a typo is an error), frozen, NaN or inf never meant."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# Upper bounds of counts: far above any real sweep, far below what would overflow or stall deep
# inside a plugin, Optuna or torch (a typo such as epochs: 10**12 is refused by `validate`).
MAX_EPOCHS = 100_000  # epochs of one trial: at 10 ms per epoch, 17 minutes; at 1 s, 28 hours
MAX_BATCH = 1 << 24  # samples per batch (16.8 M): a batch also has to fit in the training split
MAX_TRIALS = 1_000_000  # trials of a sweep: each is a row set in the study and an MLflow run
MAX_PROCESSES = 1024  # worker processes or torch threads on one machine
MAX_SECONDS = 366 * 24 * 3600  # a year, in seconds: longer is a unit slip (ms, minutes)
MAX_DEVICES = 1024  # DDP ranks of one trial
MAX_FUSED = 10_000  # trials in one fused model: at most a proposed batch (search.batch_size)
MAX_DEVICE_HOURS = MAX_PROCESSES * MAX_SECONDS / 3600  # 1024 devices for a year (9.0 M): more is a unit slip
