"""Multi-head attention as the textbook writes it, in one file that reads top to bottom.

    mha = MultiHeadAttention(d_model=64, num_heads=4)
    x = torch.randn(1, 10, 64)                     # (B, T, C)
    out, weights = mha(x, mask=causal_mask(10))     # (B, T, C), (B, nh, T, T)

Dimension names used in every shape comment:
    B  batch            T  query positions      S  key positions (== T in self-attention)
    C  d_model          nh num_heads            hs head size = C // nh

Masks are boolean and mean "may attend": ``mask[i, j]`` is True when query i may look at key j
(the convention of ``torch.nn.functional.scaled_dot_product_attention``; note that
``torch.nn.MultiheadAttention`` uses the opposite one, True = blocked).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


def causal_mask(n: int, device: torch.device | str | None = None) -> torch.Tensor:
    """(n, n) bool: True on and below the diagonal, so position i sees positions 0..i only."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()  # (T, T)


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q K^T / sqrt(hs)) V, per head.

    q (B, nh, T, hs), k and v (B, nh, S, hs); ``mask`` bool, broadcastable to (B, nh, T, S),
    True = may attend. Returns (output (B, nh, T, hs), weights (B, nh, T, S)). Blocked scores
    become -inf before the softmax, so blocked weights are exactly 0 and every row sums to 1
    (a row must allow at least one key).
    """
    hs = q.size(-1)
    scores = q @ k.transpose(-2, -1)  # (B, nh, T, hs) @ (B, nh, hs, S) -> (B, nh, T, S)
    scores = scores / math.sqrt(hs)  # (B, nh, T, S), keeps the softmax out of saturation
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # (B, nh, T, S)
    weights = F.softmax(scores, dim=-1)  # (B, nh, T, S), each row sums to 1 over the keys
    out = weights @ v  # (B, nh, T, S) @ (B, nh, S, hs) -> (B, nh, T, hs)
    return out, weights


class MultiHeadAttention(nn.Module):
    """Attention Is All You Need, section 3.2.2: nh heads of size hs = d_model / nh.

    Four projections, each d_model -> d_model: W_q, W_k and W_v make the queries, keys and
    values of all heads at once; W_o mixes the concatenated head outputs back into d_model.
    """

    def __init__(self, d_model: int, num_heads: int, bias: bool = True) -> None:
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.W_q = nn.Linear(d_model, d_model, bias=bias)
        self.W_k = nn.Linear(d_model, d_model, bias=bias)
        self.W_v = nn.Linear(d_model, d_model, bias=bias)
        self.W_o = nn.Linear(d_model, d_model, bias=bias)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, C) -> (B, nh, T, hs): head h owns channels h*hs .. (h+1)*hs - 1."""
        B, T, _ = x.shape
        x = x.view(B, T, self.num_heads, self.head_dim)  # (B, T, nh, hs)
        return x.transpose(1, 2)  # (B, nh, T, hs)

    def combine_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, nh, T, hs) -> (B, T, C): the inverse of `split_heads` (concatenate the heads)."""
        B, nh, T, hs = x.shape
        x = x.transpose(1, 2).contiguous()  # (B, T, nh, hs)
        return x.view(B, T, nh * hs)  # (B, T, C)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Self-attention when only ``query`` is given (B, T, C); cross-attention with ``key`` and
        ``value`` (B, S, C). Returns (output (B, T, C), attention weights (B, nh, T, S))."""
        key = query if key is None else key
        value = key if value is None else value
        q = self.split_heads(self.W_q(query))  # (B, T, C) -> (B, T, C) -> (B, nh, T, hs)
        k = self.split_heads(self.W_k(key))  # (B, S, C) -> (B, S, C) -> (B, nh, S, hs)
        v = self.split_heads(self.W_v(value))  # (B, S, C) -> (B, S, C) -> (B, nh, S, hs)
        context, weights = scaled_dot_product_attention(q, k, v, mask)  # (B, nh, T, hs), (B, nh, T, S)
        out = self.W_o(self.combine_heads(context))  # (B, nh, T, hs) -> (B, T, C) -> (B, T, C)
        return out, weights


def from_torch_multihead(mha: nn.MultiheadAttention) -> MultiHeadAttention:
    """A textbook copy of ``torch.nn.MultiheadAttention``'s weights (same outputs).

    PyTorch keeps W_q, W_k and W_v stacked in one ``in_proj_weight`` (3C, C); rows 0..C-1 are
    W_q, C..2C-1 are W_k, 2C..3C-1 are W_v. ``out_proj`` is W_o.
    """
    if mha.in_proj_weight is None:
        raise ValueError("only nn.MultiheadAttention with equal query/key/value sizes is supported")
    C = mha.embed_dim
    bias = mha.in_proj_bias is not None
    textbook = MultiHeadAttention(C, mha.num_heads, bias=bias)
    with torch.no_grad():
        for i, lin in enumerate((textbook.W_q, textbook.W_k, textbook.W_v)):
            lin.weight.copy_(mha.in_proj_weight[i * C : (i + 1) * C])  # (C, C)
            if bias:
                lin.bias.copy_(mha.in_proj_bias[i * C : (i + 1) * C])  # (C,)
        textbook.W_o.weight.copy_(mha.out_proj.weight)  # (C, C)
        if bias:
            textbook.W_o.bias.copy_(mha.out_proj.bias)  # (C,)
    return textbook.to(mha.in_proj_weight.device, mha.in_proj_weight.dtype)
