"""Mamba-2 / SSD effective attention, per head, from what ``mamba2_chunk_scan`` received.

    M_h[t,s] = (C_t·B_s) · exp(A_h Σ_{r=s+1..t} Δ_r) · Δ_s,   Δ = clamp(softplus(dt + dt_bias), dt_limit)

so that y_t = Σ_s M_h[t,s] x_s + D_h x_t with x the scan's own input (post short conv). B and C
are shared by the heads of a group (transformers' ``repeat_interleave`` order). The log-decay
cumsum runs in float64 (a float32 global cumsum drifts by ~1e-3 relative at 32k tokens). The
readable token-by-token recurrence is `attnviz.mixers.reference.ssd_dense`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..layout import query_group, repeat_kv

TIME_PARTS = ("x", "dt", "B", "C", "gate")  # along S ("cum" runs on): a decode step's join its forward's


def _per_head(t: torch.Tensor, name: str, keep: int) -> torch.Tensor:
    """A per-head value the step kernel got expanded over its trailing axes (dt (B, nh, hs),
    A (nh, hs, n)), as one per head; refused where the expanded values differ (a kernel called
    with untied head dims, which the prefill layout has no place for)."""
    flat = t.reshape(*t.shape[:keep], -1)
    one = flat[..., :1]
    if not torch.equal(flat, one.expand_as(flat)):
        raise ValueError(f"the decode step's {name} differs across a head's channels")
    return one[..., 0]


def step_inputs(inputs: dict, output: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """A ``mamba2_selective_state_update`` call (one token: x, dt, z (B, nh, hs), A (nh, hs, n),
    B, C (B, groups, n), D, dt_bias (nh, hs); the state updated in place and not kept) in
    ``mamba2_chunk_scan``'s layout (B, 1, nh, hs). Falcon-H1 passes its gate z into the step
    kernel (its prefill gates after the scan): z is kept, and the check applies it (``gate``)."""
    D, bias, z = inputs.get("D"), inputs.get("dt_bias"), inputs.get("z")
    return {
        "hidden_states": inputs["hidden_states"][:, None],
        "dt": _per_head(inputs["dt"], "dt", 2)[:, None],
        "A": _per_head(inputs["A"], "A", 1),
        "B": inputs["B"][:, None],
        "C": inputs["C"][:, None],
        "D": None if D is None else _per_head(D, "D", 1),
        "dt_bias": None if bias is None else _per_head(bias, "dt_bias", 1),
        "dt_softplus": bool(inputs.get("dt_softplus")),
        "z": None if z is None else z[:, None],
    }, output[:, None]


def ssd_parts(inputs: dict) -> dict[str, torch.Tensor]:
    """x (S, nh, hs), dt Δ (S, nh), cum Σ AΔ (S, nh), B, C (S, nh, n) per head, D (nh,): float64."""
    x = inputs["hidden_states"][0].double()  # (S, nh, hs)
    n_heads = x.shape[1]
    dt = inputs["dt"][0].double()  # (S, nh)
    if inputs.get("dt_bias") is not None:
        dt = dt + inputs["dt_bias"].double()
    if inputs.get("dt_softplus"):
        dt = F.softplus(dt)
    lo, hi = inputs.get("dt_limit", (0.0, float("inf")))
    dt = dt.clamp(min=lo, max=hi)
    group = query_group(n_heads, inputs["B"].shape[2])  # head h reads B, C group h // group
    # contiguous: the copy repeat_interleave always made (the walkthrough's products see one layout)
    B = repeat_kv(inputs["B"][0].double(), group, dim=1).contiguous()  # (S, nh, n)
    C = repeat_kv(inputs["C"][0].double(), group, dim=1).contiguous()
    cum = torch.cumsum(inputs["A"].double() * dt, dim=0)  # (S, nh) Σ_{r<=t} A_h Δ_r
    D = inputs.get("D")
    D = (
        torch.zeros(n_heads, dtype=torch.float64, device=x.device)
        if D is None
        else D.double().reshape(n_heads, -1)[:, 0]
    )
    parts = {"x": x, "dt": dt, "cum": cum, "B": B, "C": C, "D": D.to(x.device)}
    if inputs.get("z") is not None:  # a gate inside the kernel (Falcon-H1's decode step), frozen
        parts["gate"] = F.silu(inputs["z"][0].double())  # (S, nh, hs)
    return parts


def ssd_rows(parts: dict, heads: Sequence[int], rows: torch.Tensor) -> torch.Tensor:
    """float64 (nh', T, S) for nh' = len(heads), T = len(rows): rows ``rows`` of M_h for each head."""
    hs = torch.as_tensor(list(heads), device=parts["x"].device)
    rows = rows.to(parts["x"].device)
    n = parts["x"].shape[0]
    C = parts["C"][rows][:, hs].transpose(0, 1)  # (nh', T, n)
    B = parts["B"][:, hs].transpose(0, 1)  # (nh', S, n)
    scores = C @ B.transpose(1, 2)  # (nh', T, S)  C_t·B_s
    cum = parts["cum"][:, hs].T  # (nh', S)
    causal = rows[:, None] >= torch.arange(n, device=rows.device)[None, :]  # (T, S)
    log_decay = (cum[:, rows, None] - cum[:, None, :]).masked_fill(~causal, -torch.inf)
    return scores * log_decay.exp() * parts["dt"][:, hs].T[:, None, :]


def ssd_outputs(parts: dict, matrix: torch.Tensor, heads: Sequence[int], rows: torch.Tensor) -> torch.Tensor:
    """Σ_s M[t,s] x_s + D x_t for ``rows``: (T, nh', hs), to compare with the scan's output."""
    hs = list(heads)
    x = parts["x"][:, hs].transpose(0, 1)  # (nh', S, hs)
    y = matrix @ x  # (nh', T, hs)
    y = y + parts["D"][hs][:, None, None] * x[:, rows]
    return y.transpose(0, 1)


def n_heads(inputs: dict) -> int:
    """nh of a captured ``mamba2_chunk_scan`` call (hidden_states: (B, S, nh, hs))."""
    return int(inputs["hidden_states"].shape[2])


def core_output(parts: dict, rows: torch.Tensor) -> torch.Tensor:
    """The scan's output at query ``rows`` rebuilt from every head's M (the self-check's side)."""
    heads = list(range(parts["x"].shape[1]))
    out = ssd_outputs(parts, ssd_rows(parts, heads, rows), heads, rows)
    gate = parts.get("gate")
    return out if gate is None else out * gate[rows.to(gate.device)]
