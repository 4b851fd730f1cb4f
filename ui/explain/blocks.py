"""The Explain page's routes on hybrids and recurrent models: one cached `attnviz.explain.BlockTrace`
(one forward: the stream at block boundaries, every mixing branch's parts c_{t,s}, checked), drawn
by the same routes view as a transformer's trace (`ui.explain.views.routes`)."""

from __future__ import annotations

from attnviz import LoadedModel
from attnviz import explain as X
from attnviz.server.settings import settings
from ui import models
from ui.explain.views import computed, traces
from ui.params import ExplainParams
from ui.text import guarded, md


def load_block_trace(
    lm: LoadedModel, p: ExplainParams, token: str | None, chat: bool
) -> tuple[X.BlockTrace | None, tuple]:
    """The block trace of the sidebar's text (cached beside the transformers' traces), or None
    after an error / a cancel."""
    key = (lm.spec, models.token_key(token), p.text, chat, "blocks")
    got = None
    with guarded(f"tracing {md(lm.spec)}'s blocks on the text", token, (lm.spec, p.text)):
        max_tokens = settings().max_tokens
        got = computed(
            "explain_block_trace",
            key,
            f"Running {md(lm.spec)} on the text (keeping every block's mixers)",
            lambda _r: X.block_trace(lm, p.text, chat=chat, max_tokens=max_tokens),
            traces(),
        )
    return got, key


def caption(lm: LoadedModel, tr: X.BlockTrace) -> str:
    return (
        f"**{md(lm.spec)}** · {models.describe_layout(lm.layout)} · {tr.n_tokens} tokens · "
        "each block's token mixing (attention heads, mixer heads, per-channel mixers) then its MLP"
    )
