"""The delta rule's effective attention (Gated DeltaNet and Kimi delta attention), per value head.

With the kernel's own q, k (L2-normalised when ``use_qk_l2norm_in_kernel``, q scaled by hs_k^-1/2,
key heads repeated for their value heads), decays a_t = exp(g_t) (a scalar per head for GDN, per
key channel for KDA) and β_t, the state runs S_t = M_t S_{t-1} + β_t k_t v_tᵀ with
M_t = (I − β_t k_t k_tᵀ) Diag(a_t), o_t = S_tᵀ q_t. Every transition acts on the key side, so

    o_t = Σ_s A[t,s] v_s,   A[t,s] = β_s k_sᵀ (M_t⋯M_{s+1})ᵀ q_t

is one scalar per (t, s, head). Rows come from a backward scan, r ← q_t, then for s = t..0:
A[t,s] = β_s k_s·r and r ← Diag(a_s)(r − β_s k_s (k_s·r)) (`scan_rows`: O(N·d) per row). Many rows
share a chunked scan (`chunked_rows`): per chunk [a, b) the C steps build W[s] = β_s k_sᵀ Q_s and
Q_a = M_aᵀ⋯M_{b-1}ᵀ once (d×d), and every row after the chunk reads A[t, a:b] = W r and carries
r ← Q_a r, so a full (T, S) head is T·S·hs_k flops in matrix products. The token-by-token oracle is
`attnviz.mixers.reference.delta_dense`. Everything runs in float64.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..layout import query_group, repeat_kv

CHUNK = 64
TIME_PARTS = ("q", "k", "a", "beta", "v")  # along S: a decode step's parts join its forward's
Emit = Callable[[torch.Tensor, int, int, torch.Tensor], None]  # (row indices, lo, hi, block)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)  # transformers' / FLA's l2norm


def delta_parts(inputs: dict) -> dict[str, torch.Tensor]:
    """q, k (S, nh, hs_k) as the kernel uses them, a (S, nh, hs_k) decays, beta (S, nh), v (S, nh, hs_v)."""
    q, k, v = (inputs[n][0] for n in ("query", "key", "value"))
    n_v = v.shape[1]
    if q.shape[1] != n_v:  # grouped value heads: each key head serves n_v // n_k value heads
        q = repeat_kv(q, query_group(n_v, q.shape[1]), dim=1)  # value head h reads key head h // group
        k = repeat_kv(k, query_group(n_v, k.shape[1]), dim=1)
    q, k = q.float(), k.float()  # the kernel normalises in float32
    if inputs.get("use_qk_l2norm_in_kernel"):
        q, k = _l2norm(q), _l2norm(k)
    q, k = q.double() * q.shape[-1] ** -0.5, k.double()
    g = inputs["g"][0].double()
    a = g.exp()[..., None].expand_as(k) if g.dim() == 2 else g.exp()  # (S, nh, hs_k)
    return {"q": q, "k": k, "a": a, "beta": inputs["beta"][0].double(), "v": v.double()}


def delta_rows(parts: dict, heads: Sequence[int], rows: torch.Tensor) -> torch.Tensor:
    """float64 (nh', T, S) for nh' = len(heads), T = len(rows): the chunked scan for many rows,
    the plain one for few."""
    if len(rows) * 4 < parts["q"].shape[-1]:
        return scan_rows(parts, heads, rows)
    return chunked_rows(parts, heads, rows)


def _head_parts(parts: dict, heads: Sequence[int]):
    hs = list(heads)
    if hs == list(range(parts["q"].shape[1])):  # every head: the tensors themselves (a list index copies)
        return (parts[n] for n in ("q", "k", "a", "beta"))
    return (parts[n][:, hs] for n in ("q", "k", "a", "beta"))


def scan_rows(parts: dict, heads: Sequence[int], rows: torch.Tensor) -> torch.Tensor:
    """The backward scan, all ``rows`` at once (a row joins when s reaches its position)."""
    q, k, a, beta = _head_parts(parts, heads)
    n, h, d = q.shape
    positions = rows.tolist()
    out = q.new_zeros(h, len(positions), n)
    r = q.new_zeros(h, len(positions), d)
    start = {t: i for i, t in enumerate(positions)}
    for s in range(max(positions), -1, -1):
        if s in start:
            r[:, start[s]] = q[s]
        dot = r @ k[s][:, :, None]  # (nh', T, 1)  k_s·r
        out[:, :, s] = beta[s][:, None] * dot[..., 0]
        r = a[s][:, None, :] * (r - beta[s][:, None, None] * k[s][:, None, :] * dot)
    return out


def chunked_rows(
    parts: dict, heads: Sequence[int], rows: torch.Tensor, chunk: int = CHUNK, emit: Emit | None = None
) -> torch.Tensor:
    """The same rows by chunks: C sequential steps per chunk on d×d matrices, the rest matmuls.

    ``emit(row_indices, lo, hi, block)`` receives each computed (nh', rows, hi - lo) block instead
    (a pooled view never holds the (T, S) matrix); the return value is then empty."""
    q, k, a, beta = _head_parts(parts, heads)
    n, h, d = q.shape
    rows_l = rows.tolist()
    out = q.new_zeros(h, len(rows_l), n if emit is None else 0)
    r = q.new_zeros(h, len(rows_l), d)  # each row's r at the start of the chunk above
    rows_t = torch.as_tensor(rows_l, device=q.device)
    eye = torch.eye(d, dtype=q.dtype, device=q.device).expand(h, d, d)
    last = max(rows_l)
    for lo in range(last - last % chunk, -1, -chunk):
        hi = min(lo + chunk, last + 1)
        after = (rows_t >= hi).nonzero()[:, 0]  # rows past this chunk: r arrives at hi
        inside = ((rows_t >= lo) & (rows_t < hi)).nonzero()[:, 0]
        w = q.new_zeros(h, hi - lo, d)  # W[s] = β_s k_sᵀ Q_s
        qm = eye.clone()  # Q_s = M_{s+1}ᵀ⋯M_{hi-1}ᵀ as a left factor on r (r ↦ Q r)
        r_in = q.new_zeros(h, len(inside), d)
        block_in = q.new_zeros(h, len(inside), hi - lo)
        pos_in = rows_t[inside].tolist()
        for s in range(hi - 1, lo - 1, -1):
            ks, bs, as_ = k[s], beta[s], a[s]  # (nh', hs_k), (nh',), (nh', hs_k)
            w[:, s - lo] = bs[:, None] * (ks[:, None, :] @ qm)[:, 0]
            # Q ← M_sᵀ Q = Diag(a_s)(I − β_s k_s k_sᵀ) Q
            qm = as_[:, :, None] * (qm - bs[:, None, None] * ks[:, :, None] * (ks[:, None, :] @ qm))
            for j, t in enumerate(pos_in):  # rows inside the chunk: the plain scan
                if t == s:
                    r_in[:, j] = q[s]
            if len(pos_in):
                dot = r_in @ ks[:, :, None]
                block_in[:, :, s - lo] = bs[:, None] * dot[..., 0]
                r_in = as_[:, None, :] * (r_in - bs[:, None, None] * ks[:, None, :] * dot)
        if len(after):
            block_after = r[:, after] @ w.transpose(1, 2)
            if emit is None:
                out[:, after, lo:hi] = block_after
            else:
                emit(after, lo, hi, block_after)
            r[:, after] = r[:, after] @ qm.transpose(1, 2)
        if len(inside):
            if emit is None:
                out[:, inside, lo:hi] = block_in
            else:
                emit(inside, lo, hi, block_in)
            r[:, inside] = r_in
    return out


def delta_outputs(parts: dict, matrix: torch.Tensor, heads: Sequence[int]) -> torch.Tensor:
    """Σ_s A[t,s] v_s: (T, nh', hs_v), to compare with the kernel's output."""
    v = parts["v"][:, list(heads)].transpose(0, 1)  # (nh', S, hs_v)
    return (matrix @ v).transpose(0, 1)


def n_heads(inputs: dict) -> int:
    """nh, the value heads of a captured delta-rule call (value: (B, S, nh, hs_v))."""
    return int(inputs["value"].shape[2])


def core_output(parts: dict, rows: torch.Tensor) -> torch.Tensor:
    """The kernel's output at query ``rows`` rebuilt from every head's A (the self-check's side)."""
    heads = list(range(parts["v"].shape[1]))
    return delta_outputs(parts, delta_rows(parts, heads, rows), heads)
