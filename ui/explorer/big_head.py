"""The explorer's big head: the head picker and one head up close, with its downloads.

The selected head is read and written in one place, `current`, at the top of the explorer's
fragment: a click on a tile of the layer grid (a selection event) becomes the head before the
picker is drawn, so the click needs no second rerun. A text too long to draw whole
shows the head block-pooled on the device, or a zoomed region at full resolution; with hidden
tokens / no sink (or value-weighted), a window of exact query rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from attnviz import AttentionResult
from attnviz import figures as F
from attnviz.figures import panels as P
from ui import export, heatmaps, models, pickers, shown, state
from ui.explain import qk
from ui.shown import Drawing
from ui.text import guarded

KEY = "head"
HEAD_PX = 400  # the big head's height: it and the grid fit the first screen at 1280x800
GRID_KEY = "head_grid"  # the layer grid's element (`ui.explorer.layer_grid`): a tile click picks a head
HEAD_KEY = "big_head"  # the big head's element: a click on a cell asks why it attends there


def current(n_heads: int) -> int:
    """The selected head, before anything is drawn: a new click on a grid tile selects its head
    (the one place the head is written besides its picker), then it is kept in 0..n_heads-1 (a
    link's or another model's head gets a warning)."""
    picked = heatmaps.clicked(GRID_KEY)
    if picked:
        state.put(KEY, picked["panel"])
    return state.clamp(KEY, 0, n_heads - 1, "head")


@dataclass(frozen=True)
class Region:
    """Which part of the head the view draws: ``mode`` "rows" (exact rows ``rows``), "zoom"
    (``rows`` x ``cols`` at full resolution) or "pooled" (the whole head, block-pooled)."""

    mode: str
    rows: slice = field(default_factory=lambda: slice(None))
    cols: slice = field(default_factory=lambda: slice(None))
    note: str = ""


def _region(d: Drawing, c2: st.delta_generator.DeltaGenerator) -> Region:
    """The region controls (zoom, the row window) when the head is too long to draw whole."""
    n_q, n_k = len(d.ax.q_idx), len(d.ax.k_idx)
    w = shown.window_rows(n_q, n_k)
    if w >= n_q:
        return Region("rows")
    with c2:
        zoom = st.toggle("Zoom", key="zoom", help="One region of the head at full resolution.", wrap=True)
    if zoom:
        rows, cols = zoom_controls(n_q, n_k)
        note = f"Query {rows.start}–{rows.stop - 1}, key {cols.start}–{cols.stop - 1} at full resolution."
        return Region("zoom", rows, cols, note)
    if shown.applies(d.res, d.view, d.ax):
        return Region("pooled")
    state.clamp("row0", 0, n_q - w, "first query row")
    with c2:
        row0 = int(st.slider(f"Query rows ({w} of {n_q} at a time)", 0, n_q - w, key="row0", step=1))
    note = "A window of exact rows: " + shown.FALLBACK_NOTE + "." if type(d.res) is AttentionResult else ""
    return Region("rows", slice(row0, row0 + w), note=note)


def zoom_controls(n_q: int, n_k: int) -> tuple[slice, slice]:
    """The zoom region's controls (keys ``zq``, ``zk``, ``zn``): its first query, first key and
    side; returns the (rows, cols) slices of shown positions, clipped to the text."""
    c1, c2, c3 = st.columns(3)
    side_max = min(shown.HEAD_SIDE, max(n_q, n_k))
    state.clamp("zq", 0, max(0, n_q - 1), "first query")
    state.clamp("zk", 0, max(0, n_k - 1), "first key")
    state.clamp("zn", min(8, side_max), side_max, "zoom side")
    with c1:
        q0 = st.number_input("First query", 0, max(0, n_q - 1), key="zq", step=1)
    with c2:
        k0 = st.number_input("First key", 0, max(0, n_k - 1), key="zk", step=1)
    with c3:
        n = st.number_input("Side (tokens)", min(8, side_max), side_max, key="zn", step=8)
    return slice(int(q0), min(n_q, int(q0) + int(n))), slice(int(k0), min(n_k, int(k0) + int(n)))


def _matrix(
    r, key: tuple, d: Drawing, head: int, reg: Region
) -> tuple[np.ndarray, list[str], list[str], str]:
    """(weights, query labels, key labels, how they were made) of the region, from result ``r``."""
    ax = d.ax
    if reg.mode == "pooled":
        img = shown.head_image(r, key, d.layer, head, d.view, ax, d.how)
        return img.z, img.q_labels, img.k_labels, img.note[0].upper() + img.note[1:] + "."
    if reg.mode == "zoom":
        z = shown.zoomed(r, d.layer, head, d.view, ax, reg.rows, reg.cols)
        return z, ax.q_labels[reg.rows], ax.k_labels[reg.cols], ""
    return shown.head_rows(r, d.layer, head, d.view, ax, reg.rows), ax.q_labels[reg.rows], ax.k_labels, ""


def draw(ref: models.ResultRef, d: Drawing, head: int, zmax: float | None) -> None:
    """Head ``head`` of ``d``'s layer up close, then its picker (under it: the head starts level
    with the grid, both on the first screen), with its downloads."""
    top = st.container()
    c1, c2 = st.columns([1, 1])
    with c1:
        pickers.head_picker(d.res.n_heads, d.kv)
    reg = _region(d, c2)
    waits = reg.mode == "pooled" and len(d.ax.q_idx) * len(d.ax.k_idx) > 1 << 20
    spin = st.spinner("Pooling the head…", show_time=True) if waits else contextlib.nullcontext()
    with guarded("drawing the head") as caught, spin:  # past the free memory: the message
        probs, q_lab, k_lab, made = _matrix(d.res, d.key, d, head, reg)
    if caught:
        return
    head_name = F.head_title(head, d.kv[head] if d.kv else None)
    title = f"{ref.name} · {d.res.layout.layer_label(d.layer)} · {head_name}"
    title += f" · {d.stack}" if d.stack_part else ""
    cmap, scale, value = d.cmap, d.scale, d.value_name

    def figure(z: np.ndarray) -> go.Figure:  # the downloads' figure (SVG, PDF, HTML)
        fig = F.head_heatmap(
            z, q_lab, k_lab, title=title, colorscale=cmap, scale=scale, zmax=zmax, value=value, height=HEAD_PX
        )
        # the title starts at the figure's left edge, not the plot area's: long token labels push
        # the plot area right, and a title anchored there ran past the chart's edge
        return fig.update_layout(title_xref="container", title_x=0, title_pad_l=10)

    name = F.figure_name(ref.name, d.stack_part, f"L{d.layer}", f"H{head}")
    panel = P.head_panel(probs, q_lab, k_lab, title=title, scale=scale)
    cell = heatmaps.clicked(HEAD_KEY)
    with top:
        heatmaps.show(
            [panel], P.colour_bar(scale, cmap, zmax, probs, value), key=HEAD_KEY, tile_px=HEAD_PX - 120,
            click="cell", axes=True, name=name,
        )  # fmt: skip
    qk.big_head_link(_as_event(cell, panel), d.layer, head)  # "why does it attend here?" for the clicked cell
    _notes(d, reg, made)
    _downloads(ref, d, head, reg, name, figure, (q_lab, k_lab))


def _as_event(cell: dict | None, panel: P.Panel) -> dict | None:
    """A clicked cell as the selection event `qk.big_head_link` reads (its query and key labels)."""
    if (
        cell is None
        or not (0 <= cell.get("row", -1) < len(panel.q_labels))
        or not (0 <= cell.get("col", -1) < len(panel.k_labels))
    ):
        return None
    point = {"y": panel.q_labels[cell["row"]], "x": panel.k_labels[cell["col"]]}
    return {"selection": {"points": [point]}}


def _notes(d: Drawing, reg: Region, made: str) -> None:
    note = made or reg.note
    notes = [note.rstrip(".")] if note else []
    if d.view.hide and d.res.axes(d.stack)[0].hidden.any():
        notes.append("special/template tokens hidden, rows renormalised")
    if d.view.nosink:
        notes.append("key 0 dropped, rows renormalised (a causal row 0 has nothing left and shows 0)")
    if notes:
        text = "; ".join(notes)
        st.caption(text[0].upper() + text[1:] + ".")


def _downloads(
    ref: models.ResultRef,
    d: Drawing,
    head: int,
    reg: Region,
    name: str,
    figure: Callable[[np.ndarray], go.Figure],
    labels: tuple[list[str], list[str]],
) -> None:
    """NPZ (the raw rows), CSV and HTML (what the view draws), each made when clicked from the
    ref: the callables outlive the run and never hold the result."""
    layer, view, ax, key = d.layer, d.view, d.ax, d.key
    plain = Drawing(None, key, view, layer, ax, d.kv, d.cmap, d.choice, d.scale, d.scale_note, d.side, d.how)

    def result_now() -> AttentionResult:
        return models.result_now(ref)

    def shown_now() -> np.ndarray:  # what the view draws (pooled, zoomed or rows), raw weights
        return _matrix(result_now(), key, plain, head, reg)[0]

    export.downloads(
        name,
        npz=lambda: export.npz_bytes(
            attention=shown.head_rows(result_now(), layer, head, view, ax),
            query_positions=ax.q_idx,
            key_positions=ax.k_idx,
            query_tokens=np.array(ax.q_labels),
            key_tokens=np.array(ax.k_labels),
            model=ref.name,
            layer=layer,
            head=head,
            stack=view.stack,
        ),
        csv=lambda: export.csv_text(shown_now(), labels[0], labels[1], "query \\ key"),
        fig=lambda: figure(shown_now()),
        key="head",
        what=f"weights of {d.res.layout.layer_label(layer)}, head {head}",
        shape=(len(ax.q_idx), len(ax.k_idx)),
    )
