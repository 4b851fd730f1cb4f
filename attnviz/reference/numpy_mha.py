"""Multi-head self-attention in NumPy: the forward pass and, by hand, the backward pass.

    params = init_params(d_model=16, num_heads=4, rng=np.random.default_rng(0))
    out, cache = mha_forward(x, params, mask=causal_mask(T))   # x (B, T, C) -> out (B, T, C)
    grads = mha_backward(d_out, cache)                          # grads.x, grads.W_q, ...

Weights are stored the way the formulas read, ``Q = x @ W_q + b_q`` with W (C_in, C_out): the
transpose of ``torch.nn.Linear.weight``. Dimension names as in `textbook`: B batch, T positions,
C d_model, nh heads, hs head size. ``mask`` is bool (T, T), True = may attend.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np


@dataclass(frozen=True, eq=False)
class MHAParams:
    """The four projections of one attention layer (biases may be None)."""

    num_heads: int
    W_q: np.ndarray  # (C, C)
    W_k: np.ndarray  # (C, C)
    W_v: np.ndarray  # (C, C)
    W_o: np.ndarray  # (C, C)
    b_q: np.ndarray | None = None  # (C,)
    b_k: np.ndarray | None = None
    b_v: np.ndarray | None = None
    b_o: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class MHAGrads:
    """d loss / d every input of `mha_forward` (None for absent biases)."""

    x: np.ndarray  # (B, T, C)
    W_q: np.ndarray
    W_k: np.ndarray
    W_v: np.ndarray
    W_o: np.ndarray
    b_q: np.ndarray | None
    b_k: np.ndarray | None
    b_v: np.ndarray | None
    b_o: np.ndarray | None


@dataclass(frozen=True, eq=False)
class MHACache:
    """What the backward pass needs from the forward pass."""

    params: MHAParams
    x: np.ndarray  # (B, T, C)
    q: np.ndarray  # (B, nh, T, hs)
    k: np.ndarray  # (B, nh, T, hs)
    v: np.ndarray  # (B, nh, T, hs)
    weights: np.ndarray  # (B, nh, T, T), softmax output
    context: np.ndarray  # (B, T, C), heads concatenated, input of W_o
    scale: float


def init_params(
    d_model: int, num_heads: int, rng: np.random.Generator, *, bias: bool = True, dtype=np.float64
) -> MHAParams:
    """Random weights with std 1/sqrt(C) (outputs keep roughly unit scale)."""
    if d_model % num_heads != 0:
        raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
    std = d_model**-0.5

    def w() -> np.ndarray:
        return (rng.standard_normal((d_model, d_model)) * std).astype(dtype)

    def b() -> np.ndarray | None:
        return (rng.standard_normal(d_model) * 0.1).astype(dtype) if bias else None

    return MHAParams(num_heads, w(), w(), w(), w(), b(), b(), b(), b())


def causal_mask(n: int) -> np.ndarray:
    """(n, n) bool, True on and below the diagonal."""
    return np.tril(np.ones((n, n), dtype=bool))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax; -inf entries get exactly 0."""
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """(B, T, C) -> (B, nh, T, hs)."""
    B, T, C = x.shape
    return x.reshape(B, T, num_heads, C // num_heads).transpose(0, 2, 1, 3)  # (B, nh, T, hs)


def combine_heads(x: np.ndarray) -> np.ndarray:
    """(B, nh, T, hs) -> (B, T, C)."""
    B, nh, T, hs = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, nh * hs)  # (B, T, nh, hs) -> (B, T, C)


