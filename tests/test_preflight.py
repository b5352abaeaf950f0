"""What every trial would hit is found once, before the first trial: the data set is prepared
(or found missing) in the main process, every plugin choice is dry-built on the CPU with one
training step, plugin arguments are checked against the factories' annotations, and CIFAR's
pickled batches are read by an unpickler that refuses anything but arrays, lists and strings."""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import shutil
import tarfile
import threading
import traceback
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import SPACES, make_dist, sweeper, write_spec, write_tiny_cifar
from typer.testing import CliRunner

from sweeper.cli import app
from sweeper.pluginhost import registry
from sweeper_plugins import cifar


def cli(*args: str) -> tuple[int, str]:
    """The CLI in this process (a subprocess costs seconds of imports); like a user, it must
    never see a traceback: anything but typer's own exit would be one."""
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), "".join(
        traceback.format_exception(result.exception)
    )
    return result.exit_code, " ".join(result.output.split())


def test_cifar_offline_without_data_stops_before_any_trial(workdir: Path, monkeypatch: pytest.MonkeyPatch):
    """The README's headline command on a machine with neither the data nor a network: the
    download is tried once, for real, and fails; exit 2 naming where the files go; no trial, no
    study, no MLflow run (not even its database) and no output folder."""
    db = workdir / "own-mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    proc = sweeper("run", str(SPACES / "cifar.yaml"), "--out", "X", timeout=300)
    message = " ".join(proc.stderr.split())
    assert proc.returncode == 2, message
    for part in (
        "dataset.args / dataset plugin 'cifar10' (distribution sweeper",
        "downloading https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz failed",
        f"CIFAR-10 goes in {workdir / 'data' / 'cifar10' / 'cifar-10-batches-py'}/",
        "data_batch_1 .. data_batch_5 and batches.meta",
        "archive cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html",
        "dataset.args.download: true fetches it (needs internet)",
    ):
        assert part in message
    assert not (workdir / "X").exists() and not db.exists()


def test_a_wrong_type_for_a_plugin_argument_stops_before_training(workdir: Path):
    spec = str(SPACES / "smoke.yaml")
    code, out = cli("validate", spec, "model.args.hidden=wide")
    assert code == 2
    assert "model.args.hidden: model plugin 'mlp' expects int, got 'wide': Input should be a valid integer" in out
    code, out = cli("validate", spec, "optimizer.args.lr=true")  # a bool is not a number here
    assert code == 2 and "optimizer.args.lr: optimizer plugin 'adam' expects float | torch.Tensor, got True" in out
    assert cli("validate", spec, "optimizer.args.lr=1", "model.args.dropout=0")[0] == 0  # an int for a float is fine

    code, out = cli(
        "run", spec, "search.space.model.args.hidden={type: categorical, choices: [16, wide]}", "--out", "X", "--quiet"
    )
    assert code == 2
    assert "model.args.hidden: model plugin 'mlp' expects int, got 'wide' (from search.space.model.args.hidden)" in out
    code, out = cli("validate", spec, "search.space.model.args.depth={type: float, low: 1, high: 2}")
    assert code == 2 and "model.args.depth: model plugin 'mlp' expects int, got 1.0 (from search.space" in out
    assert not (workdir / "X").exists()


def test_every_plugin_choice_is_dry_built(workdir: Path):
    """SGD's nesterov needs momentum: only the sgd choice of a searched optimizer.plugin breaks,
    and the dry build finds it before any trial instead of every sgd trial failing."""
    space = [
        "search.space.optimizer.plugin={type: categorical, choices: [adam, sgd]}",
        "search.space.optimizer.args.nesterov={type: categorical, choices: [true], when: {optimizer.plugin: sgd}}",
    ]
    code, out = cli("run", str(SPACES / "smoke.yaml"), *space, "--out", "X", "--quiet")
    assert code == 2
    assert "optimizer.args / optimizer plugin 'sgd' (distribution sweeper" in out
    assert (
        "building it failed (with optimizer.args.lr=0.0001, optimizer.plugin='sgd', optimizer.args.nesterov=True)"
        in out
    )
    assert "ValueError: Nesterov momentum requires a momentum and zero dampening" in out
    assert not (workdir / "X").exists()

    code, out = cli(
        "validate",
        str(SPACES / "smoke.yaml"),
        *space,
        "search.space.optimizer.args.momentum={type: float, low: 0.8, high: 0.9, when: {optimizer.plugin: sgd}}",
    )
    assert code == 0, out
    assert "# dry build: 2 configuration(s) (base, optimizer.plugin=sgd) on cpu" in out

    code, out = cli("validate", str(SPACES / "smoke.yaml"), "train.batch_size=300")  # 256 training samples
    assert code == 2 and "train.batch_size: a batch of 300 is larger than the training split" in out


