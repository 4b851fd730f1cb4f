"""RecurrentGemma's RG-LRU: exact per channel, summarised by contributions.

From what ``RecurrentGemmaRglru._rnn_scan`` received (x̃ = the gated, normalised input
x·i·√(1−a²), and the recurrent gate a, zeroed at the reset position 0), per channel c:

    A^c[t,s] = Π_{r=s+1..t} a_{r,c},   y_t = Σ_s A^c[t,s] x̃_{s,c}

The block's output is linear_out(y_t ⊙ gelu-branch_t), so the per-block picture is ‖c_{t,s}‖ with
c_{t,s} = W_out (g_t ⊙ A[:, t, s] ⊙ x̃_s), the GeLU branch g frozen at its forward value. The
log-decay cumsum runs in float64.
"""

from __future__ import annotations

import torch

from . import channels


def rglru_parts(inputs: dict) -> dict[str, torch.Tensor]:
    """x̃ (S, ch), cumulative log a (S, ch), gate g (T, ch; ones when not tapped): float64."""
    x = inputs["hidden_states"][0].double()
    a = inputs["recurrent_gate"][0].double()
    log_a = torch.log(a[1:].clamp(min=1e-300))  # position 0 never enters a product r ≥ s + 1
    cum = torch.cat([torch.zeros_like(x[:1]), torch.cumsum(log_a, dim=0)])
    gate = inputs.get("gate")
    return {"x": x, "cum": cum, "gate": torch.ones_like(x) if gate is None else gate[0].double()}


def channel_rows(parts: dict, t: int) -> torch.Tensor:
    """float64 (ch, t + 1): row t of A^c for every channel."""
    return torch.exp(parts["cum"][t][None, :] - parts["cum"][: t + 1]).T


def rglru_output(parts: dict, t: int) -> torch.Tensor:
    return (channel_rows(parts, t) * parts["x"][: t + 1].T).sum(-1)


def contribution_rows(parts: dict, weight: torch.Tensor, rows: list[int], n: int) -> torch.Tensor:
    """float64 (len(rows), S): ‖W_out (g_t ⊙ A[:, t, s] ⊙ x̃_s)‖ (0 for s > t)."""
    return channels.contribution_rows(
        lambda t: channel_rows(parts, t), parts["x"], parts["gate"], weight, rows, n
    )


def contribution_sum(parts: dict, weight: torch.Tensor, bias: torch.Tensor | None, t: int) -> torch.Tensor:
    """Σ_s c_{t,s} (+ bias): (hidden,), vs the block's mixer output at t."""
    return channels.through_projection(rglru_output(parts, t) * parts["gate"][t], weight, bias)


def channel_terms(parts: dict) -> channels.ChannelTerms:
    """Σ_s terms of the output (nothing comes from no token), for routes."""
    values = parts["x"]
    return channels.ChannelTerms(
        lambda t: channel_rows(parts, t), values, parts["gate"], channels.no_rest(values)
    )
