"""Transforms of attention probabilities: dropping positions with renormalisation, and rollout.

`drop_and_renormalize` serves both "without the sink" (drop key_pos 0) and "hide special
tokens" (drop the special / template positions from both axes). `attention_rollout` follows
Abnar & Zuidema (2020): per layer A = (1 - r) * mean_head(P) + r * I, rows renormalised, and
the rollout is the product A_last @ ... @ A_first (dense: O(N^2), the oracle).

`token_rollout` gives one token's row of it, and where that token's sources sit at every layer,
at O(N·d) extra memory: it needs only u = A_l^T r per layer, and P_h^T r is itself an attention
with the keys as queries (see `_transposed`), whose log-sum-exp is log (P_h^T r)_j.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import overload

import numpy as np
import torch

from ..errors import AttnvizError
from ..exact.lse import (
    NEG,
    MaskSpec,
    attend,
    captured,
    key_bias,
    layer_lse_path,
    layer_spec,
    lse_without_first,
    worst,
)
from ..layout import Stack, query_group
from ..records import CapturedAttention
from ..result import AttentionResult

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


def _sinkless(probs: torch.Tensor) -> torch.Tensor:
    """Each head's rows without key_pos 0, renormalised, key 0 kept as a zero column (square)."""
    out = torch.zeros_like(probs)
    out[..., 1:] = _renormalize_rows(probs[..., 1:])
    return out


