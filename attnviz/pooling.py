"""Views at any length: block-pooled probabilities and full-resolution regions, never a host N×N.

`pooled(result, layer, heads)` splits query_pos and key_pos into blocks of ``block`` tokens
(about ``cells`` blocks per axis) and returns each block's mean and max probability, computed on
the model's device tile by tile: p_ij = exp(s_ij - L_i) with L from the fused kernels
(attnviz.lse), so a tile needs only its own scores; causal tiles above the diagonal are skipped.
Layers whose scores are not standard (soft-capping, a position bias, ...) pool exact
`layer_tensor` row chunks instead. `region` gives one rectangle at full resolution (zoom).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .errors import AttnvizError
from .layout import Stack
from .limits import require
from .lse import captured, layer_lse, layer_spec, scores_tile
from .result import AttentionResult

log = logging.getLogger(__name__)

TILE_ELEMENTS = 1 << 24  # float32 elements of one (heads, rows, cols) tile


@dataclass(frozen=True, eq=False)
class PooledView:
    """Block-pooled probabilities of some heads of one layer: float32 (heads, q_blocks, k_blocks).

    Block (a, b) covers query_pos [a·block, (a+1)·block) and key_pos [b·block, (b+1)·block)
    (the last blocks may be shorter); ``mean`` averages over the cells a block covers."""

    layer: int
    heads: tuple[int, ...]
    block: int
    n_queries: int
    n_keys: int
    mean: np.ndarray
    max: np.ndarray
    path: str  # "fused" or "dense: <why>"


def _heads(result: AttentionResult, heads: Sequence[int] | None) -> list[int]:
    hs = list(range(result.n_heads)) if heads is None else [int(h) for h in heads]
    for h in hs:
        if not 0 <= h < result.n_heads:
            raise AttnvizError(f"head {h} is out of range: this model has heads 0..{result.n_heads - 1}")
    return hs


def _qk(cap, hs: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    group = cap.query.shape[1] // cap.key.shape[1]
    q = cap.query[0, hs]  # (h, q, d)
    k = cap.key[0, [h // group for h in hs]]  # (h, k, d)
    return q, k


def _pool_into(p: torch.Tensor, block: int, a: int, c: int, sums: torch.Tensor, maxes: torch.Tensor) -> None:
    """Add tile p (h, rows, cols) at query_pos a, key_pos c (multiples of block) into the grids."""
    h, rows, cols = p.shape
    pr, pc = (-rows) % block, (-cols) % block
    if pr or pc:
        p = torch.nn.functional.pad(p, (0, pc, 0, pr))
    grid = p.reshape(h, (rows + pr) // block, block, (cols + pc) // block, block)
    br, bc = a // block, c // block
    sums[:, br : br + grid.shape[1], bc : bc + grid.shape[3]] += grid.sum((2, 4))
    tile_max = grid.amax((2, 4))
    view = maxes[:, br : br + grid.shape[1], bc : bc + grid.shape[3]]
    torch.maximum(view, tile_max, out=view)


def pooled(
    result: AttentionResult,
    layer: int,
    heads: Sequence[int] | None = None,
    *,
    cells: int = 256,
    stack: Stack | None = None,
    computation: str = "auto",
) -> PooledView:
    """Mean and max probability of each (block × block) cell of the chosen heads (default: all).

    ``block = ceil(max(n_queries, n_keys) / cells)``; with ``cells >= N`` this is the full
    matrix. Memory: the two (heads, cells, cells) grids plus one tile on the device.
    """
    stack = stack if stack is not None else result.stacks[0]
    if cells < 1:
        raise AttnvizError("cells must be at least 1")
    hs = _heads(result, heads)
    n_q, n_k = (len(t) for t in result.axes(stack))
    block = max(1, math.ceil(max(n_q, n_k) / cells))
    gq, gk = math.ceil(n_q / block), math.ceil(n_k / block)
    cap = captured(result, stack, layer)
    spec, why = layer_spec(cap, result.layout, layer, stack)
    device = cap.query.device if cap is not None else result.layer_tensor(layer, rows=slice(0, 1)).device
    require(2 * len(hs) * gq * gk * 4 + TILE_ELEMENTS * 8, device, what="a pooled view", hint="fewer cells")
    sums = torch.zeros(len(hs), gq, gk, device=device)
    maxes = torch.zeros_like(sums)
    if computation != "dense" and spec is not None and cap is not None:
        q, k = _qk(cap, hs)
        lse = layer_lse(cap, spec)[hs]  # (h, q)
        side = max(block, int(math.sqrt(TILE_ELEMENTS / len(hs))) // block * block)
        for a in range(0, n_q, side):
            for c in range(0, n_k, side):
                if spec.causal and c > a + side - 1:
                    break  # above the diagonal: all zero
                s = scores_tile(q[:, a : a + side], k[:, c : c + side], float(cap.scaling), spec, a, c)
                p = torch.exp(s - lse[:, a : a + side, None])
                _pool_into(p, block, a, c, sums, maxes)
        path = "fused"
    else:
        rows = max(block, TILE_ELEMENTS // max(1, len(hs) * n_k) // block * block)
        for a in range(0, n_q, rows):
            every = hs == list(range(result.n_heads))  # same kernel calls as `layer` itself
            chunk = slice(a, min(a + rows, n_q))
            p = result.layer_tensor(layer, heads=None if every else hs, rows=chunk, stack=stack)
            _pool_into(p.to(device), block, a, 0, sums, maxes)
        path = f"dense: {why if computation != 'dense' else 'asked'}"
    counts_q = torch.full((gq,), block, device=device)
    counts_q[-1] = n_q - block * (gq - 1)
    counts_k = torch.full((gk,), block, device=device)
    counts_k[-1] = n_k - block * (gk - 1)
    mean = sums / (counts_q[:, None] * counts_k[None, :]).float()
    return PooledView(
        layer=layer,
        heads=tuple(hs),
        block=block,
        n_queries=n_q,
        n_keys=n_k,
        mean=mean.cpu().numpy(),
        max=maxes.cpu().numpy(),
        path=path,
    )


def region(
    result: AttentionResult,
    layer: int,
    heads: Sequence[int] | None = None,
    *,
    rows: slice,
    cols: slice,
    stack: Stack | None = None,
) -> np.ndarray:
    """Exact probabilities of one rectangle (zoom): float32 (heads, rows, cols)."""
    stack = stack if stack is not None else result.stacks[0]
    hs = _heads(result, heads)
    n_q, n_k = (len(t) for t in result.axes(stack))
    r0, r1, _ = rows.indices(n_q)
    c0, c1, _ = cols.indices(n_k)
    if r1 <= r0 or c1 <= c0:
        raise AttnvizError(f"empty region: query_pos {r0}..{r1}, key_pos {c0}..{c1}")
    cap = captured(result, stack, layer)
    spec, _ = layer_spec(cap, result.layout, layer, stack)
    if spec is not None and cap is not None:
        require(3 * len(hs) * (r1 - r0) * (c1 - c0) * 4, cap.query.device, what="this region",
                hint="a smaller region")  # fmt: skip
        q, k = _qk(cap, hs)
        s = scores_tile(q[:, r0:r1], k[:, c0:c1], float(cap.scaling), spec, r0, c0)
        p = torch.exp(s - layer_lse(cap, spec)[hs][:, r0:r1, None])
        return p.cpu().numpy()
    require(3 * len(hs) * (r1 - r0) * n_k * 4, "cpu", what="this region", hint="fewer rows")
    p = result.layer_tensor(layer, heads=hs, rows=slice(r0, r1), stack=stack)
    return p[:, :, c0:c1].cpu().numpy()
