"""Downsampling (pure numpy) and the browser payload budget of a figure."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, get_args

import numpy as np
import plotly.graph_objects as go

Pool = Literal["max", "mean"]
POOLS: tuple[str, ...] = get_args(Pool)

BYTES_PER_CELL = 7  # measured: base64 float32 plus JSON escapes, rounded up
PAYLOAD_LIMIT = 5_000_000
GRID_MAX_SIDE = 128  # pixels per head side in a grid of heads
GRID_MAX_CELLS = 120_000  # all heads of one grid together (~0.8 MB)
SINGLE_MAX_CELLS = 400_000  # one head at full resolution up to 632 x 632 tokens (~2.7 MB)
SINGLE_MAX_KEYS = 1024  # key columns of a row window before keys are pooled
MOSAIC_MAX_CELLS = 300_000  # every layer x head of a model at once (~2 MB)


def bin_edges(n: int, max_bins: int) -> np.ndarray:
    """Start index of each of ``min(n, max_bins)`` near-equal bins over ``range(n)``."""
    bins = max(1, min(int(n), int(max_bins)))
    return np.unique(np.floor(np.arange(bins) * (n / bins)).astype(np.int64))


def pool(a: np.ndarray, row_edges: np.ndarray, col_edges: np.ndarray, how: Pool = "max") -> np.ndarray:
    """Reduce the last two axes of ``a`` over bins that start at the given edges.

    ``"max"`` keeps a single strong weight visible (the default for pictures); ``"mean"`` keeps
    the average weight of the bin.
    """
    if how not in POOLS:
        raise ValueError(f"unknown pooling {how!r}; use one of {POOLS}")
    a = np.asarray(a, dtype=np.float32)
    if len(row_edges) == a.shape[-2] and len(col_edges) == a.shape[-1]:
        return a
    ufunc = np.maximum if how == "max" else np.add
    out = ufunc.reduceat(ufunc.reduceat(a, row_edges, axis=-2), col_edges, axis=-1)
    if how == "mean":
        rows = np.diff(np.append(row_edges, a.shape[-2]))
        cols = np.diff(np.append(col_edges, a.shape[-1]))
        out = out / (rows[:, None] * cols[None, :])
    return out.astype(np.float32)


def downsample(
    a: np.ndarray, max_rows: int, max_cols: int | None = None, how: Pool = "max"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pooled, row_edges, col_edges) with at most ``max_rows`` x ``max_cols`` cells per matrix."""
    max_cols = max_rows if max_cols is None else max_cols
    rows, cols = bin_edges(a.shape[-2], max_rows), bin_edges(a.shape[-1], max_cols)
    return pool(a, rows, cols, how), rows, cols


def pooled_rows(
    get_rows: Callable[[slice], np.ndarray],
    n_rows: int,
    n_cols: int,
    max_side: int,
    how: Pool = "max",
    chunk_cells: int = 1 << 24,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pool a (..., n_rows, n_cols) matrix fetched in row chunks; never holds it all at once.

    ``get_rows(slice)`` returns (..., rows, n_cols). Chunks follow the row bins, so each bin is
    reduced inside one chunk; a chunk has about ``chunk_cells`` cells per leading index (e.g.
    per head). Returns (pooled, row_edges, col_edges).
    """
    row_e, col_e = bin_edges(n_rows, max_side), bin_edges(n_cols, max_side)
    per_bin = max(1, math.ceil(n_rows / len(row_e)))
    bins_per_chunk = max(1, chunk_cells // max(1, per_bin * n_cols))
    parts = []
    for i in range(0, len(row_e), bins_per_chunk):
        starts = row_e[i : i + bins_per_chunk]
        stop = int(row_e[i + bins_per_chunk]) if i + bins_per_chunk < len(row_e) else n_rows
        block = np.asarray(get_rows(slice(int(starts[0]), stop)), dtype=np.float32)
        parts.append(pool(block, starts - starts[0], col_e, how))
    return np.concatenate(parts, axis=-2), row_e, col_e


def grid_side(
    n_heads: int, max_cells: int = GRID_MAX_CELLS, max_side: int = GRID_MAX_SIDE, n_tokens: int | None = None
) -> int:
    """Pixels per side of each head in a grid so that all heads fit ``max_cells``. With
    ``n_tokens`` given, a text of up to ``max_side`` tokens stays unpooled while the grid is
    within twice the budget (pooling 128 tokens into 115 bins would only blur them)."""
    side = max(8, min(max_side, int(math.sqrt(max_cells / max(1, n_heads)))))
    if n_tokens is not None and side < n_tokens <= max_side and n_heads * n_tokens**2 <= 2 * max_cells:
        return n_tokens
    return side


def payload_bytes(fig: go.Figure) -> int:
    """Size of the JSON the browser receives for ``fig``."""
    return len(fig.to_json())
