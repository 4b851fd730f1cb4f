"""One Mamba-2 (SSD) or Gated DeltaNet layer by hand, for learners: the recurrence token by token,
the closed form (the effective attention A), and the model's own output, side by side.

Both mixers carry a state from token to token, yet each output is a weighted sum of the value
vectors, y_t = Σ_s A[t,s] v_s, because every step is linear in the values once the gates are fixed.

Gated DeltaNet, per value head (q, k L2-normalised, q scaled by d_k^-1/2, as the kernel uses them)::

    S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ      # (d_k, d_v) state
    o_t = S_tᵀ q_t
    A   = (QKᵀ ⊙ Γ ⊙ tril) (I + L)⁻¹ diag(β),   Γ[t,s] = α_{s+1}⋯α_t,   L[t,s] = β_t Γ[t,s] k_t·k_s (s < t)

Mamba-2 / SSD, per head (Δ = softplus(dt + dt_bias), x the scan's input after the short conv)::

    h_t = exp(A_h Δ_t) h_{t−1} + Δ_t x_t B_tᵀ                 # (P, n) state
    y_t = h_t C_t + D_h x_t
    A[t,s] = (C_t·B_s) · exp(A_h (Δ_{s+1} + … + Δ_t)) · Δ_s    # y_t = Σ_s A[t,s] x_s + D_h x_t

The kernel's inputs come from one ordinary forward with attnviz's recorder (`capture`), prepared
the way the kernel prepares them (`attnviz.mixers.delta.delta_parts` / `ssd.ssd_parts`). All
arithmetic here is float64; the model ran in its own dtype (float32 on the CPU).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..capture import mixers as mixer_capture
from ..capture.hook import recording
from ..errors import BadIndex
from ..mixers import delta, ssd
from ..mixers.kinds import MIXERS
from ..records import CapturedMixer

FORMULAS = {  # what a page shows above the numbers (the module docstring's, one per kind)
    "gated_delta": "S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ      (d_k × d_v state)\n"
    "o_t = S_tᵀ q_t\n"
    "A   = (QKᵀ ⊙ Γ ⊙ tril) (I + L)⁻¹ diag(β)\n"
    "      Γ[t,s] = α_{s+1}⋯α_t,  L[t,s] = β_t Γ[t,s] k_t·k_s (s < t)\n"
    "o_t = Σ_s A[t,s] v_s",
    "mamba2": "h_t = exp(A_h Δ_t) h_{t−1} + Δ_t x_t B_tᵀ      (P × n state)\n"
    "y_t = h_t C_t + D_h x_t\n"
    "A[t,s] = (C_t·B_s) · exp(A_h (Δ_{s+1} + … + Δ_t)) · Δ_s\n"
    "y_t = Σ_s A[t,s] x_s + D_h x_t",
}
# The layers this walkthrough explains: those it has formulas for, each a per-head kind in the
# registry (its closed form is one signed A per head); the registry is asked, not repeated.
KINDS: tuple[str, ...] = tuple(k for k in FORMULAS if MIXERS[k].per_head)


@dataclass(frozen=True)
class Step:
    name: str
    description: str
    value: Any  # torch.Tensor while built, np.ndarray in a MixerWalkthrough


@dataclass(frozen=True)
class MixerWalkthrough:
    """One head of one block recomputed three ways; ``diffs``: max |Δ| of each against the kernel."""

    kind: str
    block: int
    head: int
    steps: tuple[Step, ...]  # the inputs as the kernel used them, then A
    recurrence: np.ndarray  # (N, d_v) outputs of the token-by-token recurrence
    closed_form: np.ndarray  # (N, N) A
    closed_output: np.ndarray  # (N, d_v) Σ_s A[t,s] v_s (+ D x_t for SSD)
    model_output: np.ndarray  # (N, d_v) what the model's kernel returned for this head
    state_norms: np.ndarray  # (N,) ‖S_t‖ (Frobenius) after each token
    diffs: dict[str, float]


def capture(lm, ids: list[int], block: int, kind: str) -> tuple[CapturedMixer, torch.Tensor]:
    """(record, full output) of block ``block``'s ``kind`` mixer for ``ids``: one forward under the
    model's lock with the recorder active only in this thread. The record keeps the kernel's
    output only at the self-check's rows, so the kernel is run once more on the captured inputs
    (outside the recorder, the model's own function) for every row; `walkthrough` checks that
    re-run against the forward's kept rows."""
    mixer_capture.install(lm.model)
    with recording({}) as rec:
        lm.forward(list(ids), logits_at="none")
    found = [r for r in rec.mixers if r.block == block and r.kind == kind]
    if len(found) != 1 or not found[0].function:
        raise BadIndex(f"block {block} ran {len(found)} {kind} kernel calls; the walkthrough needs one")
    record = found[0]
    module = dict(lm.model.named_modules())[record.module_name]
    kernel = getattr(sys.modules[type(module).__module__], record.function)
    with lm.lock, torch.inference_mode():
        out = kernel(**record.inputs)
    return record, (out[0] if isinstance(out, tuple) else out).detach()


def gdn_recurrence(q, k, v, alpha, beta) -> tuple[torch.Tensor, torch.Tensor]:
    """o (N, d_v) and ‖S_t‖ (N,) token by token: q, k (N, d_k), v (N, d_v), alpha, beta (N,)."""
    n, d_k = k.shape
    S = torch.zeros(d_k, v.shape[1], dtype=torch.float64)  # (d_k, d_v)
    out, norms = [], []
    for t in range(n):
        S = alpha[t] * (S - beta[t] * torch.outer(k[t], k[t] @ S))  # α_t (I − β_t k_t k_tᵀ) S_{t−1}
        S = S + beta[t] * torch.outer(k[t], v[t])  # + β_t k_t v_tᵀ
        out.append(S.T @ q[t])  # o_t = S_tᵀ q_t
        norms.append(torch.linalg.norm(S))
    return torch.stack(out), torch.stack(norms)


def gdn_closed_form(q, k, alpha, beta) -> torch.Tensor:
    """A (N, N) = (QKᵀ ⊙ Γ ⊙ tril)(I + L)⁻¹ diag(β), the UT form the chunked kernel solves."""
    n = q.shape[0]
    G = torch.cumsum(torch.log(alpha), 0)  # (N,) log α_1 + … + log α_t
    tril = torch.ones(n, n, dtype=torch.bool).tril()
    gamma = torch.exp((G[:, None] - G[None, :]).masked_fill(~tril, -torch.inf))  # Γ[t,s], 0 above
    L = (beta[:, None] * gamma * (k @ k.T)).tril(-1)  # (N, N) strictly lower
    eye = torch.eye(n, dtype=torch.float64)
    return ((q @ k.T) * gamma) @ torch.linalg.solve(eye + L, torch.diag(beta))


def ssd_recurrence(x, B, C, dt, A_dt, D) -> tuple[torch.Tensor, torch.Tensor]:
    """y (N, P) and ‖h_t‖ (N,) token by token: x (N, P), B, C (N, n), dt Δ and A_dt = A_h Δ (N,)."""
    h = torch.zeros(x.shape[1], B.shape[1], dtype=torch.float64)  # (P, n)
    out, norms = [], []
    for t in range(x.shape[0]):
        h = torch.exp(A_dt[t]) * h + dt[t] * torch.outer(x[t], B[t])  # decay, then write x_t B_tᵀ
        out.append(h @ C[t] + D * x[t])  # read with C_t, plus the skip D x_t
        norms.append(torch.linalg.norm(h))
    return torch.stack(out), torch.stack(norms)


def ssd_closed_form(B, C, dt, cum) -> torch.Tensor:
    """A (N, N)[t,s] = (C_t·B_s) · exp(cum_t − cum_s) · Δ_s for s ≤ t (cum: Σ_{r≤t} A_h Δ_r)."""
    n = B.shape[0]
    tril = torch.ones(n, n, dtype=torch.bool).tril()
    decay = torch.exp((cum[:, None] - cum[None, :]).masked_fill(~tril, -torch.inf))
    return (C @ B.T) * decay * dt[None, :]


def _max(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def walkthrough(
    rec: CapturedMixer, output: torch.Tensor, head: int, engine: np.ndarray | None = None
) -> MixerWalkthrough:
    """Head ``head`` of a captured GDN or SSD block, three ways (``rec``, ``output``: from
    `capture`); ``engine``: the (N, N) matrix `AttentionResult.head(b, h, mixer=kind)` drew,
    compared with the closed form too."""
    if rec.kind not in KINDS:
        raise BadIndex(f"the walkthrough covers {' and '.join(KINDS)}, not {rec.kind}")
    model = output[0][:, head].double().cpu()  # (N, d_v) the kernel's own output
    kept = list(rec.output_rows) or list(range(output.shape[1]))
    rerun = float((output[0][kept] - rec.output[0]).abs().max())  # the re-run is the forward's
    if rec.kind == "gated_delta":
        p = delta.delta_parts(rec.inputs)
        q, k, v = p["q"][:, head], p["k"][:, head], p["v"][:, head]  # (N, d)
        alpha, beta = p["a"][:, head, 0], p["beta"][:, head]  # (N,) scalar gates per token
        rec_out, norms = gdn_recurrence(q, k, v, alpha, beta)
        A = gdn_closed_form(q, k, alpha, beta)
        closed = A @ v
        steps = [
            Step("q", "queries as the kernel uses them: L2-normalised, times d_k^-1/2 (N, d_k)", q),
            Step("k", "keys, L2-normalised (N, d_k)", k),
            Step("v", "values (N, d_v)", v),
            Step("alpha", "decay α_t = exp(g_t) per token (N,)", alpha[:, None]),
            Step("beta", "write strength β_t per token (N,)", beta[:, None]),
            Step("A", "effective attention A = (QKᵀ ⊙ Γ ⊙ tril)(I + L)⁻¹ diag(β) (N, N)", A),
        ]
    else:
        p = ssd.ssd_parts(rec.inputs)
        x, B, C, dt, cum = (
            p["x"][:, head],
            p["B"][:, head],
            p["C"][:, head],
            p["dt"][:, head],
            p["cum"][:, head],
        )
        A_dt = torch.diff(cum, prepend=torch.zeros(1, dtype=cum.dtype))  # (N,) A_h Δ_t
        D = p["D"][head]
        rec_out, norms = ssd_recurrence(x, B, C, dt, A_dt, D)
        A = ssd_closed_form(B, C, dt, cum)
        closed = A @ x + D * x
        steps = [
            Step("x", "the scan's input x (after the short conv) (N, P)", x),
            Step("B", "B_t: what each token writes into the state (N, n)", B),
            Step("C", "C_t: how each token reads the state (N, n)", C),
            Step("dt", "Δ_t = softplus(dt + dt_bias), clamped (N,)", dt[:, None]),
            Step("A", "effective attention A[t,s] = (C_t·B_s)·exp(A_h Σ_{r=s+1..t} Δ_r)·Δ_s (N, N)", A),
        ]
    diffs = {
        "kernel re-run vs the forward (its kept rows)": rerun,
        "recurrence vs model": _max(rec_out, model),
        "closed form vs model": _max(closed, model),
        "recurrence vs closed form": _max(rec_out, closed),
    }
    if engine is not None:
        diffs["closed form vs attnviz's matrix"] = float(np.abs(A.numpy() - engine).max())
    return MixerWalkthrough(
        kind=rec.kind,
        block=rec.block,
        head=head,
        steps=tuple(Step(s.name, s.description, s.value.numpy()) for s in steps),
        recurrence=rec_out.numpy(),
        closed_form=A.numpy(),
        closed_output=closed.numpy(),
        model_output=model.numpy(),
        state_norms=norms.numpy(),
        diffs=diffs,
    )
