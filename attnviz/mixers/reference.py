"""The textbook forms, token by token: the oracle every fast path in attnviz.mixers is tested
against (tiny inputs only: they are O(N²) Python steps and dense d×d products).

Each takes the parts its fast module builds from the kernel's inputs (float64) and returns the
whole (nh, T, S) matrix straight from the definition.
"""

from __future__ import annotations

import math

import torch


def ssd_dense(parts: dict) -> torch.Tensor:
    """M_h[t,s] = (C_t·B_s) · Π_{r=s+1..t} exp(A_h Δ_r) · Δ_s, one product at a time."""
    n, h = parts["dt"].shape
    step = torch.diff(parts["cum"], dim=0, prepend=torch.zeros_like(parts["cum"][:1]))  # A_h Δ_r
    out = torch.zeros(h, n, n, dtype=torch.float64)
    for head in range(h):
        for t in range(n):
            for s in range(t + 1):
                decay = math.prod(math.exp(float(step[r, head])) for r in range(s + 1, t + 1))
                cb = float(parts["C"][t, head] @ parts["B"][s, head])
                out[head, t, s] = cb * decay * float(parts["dt"][s, head])
    return out


def delta_dense(parts: dict) -> torch.Tensor:
    """A[t,s] = β_s k_sᵀ (M_t⋯M_{s+1})ᵀ q_t with M_r = (I − β_r k_r k_rᵀ) Diag(a_r) built as matrices."""
    q, k, a, beta = parts["q"], parts["k"], parts["a"], parts["beta"]
    n, h, d = q.shape
    out = torch.zeros(h, n, n, dtype=torch.float64)
    eye = torch.eye(d, dtype=torch.float64)
    for head in range(h):
        m = [
            (eye - beta[r, head] * torch.outer(k[r, head], k[r, head])) @ torch.diag(a[r, head])
            for r in range(n)
        ]
        for t in range(n):
            prod = eye.clone()  # M_t⋯M_{s+1}
            for s in range(t, -1, -1):
                out[head, t, s] = beta[s, head] * k[s, head] @ prod.T @ q[t, head]
                prod = prod @ m[s]
    return out


def selective_dense(parts: dict, channel: int) -> torch.Tensor:
    """Mamba-1's M^c[t,s] = Σ_n C_{t,n} B_{s,n} Δ_{s,c} Π_{r=s+1..t} exp(A_{c,n} Δ_{r,c})."""
    n = parts["dt"].shape[0]
    out = torch.zeros(n, n, dtype=torch.float64)
    A, dt = parts["A"][channel], parts["dt"][:, channel]
    for t in range(n):
        for s in range(t + 1):
            decay = torch.ones_like(A)
            for r in range(s + 1, t + 1):
                decay = decay * torch.exp(A * dt[r])
            out[t, s] = (parts["C"][t] * parts["B"][s] * decay).sum() * dt[s]
    return out


def lightning_dense(parts: dict) -> torch.Tensor:
    """A_h[t,s] = (q_t·k_s) · Π_{r=s+1..t} e^{-λ_h}: the state decays once per step."""
    q, k, lam = parts["q"], parts["k"], parts["slope"]
    n, h, _ = q.shape
    out = torch.zeros(h, n, n, dtype=torch.float64)
    for head in range(h):
        for t in range(n):
            decay = 1.0
            for s in range(t, -1, -1):
                out[head, t, s] = float(q[t, head] @ k[s, head]) * decay
                decay *= math.exp(-float(lam[head]))
    return out
