"""Every (layer, head) of a model at once, tiled into one heatmap."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.bins import MOSAIC_MAX_CELLS
from attnviz.figures.colour import _coloraxis, _colour, _max, _weight_hover, resolve_scale
from attnviz.figures.labels import escape, head_title
from attnviz.figures.panels import Panel

_CLEAR = "rgba(0,0,0,0)"


def model_mosaic(
    images: np.ndarray,
    *,
    colorscale: str = "Viridis",
    log: bool = False,
    kv_heads: Sequence[int] | None = None,
    q_labels: Sequence[str] | None = None,
    k_labels: Sequence[str] | None = None,
    layers_across: bool | None = None,
    width_px: int = 1100,
    scale: str | None = None,
    pickable: bool = False,
    selected: tuple[int, int] | None = None,
    layer_names: Sequence[str] | None = None,
) -> go.Figure:
    """Every (layer, head) at once: (layers, heads, s_q, s_k) small images tiled into one heatmap.

    The longer of the two counts runs across (30 layers x 9 heads: layers are columns), so the
    tiles stay square and the figure short. A one-cell gap separates tiles. Hover names the
    layer, the head and (with ``q_labels`` / ``k_labels``, one per tile row / column) the tokens.
    Build ``images`` with `pooled_rows` to fit `MOSAIC_MAX_CELLS`. ``pickable`` lays one
    transparent marker over each tile (customdata: layer, head) so a click on a thumbnail is a
    selection event; its hover then names the tile. ``selected`` (layer, head) frames that tile.
    ``layer_names`` (e.g. a hybrid's block indices) replace "layer i".
    """
    images = np.asarray(images, dtype=np.float32)
    mode = resolve_scale(log, scale)
    n_l, n_h, s_r, s_c = images.shape
    across = n_l > n_h if layers_across is None else layers_across
    grid = images.transpose(1, 0, 2, 3) if across else images  # (outer rows, outer cols, s_r, s_c)
    n_rows, n_cols = grid.shape[:2]
    tile_r, tile_c = s_r + 1, s_c + 1
    canvas = np.full((n_rows * tile_r, n_cols * tile_c), np.nan, dtype=np.float32)
    for i in range(n_rows):
        for j in range(n_cols):
            canvas[i * tile_r : i * tile_r + s_r, j * tile_c : j * tile_c + s_c] = grid[i, j]
    layer_names = list(layer_names) if layer_names is not None else [f"layer {i}" for i in range(n_l)]
    head_names = [head_title(h, None if kv_heads is None else kv_heads[h]) for h in range(n_h)]
    row_names, col_names = (head_names, layer_names) if across else (layer_names, head_names)
    ql = [escape(x) for x in q_labels] if q_labels is not None else [f"bin {r}" for r in range(s_r)]
    kl = [escape(x) for x in k_labels] if k_labels is not None else [f"bin {c}" for c in range(s_c)]
    ylab = [
        f"{row_names[r // tile_r]} · query {ql[r % tile_r]}"
        if r % tile_r < s_r
        else f"{row_names[r // tile_r]} ·"
        for r in range(canvas.shape[0])
    ]
    xlab = [
        f"{col_names[c // tile_c]} · key {kl[c % tile_c]}"
        if c % tile_c < s_c
        else f"{col_names[c // tile_c]} ·"
        for c in range(canvas.shape[1])
    ]
    fig = go.Figure(
        go.Heatmap(
            z=_colour(canvas, mode),
            x=xlab,
            y=ylab,
            coloraxis="coloraxis",
            hoverongaps=False,
            hovertemplate=f"%{{y}}<br>%{{x}}<br>{_weight_hover(mode)}<extra></extra>",
        )
    )
    short_rows = [f"H{h}" for h in range(n_h)] if across else [f"L{i}" for i in range(n_l)]
    short_cols = [f"L{i}" for i in range(n_l)] if across else [f"H{h}" for h in range(n_h)]
    cell_px = (width_px - 120) / canvas.shape[1]
    fig.update_layout(
        coloraxis=_coloraxis(colorscale, mode, _max(images) if images.size else 1.0),
        height=int(min(2400, max(260, canvas.shape[0] * cell_px + 70))),
        margin=dict(l=10, r=10, t=40, b=10),
        xaxis=dict(
            type="category",
            side="top",
            tickmode="array",
            tickvals=[xlab[j * tile_c + s_c // 2] for j in range(n_cols)],
            ticktext=short_cols,
            showgrid=False,
        ),
        yaxis=dict(
            type="category",
            autorange="reversed",
            tickmode="array",
            tickvals=[ylab[i * tile_r + s_r // 2] for i in range(n_rows)],
            ticktext=short_rows,
            scaleanchor="x",
            showgrid=False,
        ),
        plot_bgcolor="rgba(0,0,0,0)",
    )
    centres_x = [xlab[j * tile_c + s_c // 2] for j in range(n_cols)]
    centres_y = [ylab[i * tile_r + s_r // 2] for i in range(n_rows)]

    def tile(layer: int, head: int) -> tuple[str, str]:
        i, j = (head, layer) if across else (layer, head)
        return centres_x[j], centres_y[i]

    if pickable:
        cells = [(layer, head) for layer in range(n_l) for head in range(n_h)]
        xs, ys = zip(*(tile(layer, head) for layer, head in cells), strict=True)
        fig.add_trace(
            go.Scatter(
                x=list(xs),
                y=list(ys),
                mode="markers",
                # half a tile: the chart may be drawn narrower than width_px, and markers that
                # overlap their neighbours make a click pick the wrong tile
                marker=dict(symbol="square", size=max(4.0, 0.5 * cell_px * min(s_r, s_c)), color=_CLEAR),
                customdata=[[layer, head] for layer, head in cells],
                text=[f"{layer_names[layer]} · {head_names[head]}" for layer, head in cells],
                hovertemplate="%{text}: click to open<extra></extra>",
                name="tiles",
                showlegend=False,
            )
        )
    if selected is not None and 0 <= selected[0] < n_l and 0 <= selected[1] < n_h:
        sx, sy = tile(*selected)
        fig.add_trace(
            go.Scatter(
                x=[sx],
                y=[sy],
                mode="markers",
                marker=dict(
                    symbol="square-open",
                    size=max(8.0, cell_px * (min(s_r, s_c) + 2)),
                    color="#e4002b",
                    line=dict(width=2.5),
                ),
                hoverinfo="skip",
                name="selected head",
                showlegend=False,
            )
        )
    return fig


def mosaic_panels(
    images: np.ndarray,
    *,
    q_labels: Sequence[str],
    k_labels: Sequence[str],
    scale: str = "linear",
    layer_names: Sequence[str] | None = None,
    kv_heads: Sequence[int] | None = None,
) -> list[Panel]:
    """Every (layer, head) tile of ``images`` (layers, heads, s_q, s_k) as a panel for a browser
    element that draws them once (the app's `ui.heatmaps`), row by row: heads down, layers across
    (panel ``h * layers + l`` is layer l's head h; lay them out ``layers`` columns wide). Each
    panel's values are the tile as drawn on ``scale`` (float32: the hover's exact value); its
    title names the layer and the head ("L3 H4", a hybrid's block index for L)."""
    images = np.asarray(images, dtype=np.float32)
    n_l, n_h = images.shape[:2]
    mode = resolve_scale(False, scale)
    drawn = _colour(images, mode).astype(np.float32)
    short = [n.replace("layer ", "L") for n in layer_names] if layer_names else [f"L{i}" for i in range(n_l)]
    heads = mosaic_row_titles(kv_heads, n_h)
    ql, kl = list(q_labels), list(k_labels)
    return [Panel(f"{short[la]} {heads[h]}", drawn[la, h], ql, kl) for h in range(n_h) for la in range(n_l)]


def mosaic_row_titles(kv_heads: Sequence[int] | None, n_heads: int) -> list[str]:
    """The mosaic's row (head) names: "H4", with GQA "H4 kv1"."""
    return [f"H{h}" if kv_heads is None else f"H{h} kv{kv_heads[h]}" for h in range(n_heads)]


def mosaic_side(n_layers: int, n_heads: int, max_cells: int = MOSAIC_MAX_CELLS, max_side: int = 64) -> int:
    """Pixels per side of each tile so that a (layers x heads) mosaic fits ``max_cells``."""
    return max(4, min(max_side, int(math.sqrt(max_cells / max(1, n_layers * n_heads))) - 1))
