"""Third-party plugins, as real distributions: one that raises at import, a misspelt argument,
a name claimed twice, an incompatible plugin-API version, shipped search spaces."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from conftest import make_dist, sweeper, write_spec

from sweeper import PLUGIN_API_VERSION
from sweeper.errors import UserError
from sweeper.pluginhost import registry

MODEL = '''
from torch import nn
SWEEPER_PLUGIN_API = {api!r}

def {name}(*, input_shape, num_classes, width: int = 8):
    """A linear model{doc}."""
    import math
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), width), nn.Linear(width, num_classes))
'''


def model_dist(
    site: Path, dist: str, module: str, name: str = "tiny", api: object = PLUGIN_API_VERSION, version: str = "1.0"
) -> None:
    make_dist(
        site,
        dist,
        version,
        {"sweeper.models": {name: f"{module}:{name}"}},
        {f"{module}.py": MODEL.format(api=api, name=name, doc=f" from {dist}")},
    )
    registry.refresh()


def quick(path: Path, **model: object) -> Path:
    return write_spec(
        path,
        model=model,
        train={"epochs": 1, "batch_size": 32},
        search={"n_trials": 1, "sampler": "random"},
        tracking={"enabled": False},
    )


def test_refresh_sees_new_distributions(site: Path):
    assert "tiny" not in {p.name for p in registry.list_plugins("models")}
    make_dist(
        site,
        "late-plugin",
        "0.3",
        {"sweeper.models": {"tiny": "late_models:tiny"}},
        {"late_models.py": MODEL.format(api=1, name="tiny", doc="")},
    )
    assert "tiny" not in {p.name for p in registry.list_plugins("models")}  # cached until refresh()
    registry.refresh()
    (tiny,) = [p for p in registry.list_plugins("models") if p.name == "tiny"]
    assert (tiny.distribution, tiny.version, tiny.target) == ("late-plugin", "0.3", "late_models:tiny")
    assert "late_models" not in sys.modules  # listing imported nothing


def test_a_plugin_that_raises_at_import_breaks_only_itself(site: Path, workdir: Path):
    make_dist(
        site,
        "broken-plugin",
        "1.0",
        {"sweeper.models": {"broken": "broken_models:broken"}},
        {"broken_models.py": "raise RuntimeError('boom: compiled extension missing')\n"},
    )
    registry.refresh()
    assert ("broken", "broken-plugin") in {(p.name, p.distribution) for p in registry.list_plugins("models")}
    with pytest.raises(UserError) as exc:
        registry.get("models", "broken")
    message = str(exc.value)
    for part in (
        "model plugin 'broken'",
        "distribution broken-plugin 1.0",
        "entry point 'broken = broken_models:broken' in group 'sweeper.models'",
        "RuntimeError: boom: compiled extension missing",
        "Other plugins are unaffected",
    ):
        assert part in message
    assert registry.get("models", "mlp")  # the others still load

    listing = sweeper("plugins", check=True)  # plain listing imports nothing: unaffected
    assert "broken-plugin" in listing.stdout and "mlp" in listing.stdout
    with_args = sweeper("plugins", "models", "--args")  # imports each: reports the broken one, shows the rest
    assert with_args.returncode == 1
    assert "  hidden: int = 256\n  depth: int = 2\n" in with_args.stdout
    assert "broken-plugin 1.0" in with_args.stderr and "broken = broken_models:broken" in with_args.stderr
    sweeper("validate", str(quick(workdir / "ok.yaml", plugin="mlp")), check=True)

    bad = sweeper("run", str(quick(workdir / "bad.yaml", plugin="broken")), "--quiet")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "broken-plugin 1.0" in bad.stderr and "RuntimeError: boom" in bad.stderr


def test_a_misspelt_argument_stops_the_sweep_before_any_training(site: Path, workdir: Path):
    model_dist(site, "tiny-plugin", "tiny_models", version="2.0")
    proc = sweeper("run", str(quick(workdir / "spec.yaml", plugin="tiny", args={"widht": 4})), "--quiet")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        "model.args.widht: model plugin 'tiny' has no argument 'widht' (did you mean 'width'?); it "
        "accepts: width. The plugin comes from distribution tiny-plugin 2.0, entry point "
        "'tiny = tiny_models:tiny' in group 'sweeper.models'."
    ) in " ".join(proc.stderr.split())
    assert not (workdir / "runs").exists()  # nothing was started

    spec = quick(workdir / "searched.yaml", plugin="tiny")
    proc = sweeper("validate", str(spec), "search.space.model.args.wdth={type: int, low: 2, high: 8}")
    assert proc.returncode == 2 and "model.args.wdth" in proc.stderr and "did you mean 'width'" in proc.stderr
    sweeper("validate", str(spec), "search.space.model.args.width={type: int, low: 2, high: 8}", check=True)


def test_a_name_claimed_by_two_distributions_must_be_pinned(site: Path, workdir: Path):
    model_dist(site, "alpha-models", "alpha_models", name="twin")
    model_dist(site, "beta-models", "beta_models", name="twin")
    with pytest.raises(
        UserError,
        match=r"'twin' is claimed by several distributions \(distribution "
        r"alpha-models 1\.0.*; distribution beta-models 1\.0.*pin one",
    ):
        registry.get("models", "twin")
    beta = registry.get("models", "beta-models:twin")
    assert beta.__module__ == "beta_models"
    assert registry.get("models", "beta_models:twin") is beta  # pins use the normalised name

    listing = sweeper("plugins", "models", check=True)
    assert "alpha-models" in listing.stdout and "beta-models" in listing.stdout
    assert "'twin' is claimed by alpha-models, beta-models" in listing.stderr

    unpinned = sweeper("validate", str(quick(workdir / "a.yaml", plugin="twin")))
    assert unpinned.returncode == 2 and "alpha-models" in unpinned.stderr and "beta-models" in unpinned.stderr
    pinned = quick(workdir / "b.yaml", plugin="beta-models:twin", args={"width": 4})
    assert "model.beta-models:twin=beta-models==1.0" in sweeper("validate", str(pinned), check=True).stdout
    sweeper("run", str(pinned), "--quiet", "--out", "out", check=True)  # trials and export use the pin
    summary = yaml.safe_load((workdir / "out" / "summary.json").read_text())
    assert summary["counts"] == {"complete": 1}


def test_an_incompatible_api_version_is_refused(site: Path):
    model_dist(site, "future-plugin", "future_models", api=PLUGIN_API_VERSION + 1, version="3.0")
    with pytest.raises(UserError) as exc:
        registry.get("models", "tiny")
    message = str(exc.value)
    for part in (
        "model plugin 'tiny'",
        "distribution future-plugin 3.0",
        "'tiny = future_models:tiny'",
        f"targets sweeper plugin API version {PLUGIN_API_VERSION + 1} (future_models.SWEEPER_PLUGIN_API)",
        f"sweeper.PLUGIN_API_VERSION = {PLUGIN_API_VERSION}",
    ):
        assert part in message
    proc = sweeper("plugins", "show", "tiny")
    assert proc.returncode == 2 and "future-plugin 3.0" in proc.stderr and "Traceback" not in proc.stderr


def test_api_version_declarations(site: Path):
    model_dist(site, "multi-plugin", "multi_models", name="multi", api=[PLUGIN_API_VERSION, PLUGIN_API_VERSION + 1])
    model_dist(site, "odd-plugin", "odd_models", name="odd", api="one")
    assert registry.get("models", "multi")  # a list naming this version is fine
    with pytest.raises(
        UserError,
        match=r"declares SWEEPER_PLUGIN_API = 'one' in module odd_models; "
        r"expected an int or a list of ints",
    ):
        registry.get("models", "odd")
    assert registry.declared_api("models", "multi") == [PLUGIN_API_VERSION, PLUGIN_API_VERSION + 1]
    assert registry.declared_api("models", "mlp") is None  # undeclared: accepted


def test_plugins_show_prints_provenance_and_arguments(site: Path):
    model_dist(site, "tiny-plugin", "tiny_models", version="2.0")
    out = " ".join(sweeper("plugins", "show", "tiny", check=True).stdout.split())
    for part in (
        "model plugin 'tiny'",
        "distribution tiny-plugin 2.0",
        "entry point tiny = tiny_models:tiny",
        f"plugin API {PLUGIN_API_VERSION} (this sweeper: {PLUGIN_API_VERSION})",
        "A linear model from tiny-plugin.",
        "set by sweeper: input_shape, num_classes",
        "width 8 int",
    ):
        assert part in out
    typo = sweeper("plugins", "show", "tinny")
    assert typo.returncode == 2 and "Did you mean 'tiny'?" in typo.stderr


def test_init_copies_a_shipped_search_space(site: Path, workdir: Path):
    smoke = (Path(__file__).parents[1] / "search_spaces" / "smoke.yaml").read_text()
    make_dist(
        site,
        "spaces-plugin",
        "0.2",
        {"sweeper.search_spaces": {"quick": "spaces_pkg.spaces"}, "sweeper.models": {"tiny": "spaces_pkg.models:tiny"}},
        {
            "spaces_pkg/__init__.py": "",
            "spaces_pkg/spaces/__init__.py": "",
            "spaces_pkg/spaces/quick.yaml": smoke,
            "spaces_pkg/models.py": MODEL.format(api=1, name="tiny", doc=""),
        },
    )
    registry.refresh()
    assert "spaces_pkg" not in sys.modules
    sweeper("init", "--from", "quick", check=True)
    written = (workdir / "quick.yaml").read_text()
    assert written.startswith("# Copied by `sweeper init --from quick` from search space 'quick' of spaces-plugin 0.2.")
    assert written.endswith(smoke)  # the YAML is copied as written, comments included
    sweeper("validate", "quick.yaml", check=True)

    again = sweeper("init", "--from", "tiny")  # a plugin name: its distribution's only search space
    assert again.returncode == 2 and "quick.yaml already exists" in again.stderr
    sweeper("init", "--from", "tiny", "--out", "other/spec.yaml", check=True)
    assert (workdir / "other" / "spec.yaml").read_text().endswith(smoke)
    several = sweeper("init", "--from", "mlp")  # sweeper itself ships several spaces using mlp
    shipped = (
        "sweeper:cifar, sweeper:diabetes, sweeper:digits, sweeper:image_folder, sweeper:mnist1d, sweeper:multilabel, "
        "sweeper:sequences, sweeper:smoke, sweeper:tabular, sweeper:torchvision, sweeper:torchvision_model"
    )
    assert several.returncode == 2
    assert f"'mlp' comes from sweeper, which ships several search spaces: {shipped}" in several.stderr
    make_dist(
        site,
        "bare-plugin",
        "1.0",
        {"sweeper.models": {"bare": "bare_models:bare"}},
        {"bare_models.py": MODEL.format(api=1, name="bare", doc="")},
    )
    registry.refresh()
    none = sweeper("init", "--from", "bare")
    assert none.returncode == 2 and "plugin 'bare' (from bare-plugin) ships no search space" in none.stderr
    assert "spaces-plugin:quick" in none.stderr


def test_init_copies_a_built_in_search_space(workdir: Path):
    """The built-in search spaces register through the same group a third party uses (installed
    as package data of sweeper_plugins.search_spaces) and come out as written."""
    sweeper("init", "--from", "digits", "--out", "d.yaml", check=True)
    shipped = (Path(__file__).parents[1] / "search_spaces" / "digits.yaml").read_text()
    assert (workdir / "d.yaml").read_text().endswith(shipped)
    sweeper("validate", "d.yaml", check=True)
