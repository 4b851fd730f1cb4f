"""Why a head attends: the figure of one score's split (`attnviz.explain.qk_attribution`).

`qk_view` draws the query-part x key-part matrix T on a diverging scale centred at 0, with each
side's marginal as bars beside it (above: each key part with the whole query; right: each query
part with the whole key). ``by="layer"`` sums the parts per layer of origin (a 30-layer model has
~300 parts a side). Every mark carries ``customdata`` whose first two entries are the (layer, head)
of the part it names (-1, -1: not a head), so a page can open the clicked head in the explorer.
`term_sentences` says the largest terms in words; `qk_band_view` splits the top terms by rotary
band (each column sums to its term). In a hybrid, parts are named by the model's own block index.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.figures.labels import TITLE_MARGIN, escape
from attnviz.mixers.kinds import MIXERS

if TYPE_CHECKING:
    from attnviz.explain import OVCircuits, QKAttribution, QKSpace

_HEAD = re.compile(r"^L(\d+)H(\d+)$")
_LAYER = re.compile(r"^L(\d+)")
_BRANCH = re.compile(r"^L(\d+)\.([a-z_0-9]+)$")  # L0.short_conv, L0.gated_delta3 (a mixer head)


def part_head(name: str) -> tuple[int, int]:
    """(layer, head) of a head's part ``L{l}H{h}``; (layer, -1) for ``L{l}.mlp`` / ``L{l}``; else (-1, -1)."""
    m = _HEAD.match(name)
    if m:
        return int(m.group(1)), int(m.group(2))
    m = _LAYER.match(name)
    return (int(m.group(1)), -1) if m else (-1, -1)


def part_words(name: str) -> str:
    """A part in words: "L1H4's output", "L0's MLP output", "the token embedding" ..."""
    if _HEAD.match(name):
        return f"{name}'s output"
    if name.endswith(".mlp"):
        return f"{name[:-4]}'s MLP output"
    if _LAYER.fullmatch(name):
        return f"what layer {name[1:]} wrote"
    branch = _BRANCH.match(name)
    if branch:
        block, what = branch.groups()
        kind = next((k for k in sorted(MIXERS, key=len, reverse=True) if what.startswith(k)), what)
        rest = what[len(kind) :]
        return f"L{block}'s {kind} head {rest} output" if rest.isdigit() else f"L{block}'s {kind} output"
    return {
        "embed": "the token embedding",
        "pos": "the position embedding",
        "bias": "the biases",
        "position_bias": "the position bias",
    }.get(name, name)


def term_sentences(cell: QKAttribution, top: int = 10) -> list[str]:
    """The ``top`` largest terms in words: "L1H4's output at 'bank' (query) with L0H2's output at
    'river' (key): +2.3 of 7.1"."""
    q_tok, k_tok = cell.tokens.display[cell.query], cell.tokens.display[cell.key]
    out = []
    for a, b, value in cell.top(top):
        out.append(
            f"{part_words(a)} at '{q_tok}' (query) with {part_words(b)} at '{k_tok}' (key): "
            f"{value:+.3g} of {cell.score:.3g}"
        )
    return out


def _matrix(cell: QKAttribution, by: str) -> tuple[tuple[str, ...], np.ndarray]:
    return cell.by_origin() if by == "layer" else (cell.components, cell.terms)


