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


@pytest.mark.parametrize("name", MODELS)
def test_padded_values_change_neither_the_loss_nor_the_gradients(name: str):
    """The DataLoader path's padding, end to end in training mode: the built-in `sequences` data
    set's batch collated by pad_collate, the model called with the mask as the trainer calls it,
    the classification task's loss and metrics. Filling the padded positions with other values
    gives the very same loss, metrics and gradients (dropout on, drawn from the same seed)."""
    from sweeper.spec import TrainSpec
    from sweeper.trial.loading import as_batch, forward
    from sweeper.trial.trainer import default_task

    data = registry.get("datasets", "sequences")(num_train=16, num_val=8, min_length=6, max_length=20, seed=0)
    batch = as_batch(data.collate("train", range(16)), torch.device("cpu"))
    assert batch.mask is not None and not batch.mask.all()  # variable lengths: some padding
    task = default_task(data, TrainSpec())
    torch.manual_seed(0)
    model = registry.get("models", name)(input_shape=data.sample_shape, num_classes=data.num_classes, dropout=0.2)
    model.train()

    def loss_metrics_grads(x: torch.Tensor) -> tuple[float, dict[str, float], list[torch.Tensor]]:
        model.zero_grad()
        torch.manual_seed(1)  # the same dropout draws
        out = forward(model, x, batch.mask)
        loss = task.loss(out, batch.y)
        loss.backward()
        meter = task.meter("train")
        meter.update(out.detach(), batch.y)
        return loss.item(), meter.compute(), [p.grad.clone() for p in model.parameters()]

    loss, metrics, grads = loss_metrics_grads(batch.x)
    other = batch.x.clone()
    padding = ~batch.mask
    other[padding] = 1_000 * torch.randn(int(padding.sum()), generator=torch.Generator().manual_seed(2))
    other_loss, other_metrics, other_grads = loss_metrics_grads(other)
    assert other_loss == loss and other_metrics == metrics
    assert len(grads) == len(other_grads) and all(torch.equal(a, b) for a, b in zip(grads, other_grads))
    assert any(g.abs().sum() > 0 for g in grads)  # the gradients are not trivially zero
