"""Views at any length: block-pooled probabilities and full-resolution regions, never a host N×N.

`pooled(result, layer, heads)` splits query_pos and key_pos into blocks of ``block`` tokens
(about ``cells`` blocks per axis) and returns each block's mean and max probability, computed on
the model's device tile by tile: p_ij = exp(s_ij - L_i) with L from the fused kernels
(attnviz.exact.lse), so a tile needs only its own scores; causal tiles above the diagonal are skipped.
Bins of one width (`equal_edges`, the default blocks) pool by reshapes over query-row chunks
that skip the keys a causal chunk never sees, and the max needs no exponential of the tile:
max_ij exp(s_ij - L_i) = exp(max_i (max_j s_ij - L_i)) (exp is increasing); other bins pool by
scatters. Only the pools asked for (``pools``) are computed.
The tiles are the layer's `attnviz.exact.sources.LogTiles`; a layer that has none (soft-capping,
a position bias, an eager result, ...) pools exact row chunks of its source instead.
`region` gives one rectangle at full resolution (zoom).
Every p it pools is an entry of the readable reference `attnviz.reference.attention`
(tests/engine/test_reference_attention.py pools one token per bin and compares).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import AttnvizError
from ..exact.sources import LogTiles
from ..layout import Stack
from ..limits import require
from ..result import AttentionResult

log = logging.getLogger(__name__)

TILE_ELEMENTS = 1 << 24  # float32 elements of one (heads, rows, cols) tile
CHUNK_ROWS = 256  # query rows per chunk of the reshape path (whole bins): small enough to skip
# most of a causal layer's masked half, large enough to keep the per-chunk overhead small
POOLS = ("mean", "max")


@dataclass(frozen=True, eq=False)
class PooledView:
    """Block-pooled probabilities of some heads of one layer: float32 (heads, q_bins, k_bins).

    Bin a of the query axis covers query_pos [row_edges[a], row_edges[a + 1]) (the last one runs
    to n_queries); likewise for keys. ``mean`` averages over the cells a block covers. With the
    default equal blocks, ``block`` is their size (the last ones may be shorter)."""

    layer: int
    heads: tuple[int, ...]
    block: int
    n_queries: int
    n_keys: int
    row_edges: np.ndarray
    col_edges: np.ndarray
    mean: np.ndarray | None  # None when not asked for (``pools``)
    max: np.ndarray | None
    path: str  # "fused", "blocked: <why>" (L from the exact blocked softmax) or "dense: <why>"

    def values(self, how: str) -> np.ndarray:
        """The ``how`` ("mean" or "max") pool; an error when this view was not asked for it."""
        got = self.max if how == "max" else self.mean if how == "mean" else None
        if got is None:
            raise AttnvizError(f"this pooled view has no {how!r} pool; ask pooled(..., pools=[{how!r}])")
        return got


def equal_edges(n: int, max_bins: int) -> np.ndarray:
    """Start positions of bins of ``ceil(n / max_bins)`` tokens over range(n) (the last may be
    shorter): at most ``max_bins`` bins that `pooled` reduces by reshapes."""
    block = max(1, math.ceil(n / max(1, int(max_bins))))
    return np.arange(0, n, block, dtype=np.int64)


def _width(edges: np.ndarray, n: int) -> int | None:
    """The one width of the bins starting at ``edges`` over range(n) (the last may be shorter)."""
    w = int(edges[1] - edges[0]) if len(edges) > 1 else n
    return w if (np.diff(edges) == w).all() and n - int(edges[-1]) <= w else None


def _reduce(x: torch.Tensor, dim: int, width: int, how: str) -> torch.Tensor:
    """``how`` ("sum" or "amax") over consecutive groups of ``width`` along ``dim`` (the last
    group may be shorter): a reshape, no copy."""
    n = x.shape[dim]
    full = n // width * width
    parts = []
    if full:
        parts.append(getattr(x.narrow(dim, 0, full).unflatten(dim, (-1, width)), how)(dim + 1))
    if full < n:
        parts.append(getattr(x.narrow(dim, full, n - full), how)(dim, keepdim=True))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def _heads(result: AttentionResult, heads: Sequence[int] | None) -> list[int]:
    hs = list(range(result.n_heads)) if heads is None else [int(h) for h in heads]
    for h in hs:
        if not 0 <= h < result.n_heads:
            raise AttnvizError(f"head {h} is out of range: this model has heads 0..{result.n_heads - 1}")
    return hs


def _edges(edges: Sequence[int] | np.ndarray | None, n: int, block: int, axis: str) -> np.ndarray:
    """Bin start positions: given (checked: start at 0, strictly increasing, below n) or every block."""
    if edges is None:
        return np.arange(0, n, block, dtype=np.int64)
    e = np.asarray(edges, dtype=np.int64).reshape(-1)
    if e.size == 0 or e[0] != 0 or (np.diff(e) <= 0).any() or e[-1] >= n:
        raise AttnvizError(f"{axis} bin edges must start at 0, increase, and stay below {n}")
    return e


class _Grid:
    """Running sum and max of probabilities per (head, query bin, key bin), on the device."""

    def __init__(self, h: int, row_edges: np.ndarray, col_edges: np.ndarray, n_q: int, n_k: int, device):
        self.row_bin = torch.as_tensor(
            np.searchsorted(row_edges, np.arange(n_q), side="right") - 1, device=device
        )
        self.col_bin = torch.as_tensor(
            np.searchsorted(col_edges, np.arange(n_k), side="right") - 1, device=device
        )
        self.sums = torch.zeros(h, len(row_edges), len(col_edges), device=device)
        self.maxes = torch.zeros_like(self.sums)

    def add(self, p: torch.Tensor, a: int, c: int) -> None:
        """Tile p (h, rows, cols) at query_pos a, key_pos c: reduce keys, then rows, into bins."""
        h, rows, cols = p.shape
        n_kb = self.sums.shape[2]
        cid = self.col_bin[c : c + cols].expand(h, rows, cols)
        col_sum = p.new_zeros(h, rows, n_kb).scatter_add_(-1, cid, p)
        col_max = p.new_zeros(h, rows, n_kb).scatter_reduce_(-1, cid, p, "amax")
        rid = self.row_bin[a : a + rows]
        self.sums.index_add_(1, rid, col_sum)
        self.maxes.scatter_reduce_(1, rid[None, :, None].expand(h, rows, n_kb), col_max, "amax")


def pooled(
    result: AttentionResult,
    layer: int,
    heads: Sequence[int] | None = None,
    *,
    cells: int = 256,
    stack: Stack | None = None,
    row_edges: Sequence[int] | np.ndarray | None = None,
    col_edges: Sequence[int] | np.ndarray | None = None,
    computation: str = "auto",
    pools: Sequence[str] = POOLS,
) -> PooledView:
    """Mean and max probability of each block of the chosen heads (default: all).

    Blocks are ``block = ceil(max(n_queries, n_keys) / cells)`` tokens on a side, or the bins
    given by ``row_edges`` / ``col_edges`` (start positions, e.g. `equal_edges`, which pool
    fastest, or `attnviz.figures.bin_edges`). With ``cells >= N`` this is the full matrix.
    ``pools`` names the pools to compute ("mean", "max"); the view's other one is None.
    Memory: the two (heads, bins, bins) grids plus one tile on the device.
    """
    stack = stack if stack is not None else result.stacks[0]
    if cells < 1:
        raise AttnvizError("cells must be at least 1")
    if not pools or set(pools) - set(POOLS):
        raise AttnvizError(f"pools must name some of {POOLS}, not {tuple(pools)}")
    hs = _heads(result, heads)
    n_q, n_k = (len(t) for t in result.axes(stack))
    block = max(1, math.ceil(max(n_q, n_k) / cells))
    re, ce = _edges(row_edges, n_q, block, "query"), _edges(col_edges, n_k, block, "key")
    src = result.source(layer, stack)
    device = src.device
    need = 2 * len(hs) * len(re) * len(ce) * 4 + TILE_ELEMENTS * 8
    require(need, device, what="a pooled view", hint="fewer cells")  # before L's own pass
    tiles, why = src.log_tiles(hs) if computation != "dense" else (None, "asked")
    grid = _Grid(len(hs), re, ce, n_q, n_k, device)
    wq, wk = _width(re, n_q), _width(ce, n_k)
    if tiles is not None:
        if wq is not None and wk is not None:
            _reshaped(grid, tiles, (n_q, n_k), (wq, wk), pools)
        else:
            side = max(1, int(math.sqrt(TILE_ELEMENTS / len(hs))))
            for a in range(0, n_q, side):
                for c in range(0, n_k, side):
                    if tiles.causal and c > a + side - 1:
                        break  # above the diagonal: all zero
                    grid.add(
                        torch.exp(tiles.scores(a, side, c, side) - tiles.lse[:, a : a + side, None]), a, c
                    )
        path = tiles.path  # "fused", or "blocked: <why>" when L came from there
    else:
        rows = max(1, TILE_ELEMENTS // max(1, len(hs) * n_k))
        every = hs == list(range(result.n_heads))  # same kernel calls as `layer` itself
        for a in range(0, n_q, rows):
            chunk = slice(a, min(a + rows, n_q))
            grid.add(src.probabilities(None if every else hs, chunk).to(device), a, 0)
        path = f"dense: {why}"
    rq = torch.as_tensor(np.diff(np.append(re, n_q)), device=device)
    rk = torch.as_tensor(np.diff(np.append(ce, n_k)), device=device)
    mean = grid.sums / (rq[:, None] * rk[None, :]).float()
    return PooledView(
        layer=layer,
        heads=tuple(hs),
        block=block if row_edges is None and col_edges is None else 0,
        n_queries=n_q,
        n_keys=n_k,
        row_edges=re,
        col_edges=ce,
        mean=mean.cpu().numpy() if "mean" in pools else None,
        max=grid.maxes.cpu().numpy() if "max" in pools else None,
        path=path,
    )


def _reshaped(
    grid: _Grid,
    tiles: LogTiles,
    n: tuple[int, int],
    width: tuple[int, int],
    pools: Sequence[str],
) -> None:
    """Bins of one width per axis, into ``grid``: chunks of whole query bins against every key
    a chunk can see (causal: none past its last query), reduced by reshapes.
    max_ij p_ij = exp(max_i (max_j s_ij - L_i)) (exp is increasing); the mean takes p = exp(s - L).
    Each p is the reference's (`attnviz.reference.attention`): exp(s − L) with L its row's
    normaliser; keys past a causal chunk's last query have p = 0 there, so leaving them out
    changes no sum and no max (tests/engine/test_reference_attention.py, one token per bin)."""
    (n_q, n_k), (wq, wk) = n, width
    lse = tiles.lse
    h = lse.shape[0]
    rows = wq * max(1, min(-(-CHUNK_ROWS // wq), TILE_ELEMENTS // max(1, h * n_k * wq)))
    for a in range(0, n_q, rows):
        r = min(rows, n_q - a)
        cols = min(n_k, -(-(a + r) // wk) * wk) if tiles.causal else n_k  # keys past the chunk: masked
        s = tiles.scores(a, r, 0, cols)  # (h, r, cols)
        lse_rows = lse[:, a : a + r, None]
        b0, b1, c1 = a // wq, a // wq + -(-r // wq), -(-cols // wk)
        if "max" in pools:
            m = _reduce(_reduce(s, 2, wk, "amax").sub_(lse_rows), 1, wq, "amax")  # (h, bins, bins)
            grid.maxes[:, b0:b1, :c1] = m.exp_()
        if "mean" in pools:
            p = s.sub_(lse_rows).exp_()  # in place: s is not needed after this
            grid.sums[:, b0:b1, :c1] = _reduce(_reduce(p, 2, wk, "sum"), 1, wq, "sum")


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
    src = result.source(layer, stack)
    tiles, _ = src.log_tiles(hs)
    if tiles is not None:
        require(3 * len(hs) * (r1 - r0) * (c1 - c0) * 4, src.device, what="this region",
                hint="a smaller region")  # fmt: skip
        s = tiles.scores(r0, r1 - r0, c0, c1 - c0)
        return torch.exp(s - tiles.lse[:, r0:r1, None]).cpu().numpy()
    require(3 * len(hs) * (r1 - r0) * n_k * 4, "cpu", what="this region", hint="fewer rows")
    p = src.probabilities(hs, slice(r0, r1))
    return p[:, :, c0:c1].cpu().numpy()
