"""The explorer's extra views: colour-scale choice, clicks on figures, value-weighted attention and
the token views (lines between tokens, coloured text). Pages call these; figures come from
`attnviz.figures`, data from `attnviz.analysis.token_views` / `attnviz.analysis.value_weighted`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import streamlit as st

from attnviz import AttentionResult, AttnvizError
from attnviz import figures as F
from attnviz.analysis import token_views as TV
from attnviz.analysis.value_weighted import ValueWeighted
from attnviz.layout import Stack
from ui import export, models, state
from ui.params import EXPLORER_SCALES
from ui.text import literal

SCALE_NAMES = {
    "auto": f"auto (log₁₀ past {F.LONG_TEXT_TOKENS} tokens)",
    "linear": "linear",
    "log": "log₁₀",
    "rank": "rank (percentile)",
    "perhead": "per head",
}
DIRECTION_NAMES = {"from": "attends to", "to": "is attended by"}
_SEEN = "_attnviz_seen_clicks"
_PENDING_TOK = "_attnviz_pending_tok"


SCALE_HELP = {
    "auto": f"auto: linear weights for short texts, log₁₀ past {F.LONG_TEXT_TOKENS} tokens (where every "
    "weight is ~1/N)",
    "linear": "linear: the weight itself",
    "log": "log₁₀: small weights visible at any length",
    "rank": "rank: each weight's percentile among those drawn",
    "perhead": "per head: auto's scale, each head on its own range (the others share one range)",
}


def scale_for(choice: str, n_tokens: int) -> tuple[str, str]:
    """(scale to draw, note for the page) for a choice of `scale_picker`. "auto" is log past
    `F.LONG_TEXT_TOKENS` tokens (a linear scale looks empty there); "perhead" is auto's scale with
    each head on its own range (the caller drops the shared maximum)."""
    if choice in ("auto", "perhead"):
        scale = F.default_scale(n_tokens)
        note = F.scale_note(scale, n_tokens)
        lead = "Auto colour scale" if choice == "auto" else "Each head on its own colour range"
        if note:
            return scale, f"{lead}: {note[0].lower()}{note[1:]}"
        return scale, (f"{lead}." if choice == "perhead" else "")
    return choice, F.scale_note(choice, n_tokens)


def scale_picker(options: Sequence[str] = EXPLORER_SCALES, key: str = "scale") -> str:
    """Every page's one colour control ("Colour scale"): ``options`` are those that make sense on
    the page (`ui.params`: the explorer's five, "per head" only where a page draws several heads on
    their own ranges). A selectbox: five segments do not fit the controls' column."""
    state.choose(key, list(options), "colour scale")
    return str(
        st.selectbox(
            "Colour scale",
            list(options),
            key=key,
            format_func=lambda s: SCALE_NAMES.get(s, s),
            help="; ".join(SCALE_HELP[o] for o in options) + ".",
        )
    )


def clicked(event: Any, key: str) -> list | None:
    """The customdata of a new click on a chart drawn with ``on_select="rerun"`` (None when the
    selection is the one already handled, so a later widget change is not overridden)."""
    try:  # PlotlyState supports both attribute and item access; a plain dict only items
        points = list(event["selection"]["points"]) if event else []
    except (KeyError, TypeError):
        points = []
    data = next((p.get("customdata") for p in points if p.get("customdata") is not None), None)
    seen = st.session_state.setdefault(_SEEN, {})
    mark = repr(data)
    if data is None or seen.get(key) == mark:
        if data is None:
            seen.pop(key, None)
        return None
    seen[key] = mark
    return list(data) if isinstance(data, list | tuple) else [data]


def value_weighted(ref: models.ResultRef, res: AttentionResult, on: bool) -> tuple[Any, tuple]:
    """(result or its value-weighted view, cache key). A model the view cannot map shows why."""
    if not on:
        return res, ref.key
    lm = models.load(ref.spec, ref.token)
    if lm is None:
        return res, ref.key
    wrapped = models.cached("vw", ref.key, lambda: ValueWeighted(lm, res), nbytes=lambda _: 1 << 20)
    try:
        wrapped.norms(0, res.stacks[0])
    except AttnvizError as err:
        st.warning(f"Value-weighted attention is not available here: {err}.", icon=":material/info:")
        return res, ref.key
    return wrapped, (*ref.key, "vw")


def token_section(
    ref: models.ResultRef,
    res: Any,
    stack: Stack,
    layer: int,
    head: int,
    head_names: Sequence[str],
    scale: str,
) -> None:
    """Lines between tokens (all heads) and the text coloured by the selected token's attention.
    A click on a token selects it (``tok``)."""
    q_tokens, _ = res.axes(stack)
    if stack == "cross":
        st.info("Token views show self-attention; pick the encoder or decoder stack.")
        return
    n = len(q_tokens)
    if _PENDING_TOK in st.session_state:
        state.put("tok", st.session_state.pop(_PENDING_TOK))
    state.clamp("tok", 0, n - 1, "token")
    c1, c2, c3 = st.columns([2, 3, 2])
    with c1:
        tok = int(st.number_input("Token position", 0, n - 1, key="tok", help="Or click a token below."))
    with c2:
        picked = st.segmented_control(
            "Direction",
            list(DIRECTION_NAMES),
            key="tdir",
            required=True,
            format_func=lambda d: f"token {DIRECTION_NAMES[d]}",
        )
    with c3:
        top_k = int(st.number_input("Links per head", 1, 10, value=3, key="topk"))
    direction = cast(F.Direction, picked or "from")
    display = list(q_tokens.display)
    st.caption(f"Selected: ({tok}) {literal(display[tok], quote=True)}")
    lines_tab, text_tab = st.tabs(["Lines between tokens (all heads)", f"Coloured text ({head_names[head]})"])
    with lines_tab:
        win = TV.window(n, tok)
        rows = models.cached(
            "tokrows",
            (ref.key, type(res).__name__, stack, layer, direction, tuple(win)),
            lambda: TV.token_rows(res, layer, win, direction=direction, stack=stack),
        )
        fig = F.token_lines(
            rows, display, win, selected=tok, top_k=top_k, direction=direction, head_names=head_names
        )
        name = F.figure_name(ref.name, f"L{layer}", "lines", f"T{tok}")
        _apply_token_click(export.chart(fig, name, key="lines_chart", on_select=True), "lines_chart")
        if n > len(win):
            st.caption(
                f"Positions {win[0]}–{win[-1]} of {n} around the selected token; partners outside "
                "the window are listed past a ⋯ with their position, as (position) token "
                "(above it: earlier, below it: later)."
            )
    with text_tab:
        weights = TV.token_weights(res, layer, tok, head=head, direction=direction, stack=stack)
        title = f"how much ({tok}) {DIRECTION_NAMES[direction]} each token · {head_names[head]}"
        fig = F.token_text(weights, display, selected=tok, scale=scale, title=title)
        name = F.figure_name(ref.name, f"L{layer}", f"H{head}", "text", f"T{tok}")
        _apply_token_click(export.chart(fig, name, key="text_chart", on_select=True), "text_chart")


def _apply_token_click(event: Any, key: str) -> None:
    """A clicked token becomes ``tok`` on the rerun (its number input is already drawn in this one)."""
    data = clicked(event, key)
    if data:
        st.session_state[_PENDING_TOK] = int(data[0])
        st.rerun()
