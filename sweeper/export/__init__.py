"""Export a trained model to every asked format, verify each file, describe them in export.json.

write.py writes and checks the files (``export_model``), inputs.py says what the exported model
takes (x, or x and a mask for padded sequences, with a dynamic length) and which inputs the
check runs, formats.py writes the files, verify.py checks them from a process without sweeper,
consumer.py is that process's (self-contained) code, publish.py registers the model in MLflow
and registrar.py does it from a process of its own, served.py runs those two processes,
trial_run.py exports a finished trial later from its MLflow run, predict.py runs a file
(`sweeper predict`).

Importing this package imports no torch: ``prestart`` starts the export's helper processes
before the sweep's process imports it, so that their start overlaps the sweep's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sweeper.export.verify import ExportError
    from sweeper.export.write import EXAMPLE_ROWS, artifacts, export_model, exportable

__all__ = ["EXAMPLE_ROWS", "ExportError", "artifacts", "export_model", "exportable", "prestart"]


def prestart(formats: list[str], register: bool) -> None:
    """Start the helper processes a sweep's end will use: the check of ``formats``' files and,
    with ``register``, the registrar, each importing what it needs while the sweep trains."""
    from sweeper.export.registrar import prestart as start_registrar
    from sweeper.export.verify import prestart as start_consumer

    if formats:
        start_consumer(formats)
        if register:
            start_registrar()


def __getattr__(name: str) -> Any:  # the writing side, imported when first used (it imports torch)
    if name == "ExportError":
        from sweeper.export import verify

        return verify.ExportError
    if name in ("EXAMPLE_ROWS", "artifacts", "export_model", "exportable"):
        from sweeper.export import write

        return getattr(write, name)
    raise AttributeError(f"module 'sweeper.export' has no attribute {name!r}")