def qk_view(cell: QKAttribution, *, by: str = "part", height: int | None = None) -> go.Figure:
    """The split of one score: T (rows: query parts, columns: key parts; red raises the score,
    blue lowers it), the key side's marginal as bars above, the query side's on the right."""
    names, terms = _matrix(cell, by)
    n = len(names)
    lim = float(np.abs(terms).max()) or 1.0
    fig = make_subplots(
        rows=2,
        cols=2,
        row_heights=[0.22, 0.78],
        column_widths=[0.8, 0.2],
        horizontal_spacing=0.02,
        vertical_spacing=0.02,
        shared_xaxes=True,
        shared_yaxes=True,
    )
    heads = [part_head(x) for x in names]
    labels = [escape(x) for x in names]
    data = [[[*heads[a], *heads[b]] for b in range(n)] for a in range(n)]
    fig.add_trace(
        go.Heatmap(
            z=terms,
            x=labels,
            y=labels,
            zmid=0,
            zmin=-lim,
            zmax=lim,
            colorscale="RdBu_r",
            customdata=data,
            colorbar=dict(title=dict(text="term", side="right"), thickness=10, len=0.6, y=0.35),
            hovertemplate="query part %{y} × key part %{x}: %{z:.4g}<br>click: open the query part's head"
            "<extra></extra>",
        ),
        row=2,
        col=1,
    )
    for side, values, row, col in (
        ("key", terms.sum(0), 1, 1),
        ("query", terms.sum(1), 2, 2),
    ):
        vertical = side == "key"
        fig.add_trace(
            go.Bar(
                x=labels if vertical else values,
                y=values if vertical else labels,
                orientation="v" if vertical else "h",
                customdata=[list(h) for h in heads],
                marker_color=["#d62728" if v > 0 else "#1f77b4" for v in values],
                hovertemplate=f"{side} part %{{{'x' if vertical else 'y'}}}: "
                f"%{{{'y' if vertical else 'x'}:.4g}}<br>click: open its head<extra></extra>",
                name=f"{side} side",
            ),
            row=row,
            col=col,
        )
    q_tok = escape(cell.tokens.display[cell.query])
    k_tok = escape(cell.tokens.display[cell.key])
    extra = f" + position bias {cell.position_bias:.3g}" if cell.position_bias else ""
    capped = f" (after the soft-cap {cell.capped:.3g})" if cell.softcap else ""
    block = cell.block if cell.block >= 0 else cell.layer  # the model's own block index
    fig.update_layout(
        title=dict(
            text=(
                f"Why L{block}H{cell.head} attends from ({cell.query}) {q_tok} to ({cell.key}) "
                f"{k_tok}: score {cell.score:.4g}{capped} = Σ terms{extra}"
            ),
            x=0.01,
            xref="container",
            y=0.985,
            yref="container",
            yanchor="top",
        ),
        height=height or int(min(1400, max(520, 14 * n + 260))),
        margin=dict(l=90, r=20, t=TITLE_MARGIN + 10, b=90),
        showlegend=False,
    )
    fig.update_yaxes(autorange="reversed", row=2, col=1, title_text="query part")
    fig.update_xaxes(title_text="key part", row=2, col=1, tickangle=-60)
    fig.update_yaxes(title_text="key side", row=1, col=1)
    fig.update_xaxes(title_text="query side", row=2, col=2)
    return fig


def qk_band_view(cell: QKAttribution, *, top: int = 10, height: int | None = None) -> go.Figure:
    """The ``top`` terms split by rotary band: rows are bands (band 0: the fastest turn), columns
    the terms (query part × key part), on a diverging scale centred at 0; each column sums to its
    term exactly. A model without rotary tables has one band."""
    labels, pairs, values = cell.by_band(top)
    columns = [f"{n + 1}. {escape(a)} × {escape(b)}" for n, (a, b) in enumerate(pairs)]
    lim = float(np.abs(values).max()) or 1.0
    fig = go.Figure(
        go.Heatmap(
            z=values,
            x=columns,
            y=[escape(x) for x in labels],
            zmid=0,
            zmin=-lim,
            zmax=lim,
            colorscale="RdBu_r",
            colorbar=dict(title=dict(text="piece"), thickness=10),
            hovertemplate="%{y} of term %{x}: %{z:.4g}<extra></extra>",
        )
    )
    fig.update_layout(
        title=dict(
            text="The top terms by rotary band (each column sums to its term)", x=0.01, xref="container"
        ),
        height=height or int(min(900, max(320, 18 * len(labels) + 200))),
        margin=dict(l=140, r=20, t=TITLE_MARGIN, b=120),
        yaxis=dict(autorange="reversed", title="rotary band"),
        xaxis=dict(title="term (query part × key part)", tickangle=-40),
    )
    return fig


