"""Data for the token views: windows of attention rows or columns, never the whole (N, N) layer.

``direction="from"``: what the tokens at some positions attend to (their rows).
``direction="to"``: how much every token attends to them (their columns), computed in row chunks
so an 8k-token layer is never held at once. With ``lm`` given, weights are value-weighted
(‖α_ij · W_O^h v_j^h‖, see `attnviz.analysis.value_weighted`) instead of raw.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import torch

from ..errors import AttnvizError
from ..layout import Stack
from ..loading import LoadedModel
from ..result import AttentionResult
from .value_weighted import key_norms

CHUNK_ELEMENTS = 1 << 24  # elements of one (heads, rows, keys) chunk when reading columns
DEFAULT_WINDOW = 12  # positions each side of the selected token in the lines view


def window(n: int, selected: int | None, half: int = DEFAULT_WINDOW) -> list[int]:
    """Up to 2 * half + 1 consecutive positions centred on ``selected`` (from 0 without one)."""
    size = min(n, 2 * half + 1)
    centre = half if selected is None else int(selected)
    start = min(max(0, centre - half), n - size)
    return list(range(start, start + size))


def _check_positions(n: int, positions: Sequence[int]) -> list[int]:
    pos = [int(p) for p in positions]
    bad = [p for p in pos if not 0 <= p < n]
    if bad:
        raise AttnvizError(f"token position {bad[0]} is out of range: the text has positions 0..{n - 1}")
    return pos


def token_rows(
    result: AttentionResult,
    layer: int,
    positions: Sequence[int],
    *,
    direction: str = "from",
    heads: Sequence[int] | None = None,
    stack: Stack | None = None,
    lm: LoadedModel | None = None,
) -> np.ndarray:
    """float32 (heads, len(positions), N): rows (``"from"``) or transposed columns (``"to"``)."""
    q_tokens, k_tokens = result.axes(stack)
    head_idx = list(range(result.n_heads)) if heads is None else [int(h) for h in heads]
    norms = None
    if lm is not None:
        norms = key_norms(lm, result, layer, stack=stack)[head_idx]  # (heads, key_pos)
    if direction == "from":
        pos = _check_positions(len(q_tokens), positions)
        if pos and _consecutive(pos):
            t = result.layer_tensor(layer, heads=head_idx, rows=slice(pos[0], pos[-1] + 1), stack=stack)
        else:  # arbitrary positions: one row each
            rows = [
                result.layer_tensor(layer, heads=head_idx, rows=slice(p, p + 1), stack=stack) for p in pos
            ]
            t = torch.cat(rows, dim=1)
        if norms is not None:
            t = t * norms[:, None, :].to(t.device)
        return t.cpu().numpy()
    if direction != "to":
        raise AttnvizError(f"unknown direction {direction!r}; use 'from' or 'to'")
    pos = _check_positions(len(k_tokens), positions)
    n_q = len(q_tokens)
    step = max(1, CHUNK_ELEMENTS // max(1, len(head_idx) * len(k_tokens)))
    cols = []
    idx = torch.tensor(pos)
    for a in range(0, n_q, step):
        block = result.layer_tensor(layer, heads=head_idx, rows=slice(a, min(n_q, a + step)), stack=stack)
        cols.append(block.index_select(-1, idx.to(block.device)))  # (heads, rows, len(pos))
    c = torch.cat(cols, dim=1)  # (heads, N queries, len(pos))
    if norms is not None:
        c = c * norms[:, None, pos].to(c.device)
    return c.transpose(1, 2).cpu().numpy()


def _consecutive(pos: list[int]) -> bool:
    return all(b == a + 1 for a, b in itertools.pairwise(pos))


def token_weights(
    result: AttentionResult,
    layer: int,
    selected: int,
    *,
    head: int | None = None,
    direction: str = "from",
    reduce: str = "mean",
    stack: Stack | None = None,
    lm: LoadedModel | None = None,
) -> np.ndarray:
    """float32 (N,): the selected token's row (``"from"``) or column (``"to"``) for one head, or
    the heads' mean / max when ``head`` is None (the coloured-text view)."""
    heads = None if head is None else [int(head)]
    w = token_rows(result, layer, [selected], direction=direction, heads=heads, stack=stack, lm=lm)[:, 0]
    if head is not None:
        return w[0]
    if reduce not in ("mean", "max"):
        raise AttnvizError(f"unknown reduction {reduce!r}; use 'mean' or 'max'")
    return w.mean(axis=0) if reduce == "mean" else w.max(axis=0)
