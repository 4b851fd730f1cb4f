"""All heads of one layer in one figure with a shared colour axis."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.figures.bins import GRID_MAX_CELLS, GRID_MAX_SIDE, downsample, grid_side
from attnviz.figures.colour import DIVERGING, _coloraxis, _colour, _max, _weight_hover, resolve_scale
from attnviz.figures.labels import bin_labels, escape, head_title, token_ticks


def head_grid(
    layer_probs: np.ndarray,
    q_labels: Sequence[str],
    k_labels: Sequence[str] | None = None,
    *,
    heads: Sequence[int] | None = None,
    kv_heads: Sequence[int] | None = None,
    cols: int | None = None,
    titles: Sequence[str] | None = None,
    colorscale: str = "Viridis",
    log: bool = False,
    zmax: float | None = None,
    diverging: bool = False,
    max_cells: int = GRID_MAX_CELLS,
    facet_px: int = 160,
    scale: str | None = None,
    pickable: bool = False,
    max_side: int = GRID_MAX_SIDE,
    value: str = "weight",
    open_head: int | None = None,
    colorbar: bool = True,
) -> go.Figure:
    """All heads of one layer, one heatmap each, in one figure with a shared colour axis.
    (``max_side``: bins per facet side at most; the notebook's `head_view` draws up to 256.)

    ``layer_probs`` is (heads, query_pos, key_pos), already pooled or not (pooled here to fit
    ``max_cells``). ``kv_heads[i]`` labels each facet "head h · kv g"; with GQA the grid puts
    one KV group per row. ``diverging`` draws signed differences around 0. ``scale``
    ("linear" | "log" | "rank") overrides ``log``; pass the view's ``zmax`` so the grid and the
    big head share one colour scale. ``value`` names what is drawn (colour bar, hover).
    ``pickable`` adds a small clickable marker in each facet's top-right corner (customdata: the
    head) for selection events, leaving the cells' hover to the heatmaps.

    ``facet_px`` is each square tile's side in pixels (`grid_shape` fits it to a space); token
    labels are drawn only where each fits its row (`labels_fit`), the hover gives every value.
    ``open_head`` (a head of ``heads``) is framed. ``colorbar=False`` leaves the colour bar out
    (a view that shows the same scale beside the grid).
    """
    layer_probs = np.asarray(layer_probs, dtype=np.float32)
    mode = resolve_scale(log, scale)
    k_labels = q_labels if k_labels is None else k_labels
    n_h = layer_probs.shape[0]
    heads = list(range(n_h)) if heads is None else [int(h) for h in heads]
    side = grid_side(n_h, max_cells, max_side, n_tokens=max(layer_probs.shape[-2:]))
    pooled, re, ce = downsample(layer_probs, side, side, "mean" if diverging else "max")
    ql, kl = bin_labels(q_labels, re), bin_labels(k_labels, ce)
    if cols is None:
        cols = _grid_cols(n_h, kv_heads)
    rows = math.ceil(n_h / cols)
    if titles is None:
        titles = [head_title(h, None if kv_heads is None else kv_heads[i]) for i, h in enumerate(heads)]
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=[escape(t) for t in titles],
        horizontal_spacing=0.02,
        vertical_spacing=TITLE_PX / (rows * (facet_px + TITLE_PX)) if rows > 1 else 0.0,
        shared_xaxes="all",
        shared_yaxes="all",
    )
    x, y = [escape(s) for s in kl], [escape(s) for s in ql]
    z_all = pooled if diverging else _colour(pooled, mode)
    hover = "%{z:+.4f}" if diverging else _weight_hover(mode, escape(value))
    for i in range(n_h):
        fig.add_trace(
            go.Heatmap(
                z=z_all[i],
                x=x,
                y=y,
                coloraxis="coloraxis",
                name=titles[i],
                hovertemplate=f"{escape(titles[i])}<br>query %{{y}}<br>key %{{x}}<br>{hover}<extra></extra>",
            ),
            row=i // cols + 1,
            col=i % cols + 1,
        )
    if diverging:
        bound = float(np.nanmax(np.abs(pooled))) if pooled.size else 1.0
        bound = bound or 1.0
        axis = dict(colorscale=DIVERGING, cmin=-bound, cmax=bound, cmid=0.0, colorbar=dict(title="Δ weight"))
    else:
        axis = _coloraxis(colorscale, mode, zmax if zmax is not None else _max(pooled), title=escape(value))
    show_ticks = labels_fit(max(len(ql), len(kl)), facet_px)
    # fixed ranges: the click targets' markers padded the autorange, shrinking each tile in its cell
    fig.update_xaxes(type="category", showticklabels=False, ticks="", tickangle=-90, showgrid=False,
                     range=[-0.5, len(x) - 0.5])  # fmt: skip
    fig.update_yaxes(
        type="category", range=[len(y) - 0.5, -0.5], showticklabels=False, ticks="", showgrid=False
    )
    if show_ticks:
        small = dict(size=11 if len(ql) <= 8 else 9)
        fig.update_xaxes(**{**token_ticks(x), "tickfont": small})
        fig.update_yaxes(**{**token_ticks(y), "tickfont": small})
    if show_ticks:  # token labels on the left column and under the bottom facet of each column
        for i in range(n_h):
            r, c = i // cols + 1, i % cols + 1
            if i + cols >= n_h:
                fig.update_xaxes(showticklabels=True, row=r, col=c)
            if c == 1:
                fig.update_yaxes(showticklabels=True, row=r, col=c)
    # the colour bar lies under the tiles: beside them it took a fifth of a half-page column
    bar: dict = dict(axis.get("colorbar") or {})  # type: ignore[call-overload]
    title = bar.get("title", {})
    title = dict(text=title) if isinstance(title, str) else title
    axis["colorbar"] = {**bar, **COLORBAR_BELOW, "title": {**title, "side": "top"}}
    axis["showscale"] = colorbar
    below = (LABEL_PX if show_ticks else 0) + (COLORBAR_PX if colorbar else 4)
    fig.update_layout(
        coloraxis=axis,
        height=rows * (facet_px + TITLE_PX) + 2 * TITLE_PX + below,
        margin=dict(l=10, r=10, t=2 * TITLE_PX, b=below),
        showlegend=False,
    )
    fig.update_annotations(font_size=11)
    if not diverging and pooled.shape[1] == pooled.shape[2]:  # square tiles for square matrices
        fig.update_yaxes(scaleanchor="x", constrain="domain")
        fig.update_xaxes(constrain="domain")
    if open_head is not None and open_head in heads:
        i = heads.index(open_head)
        n = "" if i == 0 else str(i + 1)
        fig.add_shape(
            type="rect", xref=f"x{n} domain", yref=f"y{n} domain", x0=-0.03, x1=1.03, y0=-0.03, y1=1.03,
            line=dict(color=OPEN_MARK, width=3), name="open head",
        )  # fmt: skip
    if pickable:
        _add_pickers(fig, heads, titles, cols, x, y)
    return fig


OPEN_MARK = "#ff2b2b"  # the frame of the head open large (the app's accent red)
TITLE_PX = 18  # a tile's title line (twice over the first row: room for the figure's title)
LABEL_PX = 60  # room for the key labels under the bottom row, when drawn
COLORBAR_PX = 46  # the horizontal colour bar under the tiles
COLORBAR_BELOW = dict(orientation="h", x=0.5, xanchor="center", y=0, yref="container", yanchor="bottom",
                      thickness=10, len=0.9)  # fmt: skip
LABEL_MIN_PX = 12  # a token label needs this many pixels of its row, else labels overlap


def labels_fit(n_bins: int, tile_px: int) -> bool:
    """True when each of ``n_bins`` rows of a ``tile_px`` tile has room for a token label."""
    return n_bins > 0 and tile_px / n_bins >= LABEL_MIN_PX


def grid_shape(
    n_heads: int,
    width_px: int,
    height_px: int,
    kv_heads: Sequence[int] | None = None,
    *,
    colorbar: bool = True,
) -> tuple[int, int]:
    """(columns, tile side in px) of the largest square tiles for ``n_heads`` in a space of
    ``width_px`` x ``height_px`` (titles included). One KV group per row (`_grid_cols`) unless
    another column count makes tiles a quarter larger."""

    def tile(cols: int) -> int:
        rows = math.ceil(n_heads / cols)
        fit_w = width_px / cols - 6
        fit_h = (height_px - 2 * TITLE_PX - (COLORBAR_PX if colorbar else 4)) / rows - TITLE_PX
        return max(16, int(min(fit_w, fit_h)))

    preferred = _grid_cols(n_heads, kv_heads)
    best = max(range(1, n_heads + 1), key=tile)
    cols = best if tile(best) > 1.25 * tile(preferred) else preferred
    return cols, tile(cols)


PICK_LATTICE = 8  # click targets per tile side: any click on a tile lands within ~15 px of one


def _add_pickers(
    fig: go.Figure, heads: Sequence[int], titles: Sequence[str], cols: int, x: list[str], y: list[str]
) -> None:
    """Make every facet clickable: heatmaps are not selectable in Plotly (a click on a cell is no
    selection event), so each facet gets a lattice of invisible points covering it (customdata:
    the head; a click anywhere on the tile lands on one). No visible marker: a grey square in a
    corner read as an unticked checkbox; the hover and the page's caption say a click opens it."""
    n = PICK_LATTICE
    xi = sorted({round(i * (len(x) - 1) / (n - 1)) for i in range(n)})
    yi = sorted({round(i * (len(y) - 1) / (n - 1)) for i in range(n)})
    for i, h in enumerate(heads):
        where = dict(row=i // cols + 1, col=i % cols + 1)
        tip = f"{escape(titles[i])}: click to show it big<extra></extra>"
        fig.add_trace(
            go.Scatter(
                x=[x[a] for a in xi for _ in yi],
                y=[y[b] for _ in xi for b in yi],
                mode="markers",
                marker=dict(size=22, opacity=0, color="#fff"),
                customdata=[[int(h)]] * (len(xi) * len(yi)),
                name=f"tile {titles[i]}",
                hovertemplate=tip,
                showlegend=False,
            ),
            **where,
        )


def _grid_cols(n_heads: int, kv_heads: Sequence[int] | None) -> int:
    """One KV group per row under GQA (if groups are 2..8 wide), else up to 4 columns."""
    if kv_heads is not None:
        group = sum(1 for g in kv_heads if g == kv_heads[0])
        if 1 < group <= 8 and n_heads % group == 0:
            return group
    return min(n_heads, 4 if n_heads <= 16 else 8)
