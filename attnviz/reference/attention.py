"""One layer's attention probabilities, the textbook way: read this first.

Every number attnviz shows for a head is one entry of the matrix this file computes, and every
fast path in `attnviz.exact` (and the tiles of `attnviz.analysis.pooling`) is an optimised way
to get the same entries. Their docstrings name this module as the identity they must equal, and
tests/engine/test_reference_attention.py holds them to it on tiny models (GQA, sliding window,
soft-capping, padding). Nothing here is fast: it builds the whole (batch, heads, T, S) tensor.
Read `attnviz.exact.sources` next: where a result gets one layer's probabilities, and which
optimised path each form takes.

    p = attention_probabilities(q, k, scaling=hs ** -0.5)                 # causal decoder
    p = attention_probabilities(q, k, scaling=s, padding=pad, causal=False)  # padded encoder

Dimension names: the one vocabulary of the package, in shape comments, docstrings and figure
labels (`attnviz.records`, `attnviz.result` and the mixers use it; an axis over many is plural):
    layer      an attention layer of a stack (axis: layers)
    head       a query head (axis: heads; nh here)
    kv_head    a key/value head (axis: kv_heads; nkv here); with GQA kv_heads < heads, and each
               serves a group of heads / kv_heads consecutive query heads (axis: group)
    query_pos  a query position (T of them here)
    key_pos    a key position (S of them here; S == T without a KV cache)
    d_head     the head size (hs here)
    d_model    the residual stream's width
This file's formulas keep transformers' short forms: B (batch), nh, nkv, T, S, hs.

The steps, in transformers' eager order (`eager_attention_forward` in modeling_llama.py):
1. GQA: each KV head serves nh / nkv consecutive query heads (`attnviz.layout.repeat_kv`,
   transformers' `repeat_kv` order).
2. scores = Q Kᵀ · scaling, in float32.
3. soft-cap (Gemma 2): scores = cap · tanh(scores / cap).
4. + an additive bias (ALiBi, T5's relative positions), if the model has one.
5. mask: causal (key j ≤ query i, queries being the last T of S positions), a sliding window
   (i − j < window), padding (keys that are padding), or any boolean mask (True = may attend).
6. softmax over the keys in float32; a masked key gets exactly 0. A row with no key left (a
   padding query) is all 0 here; eager gives it a uniform row over the dtype's minimum instead,
   which no model reads.
"""

from __future__ import annotations

import torch

from ..layout import query_group, repeat_kv  # GQA's one rule: KV head g serves heads g·G .. (g+1)·G − 1


def allowed_keys(
    t: int,
    s: int,
    *,
    causal: bool = True,
    sliding_window: int | None = None,
    padding: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """bool (B | 1, 1 | nh, T, S): True where query i may attend to key j."""
    i = torch.arange(s - t, s)[:, None]  # (T, 1) absolute positions of the queries
    j = torch.arange(s)[None, :]  # (1, S)
    ok = torch.ones(t, s, dtype=torch.bool)[None, None]  # (1, 1, T, S)
    if causal:
        ok = ok & (j <= i)
    if sliding_window is not None:
        ok = ok & (i - j < sliding_window)
    if padding is not None:  # (B, S) True = a real token
        ok = ok & padding.bool()[:, None, None, :]  # (B, 1, 1, S)
    if mask is not None:  # bool, broadcastable to (B, nh, T, S)
        ok = ok & mask.bool()
    return ok


def attention_probabilities(
    query: torch.Tensor,
    key: torch.Tensor,
    *,
    scaling: float,
    causal: bool = True,
    sliding_window: int | None = None,
    padding: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    softcap: float | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(Q Kᵀ · scaling (+ soft-cap, + bias, masked)) per head: float32 (B, nh, T, S).

    query (B, nh, T, hs) after its rotary embedding; key (B, nkv, S, hs) before GQA repetition;
    ``bias`` additive, broadcastable to (B, nh, T, S); ``mask`` bool, True = may attend.
    """
    nh, t, s = query.shape[1], query.shape[2], key.shape[2]  # (B, nh, T, hs), (B, nkv, S, hs)
    k = repeat_kv(key, query_group(nh, key.shape[1]))  # (B, nkv, S, hs) -> (B, nh, S, hs)
    scores = query.float() @ k.float().transpose(-1, -2) * scaling  # (B, nh, T, S)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias.float()
    ok = allowed_keys(t, s, causal=causal, sliding_window=sliding_window, padding=padding, mask=mask)
    scores = scores.masked_fill(~ok.to(scores.device), float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # (B, nh, T, S); a row of only -inf gives NaN
    return probs.nan_to_num(0.0)


def head_outputs(probs: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """z = P V per head: (B, nh, T, S) × (B, nkv, S, hs) -> float32 (B, nh, T, hs), the input of
    the output projection (its columns h·hs .. (h + 1)·hs are head h's)."""
    return probs @ repeat_kv(value, query_group(probs.shape[1], value.shape[1])).float()
