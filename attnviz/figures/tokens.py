"""Token views: lines between two columns of tokens (all heads of a layer), and the text itself
coloured by attention. Tokens are text: every label is HTML-escaped.

Both work at any N: the lines show a window of rows and the top-k links of each row per head
(keys outside the window are listed past a "⋯" gap, each labelled "(position) token"), and the
coloured text shows a window of tokens around the selected one. Token markers carry their
position as ``customdata`` so a click is a selection event that names the token.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np
import plotly.colors as pc
import plotly.graph_objects as go

from attnviz.figures.colour import _colour, rank_values, resolve_scale
from attnviz.figures.labels import TITLE_MARGIN, _title, escape

Direction = Literal["from", "to"]
DIRECTIONS: tuple[str, ...] = get_args(Direction)
LINE_LEVELS = (0.02, 0.1, 0.3, 0.6)  # weight buckets: opacity and width grow with the weight
_LEVEL_STYLE = ((0.18, 1.0), (0.35, 1.6), (0.6, 2.4), (0.9, 3.4))  # (opacity, width) per bucket
ROW_PX = 19
TEXT_MAX_TOKENS = 600  # coloured text: tokens drawn around the selected one (~6 lines a 100)
COLOURBAR_PX = 280  # the coloured text's colour bar: horizontal, under the text
COLOURBAR_MARGIN = 56  # px under the text for it and its labels
_NAMES = {"from": ("query", "key", "attends to"), "to": ("key", "query", "is attended by")}


def head_colours(n_heads: int) -> list[str]:
    """One distinct colour per head (Plotly's 10, then Alphabet's 26, cycling)."""
    pal = pc.qualitative.Plotly if n_heads <= 10 else pc.qualitative.Alphabet
    return [pal[h % len(pal)] for h in range(n_heads)]


def _rgba(colour: str, alpha: float) -> str:
    r, g, b = pc.hex_to_rgb(colour) if colour.startswith("#") else pc.unlabel_rgb(colour)
    return f"rgba({int(r)},{int(g)},{int(b)},{alpha})"


def token_lines(
    rows: np.ndarray,
    display: Sequence[str],
    row_positions: Sequence[int],
    *,
    selected: int | None = None,
    top_k: int = 3,
    min_weight: float = LINE_LEVELS[0],
    direction: Direction = "from",
    head_names: Sequence[str] | None = None,
    title: str = "",
    hover: Sequence[str] | None = None,
) -> go.Figure:
    """Lines from each row token (left) to its top-k partners (right), one colour per head.

    ``rows`` (heads, R, N): for ``direction="from"`` the attention rows of the queries at
    ``row_positions`` over all N keys; for ``"to"`` the columns of the keys at ``row_positions``
    over all N queries (how much each query attends to them), transposed to rows. ``display``:
    the N display tokens. With ``selected`` (a position among ``row_positions``) only that
    token's lines are drawn. Weights under ``min_weight`` get no line. ``hover``: what a token's
    hover says (default its display; `attnviz.tokens.Tokens.hover` lists a split character's pieces).
    """
    rows = np.asarray(rows, dtype=np.float32)
    n_heads, n_rows, n = rows.shape
    row_positions = [int(p) for p in row_positions]
    if len(row_positions) != n_rows or len(display) != n:
        raise ValueError(
            f"rows {rows.shape} do not match {len(row_positions)} positions / {len(display)} tokens"
        )
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}; use one of {DIRECTIONS}")
    left_name, right_name, verb = _NAMES[direction]
    names = list(head_names) if head_names is not None else [f"head {h}" for h in range(n_heads)]
    colours = head_colours(n_heads)
    k = max(1, min(int(top_k), n))
    drawn = [r for r, p in enumerate(row_positions) if selected is None or p == selected]
    # top-k partners of every drawn row, per head: (heads, drawn, k)
    part = rows[:, drawn, :]
    top = np.argsort(-part, axis=-1, kind="stable")[..., :k]
    weights = np.take_along_axis(part, top, axis=-1)
    keep = weights >= min_weight
    partners = sorted(set(row_positions) | {int(j) for j in top[keep].ravel()})
    # right column: partners in order, a "⋯" gap wherever positions jump
    y_right: dict[int, float] = {}
    gaps: list[float] = []
    y = 0.0
    for i, p in enumerate(partners):
        if i and p != partners[i - 1] + 1:
            gaps.append(y)
            y += 1
        y_right[p] = y
        y += 1
    y_left = {p: float(r) for r, p in enumerate(row_positions)}
    # The links are layout shapes, not one scatter per (head, weight band) (9 heads gave 18
    # scatters): a shape takes its own colour and width, and Plotly's cost grows with traces.
    # Each head's links share a legend group with its legend entry (a zero-length shape in the
    # head's full colour), so a click on the entry still hides them.
    shapes: list[dict] = [
        dict(
            type="line", x0=0.0, x1=0.0, y0=0.0, y1=0.0, line=dict(color=colours[h], width=3),
            legendgroup=names[h], name=escape(names[h]), showlegend=True,
        )
        for h in range(n_heads)
    ]  # fmt: skip
    for h in range(n_heads):
        for d, r in enumerate(drawn):
            for j, w in zip(top[h, d], weights[h, d], strict=True):
                if w < min_weight:
                    continue
                level = int(np.searchsorted(LINE_LEVELS, w, side="right")) - 1  # its weight band
                if level < 0:  # under the lowest band (a min_weight below it): no line, as before
                    continue
                alpha, width = _LEVEL_STYLE[level]
                shapes.append(
                    dict(
                        type="line", x0=0.0, x1=1.0, y0=y_left[row_positions[r]], y1=y_right[int(j)],
                        line=dict(color=_rgba(colours[h], alpha), width=width), layer="below",
                        legendgroup=names[h], showlegend=False,
                    )
                )  # fmt: skip
    fig = go.Figure(layout=dict(shapes=shapes))

    in_window = set(row_positions)

    def column(x: float, positions: list[int], ys: list[float], side: str, role: str) -> go.Scatter:
        emph = [selected is None or p == selected for p in positions]
        tokens = [escape(display[p]) for p in positions]
        return go.Scatter(
            x=[x] * len(positions),
            y=ys,
            mode="markers+text",
            # a partner outside the window (past a ⋯) is labelled with its position: where the link goes
            text=[t if p in in_window else f"({p}) {t}" for p, t in zip(positions, tokens, strict=True)],
            hovertext=[escape(hover[p]) for p in positions] if hover is not None else tokens,
            textposition=f"middle {side}",
            textfont=dict(size=12, color=["#111" if e else "#999" for e in emph]),
            marker=dict(size=7, color=["#e4002b" if p == selected else "#777" for p in positions]),
            customdata=[[p] for p in positions],
            hovertemplate=f"{role} (%{{customdata[0]}}) %{{hovertext}}<extra></extra>",
            name=f"{role} tokens",
            showlegend=False,
        )

    fig.add_trace(column(0.0, row_positions, [y_left[p] for p in row_positions], "left", left_name))
    fig.add_trace(column(1.0, partners, [y_right[p] for p in partners], "right", right_name))
    for g in gaps:  # "⋯" where positions jump (text, not a trace: nothing to click)
        fig.add_annotation(x=1.0, y=g, text="⋯", showarrow=False, xanchor="center")
    height = int(max(y, n_rows) * ROW_PX + TITLE_MARGIN + 60)
    head = title or f"Each {left_name} → top {k} {right_name}s per head ({verb})"
    fig.update_layout(
        title=_title(escape(head)),
        height=min(height, 20_000),
        margin=dict(l=10, r=10, t=TITLE_MARGIN, b=10),
        xaxis=dict(range=[-0.75, 1.75], visible=False, fixedrange=True),
        yaxis=dict(range=[max(y, n_rows), -1], visible=False),
        legend=dict(orientation="h", y=-0.02, yanchor="top", x=0),
        showlegend=True,  # the legend lists the heads (shapes), not the traces
        plot_bgcolor="rgba(0,0,0,0)",
        dragmode=False,
    )
    return fig


def _layout_text(
    display: Sequence[str], positions: Sequence[int], width_chars: int
) -> list[tuple[float, int, int]]:
    """(x start, line, width in characters) of each token, wrapped at ``width_chars``; a token
    that shows a line break (↵) ends its line."""
    out = []
    x, line = 0, 0
    for p in positions:
        w = max(2, len(display[p]) + 1)
        if x and x + w > width_chars:
            x, line = 0, line + 1
        out.append((float(x), line, w))
        x += w
        if "↵" in display[p]:
            x, line = 0, line + 1
    return out


def text_window(n: int, selected: int | None, max_tokens: int = TEXT_MAX_TOKENS) -> range:
    """Positions drawn by the coloured text: all of them, or ``max_tokens`` around ``selected``."""
    if n <= max_tokens:
        return range(n)
    centre = 0 if selected is None else int(selected)
    start = min(max(0, centre - max_tokens // 2), n - max_tokens)
    return range(start, start + max_tokens)


DARK_LOW = frozenset({"Viridis", "Magma", "Inferno", "Cividis"})  # colour maps that start dark


def token_text(
    weights: np.ndarray,
    display: Sequence[str],
    *,
    selected: int | None = None,
    scale: str | None = None,
    colorscale: str = "Oranges",
    width_chars: int = 96,
    max_tokens: int = TEXT_MAX_TOKENS,
    title: str = "",
    hover: Sequence[str] | None = None,
) -> go.Figure:
    """The text, each token's background coloured by ``weights`` (N,): e.g. how much the
    selected token attends to each token (a row) or how much each attends to it (a column).

    Tokens are bars in a wrapped, monospace-like layout; a click selects a token (customdata:
    its position). Long texts draw ``max_tokens`` around ``selected``. ``scale`` "log" or
    "rank" spreads the small weights of long texts apart. ``hover``: what each token's hover
    says (default its display). The colour bar lies under the text at a fixed length: beside a
    one-line text it was squashed to the line's height, its labels on top of each other.
    """
    weights = np.asarray(weights, dtype=np.float32)
    n = len(display)
    if weights.shape != (n,):
        raise ValueError(f"weights {weights.shape} do not match {n} tokens")
    mode = resolve_scale(False, scale)
    shown = list(text_window(n, selected, max_tokens))
    place = _layout_text(display, shown, width_chars)
    vals = weights[shown]
    colour = rank_values(vals) if mode == "rank" else _colour(vals, mode)
    if mode == "linear":
        cmin, cmax = 0.0, float(vals.max()) if vals.size and vals.max() > 0 else 1.0
    elif mode == "log":
        cmin, cmax = float(np.nanmin(colour)) if colour.size else -5.0, 0.0
    else:
        cmin, cmax = 0.0, 1.0
    frac = (colour - cmin) / max(cmax - cmin, 1e-12)
    dark_low = colorscale in DARK_LOW  # Viridis & co. start dark: light text on low weights
    text_colour = ["#fff" if (f < 0.55 if dark_low else f > 0.6) else "#111" for f in frac]
    is_sel = [p == selected for p in shown]
    fig = go.Figure(
        go.Bar(
            base=[x for x, _, _ in place],
            x=[w for _, _, w in place],
            y=[line for _, line, _ in place],
            orientation="h",
            text=[escape(display[p]) for p in shown],
            textposition="inside",
            insidetextanchor="middle",
            textangle=0,
            textfont=dict(family="monospace", size=12, color=text_colour),
            marker=dict(
                color=colour,
                coloraxis="coloraxis",
                line=dict(
                    color=["#e4002b" if s else "rgba(0,0,0,0)" for s in is_sel],
                    width=[3 if s else 0 for s in is_sel],
                ),
            ),
            customdata=[[p, float(weights[p])] for p in shown],
            hovertext=[escape(hover[p] if hover is not None else display[p]) for p in shown],
            hovertemplate="(%{customdata[0]}) %{hovertext}<br>weight %{customdata[1]:.4g}<extra></extra>",
            width=0.9,
            name="tokens",
        )
    )
    n_lines = (place[-1][1] + 1) if place else 1
    note = f" (positions {shown[0]}–{shown[-1]} of {n})" if len(shown) < n else ""
    bar_title = {"linear": "weight", "log": "log₁₀ weight", "rank": "weight rank"}[mode]
    fig.update_layout(
        title=_title(escape(title) + note),
        coloraxis=dict(
            colorscale=colorscale,
            cmin=cmin,
            cmax=cmax,
            colorbar=dict(
                title=dict(text=bar_title, side="right"),
                orientation="h",
                thickness=12,
                len=COLOURBAR_PX,
                lenmode="pixels",
                x=1,
                xanchor="right",
                y=0,
                yref="container",
                yanchor="bottom",
                ypad=8,
            ),
        ),
        height=int(min(20_000, n_lines * 24 + TITLE_MARGIN + 30 + COLOURBAR_MARGIN)),
        margin=dict(l=10, r=10, t=TITLE_MARGIN, b=10 + COLOURBAR_MARGIN),
        xaxis=dict(range=[0, width_chars], visible=False, fixedrange=True),
        yaxis=dict(range=[n_lines - 0.5, -0.5], visible=False),
        uniformtext=dict(minsize=9, mode="show"),
        plot_bgcolor="rgba(0,0,0,0)",
        bargap=0.1,
        dragmode=False,
    )
    return fig


def token_text_html(
    weights: np.ndarray, display: Sequence[str], *, selected: int | None = None, scale: str | None = None
) -> str:
    """The same coloured text as safe HTML (for notebooks): every token HTML-escaped, inline styles
    only (orange background, alpha = the scaled weight), the selected token outlined."""
    weights = np.asarray(weights, dtype=np.float32)
    mode = resolve_scale(False, scale)
    vals = rank_values(weights) if mode == "rank" else _colour(weights, mode)
    if mode == "log":
        vals = (vals - np.nanmin(vals)) / max(float(-np.nanmin(vals)), 1e-12) if vals.size else vals
    elif mode == "linear" and vals.size and vals.max() > 0:
        vals = vals / vals.max()
    spans = []
    for p, (tok, a) in enumerate(zip(display, vals, strict=True)):
        outline = "outline:2px solid #e4002b;" if p == selected else ""
        text = html.escape(tok).replace("↵", "↵<br>")
        spans.append(
            f'<span title="({p}) weight {float(weights[p]):.4g}" '
            f'style="background:rgba(255,127,14,{float(a):.3f});{outline}padding:0 1px;border-radius:2px">'
            f"{text}</span>"
        )
    return (
        '<div style="font-family:monospace;line-height:1.7;white-space:pre-wrap">'
        + " ".join(spans)
        + "</div>"
    )
