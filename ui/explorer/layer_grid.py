"""The explorer's layer grid: every head of one layer, drawn once by the browser (`ui.heatmaps`:
server-made pictures, one pixel per cell, with each cell's exact value in the hover); a click on
a head's tile selects it (read by `ui.explorer.big_head.current`, the one place the head is
written).

The grid is sized to the first screen (`SPACE`: half the page at 1280x800, under the controls):
square tiles as large as fit, token labels only where they fit (the hover gives every value).
A head change reruns only the big head's fragment, so the grid is not sent or drawn again: the
frame on the open head moves in the browser (`mark`, from that fragment); a hovered tile is shown
enlarged beside the grid."""

from __future__ import annotations

import contextlib

import plotly.graph_objects as go
import streamlit as st

from attnviz import figures as F
from attnviz.figures import panels as P
from ui import export, heatmaps, shown
from ui.explorer import big_head
from ui.models import ResultRef
from ui.shown import Drawing
from ui.text import guarded

GQA_NOTE = " Rows are KV groups: the query heads of a row share one key/value head (GQA)."
SPACE = (400, 400)  # (width, height) px for the grid: a half-page column at 1280x800, under the controls


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
    header = f"{d.res.layout.layer_label(d.layer).capitalize()}: all {n_heads} heads"
    shared = d.choice != "perhead" and d.scale != "rank" and img.z.size  # one range: grid and big view
    zmax = float(img.z.max()) if shared else None
    own_bar = d.choice == "perhead"  # else the big head beside it shows the same colour scale
    cols, tile = F.grid_shape(n_heads, *SPACE, kv_heads=d.kv, colorbar=own_bar)
    titles = [F.head_title(h, d.kv[h] if d.kv else None) for h in range(n_heads)]
    panels = P.grid_panels(img.z, img.q_labels, img.k_labels, titles, scale=d.scale)
    bar = P.colour_bar(d.scale, d.cmap, zmax, img.z, d.value_name)
    name = F.figure_name(ref.name, d.stack_part, f"L{d.layer}")
    heatmaps.show(
        panels, bar, key=big_head.GRID_KEY, title=header, cols=cols, tile_px=tile, click="panel",
        preview=True, open_index=big_head.current(n_heads), name=name, colorbar=own_bar,
    )  # fmt: skip

    # the downloads' callables outlive the run (a session kept 2 minutes after its visitor left):
    # they take the drawing's plain values, never `d`, which holds the result
    kv, cmap, scale, value = d.kv, d.cmap, d.scale, d.value_name

    def figure() -> go.Figure:  # the downloads' figure (SVG, PDF, HTML), made when clicked
        fig = F.head_grid(
            img.z, img.q_labels, img.k_labels, kv_heads=kv, colorscale=cmap, scale=scale, zmax=zmax,
            value=value, cols=cols, facet_px=tile, colorbar=own_bar,
        )  # fmt: skip
        return fig.update_layout(title=dict(text=f"<b>{F.escape(header)}</b>", x=0, xref="container"))

    by_kv = GQA_NOTE if d.kv and 1 < cols == d.kv.count(d.kv[0]) else ""
    pooled = f"{img.note[0].upper()}{img.note[1:]}. " if img.note else ""
    st.caption(
        pooled + "Hover a tile to see it enlarged; click it to open it big." + by_kv + " " + d.scale_note
    )
    if img.caveat:
        st.caption(img.caveat)
    export.html_buttons(lambda: [figure()], name, key="grid", what="this layer's grid")
    return True, zmax
