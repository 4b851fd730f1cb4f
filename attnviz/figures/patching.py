"""Figures of activation patching, attribution patching and head search (`attnviz.patch`,
`attnviz.attribution_patch`, `attnviz.explain.search`): pure builders, typed results in,
``go.Figure`` out, also the notebook views. Clickable cells carry ``customdata`` [layer, head]
(-1: not a head), as in `figures.explain`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.figures.explain import _short, _subplot_title
from attnviz.figures.labels import TITLE_MARGIN, _title, escape

if TYPE_CHECKING:
    from attnviz.explain.patching import Patching
    from attnviz.explain.search import HeadScores

PATCH_COLOURS = "RdBu_r"  # diverging, centred at 0 (the corrupted run); 1 is the clean run
BAR = dict(thickness=12, lenmode="pixels", len=280, y=1.0, yanchor="top")  # tall grids: a bar at the top


def _patch_grid(res: Patching, values: np.ndarray) -> tuple[np.ndarray, list[str], list[str], list]:
    """A patching grid as a 2-D heatmap: (z, row labels, column labels, customdata [layer, head])."""
    n_l = values.shape[0]
    cols = [
        f"({p}){'≠' if p in res.pairing.differing else ''} {escape(_short(res_token(res, p), 10))}"
        for p in res.pairing.target
    ]
    if res.dims == ("layer", "head"):
        n_h = values.shape[1]
        data = [[[la, h] for h in range(n_h)] for la in range(n_l)]
        return values, [f"L{la}" for la in range(n_l)], [f"H{h}" for h in range(n_h)], data
    if res.dims == ("layer", "position"):
        data = [[[la, -1] for _ in cols] for la in range(n_l)]
        return values, [f"L{la}" for la in range(n_l)], cols, data
    inner = values.shape[1]  # heads, or the block parts
    z = values.reshape(n_l * inner, -1)
    if res.dims[1] == "head":
        rows = [f"L{la} H{h}" for la in range(n_l) for h in range(inner)]
        data = [[[la, h] for _ in cols] for la in range(n_l) for h in range(inner)]
    else:
        names = ("attn", "mlp") if res.parts == ("attention", "mlp") else res.parts  # a hybrid's mixers
        rows = [f"L{la} {names[k]}" for la in range(n_l) for k in range(inner)]
        data = [[[la, -1] for _ in cols] for la in range(n_l) for _k in range(inner)]
    return z, rows, cols, data


def res_token(res: Patching, position: int) -> str:
    """The patched run's token at ``position`` (the corrupted prompt when denoising)."""
    tokens = res.corrupted if res.direction == "denoise" else res.clean
    return tokens.display[position]


def _patch_heatmap(res: Patching, values: np.ndarray, lim: float, colorbar: dict | None) -> go.Heatmap:
    z, rows, cols, data = _patch_grid(res, values)
    return go.Heatmap(
        z=z,
        x=cols,
        y=rows,
        zmin=-lim,
        zmax=lim,
        zmid=0.0,
        colorscale=PATCH_COLOURS,
        customdata=data,
        showscale=colorbar is not None,
        colorbar=colorbar,
        hoverongaps=False,
        hovertemplate="%{y} · %{x}: %{z:.3f}"
        + ("<br>click: open the head" if "head" in res.dims else "")
        + "<extra></extra>",
    )


def _patch_title(res: Patching) -> str:
    kind = "ESTIMATE · attribution patching" if res.estimate else "activation patching"
    what = f"logit(“{escape(res.answer_token)}”) − logit(“{escape(res.wrong_token)}”)"
    return (
        f"{kind} · {res.over} · {res.direction}<br>{what} normalised: 0 = corrupted "
        f"({res.corrupted_diff:.2f}), 1 = clean ({res.clean_diff:.2f})"
    )


def patching_view(res: Patching, *, height: int | None = None) -> go.Figure:
    """The normalised metric of every cell on a diverging scale centred at 0 (the corrupted run):
    layer × head, layer × position, (layer, head) × position or (layer, block) × position. Columns
    are the patched run's positions, ≠ marking tokens that differ between the prompts. Cells carry
    [layer, head] (head -1 for the stream and blocks) to open a head in the explorer."""
    lim = max(1.0, float(np.nanmax(np.abs(res.values))))
    bar = dict(title=dict(text="estimate" if res.estimate else "patched", side="right"), **BAR)
    fig = go.Figure(_patch_heatmap(res, res.values, lim, bar))
    n_rows = len(_patch_grid(res, res.values)[1])
    fig.update_layout(
        title=_title(_patch_title(res), size=13),
        height=height or max(360, 18 * n_rows + 180),
        margin=dict(l=80, r=20, t=TITLE_MARGIN + 30, b=90),
        yaxis=dict(autorange="reversed"),
    )
    return fig


def patching_comparison_view(res: Patching, *, height: int | None = None) -> go.Figure:
    """Attribution patching beside the real patches of its verified cells: the estimate, the real
    value (blank where not verified) and estimate − real, one diverging scale."""
    real = np.full(res.values.shape, np.nan)
    for idx, (_, r) in res.verified.items():
        real[idx] = r
    diff = res.values - real
    lim = max(1.0, float(np.nanmax(np.abs(res.values))), float(np.nanmax(np.abs(np.nan_to_num(real)))))
    fig = make_subplots(
        rows=1,
        cols=3,
        shared_yaxes=True,
        horizontal_spacing=0.04,
        subplot_titles=(
            "ESTIMATE (attribution patching)",
            f"real patch (top {len(res.verified)} cells)",
            "estimate − real",
        ),
    )
    bar = dict(title=dict(text="normalised", side="right"), **BAR)
    for col, z in enumerate((res.values, real, diff), start=1):
        fig.add_trace(_patch_heatmap(res, z, lim, bar if col == 3 else None), row=1, col=col)
    n_rows = len(_patch_grid(res, res.values)[1])
    fig.update_layout(
        title=_subplot_title(_patch_title(res)),
        height=height or max(380, 18 * n_rows + 200),
        margin=dict(l=80, r=20, t=TITLE_MARGIN + 50, b=90),
        plot_bgcolor="white",  # cells not verified stay blank
    )
    fig.update_yaxes(autorange="reversed")
    return fig


def head_search_view(found: HeadScores, *, height: int | None = None) -> go.Figure:
    """Every head's α (a probability: sequential scale from 0), layer × head; click a head."""
    n_l, n_h = found.scores.shape
    data = [[[la, h] for h in range(n_h)] for la in range(n_l)]
    fig = go.Figure(
        go.Heatmap(
            z=found.scores,
            x=[f"H{h}" for h in range(n_h)],
            y=[f"L{la}" for la in range(n_l)],
            zmin=0.0,
            zmax=max(1e-9, float(found.scores.max())),
            colorscale="Blues",
            customdata=data,
            colorbar=dict(title=dict(text="α", side="right"), thickness=12),
            hovertemplate="layer %{customdata[0]} head %{customdata[1]}: α %{z:.4f}<br>click: open it"
            "<extra></extra>",
        )
    )
    fig.update_layout(
        title=_title(f"Head search · {escape(found.what)}", size=13),
        height=height or max(320, 16 * n_l + 160),
        margin=dict(l=60, r=20, t=TITLE_MARGIN + 10, b=50),
        yaxis=dict(autorange="reversed"),
    )
    return fig