def key_side_table(
    row_labels: list[str], key_terms: np.ndarray, parts: tuple[str, ...], top: int = 3
) -> dict:
    """The key side of a whole query row as a table: for each key, its score and its ``top``
    key parts (name, value), largest |value| first. ``key_terms`` (keys, parts)."""
    order = np.argsort(-np.abs(key_terms), axis=1)[:, :top]
    return {
        "key": row_labels,
        "score": [round(float(s), 4) for s in key_terms.sum(1)],
        **{
            f"part {r + 1}": [
                f"{parts[order[k, r]]} {key_terms[k, order[k, r]]:+.3g}" for k in range(len(row_labels))
            ]
            for r in range(min(top, key_terms.shape[1]))
        },
    }


def qk_space_view(space: QKSpace, *, height: int = 520) -> go.Figure:
    """The head's queries and keys as one PCA scatter, coloured by position: queries (circles),
    keys after RoPE (what the scores use; diamonds) and before it (crosses). Each point carries
    ``customdata`` [position]."""
    fig = go.Figure()
    n = len(space.labels)
    sets = [("queries", space.queries, "circle"), ("keys (after RoPE)", space.keys, "diamond")]
    if space.rotary:
        sets.append(("keys (before RoPE)", space.keys_unrotated, "x"))
    labels = [escape(x) for x in space.labels]
    for name, xy, symbol in sets:
        fig.add_trace(
            go.Scatter(
                x=xy[:, 0],
                y=xy[:, 1],
                mode="markers",
                name=name,
                text=labels,
                customdata=[[i] for i in range(n)],
                marker=dict(
                    symbol=symbol,
                    size=8,
                    color=np.arange(n),
                    colorscale="Viridis",
                    colorbar=dict(title=dict(text="position"), thickness=10) if symbol == "circle" else None,
                    opacity=0.85 if symbol != "x" else 0.5,
                ),
                hovertemplate=f"{name}: %{{text}}<br>click: pick this token<extra></extra>",
            )
        )
    a, b = space.explained
    fig.update_layout(
        title=dict(
            text=f"L{space.block if space.block >= 0 else space.layer}H{space.head}'s queries and keys "
            "over the text (PCA of all three sets)",
            x=0.01,
            xref="container",
        ),
        xaxis=dict(title=f"PC1 ({a:.0%} of the variance)"),
        yaxis=dict(title=f"PC2 ({b:.0%})"),
        height=height,
        margin=dict(l=60, r=20, t=TITLE_MARGIN, b=50),
        legend=dict(orientation="h", y=-0.15),
    )
    return fig


def ov_map_view(ov: OVCircuits, *, height: int | None = None) -> go.Figure:
    """Every head's OV copying score Σλ/Σ|λ| as a layer x head map (red: copies the tokens it
    attends to; blue: suppresses them). Each cell carries ``customdata`` [layer, head, share of
    positive eigenvalues]."""
    n_l, n_h = ov.copying.shape
    data = [[[layer, h, float(ov.positive[layer, h])] for h in range(n_h)] for layer in range(n_l)]
    fig = go.Figure(
        go.Heatmap(
            z=ov.copying,
            x=[f"H{h}" for h in range(n_h)],
            y=[f"L{ov.blocks[layer] if ov.blocks else layer}" for layer in range(n_l)],
            zmid=0,
            zmin=-1,
            zmax=1,
            colorscale="RdBu_r",
            customdata=data,
            colorbar=dict(title=dict(text="copying"), thickness=10),
            hovertemplate="%{y} head %{customdata[1]}: copying %{z:.3f}, "
            "positive eigenvalues %{customdata[2]:.0%}<br>click: open it<extra></extra>",
        )
    )
    fig.update_layout(
        title=dict(
            text="OV circuits: copying score Σλ/Σ|λ| of W_U W_O W_V W_E (weights only)",
            x=0.01,
            xref="container",
        ),
        height=height or max(360, 16 * n_l + 140),
        margin=dict(l=60, r=20, t=TITLE_MARGIN, b=40),
        yaxis=dict(autorange="reversed"),
    )
    return fig
