"""RWKV-4's WKV: exact per channel (rows are probabilities), summarised by contributions.

From what ``rwkv_linear_attention`` received (time_decay w, time_first u, key k, value v), per
channel c the output is a weighted mean of the values with weights

    A^c[t,·] = softmax_{s≤t}(ℓ),  ℓ_{t,s} = k_{s,c} − (t−1−s)·e^{w_c}  (s < t),  ℓ_{t,t} = u_c + k_{t,c}

(the kernel's running max only stabilises this). The block's output is out(σ(r_t) ⊙ wkv_t), so
the per-block picture is ‖c_{t,s}‖ with c_{t,s} = W_out (σ(r_t) ⊙ A[:, t, s] ⊙ v_s), the
receptance gate frozen at its forward value.
"""

from __future__ import annotations

import torch

from . import channels


def wkv_parts(inputs: dict) -> dict[str, torch.Tensor]:
    """k, v (S, ch), decay e^{w} and bonus u (ch,), gate σ(r) (T, ch) when tapped: float64."""
    k = inputs["key"][0].double()
    r = inputs.get("r_pre")
    return {
        "k": k,
        "v": inputs["value"][0].double(),
        "decay": inputs["time_decay"].double().exp(),
        "u": inputs["time_first"].double(),
        "gate": torch.ones_like(k) if r is None else torch.sigmoid(r[0].double()),
    }


def channel_rows(parts: dict, t: int) -> torch.Tensor:
    """float64 (ch, t + 1): row t of A^c for every channel (each row sums to 1)."""
    s = torch.arange(t + 1, dtype=torch.float64, device=parts["k"].device)
    logits = parts["k"][: t + 1] - (t - 1 - s)[:, None] * parts["decay"][None, :]  # (t + 1, ch)
    logits[t] = parts["u"] + parts["k"][t]
    return torch.softmax(logits, dim=0).T


def wkv_output(parts: dict, t: int) -> torch.Tensor:
    """(ch,): the WKV output at t, Σ_s A^c[t,s] v_s."""
    return (channel_rows(parts, t) * parts["v"][: t + 1].T).sum(-1)


def contribution_rows(parts: dict, weight: torch.Tensor, rows: list[int], n: int) -> torch.Tensor:
    """float64 (len(rows), S): ‖W_out (σ(r_t) ⊙ A[:, t, s] ⊙ v_s)‖ (0 for s > t)."""
    return channels.contribution_rows(
        lambda t: channel_rows(parts, t), parts["v"], parts["gate"], weight, rows, n
    )


def contribution_sum(parts: dict, weight: torch.Tensor, bias: torch.Tensor | None, t: int) -> torch.Tensor:
    """Σ_s c_{t,s} (+ bias): (hidden,), vs the block's attention output at t."""
    return channels.through_projection(wkv_output(parts, t) * parts["gate"][t], weight, bias)


def channel_terms(parts: dict) -> channels.ChannelTerms:
    """Σ_s terms of the output (nothing comes from no token), for routes."""
    values = parts["v"]
    return channels.ChannelTerms(
        lambda t: channel_rows(parts, t), values, parts["gate"], channels.no_rest(values)
    )
