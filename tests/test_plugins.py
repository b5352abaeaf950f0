"""Built-in plugins: models, data sets (CIFAR-10 from tiny files in its on-disk format), schedules."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import write_tiny_cifar

from sweeper.plugin import Normalize
from sweeper.pluginhost import registry
from sweeper_plugins.cifar import MEAN, PAD, STD, random_crop_flip


@pytest.mark.parametrize("name, args", [("mlp", {}), ("cnn", {}), ("resnet18", {"width": 8})])
@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 32, 32)])
def test_models_map_inputs_to_class_logits(name, args, shape):
    model = registry.get("models", name)(input_shape=shape, num_classes=7, **args)
    out = model(torch.randn(5, *shape))
    assert out.shape == (5, 7)
    out.sum().backward()  # trainable end to end
    assert all(p.grad is not None for p in model.parameters())


def test_resnet18_is_the_cifar_variant():
    model = registry.get("models", "resnet18")(input_shape=(3, 32, 32), num_classes=10, width=64)
    stem = model[0]
    assert stem.kernel_size == (3, 3) and stem.stride == (1, 1)
    assert not any(isinstance(m, torch.nn.MaxPool2d) for m in model.modules())
    assert 11.0e6 < sum(p.numel() for p in model.parameters()) < 11.3e6  # ResNet-18: 11.2 M


def test_digits_is_real_and_split_by_seed():
    digits = registry.get("datasets", "digits")
    a, b, c = digits(seed=0), digits(seed=0), digits(seed=1)
    assert a.train_x.shape == (1079, 1, 8, 8) and a.val_x.shape == (359, 1, 8, 8) and a.num_classes == 10
    assert a.test_x is not None and a.test_x.shape == (359, 1, 8, 8)  # test_fraction 0.2: tests/test_holdout.py
    assert torch.equal(a.val_y, b.val_y) and not torch.equal(a.val_y, c.val_y)
    assert abs(a.train_x.mean().item()) < 1e-5  # standardised on the training split


def test_cifar10_reads_the_on_disk_format(tmp_path: Path):
    write_tiny_cifar(tmp_path)
    data = registry.get("datasets", "cifar10")(root=str(tmp_path), val_fraction=0.2, seed=3)
    assert data.train_x.shape == (80, 3, 32, 32) and data.val_x.shape == (20, 3, 32, 32)
    assert data.test_x is not None and data.test_x.shape == (20, 3, 32, 32)  # test_batch: the held-out test split
    assert data.class_names[0] == "airplane" and data.num_classes == 10
    assert data.train_transform is random_crop_flip
    assert data.normalization["mean"] == pytest.approx([0.4914, 0.4822, 0.4465])
    # pixels stay uint8 (a quarter of float32's memory) and are normalised per batch on the device
    assert data.train_x.dtype == torch.uint8 and data.train_x.is_contiguous()
    inputs = data.inputs(data.val_x[:4])
    mean, std = torch.tensor(MEAN)[:, None, None], torch.tensor(STD)[:, None, None]
    torch.testing.assert_close(inputs, (data.val_x[:4].float() / 255 - mean) / std)


def test_crop_padding_is_black_before_normalisation():
    """torchvision's order: pad the raw image with black, then normalise (a padding of 0 after
    normalisation would be the mean colour)."""
    white = torch.full((64, 3, 32, 32), 255, dtype=torch.uint8)
    cropped = random_crop_flip(white, torch.Generator().manual_seed(0))
    assert cropped.dtype == torch.uint8 and (cropped == 0).any()  # some crops show padding
    inputs = Normalize(1 / 255, MEAN, STD)(cropped)
    black = (-torch.tensor(MEAN) / torch.tensor(STD))[None, :, None, None].expand_as(inputs)
    assert torch.allclose(inputs[cropped == 0], black[cropped == 0])


def test_cifar10_missing_files_say_what_to_do(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="download: true"):
        registry.get("datasets", "cifar10")(root=str(tmp_path))


def test_crop_flip_is_seeded_and_moves_pixels_within_the_padding():
    x = torch.arange(2 * 3 * 32 * 32, dtype=torch.float32).reshape(2, 3, 32, 32) + 1
    a = random_crop_flip(x, torch.Generator().manual_seed(0))
    b = random_crop_flip(x, torch.Generator().manual_seed(0))
    assert a.shape == x.shape and torch.equal(a, b)
    values = set(x.flatten().tolist()) | {0.0}  # every output pixel is an input pixel or padding
    assert set(a.flatten().tolist()) <= values
    assert not torch.equal(a, x) and PAD == 4


@pytest.mark.parametrize("name", ["none", "onecycle", "cosine", "step", "plateau"])
def test_schedules_build(name):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    sched = registry.get("schedules", name)(opt, epochs=3, steps_per_epoch=4)
    assert (sched is None) == (name == "none")
    if name == "onecycle":
        lrs = []
        for _ in range(12):
            opt.step()
            sched.step()
            lrs.append(opt.param_groups[0]["lr"])
        assert max(lrs) == pytest.approx(0.1, rel=0.05)  # peaks at the configured LR
