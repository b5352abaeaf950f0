"""What a plugin author imports: sweeper.plugin's typing Protocols hold for the built-in and the
example plugins (and reject a factory that breaks them), every attribute a plugin may set is
named once (in sweeper.plugin) and documented, ``__all__`` lists the public names; and the mypy
configuration's strict override enables what ``mypy --strict`` does."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

from conftest import REPO

import sweeper.plugin
import sweeper.testing
from sweeper.pluginhost import registry

EXAMPLE = REPO / "examples" / "sweeper-plugin-example"
PROTOCOLS = {
    "models": "ModelFactory",
    "datasets": "DatasetFactory",
    "optimizers": "OptimizerFactory",
    "schedules": "ScheduleFactory",
}
# Factories that break their kind's protocol, one per line, each marked with what mypy must say.
BROKEN = """
import torch
from torch import nn

from sweeper.plugin import DatasetFactory, ModelFactory, OptimizerFactory, ScheduleFactory


def needs_width(*, input_shape: tuple[int, ...], num_classes: int, width: int) -> nn.Module:
    return nn.Linear(input_shape[0], num_classes)


def forgets_classes(*, input_shape: tuple[int, ...]) -> nn.Module:
    return nn.Identity()


def split_needs_path(*, path: str, seed: int = 0) -> int:
    return 0


def returns_a_model(params: object) -> nn.Module:
    return nn.Identity()


def positional_epochs(optimizer: torch.optim.Optimizer, epochs: int, steps: int) -> None:
    return None


def returns_a_factor(optimizer: torch.optim.Optimizer, *, epochs: int, steps_per_epoch: int) -> float:
    return 0.1


a: ModelFactory = needs_width  # error: ModelFactory
b: ModelFactory = forgets_classes  # error: ModelFactory
c: DatasetFactory = split_needs_path  # error: SeededDatasetFactory
d: OptimizerFactory = returns_a_model  # error: OptimizerFactory
e: ScheduleFactory = positional_epochs  # error: ScheduleFactory
f: ScheduleFactory = returns_a_factor  # error: ScheduleFactory
"""


def _entry_points() -> list[tuple[str, str]]:
    """(kind, "module:attr") of every factory sweeper registers and of the example package's."""
    ours = [(p.kind, p.target) for p in registry.list_plugins() if p.kind in PROTOCOLS and p.distribution == "sweeper"]
    groups = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]["entry-points"]
    example = [(group.removeprefix("sweeper."), target) for group, eps in groups.items() for target in eps.values()]
    return ours + [(kind, target) for kind, target in example if kind in PROTOCOLS]


def test_factories_satisfy_the_protocols_and_broken_ones_do_not(tmp_path: Path):
    factories = _entry_points()
    assert {target for _, target in factories} >= {"torch.optim:SGD", "sweeper_plugin_example.optim:lion"}
    lines = [f"from sweeper.plugin import {', '.join(PROTOCOLS.values())}"]
    for i, (kind, target) in enumerate(factories):
        module, attr = target.split(":")
        lines += [f"from {module} import {attr} as factory_{i}", f"check_{i}: {PROTOCOLS[kind]} = factory_{i}"]
    # names of their own: mypy's cache would replay a same-named module's errors of an earlier run
    conforming, broken = (tmp_path / f"{kind}_{uuid.uuid4().hex}.py" for kind in ("conforming", "broken"))
    conforming.write_text("\n".join(lines) + "\n")
    broken.write_text(BROKEN)
    # mypy finds sweeper from the repository; the built-ins (installed as sweeper_plugins from
    # plugins/) and the example package (not installed here) through MYPYPATH.
    (tmp_path / "path").mkdir()
    (tmp_path / "path" / "sweeper_plugins").symlink_to(REPO / "plugins")
    search_path = os.pathsep.join([str(tmp_path / "path"), str(EXAMPLE / "src")])
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--hide-error-context", conforming, broken],
        cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, "MYPYPATH": search_path},
    )  # fmt: skip
    errors = {  # those of the two files (the project's configuration and cache: `mypy sweeper`'s)
        (Path(m["file"]).name, int(m["line"])): m["text"]
        for m in re.finditer(r"^(?P<file>\S+):(?P<line>\d+): error: (?P<text>.*)$", proc.stdout, re.M)
        if Path(m["file"]).parent == tmp_path
    }
    expected = {
        (broken.name, n): m.group(1)
        for n, line in enumerate(BROKEN.splitlines(), start=1)
        if (m := re.search(r"# error: (\w+)", line))
    }
    assert errors.keys() == expected.keys(), proc.stdout + proc.stderr
    for where, protocol in expected.items():
        assert f'variable has type "{protocol}' in errors[where], errors[where]


