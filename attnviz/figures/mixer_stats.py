"""Per-head statistics of a non-softmax mixer's matrix that apply to a signed, unnormalised A.

Entropy, sink share, rollout and the induction score assume rows of probabilities; a mixer's
effective attention is signed and not normalised, so they do not apply as they stand
(`NOT_APPLICABLE`). What does apply is defined on |A| explicitly, per head, over the query rows
asked for (rows are fetched in tiles, never the whole N×N at once):

- ``distance``: mean |A|-weighted distance Σ|A[t,s]|·(t−s) / Σ|A| (tokens back);
- ``self``: share of Σ|A| on the diagonal (the token's own value);
- ``negative``: share of Σ|A| carried by negative entries (0 for contribution norms);
- ``row_sum``: mean row sum Σ_s A[t,s] (1 would mean a probability-like row).
"""

from __future__ import annotations

from typing import Any

import numpy as np

STATISTICS = ("distance", "self", "negative", "row_sum")
NOT_APPLICABLE = ("entropy", "sink share", "rollout", "induction")
WHY_NOT = "not applicable: signed, unnormalised"
TILE_ROWS = 256


def mixer_statistics(result: Any, block: int, kind: str, rows: slice | None = None) -> np.ndarray:
    """float64 (heads, len(STATISTICS)) for block ``block``'s ``kind`` mixer (``result``: an
    `attnviz.AttentionResult`), over query rows ``rows`` (default: all)."""
    n = result.n_tokens
    start, stop, _ = (rows or slice(None)).indices(n)
    n_heads = result.mixer_heads(block, kind)
    total = np.zeros(n_heads)
    dist = np.zeros(n_heads)
    diag = np.zeros(n_heads)
    neg = np.zeros(n_heads)
    rsum = np.zeros(n_heads)
    keys = np.arange(n)
    for a in range(start, stop, TILE_ROWS):
        b = min(stop, a + TILE_ROWS)
        m = result.layer(block, mixer=kind, rows=slice(a, b)).astype(np.float64)  # (heads, rows, N)
        mag = np.abs(m)
        q = np.arange(a, b)
        total += mag.sum((1, 2))
        dist += (mag * (q[:, None] - keys[None, :]).clip(min=0)).sum((1, 2))
        diag += mag[:, np.arange(b - a), q].sum(1)
        neg += np.where(m < 0, mag, 0.0).sum((1, 2))
        rsum += m.sum((1, 2))
    safe = np.where(total > 0, total, 1.0)
    return np.stack([dist / safe, diag / safe, neg / safe, rsum / max(1, stop - start)], 1)
