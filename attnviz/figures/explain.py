"""Figures of the explanations (`attnviz.explain`): routes, logit lens, attribution, ablation,
rotary bands. Pure builders, the engine's typed results in, ``go.Figure`` out; the same calls
are the notebook views: ``attnviz.flow_view(attnviz.information_flow(lm, text))`` ... Clickable
marks carry ``customdata`` whose first two entries are (layer, head) (-1: not a head), so a page
can open the clicked head in the explorer."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.explain.writes import PART_NAMES
from attnviz.figures.labels import TITLE_MARGIN, _title, escape

if TYPE_CHECKING:
    from attnviz.explain import Ablation, Attribution, FlowGraph, LogitLens, RotaryBands

KIND_COLOURS = {"attention": "#1f77b4", "mixer": "#2ca02c", "ffn": "#ff7f0e", "residual": "#9a9a9a"}
MIN_EDGE_WIDTH = 2.5  # px: a near-flat 1 px route edge vanished into the white, anti-aliased
WIDTH_LEVELS = (MIN_EDGE_WIDTH, 3.0, 4.0, 5.5, 7.0, 9.0)


def _short(text: str, n: int = 10) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _width(weight: float) -> int:
    """Index into `WIDTH_LEVELS`: √importance in six steps (small weights stay visible)."""
    return min(len(WIDTH_LEVELS) - 1, int(np.sqrt(max(weight, 0.0)) * len(WIDTH_LEVELS)))


def _subplot_title(text: str) -> dict:
    """A figure title above subplot titles, anchored to the container; a two-line one is padded
    back down by its extra lines (1.3 em each at 17 px), which Plotly lifted out of the figure."""
    pad = dict(t=round(text.count("<br>") * 1.3 * 17))
    return dict(text=text, x=0.01, xref="container", y=0.985, yref="container", yanchor="top", pad=pad)


ALL_TOKENS_MAX = 48  # routes of texts up to this long show every token as a column


def flow_view(graph: FlowGraph, *, height: int | None = None) -> go.Figure:
    """The routes drawn tokens × layers: one column per token (every token of a short text, else
    the tokens on a route, in text order, labelled "(i) token"), the residual stream entering block
    l at height l, after its attention (a hybrid's token mixing) at l + ½. Edge width = importance;
    attention blue, a non-softmax mixer green, residual grey, the FFN's share an orange square
    beside the stream (size = importance). A dot on each attention / mixer edge names its heads
    and picks its strongest head (a per-channel mixer's: the branch, one component)."""
    n_tok = len(graph.tokens)
    tokens = list(range(n_tok)) if n_tok <= ALL_TOKENS_MAX else sorted({n.token for n in graph.nodes})
    col = {t: i for i, t in enumerate(tokens)}
    labels = [escape(f"({t}) {_short(graph.tokens.display[t], 14)}") for t in tokens]
    lines: dict[tuple[str, int], tuple[list, list]] = {}
    handles: dict[str, list] = {"x": [], "y": [], "text": [], "data": [], "colour": []}
    ffn: dict[str, list] = {"x": [], "y": [], "size": [], "text": []}
    for e in graph.edges:
        x0, x1, y0, y1 = col[e.source.token], col[e.target.token], e.source.depth, e.target.depth
        if e.kind == "ffn":  # a square beside the stream, halfway up the block
            ffn["x"].append(x0 + 0.12)
            ffn["y"].append((y0 + y1) / 2)
            ffn["size"].append(5 + 16 * np.sqrt(e.weight))
            ffn["text"].append(f"layer {e.layer} FFN at {labels[x0]} · {e.weight:.3f}")
            continue
        xs, ys = lines.setdefault((e.kind, _width(e.weight)), ([], []))
        xs += [x0, x1, None]
        ys += [y0, y1, None]
        if e.kind in ("attention", "mixer"):
            order = np.argsort(e.heads)[::-1]
            top = [f"H{int(h)} {e.heads[h]:.2f}" for h in order[:4] if e.heads[h] > 0]
            per_channel = len(e.heads) == 1 and e.kind == "mixer"  # one component: no head to open
            # the click dot sits on the edge 0.35 of a column from its target: a midpoint fell on
            # another token's column whenever the edge spanned an even number of them
            t = 0.35 / abs(x0 - x1) if x0 != x1 else 0.5
            handles["x"].append(x1 + (x0 - x1) * t)
            handles["y"].append(y1 + (y0 - y1) * t)
            head = -1 if per_channel else int(order[0])
            handles["colour"].append(KIND_COLOURS[e.kind])
            mark = [e.layer, head, e.source.token, e.target.token]  # + the branch: a mixer's edge
            handles["data"].append(mark + ([e.part] if e.kind == "mixer" else []))
            what = PART_NAMES.get(e.part, e.part) if e.part else "attention"
            handles["text"].append(
                f"layer {e.layer} {what} · {labels[col[e.source.token]]} → {labels[col[e.target.token]]}"
                f"<br>weight {e.weight:.3f} · "
                + (
                    "one component (mixes per channel, no heads)<br>click: what it writes"
                    if per_channel
                    else f"heads: {', '.join(top)}<br>click: head {head}"
                )
            )
    # each trace is Plotly's fixed cost in the browser: the edges' own traces are the legend
    fig, in_legend = go.Figure(), set()
    for (kind, level), (xs, ys) in sorted(lines.items(), key=lambda kv: (kv[0][0] != "residual", kv[0][1])):
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=kind not in in_legend, legendgroup=kind,
            name=kind, line=dict(color=KIND_COLOURS[kind], width=WIDTH_LEVELS[level]), opacity=0.85,
        ))  # fmt: skip
        in_legend.add(kind)
    if ffn["x"]:
        fig.add_trace(go.Scatter(
            x=ffn["x"], y=ffn["y"], mode="markers", name="ffn", legendgroup="ffn",
            marker=dict(symbol="square", size=ffn["size"], color=KIND_COLOURS["ffn"], opacity=0.8),
            hovertext=ffn["text"], hovertemplate="%{hovertext}<extra></extra>",
        ))  # fmt: skip
    nx = [col[n.token] for n in graph.nodes]
    ny = [n.depth for n in graph.nodes]
    fig.add_trace(
        go.Scatter(
            x=nx,
            y=ny,
            mode="markers",
            showlegend=False,
            hoverinfo="skip",
            marker=dict(size=3, color="#777"),  # small: a column of 60 nodes must not read as a dotted bar
        )
    )
    fig.add_trace(
        go.Scatter(
            x=handles["x"],
            y=handles["y"],
            mode="markers",
            name="attention edge (click)",
            showlegend=False,
            marker=dict(size=9, color=handles["colour"], line=dict(color="white", width=1)),
            customdata=handles["data"],
            hovertext=handles["text"],
            hovertemplate="%{hovertext}<extra></extra>",
        )
    )
    # clickable nodes (invisible marks over the grey dots): customdata (layer, -1, token, token, part)
    writers = [(n, *graph.writer(n)) for n in graph.nodes if n.layer > 0 or n.stage == "mid"]
    fig.add_trace(
        go.Scatter(
            x=[col[n.token] for n, _, _ in writers],
            y=[n.depth for n, _, _ in writers],
            mode="markers",
            name="node (click)",
            showlegend=False,
            marker=dict(size=11, color="rgba(0,0,0,0)"),
            customdata=[[layer, -1, n.token, n.token, part] for n, layer, part in writers],
            hovertext=[
                f"layer {layer} {PART_NAMES.get(part, part)} output at {labels[col[n.token]]}"
                "<br>click: what it writes"
                for n, layer, part in writers
            ],
            hovertemplate="%{hovertext}<extra></extra>",
        )
    )
    root = graph.n_layers
    fig.add_trace(
        go.Scatter(
            x=[col[graph.token]],
            y=[root],
            mode="markers",
            showlegend=False,
            marker=dict(size=13, symbol="star", color="#d62728"),
            hovertext=[f"prediction at {labels[col[graph.token]]}"],
            hovertemplate="%{hovertext}<extra></extra>",
        )
    )
    step = 1 if graph.n_layers <= 16 else (2 if graph.n_layers <= 40 else 5)
    yticks = list(range(0, graph.n_layers + 1, step))
    ytext = ["embeddings" if y == 0 else ("output" if y == graph.n_layers else f"layer {y}") for y in yticks]
    title = (
        f"Routes to the prediction at {labels[col[graph.token]]} · {escape(graph.model_name)} · "
        f"threshold {graph.threshold:g} · {len(graph.edges)} edges"
    )
    fig.update_layout(
        title=_title(title),
        height=height or max(420, 22 * graph.n_layers + 160),
        margin=dict(l=90, r=20, t=TITLE_MARGIN, b=90),
        xaxis=dict(
            tickmode="array",
            tickvals=list(range(len(tokens))),
            ticktext=labels,
            tickangle=-45,
            range=[-0.6, len(tokens) - 0.4],
            title="token" if n_tok <= ALL_TOKENS_MAX else "token (only the tokens on a route)",
            zeroline=False,
        ),
        yaxis=dict(
            tickmode="array",
            tickvals=yticks,
            ticktext=ytext,
            range=[-0.5, graph.n_layers + 0.6],
            title="residual stream",
            zeroline=False,
        ),
        legend=dict(orientation="h", y=-0.25 if len(tokens) > 6 else -0.18),
        plot_bgcolor="white",
        clickmode="event+select",
        dragmode="pan",
    )
    return fig


