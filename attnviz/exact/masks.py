"""Masks the fused kernels reproduce, and key-only additive biases (ALiBi).

`MaskSpec` (causal, sliding window or none) and the check that a captured mask is exactly one;
`key_bias`: a per-head bias b_hj that depends only on the key (s_ij = scale · q_i·k_j + b_hj),
recorded as ``position_bias`` of shape (1, heads, 1, key_pos) and/or carried by a per-head float
mask whose allowed entries are the same b_hj on every row (Falcon-ALiBi: transformers adds ALiBi
into the causal mask). `attnviz.exact.lse.layer_spec` decides; these only answer.
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from ..layout import AttentionLayout, Stack
from ..records import CapturedAttention

BLOCK_ROWS = 1024  # query rows per block where a mask must be spelled out
V = TypeVar("V")


class PerTensor(Generic[V]):
    """Values computed once per tensor object (a verdict on a mask, a derived mask, a layer's L):
    keyed by the tensor's id and a tag, with a weak reference proving it is the same tensor (every
    layer of a forward shares one mask object, so each is worked out once). An entry goes when its
    tensor is freed; past ``limit`` entries the table starts afresh."""

    def __init__(self, limit: int = 256) -> None:
        self.limit = limit
        self._table: dict[tuple[int, Hashable], tuple[weakref.ref, V]] = {}

    def get(self, tensor: torch.Tensor, tag: Hashable = None) -> V | None:
        hit = self._table.get((id(tensor), tag))
        return hit[1] if hit is not None and hit[0]() is tensor else None

    def put(self, tensor: torch.Tensor, value: V, tag: Hashable = None) -> V:
        if len(self._table) > self.limit:
            self._table.clear()
        key = (id(tensor), tag)
        self._table[key] = (weakref.ref(tensor), value)
        weakref.finalize(tensor, self._table.pop, key, None)
        return value


@dataclass(frozen=True)
class MaskSpec:
    """A mask the fused kernels reproduce: causal (key_pos <= query_pos), optionally a sliding
    window of W keys (key_pos > query_pos - W), or none (every key)."""

    causal: bool
    window: int | None = None


def mask_of(layout: AttentionLayout, layer: int, stack: Stack) -> tuple[bool, int | None]:
    """(causal, sliding window or None) of one layer, read from the layout."""
    causal = stack == "decoder" or (stack == "self" and layout.kind == "decoder")
    window = None
    if layout.sliding_window and stack != "cross":
        types = layout.layer_types
        if (not types and layout.kind == "decoder") or (
            layer < len(types) and types[layer] == "sliding_attention"
        ):
            window = int(layout.sliding_window)
    return causal, window


def allowed(q_pos: torch.Tensor, k_pos: torch.Tensor, spec: MaskSpec) -> torch.Tensor:
    """Bool (query_pos, key_pos): which keys each query may see under ``spec``."""
    ok = torch.ones(q_pos.shape[0], k_pos.shape[0], dtype=torch.bool, device=q_pos.device)
    if spec.causal:
        ok &= k_pos[None, :] <= q_pos[:, None]
    if spec.window is not None:
        ok &= k_pos[None, :] > q_pos[:, None] - spec.window
    return ok


_VERDICTS: PerTensor[bool] = PerTensor()


def mask_matches(mask: torch.Tensor, spec: MaskSpec, n_q: int, n_k: int) -> bool:
    """Whether ``mask`` is exactly ``spec``'s mask for n_q x n_k (worked out once per mask tensor)."""
    hit = _VERDICTS.get(mask, (spec, n_q, n_k))
    if hit is None:
        hit = _VERDICTS.put(mask, _check_mask(mask, spec, n_q, n_k), (spec, n_q, n_k))
    return hit


def is_causal(mask: torch.Tensor) -> bool:
    """True when ``mask`` (bool True = attend, or additive 0 / very negative), (1, 1, N, N), is
    exactly the causal mask (SDPA can then run its causal kernel instead of reading the mask)."""
    n = mask.shape[-1]
    return mask.dim() == 4 and tuple(mask.shape[:3]) == (1, 1, n) and mask_matches(mask, MaskSpec(True), n, n)


