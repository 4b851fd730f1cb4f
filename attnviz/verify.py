"""The self-check: one layer recomputed by transformers' own eager attention on the same input.

For the fast path the captured query, key and value of one layer go through the model's own
``eager_attention_forward`` (the function transformers runs when the model is loaded with
``attn_implementation="eager"``: soft-capping, sinks, position bias included), with the mask in
eager's additive form. Its probabilities must equal ours: both softmax the same scores; the only
difference allowed is eager casting its fp32 softmax back to the model dtype (a bf16 rounding).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import torch

from .capture import CapturedAttention
from .errors import AttnvizError
from .masks import additive
from .result import AttentionResult, Check

log = logging.getLogger(__name__)

VerifyArg = bool | str | int


class CannotCheck(AttnvizError):
    """The model has no eager attention function to compare with (custom code)."""


def tolerance(dtype: torch.dtype) -> float:
    """Allowed max |Δ| of probabilities: 1e-5 in fp32; eager rounds its output to the model dtype
    (half an ulp at 1.0 is eps/2 in bf16/fp16), so eps there."""
    return 1e-5 if dtype == torch.float32 else float(torch.finfo(dtype).eps)


def pick_layer(result: AttentionResult, verify: VerifyArg) -> int | None:
    """Which layer ``verify`` asks for: an int is that layer; True / "auto" the middle one."""
    if verify is False or verify is None:
        return None
    n = result.n_layers()
    if isinstance(verify, bool) or verify in ("auto", "true", "yes", "on"):
        return n // 2
    try:
        layer = int(verify)
    except (TypeError, ValueError):
        raise AttnvizError(f"verify={verify!r}: use True, 'auto' or a layer index") from None
    if not 0 <= layer < n:
        raise AttnvizError(f"verify layer {layer} is out of range: this model has layers 0..{n - 1}")
    return layer


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
    from .adapters import eager_function as adapted

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


def self_check(model: Any, result: AttentionResult, layer: int) -> Check:
    """Recompute ``layer`` (first stack) with eager and compare; raises on a mismatch."""
    stack = result.stacks[0]
    ours = result.layer_tensor(layer, stack=stack)
    dtype = next(model.parameters()).dtype
    if not result._captured:
        # The probabilities already are eager's own (the module re-run on this layer's input).
        return Check(stack, layer, 0.0, str(dtype).removeprefix("torch."), tolerance(dtype), "eager itself")
    cap = result._captured[stack][layer]
    theirs = eager_probabilities(model, cap).to(ours.device)
    if cap.sinks is not None and bool(((theirs.sum(-1) - 1).abs() < 1e-3).all()):
        # Granite-SWA scales the output by sigmoid(lse - sink) after a plain softmax, so its eager
        # weights sum to 1: the same as ours once the sink's share is taken back out.
        ours = ours / ours.sum(-1, keepdim=True)
    diff = float((ours - theirs).abs().max()) if ours.numel() else 0.0
    check = Check(stack, layer, diff, str(cap.query.dtype).removeprefix("torch."), tolerance(cap.query.dtype))
    log.info("self-check %s: %s", result.model_name, check.caption())
    if not diff <= check.tolerance:
        raise AttnvizError(
            f"self-check failed: {result.layout.layer_label(layer)} ({stack}) differs from transformers' "
            f"eager attention by {diff:.2e} (tolerance {check.tolerance:.0e}, {check.dtype}); these "
            "numbers are not the model's own, please report this model"
        )
    return check
