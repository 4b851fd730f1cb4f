"""The explorer's layer controls (stack, layer, colour, hidden tokens, sink, value-weighted) and
what they ask for, a `Drawing`, read back from the session so that the big head's fragment,
which reruns without the controls, draws the same view."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import cast

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from attnviz import AttentionResult
from attnviz import figures as F
from attnviz.layout import Stack
from ui import mixers, models, pickers, shown, state
from ui.shown import Drawing

STACK_NAMES = {
    "self": "self",
    "encoder": "encoder",
    "decoder": "decoder",
    "cross": "cross (decoder → encoder)",
}
HIDE_HELP = (
    "Drop special and chat-template tokens from both axes and renormalise each row over the keys left."
)
NOSINK_HELP = "Drop key 0 (the first token, where many heads park attention) and renormalise each row."
VW_HELP = (
    "‖α·W_O v‖ (Kobayashi et al. 2020): each weight times the norm of what that key's value adds to "
    "the output, relative to the layer's largest; a sink with a tiny value fades."
)


def draw(res: AttentionResult) -> DeltaGenerator:
    """The layer and view controls (their values are read back by `drawing`); returns the
    column where the pooling choice goes when a long text needs it."""
    stack = pickers.stack_picker(res.stacks, lambda s: STACK_NAMES.get(s, s))
    n_layers = res.n_layers(stack)
    state.clamp("layer", 0, n_layers - 1, "layer")
    c1, c2, c3 = st.columns([4, 3, 3])
    with c1:
        if mixers.applies(res.layout):  # the block picker above chose the layer
            st.caption(mixers.attention_block_line(res.layout, int(state.get("layer"))))
        elif n_layers > 1:
            st.slider("Layer", 0, n_layers - 1, key="layer")
        else:
            st.number_input("Layer", 0, 0, key="layer")
    with c2:
        st.selectbox("Colour map", F.COLORSCALES, key="cmap")
        pickers.scale_picker()
    with c3:
        st.toggle("Hide special tokens", key="hide", help=HIDE_HELP, wrap=True)
        st.toggle("Renormalise without the sink", key="nosink", help=NOSINK_HELP, wrap=True)
        st.toggle("Value-weighted", key="vw", help=VW_HELP, wrap=True)
    return c2


# The layer fragment's Drawing while the head fragment runs inside it (one script run, one
# thread): computed once per run. Never kept past the run: it holds the result's arrays.
_this_run = threading.local()


@contextlib.contextmanager
def shared(ref: models.ResultRef, d: Drawing) -> Iterator[None]:
    """Within the block, `drawing` of ``ref`` returns ``d``: the big head's fragment, called
    inside the layer's run, draws what the layer computed. A head-only rerun computes its own."""
    _this_run.held = (ref.key, d)
    try:
        yield
    finally:
        _this_run.held = None


def drawing(ref: models.ResultRef, res: AttentionResult) -> Drawing | None:
    """What the controls ask for (read from the session: the big head's fragment reruns without
    them); None when every token is hidden (said). Once per run (see `shared`)."""
    held = getattr(_this_run, "held", None)
    if held is not None and held[0] == ref.key:
        return held[1]
    stack = cast(Stack, state.get("stack") or res.stacks[0])
    drawn, key = shown.value_weighted(ref, res, bool(state.get("vw")))
    view = shown.View(stack=stack, hide=bool(state.get("hide")), nosink=bool(state.get("nosink")))
    ax = shown.axes(drawn, view)
    if min(len(ax.q_idx), len(ax.k_idx)) == 0:
        st.info("Every token is hidden by the options above; turn 'Hide special tokens' off.")
        return None
    n = max(len(ax.q_idx), len(ax.k_idx))
    choice = str(state.get("scale"))
    scale, note = pickers.scale_for(choice, n)
    side = F.grid_side(res.n_heads, n_tokens=n)
    how = str(state.get("pool") or "max") if n > side and shown.applies(drawn, view, ax) else "max"
    kv = pickers.kv_heads(res, stack)
    layer, cmap = int(state.get("layer")), str(state.get("cmap"))
    return Drawing(drawn, key, view, layer, ax, kv, cmap, choice, scale, note, side, how)
