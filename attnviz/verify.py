"""The self-check: one layer recomputed by transformers' own eager attention on the same input.

For the fast path the captured query, key and value of one layer go through the model's own
``eager_attention_forward`` (the function transformers runs when the model is loaded with
``attn_implementation="eager"``: soft-capping, sinks, position bias included), with the mask in
eager's additive form. Its probabilities must equal ours: both softmax the same scores; the only
difference allowed is eager casting its fp32 softmax back to the model dtype (a bf16 rounding).
One layer of every stack is checked: an encoder-decoder's decoder and cross attention run on other
inputs than its encoder, and an error there would not show in the encoder.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from .errors import AttnvizError
from .exact.eager import comparable, eager_probabilities
from .layout import Stack
from .records import Check
from .result import AttentionResult

log = logging.getLogger(__name__)

VerifyArg = bool | str | int


def tolerance(dtype: torch.dtype) -> float:
    """Allowed max |Δ| of probabilities: 1e-5 in fp32; eager rounds its output to the model dtype
    (half an ulp at 1.0 is eps/2 in bf16/fp16), so eps there."""
    return 1e-5 if dtype == torch.float32 else float(torch.finfo(dtype).eps)


def pick_layers(result: AttentionResult, verify: VerifyArg) -> dict[Stack, int]:
    """Which layer of each stack ``verify`` asks for: an int is that layer in every stack; True /
    "auto" each stack's middle one; False none. An encoder-decoder's encoder, decoder and cross
    stacks are each checked: they run on different inputs (the decoder on its start token)."""
    if verify is False or verify is None:
        return {}
    if isinstance(verify, bool) or verify in ("auto", "true", "yes", "on"):
        return {stack: result.n_layers(stack) // 2 for stack in result.stacks}
    try:
        layer = int(verify)
    except (TypeError, ValueError):
        raise AttnvizError(f"verify={verify!r}: use True, 'auto' or a layer index") from None
    for stack in result.stacks:
        n = result.n_layers(stack)
        if not 0 <= layer < n:
            where = "this model has" if len(result.stacks) == 1 else f"the {stack} stack has"
            raise AttnvizError(f"verify layer {layer} is out of range: {where} layers 0..{n - 1}")
    return dict.fromkeys(result.stacks, layer)


def self_check(model: Any, result: AttentionResult, layers: Mapping[Stack, int]) -> tuple[Check, ...]:
    """Recompute one layer of each stack in ``layers`` with eager from what the forward captured
    (a result without captures holds eager's own probabilities) and compare; raises naming the
    stack and layer on a mismatch."""
    return tuple(_check_one(model, result, stack, layer) for stack, layer in layers.items())


def _check_one(model: Any, result: AttentionResult, stack: Stack, layer: int) -> Check:
    ours = result.layer_tensor(layer, stack=stack)
    dtype = next(model.parameters()).dtype
    cap = result.captured(layer, stack)
    if cap is None:
        # The probabilities already are eager's own (the module re-run on this layer's input).
        return Check(stack, layer, 0.0, str(dtype).removeprefix("torch."), tolerance(dtype), "eager itself")
    theirs = eager_probabilities(model, cap).to(ours.device)
    ours = comparable(ours, theirs, cap)
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
