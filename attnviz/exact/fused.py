"""One attention pass whose values are features: (E_p[v], L) without an N×N tensor, on any device.

The identity it must equal: with p the readable reference
`attnviz.reference.attention.attention_probabilities`, E_p[v] = p V
(`attnviz.reference.attention.head_outputs`) and L_i = log Σ_j exp s_ij, the normaliser of p's
row i (tests/engine/test_reference_attention.py). The kernels and `blocked` compute both without
p: an online softmax (flash) or one block of query rows at a time.

`attend(q, k, v, scale=..., spec=...)` runs PyTorch's CPU flash kernel on the CPU and the
memory-efficient kernel on CUDA (both through the seam `attnviz.backend`, whose docstring
states their contract), and an exact blocked softmax (`blocked`) elsewhere or where a kernel
documents that it takes no such inputs (`backend.no_kernel_reason`). `Attended.path` says which
ran: "fused" or "blocked: <why>". Out of memory and every other error propagate: a fallback for
them would hide a bug or run for minutes at long N.

Masks: causal on the square prefill is the kernels' own flag; a sliding window or an offset
causal block becomes additive bias blocks of `BLOCK_ROWS` query rows. A per-head key-only bias
(``key_bias``, ALiBi, rollout's per-key terms) rides along as an additive bias.

CUDA layout (efficient kernel):
- Q and K: their first ``score_dim`` columns (the caller promises q is zero beyond them), rounded
  up to the kernel's alignment: views when the strides allow, else one zero-padded copy each
  (V is never padded: the kernel's value alignment is 1).
- V: where one call would take the slow general kernel (max(K, Kv) > 128, K <= 128: head dim 128
  plus features), V is split into column chunks of <= 128 so each call keeps its output in
  registers: QK^T runs once more, the output never round-trips through global memory, query
  blocks stay 64 rows (`SPLIT_VALUES`; `make gpu-check` times both).
- a bias buffer's last dim is padded to 16 and sliced back, then expanded over heads (stride 0).
- L: the first M of the kernel's ceil(M / 32) * 32 rows (the rest are +inf padding).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch

from .. import backend
from ..limits import require
from .masks import BLOCK_ROWS, MaskSpec, allowed

log = logging.getLogger(__name__)

SPLIT_VALUES = True  # CUDA: split V so every call takes a register-file kernel (see the docstring)


class Attended(NamedTuple):
    out: torch.Tensor  # (heads, q, ev) E_p[v]
    lse: torch.Tensor  # (heads, q) L
    path: str  # "fused" or "blocked: <why>"


def _up(n: int, a: int) -> int:
    return -(-n // a) * a


def scores_tile(
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float,
    spec: MaskSpec,
    q0: int,
    k0: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Exact masked scores of a tile (the reference's masked scores, cut to the tile):
    q (h, rows, d) at query_pos q0.., k (h, cols, d) at key_pos k0..
    -> float32 (h, rows, cols), disallowed entries -inf. ``bias`` (h, key_pos), a key-only additive
    bias over every key (`key_bias`), is added at key_pos k0.. The product is IEEE fp32 on every
    device (never TF32: it is compared with the kernels' log-sum-exp)."""
    s = backend.matmul_ieee(q.float(), k.float().transpose(-1, -2)).mul_(scale)
    if bias is not None:
        s.add_(bias[:, None, k0 : k0 + k.shape[-2]])
    if spec.causal or spec.window is not None:
        # only keys some row of the tile may not see: causal alone, those past its first query
        # (keys before q0 + 1 are allowed for every row, so masking only the rest equals the
        # reference's full causal mask on this tile)
        c0 = max(0, q0 + 1 - k0) if spec.window is None else 0
        if c0 < k.shape[-2]:
            ok = allowed(
                torch.arange(q0, q0 + q.shape[-2], device=q.device),
                torch.arange(k0 + c0, k0 + k.shape[-2], device=q.device),
                spec,
            )
            s[..., c0:].masked_fill_(~ok, float("-inf"))
    return s