LENS_ROW_CHARS = 176  # characters of 9 px text across the lens on a full-width page (16 cells: 11 each)


def lens_view(lens: LogitLens, *, height: int | None = None) -> go.Figure:
    """Layers × positions: each cell's colour is the top token's probability, its text that token;
    the hover lists the top k and where the model's final prediction stands."""
    n_rows, n_pos, k = lens.top_ids.shape
    x = [escape(f"({p}) {_short(lens.tokens.display[p], 12)}") for p in lens.positions]
    y = [
        "embeddings" if r == 0 else ("final" if r == n_rows - 1 else f"after layer {r - 1}")
        for r in range(n_rows)
    ]
    chars = max(4, min(16, LENS_ROW_CHARS // max(n_pos, 1)))  # what a cell holds at the page's width
    text = [[escape(_short(lens.top_tokens[r][c][0], chars)) for c in range(n_pos)] for r in range(n_rows)]
    hover = [
        [
            "<br>".join(f"{escape(lens.top_tokens[r][c][i])} {lens.top_probs[r, c, i]:.3f}" for i in range(k))
            + f"<br>final prediction {escape(lens.predicted_tokens[c])}: rank {int(lens.rank[r, c])}, "
            f"p {lens.prob[r, c]:.3f}"
            for c in range(n_pos)
        ]
        for r in range(n_rows)
    ]
    fig = go.Figure(
        go.Heatmap(
            z=lens.top_probs[:, :, 0],
            x=list(range(n_pos)),
            y=list(range(n_rows)),
            text=text,
            texttemplate="%{text}",
            textfont=dict(size=9),
            customdata=hover,
            zmin=0,
            zmax=1,
            colorscale=[[0.0, "#f7fbff"], [1.0, "#6baed6"]],  # light: the token text stays readable
            colorbar=dict(thickness=10, title="p(top)"),
            hovertemplate="%{customdata}<extra></extra>",
        )
    )
    fig.update_layout(  # every layer labelled: 22 px a row holds a tick label
        title=_title(f"Logit lens · {escape(lens.model_name)} · top token after each layer"),
        height=height or max(380, 22 * n_rows + 150),
        margin=dict(l=110, r=20, t=TITLE_MARGIN, b=100),
        xaxis=dict(
            tickmode="array", tickvals=list(range(n_pos)), ticktext=x, tickangle=-45, title="position"
        ),
        yaxis=dict(tickmode="array", tickvals=list(range(n_rows)), ticktext=y),
    )
    return fig


def attribution_view(att: Attribution, *, top: int = 20, height: int | None = None) -> go.Figure:
    """Left: every head's direct contribution, layers × heads (red raises the logit, blue lowers
    it). Right: the ``top`` parts by size, heads, MLPs and the embedding. Click a head to open it."""
    n_l, n_h = att.heads.shape
    lim = float(np.abs(att.heads).max()) or 1.0
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.55, 0.45],
        horizontal_spacing=0.12,
        subplot_titles=("heads (layer × head)", f"largest {top} parts"),
    )
    data = [[[layer, h] for h in range(n_h)] for layer in range(n_l)]
    fig.add_trace(
        go.Heatmap(
            z=att.heads,
            x=[f"H{h}" for h in range(n_h)],
            y=[f"L{layer}" for layer in range(n_l)],
            zmin=-lim,
            zmax=lim,
            colorscale="RdBu_r",
            customdata=data,
            colorbar=dict(thickness=10, orientation="h", x=0.27, y=-0.08, len=0.5, yanchor="top"),
            hovertemplate="layer %{customdata[0]} head %{customdata[1]}: %{z:.3f}<br>click: open it"
            "<extra></extra>",
        ),
        row=1,
        col=1,
    )
    parts = att.ranking(top)[::-1]
    names = [
        {"head": f"L{p[1]} H{p[2]}", "mlp": f"MLP {p[1]}", "embedding": "embedding"}[p[0]] for p in parts
    ]
    fig.add_trace(
        go.Bar(
            x=[p[3] for p in parts],
            y=names,
            orientation="h",
            customdata=[[p[1], p[2]] for p in parts],
            marker_color=["#d62728" if p[3] > 0 else "#1f77b4" for p in parts],
            hovertemplate="%{y}: %{x:.3f}<extra></extra>",
        ),
        row=1,
        col=2,
    )
    what = f"“{escape(att.target_token)}”" + (
        f" − “{escape(att.contrast_token)}”" if att.contrast is not None else ""
    )
    fig.update_layout(
        title=_subplot_title(
            f"Direct logit attribution · logit({what}) = {att.logit:.3f} at "
            f"({att.position}) {escape(_short(att.tokens.display[att.position], 14))} · rest {att.rest:.3f}"
        ),
        height=height or max(420, 16 * n_l + 160),
        margin=dict(l=60, r=20, t=TITLE_MARGIN + 30, b=90),
        showlegend=False,
        yaxis=dict(autorange="reversed"),
    )
    return fig


