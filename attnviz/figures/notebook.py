"""Notebook views: one call from a result to a Plotly figure, and a result's own cell display.

``head_view(res)`` draws every head of a layer (with a layer slider when no layer is given) and
``model_view(res)`` every layer x head at once; both use the figure builders the app uses
(`attnviz.figures`) and pool long inputs the way the app does, fetching each layer in row chunks.
``AttentionResult`` displays itself through `mimebundle`: a compact summary and the head view,
as plain Plotly (the ``application/vnd.plotly.v1+json`` type Jupyter and VS Code render, and
HTML for other front-ends), bounded to a few MB at any length.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from ..errors import BadIndex
from ..layout import AttentionLayout, Stack
from ..mixers.kinds import MIXERS
from ..tokens import Tokens
from .bins import GRID_MAX_CELLS, GRID_MAX_SIDE, grid_side, pooled_rows
from .grid import head_grid
from .labels import bin_labels
from .mosaic import model_mosaic, mosaic_side

if TYPE_CHECKING:
    import plotly.graph_objects as go


class ShownResult(Protocol):
    """What these views read of an `attnviz.AttentionResult` (typed here as a protocol, so that
    the result can display itself through this module without an import circle)."""

    @property
    def model_name(self) -> str: ...
    @property
    def layout(self) -> AttentionLayout: ...
    @property
    def tokens(self) -> Tokens: ...
    @property
    def path(self) -> str: ...
    @property
    def seconds(self) -> float: ...
    @property
    def stacks(self) -> tuple[Stack, ...]: ...
    @property
    def n_tokens(self) -> int: ...
    @property
    def n_heads(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def n_layers(self, stack: Stack | None = None) -> int: ...
    def resolve_stack(self, stack: Stack | None) -> Stack: ...
    def axes(self, stack: Stack | None = None) -> tuple[Tokens, Tokens]: ...
    def layer_tensor(
        self,
        layer: int,
        *,
        heads: Sequence[int] | None = None,
        rows: slice | None = None,
        stack: Stack | None = None,
    ) -> torch.Tensor: ...
    def mixer_tensor(
        self,
        layer: int,
        *,
        heads: Sequence[int] | None = None,
        rows: slice | None = None,
        stack: Stack | None = None,
        mixer: str | None = None,
    ) -> torch.Tensor: ...
    def mixer_heads(self, block: int, mixer: str) -> int: ...
    def mixer_pooled(self, block: int, mixer: str, head: int, cells: int = 256) -> Any: ...
    def mixer_meaning(self, mixer: str) -> str: ...


SLIDER_MAX_CELLS = 240_000  # every layer's heads in one slider figure (~1.7 MB of JSON)
FULL_TOKENS = 256  # head_view draws every token up to this many, pools only beyond
FULL_CELLS = 4_000_000  # ... and the all-layer slider while it stays under this (~21 MB of JSON)
REPR_MAX_CELLS = 120_000  # the cell display: the slider figure at half that (bundle ~2 MB)
# The cell display walks every layer only while that is quick (layers x heads x N^2 probabilities
# computed, ~1 s on 2 cores); past it, one layer, and `head_view(res)` draws the slider on request.
REPR_ALL_LAYERS_CELLS = 50_000_000
PLOTLY_MIME = "application/vnd.plotly.v1+json"


def _kv_heads(res: ShownResult, stack: Stack, heads: Sequence[int]) -> list[int] | None:
    lay = res.layout
    if lay.group_size <= 1 or stack == "cross":
        return None
    return [lay.kv_head_of(h) for h in heads]


def _pooled_layer(
    res: ShownResult, layer: int, heads: list[int], stack: Stack, side: int
) -> tuple[np.ndarray, list[str], list[str]]:
    """(heads, <=side, <=side) max-pooled probabilities and the bin labels, fetched by row chunks."""
    q_tok, k_tok = res.axes(stack)
    pooled, re, ce = pooled_rows(
        lambda sl: res.layer_tensor(layer, heads=heads, rows=sl, stack=stack).float().cpu().numpy(),
        len(q_tok),
        len(k_tok),
        side,
    )
    return pooled, bin_labels(q_tok.labels, re), bin_labels(k_tok.labels, ce)


def _heads(res: ShownResult, heads: Sequence[int] | None) -> list[int]:
    chosen = list(range(res.n_heads)) if heads is None else [int(h) for h in heads]
    if not chosen:
        raise BadIndex("heads is empty; give head indices or None for every head")
    for h in chosen:
        if not 0 <= h < res.n_heads:
            raise BadIndex(f"head {h} is out of range: this model has heads 0..{res.n_heads - 1}")
    return chosen


def _layers(res: ShownResult, layer: int | None, stack: Stack) -> list[int]:
    n = res.n_layers(stack)
    if layer is None:
        return list(range(n))
    if not 0 <= int(layer) < n:
        raise BadIndex(f"layer {layer} is out of range: this model has layers 0..{n - 1}")
    return [int(layer)]


def notebook_side(n_tokens: int, n_tiles: int, max_cells: int | None, *, one_layer: bool) -> int:
    """Bins per axis of each head's tile: every token up to `FULL_TOKENS` (within `FULL_CELLS` for
    the all-layer slider, which embeds every layer), pooled only beyond; ``max_cells`` (the
    figure's whole budget) overrides."""
    if max_cells is None and n_tokens <= FULL_TOKENS and (one_layer or n_tiles * n_tokens**2 <= FULL_CELLS):
        return n_tokens
    budget = max_cells or (GRID_MAX_CELLS if one_layer else SLIDER_MAX_CELLS)
    if max_cells is None and not one_layer:
        budget = FULL_CELLS
    return grid_side(n_tiles, budget, max_side=FULL_TOKENS, n_tokens=n_tokens)


def head_view(
    result: ShownResult,
    layer: int | None = None,
    heads: Sequence[int] | None = None,
    *,
    stack: Stack | None = None,
    colorscale: str = "Viridis",
    log: bool = False,
    max_cells: int | None = None,
    heading: str = "",
    mixer: str | None = None,
) -> go.Figure:
    """The heads of one layer as a grid of heatmaps (the app's explorer grid).

    ``mixer`` (a non-softmax kind of `res.layout.mixers[layer]`, e.g. "gated_delta") draws block
    ``layer``'s mixer instead: its effective attention, signed, on a diverging scale centred at 0
    (mean-pooled past `FULL_TOKENS`), labelled "effective attention (signed, not probabilities)".

    ``layer=None`` puts every layer in one figure behind a layer slider, on one colour scale;
    all layers share the cell budget, so long inputs are pooled more than for one layer.
    ``heads`` picks query heads (default: all). Every token is drawn up to `FULL_TOKENS` tokens
    (as BertViz draws every token until it breaks, ~256); past that each head is max-pooled and
    the title says how far. Token axes are ``"(i) token"``; pooled axes name each bin's span.
    ``heading`` is a first title line.
    """
    if mixer is not None and mixer != "attention":
        return _mixer_view(result, layer, mixer, heads, max_cells, heading)
    if mixer == "attention" and layer is not None:
        layer = result.layout.attention_layer_of(int(layer))
    stack = result.resolve_stack(stack)
    chosen = _heads(result, heads)
    layers = _layers(result, layer, stack)
    q_tok, k_tok = result.axes(stack)
    n_tokens = max(len(q_tok), len(k_tok))
    side = notebook_side(n_tokens, len(layers) * len(chosen), max_cells, one_layer=layer is not None)
    grids = [_pooled_layer(result, i, chosen, stack, side) for i in layers]
    zmax = max((float(np.nanmax(g[0])) for g in grids if g[0].size), default=1.0) or 1.0
    kv = _kv_heads(result, stack, chosen)
    figs = []
    for pooled, q_lab, k_lab in grids:
        cells = pooled.shape[0] * pooled.shape[1] * pooled.shape[2]
        figs.append(
            head_grid(
                pooled,
                q_lab,
                k_lab,
                heads=chosen,
                kv_heads=kv,
                colorscale=colorscale,
                log=log,
                zmax=zmax,
                max_cells=max(cells, 1),
                max_side=max(side, GRID_MAX_SIDE),
            )
        )
    pooled_shape = grids[0][0].shape[1:]
    note = (
        ""
        if pooled_shape == (len(q_tok), len(k_tok))
        else f" · max-pooled to {pooled_shape[0]}×{pooled_shape[1]} (every token is drawn up to "
        f"{FULL_TOKENS} tokens{'' if layer is not None else ' in a one-layer view, head_view(res, layer=i)'})"
    )
    where = f"{result.model_name}" + ("" if stack == "self" else f" · {stack}")
    top = f"{html.escape(heading)}<br>" if heading else ""
    lay = result.layout  # a block that mixes tokens another way too says so (Falcon-H1, zaya)
    extra = {i: lay.mixer_note(lay.model_layer(i)) for i in layers}
    titles = [
        top
        + html.escape(f"{where} · layer {i}{note}")
        + (f"<br>{html.escape(extra[i][:140])}" if extra[i] else "")
        for i in layers
    ]
    fig = figs[0]
    fig.update_layout(
        title=dict(text=titles[0], x=0.01, xanchor="left", y=0.99, yanchor="top"),
        margin=dict(t=100 if heading else 86),
    )
    if len(figs) == 1:
        return fig
    per = len(fig.data)
    for other in figs[1:]:
        for trace in other.data:
            trace.visible = False
            fig.add_trace(trace)
    steps = []
    for k, i in enumerate(layers):
        visible = [k * per <= t < (k + 1) * per for t in range(per * len(layers))]
        steps.append(
            dict(method="update", label=str(i), args=[{"visible": visible}, {"title.text": titles[k]}])
        )
    fig.update_layout(
        sliders=[dict(active=0, currentvalue=dict(prefix="layer "), steps=steps, pad=dict(t=40))],
        height=(fig.layout.height or 400) + 90,
    )
    return fig


def _mixer_view(
    result: ShownResult,
    block: int | None,
    mixer: str,
    heads: Sequence[int] | None,
    max_cells: int | None,
    heading: str,
) -> go.Figure:
    """`head_view` of a non-softmax mixer: signed, diverging around 0, pooled by the mean."""
    if block is None:
        raise BadIndex(f"a {mixer} view needs its block: head_view(res, layer=block, mixer={mixer!r})")
    n_heads = result.mixer_heads(int(block), mixer)
    per_head = MIXERS[mixer].per_head  # the record says: one signed A per head, or norms per channel
    chosen = list(range(n_heads)) if heads is None else [int(h) for h in heads]
    labels = result.tokens.labels
    n = result.n_tokens
    side = notebook_side(n, len(chosen), max_cells, one_layer=True)
    if side >= n:
        grid = result.mixer_tensor(int(block), heads=chosen, mixer=mixer).numpy()
        q_lab = k_lab = list(labels)
        note = ""
    else:
        views = [result.mixer_pooled(int(block), mixer, h, cells=side) for h in chosen]
        grid = np.stack([v.mean for v in views])
        edges = np.arange(0, n, views[0].tokens_per_bin)
        q_lab = k_lab = bin_labels(labels, edges)
        note = f" · mean-pooled to {grid.shape[1]}×{grid.shape[2]}"
    zmax = float(np.abs(grid).max()) or 1.0
    fig = head_grid(
        grid, q_lab, k_lab, heads=chosen, diverging=True, zmax=zmax, max_cells=max(grid.size, 1),
        max_side=max(side, GRID_MAX_SIDE),
    )  # fmt: skip
    lines = [heading] if heading else []
    lines.append(f"{result.model_name} · block {block} · {mixer}{note}")
    lines.append(result.mixer_meaning(mixer)[:120])
    extra = result.layout.mixer_note(int(block))
    if extra:
        lines.append(extra[:120])
    fig.update_layout(
        title=dict(
            text="<br>".join(html.escape(t) for t in lines), x=0.01, xanchor="left", y=0.99, yanchor="top"
        ),
        margin=dict(t=40 + 22 * len(lines)),
        coloraxis_colorbar_title="effective attention<br>(signed)" if per_head else "‖contribution‖",
    )
    return fig


def model_view(
    result: ShownResult, *, stack: Stack | None = None, colorscale: str = "Viridis", log: bool = False
) -> go.Figure:
    """Every layer x head at once, one small pooled tile each (the app's model overview mosaic)."""
    stack = result.resolve_stack(stack)
    n_layers, n_heads = result.n_layers(stack), result.n_heads
    if n_layers == 0:
        raise BadIndex(
            "this model has no softmax attention layers; draw its mixers one block at a time: "
            "attnviz.head_view(res, layer=block, mixer=res.layout.mixers[block][0])"
        )
    side = mosaic_side(n_layers, n_heads)
    every = list(range(n_heads))
    tiles, q_lab, k_lab = [], None, None
    for layer in range(n_layers):
        pooled, q_lab, k_lab = _pooled_layer(result, layer, every, stack, side)
        tiles.append(pooled)
    fig = model_mosaic(
        np.stack(tiles), colorscale=colorscale, log=log, kv_heads=_kv_heads(result, stack, every),
        q_labels=q_lab, k_labels=k_lab,
    )  # fmt: skip
    where = result.model_name + ("" if stack == "self" else f" · {stack}")
    fig.update_layout(
        title=dict(
            text=html.escape(f"{where} · {n_layers} layers × {n_heads} heads"), x=0.01, xanchor="left"
        ),
        margin=dict(t=80),
    )
    return fig


def summary(result: ShownResult) -> list[tuple[str, str]]:
    """(name, value) rows describing a result (plain text)."""
    lay = result.layout
    heads = f"{lay.n_heads}" + (f" ({lay.n_kv_heads} KV heads, GQA)" if lay.group_size > 1 else "")
    layers = " + ".join(f"{result.n_layers(s)} {s}" for s in result.stacks) if len(result.stacks) > 1 else ""
    preview = " ".join(result.tokens.display[:12]) + (" …" if result.n_tokens > 12 else "")
    return [
        ("model", f"{result.model_name} ({lay.model_type}, {lay.kind})"),
        ("tokens", f"{result.n_tokens}: {preview}"),
        ("layers × heads", f"{layers or result.n_layers()} × {heads}"),
        ("path", f"{result.path} ({result.seconds:.2f} s, {result.nbytes / 2**20:.1f} MiB held)"),
    ] + ([("token mixers", lay.mixer_summary())] if lay.mixer_summary() else [])


def mimebundle(result: ShownResult, max_cells: int = REPR_MAX_CELLS) -> dict[str, Any]:
    """What a notebook cell shows for ``result``: text, HTML (summary + figure, plotly.js from
    its CDN) and the Plotly JSON that JupyterLab, Notebook 7 and VS Code draw natively."""
    rows = summary(result)
    stack = result.stacks[0]
    q_tok, k_tok = result.axes(stack)
    n_layers = result.n_layers(stack)
    layer = None
    mixer = None
    if n_layers == 0 and result.layout.mixers:  # no attention (Mamba, RWKV): block 0's mixer
        layer, mixer = 0, result.layout.mixers[0][0]
        rows.append(("shown", f"block 0's {mixer}; attnviz.head_view(res, layer=b, mixer=...) for others"))
    elif n_layers * result.n_heads * len(q_tok) * len(k_tok) > REPR_ALL_LAYERS_CELLS:
        layer = n_layers // 2
        rows.append(("shown", f"layer {layer} of {n_layers}; attnviz.head_view(res) walks every layer"))
    text = "AttentionResult\n" + "".join(f"  {k}: {v}\n" for k, v in rows)
    fig = head_view(result, layer, max_cells=max_cells, heading=f"{rows[1][1][:80]}", mixer=mixer)
    left = "style='text-align:left'"
    table = "".join(
        f"<tr><th {left}>{html.escape(k)}</th><td {left}>{html.escape(v)}</td></tr>" for k, v in rows
    )
    page = f"<table>{table}</table>" + fig.to_html(full_html=False, include_plotlyjs="cdn")
    plotly_json = json.loads(fig.to_json())
    plotly_json["config"] = {"displaylogo": False}
    return {"text/plain": text, "text/html": page, PLOTLY_MIME: plotly_json}
