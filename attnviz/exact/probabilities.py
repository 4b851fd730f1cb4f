"""Attention probabilities from what a call saw, in eager's order of operations.

``attention_scores`` is eager's pre-softmax path (QK^T * scale, soft-cap, + bias, + mask),
``softmax_fp32`` its float32 softmax, and ``probs_from_capture`` the two applied to one captured
call for the heads and query rows asked - the only place the fast path turns Q and K into
probabilities.

The identity it must equal: the readable reference `attnviz.reference.attention.attention_probabilities`
(tests/engine/test_reference_attention.py). It differs only in how: masked scores get the dtype's
minimum instead of -inf (eager's convention; exp underflows to exactly 0 either way), the steps
work in place on one buffer, and long causal calls go in blocks of query rows (`_causal_blocks`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..layout import kv_heads_of
from ..records import CapturedAttention


def attention_scores(
    query: torch.Tensor,
    key: torch.Tensor,
    *,
    scaling: float,
    softcap: float | None = None,
    position_bias: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    q_offset: int = 0,
) -> torch.Tensor:
    """Masked pre-softmax scores in eager's order: QK^T * scale, soft-cap, + bias, + mask.

    query (..., q_pos, d_head) and key (..., key_pos, d_head) with matching head dims (GQA already
    resolved). ``mask``/``position_bias`` must be sliced to the same query rows; ``q_offset`` is
    the absolute position of the first query row (for the implicit causal mask: query row i sees
    keys 0 .. q_offset + i, whatever the number of rows - a single first row sees only key 0).
    """
    # Every step after the matmul works in place on its fresh output: one (heads, q, k) buffer.
    scores = torch.matmul(query, key.transpose(-1, -2)).mul_(scaling)
    if softcap is not None:
        scores.div_(softcap).tanh_().mul_(softcap)
    if position_bias is not None:
        scores.add_(position_bias)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores.masked_fill_(~mask, torch.finfo(scores.dtype).min)
        else:
            scores.add_(mask)
    elif is_causal:
        q_pos = torch.arange(scores.shape[-2], device=scores.device) + q_offset
        k_pos = torch.arange(scores.shape[-1], device=scores.device)
        scores.masked_fill_(k_pos[None, :] > q_pos[:, None], torch.finfo(scores.dtype).min)
    return scores


def softmax_fp32(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim in float32, in place when ``scores`` is already float32
    (same result as ``torch.softmax(scores, -1, dtype=torch.float32)``, without 3 more buffers)."""
    s = scores if scores.dtype == torch.float32 else scores.float()
    s.sub_(s.amax(dim=-1, keepdim=True)).exp_()
    return s.div_(s.sum(dim=-1, keepdim=True))


def probs_from_capture(
    cap: CapturedAttention,
    heads: Sequence[int] | None = None,
    rows: slice | None = None,
) -> torch.Tensor:
    """Softmax probabilities (len(heads), q_pos, key_pos) float32 from one captured call.

    Same order of operations as transformers' eager attention; softmax in float32. Heads are
    query heads; GQA maps query head h to KV head h // (heads / kv_heads). Computed on the
    device the layer ran on.
    """
    n_heads, n_kv = cap.query.shape[1], cap.key.shape[1]
    head_idx = list(range(n_heads)) if heads is None else [int(h) for h in heads]
    n_q, n_k = cap.query.shape[2], cap.key.shape[2]
    first, stop, step = (rows or slice(None)).indices(n_q)
    if step != 1:
        raise ValueError(f"rows must be a contiguous slice (step 1), got step {step}")
    rows = slice(first, max(first, stop))
    # Absolute position of the first asked row: the queries are the last n_q of n_k positions.
    start = first + n_k - n_q
    q = cap.query[0, head_idx, rows]  # (h, q_rows, d_head)
    # gathering each asked head's KV head = the reference's repeat_kv, without the other heads
    kv_idx = torch.tensor(kv_heads_of(head_idx, n_heads, n_kv), device=cap.key.device)
    k = cap.key[0].index_select(0, kv_idx)  # (h, key_pos, d_head)
    bias = None
    if cap.position_bias is not None:
        pb = cap.position_bias[0]
        bias = pb[head_idx] if pb.shape[0] > 1 else pb
        bias = bias[:, rows] if bias.shape[1] > 1 else bias  # ALiBi: one row (1, key_pos) per head
    mask = None
    if cap.mask is not None:
        m = cap.mask[0]
        mask = m[head_idx] if m.shape[0] > 1 else m
        mask = mask[:, rows] if mask.shape[1] > 1 else mask  # a padding mask: one row for all
    if mask is None and bias is None and cap.sinks is None and cap.is_causal and q.shape[1] > _CAUSAL_BLOCK:
        return _causal_blocks(q, k, cap, start)
    scores = attention_scores(
        q,
        k,
        scaling=cap.scaling,
        softcap=cap.softcap,
        position_bias=bias,
        mask=mask,
        is_causal=cap.is_causal,
        q_offset=start,
    )
    if cap.sinks is not None:
        # The sink logit joins each row's softmax and is dropped: visible keys sum to < 1.
        sink = (
            cap.sinks.to(scores.device)[head_idx]
            .to(scores.dtype)
            .reshape(-1, 1, 1)
            .expand(*scores.shape[:-1], 1)
        )
        return softmax_fp32(torch.cat([scores, sink], dim=-1))[..., :-1]
    return softmax_fp32(scores)


_CAUSAL_BLOCK = 512


def _causal_blocks(q: torch.Tensor, k: torch.Tensor, cap: CapturedAttention, start: int) -> torch.Tensor:
    """Causal probabilities block by block of query rows, each against only the keys it can see
    (about half the work of the full square; the upper triangle stays exactly 0).

    Equals the reference: a row's softmax only involves the keys it may see, and the keys cut
    off past the block's last row are masked (probability 0) for every row of the block."""
    n_q, n_k = q.shape[1], k.shape[1]
    out = torch.zeros(q.shape[0], n_q, n_k, dtype=torch.float32, device=q.device)
    for a in range(0, n_q, _CAUSAL_BLOCK):
        b = min(a + _CAUSAL_BLOCK, n_q)
        seen = min(start + b, n_k)  # keys 0 .. last row's position
        scores = attention_scores(
            q[:, a:b],
            k[:, :seen],
            scaling=cap.scaling,
            softcap=cap.softcap,
            is_causal=True,
            q_offset=start + a,
        )
        out[:, a:b, :seen] = softmax_fp32(scores)
    return out
