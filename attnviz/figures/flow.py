"""Where one token's information comes from: a token strip and a layer × token flow map.

Both take `attnviz.analysis.rollout.TokenRollout.sources` (layers × tokens, each row sums to 1). Long
texts are binned: a bin shows the summed share of its tokens (so the strip still sums to 1)
and is labelled ``"(i–j) token…"``; the payload stays bounded at any length. With ``log`` the
colour is log₁₀ of the share (binned first, so a bin's colour is its summed share) from the
smallest positive share drawn (`share_floor_exp`) up to 1. Rollout multiplies one matrix per
layer, so shares shrink geometrically: on SmolLM2 the last token's strip is 1.0 on the first
token (the sink) and 1e-8..1e-5 elsewhere, below the heatmaps' fixed 1e-5 floor and invisible
on a linear scale; the data's own range shows that structure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.bins import bin_edges
from attnviz.figures.labels import _title, bin_labels, escape, index_ticks, token_ticks

FLOW_MAX_TOKENS = 1024  # token columns before binning (flow map: layers x 1024 cells, < 1 MB)
MIN_FLOOR_EXP = -12  # the log colour never reaches below 1e-12 (float noise, not flow)


def binned_sums(values: np.ndarray, labels: Sequence[str], max_bins: int = FLOW_MAX_TOKENS):
    """(values summed over token bins along the last axis, bin labels); unchanged when short."""
    values = np.asarray(values, dtype=np.float64)
    n = values.shape[-1]
    if n <= max_bins:
        return values, list(labels)
    edges = bin_edges(n, max_bins)
    return np.add.reduceat(values, edges, axis=-1), bin_labels(labels, edges)


def share_floor_exp(z: np.ndarray) -> int:
    """The log colour's lowest decade: that of the smallest positive share (-12 at the lowest,
    -1 at the highest); shares below it (zeros: causal positions after the token) share its colour."""
    pos = z[np.isfinite(z) & (z > 0)]
    if not pos.size:
        return -1
    return int(min(-1, max(MIN_FLOOR_EXP, math.floor(float(np.log10(pos.min()))))))


def _share_colour(z: np.ndarray, log: bool, max_ticks: int = 7) -> dict:
    """Heatmap settings for shares ``z`` (2-D): linear from 0, or log₁₀ from `share_floor_exp`
    to 0 (at most ``max_ticks`` decades labelled) with the share itself in the hover (``customdata``)."""
    if not log:
        return dict(z=z, zmin=0.0, hovertemplate="share %{z:.4f}<extra></extra>")
    lo = share_floor_exp(z)
    step = -(lo // (max_ticks - 1)) if lo < -(max_ticks - 1) else 1  # ceil(-lo / (max_ticks - 1))
    ticks = sorted({*range(lo, 1, step), 0})  # the floor and 1 always labelled
    bar = dict(tickvals=ticks, ticktext=[f"1e{t}" if t else "1" for t in ticks], title=dict(text="share"))
    coloured = np.clip(np.log10(np.maximum(z, 10.0**lo)), lo, 0.0).astype(np.float32)
    return dict(
        z=coloured,
        zmin=float(lo),
        zmax=0.0,
        colorbar=bar,
        customdata=z.astype(np.float32),
        hovertemplate="share %{customdata:.2e}<extra></extra>",
    )


def token_strip(
    weights: np.ndarray, labels: Sequence[str], *, title: str, colorscale: str = "Viridis", log: bool = False
) -> go.Figure:
    """One row of colour over the tokens: the share of each in the selected token's rollout."""
    z, x = binned_sums(weights, labels)
    x = [escape(t) for t in x]
    colour = _share_colour(z[None, :], log, max_ticks=3)  # a 180-px strip: three labels fit
    colour["hovertemplate"] = "%{x}<br>" + colour["hovertemplate"]
    fig = go.Figure(go.Heatmap(x=x, y=["source"], colorscale=colorscale, **colour))
    fig.update_traces(colorbar_thickness=10)
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
    log: bool = False,
) -> go.Figure:
    """Layers down (input of layer l, first layer on top), tokens across: how much of each token
    at that depth ends up in the selected token after the last layer."""
    z, x = binned_sums(sources, labels)
    x = [escape(t) for t in x]
    n_layers = z.shape[0]
    layers = list(layer_names) if layer_names is not None else [f"layer {i}" for i in range(n_layers)]
    vals, text = index_ticks(layers)
    colour = _share_colour(z, log)
    colour["hovertemplate"] = "into %{y}: %{x}<br>" + colour["hovertemplate"]
    fig = go.Figure(go.Heatmap(x=x, y=layers, colorscale=colorscale, **colour))
    fig.update_traces(colorbar_thickness=10)
    fig.update_layout(
        title=_title(escape(title)),
        height=min(900, max(240, 14 * n_layers + 140)),
        margin=dict(l=10, r=10, t=56, b=10),
        xaxis=dict(type="category", **token_ticks(x)),
        yaxis=dict(
            type="category",
            autorange="reversed",
            tickmode="array",
            tickvals=vals,
            ticktext=text,
            title=dict(text="layer (input of)"),
        ),
    )
    return fig