def _affine(x: np.ndarray, W: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    y = x @ W  # (B, T, C) @ (C, C) -> (B, T, C)
    return y if b is None else y + b


def mha_forward(
    x: np.ndarray, params: MHAParams, mask: np.ndarray | None = None
) -> tuple[np.ndarray, MHACache]:
    """x (B, T, C) -> (output (B, T, C), cache for `mha_backward`). The attention weights are
    ``cache.weights`` (B, nh, T, T)."""
    p = params
    q = split_heads(_affine(x, p.W_q, p.b_q), p.num_heads)  # (B, nh, T, hs)
    k = split_heads(_affine(x, p.W_k, p.b_k), p.num_heads)  # (B, nh, T, hs)
    v = split_heads(_affine(x, p.W_v, p.b_v), p.num_heads)  # (B, nh, T, hs)
    scale = 1.0 / np.sqrt(q.shape[-1])
    scores = (q @ k.transpose(0, 1, 3, 2)) * scale  # (B, nh, T, hs) @ (B, nh, hs, T) -> (B, nh, T, T)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)  # (B, nh, T, T)
    weights = softmax(scores, axis=-1)  # (B, nh, T, T)
    context = combine_heads(weights @ v)  # (B, nh, T, T) @ (B, nh, T, hs) -> (B, nh, T, hs) -> (B, T, C)
    out = _affine(context, p.W_o, p.b_o)  # (B, T, C)
    return out, MHACache(p, x, q, k, v, weights, context, float(scale))


def mha_backward(d_out: np.ndarray, cache: MHACache) -> MHAGrads:
    """Gradients of a loss L given dL/d output (B, T, C), by the chain rule step by step."""
    p, x = cache.params, cache.x
    x2 = x.reshape(-1, x.shape[-1])  # (B*T, C)

    # out = context @ W_o + b_o
    d_out2 = d_out.reshape(-1, d_out.shape[-1])  # (B*T, C)
    dW_o = cache.context.reshape(-1, cache.context.shape[-1]).T @ d_out2  # (C, B*T) @ (B*T, C) -> (C, C)
    db_o = d_out2.sum(axis=0) if p.b_o is not None else None  # (C,)
    d_context = d_out @ p.W_o.T  # (B, T, C)

    # context = combine_heads(weights @ v)
    d_ctx_heads = split_heads(d_context, p.num_heads)  # (B, nh, T, hs)
    d_weights = d_ctx_heads @ cache.v.transpose(
        0, 1, 3, 2
    )  # (B, nh, T, hs) @ (B, nh, hs, T) -> (B, nh, T, T)
    d_v = (
        cache.weights.transpose(0, 1, 3, 2) @ d_ctx_heads
    )  # (B, nh, T, T) @ (B, nh, T, hs) -> (B, nh, T, hs)

    # weights = softmax(scores): dS = P * (dP - sum_j dP_j P_j); blocked entries have P = 0 -> dS = 0
    P = cache.weights
    d_scores = P * (d_weights - np.sum(d_weights * P, axis=-1, keepdims=True))  # (B, nh, T, T)

    # scores = q @ k^T * scale
    d_q = (d_scores @ cache.k) * cache.scale  # (B, nh, T, T) @ (B, nh, T, hs) -> (B, nh, T, hs)
    d_k = (d_scores.transpose(0, 1, 3, 2) @ cache.q) * cache.scale  # (B, nh, T, hs)

    # q = split_heads(x @ W_q + b_q), and the same for k and v
    grads = {}
    d_x = np.zeros_like(x)
    for name, d_heads in (("q", d_q), ("k", d_k), ("v", d_v)):
        d_proj = combine_heads(d_heads)  # (B, T, C)
        d_proj2 = d_proj.reshape(-1, d_proj.shape[-1])  # (B*T, C)
        W = getattr(p, f"W_{name}")
        grads[f"W_{name}"] = x2.T @ d_proj2  # (C, B*T) @ (B*T, C) -> (C, C)
        grads[f"b_{name}"] = d_proj2.sum(axis=0) if getattr(p, f"b_{name}") is not None else None
        d_x = d_x + d_proj @ W.T  # (B, T, C) @ (C, C) -> (B, T, C); x feeds all three projections
    return MHAGrads(x=d_x, W_o=dW_o, b_o=db_o, **grads)


def param_names(params: MHAParams) -> list[str]:
    """Names of the arrays in ``params`` (weights and the biases that are present)."""
    return [f.name for f in fields(params) if f.name != "num_heads" and getattr(params, f.name) is not None]
