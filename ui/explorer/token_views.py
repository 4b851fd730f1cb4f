"""The explorer's token views: lines between tokens (every head of the layer) or the text
coloured by the selected token's attention (the selected head). Only the view on screen is
computed and drawn. A click on a token selects it (``tok``); the default token is the last one
(a causal model's token 0 attends only to itself: one line, an empty-looking view).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import streamlit as st
import streamlit.components.v1 as components

from attnviz import figures as F
from attnviz.analysis import token_views as TV
from attnviz.layout import Stack
from ui import clicks, export, models, state
from ui.params import TOKEN_VIEWS
from ui.text import literal

DIRECTION_NAMES = {"from": "attends to", "to": "is attended by"}
LINES_CHART, TEXT_CHART = "lines_chart", "text_chart"
TEXT_WIDTH_CHARS = 52  # characters a line of the coloured text holds in half the page


def selected_token(n: int) -> int:
    """The selected token, before its input is drawn: a new click on a token of either view, else
    ``tok`` (-1, the default, means the last token)."""
    for chart in (LINES_CHART, TEXT_CHART):
        picked = clicks.click(chart)
        if picked:
            state.put("tok", int(picked[0]))
    if state.get("tok") == -1:
        state.put("tok", n - 1)
    return state.clamp("tok", 0, n - 1, "token")


def draw(
    ref: models.ResultRef,
    res: Any,
    key: tuple,
    stack: Stack,
    layer: int,
    head: int,
    head_names: Sequence[str],
    scale: str,
    cmap: str = "Viridis",
) -> None:
    """The token views of ``res`` (a result or its value-weighted view, cached under ``key``);
    the coloured text in the heatmaps' colour map ``cmap``."""
    q_tokens, _ = res.axes(stack)
    if stack == "cross":
        st.info("Token views show self-attention; pick the encoder or decoder stack.")
        return
    n = len(q_tokens)
    tok = selected_token(n)
    # the views sit in the big head's column (half the page): two narrow rows of controls
    c1, c2 = st.columns([1, 1])
    with c1:
        tok = int(st.number_input("Token position", 0, n - 1, key="tok", help="Or click a token below."))
    with c2:
        top_k = int(
            st.number_input("Links per head", 1, 10, key="topk", help="Each head's strongest links drawn.")
        )
    shown = st.segmented_control(
        "Show",
        TOKEN_VIEWS,
        key="tview",
        required=True,
        format_func=lambda v: "lines (all heads)" if v == "lines" else f"coloured text ({head_names[head]})",
    )
    picked = st.segmented_control(
        "Direction", list(DIRECTION_NAMES), key="tdir", required=True,
        format_func=lambda d: f"token {DIRECTION_NAMES[d]}",
    )  # fmt: skip
    direction = cast(F.Direction, picked or "from")
    display = list(q_tokens.display)
    st.caption(f"Selected: ({tok}) {literal(display[tok], quote=True)}")
    if shown == "text":
        weights = TV.token_weights(res, layer, tok, head=head, direction=direction, stack=stack)
        title = f"how much ({tok}) {DIRECTION_NAMES[direction]} each token · {head_names[head]}"
        hover = [q_tokens.hover(i) for i in range(n)]
        fig = F.token_text(
            weights,
            display,
            selected=tok,
            scale=scale,
            title=title,
            hover=hover,
            width_chars=TEXT_WIDTH_CHARS,
            colorscale=cmap,
        )
        name = F.figure_name(ref.name, f"L{layer}", f"H{head}", "text", f"T{tok}")
        export.chart(fig, name, key=clicks.chart_key(TEXT_CHART), on_select=True)
        hover_text(res, layer, head, stack, display, tok, direction)
        return
    win = TV.window(n, tok)
    rows = models.cached(
        "tokrows",
        (key, stack, layer, direction, tuple(win)),
        lambda: TV.token_rows(res, layer, win, direction=direction, stack=stack),
    )
    hover = [q_tokens.hover(i) for i in range(n)]
    fig = F.token_lines(
        rows, display, win, selected=tok, top_k=top_k, direction=direction, head_names=head_names, hover=hover
    )
    name = F.figure_name(ref.name, f"L{layer}", "lines", f"T{tok}")
    export.chart(fig, name, key=clicks.chart_key(LINES_CHART), on_select=True)
    if n > len(win):
        st.caption(
            f"Positions {win[0]}–{win[-1]} of {n} around the selected token; partners outside "
            "the window are listed past a ⋯ with their position, as (position) token "
            "(above it: earlier, below it: later)."
        )
    hover_lines(res, key, layer, stack, display, tok, direction, top_k, head_names)


def hover_lines(
    res: Any, key: tuple, layer: int, stack: Stack, display: list[str], tok: int, direction: str, top_k: int,
    head_names: Sequence[str],
) -> None:  # fmt: skip
    """BertViz's view: hover a token and only its lines show, drawn in the browser from every
    head's top-k partners of every token (in the page: no server). Up to `F.HOVER_MAX_TOKENS`."""
    n = len(display)
    if n > F.HOVER_MAX_TOKENS:
        return

    def build() -> tuple:
        t = res.layer_tensor(layer, stack=stack).float()  # (heads, N, N)
        t = t.transpose(1, 2) if direction == "to" else t
        w, idx = t.topk(min(top_k, n), dim=-1)
        return idx.cpu().numpy(), w.cpu().numpy()

    idx, w = models.cached("hoverlines", (key, stack, layer, direction, top_k), build)
    st.caption("Hover a token on the left: its lines, every head at once (drawn in your browser, no wait).")
    page = F.hover_lines_html(idx, w, display, list(head_names), F.head_colours(len(head_names)), start=tok)
    components.html(page, height=min(520, 60 + 18 * n), scrolling=True)


def hover_text(
    res: Any, layer: int, head: int, stack: Stack, display: list[str], tok: int, direction: str
) -> None:
    """The text once more, coloured in the browser by the hovered token's weights (the whole
    head's matrix is in the page: a hover needs no server). Up to `F.HOVER_MAX_TOKENS` tokens."""
    n = len(display)
    if n > F.HOVER_MAX_TOKENS:
        st.caption(
            f"Hover colouring is offered up to {F.HOVER_MAX_TOKENS} tokens; click a token above instead."
        )
        return
    w = res.layer_tensor(layer, heads=[head], stack=stack)[0].float().cpu().numpy()
    what = DIRECTION_NAMES[direction]
    st.caption(f"Hover a token: the text is coloured by what it {what} (computed in your browser, no wait).")
    lines = math.ceil(sum(len(t) + 1 for t in display) / 70) + 1
    components.html(
        F.hover_text_html(w.T if direction == "to" else w, display, start=tok, what=what),
        height=min(520, 44 + 30 * lines),
        scrolling=True,
    )