def ablation_view(ab: Ablation, *, height: int = 380) -> go.Figure:
    """The next-token probabilities of the top tokens before and after the ablation."""
    ids = list(dict.fromkeys([t[0] for t in ab.top_before] + [t[0] for t in ab.top_after]))
    shown = {t[0]: t[1] for t in (*ab.top_before, *ab.top_after)}
    before = {t[0]: t[2] for t in ab.top_before}
    after = {t[0]: t[2] for t in ab.top_after}
    names = [escape(f"“{shown[i]}”") + ("  ◀" if i == ab.target else "") for i in ids]  # "." stays visible
    fig = go.Figure()
    fig.add_trace(go.Bar(y=names, x=[before.get(i, 0.0) for i in ids], orientation="h", name="before"))
    fig.add_trace(
        go.Bar(y=names, x=[after.get(i, 0.0) for i in ids], orientation="h", name=f"{ab.mode}-ablated")
    )
    heads = ", ".join(f"L{layer} H{h}" for layer, h in ab.heads)
    fig.update_layout(
        title=_title(f"Next token at ({ab.position}) without {escape(heads)} · KL {ab.kl:.3f} nats"),
        barmode="group",
        height=height,
        margin=dict(l=110, r=20, t=TITLE_MARGIN, b=40),
        yaxis=dict(autorange="reversed"),
        xaxis=dict(title="probability (top tokens before or after)"),
    )
    return fig


