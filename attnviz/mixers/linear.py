"""MiniMax lightning attention, per head: linear attention with a fixed per-head decay.

From what the module computed (φ = its activation applied to qkv_proj, then split per head):

    A_h[t,s] = (q_t·k_s) · exp(-λ_h (t-s)),  s ≤ t,   y_t = Σ_s A_h[t,s] v_s

with λ_h the layer's ``slope_rate``; there is no normaliser. Block-wise, the module's loop gives
exactly this: the intra-block decay is exp(-λ(i-j)) and the carried state decays by exp(-λ(B+i-j))
across a block boundary. RMSNorm over all heads (a per-token scale), a sigmoid gate and out_proj
follow outside A. The oracle is `attnviz.mixers.reference.lightning_dense`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def lightning_parts(inputs: dict) -> dict[str, torch.Tensor]:
    """q, k, v (S, nh, hs) and λ (nh,), float64."""
    slope = inputs["slope_rate"].double().reshape(-1)
    n_heads = slope.shape[0]
    qkv = inputs["qkv"][0].double()
    qkv = qkv.reshape(qkv.shape[0], n_heads, -1)
    q, k, v = torch.split(qkv, qkv.shape[-1] // 3, dim=-1)
    return {"q": q, "k": k, "v": v, "slope": slope}


def lightning_rows(parts: dict, heads: Sequence[int], rows: torch.Tensor) -> torch.Tensor:
    """float64 (nh', T, S) for nh' = len(heads), T = len(rows)."""
    hs = list(heads)
    rows = rows.to(parts["q"].device)
    q = parts["q"][rows][:, hs].transpose(0, 1)  # (nh', T, hs)
    k = parts["k"][:, hs].transpose(0, 1)  # (nh', S, hs)
    n = k.shape[1]
    gap = (rows[:, None] - torch.arange(n, device=rows.device)[None, :]).double()  # (T, S)  t - s
    decay = torch.exp(-parts["slope"][hs][:, None, None] * gap.clamp(min=0)) * (gap >= 0)
    return (q @ k.transpose(1, 2)) * decay


def lightning_outputs(parts: dict, matrix: torch.Tensor, heads: Sequence[int]) -> torch.Tensor:
    """Σ_s A[t,s] v_s: (T, nh', hs)."""
    v = parts["v"][:, list(heads)].transpose(0, 1)
    return (matrix @ v).transpose(0, 1)


def n_heads(inputs: dict) -> int:
    """nh of a lightning attention layer (one decay rate per head)."""
    return int(inputs["slope_rate"].numel())


def core_output(parts: dict, rows: torch.Tensor) -> torch.Tensor:
    """The attention's output before its norm at query ``rows``, rebuilt from every head's A."""
    heads = list(range(parts["slope"].shape[0]))
    return lightning_outputs(parts, lightning_rows(parts, heads, rows), heads)