def _head_mean(
    result: AttentionResult, layer: int, stack: Stack, chunk_elements: int, sink_aware: bool = False
) -> torch.Tensor:
    """mean over heads of one layer, (query_pos, key_pos) float32, fetched in row chunks."""
    n_q = len(result.axes(stack)[0])
    n_k = len(result.axes(stack)[1])
    size = max(1, chunk_elements // max(1, result.n_heads * n_k))
    fix = _sinkless if sink_aware else (lambda p: p)
    parts = [
        fix(result.layer_tensor(layer, rows=slice(i, min(i + size, n_q)), stack=stack)).mean(0)
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
    sink_aware: bool = False,
) -> np.ndarray:
    """Attention rollout over all layers of a self-attention stack.

    Returns float32 (query_pos, key_pos) — row i says how much each input token flows into
    position i at the last layer; rows sum to 1 — or with ``per_layer`` (layer, query_pos,
    key_pos), entry l being the rollout up to and including layer l. Computed on the model's
    device one layer at a time: memory O(N^2) plus one row chunk of one layer. For an
    encoder-decoder "decoder" stack only the decoder self-attention is rolled out.
    ``sink_aware`` drops key_pos 0 from every head's rows and renormalises before the mean.
    """
    stack = stack if stack is not None else result.stacks[0]
    if stack == "cross":
        raise AttnvizError("rollout needs self-attention; pick the encoder or decoder stack")
    if not 0.0 <= residual <= 1.0:
        raise AttnvizError("residual must be between 0 and 1")
    rolled: torch.Tensor | None = None
    steps: list[np.ndarray] = []
    for layer in range(result.n_layers(stack)):
        mean = _head_mean(result, layer, stack, chunk_elements, sink_aware)
        rolled = rollout_step(rolled, mean, residual=residual)
        if per_layer:
            steps.append(rolled.float().cpu().numpy())
    if rolled is None:
        raise AttnvizError("this stack has no layers")
    if per_layer:
        return np.stack(steps)
    return rolled.float().cpu().numpy()


# ---------------------------------------------------------------------------------------------
# One token's rollout at O(N·d) memory
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class TokenRollout:
    """Where one token's information comes from, layer by layer.

    ``sources[l]`` (float64, layers × key_pos) = e_t^T A_{last} ⋯ A_l: how much each token at the
    input of layer l flows into ``token`` after the last layer. Row 0 is the token's row of the
    full rollout (`attention_rollout`); every row sums to 1. ``paths[l]`` says how layer l ran:
    "fused", "blocked: <why>" (a fused kernel refused: the exact blocked softmax) or "dense: <why>".
    """

    token: int
    residual: float
    sink_aware: bool
    sources: np.ndarray
    paths: tuple[str, ...]

    @property
    def rollout(self) -> np.ndarray:
        """The token's row of the rollout over every layer: (key_pos,)."""
        return self.sources[0]


def _scaled(r: torch.Tensor, mass: torch.Tensor, residual: float) -> torch.Tensor:
    """r / D: D_i = (1 - residual) · (row sum of mean_h P'_h)_i + residual, the renormalisation."""
    d = (1.0 - residual) * mass + residual
    return torch.where(d > 0, r / torch.where(d > 0, d, 1.0), 0.0)


def _transposed(cap: CapturedAttention, spec: MaskSpec, r: torch.Tensor, residual: float, sink_aware: bool):
    """(mean over heads of P'_h^T r~, r~ = r / D, path) of one layer, fused.

    u_hj = Σ_i r_i p_hij = exp(LSE_i [scale k_j·q_hi + log r_i - L_hi]): an attention with K as
    queries, Q as keys and a per-key bias b_i = log r_i - L_hi (the kernel's additive bias).
    The transposed mask (i >= j, window i < j + W) is the causal one on reversed positions.
    Sink-aware: p' = p / (1 - p_i0) = exp(s_ij - L'_i) for j >= 1 (L' without key 0), so the bias
    uses L' and u_0 = 0.
    """
    q = cap.query[0]  # (h, q, d)
    key = cap.key[0]  # (kv_heads, k, d)
    h, n, d = q.shape
    n_kv = key.shape[0]
    if sink_aware:
        # p'_ij = p_ij / (1 - p_i0) = exp(s_ij - L'_i) for j >= 1, L' the log-sum-exp without key 0
        lse, lse_path = lse_without_first(cap, spec)
        mass = torch.isfinite(lse).float().mean(0)  # a row left with no key has row sum 0
    else:
        lse, lse_path = layer_lse_path(cap, spec)  # (h, q)
        mass = torch.ones(n, device=q.device)
    r_tilde = _scaled(r, mass, residual)
    bias = torch.log(r_tilde)[None, :] - lse  # (h, q)
    bias = torch.nan_to_num(bias, nan=NEG, neginf=NEG, posinf=NEG).clamp(min=NEG)
    flip = spec.causal  # the transposed causal mask is the causal one on reversed positions

    def order(t: torch.Tensor) -> torch.Tensor:
        return t.flip(-2) if flip else t

    queries = torch.empty(n_kv, query_group(h, n_kv), n, d, dtype=torch.float32, device=q.device)
    queries[:] = order(key)[:, None]  # k_j, GQA-expanded in the copy
    keys = torch.mul(order(q).float(), cap.scaling)  # scale q_i
    got = attend(
        queries.view(h, n, d), keys, keys, scale=1.0, spec=spec, key_bias=order(bias[..., None])[..., 0]
    )
    lse_t = got.lse.flip(-1) if flip else got.lse
    kb = key_bias(cap)  # a key-only bias b_hj is constant along the transposed row j: a factor
    u = torch.exp(lse_t if kb is None else lse_t + kb)  # (h, key_pos)
    if sink_aware:
        u[:, 0] = 0.0
    return u.mean(0), r_tilde, worst(lse_path, got.path)


def _dense_transposed(
    result: AttentionResult, layer: int, stack: Stack, r: torch.Tensor, residual: float, sink_aware: bool
):
    """Same as `_transposed` from `layer_tensor` rows (exact for any attention; memory one chunk)."""
    n = r.shape[0]
    size = max(1, CHUNK_ELEMENTS // max(1, result.n_heads * n))
    r = r.to(result.layer_tensor(layer, rows=slice(0, 1), stack=stack).device)  # this layer's device
    u = torch.zeros(n, dtype=torch.float32, device=r.device)
    r_tilde = torch.zeros_like(u)
    for a in range(0, n, size):
        rows = slice(a, min(a + size, n))
        p = result.layer_tensor(layer, rows=rows, stack=stack).to(r.device)
        mean = (_sinkless(p) if sink_aware else p).mean(0)  # (rows, key_pos)
        r_tilde[rows] = _scaled(r[rows], mean.sum(-1), residual)
        u += mean.T @ r_tilde[rows]
    return u, r_tilde


def token_rollout(
    result: AttentionResult,
    token: int = -1,
    *,
    stack: Stack | None = None,
    residual: float = 0.5,
    sink_aware: bool = False,
    computation: str = "auto",
) -> TokenRollout:
    """Rollout of one token (default: the last) through every layer, at O(N·d) extra memory.

    Per layer (last to first) u = A_l^T r with A_l = D^-1 ((1 - residual) mean_h P'_h + residual I)
    (D the row sums; P' = P, or P without key 0 renormalised when ``sink_aware``), starting from
    r = e_token. Fused (`_transposed`) where the layer's scores are standard, exact row chunks of
    `layer_tensor` otherwise or with ``computation="dense"`` (the oracle's arithmetic).
    """
    stack = stack if stack is not None else result.stacks[0]
    if stack == "cross":
        raise AttnvizError("rollout needs self-attention; pick the encoder or decoder stack")
    if not 0.0 <= residual <= 1.0:
        raise AttnvizError("residual must be between 0 and 1")
    n = len(result.axes(stack)[0])
    if not -n <= token < n:
        raise AttnvizError(f"token {token} is out of range: this text has positions 0..{n - 1}")
    token = token % n
    n_layers = result.n_layers(stack)
    r = torch.zeros(n, dtype=torch.float32)
    r[token] = 1.0
    sources = np.zeros((n_layers, n))
    paths: list[str] = [""] * n_layers
    for layer in reversed(range(n_layers)):
        cap = captured(result, stack, layer)
        spec, why = layer_spec(cap, result.layout, layer, stack)
        if computation != "dense" and spec is not None and cap is not None:
            r = r.to(cap.query.device)  # layers may sit on different GPUs (device_map="auto")
            u, r_tilde, paths[layer] = _transposed(cap, spec, r, residual, sink_aware)
        else:
            u, r_tilde = _dense_transposed(result, layer, stack, r, residual, sink_aware)
            paths[layer] = f"dense: {why if computation != 'dense' else 'asked'}"
        r = (1.0 - residual) * u + residual * r_tilde
        sources[layer] = r.double().cpu().numpy()
    return TokenRollout(
        token=token, residual=residual, sink_aware=sink_aware, sources=sources, paths=tuple(paths)
    )