def rotary_view(b: RotaryBands, *, height: int = 420) -> go.Figure:
    """Left: each rotary band's term of the (query, key) score, fastest band first, and the
    unrotated dims. Right: how much each band's term moves across the query's keys with the
    distance alone (every key the average content) and with the content alone (every key at the
    query's position)."""
    wl = b.spec.wavelengths
    names = [f"{m}: λ {w:.0f}" if w < 1e4 else f"{m}: λ {w:.0e}" for m, w in enumerate(wl)]
    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.1,
        subplot_titles=(f"score of key {b.key} by band", f"across keys 0..{b.query}: what moves each band"),
    )
    x = names + (["unrotated dims"] if b.spec.rest else [])
    y = list(b.pair_terms) + ([b.rest_term] if b.spec.rest else [])
    fig.add_trace(
        go.Bar(
            x=x,
            y=y,
            name="term",
            marker_color="#1f77b4",
            showlegend=False,
            hovertemplate="band %{x}: %{y:.4f}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Bar(x=names, y=b.position_spread, name="distance only", marker_color="#ff7f0e"), row=1, col=2
    )
    fig.add_trace(
        go.Bar(x=names, y=b.content_spread, name="content only", marker_color="#2ca02c"), row=1, col=2
    )
    fig.add_trace(
        go.Scatter(x=names, y=b.spread, name="actual", mode="markers", marker=dict(color="#333", size=7)),
        row=1,
        col=2,
    )
    fig.update_layout(
        title=_subplot_title(
            f"Rotary bands · layer {b.layer} head {b.head} · query {b.query}, key {b.key} · "
            f"score {b.score:.3f} ({b.spec.pairing} pairs, {len(b.spec.pairs)} bands)"
        ),
        height=height,
        barmode="group",
        margin=dict(l=50, r=20, t=TITLE_MARGIN + 30, b=90),
        legend=dict(orientation="h", y=-0.3),
    )
    fig.update_xaxes(tickangle=-45, tickfont=dict(size=9))
    fig.update_yaxes(title_text="score term", row=1, col=1)
    fig.update_yaxes(title_text="std over keys", row=1, col=2)
    return fig
