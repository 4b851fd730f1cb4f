"""Value-weighted attention (Kobayashi et al. 2020, "Attention is not only a weight").

A head's contribution from key j to query i is the vector ``α_ij · W_O^h v_j^h`` (``W_O^h``:
the columns of the output projection that read head h, ``v_j^h``: the value of key j read by
head h, its KV head under GQA). Its norm says how much key j really moves query i's output;
a large weight on a key with a tiny value vector (a "sink") shows up as small. Since α ≥ 0,

    ‖α_ij · W_O^h v_j^h‖ = α_ij · ‖W_O^h v_j^h‖

so the per-key norms (heads, key_pos) are computed once and broadcast over the query rows.
The values are the ones the model itself used (captured by the fast path, after the value
projection and its bias); the output projection's bias is not per key and is left out, as in the
paper. ``value_weighted(...).sum over keys`` of the vectors (not the norms) plus that bias is the
layer's attention output; tests check the norms against that direct computation.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal, get_args

import numpy as np
import torch

from ..capture.projections import output_weight
from ..errors import AttnvizError
from ..exact.probabilities import probs_from_capture
from ..layout import Stack, kv_heads_of
from ..loading import LoadedModel
from ..result import AttentionResult

log = logging.getLogger(__name__)

Reduce = Literal["mean", "max"]
REDUCES: tuple[str, ...] = get_args(Reduce)


def key_norms(
    lm: LoadedModel, result: AttentionResult, layer: int, *, stack: Stack | None = None
) -> torch.Tensor:
    """‖W_O^h v_j^h‖ for every head and key: float32 (heads, key_pos) on the layer's device."""
    stack = result.resolve_stack(stack)
    result.check_index(layer, None, stack)
    cap = result.captured(layer, stack)
    if cap is None:
        raise AttnvizError(
            "value-weighted attention needs the values the model used, which only the fast path "
            "records; extract with path='fast' (this result came from the eager path)"
        )
    if cap.value is None:
        raise AttnvizError("this attention call recorded no values; value-weighted attention is unavailable")
    n_heads, n_kv = cap.query.shape[1], cap.value.shape[1]
    v = cap.value[0].float()  # (kv_heads, key_pos, d_head)
    w_o = output_weight(lm.model, cap.module_name, n_heads, v.shape[-1]).to(v.device)
    kv = torch.tensor(kv_heads_of(range(n_heads), n_heads, n_kv), device=v.device)
    with torch.no_grad():
        # (heads, key_pos, d_model) = v^{g(h)} (key_pos, d_head) @ W_O^h^T (d_head, d_model)
        proj = torch.matmul(v[kv], w_o.transpose(1, 2))
        return torch.linalg.vector_norm(proj, dim=-1)  # (heads, key_pos)


def value_weighted(
    lm: LoadedModel,
    result: AttentionResult,
    layer: int,
    *,
    heads: Sequence[int] | None = None,
    rows: slice | None = None,
    stack: Stack | None = None,
) -> np.ndarray:
    """‖α_ij · W_O^h v_j^h‖ per head: float32 (heads, query_pos, key_pos), in hidden-state units.

    ``lm`` must be the model that produced ``result`` (fast path). Rows sum to the norm-weighted
    mass of each query, not to 1.
    """
    stack = result.resolve_stack(stack)
    result.check_index(layer, heads, stack)
    norms = key_norms(lm, result, layer, stack=stack)
    head_idx = list(range(norms.shape[0])) if heads is None else [int(h) for h in heads]
    cap = result.captured(layer, stack)
    assert cap is not None  # key_norms refused an eager result
    probs = probs_from_capture(cap, head_idx, rows)
    return (probs * norms[head_idx, None, :].to(probs.device)).cpu().numpy()


def reduce_heads(weights: np.ndarray, how: Reduce = "mean") -> np.ndarray:
    """(heads, q, k) -> (q, k): the heads' average or maximum (a layer summary)."""
    if how not in REDUCES:
        raise AttnvizError(f"unknown reduction {how!r}; use one of {REDUCES}")
    w = np.asarray(weights, dtype=np.float32)
    return w.mean(axis=0) if how == "mean" else w.max(axis=0)


def layer_value_weighted(
    lm: LoadedModel, result: AttentionResult, layer: int, how: Reduce = "mean", *, stack: Stack | None = None
) -> np.ndarray:
    """Value-weighted attention of a whole layer reduced over heads: float32 (query_pos, key_pos)."""
    return reduce_heads(value_weighted(lm, result, layer, stack=stack), how)


class ValueWeighted:
    """A result whose attention is value-weighted: ``layer_tensor`` / ``layer`` / ``head`` give
    α_ij · ‖W_O^h v_j^h‖ instead of α_ij, so any view of a result can show it unchanged.

    ``relative=True`` divides each layer by its largest key norm (over heads and keys), so the
    numbers lie in [0, 1] like weights (what colour scales expect); ``False`` keeps hidden-state
    units. Everything else (tokens, layout, axes ...) is the wrapped result's.
    """

    def __init__(self, lm: LoadedModel, result: AttentionResult, *, relative: bool = True) -> None:
        self.result = result
        self.relative = relative
        self._lm = lm
        self._norms: dict[tuple[int, Stack], torch.Tensor] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.result, name)

    def norms(self, layer: int, stack: Stack | None = None) -> torch.Tensor:
        """(heads, key_pos) key norms of a layer (relative to the largest when ``relative``)."""
        st = self.result.resolve_stack(stack)
        if (layer, st) not in self._norms:
            n = key_norms(self._lm, self.result, layer, stack=st)
            if self.relative:
                n = n / n.max().clamp(min=torch.finfo(n.dtype).tiny)
            self._norms[(layer, st)] = n
        return self._norms[(layer, st)]

    def layer_tensor(
        self,
        layer: int,
        *,
        heads: Sequence[int] | None = None,
        rows: slice | None = None,
        stack: Stack | None = None,
    ) -> torch.Tensor:
        t = self.result.layer_tensor(layer, heads=heads, rows=rows, stack=stack)
        n = self.norms(layer, stack)
        n = n if heads is None else n[[int(h) for h in heads]]
        return t * n[:, None, :].to(t.device)

    def layer(self, layer: int, *, stack: Stack | None = None, rows: slice | None = None) -> np.ndarray:
        return self.layer_tensor(layer, stack=stack, rows=rows).cpu().numpy()

    def head(
        self, layer: int, head: int, *, stack: Stack | None = None, rows: slice | None = None
    ) -> np.ndarray:
        return self.layer_tensor(layer, heads=[head], stack=stack, rows=rows)[0].cpu().numpy()
