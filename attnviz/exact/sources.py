"""Where one layer's probabilities come from: read this right after `attnviz.reference.attention`.

A result keeps each attention layer in one of three forms, and `AttentionResult.source` hands
out that layer's `Source`: the one place that branches on the form. Whoever wants
probabilities (`AttentionResult.layer_tensor`, `attnviz.analysis.pooling`) asks the source and
never looks at the form.

- `Captured` (the fast path, ``extract(path="fast")``): the call's captured Q, K, mask and
  extras. Rows are eager's order of operations on them (`attnviz.exact.probabilities`). Where the
  layer's scores are exactly scale · q·k plus a mask the kernels reproduce (`attnviz.exact.lse.layer_spec`,
  the one predicate), it also gives `LogTiles`: any rectangle of log p_ij = s_ij − L_i from Q, K
  and each row's log-sum-exp L, from PyTorch's fused kernels (`attnviz.exact.fused`), so a pooled
  view of 32k tokens never needs a whole row.
- `Recomputed` (layer at a time): the model's own attention module run again, in eager mode, on
  the layer's recorded input.
- `Stored` (``path="eager"``): the (heads, T, S) tensor the model returned with
  ``output_attentions=True``.

The identity every source must equal: `attnviz.reference.attention.attention_probabilities`,
row for row, and exp of any log tile is that matrix's rectangle
(tests/engine/test_reference_attention.py holds each source to it on tiny models).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

import torch

from ..capture.layerwise import LayerInput
from ..layout import AttentionLayout, Stack, kv_heads_of
from ..records import CapturedAttention
from .lse import key_bias, layer_lse_path, layer_spec, scores_tile
from .probabilities import probs_from_capture

EAGER_REASON = "eager result"  # why a stored or recomputed layer has no log tiles


@dataclass(frozen=True, eq=False)
class LogTiles:
    """Exact log-probabilities of some heads of one layer, a rectangle at a time:
    log p_ij = s_ij − L_i, with ``scores(a, rows, c, cols)`` the masked scores (−inf where a
    key is masked) of query_pos a.., key_pos c.. as float32 (heads, rows, cols) and ``lse`` the
    rows' L (heads, T). Subtracting after a reduction over keys is what makes a block's maximum
    cheap: max_j p_ij = exp(max_j s_ij − L_i)."""

    scores: Callable[[int, int, int, int], torch.Tensor]
    lse: torch.Tensor  # (heads, T) float32
    causal: bool  # keys past a query are masked: tiles above the diagonal are all −inf
    path: str  # where L came from: "fused" (a kernel or the forward) or "blocked: <why>"


class Source(Protocol):
    """One layer's attention probabilities on demand (see the module docstring)."""

    @property
    def device(self) -> torch.device: ...

    def probabilities(self, heads: Sequence[int] | None, rows: slice | None) -> torch.Tensor:
        """float32 (heads, rows, S) on the model's device; None: every head, every row."""
        ...

    def log_tiles(self, heads: Sequence[int]) -> tuple[LogTiles | None, str]:
        """(the tiles of ``heads``, "fused"), or (None, why only whole rows are exact here)."""
        ...


def _cut(t: torch.Tensor, heads: Sequence[int] | None, rows: slice | None) -> torch.Tensor:
    t = t if heads is None else t[list(heads)]
    return t[:, rows or slice(None)]


@dataclass(frozen=True, eq=False)
class Stored:
    """The eager path's tensor, (heads, T, S), as the model returned it."""

    tensor: torch.Tensor

    @property
    def device(self) -> torch.device:
        return self.tensor.device

    def probabilities(self, heads: Sequence[int] | None, rows: slice | None) -> torch.Tensor:
        return _cut(self.tensor, heads, rows)

    def log_tiles(self, heads: Sequence[int]) -> tuple[LogTiles | None, str]:
        return None, EAGER_REASON


@dataclass(frozen=True, eq=False)
class Recomputed:
    """The model's attention module run again on one layer's recorded input, inside
    ``eager_mode()`` (the model switched to eager attention for the call)."""

    call: LayerInput
    eager_mode: Callable[[], AbstractContextManager]

    @property
    def device(self) -> torch.device:
        return self.call.tensors()[0].device

    def probabilities(self, heads: Sequence[int] | None, rows: slice | None) -> torch.Tensor:
        with self.eager_mode():
            return _cut(self.call.probabilities(), heads, rows)

    def log_tiles(self, heads: Sequence[int]) -> tuple[LogTiles | None, str]:
        return None, EAGER_REASON


@dataclass(frozen=True, eq=False)
class Captured:
    """The fast path: one captured call (``cap``) of layer ``layer`` of ``stack``."""

    cap: CapturedAttention
    layout: AttentionLayout
    layer: int
    stack: Stack

    @property
    def device(self) -> torch.device:
        return self.cap.query.device

    def probabilities(self, heads: Sequence[int] | None, rows: slice | None) -> torch.Tensor:
        return probs_from_capture(self.cap, heads, rows)

    def log_tiles(self, heads: Sequence[int]) -> tuple[LogTiles | None, str]:
        cap = self.cap
        spec, why = layer_spec(cap, self.layout, self.layer, self.stack)
        if spec is None:
            return None, why
        hs = [int(h) for h in heads]
        q = cap.query[0, hs]  # (h, T, d)
        k = cap.key[0, kv_heads_of(hs, cap.query.shape[1], cap.key.shape[1])]  # (h, S, d): GQA's rule
        lse, path = layer_lse_path(cap, spec)
        kb = key_bias(cap)
        kb = None if kb is None else kb[hs]
        scale = float(cap.scaling)

        def scores(a: int, rows: int, c: int, cols: int) -> torch.Tensor:  # (h, rows, cols)
            return scores_tile(q[:, a : a + rows], k[:, c : c + cols], scale, spec, a, c, kb)

        return LogTiles(scores, lse[hs], spec.causal, "fused" if path == "forward" else path), "fused"
