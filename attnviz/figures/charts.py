"""Per-head statistics as a (layer, head) table, and bar charts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.figures.labels import _title, escape, head_title, index_ticks


def metric_heatmap(
    values: np.ndarray,
    name: str,
    *,
    kv_heads: Sequence[int] | None = None,
    head_names: Sequence[str] | None = None,
    colorscale: str = "Viridis",
    zmin: float | None = None,
    zmax: float | None = None,
    layers_across: bool = True,
    height: int | None = None,
) -> go.Figure:
    """A (layer, head) table of one head statistic as a heatmap: layers across, heads down
    (like the mosaic). Hover names the layer and the head; ticks are short (L3, H4)."""
    values = np.asarray(values, dtype=np.float64)
    n_l, n_h = values.shape
    heads = (
        list(head_names)
        if head_names is not None
        else [head_title(h, None if kv_heads is None else kv_heads[h]) for h in range(n_h)]
    )
    layers = [f"layer {i}" for i in range(n_l)]
    short_h = [f"H{h}" if head_names is None else head_names[h].replace("kv ", "KV") for h in range(n_h)]
    z, x, y = (values.T, layers, heads) if layers_across else (values, heads, layers)
    layer_vals, layer_text = index_ticks(layers)  # every 1st/2nd/5th layer, horizontal
    xv, xt, yv, yt = (
        (layer_vals, layer_text, y, short_h)
        if layers_across
        else (x, short_h, layer_vals, [f"L{t}" for t in layer_text])
    )
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=x,
            y=y,
            zmin=zmin,
            zmax=zmax,
            colorscale=colorscale,
            colorbar=dict(thickness=10),
            hovertemplate=f"%{{x}} · %{{y}}<br>{escape(name)} %{{z:.3f}}<extra></extra>"
            if layers_across
            else f"%{{y}} · %{{x}}<br>{escape(name)} %{{z:.3f}}<extra></extra>",
        )
    )
    rows = len(y)
    fig.update_layout(
        title=_title(escape(name)),
        height=height or min(900, max(200, 16 * rows + 140)),
        margin=dict(l=10, r=10, t=56, b=10),
        xaxis=dict(
            type="category",
            tickmode="array",
            tickvals=xv,
            ticktext=xt,
            tickangle=0,
            tickfont=dict(size=12),
            title=dict(text="layer" if layers_across else "head"),
        ),
        yaxis=dict(type="category", autorange="reversed", tickmode="array", tickvals=yv, ticktext=yt),
    )
    return fig


@dataclass(frozen=True)
class MetricPanel:
    """One statistic for `metric_panels`: a (layer, head) table (or one column per KV group,
    named by ``head_names``), drawn on ``zmin``..``zmax`` (None: its own range)."""

    values: np.ndarray
    name: str
    head_names: Sequence[str] | None = None
    zmin: float | None = None
    zmax: float | None = None


def metric_panels(
    panels: Sequence[MetricPanel],
    *,
    kv_heads: Sequence[int] | None = None,
    colorscale: str = "Viridis",
    columns: int = 2,
) -> go.Figure:
    """Several (layer, head) statistics in one figure, one heatmap subplot each (layers across,
    heads down; each its own colour bar, hover and ticks as `metric_heatmap`'s). One chart where
    there were seven: a chart's fixed cost in the browser (~0.15 s, twice on a Streamlit mount)
    is paid once."""
    n = len(panels)
    if not n:
        raise ValueError("metric_panels needs at least one statistic")
    n_rows, columns = math.ceil(n / columns), min(columns, n)
    n_heads = max(np.asarray(p.values).shape[1] for p in panels)
    panel_px, gap_px = max(150, 16 * n_heads + 70), 70  # + the subplot title and the layer axis
    height = n_rows * panel_px + (n_rows - 1) * gap_px + 40
    fig = make_subplots(
        rows=n_rows,
        cols=columns,
        subplot_titles=[escape(p.name) for p in panels],
        horizontal_spacing=0.16,
        vertical_spacing=gap_px / height,
    )
    for i, p in enumerate(panels):
        row, col = i // columns + 1, i % columns + 1
        values = np.asarray(p.values, dtype=np.float64)
        n_l, n_h = values.shape
        names = p.head_names
        heads = (
            list(names)
            if names is not None
            else [head_title(h, None if kv_heads is None else kv_heads[h]) for h in range(n_h)]
        )
        short_h = [f"H{h}" if names is None else names[h].replace("kv ", "KV") for h in range(n_h)]
        layers = [f"layer {i}" for i in range(n_l)]
        layer_vals, layer_text = index_ticks(layers)
        sub = fig.get_subplot(row, col)
        x_dom, y_dom = sub.xaxis.domain, sub.yaxis.domain
        fig.add_trace(
            go.Heatmap(
                z=values.T,
                x=layers,
                y=heads,
                zmin=p.zmin,
                zmax=p.zmax,
                colorscale=colorscale,
                name=escape(p.name),
                colorbar=dict(
                    thickness=10, x=x_dom[1] + 0.01, xanchor="left", y=(y_dom[0] + y_dom[1]) / 2,
                    yanchor="middle", len=y_dom[1] - y_dom[0], lenmode="fraction",
                ),
                hovertemplate=f"%{{x}} · %{{y}}<br>{escape(p.name)} %{{z:.3f}}<extra></extra>",
            ),
            row=row,
            col=col,
        )  # fmt: skip
        fig.update_xaxes(
            type="category", tickmode="array", tickvals=layer_vals, ticktext=layer_text, tickangle=0,
            tickfont=dict(size=12), title=dict(text="layer", standoff=4), row=row, col=col,
        )  # fmt: skip
        fig.update_yaxes(
            type="category", autorange="reversed", tickmode="array", tickvals=heads, ticktext=short_h,
            row=row, col=col,
        )  # fmt: skip
    fig.update_annotations(font=dict(size=14), xanchor="left")  # the subplot titles, left-aligned
    for i, ann in enumerate(fig.layout.annotations[:n]):
        ann.x = fig.get_subplot(i // columns + 1, i % columns + 1).xaxis.domain[0]
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=40, b=10))
    return fig


def bar_chart(
    values: Sequence[float], labels: Sequence[str], *, title: str = "", x_title: str = ""
) -> go.Figure:
    """Horizontal bars, first value on top (e.g. the heads that changed most)."""
    fig = go.Figure(
        go.Bar(
            x=list(values),
            y=[escape(s) for s in labels],
            orientation="h",
            hovertemplate="%{y}: %{x:.4f}<extra></extra>",
        )
    )
    fig.update_layout(
        title=_title(escape(title)),
        height=max(240, 22 * len(labels) + 130),
        margin=dict(l=10, r=20, t=56, b=10),
        xaxis=dict(title=dict(text=escape(x_title)), automargin=True),
        yaxis=dict(type="category", autorange="reversed"),
    )
    return fig


def profile_chart(
    x: Sequence[float],
    series: dict[str, Sequence[float]],
    *,
    title: str = "",
    x_title: str = "",
    y_title: str = "",
) -> go.Figure:
    """Lines over a shared x axis, one per named series (e.g. two models' per-layer entropy on a
    relative depth axis)."""
    fig = go.Figure(
        [
            go.Scatter(
                x=list(x),
                y=list(v),
                mode="lines+markers",
                name=escape(name),
                hovertemplate=f"{escape(name)}<br>%{{x:.2f}}: %{{y:.4f}}<extra></extra>",
            )
            for name, v in series.items()
        ]
    )
    fig.update_layout(
        title=_title(escape(title)),
        height=340,
        margin=dict(l=10, r=10, t=56, b=10),
        xaxis=dict(title=dict(text=escape(x_title))),
        yaxis=dict(title=dict(text=escape(y_title))),
        legend=dict(orientation="h", y=-0.2),
    )
    return fig