def _attributes() -> dict[str, str]:
    """sweeper.plugin's names for the attributes a plugin may set: constant -> attribute."""
    return {k: v for k, v in vars(sweeper.plugin).items() if k.endswith("_ATTR")}


def test_each_plugin_attribute_is_named_once_and_documented():
    attributes = _attributes()
    assert set(attributes.values()) == {
        "SWEEPER_PLUGIN_API",
        "sweeper_channels_last",
        "sweeper_fusable",
        "sweeper_data_kind",
        "sweeper_data_kinds",
    }
    # no other module spells one out, nor reads a sweeper_* attribute of its own
    for path in (REPO / "sweeper").rglob("*.py"):
        if path == REPO / "sweeper" / "plugin.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value not in attributes.values(), f"{path}:{node.lineno} spells out {node.value!r}"
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("getattr", "hasattr", "setattr"):
                name = node.args[1] if len(node.args) > 1 else None
                assert not (isinstance(name, ast.Constant) and str(name.value).lower().startswith("sweeper_")), (
                    f"{path}:{node.lineno} reads a plugin attribute not named in sweeper.plugin"
                )
    docs = (REPO / "docs" / "plugins.md").read_text()
    section = docs.split("## Attributes a plugin may set", 1)[1].split("\n## ", 1)[0]
    examples = "\n".join(re.findall(r"```python\n(.*?)```", section, re.S))
    for constant, attribute in attributes.items():
        assert f"`{attribute}`" in section, f"docs/plugins.md does not document {attribute}"
        assert re.search(rf"\b{attribute} = ", examples), f"docs/plugins.md has no example setting {attribute}"
        assert f"sweeper.plugin.{constant}" in section


def test_all_names_the_public_api():
    for module in (sweeper.plugin, sweeper.testing):
        assert all(hasattr(module, name) for name in module.__all__), module.__name__
        assert len(set(module.__all__)) == len(module.__all__)
    assert {n for n in vars(sweeper.testing) if n.startswith("check_")} <= set(sweeper.testing.__all__)
    protocols = {"ModelFactory", "DatasetFactory", "OptimizerFactory", "ScheduleFactory", "DataSplits", "in_dry_build"}
    assert protocols | set(_attributes()) <= set(sweeper.plugin.__all__)


def test_the_strict_override_enables_what_strict_does():
    """pyproject.toml lists --strict's flags one by one (a per-module `strict = true` applies to every
    module: mypy#11401); this holds that list to the installed mypy's --strict."""
    help_text = subprocess.run([sys.executable, "-m", "mypy", "--help"], capture_output=True, text=True).stdout
    listed = re.search(r"--strict\s+Strict mode; enables the following flags:(.*?)\n  --", help_text, re.S)
    assert listed, "mypy --help no longer lists what --strict enables"
    flags = re.findall(r"--([a-z-]+)", re.sub(r"-\s+", "-", listed.group(1)))
    assert len(flags) >= 10, flags
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    (strict,) = [o for o in config["overrides"] if "sweeper.plugin" in o["module"]]
    contracts = {"sweeper.spec.*", "sweeper.errors", "sweeper.states", "sweeper.plan.strategy", "sweeper.track.records"}
    assert contracts | {"sweeper.search.optuna.rdb"} <= set(strict["module"])
    for flag in flags:
        key, value = flag.replace("-", "_"), True
        if key.startswith("no_"):
            key, value = key.removeprefix("no_"), False
        assert strict.get(key, config.get(key)) is value, f"--strict's --{flag} is not in the strict override"
