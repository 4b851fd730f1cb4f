"""A pooled view of one mixer head: mean and max |A| over blocks of tokens, never (T, S) at once.

The grid is (bins, bins) for `cells` bins a side (block = ceil(S / cells) tokens), like
`attnviz.analysis.pooling.pooled` for softmax heads; the mean counts every cell of a block (zeros
above the diagonal included) and is signed, the max is of |A|. Rows come in tiles of the
per-head formulas; a kind with ``stream_rows`` (the delta rule's chunked scan) streams them
straight into the grid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .kinds import MIXERS
from .store import MixerStore

TILE_ROWS = 256


@dataclass(frozen=True)
class MixerPooled:
    block: int  # the model's block
    kind: str
    head: int
    tokens_per_bin: int
    mean: np.ndarray  # float32 (bins, bins) over (T, S), signed
    absmax: np.ndarray  # float32 (bins, bins), max |A|


def mixer_pooled(store: MixerStore, block: int, kind: str, head: int, cells: int = 256) -> MixerPooled:
    """The pooled view of head ``head`` of block ``block``'s ``kind`` mixer (after its self-check);
    never holds the (T, S) matrix."""
    n = store.n_tokens
    width = max(1, math.ceil(n / cells))
    bins = math.ceil(n / width)
    sums = torch.zeros(bins, bins, dtype=torch.float64)
    maxes = torch.zeros(bins, bins, dtype=torch.float64)
    store.check(block, kind)
    bin_of = torch.arange(n) // width

    def add(rows: torch.Tensor, lo: int, hi: int, values: torch.Tensor) -> None:  # values (T', hi - lo)
        rb, cb = bin_of[rows.cpu()], bin_of[lo:hi]
        flat = (rb[:, None] * bins + cb[None, :]).reshape(-1)
        v = values.reshape(-1).double().cpu()
        sums.view(-1).index_add_(0, flat, v)
        maxes.view(-1).scatter_reduce_(0, flat, v.abs(), "amax")

    stream = MIXERS[kind].stream_rows
    if stream is not None:
        stream(
            store.parts(block, kind), [head], torch.arange(n), emit=lambda r, lo, hi, b: add(r, lo, hi, b[0])
        )
    else:
        for a in range(0, n, TILE_ROWS):
            rows = torch.arange(a, min(a + TILE_ROWS, n))
            add(rows, 0, n, store.tensor(block, kind, [head], slice(a, a + len(rows)))[0].double())
    counts = torch.bincount(bin_of, minlength=bins).double()
    mean = sums / (counts[:, None] * counts[None, :])
    return MixerPooled(block, kind, head, width, mean.float().numpy(), maxes.float().numpy())
