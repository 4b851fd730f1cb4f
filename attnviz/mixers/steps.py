"""Cached decode steps of a recurrent mixer, joined to the forward they continue.

A decode step hands the mixer's kernel one token and the state the earlier tokens left
(``fused_recurrent_gated_delta_rule(..., initial_state=...)``, Mamba's and Mamba-2's
``selective_state_update(state, ...)``). The state is a sum over those tokens, so a step alone
has no row over them. But every part a row is built from is per token (x_s, Δ_s, B_s, C_s for
SSD; q, k, a, β, v for the delta rule), so the parts of a prefill and of each following step,
joined along the token axis, are the parts of the whole sequence, and the new token's row
A[t, :t+1] follows from them at O(t) per head:

    parts(prefill ‖ step_1 ‖ … ‖ step_k) = cat(parts(prefill), parts(step_1), …)   # "cum" runs on

The self-check then holds the join to account: at every step's row, Σ_s A[t,s] v_s (+ skip)
rebuilt from the joined parts must equal what the step kernel returned, which it computed from
the cache's real state. A join that missed a token, or a cache that was reset, fails there.
A record that continues a state no captured record started is refused with that reason.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..records import CapturedMixer

STATE_ARGUMENTS = ("initial_state", "initial_states", "state")  # the state a call continues from
CONTINUES = "continues"  # inputs key: True when the call continued a state (never kept itself)


def continues(record: CapturedMixer) -> bool:
    """Whether ``record``'s call started from a state left by earlier tokens."""
    return bool(record.inputs.get(CONTINUES))


def join(group: Sequence[CapturedMixer], channels_first: bool) -> CapturedMixer | str:
    """One record for a forward and the calls that continued it, in call order (or why not)."""
    first = group[0]
    where = f"block {first.block}'s {first.kind} mixer"
    if continues(first):
        return (
            f"{where} continued a state from tokens no captured call saw (a cached decode step "
            "on its own): its rows need the forward that started that state"
        )
    if any(not continues(r) for r in group[1:]):
        return (
            f"{where} ran several scans from an empty state in one record (Zamba's one scan per "
            "channel group): its decode steps are not joined to them"
        )
    refused = next((r.inputs["refused"] for r in group if "refused" in r.inputs), None)
    if refused is not None:
        return f"{where}: {refused}"
    axis = 2 if channels_first else 1
    rows: list[int] = []
    outputs, projected, scales = [], [], []
    offset = 0
    for r in group:
        n = r.n_tokens or int(r.output.shape[axis])
        kept = list(r.output_rows) or list(range(n))
        rows += [offset + i for i in kept]
        outputs.append(r.output)
        projected.append(r.out_out)
        scales.append(r.scale)
        offset += n
    steps = group[1:]
    function = first.function
    if steps:
        function += f" + {len(steps)} × {steps[-1].function}"
    ran = [r.implementation for r in (first, steps[-1]) if r.implementation]
    kinds = set(first.branches)  # a parallel block's branch sizes, measured in every call
    same = bool(kinds) and all(set(r.branches) == kinds for r in group)
    branches = {k: torch.cat([r.branches[k] for r in group]) for k in kinds} if same else {}
    return CapturedMixer(
        first.kind, first.module_name, first.block, function, {"steps": [r.inputs for r in group]},
        torch.cat(outputs, dim=axis),
        out_out=None if any(p is None for p in projected) else torch.cat(projected, dim=1),  # type: ignore[arg-type]
        scale=None if any(s is None for s in scales) else torch.cat(scales, dim=1),  # type: ignore[arg-type]
        n_tokens=offset, output_rows=tuple(rows), out_weight=first.out_weight, out_bias=first.out_bias,
        branches=branches, branch_how=first.branch_how if branches else "",
        implementation=" + ".join(dict.fromkeys(ran)),
    )  # fmt: skip


def join_parts(pieces: Sequence[dict], time_parts: Sequence[str]) -> dict:
    """The parts of consecutive calls as one sequence's: ``time_parts`` concatenated along S,
    "cum" (a running sum along S) carried on, every other part equal in each call."""
    if len(pieces) == 1:
        return pieces[0]
    first = pieces[0]
    out = dict(first)
    for key in time_parts:
        have = [p for p in pieces if key in p]
        if not have:
            continue
        like = have[0][key]
        out[key] = torch.cat(
            [p[key] if key in p else like.new_ones(p["x"].shape[0], *like.shape[1:]) for p in pieces]
        )  # a gate only some calls had (Falcon-H1's step kernel gates): 1 where none was applied
    if "cum" in first:
        runs, total = [], 0.0
        for p in pieces:
            runs.append(p["cum"] + total)
            total = runs[-1][-1]
        out["cum"] = torch.cat(runs)
    fixed = [
        k for k, v in first.items() if k not in time_parts and k != "cum" and isinstance(v, torch.Tensor)
    ]
    for key in fixed:  # the mixer's own parameters (A, D): one value for every call
        if any(not torch.equal(p[key], first[key]) for p in pieces[1:]):
            raise ValueError(f"the decode steps' {key} differs from the forward's")
    return out
