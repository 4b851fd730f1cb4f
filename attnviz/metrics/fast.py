"""The per-head statistics from the fused kernels' log-sum-exp: no N×N tensor.

For one layer, `layer_pass` (attnviz.exact.lse) gives every query head's L_i, the cross terms
scale · q_b·E_{p_a}[k] (heads a, b of one KV group) and E_p[key_pos]_i: from the model's own
forward (``extract(statistics=True)``, attnviz.exact.statistics) or from one second fused attention
call. Then, per query row i (s_ij = scale · q_i·k_j):

- entropy            H_i = L_i - scale · q_i·E_p[k] [- E_p[b]]  (a head's own cross term)
- sink / prev / diag p_ij = exp(s_ij - L_i) at j = 0, i - 1, i   (0 where the mask forbids j)
- distance (causal)  i - E_p[key_pos]
- distance (bidir.)  2 m_i (i - E_c[key_pos]) + E_p[key_pos] - i, with the causal pass's
                     L^c and m_i = exp(L^c_i - L_i) the mass on keys <= i
- coherence          KL(a||b)_i = CE(a, b)_i - H^a_i, CE(a, b)_i = L^b_i - scale · q^b_i·E_{p^a}[k]
                     (heads a, b share K in a GQA group)
- induction          p_{i, i-len+1} = exp(s - L_i) on the probe

Each equals the dense definition in `attnviz.metrics.definitions` (tests: 1e-4 in float32).
"""

from __future__ import annotations

import torch

from ..exact.lse import LayerPass, MaskSpec, key_bias, layer_lse, layer_pass
from ..layout import by_kv_group, query_group
from ..records import CapturedAttention
from .definitions import key_counts

Sums = dict[str, tuple[torch.Tensor, torch.Tensor]]


def _allowed_at(q_pos: torch.Tensor, k_pos: torch.Tensor, spec: MaskSpec, n_k: int) -> torch.Tensor:
    """Bool per row: key k_pos[r] is a real key that query q_pos[r] may see."""
    ok = (k_pos >= 0) & (k_pos < n_k)
    if spec.causal:
        ok &= k_pos <= q_pos
    if spec.window is not None:
        ok &= k_pos > q_pos - spec.window
    return ok


