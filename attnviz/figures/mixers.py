"""Figures of non-softmax token mixers (Mamba-2, Gated DeltaNet, KDA, Mamba-1): pure builders.

A mixer's effective attention A[t,s] (`AttentionResult.layer(b, mixer=kind)`) is exact but signed
and not normalised, so it is never drawn like a probability map: a diverging colour scale centred
at 0 (equal reach either side), and the figure itself says "effective attention (signed, not
probabilities)" with the mixer kind. Mamba-1 is exact only per channel: its one "head" is the norm
of each source token's contribution through out_proj, drawn on a sequential scale from 0 and
labelled as such (non-negative, not probabilities either).

- `mixer_heatmap`: one head's (query_pos, key_pos) matrix.
- `mixer_grid`: every head of one block on one shared colour axis.
- `token_contributions`: one query's row as bars over the source tokens (the per-head
  token-contribution view of every mixer).
- `parallel_block`: a block with parallel branches (Falcon-H1, Zamba2: attention + Mamba-2) drawn
  side by side, each titled with its share of the block's token-mixing output.

A kind's display name and how it is drawn come from its record (`attnviz.mixers.MIXERS`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.errors import BadIndex
from attnviz.figures.bins import SINGLE_MAX_CELLS, SINGLE_MAX_KEYS, downsample
from attnviz.figures.colour import DIVERGING
from attnviz.figures.labels import TITLE_MARGIN, _title, bin_labels, escape, token_ticks
from attnviz.mixers.kinds import MIXERS, SIGNED_MEANING, Picture

SIGNED = SIGNED_MEANING
NORMS = "token contribution norms ‖c_{t,s}‖ (not probabilities)"


def kind_name(kind: str) -> str:
    """ "Gated DeltaNet" for "gated_delta" (the kind itself when unknown)."""
    spec = MIXERS.get(kind)
    return kind if spec is None else spec.display


def picture(kind: str) -> Picture:
    """How a kind's matrix is drawn: "probabilities", "signed" (diverging at 0) or "norms"
    (a per-channel kind's contribution norms, sequential from 0); "signed" when unknown."""
    spec = MIXERS.get(kind)
    return "signed" if spec is None else spec.drawn_as


def is_norms(kind: str) -> bool:
    """Whether a kind's one "head" is a non-negative contribution norm, not a signed matrix."""
    return picture(kind) == "norms"


def what_it_is(kind: str) -> str:
    """What a mixer's matrix is, for titles: the signed label, or the contribution-norm label."""
    return {"probabilities": "probabilities", "norms": NORMS, "signed": SIGNED}[picture(kind)]


def colour_axis(kind: str, z: np.ndarray) -> dict:
    """The colour axis of a mixer's matrix: diverging and centred at 0 with equal reach either side
    (signed kinds), sequential from 0 (contribution norms)."""
    finite = np.asarray(z, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    reach = float(np.abs(finite).max()) if finite.size else 0.0
    reach = reach or 1.0
    if is_norms(kind):
        return dict(colorscale="Viridis", cmin=0.0, cmax=reach, colorbar=dict(title=dict(text="‖c‖")))
    return dict(
        colorscale=DIVERGING, cmid=0.0, cmin=-reach, cmax=reach, colorbar=dict(title=dict(text="A (signed)"))
    )


def _pooled(z: np.ndarray, rows: list[str], cols: list[str], max_cells: int):
    """Mean-pool past ``max_cells`` (a signed matrix: max-pooling would drop the negatives)."""
    if z.shape[0] * z.shape[1] <= max_cells:
        return z, rows, cols, ""
    side = int(math.sqrt(max_cells))
    z, re, ce = downsample(z, min(side, z.shape[0]), min(side, z.shape[1]), "mean")
    return z, bin_labels(rows, re), bin_labels(cols, ce), f" (mean-pooled to {z.shape[0]}×{z.shape[1]})"


def _top(text: str) -> dict:
    """A title at the top of the figure (above the subplot titles of a grid)."""
    return {**_title(text), "yref": "container", "y": 1, "yanchor": "top", "pad": dict(t=12)}


def _hover(kind: str) -> str:
    name = "‖c‖" if is_norms(kind) else "A"
    return f"query %{{y}}<br>key %{{x}}<br>{name} = %{{z:.4g}}<extra></extra>"


def mixer_heatmap(
    z: np.ndarray,
    q_labels: Sequence[str],
    k_labels: Sequence[str] | None = None,
    *,
    kind: str,
    title: str = "",
    max_cells: int = SINGLE_MAX_CELLS,
    height: int = 640,
) -> go.Figure:
    """One head of a non-softmax mixer: its exact (query_pos, key_pos) matrix, diverging colours
    centred at 0, titled with the kind and "effective attention (signed, not probabilities)"."""
    z = np.asarray(z, dtype=np.float32)
    k_labels = q_labels if k_labels is None else k_labels
    if z.shape != (len(q_labels), len(k_labels)):
        raise ValueError(f"labels ({len(q_labels)}, {len(k_labels)}) do not match the matrix {z.shape}")
    z, rows, cols, note = _pooled(z, list(q_labels), list(k_labels), max_cells)
    x, y = [escape(s) for s in cols], [escape(s) for s in rows]
    fig = go.Figure(go.Heatmap(z=z, x=x, y=y, coloraxis="coloraxis", hovertemplate=_hover(kind)))
    head = f"{escape(title)}<br>" if title else ""
    fig.update_layout(
        title=_top(f"{head}{kind_name(kind)}<br>{what_it_is(kind)}{note}"),
        coloraxis=colour_axis(kind, z),
        height=height,
        margin=dict(l=10, r=10, t=TITLE_MARGIN + 40, b=10),
        xaxis=dict(type="category", title=dict(text="key"), tickangle=-60, **token_ticks(x)),
        yaxis=dict(type="category", title=dict(text="query"), autorange="reversed", **token_ticks(y)),
    )
    return fig


def mixer_grid(
    stack: np.ndarray,
    q_labels: Sequence[str],
    k_labels: Sequence[str] | None = None,
    *,
    kind: str,
    heads: Sequence[int] | None = None,
    title: str = "",
    max_cells: int = 160_000,
    cols: int = 4,
) -> go.Figure:
    """Every head of one block (``stack``: (heads, N, N)) on one shared colour axis."""
    stack = np.asarray(stack, dtype=np.float32)
    k_labels = q_labels if k_labels is None else k_labels
    heads = list(range(stack.shape[0])) if heads is None else list(heads)
    per = max(1, max_cells // max(1, len(heads)))
    pooled = [_pooled(m, list(q_labels), list(k_labels), per) for m in stack]
    cols = min(cols, len(heads))
    n_rows = math.ceil(len(heads) / cols)
    names = [f"head {h}" for h in heads]
    # A gap of ~40 px per row for its head's title: plotly refuses a spacing over 1 / (rows - 1),
    # which a fixed fraction passes at 16 or 32 heads (GLM-5-Next, Nemotron-H).
    spacing = min(0.08, 40 / (220 * n_rows))
    fig = make_subplots(n_rows, cols, subplot_titles=names, horizontal_spacing=0.03, vertical_spacing=spacing)
    for i, (z, rows, cs, _) in enumerate(pooled):
        x, y = [escape(s) for s in cs], [escape(s) for s in rows]
        fig.add_trace(
            go.Heatmap(z=z, x=x, y=y, coloraxis="coloraxis", hovertemplate=f"{names[i]}<br>" + _hover(kind)),
            i // cols + 1,
            i % cols + 1,
        )
    fig.update_xaxes(type="category", showticklabels=False)
    fig.update_yaxes(type="category", showticklabels=False, autorange="reversed")
    head = f"{escape(title)}<br>" if title else ""
    note = pooled[0][3] if pooled else ""
    fig.update_layout(
        title=_top(f"{head}{kind_name(kind)}<br>{what_it_is(kind)}{note}"),
        coloraxis=colour_axis(kind, stack),
        height=max(360, 220 * n_rows + TITLE_MARGIN + 60),
        margin=dict(l=10, r=10, t=TITLE_MARGIN + 50, b=10),
    )
    return fig


def token_contributions(
    row: np.ndarray,
    k_labels: Sequence[str],
    *,
    kind: str,
    query_label: str,
    title: str = "",
    max_keys: int = SINGLE_MAX_KEYS,
    norms: bool | None = None,
) -> go.Figure:
    """One query's row of a mixer head as bars over the source tokens: how much each source token
    adds to that query's output in this head (signed A[t,s] per unit of its value for per-head
    kinds, red > 0 > blue; ``norms``, the default for the per-channel kinds: the row is
    ‖c_{t,s}‖, the size of what s adds through the output projection)."""
    row = np.asarray(row, dtype=np.float32).reshape(-1)
    if len(row) != len(k_labels):
        raise ValueError(f"{len(k_labels)} key labels for a row of {len(row)}")
    labels, note = list(k_labels), ""
    if len(row) > max_keys:
        pooled, _, ce = downsample(row[None], 1, max_keys, "mean")
        row, labels, note = pooled[0], bin_labels(labels, ce), f" (keys mean-pooled to {max_keys})"
    signed = not (is_norms(kind) if norms is None else norms)
    colour = ["#b2182b" if v > 0 else "#2166ac" for v in row] if signed else "#440154"
    name = "A[t,s] (signed)" if signed else "‖c_{t,s}‖"
    x = [escape(s) for s in labels]
    fig = go.Figure(
        go.Bar(
            x=x, y=row, marker_color=colour, hovertemplate=f"key %{{x}}<br>{name} = %{{y:.4g}}<extra></extra>"
        )
    )
    head = f"{escape(title)}<br>" if title else ""
    fig.update_layout(
        title=_title(
            f"{head}{kind_name(kind)} · query {escape(query_label)}: each source token's "
            f"{'weight' if signed else 'contribution'} · {SIGNED if signed else NORMS}{note}"
        ),
        height=360,
        margin=dict(l=10, r=10, t=TITLE_MARGIN, b=10),
        xaxis=dict(type="category", title=dict(text="source token (key)"), tickangle=-60, **token_ticks(x)),
        yaxis=dict(title=dict(text=name), zeroline=True, zerolinecolor="#444"),
    )
    return fig


def parallel_block(
    branches: Sequence[tuple[str, np.ndarray]],
    q_labels: Sequence[str],
    k_labels: Sequence[str] | None = None,
    *,
    shares: Mapping[str, float] | None = None,
    title: str = "",
    max_cells: int = 120_000,
) -> go.Figure:
    """A block whose token mixing runs in parallel branches (``branches``: (kind, one head's
    matrix) each, e.g. attention probabilities and a Mamba-2 head), side by side, each on its own
    colour axis (probabilities from 0, signed matrices centred at 0), each titled with its share
    of the block's token-mixing output (``shares``: kind -> fraction)."""
    k_labels = q_labels if k_labels is None else k_labels
    titles = []
    for kind, _ in branches:
        share = "" if not shares or kind not in shares else f" · {shares[kind]:.0%} of the block's output"
        titles.append(f"{kind_name(kind)}{share}<br>{what_it_is(kind)}")
    fig = make_subplots(1, len(branches), subplot_titles=titles, horizontal_spacing=0.22)
    axes = {}
    for i, (kind, z) in enumerate(branches):
        z = np.asarray(z, dtype=np.float32)
        z, rows, cols, _ = _pooled(z, list(q_labels), list(k_labels), max_cells)
        name = "coloraxis" if i == 0 else f"coloraxis{i + 1}"
        x, y = [escape(s) for s in cols], [escape(s) for s in rows]
        fig.add_trace(go.Heatmap(z=z, x=x, y=y, coloraxis=name, hovertemplate=_hover(kind)), 1, i + 1)
        if picture(kind) == "probabilities":
            top = float(np.nanmax(z)) if z.size else 1.0
            ax: dict[str, Any] = dict(
                colorscale="Viridis", cmin=0.0, cmax=top or 1.0, colorbar=dict(title=dict(text="p"))
            )
        else:
            ax = colour_axis(kind, z)
        right = fig.layout["xaxis" if i == 0 else f"xaxis{i + 1}"].domain[1]  # beside its own plot
        ax["colorbar"] = {**ax["colorbar"], "x": right + 0.01, "xanchor": "left", "len": 0.9, "thickness": 14}
        axes[name] = ax
    fig.update_xaxes(type="category", tickangle=-60)
    fig.update_yaxes(type="category", autorange="reversed")
    head = f"{escape(title)}<br>" if title else ""
    fig.update_layout(
        title=_top(f"{head}parallel branches: each draws one branch, not the block's whole token mixing"),
        height=560,
        margin=dict(l=10, r=10, t=TITLE_MARGIN + 50, b=10),
        **axes,
    )
    return fig


def block_view(
    result: Any,
    block: int,
    heads: Sequence[int] | None = None,
    *,
    shares: Mapping[str, float] | None = None,
    head: int = 0,
) -> go.Figure:
    """Block ``block`` of ``result`` (an `attnviz.AttentionResult`) drawn by its mixers: a block
    with one non-softmax mixer as a grid of its heads (`mixer_grid`), a block with parallel
    branches as the branches side by side (`parallel_block`, head ``head`` of each; ``shares``
    from ``result.branch_shares(block).shares``). Raises for a block of softmax attention only
    (draw it with `head_view`) and for a block that mixes no tokens (an MLP-only block), saying so."""
    kinds = tuple(result.mixers(block))
    if not kinds:
        raise BadIndex(f"block {block} mixes no tokens (an MLP-only block): there is no token mixer to draw")
    labels = list(result.tokens.labels)
    where = f"{result.model_name} · block {block}"
    if len(kinds) > 1:
        branches = []
        for kind in kinds:
            n = result.mixer_heads(block, kind)
            branches.append((kind, result.head(block, min(head, n - 1), mixer=kind)))
        return parallel_block(branches, labels, shares=shares, title=f"{where} · head {head}")
    (kind,) = kinds
    if picture(kind) == "probabilities":
        raise ValueError(
            f"block {block} is softmax attention only; draw it as attention layer "
            f"{result.layout.attention_layer_of(block)}"
        )
    n = result.mixer_heads(block, kind)
    chosen = list(range(n)) if heads is None else [int(h) for h in heads]
    stack = np.stack([result.head(block, h, mixer=kind) for h in chosen])
    if is_norms(kind):
        return mixer_heatmap(stack[0], labels, kind=kind, title=f"{where} · per-channel mixer, all channels")
    return mixer_grid(stack, labels, kind=kind, heads=chosen, title=where)
