"""Hostile specs and overrides: whatever the bytes, the loader returns a spec or raises a
UserError naming the file and what was expected; never another exception, never a hang.

Named cases first (each a file a user or an attacker could hand to `sweeper validate`), then a
property-based fuzz of sweeper.spec.load.load in-process (thousands of inputs: random bytes,
YAML-ish text, mutations of the shipped specs, random overrides), then the real CLI on a few.
"""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

import pytest
import yaml
from conftest import SPACES, sweeper
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sweeper.errors import UserError
from sweeper.spec import SweepSpec, load
from sweeper.spec import space as sp

SMOKE = (SPACES / "smoke.yaml").read_text()
SHIPPED = [p.read_text() for p in sorted(SPACES.glob("*.yaml"))]
# "A billion laughs": 9^9 list items from nine short lines
LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")
)


def smoke_with(old: str, new: str) -> str:
    assert old in SMOKE
    return SMOKE.replace(old, new)


HOSTILE = {  # name: (file content, words the message must contain)
    "not-utf8.yaml": (b"name: \xff\xfe smoke\n", ["not UTF-8", "byte 0xff"]),
    "deep-flow.yaml": (b"[" * 100_000 + b"]" * 100_000, ["nested more than", ":1:"]),
    "deep-block.yaml": ("".join(f"{'  ' * i}k{i}:\n" for i in range(200)).encode(), ["nested more than"]),
    "laughs.yaml": (LAUGHS.encode(), ["anchors (&a) are not allowed", ":1:"]),
    "laughs-in-args.yaml": (
        smoke_with("args: {hidden: 32, depth: 1}", "args: {hidden: *h, depth: 1}")
        .replace("name: smoke", "name: &h smoke")
        .encode(),
        ["anchors (&h) are not allowed"],
    ),
    "nan-epochs.yaml": (smoke_with("epochs: 3", "epochs: .nan").encode(), ["train.epochs", "not a number"]),
    "inf-high.yaml": (
        smoke_with("high: 1.0e-1", "high: .inf").encode(),
        ["search.space.optimizer.args.lr.high", "not a number"],
    ),
    "nan-lr.yaml": (smoke_with("lr: 1.0e-2", "lr: .NaN").encode(), ["optimizer.args.lr", "not a number"]),
    "quoted-nan-low.yaml": (smoke_with("low: 1.0e-4", "low: 'nan'").encode(), ["optimizer.args.lr.low", "finite"]),
    "huge-int-grid.yaml": (
        smoke_with("sampler: tpe", "sampler: grid")
        .replace(
            "optimizer.args.lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}",
            "train.batch_size: {type: int, low: 1, high: 100000000000000}",
        )
        .encode(),
        ["train.batch_size", "more than 100,000"],
    ),
    "tiny-step-grid.yaml": (
        smoke_with("sampler: tpe", "sampler: grid").replace("log: true}", "step: 1.0e-300}").encode(),
        ["optimizer.args.lr", "more than 100,000"],
    ),
    "product-grid.yaml": (
        smoke_with("sampler: tpe", "sampler: grid")
        .replace(
            "optimizer.args.lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}",
            "train.batch_size: {type: int, low: 1, high: 1000}\n    train.epochs: {type: int, low: 1, high: 1000}",
        )
        .encode(),
        ["grid of", "more than 100,000 points"],
    ),
    "overflowing-step-grid.yaml": (
        smoke_with("sampler: tpe", "sampler: grid")
        .replace(
            "{type: float, low: 1.0e-4, high: 1.0e-1, log: true}",
            "{type: float, low: -3.0e38, high: 3.0e38, step: 1.0e-300}",  # the largest floats a spec may hold
        )
        .encode(),
        ["optimizer.args.lr", "more than 100,000"],
    ),
    "python-tag.yaml": (b"name: !!python/object/apply:os.system [echo hi]\n", ["python/object", ":1:"]),
    "binary-tag.yaml": (b"name: !!binary aGVsbG8=\n", ["binary", "not allowed"]),
    "bad-int-tag.yaml": (b"seed: !!int twelve\n", ["invalid YAML value"]),
    "giant-int.yaml": (smoke_with("seed: 0", "seed: 1" + "0" * 5000).encode(), ["invalid YAML value"]),
    "list.yaml": (b"- a\n- b\n", ["expected a mapping of spec sections", "got list"]),
    "empty.yaml": (b"", ["expected a mapping of spec sections"]),
    "nul.yaml": (b"name: a\x00b\n", ["invalid YAML"]),
    "many-errors.yaml": ("\n".join(f"key{i}: {i}" for i in range(2000)).encode(), ["unknown key", "and 1996 more"]),
    "many-nodes.yaml": (("x: [" + ", ".join(["1"] * 20_000) + "]").encode(), ["more than 10,000 YAML values"]),
    "empty-int-tag.yaml": (b"seed: !!int\n", ["invalid YAML value"]),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_hostile_file_is_a_user_error_naming_the_file(workdir: Path, name: str):
    content, words = HOSTILE[name]
    (workdir / name).write_bytes(content)
    with pytest.raises(UserError) as info:
        load(workdir / name)
    message = str(info.value)
    assert message.startswith(str(workdir / name)), message
    assert all(w in message for w in words), message
    assert len(message) < 2000  # a readable paragraph, not the input echoed back


def test_folders_devices_and_oversized_files(workdir: Path):
    with pytest.raises(UserError, match="is a folder"):
        load(workdir)
    with pytest.raises(UserError, match="larger than 1 MiB"):
        load("/dev/zero")  # endless: read up to the limit, never to the end
    (workdir / "big.yaml").write_text("# " + "x" * (2 << 20))
    with pytest.raises(UserError, match="larger than 1 MiB"):
        load(workdir / "big.yaml")
    with pytest.raises(UserError, match="cannot read the spec"):
        load(workdir / "missing.yaml")


def test_hostile_overrides_are_user_errors_naming_the_override():
    cases = {
        "train.epochs=.inf": "train.epochs",
        "optimizer.args.lr=.nan": "optimizer.args.lr",
        "model.args=&x {a: 1}": "override model.args",
        "train.epochs=[" + "[" * 500: "override train.epochs",
        "a" + ".b" * 1000 + "=1": "nested more than",
        "search.space.dataset.args.seed={type: int, low: 1, high: 10000000000000000}": None,
        "search.sampler=grid": "more than 100,000",
    }
    for override, words in cases.items():
        args = (
            [override]
            if "search.sampler" not in override
            else [override, "search.space={train.epochs: {type: int, low: 1, high: 10000000000}}"]
        )
        if words is None:  # a huge range is fine for a sampler that does not enumerate it
            assert load(SPACES / "smoke.yaml", args).search.space["dataset.args.seed"].high == 10**16
            continue
        with pytest.raises(UserError, match=words.replace(".", r"\.")):
            load(SPACES / "smoke.yaml", args)


def test_plain_data_still_loads():
    """What the limits must not refuse: 1e-3 is a float, a date is a string, the shipped specs load."""
    spec = load(
        SPACES / "smoke.yaml",
        [
            "optimizer.args.lr=1e-3",
            "dataset.args.note=2024-05-01",
            "search.sampler=grid",
            "search.space.optimizer.args.lr={type: float, low: 0.001, high: 0.1, step: 0.001}",
        ],
    )
    assert spec.optimizer.args["lr"] == 1e-3 and spec.dataset.args["note"] == "2024-05-01"
    assert sp.grid_size(spec.search.space) == 100 * 2
    for path in sorted(SPACES.glob("*.yaml")):
        assert isinstance(load(path), SweepSpec)


# --- the fuzz test ----------------------------------------------------------------------------

GUARD_S = 60  # a hung input fails the test instead of stalling the suite; inputs take milliseconds


@contextlib.contextmanager
def hang_guard():
    def hung(signum, frame):
        raise AssertionError(f"one input took more than {GUARD_S} s to load or refuse")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(GUARD_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def loads_or_refuses(text: str | bytes, overrides: list[str] = ()) -> None:
    path = Path("fuzz.yaml")
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    with hang_guard():
        try:
            assert isinstance(load(path, list(overrides)), SweepSpec)
        except UserError as exc:
            assert str(exc) and len(str(exc)) < 5000


YAML_TOKENS = [
    "{",
    "}",
    "[",
    "]",
    ": ",
    ", ",
    "- ",
    "\n",
    "\n  ",
    "&a ",
    "*a",
    "!!int ",
    "!!str ",
    "!!binary ",
    "!!python/name:os.system",
    "<<: ",
    "? ",
    "|\n  ",
    ">\n  ",
    "'",
    '"',
    "#",
    "%YAML 1.1\n",
    "---\n",
    "...\n",
    ".inf",
    "-.inf",
    ".nan",
    "1e-3",
    "1e999",
    "-0",
    "0x1F",
    "0o17",
    "1_000",
    "~",
    "null",
    "true",
    "no",
    "2024-13-45",
    "12:30:00",
    "name",
    "search",
    "space",
    "sampler",
    "grid",
    "type",
    "float",
    "int",
    "categorical",
    "low",
    "high",
    "step",
    "log",
    "choices",
    "when",
    "train",
    "epochs",
    "batch_size",
    "optimizer",
    "args",
    "lr",
    "model",
    "plugin",
    "mlp",
    "dataset",
    "\t",
    "\x00",
    "\ufeff",
    "é",
    "\U0001f600",
    "\x85",
    "\u2028",
]
yamlish = st.lists(st.one_of(st.sampled_from(YAML_TOKENS), st.text(max_size=8)), max_size=60).map("".join)


@st.composite
def mutated_spec(draw) -> str:
    """A shipped spec with a few slices deleted, duplicated or replaced by YAML-ish text."""
    text = draw(st.sampled_from(SHIPPED))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 40)))
        text = text[:i] + draw(st.one_of(yamlish, st.just(text[i:j] * 2), st.just(""))) + text[j:]
    return text


leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
    st.integers(min_value=-(10**40), max_value=10**40),
)
json_like = st.recursive(
    leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12,
)
SPEC_PATHS = [
    "name",
    "seed",
    "objective.metric",
    "train.epochs",
    "train.batch_size",
    "train.accumulate",
    "train.grad_clip",
    "optimizer.args.lr",
    "optimizer.plugin",
    "model.args",
    "dataset.args.num_train",
    "search.sampler",
    "search.n_trials",
    "search.timeout",
    "search.pruner",
    "search.lr_finder",
    "search.space",
    "search.space.optimizer.args.lr",
    "search.space.train.batch_size",
    "search.space.optimizer.args.lr.low",
    "search.space.optimizer.args.lr.step",
    "search.space.model.args.hidden.choices",
    "search.space.train.epochs",
    "export.formats",
    "tracking.mlflow_uri",
    "search.space.model.args.hidden.when",
]
override_path = st.one_of(st.sampled_from(SPEC_PATHS), st.text(alphabet="abc._=", min_size=1, max_size=12))
override = st.builds(
    lambda p, v: f"{p}={v}",
    override_path,
    st.one_of(yamlish, json_like.map(lambda v: yaml.safe_dump(v, default_flow_style=True).strip())),
)
SETTINGS = settings(
    max_examples=700,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SETTINGS
@given(data=st.one_of(st.binary(max_size=400), yamlish, mutated_spec()))
def test_fuzz_any_text_loads_or_is_a_user_error(data):
    loads_or_refuses(data)


@SETTINGS
@given(text=st.one_of(st.sampled_from(SHIPPED), mutated_spec()), overrides=st.lists(override, max_size=4))
def test_fuzz_any_override_loads_or_is_a_user_error(text, overrides):
    loads_or_refuses(text, overrides)


@SETTINGS
@given(changes=st.dictionaries(st.sampled_from(SPEC_PATHS), json_like, min_size=1, max_size=4))
def test_fuzz_any_value_at_any_spec_path_loads_or_is_a_user_error(changes):
    """Typed values (NaN, huge ints, nested lists, wrong types) at the paths that matter."""
    tree = yaml.safe_load(SMOKE)
    try:
        tree = sp.apply(tree, changes)
    except ValueError:
        return  # the path crosses a value: not a spec this test can write
    loads_or_refuses(yaml.safe_dump(tree, allow_unicode=True))


# --- the real CLI ---------------------------------------------------------------------------------


def test_validate_refuses_hostile_files_with_exit_2_and_no_traceback(workdir: Path):
    names = ["not-utf8.yaml", "deep-flow.yaml", "laughs-in-args.yaml", "nan-lr.yaml", "huge-int-grid.yaml"]
    for name in names:
        (workdir / name).write_bytes(HOSTILE[name][0])
    for target in [*names, "."]:
        proc = sweeper("validate", target, "train.epochs=.inf" if target == "." else "seed=1")
        assert proc.returncode == 2, (target, proc.stdout, proc.stderr)
        assert "error:" in proc.stderr and target.removesuffix(".yaml") in proc.stderr, proc.stderr
