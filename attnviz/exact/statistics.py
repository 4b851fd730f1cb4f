"""The statistics' log-sum-exp and feature expectations taken from the model's own forward.

With ``extract(..., statistics=True)`` the capture runs each eligible layer's attention as ONE
call of PyTorch's CPU flash kernel, ``aten._scaled_dot_product_flash_attention_for_cpu``, which
returns each row's log-sum-exp L_i next to its output. The kernel wants one head size for Q, K
and V, so the call is widened (per KV head; the kernel groups query heads itself):

    Q' = [q, 0 .. 0]                 (heads, q_pos, d + d_v + 1)
    K' = V' = [k, v, key_pos]        (kv_heads, key_pos, d + d_v + 1)

Q'·K' = q·k exactly (the extra terms are products with 0), so the probabilities are the layer's
own, and the output's columns are E_p[k] (d), the layer output E_p[v] (d_v) and E_p[key_pos] (1).
The model gets the d_v columns; the statistics keep L, E_p[key_pos] and the cross terms
scale · q_b·E_{p_a}[k] of every pair of query heads a, b in one KV group (`cross_terms`: a's own
term gives the entropy, the others GQA coherence) — O(heads · group · N) floats per layer.

Only where plain SDPA itself would run that flash kernel (`fusable`: CPU, float32 — float32
positions are exact, and a bf16 kernel would round E_p[k] to bf16 —, no dropout, the square
no-cache prefill, ``torch._fused_sdp_choice`` picks flash for the call transformers would make,
and the widened buffers fit the free memory).
Elsewhere (CUDA, bf16, eager-only extras) the layer runs as before and the statistics take a
second fused pass. The output equals plain SDPA's to float32 rounding — the GEMM library sums a
wider product in another order for some sizes — not always bit for bit (tests/engine/test_forward_stats.py).
Cost: the kernel still multiplies the zero columns of Q', so the widened call costs about the plain
attention plus a second pass minus one softmax; the gain grows with N (docs/benchmarks.md).
"""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend

from .. import backend
from ..layout import by_kv_group, query_group, repeat_kv
from ..limits import USABLE, free_bytes
from ..records import ForwardStats


def cross_terms(query: torch.Tensor, e_key: torch.Tensor, scale: float, group: int) -> torch.Tensor:
    """(heads, group, q_pos): [a, b] = scale · q_b·E_{p_a}[k], b running over a's KV group, from
    query (heads, q_pos, d) and e_key (heads, q_pos, d). One batched product per layer."""
    h, n, _ = query.shape
    q = by_kv_group(query, group, 0).permute(0, 2, 3, 1)  # (kv_head, q_pos, d, b)
    e = by_kv_group(e_key, group, 0).permute(0, 2, 1, 3)  # (kv_head, q_pos, a, d)
    c = backend.matmul_ieee(e, q)  # (kv_head, q_pos, a, b), never TF32
    return c.permute(0, 2, 3, 1).reshape(h, group, n).mul_(scale)


def fusable(module, query, key, value, mask, dropout: float, scaling, is_causal: bool, kwargs) -> bool:
    """Whether transformers' SDPA call for this layer would run the CPU flash kernel, in float32,
    on the square prefill the widened call reproduces (else: the layer runs as before)."""
    if backend.kind(query.device) != "cpu" or dropout:
        return False
    if any(t.dtype != torch.float32 for t in (query, key, value)):
        return False
    if query.shape[0] != 1 or query.shape[2] != key.shape[2] or kwargs.get("cache") is not None:
        return False
    if query.shape[1] % key.shape[1] or key.shape[1] != value.shape[1]:
        return False
    if mask is not None and (mask.dim() != 4 or mask.shape[0] != 1 or mask.shape[1] != 1):
        return False
    width = query.shape[-1] + value.shape[-1] + 1  # Q', K' = V' and the output, float32
    if 4 * width * query.shape[2] * (2 * query.shape[1] + key.shape[1]) > USABLE * free_bytes(query.device):
        return False  # the plain call fits where the widened one would not: the second pass then
    causal = query.shape[2] > 1 and mask is None and is_causal
    group = query_group(query.shape[1], key.shape[1])
    k, v = key, value
    if group > 1 and not (mask is None and key.shape[-1] == value.shape[-1] <= 256):  # use_gqa_in_sdpa
        k, v = repeat_kv(key, group), repeat_kv(value, group)
    try:
        choice = torch._fused_sdp_choice(
            query, k, v, mask, dropout, causal, scale=scaling, enable_gqa=k is key and group > 1
        )
    except RuntimeError:
        return False
    return int(choice) == SDPBackend.FLASH_ATTENTION.value


def forward_with_stats(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    is_causal: bool,
) -> tuple[torch.Tensor, ForwardStats]:
    """The layer's output (1, q_pos, heads, d_v) and its `ForwardStats`, from one widened flash
    call (see the module docstring). Inputs as transformers passes them: (1, heads, pos, d)."""
    _, h, n, d = query.shape
    n_kv, d_v = key.shape[1], value.shape[-1]
    width = d + d_v + 1
    q1 = query.new_zeros(1, h, n, width)
    q1[..., :d] = query
    kv = torch.empty(1, n_kv, n, width, dtype=query.dtype, device=query.device)
    kv[..., :d] = key
    kv[..., d : d + d_v] = value
    kv[..., -1] = torch.arange(n, dtype=query.dtype, device=query.device)
    bias = mask
    if mask is not None and mask.dtype == torch.bool:  # as SDPA converts a bool mask
        bias = torch.zeros(mask.shape, dtype=query.dtype, device=mask.device).masked_fill_(
            ~mask, float("-inf")
        )
    causal = n > 1 and mask is None and is_causal
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q1, kv, kv, 0.0, causal, attn_mask=bias, scale=scale
    )[:2]
    output = out[..., d : d + d_v].transpose(1, 2).contiguous()  # (1, q_pos, heads, d_v)
    stats = ForwardStats(
        lse=lse[0].float(),
        cross=cross_terms(query[0], out[0, ..., :d], scale, query_group(h, n_kv)),
        e_pos=out[0, ..., -1].contiguous(),
    )
    return output, stats