def _check_mask(mask: torch.Tensor, spec: MaskSpec, n_q: int, n_k: int) -> bool:
    """True when ``mask`` (bool or additive, (1, 1, q, k)) is exactly ``spec``'s mask, or a per-head
    float (1, heads, q, k) one that is ``spec``'s mask plus a key-only bias (`mask_bias`)."""
    if mask.dim() != 4 or mask.shape[0] != 1 or tuple(mask.shape[2:]) != (n_q, n_k):
        return False
    if mask.shape[1] != 1:
        return _check_head_mask(mask, spec)
    m = mask[0, 0]
    k_pos = torch.arange(n_k, device=m.device)
    for a in range(0, n_q, BLOCK_ROWS):
        rows = m[a : a + BLOCK_ROWS]
        want = allowed(torch.arange(a, a + rows.shape[0], device=m.device), k_pos, spec)
        if rows.dtype == torch.bool:
            if not torch.equal(rows, want):
                return False
        else:
            blocked = rows <= torch.finfo(rows.dtype).min / 2
            if not (torch.equal(rows == 0, want) and torch.equal(blocked, ~want)):
                return False
    return True


def recorded_bias(cap: CapturedAttention) -> torch.Tensor | None:
    """``position_bias`` as float32 (heads, key_pos) when it is key-only (1, heads or 1, 1, key_pos)."""
    pb = cap.position_bias
    h, n_k = cap.query.shape[1], cap.key.shape[2]
    if pb is None or pb.dim() != 4 or pb.shape[0] != 1 or pb.shape[2] != 1 or pb.shape[1] not in (1, h):
        return None
    if pb.shape[3] != n_k:
        return None
    return pb[0, :, 0].float().expand(h, n_k)


def key_bias(cap: CapturedAttention) -> torch.Tensor | None:
    """The per-head, key-only additive bias of a captured call (s_ij = scale · q_i·k_j + b_hj):
    float32 (heads, key_pos), the recorded ``position_bias`` plus what a per-head mask carries;
    None when there is neither. Exact only for calls `attnviz.exact.lse.layer_spec` accepts."""
    parts = [b for b in (recorded_bias(cap), mask_bias(cap.mask)) if b is not None]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    return parts[0] + parts[1]


def mask_bias(mask: torch.Tensor | None) -> torch.Tensor | None:
    """The key-only bias a per-head float mask (1, heads, N, N) would carry: its diagonal
    (allowed under every spec), float32 (heads, N). `_check_head_mask` proves every other
    allowed entry equals it; None for any other mask."""
    if mask is None or mask.dim() != 4 or mask.shape[1] == 1 or mask.shape[2] != mask.shape[3]:
        return None
    if not mask.dtype.is_floating_point:
        return None
    return mask[0].diagonal(0, -2, -1).float()


def _check_head_mask(mask: torch.Tensor, spec: MaskSpec) -> bool:
    """True when every row of every head is ``spec``'s mask with the allowed entries equal to the
    head's key-only bias (`mask_bias`) and the rest blocked (<= min / 2)."""
    c = mask_bias(mask)
    if c is None or not bool(torch.isfinite(c).all()):
        return False
    m = mask[0]
    n = m.shape[-1]
    k_pos = torch.arange(n, device=m.device)
    rows = max(1, (1 << 24) // max(1, m.shape[0] * n))
    for a in range(0, n, rows):
        block = m[:, a : a + rows]
        want = allowed(torch.arange(a, a + block.shape[1], device=m.device), k_pos, spec)
        if not torch.equal(block <= torch.finfo(block.dtype).min / 2, ~want.expand_as(block)):
            return False
        if not torch.equal(torch.where(want, block.float(), 0.0), torch.where(want, c[:, None], 0.0)):
            return False
    return True


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A mask as eager adds it to the scores: a float mask cast to ``dtype``; a bool mask
    (True = attend) as 0 where attended and the dtype's min elsewhere."""
    if mask.dtype != torch.bool:
        return mask.to(dtype)
    return torch.zeros((), dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
