"""The oracle: a captured call's probabilities from the model's own eager attention function.

Where the model has one, this is the model's own statement of the readable reference
`attnviz.reference.attention.attention_probabilities` (which
tests/engine/test_reference_attention.py holds equal to transformers' eager attention and to
this); it is what the self-check compares the fast path with.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from ..errors import AttnvizError
from ..records import CapturedAttention
from .masks import additive


class CannotCheck(AttnvizError):
    """The model has no eager attention function to compare with (custom code)."""


def _additive(cap: CapturedAttention, dtype: torch.dtype) -> torch.Tensor | None:
    """The captured mask as eager expects it: 0 where attended, the dtype's min elsewhere."""
    mask = cap.mask
    if mask is None:
        if not cap.is_causal or cap.query.shape[2] == 1:
            return None
        q, k = cap.query.shape[2], cap.key.shape[2]
        mask = torch.ones(q, k, dtype=torch.bool, device=cap.query.device).tril(k - q)[None, None]
    return additive(mask, dtype)


def eager_function(module: Any):
    """The eager attention function of the module's modeling file (None for custom code); an
    adapted module (attnviz/adapters) names its own."""
    from ..capture.adapters import eager_function as adapted

    own = adapted(module)
    if own is not None:
        return own
    return getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)


def eager_probabilities(model: Any, cap: CapturedAttention) -> torch.Tensor:
    """(heads, q_pos, key_pos) float32 from the model's own eager attention function."""
    module = model.get_submodule(cap.module_name)
    eager = eager_function(module)
    if eager is None or cap.value is None:
        raise CannotCheck(
            f"cannot self-check {type(module).__name__}: its module has no eager attention function"
        )
    kwargs: dict = {}
    if cap.softcap is not None:
        kwargs["softcap"] = cap.softcap
    if cap.position_bias is not None:
        kwargs["position_bias"] = cap.position_bias
    if cap.sinks is not None:
        kwargs["s_aux"] = cap.sinks.to(cap.query.dtype)
    with torch.inference_mode():
        _, weights = eager(
            module,
            cap.query,
            cap.key,
            cap.value,
            _additive(cap, cap.query.dtype),
            scaling=cap.scaling,
            dropout=0.0,
            **kwargs,
        )
    return weights[0].float()


def comparable(ours: torch.Tensor, theirs: torch.Tensor, cap: CapturedAttention) -> torch.Tensor:
    """Our probabilities in the form the eager oracle returns them. With learned sinks our rows
    sum to < 1 (the sink's share left out, as the model's softmax does); Granite-SWA's eager
    weights come from a plain softmax (it scales the output by sigmoid(lse - sink) afterwards)
    and sum to 1: the same as ours once the sink's share is taken back out."""
    if cap.sinks is not None and bool(((theirs.sum(-1) - 1).abs() < 1e-3).all()):
        return ours / ours.sum(-1, keepdim=True)
    return ours
