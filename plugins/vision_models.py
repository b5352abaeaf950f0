"""Image classifiers from the model zoos, by name: ``torchvision_model`` (any architecture of
``torchvision.models``) and ``timm`` (any of timm's, with the optional extra ``sweeper[timm]``).

Both build the architecture untrained (a sweep trains it from scratch on the data set: no
weights are downloaded), with ``num_classes`` outputs and the data's channels: torchvision's
first 3-channel convolution is rebuilt for the data's channels (a grayscale data set trains
without copying its one channel three times); timm takes ``in_chans`` itself.
"""

from __future__ import annotations

import difflib
from typing import Annotated

from pydantic import Field
from torch import nn

from sweeper.plugin import FUSABLE_ATTR, Uniform

# timm's distribution, as an extra of sweeper's (pyproject.toml: optional-dependencies.timm)
TIMM_HINT = "pip install 'sweeper[timm]'"


def _suggest(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def adapt_input_channels(model: nn.Module, channels: int) -> nn.Module:
    """``model`` with its first 3-channel Conv2d rebuilt for ``channels`` input channels (same
    output channels, kernel, stride, padding, groups and bias; fresh weights, as the rest)."""
    for parent in model.modules():
        for child_name, child in parent.named_children():
            if isinstance(child, nn.Conv2d) and child.in_channels == 3 and child.groups == 1:
                replacement = nn.Conv2d(
                    channels,
                    child.out_channels,
                    child.kernel_size,
                    stride=child.stride,
                    padding=child.padding,
                    dilation=child.dilation,
                    bias=child.bias is not None,
                    padding_mode=child.padding_mode,
                )
                setattr(parent, child_name, replacement)
                return model
    raise ValueError(f"found no 3-channel Conv2d to rebuild for {channels} input channels")


def torchvision_model(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    arch: str = "resnet18",
    dropout: Annotated[float | None, Field(ge=0.0, le=1.0), Uniform(0.0, 0.5)] = None,
) -> nn.Module:
    """torchvision's classification architecture ``arch`` (``resnet18``, ``mobilenet_v3_small``,
    ``efficientnet_b0``, ``convnext_tiny``, ``vit_b_16``, ...; ``torchvision.models.list_models``),
    untrained, for inputs (C, H, W). ``dropout``: the architecture's own dropout argument (the
    classifier's, for those that have one); unset: torchvision's default. Vision transformers are
    built for the data's image size. Architectures with a minimum input size (inception_v3: 75
    pixels) refuse smaller images in the dry build."""
    from torchvision import models

    names = models.list_models(module=models)
    if arch not in names:
        raise ValueError(f"model.args.arch: torchvision has no classification model '{arch}'{_suggest(arch, names)}")
    if len(input_shape) != 3:
        raise ValueError(f"torchvision_model takes images (C, H, W); the data set gives samples of shape {input_shape}")
    config: dict[str, object] = {"weights": None, "num_classes": num_classes}
    if dropout is not None:
        config["dropout"] = dropout
    if arch.startswith("vit_"):
        config["image_size"] = input_shape[-1]
    model = models.get_model(arch, **config)
    return adapt_input_channels(model, input_shape[0]) if input_shape[0] != 3 else model


def timm_model(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    arch: str = "resnet18",
    drop_rate: Annotated[float, Field(ge=0.0, le=1.0), Uniform(0.0, 0.5)] = 0.0,
) -> nn.Module:
    """timm's architecture ``arch`` (``timm.list_models()``), untrained, with ``num_classes``
    outputs and the data's input channels; ``drop_rate``: dropout before the classifier. Needs
    timm: ``pip install 'sweeper[timm]'``."""
    try:
        import timm
    except ImportError:
        raise ModuleNotFoundError(
            f"model plugin 'timm' needs the timm package, which is not installed: {TIMM_HINT}"
        ) from None
    if arch not in timm.list_models():
        raise ValueError(f"model.args.arch: timm has no model '{arch}'{_suggest(arch, timm.list_models())}")
    if len(input_shape) != 3:
        raise ValueError(f"timm models take images (C, H, W); the data set gives samples of shape {input_shape}")
    return timm.create_model(
        arch, pretrained=False, num_classes=num_classes, in_chans=input_shape[0], drop_rate=drop_rate
    )


# Arbitrary architectures (in-place activations, stochastic depth, batch statistics) are not
# checked under vmap: their trials train one at a time, never fused (search.fuse).
setattr(torchvision_model, FUSABLE_ATTR, False)
setattr(timm_model, FUSABLE_ATTR, False)
