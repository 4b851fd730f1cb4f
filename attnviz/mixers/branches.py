"""Each branch's share of a parallel block's token-mixing output (Falcon-H1, Zamba2).

Falcon-H1 runs attention and a Mamba-2 mixer side by side on the same normed input and adds
their outputs (each times its multiplier) into the residual stream; Zamba2's hybrid blocks add the
shared attention block's output (through its ``linear``) to the stream the Mamba-2 mixer reads.
`attnviz.capture.mixers` measures what each branch writes during the forward that `extract` runs
(no second forward): ‖o_{i,t}‖ per token, multipliers applied, kept on the Mamba-2 mixer's record.
share_i = Σ_t ‖o_{i,t}‖ / Σ_t Σ_j ‖o_{j,t}‖. These are sizes, not a decomposition: two branches
can partly cancel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import BadIndex
from ..records import CapturedMixer


@dataclass(frozen=True)
class BranchShares:
    """Block ``block``'s branches: kind -> share of the summed output norms, and per token."""

    block: int
    shares: dict[str, float]
    per_token: dict[str, np.ndarray]  # kind -> (S,) ‖o_t‖ of that branch (multipliers applied)
    how: str  # one sentence: what was measured


def branch_shares(records: Sequence[CapturedMixer], block: int) -> BranchShares:
    """The shares of block ``block``'s branches from the records of one forward."""
    rec = next((r for r in reversed(records) if r.block == block and r.branches), None)
    if rec is None:
        raise BadIndex(
            f"block {block}: no parallel branches were measured in this forward (attnviz measures the "
            "attention and Mamba-2 branches of Falcon-H1 blocks and Zamba2's hybrid blocks)"
        )
    seen = rec.branches
    if len(seen) != 2:
        raise BadIndex(f"block {block}: the forward did not run both branches (saw {sorted(seen)})")
    total = float(sum(v.sum() for v in seen.values())) or 1.0
    return BranchShares(
        block=block,
        shares={k: float(v.sum()) / total for k, v in seen.items()},
        per_token={k: v.numpy() for k, v in seen.items()},
        how=f"share = Σ_t ‖o_t‖ of the branch / the same summed over both branches; {rec.branch_how}",
    )
