"""The whole command line under hostile arguments: every command of `sweeper`, called in this
process with random strings, paths that do not exist, folders, binary files, huge numbers, bad
option values and random dotted overrides. Whatever the input: exit code 0, 1 or 2 (as
documented), never a traceback, never a hang, and no file left behind by a call that failed.

Commands that would start long work when their input is valid (run, worker, lr-find, submit,
dashboard) get inputs that must fail early (no readable spec, no sweep at that folder or URL).
"""

from __future__ import annotations

import contextlib
import signal
import traceback
from pathlib import Path

from conftest import SPACES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from sweeper.cli import app

CALL_S = 60  # one call's bound: each takes well under a second (the first import of MLflow, seconds)


@contextlib.contextmanager
def bounded(args: list[str]):
    def hung(signum, frame):
        raise AssertionError(f"sweeper {args} ran more than {CALL_S} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(CALL_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*")}


# Hostile values for any argument or option; made concrete in the test's folder.
WORDS = [
    "missing.yaml",
    "no/such/folder",
    ".",
    "binary.bin",
    "notes.yaml",
    "empty.yaml",
    "1" * 40,
    "-1",
    "0",
    "1e999",
    "nan",
    "",
    " ",
    "--",
    "-",
    "--bogus",
    "sqlite:///fuzz.db",
    "foo://bar",
    "postgresql+psycopg://nobody@127.0.0.1:1/none",
    "http://127.0.0.1:1",
    "a.b=c",
    "train.epochs=0",
    "é\u2028\x00",
]
word = st.one_of(st.sampled_from(WORDS), st.text(max_size=20))
dotted = st.builds(
    lambda path, value: f"{path}={value}",
    st.one_of(
        st.sampled_from(["train.epochs", "search.storage", "model.args.hidden", "search.space.x", "seed", "name"]),
        st.text(alphabet="abc._", min_size=1, max_size=10),
    ),
    word,
)
BAD_SPECS = ["missing.yaml", "no/such/folder", ".", "binary.bin", "notes.yaml", "empty.yaml"]
bad_spec = st.sampled_from(BAD_SPECS)
KINDS = ["datasets", "models", "optimizers", "schedules", "search_spaces"]


@st.composite
def command_line(draw) -> list[str]:
    """One call of one command, with hostile arguments and options."""
    command = draw(
        st.sampled_from(
            [
                "run",
                "validate",
                "worker",
                "status",
                "stop",
                "dashboard",
                "submit",
                "lr-find",
                "sync",
                "replay",
                "report",
                "export",
                "predict",
                "schema",
                "plugins",
                "init",
                "bogus-command",
            ]
        )
    )
    some = st.lists(word, max_size=3)
    if command in ("run", "lr-find", "submit"):  # must fail early: no readable spec
        args = [draw(bad_spec), *draw(st.lists(dotted, max_size=3))]
        if command == "submit":
            args += ["--address", draw(word)]
        if command != "submit" and draw(st.booleans()):
            args += ["--out", draw(word)]
    elif command == "validate":  # a real spec with hostile overrides is fine here: validate trains nothing
        spec = draw(st.one_of(bad_spec, st.just(str(SPACES / "smoke.yaml"))))
        args = [spec, *draw(st.lists(dotted, max_size=3)), *draw(st.sampled_from([[], ["--estimate"]]))]
        if "--estimate" in args and spec.endswith("smoke.yaml"):
            args.remove("--estimate")  # times real training steps: valid, but not what this test is about
    elif command == "worker":
        args = draw(st.one_of(st.builds(lambda s, o: [s, *o], bad_spec, st.lists(dotted, max_size=2)), some))
        args += draw(st.sampled_from([[], ["--study", draw(word)], ["--name", draw(word)]]))
    elif command in ("status", "stop", "dashboard"):
        args = draw(st.sampled_from([[draw(word)], ["--study", draw(word)], [], ["--name", draw(word)]]))
        if command == "dashboard":
            args += draw(st.sampled_from([[], ["--port", draw(word)], ["--port", "99999999"]]))
        if command == "status" and draw(st.booleans()):
            args.append("--json")
    elif command == "plugins":
        args = draw(
            st.one_of(
                st.just([]),
                st.lists(st.sampled_from([*KINDS, "--args"]), max_size=2),
                st.builds(lambda n: ["show", n], word),
                st.builds(lambda n, k: ["show", n, "--kind", k], word, word),
                some,
            )
        )
    elif command == "init":
        args = draw(st.sampled_from([["--from", draw(word)], ["--from", draw(word), "--out", draw(word)], draw(some)]))
    elif command == "schema":
        args = draw(
            st.sampled_from([[], ["--out", draw(st.sampled_from(["no/such/folder/x.json", ".", "binary.bin"]))]])
        )
    elif command == "predict":
        args = [draw(word), draw(word), *draw(st.sampled_from([[], ["--out", draw(word)]]))]
    elif command == "export":
        args = [draw(word), *draw(st.sampled_from([[], ["--formats", draw(word)], ["--checkpoint", draw(word)]]))]
    else:  # sync, replay, report, bogus-command
        args = draw(some)
    if draw(st.integers(0, 9)) == 0:
        args.append(draw(st.sampled_from(["--bogus", "--help", "-q", "--out"])))
    return [command, *args]


@settings(
    max_examples=120,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(args=command_line())
def test_any_command_line_exits_0_1_or_2_without_a_traceback_or_stray_files(workdir: Path, args: list[str]):
    (workdir / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (workdir / "notes.yaml").write_text("just some words\n")
    (workdir / "empty.yaml").write_text("")
    before = files_under(workdir)
    with bounded(args):
        result = CliRunner().invoke(app, args)
    shown = f"sweeper {args!r} exited {result.exit_code}:\n{result.output}"
    assert result.exception is None or isinstance(result.exception, SystemExit), shown + "".join(
        traceback.format_exception(result.exception)
    )
    assert result.exit_code in (0, 1, 2), shown
    assert "Traceback" not in result.output, shown
    if result.exit_code != 0:
        assert files_under(workdir) == before, f"{shown}\nleft behind: {files_under(workdir) - before}"
