"""Token-by-token heatmaps: one head, rows of one query, any labelled 2-D array."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.bins import SINGLE_MAX_CELLS, SINGLE_MAX_KEYS, downsample
from attnviz.figures.colour import DIVERGING, _coloraxis, _colour, _max, _weight_hover, resolve_scale
from attnviz.figures.labels import TITLE_MARGIN, _title, bin_labels, escape, token_ticks


def _token_heatmap(
    z: np.ndarray,
    row_labels: Sequence[str],
    k_labels: Sequence[str],
    *,
    log: bool | str,
    row_name: str = "",
    value: str = "weight",
) -> tuple[go.Figure, list[str], list[str]]:
    """One heatmap over token labels (escaped: tokens are text, never HTML) sharing the figure's
    colour axis; returns the figure and the escaped key (x) and row (y) labels."""
    x, y = [escape(s) for s in k_labels], [escape(s) for s in row_labels]
    hover = f"{row_name}%{{y}}<br>key %{{x}}<br>{_weight_hover(log, escape(value))}<extra></extra>"
    return go.Figure(go.Heatmap(z=z, x=x, y=y, coloraxis="coloraxis", hovertemplate=hover)), x, y


def pool_head(
    probs: np.ndarray, q_labels: Sequence[str], k_labels: Sequence[str], max_cells: int = SINGLE_MAX_CELLS
) -> tuple[np.ndarray, list[str], list[str], str]:
    """(weights, query labels, key labels, a note for the title) of one head: max-pooled when
    larger than ``max_cells`` (the note says to what), else as given."""
    n_q, n_k = probs.shape
    if len(q_labels) != n_q or len(k_labels) != n_k:
        raise ValueError(f"labels ({len(q_labels)}, {len(k_labels)}) do not match probs {probs.shape}")
    if n_q * n_k <= max_cells:
        return probs, list(q_labels), list(k_labels), ""
    side = int(math.sqrt(max_cells))
    rows_max = side if n_q >= side else n_q
    cols_max = max_cells // max(1, min(rows_max, n_q))
    probs, re, ce = downsample(probs, rows_max, cols_max, "max")
    note = f" (max-pooled to {probs.shape[0]}×{probs.shape[1]})"
    return probs, bin_labels(q_labels, re), bin_labels(k_labels, ce), note


def head_heatmap(
    probs: np.ndarray,
    q_labels: Sequence[str],
    k_labels: Sequence[str] | None = None,
    *,
    title: str = "",
    colorscale: str = "Viridis",
    log: bool = False,
    zmax: float | None = None,
    max_cells: int = SINGLE_MAX_CELLS,
    height: int = 640,
    scale: str | None = None,
    value: str = "weight",
) -> go.Figure:
    """One head's (query_pos, key_pos) weights; max-pooled when larger than ``max_cells``.

    Hover shows the query token, the key token (with positions) and the weight; ``value`` names
    what is drawn on the colour bar and in the hover (e.g. "‖α·W_O v‖" for value-weighted).
    """
    probs = np.asarray(probs, dtype=np.float32)
    mode = resolve_scale(log, scale)  # ``scale`` ("linear" | "log" | "rank") overrides ``log``
    k_labels = q_labels if k_labels is None else k_labels
    probs, q_labels, k_labels, note = pool_head(probs, q_labels, k_labels, max_cells)
    fig, x, y = _token_heatmap(
        _colour(probs, mode), q_labels, k_labels, log=mode, row_name="query ", value=value
    )
    fig.update_layout(
        title=_title(escape(title) + note),
        coloraxis=_coloraxis(
            colorscale, mode, zmax if zmax is not None else _max(probs), title=escape(value)
        ),
        height=height,
        margin=dict(l=10, r=10, t=TITLE_MARGIN, b=10),
        xaxis=dict(
            type="category", title=dict(text="key"), tickangle=-60, constrain="domain", **token_ticks(x)
        ),
        yaxis=dict(type="category", title=dict(text="query"), autorange="reversed", **token_ticks(y)),
    )
    return fig


def rows_heatmap(
    rows: np.ndarray,
    row_labels: Sequence[str],
    k_labels: Sequence[str],
    *,
    title: str = "",
    colorscale: str = "Viridis",
    log: bool = False,
    highlight: int | None = None,
    max_cols: int = SINGLE_MAX_KEYS,
    scale: str | None = None,
) -> go.Figure:
    """Attention rows of one query (one row per head, or per layer) over the key positions."""
    rows = np.asarray(rows, dtype=np.float32)
    mode = resolve_scale(log, scale)
    note = ""
    if rows.shape[1] > max_cols:
        rows, _, ce = downsample(rows, rows.shape[0], max_cols, "max")
        k_labels = bin_labels(k_labels, ce)
        note = f" (keys max-pooled to {rows.shape[1]})"
    fig, x, y = _token_heatmap(_colour(rows, mode), row_labels, k_labels, log=mode)
    fig.update_layout(
        title=_title(escape(title) + note),
        coloraxis=_coloraxis(colorscale, mode, _max(rows)),
        height=max(240, 28 * len(row_labels) + 190),
        margin=dict(l=10, r=10, t=TITLE_MARGIN, b=10),
        xaxis=dict(type="category", title=dict(text="key"), tickangle=-60, **token_ticks(x)),
        yaxis=dict(type="category", autorange="reversed", **token_ticks(y)),
    )
    if highlight is not None and 0 <= highlight < len(k_labels):
        fig.add_vline(x=highlight, line=dict(color="red", width=1, dash="dot"))
    return fig


def matrix_heatmap(
    a: np.ndarray,
    *,
    title: str = "",
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    x_title: str = "",
    y_title: str = "",
    colorscale: str | None = None,
    max_cells: int = 250_000,
    height: int = 360,
) -> go.Figure:
    """A generic 2-D array (Q, K, V, scores...) with optional token labels; signed data gets a
    diverging scale centred on 0; -inf (masked scores) shows as a gap."""
    a = np.asarray(a, dtype=np.float32)
    rows_l = list(row_labels) if row_labels is not None else [str(i) for i in range(a.shape[0])]
    cols_l = list(col_labels) if col_labels is not None else [str(i) for i in range(a.shape[1])]
    if a.size > max_cells:
        side = int(math.sqrt(max_cells))
        finite = np.where(np.isfinite(a), a, np.nan)
        a, re, ce = downsample(np.nan_to_num(finite, nan=0.0), side, side, "mean")
        rows_l, cols_l = bin_labels(rows_l, re), bin_labels(cols_l, ce)
    z = np.where(np.isfinite(a), a, np.nan)
    finite = z[np.isfinite(z)]
    signed = finite.size and float(finite.min()) < 0
    bound = float(np.abs(finite).max()) if finite.size else 1.0
    x, y = [escape(s) for s in cols_l], [escape(s) for s in rows_l]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=x,
            y=y,
            colorscale=colorscale or (DIVERGING if signed else "Viridis"),
            zmid=0.0 if signed else None,
            zmin=-bound if signed else None,
            zmax=bound if signed else None,
            hoverongaps=False,
            hovertemplate="row %{y}<br>col %{x}<br>%{z:.4g}<extra></extra>",
        )
    )
    long_cols = col_labels is not None and any(len(s) > 4 for s in cols_l)  # tokens, not "d12"
    fig.update_layout(
        title=_title(escape(title)),
        height=height,
        margin=dict(l=10, r=10, t=TITLE_MARGIN, b=10),
        xaxis=dict(
            type="category",
            title=dict(text=escape(x_title)),
            **(dict(tickangle=-60, **token_ticks(x)) if long_cols else {}),
        ),
        yaxis=dict(
            type="category",
            title=dict(text=escape(y_title)),
            autorange="reversed",
            **(token_ticks(y) if row_labels is not None else {}),
        ),
    )
    return fig
