"""Each branch's share of a parallel block's token-mixing output (Falcon-H1, Zamba2).

Falcon-H1 runs attention and a Mamba-2 mixer side by side on the same normed input and adds
their outputs (each times its multiplier) into the residual stream; Zamba2's hybrid blocks add the
shared attention block's output (through its ``linear``) to the stream the Mamba-2 mixer reads.
`branch_shares` runs one forward of the model on the result's tokens (under the model's lock, with
temporary forward hooks removed afterwards) and measures each branch's output: share_i =
Σ_t ‖o_i,t‖ / Σ_t Σ_j ‖o_j,t‖ (norms of what each branch writes, summed over tokens). These are
sizes, not a decomposition: two branches can partly cancel.

Kept apart from the engine (`attnviz.mixers`) on purpose: it is a view-side measurement that needs
the model, not the captured result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import BadIndex
from ..loading import Hook


@dataclass(frozen=True)
class BranchShares:
    """Block ``block``'s branches: kind -> share of the summed output norms, and per token."""

    block: int
    shares: dict[str, float]
    per_token: dict[str, np.ndarray]  # kind -> (N,) ‖o_t‖ of that branch (multipliers applied)
    how: str  # one sentence: what was measured


def _modules(lm: Any, block: int) -> tuple[Any, Any, Any, float, float, str]:
    """(block module, attention branch module, mamba2 module, attn multiplier, ssm multiplier, how)."""
    site = next((s for s in lm.mixer_sites if s.block == block and s.kind == "mamba2"), None)
    if site is None:
        raise BadIndex(f"block {block} has no Mamba-2 branch beside its attention")
    modules = dict(lm.model.named_modules())
    mamba = modules[site.module_name]
    parts = site.module_name.split(".")
    owner = next(
        (modules[".".join(parts[: i + 1])] for i in range(len(parts) - 1, 0, -1) if parts[i - 1] == "layers"),
        None,
    )
    if owner is None:
        raise BadIndex(f"block {block}: cannot find the block module of {site.module_name}")
    if hasattr(owner, "self_attn") and hasattr(owner, "ssm_out_multiplier"):  # Falcon-H1
        return (
            owner,
            owner.self_attn,
            mamba,
            float(getattr(owner, "attn_out_multiplier", 1.0)),
            float(owner.ssm_out_multiplier),
            "each branch's output times its multiplier, as the block adds them",
        )
    if hasattr(owner, "shared_transformer") and hasattr(owner, "linear"):  # Zamba2 hybrid block
        return (
            owner,
            owner.linear,
            mamba,
            1.0,
            1.0,
            "the shared attention block's write (through its linear) and the Mamba-2 mixer's output",
        )
    raise BadIndex(f"block {block} ({type(owner).__name__}): its branches' outputs are not known to attnviz")


def branch_shares(lm: Any, ids: list[int], block: int) -> BranchShares:
    """Each branch's share of block ``block``'s token-mixing output for token ids ``ids``."""
    _, attn, mamba, m_attn, m_ssm, how = _modules(lm, block)
    seen: dict[str, torch.Tensor] = {}

    def keep(kind: str, mult: float):
        def hook(_module, _args, output):
            out = output[0] if isinstance(output, tuple) else output
            seen[kind] = (out.detach().double()[0] * mult).norm(dim=-1).cpu()

        return hook

    hooks = [Hook(attn, keep("attention", m_attn)), Hook(mamba, keep("mamba2", m_ssm))]
    lm.forward(list(ids), hooks=hooks, logits_at="none")
    if set(seen) != {"attention", "mamba2"}:
        raise BadIndex(f"block {block}: the forward did not run both branches (saw {sorted(seen)})")
    total = float(sum(v.sum() for v in seen.values())) or 1.0
    return BranchShares(
        block=block,
        shares={k: float(v.sum()) / total for k, v in seen.items()},
        per_token={k: v.numpy() for k, v in seen.items()},
        how=f"share = Σ_t ‖o_t‖ of the branch / the same summed over both branches; {how}",
    )
