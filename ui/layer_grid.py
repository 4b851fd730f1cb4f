"""The explorer's layer grid: every head of one layer; a click on a head's tile selects it (read
by `ui.big_head.current`, the one place the head is written).

The grid does not frame the selected head: a head change reruns only the big head's fragment,
so the grid is not sent or drawn again (a frame would have to move with it); the big head's
title names the head."""

from __future__ import annotations

import contextlib

import streamlit as st

from attnviz import figures as F
from ui import big_head, clicks, export, shown
from ui.models import ResultRef
from ui.shown import Drawing
from ui.text import guarded


def draw(ref: ResultRef, d: Drawing) -> tuple[bool, float | None]:
    """Draw the grid of ``d``'s layer. Returns (drawn, the colour maximum the
    big head shares: None when each head has its own range or for rank); not drawn: a message
    says why (past the free memory)."""
    big = len(d.ax.q_idx) * len(d.ax.k_idx) > 1 << 20
    spin = st.spinner("Pooling the heads…", show_time=True) if big else contextlib.nullcontext()
    with guarded("pooling the heads") as caught, spin:
        img = shown.layer_image(d.res, d.key, d.layer, d.view, d.ax, d.side, d.how)
    if caught:
        return False, None
    n_heads = d.res.n_heads
    pooled = f" · {img.note}" if img.note else ""
    st.markdown(f"**{d.res.layout.layer_label(d.layer).capitalize()}: all {n_heads} heads**{pooled}")
    if img.caveat:
        st.caption(img.caveat)
    if d.kv:
        st.caption("Rows are KV groups: the query heads of a row share one key/value head (GQA).")
    shared = d.choice != "perhead" and d.scale != "rank" and img.z.size  # one range: grid and big view
    zmax = float(img.z.max()) if shared else None
    fig = F.head_grid(
        img.z, img.q_labels, img.k_labels, kv_heads=d.kv, colorscale=d.cmap, scale=d.scale, zmax=zmax,
        pickable=True, value=d.value_name,
    )  # fmt: skip
    name = F.figure_name(ref.name, d.stack_part, f"L{d.layer}")
    export.chart(fig, name, key=clicks.chart_key(big_head.GRID_CHART), on_select=True)
    st.caption("Click a head's tile to show it big. " + d.scale_note)
    export.html_buttons(lambda: [fig], name, key="grid", what="this layer's grid")
    return True, zmax
