"""Controls and helpers the pages share: the colour-scale choice, clicks on figures and
value-weighted attention. Figures come from `attnviz.figures`, data from `attnviz.analysis.value_weighted`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import streamlit as st

from attnviz import AttentionResult, AttnvizError
from attnviz import figures as F
from attnviz.analysis.value_weighted import ValueWeighted
from ui import models, state
from ui.params import EXPLORER_SCALES

SCALE_NAMES = {
    "auto": f"auto (log₁₀ past {F.LONG_TEXT_TOKENS} tokens)",
    "linear": "linear",
    "log": "log₁₀",
    "rank": "rank (percentile)",
    "perhead": "per head",
}
_SEEN = "_attnviz_seen_clicks"
_ROUNDS = "_attnviz_click_rounds"


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


def chart_key(name: str) -> str:
    """The widget key of clickable chart ``name`` in this run (see `click`)."""
    return f"{name}_{st.session_state.get(_ROUNDS, {}).get(name, 0)}"


def click(name: str) -> list | None:
    """A new click on chart ``name`` (drawn with ``key=chart_key(name)``), read before the chart
    is drawn in this run: its customdata, or None.

    After a click the chart is drawn under a new key: Plotly keeps a clicked point selected and
    a second click on it unselects it, so an event would say nothing about clicking a tile
    clicked before (head 1, head 4, head 1 again stayed on 4). A new chart starts with nothing
    selected, so every click is a new point."""
    key = chart_key(name)
    picked = clicked(st.session_state.get(key), key)
    if picked:
        rounds = st.session_state.setdefault(_ROUNDS, {})
        rounds[name] = rounds.get(name, 0) + 1
        st.session_state.get(_SEEN, {}).pop(key, None)
    return picked


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
