"""What the user wrote: the sweep spec (frozen pydantic models), its search space addressed by
dotted paths, and loading it from YAML with overrides."""

from sweeper.spec.load import apply_overrides, json_schema, load, parse_yaml, validate
from sweeper.spec.model import (
    EXPORT_FORMATS,
    METRICS,
    DataSpec,
    ExportSpec,
    Objective,
    PluginRef,
    SweepSpec,
    TrackingSpec,
    TrainSpec,
)
from sweeper.spec.search import LRFinderSpec, PrunerSpec, SearchSpec

__all__ = [
    "EXPORT_FORMATS",
    "METRICS",
    "DataSpec",
    "ExportSpec",
    "LRFinderSpec",
    "Objective",
    "PluginRef",
    "PrunerSpec",
    "SearchSpec",
    "SweepSpec",
    "TrackingSpec",
    "TrainSpec",
    "apply_overrides",
    "json_schema",
    "load",
    "parse_yaml",
    "validate",
]
