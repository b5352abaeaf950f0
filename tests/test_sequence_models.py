"""The sequence models (conv1d, gru, transformer): they train a step on (N, L) and (N, C, L)
batches, export to TorchScript, torch.export (.pt2) and ONNX with the outputs of the eager model,
and a mask keeps padded positions out of the logits."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from sweeper.export import formats
from sweeper.pluginhost import registry
from sweeper.testing import PluginExportWarning, check_model_plugin

MODELS = ("conv1d", "gru", "transformer")


@pytest.mark.parametrize("name", MODELS)
def test_a_sequence_model_trains_and_exports_to_every_format(name: str, tmp_path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", PluginExportWarning)  # an export that fails fails the test
        report = check_model_plugin(name, input_shape=(40,), num_classes=10, batch=4)
    assert report.warnings == []
    assert {"exports to TorchScript (reloaded, same outputs)", "exports to ONNX (reloaded, same outputs)"} <= set(
        report.passed
    )
    # torch.export with a dynamic batch: the .pt2 file reloaded answers another batch size alike
    torch.manual_seed(0)
    model = registry.get("models", name)(input_shape=(40,), num_classes=10).eval()
    formats.pt2(model, torch.randn(4, 40), tmp_path / "model.pt2")
    x = torch.randn(7, 40)
    with torch.no_grad():
        diff = (torch.export.load(str(tmp_path / "model.pt2")).module()(x) - model(x)).abs().max()
    assert diff <= 1e-5


@pytest.mark.parametrize("name", MODELS)
def test_channels_first_batches_train_too(name: str):
    model = registry.get("models", name)(input_shape=(3, 24), num_classes=5)
    out = model(torch.randn(6, 3, 24))
    assert out.shape == (6, 5)
    torch.nn.functional.cross_entropy(out, torch.randint(0, 5, (6,))).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("name", MODELS)
def test_padding_under_a_mask_does_not_change_the_logits(name: str):
    """A batch padded past its end with arbitrary values, and a mask that says so, gives the
    logits of the unpadded batch (eval mode: batch norm's statistics are fixed)."""
    torch.manual_seed(0)
    longer = {"max_length": 64} if name == "transformer" else {}  # the positions it codes
    model = registry.get("models", name)(input_shape=(40,), num_classes=10, **longer).eval()
    x = torch.randn(3, 40)
    padded = torch.cat([x, 100 * torch.randn(3, 9)], dim=1)
    mask = torch.arange(49) < 40
    with torch.no_grad():
        expected = model(x).numpy()
        masked = model(padded, mask.expand(3, 49)).numpy()
        unmasked = model(padded).numpy()
    assert np.abs(masked - expected).max() <= 1e-5
    assert np.abs(unmasked - expected).max() > 1e-3  # the padding would change them without the mask


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"heads \(3\) must divide width \(32\)"):
        registry.get("models", "transformer")(input_shape=(40,), num_classes=10, width=32, heads=3)
    with pytest.raises(ValueError, match=r"shaped \(L,\) or \(C, L\), got \(1, 8, 8\)"):
        registry.get("models", "gru")(input_shape=(1, 8, 8), num_classes=10)
    with pytest.raises(ValueError, match=r"41 positions is longer than max_length \(40\)"):
        registry.get("models", "transformer")(input_shape=(40,), num_classes=10)(torch.randn(2, 41))