def blocked(
    q, k, v, scale: float, spec: MaskSpec, q_offset: int, key_bias=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact softmax attention in query blocks (any device): (E_p[v], L). Each row's softmax
    needs only its own row of scores, so blocks of rows give the reference's rows exactly."""
    outs, lses = [], []
    rows = max(1, min(q.shape[1], (1 << 24) // max(1, q.shape[0] * k.shape[1])))
    for a in range(0, q.shape[1], rows):
        s = scores_tile(q[:, a : a + rows], k, scale, spec, q_offset + a, 0, key_bias)
        lse = torch.logsumexp(s, -1)  # (h, rows)
        p = torch.exp(s - lse[..., None]).nan_to_num_(0.0)
        outs.append(torch.matmul(p, v.float()))
        lses.append(lse)
    return torch.cat(outs, 1), torch.cat(lses, 1)


def _cpu(q, k, v, scale: float, causal: bool, bias):
    """aten flash for the CPU: one head size for Q, K and V (zero columns added where they differ)."""
    ev, w = v.shape[-1], max(q.shape[-1], k.shape[-1], v.shape[-1])
    q, k, v = (t if t.shape[-1] == w else torch.nn.functional.pad(t, (0, w - t.shape[-1])) for t in (q, k, v))
    out, lse = backend.backend().cpu_flash_attention(
        q[None], k[None], v[None], 0.0, causal, attn_mask=None if bias is None else bias[None], scale=scale
    )
    return out[0, ..., :ev], lse[0]


def aligned(t: torch.Tensor, width: int, align: int) -> torch.Tensor:
    """t[..., :width] as the efficient kernel takes it: a view when the strides and offset are
    multiples of ``align``, else one copy zero-padded to ``width``."""
    strides_ok = all(s % align == 0 for s in t.stride()[:-1]) and t.storage_offset() % align == 0
    if t.stride(-1) == 1 and strides_ok and t.shape[-1] >= width:
        return t[..., :width]
    out = t.new_zeros(*t.shape[:-1], width)
    cols = min(width, t.shape[-1])
    out[..., :cols] = t[..., :cols]
    return out


def _efficient(q, k, v, scale: float, causal: bool, bias, score_dim: int | None):
    """The CUDA memory-efficient kernel on (h, pos, e) tensors -> (out (h, q, ev), lse (h, q))."""
    dev = backend.backend()
    align = backend.alignment(q.dtype, dev.capability(q.device))
    h, n_q, _ = q.shape
    n_k, ev = k.shape[1], v.shape[-1]
    e = _up(score_dim if score_dim is not None else q.shape[-1], align)
    qs = aligned(q, e, align)
    ks = qs if k is q else aligned(k, e, align)
    chunks = [slice(0, ev)]
    if SPLIT_VALUES and e <= backend.RF_MAX < ev:  # one call would take the slow general kernel
        chunks = [slice(c, min(c + backend.RF_MAX, ev)) for c in range(0, ev, backend.RF_MAX)]
    attn_bias = None
    if bias is not None:  # (1 | h, 1 | rows, n_k): an aligned buffer, sliced back, expanded
        buf = bias.new_zeros(*bias.shape[:-1], _up(n_k, backend.BIAS_ALIGN))
        buf[..., :n_k] = bias
        attn_bias = buf[..., :n_k][None].expand(1, h, n_q, n_k)
    outs, lse = [], None
    for cols in chunks:
        out, got, *_ = dev.efficient_attention(
            qs[None], ks[None], v[None, ..., cols], attn_bias, lse is None, 0.0, causal, scale=scale
        )
        outs.append(out[0])
        if lse is None:
            lse = got[0, :, :n_q]  # the kernel pads L to a multiple of 32 rows with +inf
    assert lse is not None
    return (outs[0] if len(outs) == 1 else torch.cat(outs, -1)), lse


def _kernel(q, k, v, scale: float, causal: bool, bias, score_dim: int | None):
    if backend.kind(q.device) == "cpu":
        return _cpu(q, k, v, scale, causal, bias)
    return _efficient(q, k, v, scale, causal, bias, score_dim)


def _masked(q, k, v, scale: float, spec: MaskSpec, q_offset: int, key_bias, score_dim):
    n_q, n_k = q.shape[1], k.shape[1]
    kb = None if key_bias is None else key_bias.float()[:, None, :]  # (h, 1, key_pos)
    if spec.window is None and (not spec.causal or (n_q == n_k and q_offset == 0)):
        return _kernel(q, k, v, scale, spec.causal, kb, score_dim)
    outs, lses = [], []
    step = BLOCK_ROWS if kb is None else max(1, min(BLOCK_ROWS, (1 << 24) // max(1, q.shape[0] * n_k)))
    for a in range(0, n_q, step):
        b = min(a + step, n_q)
        hi = min(n_k, q_offset + b) if spec.causal else n_k
        lo = max(0, q_offset + a - spec.window + 1) if spec.window is not None else 0
        if hi <= lo:  # no row of this block sees a key
            outs.append(v.new_zeros(q.shape[0], b - a, v.shape[-1]).float())
            lses.append(torch.full((q.shape[0], b - a), float("-inf"), device=q.device))
            continue
        ok = allowed(
            torch.arange(q_offset + a, q_offset + b, device=q.device),
            torch.arange(lo, hi, device=q.device),
            spec,
        )
        bias = torch.zeros(ok.shape, dtype=q.dtype, device=q.device).masked_fill_(~ok, float("-inf"))[None]
        if kb is not None:
            bias = bias + kb[..., lo:hi]  # (h, rows, cols)
        out, lse = _kernel(q[:, a:b], k[:, lo:hi], v[:, lo:hi], scale, False, bias, score_dim)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs, 1), torch.cat(lses, 1)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    spec: MaskSpec,
    q_offset: int = 0,
    key_bias: torch.Tensor | None = None,
    score_dim: int | None = None,
) -> Attended:
    """(E_p[v] (h, q, ev), L (h, q), path) for float32 q, k of shape (h, pos, e), v (h, pos, ev).

    s_ij = scale · q_i·k_j (+ ``key_bias`` (h, key_pos)) under ``spec``; ``q_offset`` is the
    absolute position of the first query row. ``score_dim``: q is zero beyond that many columns
    (kernels may then skip them). A row with no allowed key comes back with E = 0 and L = -inf
    (the CPU kernel reports L = 0 there: callers that make such rows set them themselves).
    """
    h, n_q, e = q.shape
    n_k = k.shape[1]
    require(4 * h * (2 * n_q + 2 * n_k) * (max(e, v.shape[-1]) + 8), q.device, what="a fused attention pass",
            hint="fewer tokens")  # fmt: skip
    where = backend.kind(q.device)
    if where == "other":
        why = f"no fused kernel on {q.device.type}"
    else:
        try:
            out, lse = _masked(q, k, v, scale, spec, q_offset, key_bias, score_dim)
            return Attended(out, lse, "fused")
        except (RuntimeError, NotImplementedError) as err:
            reason = backend.no_kernel_reason(err)
            if reason is None:
                raise  # out of memory, a shape bug: never hidden behind a slow fallback
            why = reason
            log.warning("fused attention refused these inputs (%s): exact blocked softmax", err)
    out, lse = blocked(q, k, v, scale, spec, q_offset, key_bias)
    return Attended(out, lse, f"blocked: {why}")
