"""Transforms of attention probabilities: dropping positions with renormalisation, and rollout.

`drop_and_renormalize` serves both "without the sink" (drop key_pos 0) and "hide special
tokens" (drop the special / template positions from both axes). `attention_rollout` follows
Abnar & Zuidema (2020): per layer A = (1 - r) * mean_head(P) + r * I, rows renormalised, and
the rollout is the product A_last @ ... @ A_first.
"""

from __future__ import annotations

import logging
from typing import overload

import numpy as np
import torch

from .errors import AttnvizError
from .layout import Stack
from .result import AttentionResult

log = logging.getLogger(__name__)

CHUNK_ELEMENTS = 1 << 25  # elements of one (head, query rows, key_pos) fetch


def _renormalize_rows(probs: torch.Tensor) -> torch.Tensor:
    """Rows divided by their sum; a row whose sum is 0 stays all zeros (never NaN)."""
    total = probs.sum(-1, keepdim=True)
    return torch.where(total > 0, probs / torch.where(total > 0, total, 1.0), 0.0)


def _keep_index(mask, n: int, axis: str, device: torch.device) -> torch.Tensor:
    drop = np.asarray(mask.cpu() if isinstance(mask, torch.Tensor) else mask, dtype=bool).reshape(-1)
    if drop.shape[0] != n:
        raise AttnvizError(f"the {axis} mask has {drop.shape[0]} entries; the probabilities have {n}")
    return torch.as_tensor(np.flatnonzero(~drop), device=device)


@overload
def drop_and_renormalize(probs: np.ndarray, drop_keys, drop_queries=None) -> np.ndarray: ...
@overload
def drop_and_renormalize(probs: torch.Tensor, drop_keys, drop_queries=None) -> torch.Tensor: ...
def drop_and_renormalize(probs, drop_keys, drop_queries=None):
    """Remove key columns (and optionally query rows) and renormalise every row to sum 1.

    probs (..., query_pos, key_pos), numpy or torch (the result has the same type, dtype
    float32 or the input's float dtype, and device). ``drop_keys`` bool (key_pos,): True = drop;
    ``drop_queries`` bool (query_pos,) or None to keep every row. For "hide special tokens" in
    self-attention pass the same mask (``tokens.hidden``) for both. A row that put all its
    attention on dropped keys (e.g. causal row 0 without the sink) has nothing left to show and
    becomes all zeros, never NaN. Kept positions stay in order: ``np.flatnonzero(~drop)``.
    """
    is_numpy = not isinstance(probs, torch.Tensor)
    p = torch.as_tensor(np.asarray(probs)) if is_numpy else probs
    if not p.is_floating_point():
        p = p.float()
    keys = _keep_index(drop_keys, p.shape[-1], "key_pos", p.device)
    p = p.index_select(-1, keys)
    if drop_queries is not None:
        p = p.index_select(-2, _keep_index(drop_queries, p.shape[-2], "query_pos", p.device))
    out = _renormalize_rows(p)
    return out.cpu().numpy() if is_numpy else out


def without_sink(probs, *, drop_query: bool = False):
    """`drop_and_renormalize` without key_pos 0 (the first token / attention sink).

    Rows keep their positions unless ``drop_query``; causal row 0 then becomes all zeros.
    """
    n_q, n_k = probs.shape[-2:]
    keys = np.zeros(n_k, dtype=bool)
    keys[0] = True
    rows = None
    if drop_query:
        rows = np.zeros(n_q, dtype=bool)
        rows[0] = True
    return drop_and_renormalize(probs, keys, rows)


def rollout_step(rolled: torch.Tensor | None, probs: torch.Tensor, *, residual: float = 0.5) -> torch.Tensor:
    """One layer of rollout: A = (1 - residual) * mean_head(probs) + residual * I, rows
    renormalised, then A @ rolled. probs (head, query_pos, key_pos) or a head mean (q, k)."""
    mean = probs.mean(0) if probs.dim() == 3 else probs  # (query_pos, key_pos)
    n = mean.shape[-1]
    if mean.shape[0] != n:
        raise AttnvizError("rollout needs square self-attention (query_pos == key_pos)")
    eye = torch.eye(n, device=mean.device, dtype=mean.dtype)
    step = _renormalize_rows((1.0 - residual) * mean + residual * eye)
    if rolled is None:
        return step
    return step @ rolled.to(step.device)


def _head_mean(result: AttentionResult, layer: int, stack: Stack, chunk_elements: int) -> torch.Tensor:
    """mean over heads of one layer, (query_pos, key_pos) float32, fetched in row chunks."""
    n_q = len(result.axes(stack)[0])
    n_k = len(result.axes(stack)[1])
    size = max(1, chunk_elements // max(1, result.n_heads * n_k))
    parts = [
        result.layer_tensor(layer, rows=slice(i, min(i + size, n_q)), stack=stack).mean(0)
        for i in range(0, n_q, size)
    ]
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def attention_rollout(
    result: AttentionResult,
    *,
    stack: Stack | None = None,
    per_layer: bool = False,
    residual: float = 0.5,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> np.ndarray:
    """Attention rollout over all layers of a self-attention stack.

    Returns float32 (query_pos, key_pos) — row i says how much each input token flows into
    position i at the last layer; rows sum to 1 — or with ``per_layer`` (layer, query_pos,
    key_pos), entry l being the rollout up to and including layer l. Computed on the model's
    device one layer at a time: memory O(N^2) plus one row chunk of one layer. For an
    encoder-decoder "decoder" stack only the decoder self-attention is rolled out.
    """
    stack = stack if stack is not None else result.stacks[0]
    if stack == "cross":
        raise AttnvizError("rollout needs self-attention; pick the encoder or decoder stack")
    if not 0.0 <= residual <= 1.0:
        raise AttnvizError("residual must be between 0 and 1")
    rolled: torch.Tensor | None = None
    steps: list[np.ndarray] = []
    for layer in range(result.n_layers(stack)):
        rolled = rollout_step(rolled, _head_mean(result, layer, stack, chunk_elements), residual=residual)
        if per_layer:
            steps.append(rolled.float().cpu().numpy())
    if rolled is None:
        raise AttnvizError("this stack has no layers")
    if per_layer:
        return np.stack(steps)
    return rolled.float().cpu().numpy()
