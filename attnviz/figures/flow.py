"""Where one token's information comes from: a token strip and a layer × token flow map.

Both take `attnviz.rollout.TokenRollout.sources` (layers × tokens, each row sums to 1). Long
texts are binned: a bin shows the summed share of its tokens (so the strip still sums to 1)
and is labelled ``"(i–j) token…"``; the payload stays bounded at any length.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.labels import _title, bin_labels, escape, index_ticks, token_ticks
from attnviz.figures.pooling import bin_edges

FLOW_MAX_TOKENS = 1024  # token columns before binning (flow map: layers x 1024 cells, < 1 MB)


def binned_sums(values: np.ndarray, labels: Sequence[str], max_bins: int = FLOW_MAX_TOKENS):
    """(values summed over token bins along the last axis, bin labels); unchanged when short."""
    values = np.asarray(values, dtype=np.float64)
    n = values.shape[-1]
    if n <= max_bins:
        return values, list(labels)
    edges = bin_edges(n, max_bins)
    return np.add.reduceat(values, edges, axis=-1), bin_labels(labels, edges)


def token_strip(
    weights: np.ndarray, labels: Sequence[str], *, title: str, colorscale: str = "Viridis"
) -> go.Figure:
    """One row of colour over the tokens: the share of each in the selected token's rollout."""
    z, x = binned_sums(weights, labels)
    x = [escape(t) for t in x]
    fig = go.Figure(
        go.Heatmap(
            z=z[None, :],
            x=x,
            y=["source"],
            zmin=0.0,
            colorscale=colorscale,
            colorbar=dict(thickness=10),
            hovertemplate="%{x}<br>share %{z:.4f}<extra></extra>",
        )
    )
    fig.update_layout(
        title=_title(escape(title)),
        height=180,
        margin=dict(l=10, r=10, t=56, b=10),
        xaxis=dict(type="category", **token_ticks(x)),
        yaxis=dict(type="category", showticklabels=False),
    )
    return fig


def flow_map(
    sources: np.ndarray,
    labels: Sequence[str],
    *,
    title: str,
    layer_names: Sequence[str] | None = None,
    colorscale: str = "Viridis",
) -> go.Figure:
    """Layers down (input of layer l, first layer on top), tokens across: how much of each token
    at that depth ends up in the selected token after the last layer."""
    z, x = binned_sums(sources, labels)
    x = [escape(t) for t in x]
    n_layers = z.shape[0]
    layers = list(layer_names) if layer_names is not None else [f"layer {i}" for i in range(n_layers)]
    vals, text = index_ticks(layers)
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=x,
            y=layers,
            zmin=0.0,
            colorscale=colorscale,
            colorbar=dict(thickness=10),
            hovertemplate="into %{y}: %{x}<br>share %{z:.4f}<extra></extra>",
        )
    )
    fig.update_layout(
        title=_title(escape(title)),
        height=min(900, max(240, 14 * n_layers + 140)),
        margin=dict(l=10, r=10, t=56, b=10),
        xaxis=dict(type="category", **token_ticks(x)),
        yaxis=dict(type="category", autorange="reversed", tickmode="array", tickvals=vals, ticktext=text),
    )
    return fig
