"""A fast exact path for attention modules that do not go through transformers' AttentionInterface.

GPT-J, CodeGen, GPT-Neo, Falcon, BLOOM, MPT, XGLM, MPNet and a few BERT / GPT copies compute
their attention inside the module (rotary applied there, ALiBi as an additive per-head bias,
multi-query keys) and can only be loaded in eager. An adapter (attnviz/adapters/families.py)
replaces one module's attention step, only while a `capture.Recorder` is active: it computes the
query, key and value exactly as the module does, records them (with the mask, the scale and the
ALiBi bias as ``position_bias``) and computes the layer's output with SDPA, never an (heads, N, N)
softmax. Without a recorder (the probe's eager forward, the eager path, the layer-at-a-time path,
generation) the module runs its own code unchanged.

The load probe (attnviz/probe.py) compares every adapted layer with the model's own eager
attention on a short input; a mismatch sends the model to the exact layer-at-a-time path.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ...exact.masks import additive, is_causal
from ...layout import query_group, repeat_kv
from .. import hook as capture

log = logging.getLogger(__name__)

QUERY_ROWS = 1024  # query rows per SDPA call where a bias must be spelled out as a float mask
_EAGER_ATTR = "_attnviz_eager"  # a module's eager formula for the self-check (attnviz/verify.py)


def recorder(module: torch.nn.Module) -> capture.Recorder | None:
    """The active recorder when this call should take the fast path (None: run the module's own code)."""
    rec = capture.active_recorder()
    return None if rec is None or module.training else rec


def record(
    rec: capture.Recorder,
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    position_bias: torch.Tensor | None = None,
) -> None:
    """Record one call: query (1, heads, q_pos, d_head), key/value (1, kv_heads, key_pos, d_head),
    mask bool (True = attend) or additive, ALiBi as an additive (1, heads, 1, key_pos) bias.
    The mask holds all the masking (no implicit causal mask: eager applies none either). With a
    bias, half-precision query and key are kept in float32 (exact: an upcast): the scores are then
    recomputed in float32, not rounded at the bias's magnitude."""
    if position_bias is not None:
        query, key = query.float(), key.float()
    rec.record(
        module=module,
        query=query,
        key=key,
        value=value,
        mask=mask,
        scaling=scaling,
        is_causal=False,
        softcap=None,
        position_bias=position_bias,
    )


def attention_output(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    position_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(scaling · QKᵀ + bias + mask) V by SDPA: (1, heads, q_pos, d_head) in value's dtype.

    Key/value heads are repeated for grouped / multi-query heads. Without a bias a causal mask
    runs SDPA's causal kernel; with a bias, query rows go in blocks of `QUERY_ROWS`, each with
    its (heads, rows, key_pos) float mask: memory stays bounded at any length.
    """
    # With a bias (ALiBi grows with the key position) a half-precision score would be rounded at
    # the bias's magnitude: the blocks run in float32 and only the output is cast back.
    dtype = value.dtype if position_bias is None else torch.promote_types(value.dtype, torch.float32)
    q, k, v = query.to(dtype), key.to(dtype), value.to(dtype)
    groups = query_group(q.shape[1], k.shape[1])
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)  # (1, kv_heads, N, d) -> (1, heads, N, d)
    if position_bias is None:
        if mask is not None and is_causal(mask):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling)
        attn_mask = None if mask is None else (mask if mask.dtype == torch.bool else mask.to(dtype))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scaling)
    out = []
    for start in range(0, q.shape[2], QUERY_ROWS):
        rows = slice(start, start + QUERY_ROWS)
        bias = position_bias[..., rows, :] if position_bias.shape[-2] > 1 else position_bias
        block = bias.to(dtype)
        if mask is not None:
            m = mask[..., rows, :] if mask.shape[-2] > 1 else mask
            block = block + additive(m, dtype)
        block = block.expand(1, q.shape[1], min(QUERY_ROWS, q.shape[2] - start), k.shape[2])
        out.append(F.scaled_dot_product_attention(q[:, :, rows], k, v, attn_mask=block, scale=scaling))
    return torch.cat(out, dim=2).to(value.dtype)


def _patch(module: torch.nn.Module, method: str, fn: Callable, eager: Callable) -> None:
    setattr(module, method, types.MethodType(fn, module))
    setattr(module, _EAGER_ATTR, eager)


def install(model: Any) -> int:
    """Put an adapter on every attention module of a family that has one; the number adapted."""
    from .families import ADAPTERS

    n = 0
    for _name, module in model.named_modules():
        parts = type(module).__module__.split(".")
        if parts[:2] != ["transformers", "models"] or len(parts) < 3:
            continue
        found = ADAPTERS.get(f"{parts[2]}.{type(module).__name__}")
        if found is None:
            continue
        _patch(module, found.method, found.fn, found.eager)
        n += 1
    if n:
        log.info("%s: fast exact adapters on %d attention modules", type(model).__name__, n)
    return n


# Eager-only families left on the exact layer-at-a-time path, and why (docs/architectures.md).
NOT_ADAPTED: dict[str, str] = {
    "deberta": "disentangled attention: its content-to-position and position-to-content terms are a "
    "(heads, N, N) bias made per layer from that layer's hidden states; keeping it costs what eager does",
    "deberta-v2": "disentangled attention: its content-to-position and position-to-content terms are a "
    "(heads, N, N) bias made per layer from that layer's hidden states; keeping it costs what eager does",
    "big_bird": "block-sparse attention (window, global and random blocks) in its long-input setting is "
    "not one softmax over a mask that SDPA reproduces",
    "convbert": "mixed attention: span-based dynamic convolution heads beside its softmax heads",
    "ibert": "its attention runs through I-BERT's quantisation modules (QuantLinear, IntSoftmax: "
    "integer-only with quant_mode on), which SDPA does not reproduce",
    "luke": "entity-aware attention: a separate query projection per word / entity pair",
    "nystromformer": "its softmax over keys goes through Nystrom landmarks, not one SDPA call",
}


def why_not(model_type: str) -> str | None:
    """Why an eager-only family has no fast adapter, where attnviz knows a specific reason."""
    return NOT_ADAPTED.get(model_type)


def eager_function(module: Any) -> Callable | None:
    """An adapted module's eager formula, with ``eager_attention_forward``'s signature."""
    return getattr(module, _EAGER_ATTR, None)
