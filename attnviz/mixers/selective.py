"""Mamba-1 (selective scan): exact per channel, summarised per block by token contributions.

Per channel c (A_c ∈ R^n diagonal, B and C shared by all channels), from what
``mamba_selective_scan`` received:

    M^c[t,s] = Σ_n C_{t,n} B_{s,n} Δ_{s,c} exp(A_{c,n} Σ_{r=s+1..t} Δ_{r,c})

and y^c_t = (Σ_s M^c[t,s] x^c_s + D_c x^c_t) · silu(z^c_t). There are ch (d_inner) matrices and no
heads, so the exact per-block picture is the size of each source token's contribution to the
mixer's output, with the gate silu(z_t) frozen at its forward value and pushed through out_proj:
c_{t,s} = W_out (silu(z_t) ⊙ M[:, t, s] ⊙ x_s), and Σ_s c_{t,s} + W_out(silu(z_t) ⊙ D ⊙ x_t) + b
is the mixer's output. The oracle is `attnviz.mixers.reference.selective_dense`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import channels

TIME_PARTS = ("x", "dt", "B", "C", "gate")  # along S ("cum" runs on): a decode step's join its forward's


def step_inputs(inputs: dict, output: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """A ``mamba_selective_state_update`` call (one token: x, dt, z (B, ch), B, C (B, n), the
    state updated in place and not kept) in ``mamba_selective_scan``'s layout (B, ch, 1)."""
    one = {k: inputs[k][..., None] for k in ("hidden_states", "dt", "B", "C")}
    z = inputs.get("z")
    return {
        **one,
        "A": inputs["A"],
        "D": inputs.get("D"),
        "z": None if z is None else z[..., None],
        "delta_bias": inputs.get("dt_bias"),
        "delta_softplus": bool(inputs.get("dt_softplus")),
    }, output[..., None]


def selective_parts(inputs: dict) -> dict:
    """x, Δ, cum ΣΔ, gate silu(z) (S, ch); A (ch, n); B, C (S, n); D (ch,): float64.
    Scans over channel groups (Zamba: ``inputs["groups"]``) give {"groups": [parts, ...]}, read
    below as the channels of all groups in order."""
    if "groups" in inputs:
        return {"groups": [selective_parts(g) for g in inputs["groups"]]}
    x = inputs["hidden_states"][0].double().T  # (S, ch)
    dt = inputs["dt"][0].double().T
    if inputs.get("delta_bias") is not None:
        dt = dt + inputs["delta_bias"].double()
    if inputs.get("delta_softplus"):
        dt = F.softplus(dt)
    z = inputs.get("z")
    gate = torch.ones_like(x) if z is None else F.silu(z[0].double().T)
    D = inputs.get("D")
    return {
        "x": x,
        "dt": dt,
        "cum": torch.cumsum(dt, dim=0),
        "A": inputs["A"].double(),
        "B": inputs["B"][0].double().T,  # (S, n)
        "C": inputs["C"][0].double().T,
        "D": torch.zeros(x.shape[1], dtype=x.dtype, device=x.device) if D is None else D.double(),
        "gate": gate,
    }


def _cat(parts: dict, key: str) -> torch.Tensor:
    """A per-channel part over every channel group (the last axis is the channel)."""
    if "groups" in parts:
        return torch.cat([_cat(g, key) for g in parts["groups"]], dim=-1)
    return parts[key]


def channel_rows(parts: dict, t: int, channels: slice | None = None) -> torch.Tensor:
    """float64 (channels, t + 1): row t of M^c for every channel (keys 0..t)."""
    if "groups" in parts:
        return torch.cat([channel_rows(g, t) for g in parts["groups"]])[channels or slice(None)]
    ch = channels or slice(None)
    A = parts["A"][ch]  # (c, n)
    gap = parts["cum"][t, ch][None, :] - parts["cum"][: t + 1, ch]  # (s, c) Σ_{r=s+1..t} Δ_r
    decay = torch.exp(gap[:, :, None] * A[None])  # (s, c, n)
    cb = parts["B"][: t + 1] * parts["C"][t]  # (s, n)
    return (decay * cb[:, None, :]).sum(-1).T * parts["dt"][: t + 1, ch].T  # (c, s)


def core_output(parts: dict, t: int) -> torch.Tensor:
    """(ch,): the scan's output at t rebuilt from the per-channel rows (gate included)."""
    m = channel_rows(parts, t)
    x, D, gate = (_cat(parts, k) for k in ("x", "D", "gate"))
    y = (m * x[: t + 1].T).sum(-1) + D * x[t]
    return y * gate[t]


def contribution_rows(parts: dict, weight: torch.Tensor, rows: list[int], n: int) -> torch.Tensor:
    """float64 (len(rows), S): ‖c_{t,s}‖ for each query row t (0 for s > t)."""
    x, gate = _cat(parts, "x"), _cat(parts, "gate")
    return channels.contribution_rows(lambda t: channel_rows(parts, t), x, gate, weight, rows, n)


def contribution_sum(parts: dict, weight: torch.Tensor, bias: torch.Tensor | None, t: int) -> torch.Tensor:
    """Σ_s c_{t,s} + the skip term + bias: (hidden,), to compare with the mixer's output at t."""
    return channels.through_projection(core_output(parts, t), weight, bias)


def channel_terms(parts: dict) -> channels.ChannelTerms:
    """Σ_s terms of the output (D ⊙ x_t on the diagonal: token t's own), for routes."""
    x, gate, D = _cat(parts, "x"), _cat(parts, "gate"), _cat(parts, "D")

    def rows_of(t: int) -> torch.Tensor:
        m = channel_rows(parts, t)
        m[:, t] += D
        return m

    return channels.ChannelTerms(rows_of, x, gate, channels.no_rest(x))