THIRD_PARTY = '''
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated
from pydantic import Field
from torch import nn

if TYPE_CHECKING:  # `scale`'s annotation does not resolve at run time: the others are still checked
    from torch import Tensor

def strict(*, input_shape, num_classes, width: Annotated[int, Field(ge=1)] = 4, flat_output: bool = False,
           scale: Tensor | float = 1.0):
    """A model that returns the wrong shape when asked to."""
    import math
    layers = [nn.Flatten(), nn.Linear(math.prod(input_shape), width), nn.Linear(width, num_classes)]
    return nn.Sequential(*layers, nn.Flatten(0)) if flat_output else nn.Sequential(*layers)

def unreachable(*, seed: int = 0):
    raise OSError("the data server refused the connection")
'''


def test_third_party_plugins_are_checked_by_their_annotations_and_a_dry_build(site: Path, workdir: Path):
    make_dist(
        site,
        "strict-plugins",
        "2.1",
        {
            "sweeper.models": {"strict": "strict_plugins:strict"},
            "sweeper.datasets": {"unreachable": "strict_plugins:unreachable"},
        },
        {"strict_plugins.py": THIRD_PARTY},
    )
    registry.refresh()
    spec = str(write_spec(workdir / "s.yaml", model={"plugin": "strict"}, search={"n_trials": 1}))
    assert cli("validate", spec)[0] == 0
    code, out = cli("validate", spec, "model.args.width=0")
    assert code == 2
    assert (
        "model.args.width: model plugin 'strict' expects int, got 0: Input should be greater than or equal to 1" in out
    )
    code, out = cli("validate", spec, "model.args.flat_output=true")
    assert code == 2
    assert (
        "model.args / model plugin 'strict' (distribution strict-plugins 2.1, entry point 'strict = "
        "strict_plugins:strict' in group 'sweeper.models'): a forward and backward pass on 4 training samples "
        "failed: ValueError: it returns shape (12,) for 4 inputs of shape (1, 4, 4); expected (4, num_classes=3)" in out
    )
    code, out = cli("run", spec, "dataset={plugin: unreachable}", "--out", "X", "--quiet")
    assert code == 2
    assert (
        "dataset.args / dataset plugin 'unreachable' (distribution strict-plugins 2.1" in out
        and "preparing the data set failed: OSError: the data server refused the connection" in out
    )
    assert not (workdir / "X").exists()


class Payload:
    """A pickle that runs ``call(argument)`` when loaded: what a hostile 'data_batch_1' holds."""

    def __init__(self, call, argument: str) -> None:
        self.call, self.argument = call, argument

    def __reduce__(self):
        return self.call, (self.argument,)


@pytest.mark.parametrize("call", [os.system, eval], ids=["os.system", "builtins.eval"])
def test_cifar_batches_are_unpickled_restrictively(workdir: Path, call):
    marker = workdir / "payload-ran"
    argument = f"touch {marker}" if call is os.system else f"open({str(marker)!r}, 'w')"
    write_tiny_cifar(workdir / "evil")
    (workdir / "evil" / "cifar-10-batches-py" / "data_batch_1").write_bytes(pickle.dumps(Payload(call, argument)))
    code, out = cli("validate", str(SPACES / "cifar.yaml"), "dataset.args.root=evil")
    assert code == 2
    assert (
        f"{Path('evil') / 'cifar-10-batches-py' / 'data_batch_1'}: not a CIFAR-10 batch: it asks to load "
        f"{call.__module__}.{call.__name__}"
    ) in out  # posix.system / builtins.eval
    assert not marker.exists()  # refused before anything was called

    write_tiny_cifar(workdir / "tiny", per_batch=240)  # the real format loads; 1,080 training samples fit
    # every batch size cifar.yaml searches (up to 1,024), and the whole spec dry-builds
    code, out = cli("validate", str(SPACES / "cifar.yaml"), "dataset.args.root=tiny")
    assert code == 0, out
    assert "# dry build: 2 configuration(s) (base, optimizer.plugin=adamw) on cpu" in out


def test_cifar_download_shows_progress_and_an_archive_on_disk_needs_no_network(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
):
    """A real HTTP server on loopback stands in for the CIFAR host (the plugin's URL and checksum
    point at it): the archive is downloaded with a progress bar on stderr, checked and unpacked;
    later, with the folder gone but the archive kept, ``download: false`` unpacks it offline."""
    write_tiny_cifar(workdir / "made")
    served = workdir / "served"
    served.mkdir()
    with tarfile.open(served / cifar.ARCHIVE, "w:gz") as tar:
        tar.add(workdir / "made" / cifar.FOLDER, arcname=cifar.FOLDER)
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(served))
    with ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        monkeypatch.setattr(cifar, "URL", f"http://127.0.0.1:{server.server_port}/{cifar.ARCHIVE}")
        monkeypatch.setattr(cifar, "MD5", hashlib.md5((served / cifar.ARCHIVE).read_bytes()).hexdigest())
        data = cifar.cifar10(root="data", download=True, val_fraction=0.2)
        server.shutdown()
    assert len(data.train_y) + len(data.val_y) == 100 and data.class_names[0] == "airplane"
    assert "100%" in capfd.readouterr().err  # the progress bar, on stderr

    shutil.rmtree(workdir / "data" / cifar.FOLDER)  # the server is gone; the archive stays in root
    assert len(cifar.cifar10(root="data", download=False, val_fraction=0.2).train_y) == 80
