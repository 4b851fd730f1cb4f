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

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import AttnvizError
from ..loading import LoadedModel
from ..tokens import Tokens, displays
from .attribution import readout, token_id
from .residual import unembed
from .stream import Stream, stream

ONE_COMPONENT = (
    "Each mixer is one component (its heads are not split yet); Mamba-1, RWKV and short-conv "
    "mixers mix per channel and have no heads to split."
)


@dataclass(frozen=True)
class BlockAttribution:
    """Direct contributions to ``logit`` = logit(target) − logit(contrast) at ``position``, per
    block and part (``values[b, i]`` for ``parts[i]``; NaN where block b has no such part)."""

    model_name: str
    tokens: Tokens
    position: int
    target: int
    target_token: str
    contrast: int | None
    contrast_token: str
    logit: float  # the model's logit difference (its logit multiplier applied, before a soft-cap)
    embedding: float
    parts: tuple[str, ...]
    values: np.ndarray  # (n_blocks, parts) float64
    rest: float  # the final norm's and the LM head's biases
    error: float  # logit − (embedding + Σ values + rest): float rounding
    notes: tuple[str, ...] = (ONE_COMPONENT,)

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
        tgt = token_id(lm, target, int(logits.argmax()))
        con = token_id(lm, contrast, None)
        assert tgt is not None
        r, rest = readout(lm, st, t, tgt, con)
        r64 = r.to(f64)
        embedding = float(st.stream[0][t].to(f64) @ r64)
        values = np.full((st.n_layers, len(st.parts)), np.nan)
        for b, added in enumerate(st.added):
            for i, part in enumerate(st.parts):
                if part in added:
                    values[b, i] = float(added[part][t].to(f64) @ r64)
        logit = float(logits[tgt] - (logits[con] if con is not None else 0.0))
    total = embedding + np.nansum(values) + rest
    shown = displays(lm.tokenizer, [tgt] + ([con] if con is not None else []))
    return BlockAttribution(
        model_name=st.model_name,
        tokens=st.tokens,
        position=t,
        target=tgt,
        target_token=shown[0],
        contrast=con,
        contrast_token=shown[1] if con is not None else "",
        logit=logit,
        embedding=embedding,
        parts=st.parts,
        values=values,
        rest=float(rest),
        error=logit - float(total),
    )


def _logits_before_cap(lm: LoadedModel, st: Stream, t: int) -> torch.Tensor:
    """The logits at ``t`` from the final stream, before a soft-cap (monotonic): float32 (vocab,)."""
    config = lm.model.config.get_text_config()
    if getattr(config, "final_logit_softcapping", None):
        raise AttnvizError(f"{lm.spec!r} soft-caps its logits; attribute it with attnviz.logit_attribution")
    return unembed(lm, st.stream[-1][t : t + 1])[0]
