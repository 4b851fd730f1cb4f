"""Per-head statistics as a (layer, head) table, and bar charts."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

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
