"""The LFM2 gated short convolution: exact per channel (a K-band), summarised by contributions.

From in_proj's output (B, C, x, each (S, ch)) and the depthwise conv weight w (ch, K) that
``causal_conv1d_fn`` received, per channel c:

    A^c[t,s] = C_{t,c} · w_{c, K-1-(t-s)} · B_{s,c}   for 0 ≤ t-s < K,   y_t = Σ_s A^c[t,s] x_s (+ C_t·bias)

There are ch matrices and no heads, so the per-block picture is the norm of each source token's
contribution through out_proj, c_{t,s} = W_out (A[:, t, s] ⊙ x_s), with C_t frozen at its forward
value (it is: the gate is the forward's own C).
"""

from __future__ import annotations

import torch

from . import channels


def conv_parts(inputs: dict) -> dict[str, torch.Tensor]:
    """B, C, x (S, ch), w (ch, K), bias (ch,) (zeros without one): float64."""
    bcx = inputs["BCx"][0].double()  # (S, 3·ch)
    B, C, x = bcx.chunk(3, dim=-1)
    w = inputs["weight"].double()
    bias = inputs.get("bias")
    return {
        "B": B,
        "C": C,
        "x": x,
        "w": w.reshape(w.shape[0], -1),
        "bias": torch.zeros(w.shape[0], dtype=torch.float64, device=w.device)
        if bias is None
        else bias.double(),
    }


def channel_band(parts: dict, t: int) -> torch.Tensor:
    """float64 (ch, S): row t of A^c for every channel (non-zero only for t-K < s ≤ t)."""
    d, k = parts["w"].shape
    n = parts["x"].shape[0]
    out = torch.zeros(d, n, dtype=torch.float64, device=parts["x"].device)
    for lag in range(min(k, t + 1)):  # s = t - lag
        s = t - lag
        out[:, s] = parts["C"][t] * parts["w"][:, k - 1 - lag] * parts["B"][s]
    return out


def conv_output(parts: dict, t: int) -> torch.Tensor:
    """(ch,): the conv's output at t (before the C gate), rebuilt as causal_conv1d_fn computes it."""
    k = parts["w"].shape[1]
    u = parts["bias"].clone()
    for lag in range(min(k, t + 1)):
        u = u + parts["w"][:, k - 1 - lag] * parts["B"][t - lag] * parts["x"][t - lag]
    return u


def contribution_rows(parts: dict, weight: torch.Tensor, rows: list[int], n: int) -> torch.Tensor:
    """float64 (len(rows), S): ‖W_out (A[:, t, s] ⊙ x_s)‖ (the C gate is inside A; 0 for s > t)."""
    x = parts["x"]
    ungated = x.new_ones(x.shape[0], 1)  # no gate outside A: C_t is inside it
    return channels.contribution_rows(
        lambda t: channel_band(parts, t)[:, : t + 1], x, ungated, weight, rows, n
    )


def contribution_sum(parts: dict, weight: torch.Tensor, bias: torch.Tensor | None, t: int) -> torch.Tensor:
    """Σ_s c_{t,s} + W_out(C_t ⊙ conv bias) + out bias: (hidden,), vs the mixer's output at t."""
    inner = (channel_band(parts, t) * parts["x"].T).sum(-1) + parts["C"][t] * parts["bias"]
    return channels.through_projection(inner, weight, bias)


def channel_terms(parts: dict) -> channels.ChannelTerms:
    """Σ_s terms of the output; the conv bias C_t ⊙ b comes from no token (the rest)."""
    x = parts["x"]
    return channels.ChannelTerms(
        lambda t: channel_band(parts, t)[:, : t + 1],
        x,
        x.new_ones(x.shape),
        lambda t: parts["C"][t] * parts["bias"],
    )
