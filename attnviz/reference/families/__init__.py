"""Architecture families the walkthrough reads: where a layer's attention modules sit and how
its weights are laid out. One module per family (`rotary`, `gpt2`, `bert`); `common` holds what
they return."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...errors import AttnvizError
from ...loading import LoadedModel
from . import bert, gpt2, rotary
from .common import LayerModules, LayerWeights

FAMILIES: dict[str, ModuleType] = {mt: fam for fam in (rotary, gpt2, bert) for mt in fam.MODEL_TYPES}
SUPPORTED: tuple[str, ...] = tuple(FAMILIES)


def family(model_type: str) -> ModuleType:
    """The family module of ``model_type``, or the error that names the supported architectures."""
    try:
        return FAMILIES[model_type]
    except KeyError:
        raise AttnvizError(
            f"the step-by-step walkthrough does not know the {model_type!r} architecture; it supports "
            f"{', '.join(SUPPORTED)} (e.g. the built-in models smollm2-135m and minilm-l6)"
        ) from None


def layer_modules(lm: LoadedModel, layer: int) -> LayerModules:
    """The attention module of layer ``layer`` and its output projection."""
    base: Any = lm.model.base_model
    return family(lm.layout.model_type).modules(base, layer)


def layer_weights(lm: LoadedModel, layer: int) -> LayerWeights:
    """The weights and settings of attention layer ``layer`` (call while holding ``lm.lock``)."""
    mods = layer_modules(lm, layer)
    return family(lm.layout.model_type).weights(mods.attn, mods, layer, lm.model.config)


__all__ = [
    "FAMILIES",
    "SUPPORTED",
    "LayerModules",
    "LayerWeights",
    "family",
    "layer_modules",
    "layer_weights",
]