def _grouped(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q (heads, rows, d) as (kv_head, group, rows, d), a view: k (kv_heads, key_pos, d) stays
    unexpanded (GQA without a copy)."""
    return by_kv_group(q, query_group(q.shape[0], k.shape[0]), 0)


def _prob_shifted(
    q: torch.Tensor,
    k: torch.Tensor,
    lse: torch.Tensor,
    scale: float,
    q0: int,
    shift: int,
    spec: MaskSpec,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """p[h, r] = exp(scale · q[h, r]·k[kv(h), q0 + r + shift] - L[h, r]) where allowed, else 0:
    the diagonal (shift 0), previous token (-1), induction target (1 - length), by slicing."""
    n_rows, n_k = q.shape[1], k.shape[1]
    qpos = torch.arange(q0, q0 + n_rows, device=q.device)
    ok = _allowed_at(qpos, qpos + shift, spec, n_k)
    s = q.new_zeros(q.shape[0], n_rows)
    lo, hi = max(0, -(q0 + shift)), min(n_rows, n_k - (q0 + shift))
    if hi > lo:
        a = q0 + shift
        dots = (_grouped(q[:, lo:hi], k) * k[:, None, a + lo : a + hi]).sum(-1)  # (kv_head, group, rows)
        s[:, lo:hi] = dots.flatten(0, 1)
    s = s * scale
    if bias is not None and hi > lo:  # the key-only bias b_h at key_pos q0 + r + shift
        s[:, lo:hi] += bias[:, q0 + shift + lo : q0 + shift + hi]
    return torch.where(ok, torch.exp(s - lse), 0.0)


def _prob_first(q, k, lse, scale: float, spec: MaskSpec, bias: torch.Tensor | None = None):
    """p[h, i] on key_pos 0 (the sink) for every row: one matrix-vector product per KV head."""
    qpos = torch.arange(q.shape[1], device=q.device)
    ok = _allowed_at(qpos, torch.zeros_like(qpos), spec, k.shape[1])
    s = torch.matmul(_grouped(q, k), k[:, None, 0, :, None])[..., 0].flatten(0, 1) * scale  # (h, q)
    if bias is not None:
        s = s + bias[:, :1]
    return torch.where(ok, torch.exp(s - lse), 0.0)


def _reduce(values: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    v = valid.to(values.dtype)
    return (values * v).sum(-1), v.sum(-1)


def _qk(cap: CapturedAttention) -> tuple[torch.Tensor, torch.Tensor]:
    """Query (heads, q, d) and key (kv_heads, k, d) in float32 (views when already float32)."""
    return cap.query[0].float(), cap.key[0].float()


def layer_sums(cap: CapturedAttention, spec: MaskSpec, group_size: int | None) -> tuple[Sums, str]:
    """Per-metric (sum over eligible rows, number of eligible rows) of every head of one layer,
    shaped (head,) — (kv_head,) for "gqa_coherence" — like the dense `_row_sums`; and where L
    and the expectations came from ("forward" or "fused": a second fused pass)."""
    lp: LayerPass = layer_pass(cap, spec)
    q, k = _qk(cap)  # (h, q, d), (kv_h, k, d)
    n_q, n_k = q.shape[1], k.shape[1]
    scale = cap.scaling
    qpos = torch.arange(n_q, device=q.device)
    counts = key_counts(qpos, n_k, causal=spec.causal, window=spec.window)
    informative = counts >= 2
    lse = lp.lse
    out: Sums = {}
    # H_i = L_i - scale * q_i . E_p[k]: each head's own cross term
    group = lp.cross.shape[1]
    own = torch.arange(q.shape[0], device=q.device) % group  # h's place j in its group (`by_kv_group`)
    raw_entropy = lse - lp.cross[torch.arange(q.shape[0], device=q.device), own]  # (h, q)
    log_len = torch.log(counts.clamp(min=2).float())
    out["entropy"] = _reduce((raw_entropy / log_len).clamp(0.0, 1.0), informative)
    kb = key_bias(cap)
    out["sink"] = _reduce(_prob_first(q, k, lse, scale, spec, kb), informative)
    prev_ok = informative & (qpos >= 1) & (qpos - 1 < n_k)
    out["previous_token"] = _reduce(_prob_shifted(q, k, lse, scale, 0, -1, spec, kb), prev_ok)
    diag = _prob_shifted(q, k, lse, scale, 0, 0, spec, kb)
    out["diagonal"] = _reduce(diag, informative & (qpos < n_k))
    fpos = qpos.float()
    if spec.causal:
        dist = fpos - lp.e_pos  # every allowed key is at or before the query
    else:
        assert lp.lse_causal is not None and lp.pos_causal is not None
        before = torch.exp(lp.lse_causal - lse)  # mass on keys <= i
        dist = 2.0 * before * (fpos - lp.pos_causal) + lp.e_pos - fpos
    out["distance"] = _reduce(dist, informative)
    if group_size and group_size > 1:
        if group_size != group:
            raise ValueError(f"group size {group_size} does not match the captured call's {group}")
        out["gqa_coherence"] = _coherence(lse, lp.cross, raw_entropy, informative, group)
    return out, lp.source


def _coherence(lse, cross, raw_entropy, informative, group) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum over rows and pairs of exp(-(KL(a||b) + KL(b||a)) / 2) per KV head, from the
    cross-entropies CE(a, b)_i = L^b_i - cross[a, b]_i (all pairs of a group at once)."""
    lg = by_kv_group(lse, group, 0)  # (kv_head, b, q)
    kl = lg[:, None] - by_kv_group(cross, group, 0) - by_kv_group(raw_entropy, group, 0)[:, :, None]  # [a, b]
    sym = kl + kl.transpose(1, 2)
    pairs = torch.ones(group, group, dtype=torch.bool, device=lse.device).triu(1)  # a < b
    valid = informative.float()
    total = (torch.exp(-0.5 * sym[:, pairs].clamp(min=0.0)) * valid).sum((-1, -2))  # (kv_head,)
    n_pairs = group * (group - 1) // 2
    rows = valid.sum() * n_pairs
    return total, rows.expand(total.shape[0])


def induction_sums(
    cap: CapturedAttention, spec: MaskSpec, rows: slice, length: int, start: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of p[i, i - length + 1] over the second copy's rows i of every head, and their number."""
    lse = layer_lse(cap, spec)[:, rows]  # (h, rows)
    q, k = _qk(cap)
    q = q[:, rows]
    n_k = k.shape[1]
    qpos = torch.arange(rows.start, rows.stop, device=q.device)
    ok = (qpos >= start + length) & (qpos < start + 2 * length) & (qpos - length + 1 < n_k)
    p = _prob_shifted(q, k, lse, cap.scaling, rows.start, 1 - length, spec, key_bias(cap))
    return _reduce(p, ok)[0], ok.float().sum()
