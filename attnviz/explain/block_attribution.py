"""Direct logit attribution by block part: on any decoder (hybrids and recurrent models included),
each block's token-mixing branches and its MLP / MoE, each on its own, share one logit.

The final stream at position t is the embedding plus what every part of every block added
(`attnviz.explain.stream`, checked exactly; μP multipliers included). With the final norm frozen
at its actual scale for this token, the logit of ``target`` minus ``contrast`` is linear in each:

    logit = r · embedding + Σ_b,part r · added[b][part] + rest,   r = N_fᵀ u · m

(u the difference of the two unembedding rows, m the model's logit multiplier, ``rest`` the final
norm's and the LM head's biases). A mixer is one component here: the per-head split of a per-head
mixer (SSD, gated delta) through its out_proj is not built yet; per-channel mixers (Mamba-1, RWKV,
short conv) have no heads to split.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..errors import AttnvizError
from ..loading import LoadedModel
from .attribution import TargetLogit, readout, target_fields
from .residual import unembed
from .stream import Stream, stream

ONE_COMPONENT = (
    "A per-head mixer (SSD, gated delta, Kimi delta, lightning) is split by head through its out_proj, "
    "gates and output norm frozen at their forward values (where that norm spans heads, as "
    "lightning's, the split rests on its frozen scale); Mamba-1, RWKV and short-conv mixers mix "
    "per channel and are one component."
)


@dataclass(frozen=True)
class BlockAttribution(TargetLogit):
    """Direct contributions to ``logit`` = logit(target) − logit(contrast) at ``position``, per
    block and part (``values[b, i]`` for ``parts[i]``; NaN where block b has no such part)."""

    parts: tuple[str, ...]
    values: np.ndarray  # (n_blocks, parts) float64
    rest: float  # the final norm's and the LM head's biases
    error: float  # logit − (embedding + Σ values + rest): float rounding
    notes: tuple[str, ...] = (ONE_COMPONENT,)
    # (block, part) -> (heads,) float64: a per-head mixer's part split by head (its out_proj bias,
    # if any, is the part minus their sum); checked to sum to the part before it is kept
    heads: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)

    def ranking(self, top: int | None = None) -> list[tuple[str, int, float]]:
        """(part, block (-1: the embedding), contribution), largest |value| first."""
        rows = [("embedding", -1, self.embedding)]
        rows += [
            (part, b, float(self.values[b, i]))
            for b in range(self.values.shape[0])
            for i, part in enumerate(self.parts)
            if not np.isnan(self.values[b, i])
        ]
        rows.sort(key=lambda r: -abs(r[2]))
        return rows if top is None else rows[:top]

    def to_frame(self) -> Any:
        import pandas as pd

        return pd.DataFrame(self.ranking(), columns=["part", "block", "contribution"])

    def head_frame(self) -> Any:
        """One row per head of each per-head mixer part (block, part, head, contribution)."""
        import pandas as pd

        rows = [
            (b, part, h, float(v))
            for (b, part), heads in sorted(self.heads.items())
            for h, v in enumerate(heads)
        ]
        return pd.DataFrame(rows, columns=["block", "part", "head", "contribution"])


def block_attribution(
    lm: LoadedModel,
    text: str | list[int] | Stream,
    token: int = -1,
    target: int | str | None = None,
    contrast: int | str | None = None,
    *,
    chat: bool = False,
) -> BlockAttribution:
    """Each block part's direct contribution to the logit of ``target`` (default: the model's
    prediction) minus ``contrast`` at ``token``; refuses a block that is not a checked sum of its
    parts, with the reason."""
    st = text if isinstance(text, Stream) else stream(lm, text, chat=chat)
    problems = [p for p in st.problem if p]
    if st.unembed_problem or problems:
        raise AttnvizError(st.unembed_problem or f"{lm.spec!r}: {problems[0]}; its parts would not add up")
    t = st.position(token)
    f64 = torch.float64
    with torch.inference_mode():
        logits = _logits_before_cap(lm, st, t)
        chosen = target_fields(lm, logits, target, contrast)
        r, rest = readout(lm, st, t, chosen["target"], chosen["contrast"])
        r64 = r.to(f64)
        embedding = float(st.stream[0][t].to(f64) @ r64)
        values = np.full((st.n_layers, len(st.parts)), np.nan)
        for b, added in enumerate(st.added):
            for i, part in enumerate(st.parts):
                if part in added:
                    values[b, i] = float(added[part][t].to(f64) @ r64)
        heads = _split_heads(st, t, r64, values)
    total = embedding + np.nansum(values) + rest
    return BlockAttribution(
        model_name=st.model_name,
        tokens=st.tokens,
        position=t,
        **chosen,
        embedding=embedding,
        parts=st.parts,
        values=values,
        rest=float(rest),
        error=chosen["logit"] - float(total),
        heads=heads,
    )


def _split_heads(
    st: Stream, t: int, r: torch.Tensor, values: np.ndarray
) -> dict[tuple[int, str], np.ndarray]:
    """Each per-head mixer part at row ``t`` split by head: head h writes W_out[:, h] · x_h with
    x_h its slice of out_proj's input (gates and norms at their forward values), times the part's
    scale into the stream; kept only where the heads (+ out_proj's bias) give the part's write."""
    out: dict[tuple[int, str], np.ndarray] = {}
    for b, parts in enumerate(st.head_inputs):
        for part, (proj, n_heads, x) in parts.items():
            scale = st.scales[b].get(part)
            if scale is None:
                continue
            w = proj.weight.detach().to(torch.float64)  # (d_model, heads · d_head)
            xh = x[t].to(torch.float64).reshape(n_heads, -1)  # (heads, d_head)
            writes = torch.einsum("mhd,hd->hm", w.reshape(w.shape[0], n_heads, -1), xh) * scale
            whole = writes.sum(0)
            if proj.bias is not None:
                whole = whole + proj.bias.detach().to(torch.float64) * scale
            added = st.added[b][part][t].to(torch.float64)
            if (whole - added).abs().max() > 1e-4 * max(1.0, float(added.abs().max())):
                continue  # not this part's write (another path between out_proj and the stream)
            out[(b, part)] = (writes @ r.to(writes.device)).cpu().numpy()
    return out


def _logits_before_cap(lm: LoadedModel, st: Stream, t: int) -> torch.Tensor:
    """The logits at ``t`` from the final stream, before a soft-cap (monotonic): float32 (vocab,)."""
    config = lm.model.config.get_text_config()
    if getattr(config, "final_logit_softcapping", None):
        raise AttnvizError(f"{lm.spec!r} soft-caps its logits; attribute it with attnviz.logit_attribution")
    return unembed(lm, st.stream[-1][t : t + 1])[0]
