"""Ablation of a per-head mixer's heads (SSD, gated delta, Kimi delta, lightning) on hybrids and
recurrent models: head h's output before out_proj (its slice of out_proj's input, gates and norm
applied at their forward values) replaced at every position by zero or by its mean over the
positions, and the prediction compared with the model's own.

    attnviz.explain.ablate_mixer_heads(lm, text, [(0, 2)], mode="mean")

Two forwards of the model's own code (three for "mean": one reads the means first).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from ..errors import AttnvizError
from ..inputs import tokenize
from ..loading import Hook, LoadedModel
from ..tokens import Tokens, displays
from .attribution import token_id
from .stream import block_sites, out_projection

MixerMode = Literal["zero", "mean"]


@dataclass(frozen=True)
class MixerAblation:
    """The target's logit and probability at ``position`` with and without the ablated heads."""

    model_name: str
    tokens: Tokens
    position: int
    heads: tuple[tuple[int, int], ...]  # (block, head)
    mode: MixerMode
    target: int
    target_token: str
    logit_before: float
    logit_after: float
    prob_before: float
    prob_after: float
    kl: float  # KL(before ‖ after), nats

    @property
    def total_effect(self) -> float:
        return self.logit_after - self.logit_before


def _projections(lm: LoadedModel, blocks: set[int]) -> dict[int, tuple[torch.nn.Module, int]]:
    st = block_sites(lm)
    out = {}
    for b in blocks:
        if not 0 <= b < st.n_blocks:
            raise AttnvizError(f"block {b} is out of range: this model has blocks 0..{st.n_blocks - 1}")
        found = [out_projection(st.modules[k][b], k) for k in st.parts if k not in ("attention", "mlp")]
        got = [f for f in found if f is not None]
        if not got:
            raise AttnvizError(
                f"block {b} has no per-head mixer (its mixers: {', '.join(lm.layout.mixers[b])}); "
                "softmax heads are ablated with attnviz.ablate_heads, per-channel mixers have no heads"
            )
        out[b] = got[0]
    return out


def ablate_mixer_heads(
    lm: LoadedModel,
    text: str | Sequence[int],
    heads: Sequence[tuple[int, int]],
    *,
    mode: MixerMode = "zero",
    position: int = -1,
    target: int | str | None = None,
    chat: bool = False,
) -> MixerAblation:
    """The prediction at ``position`` with mixer heads ``heads`` ((block, head) pairs) ablated."""
    if mode not in ("zero", "mean"):
        raise AttnvizError(f"unknown mode {mode!r}; use 'zero' or 'mean'")
    ids = tokenize(lm, text, chat=chat)[0] if isinstance(text, str) else [int(i) for i in text]
    if not -len(ids) <= position < len(ids):
        raise AttnvizError(f"position {position} is out of range: this text has tokens 0..{len(ids) - 1}")
    pos = position % len(ids)
    wanted = [(int(b), int(h)) for b, h in heads]
    if not wanted:
        raise AttnvizError("no heads to ablate; give (block, head) pairs")
    projs = _projections(lm, {b for b, _ in wanted})
    for b, h in wanted:
        if not 0 <= h < projs[b][1]:
            raise AttnvizError(f"head {h} is out of range: block {b}'s mixer has heads 0..{projs[b][1] - 1}")
    means: dict[int, torch.Tensor] = {}

    def keep(b: int, n: int):
        def hook(_m, args):
            means[b] = args[0][0].unflatten(-1, (n, -1)).mean(0)  # (heads, d_head) over positions

        return hook

    before = lm.forward(
        ids, logits_at=[pos], hooks=[Hook(p, keep(b, n), "before") for b, (p, n) in projs.items()]
    )
    logits_before = before.logits[0, -1].float()

    def ablate(b: int, n: int):
        picked = [h for bb, h in wanted if bb == b]

        def hook(_m, args):
            x = args[0].unflatten(-1, (n, -1)).clone()  # (B, N, heads, d_head)
            for h in picked:
                x[..., h, :] = 0.0 if mode == "zero" else means[b][h].to(x.dtype)
            return (x.flatten(-2), *args[1:])

        return hook

    after = lm.forward(
        ids, logits_at=[pos], hooks=[Hook(p, ablate(b, n), "before") for b, (p, n) in projs.items()]
    )
    logits_after = after.logits[0, -1].float()
    tgt = token_id(lm, target, int(logits_before.argmax()))
    assert tgt is not None
    p0, p1 = logits_before.log_softmax(-1), logits_after.log_softmax(-1)
    return MixerAblation(
        model_name=lm.spec,
        tokens=Tokens.build(lm.tokenizer, ids),
        position=pos,
        heads=tuple(wanted),
        mode=mode,
        target=tgt,
        target_token=displays(lm.tokenizer, [tgt])[0],
        logit_before=float(logits_before[tgt]),
        logit_after=float(logits_after[tgt]),
        prob_before=float(p0[tgt].exp()),
        prob_after=float(p1[tgt].exp()),
        kl=float((p0.exp() * (p0 - p1)).sum()),
    )
