"""What every per-channel mixer shares: its exact per-token contributions through the output
projection, and the check's rebuilt core output row by row.

A per-channel mixer (Mamba-1, RWKV-4's WKV, RG-LRU) has one matrix A^c per channel c (ch of
them, no heads), so its per-block picture is the size of each source token's contribution to the
mixer's output, c_{t,s} = W_out (g_t ⊙ A[:, t, s] ⊙ v_s), with its output gate g_t frozen at its
forward value (ones where it has none). Shapes use the glossary of `attnviz.reference.attention`
(T query positions, S key positions) and ``ch`` for a mixer's channels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

RowsOf = Callable[[int], torch.Tensor]  # query position t -> float64 (ch, t + 1): row t of every A^c


@dataclass(frozen=True)
class ChannelTerms:
    """A per-channel mixer's output at t as vectors by source token, before the projection:

        inner_t = Σ_s g_t ⊙ rows_of(t)[:, s] ⊙ values_s  +  g_t ⊙ rest_of(t)

    ``rows_of(t)`` holds a per-channel skip (Mamba-1's D ⊙ x_t) on its diagonal, as token t's own
    contribution; ``rest_of(t)`` is what comes from no token (LFM2's conv bias, C_t ⊙ b)."""

    rows_of: RowsOf
    values: torch.Tensor  # (S, ch) float64
    gate: torch.Tensor  # (T, ch) float64: the frozen output gate (ones where there is none)
    rest_of: Callable[[int], torch.Tensor]  # t -> (ch,) float64


def no_rest(values: torch.Tensor) -> Callable[[int], torch.Tensor]:
    zero = values.new_zeros(values.shape[1])
    return lambda _t: zero


def contribution_rows(
    rows_of: RowsOf, values: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, rows: list[int], n: int
) -> torch.Tensor:
    """float64 (len(rows), S): ‖W_out (g_t ⊙ A[:, t, s] ⊙ v_s)‖ for each query row t (0 for s > t).

    ``values`` (S, ch) are the vectors A weighs, ``gate`` (T, ch) the frozen output gate."""
    w = weight.double()
    out = torch.zeros(len(rows), n, dtype=torch.float64, device=values.device)
    for i, t in enumerate(rows):
        vec = rows_of(t).T * values[: t + 1] * gate[t]  # (t + 1, ch)
        out[i, : t + 1] = torch.linalg.vector_norm(vec @ w.T, dim=-1)
    return out


def through_projection(inner: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """W_out · inner (+ bias): (hidden,), the mixer's output at one position from its inner vector
    (Σ_s of every contribution, skip terms and gates included)."""
    out = weight.double() @ inner
    return out if bias is None else out + bias.double()


def each_row(output_at: Callable[[dict, int], torch.Tensor]) -> Callable[[dict, torch.Tensor], torch.Tensor]:
    """A self-check reference (parts, query rows) -> (T, ch) from a one-row rebuild of the core output."""

    def rebuilt(parts: dict, rows: torch.Tensor) -> torch.Tensor:
        return torch.stack([output_at(parts, int(t)) for t in rows])

    return rebuilt
