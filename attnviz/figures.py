"""Plotly figures of attention: pure builders, arrays and labels in, ``go.Figure`` out.

Nothing here imports Streamlit; pages call ``st.plotly_chart(fig)``. Conventions:

- Token axes are ``"(i) token"`` labels on category axes. The position prefix makes every label
  unique, so repeated tokens never merge (the reason the project avoids bare token categories),
  and the hover shows the query and key tokens with no extra per-cell payload. Downsampled axes
  label each bin ``"(i–j) token…"``.
- Every label and title built from user text is HTML-escaped (``<``, ``>``, ``&``): Plotly
  renders ``<b>`` and ``<br>`` in labels, and a token must be shown literally.
- Short token axes label every token (Plotly thins category ticks to every other one); long
  ones keep Plotly's thinning. The hover always names both tokens.
- Titles sit above the plot area under a top margin that leaves room for the mode bar.
- Payload is bounded: a heatmap cell costs about 6.7 bytes in the JSON the browser gets
  (base64 float32), so the builders pool down to ``GRID_MAX_CELLS`` / ``SINGLE_MAX_CELLS`` /
  ``MOSAIC_MAX_CELLS`` cells; one page view stays under 5 MB at any sequence length.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from typing import Literal, get_args

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

ColorScale = Literal["Viridis", "Magma", "Inferno", "Cividis", "Blues", "Greys"]
COLORSCALES: tuple[str, ...] = get_args(ColorScale)
DIVERGING = "RdBu_r"
Pool = Literal["max", "mean"]
POOLS: tuple[str, ...] = get_args(Pool)

BYTES_PER_CELL = 7  # measured: base64 float32 plus JSON escapes, rounded up
PAYLOAD_LIMIT = 5_000_000
GRID_MAX_SIDE = 128  # pixels per head side in a grid of heads
GRID_MAX_CELLS = 120_000  # all heads of one grid together (~0.8 MB)
SINGLE_MAX_CELLS = 400_000  # one head at full resolution up to 632 x 632 tokens (~2.7 MB)
SINGLE_MAX_KEYS = 1024  # key columns of a row window before keys are pooled
MOSAIC_MAX_CELLS = 300_000  # every layer x head of a model at once (~2 MB)
LOG_FLOOR_EXP = -5  # log colour: weights below 1e-5 share the lowest colour
ALL_TICKS_MAX = 48  # token axes with up to this many labels show every one
TITLE_MARGIN = 76  # px above the plot area: the mode bar (~30 px) and the title below it


# ---------------------------------------------------------------------------------------------
# Labels
# ---------------------------------------------------------------------------------------------


def escape(text: str) -> str:
    """``<``, ``>`` and ``&`` as HTML entities, so Plotly shows the text literally."""
    return html.escape(str(text), quote=False)


def token_labels(display: Sequence[str], positions: Sequence[int] | None = None) -> list[str]:
    """``"(i) token"`` per position (plain text; builders escape). ``positions`` keeps the
    original positions when some tokens are hidden."""
    pos = range(len(display)) if positions is None else positions
    return [f"({int(p)}) {d}" for p, d in zip(pos, display, strict=True)]


def _label_parts(label: str) -> tuple[str, str]:
    """ "(12) bank" -> ("12", "bank"); any other label -> ("", label)."""
    if label.startswith("(") and ") " in label:
        head, text = label[1:].split(") ", 1)
        return head, text
    return "", label


def bin_labels(labels: Sequence[str], edges: np.ndarray) -> list[str]:
    """One label per bin: the label itself for a one-token bin, else ``"(i–j) first…"``."""
    n = len(labels)
    stops = [*edges[1:].tolist(), n]
    out = []
    for a, b in zip(edges.tolist(), stops, strict=True):
        if b - a == 1:
            out.append(labels[a])
            continue
        first, text = _label_parts(labels[a])
        last, _ = _label_parts(labels[b - 1])
        out.append(f"({first}–{last}) {text}…" if first and last else f"[{a}–{b - 1}] {text}…")
    return out


def head_title(head: int, kv_head: int | None = None) -> str:
    """ "head 4 · kv 1" (GQA) or "head 4"."""
    return f"head {head}" if kv_head is None else f"head {head} · kv {kv_head}"


def token_ticks(labels: Sequence[str]) -> dict:
    """Axis settings that show every label of a short category axis (``labels`` as given to
    the trace, i.e. escaped); {} for a long one, which Plotly thins."""
    n = len(labels)
    if n == 0 or n > ALL_TICKS_MAX:
        return {}
    size = 12 if n <= 16 else (10 if n <= 32 else 9)
    return dict(tickmode="array", tickvals=list(labels), ticktext=list(labels), tickfont=dict(size=size))


def index_ticks(values: Sequence[str], max_labels: int = 16) -> tuple[list[str], list[str]]:
    """(tickvals, ticktext) for a numbered category axis (layers): every 1st, 2nd, 5th, 10th ...
    value so that at most ``max_labels`` show, labelled with their index."""
    n = len(values)
    step = next((s for s in (1, 2, 5, 10, 20, 50, 100, 200) if n / s <= max_labels), max(1, n // max_labels))
    picked = list(range(0, n, step))
    return [values[i] for i in picked], [str(i) for i in picked]


def _title(text: str, size: int = 14) -> dict:
    """A left-aligned title just above the plot area (clear of the mode bar on the right)."""
    return dict(
        text=text,
        x=0,
        xref="paper",
        xanchor="left",
        y=1,
        yref="paper",
        yanchor="bottom",
        pad=dict(b=10),
        font=dict(size=size),
    )


def figure_name(*parts: object) -> str:
    """A file name stem like ``attnviz_smollm2-135m_L3_H0`` (no path separators, no spaces)."""
    text = "_".join(str(p) for p in ("attnviz", *parts) if p not in (None, ""))
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)[:120]


# ---------------------------------------------------------------------------------------------
# Downsampling (pure numpy)
# ---------------------------------------------------------------------------------------------


def bin_edges(n: int, max_bins: int) -> np.ndarray:
    """Start index of each of ``min(n, max_bins)`` near-equal bins over ``range(n)``."""
    bins = max(1, min(int(n), int(max_bins)))
    return np.unique(np.floor(np.arange(bins) * (n / bins)).astype(np.int64))


def pool(a: np.ndarray, row_edges: np.ndarray, col_edges: np.ndarray, how: Pool = "max") -> np.ndarray:
    """Reduce the last two axes of ``a`` over bins that start at the given edges.

    ``"max"`` keeps a single strong weight visible (the default for pictures); ``"mean"`` keeps
    the average weight of the bin.
    """
    if how not in POOLS:
        raise ValueError(f"unknown pooling {how!r}; use one of {POOLS}")
    a = np.asarray(a, dtype=np.float32)
    if len(row_edges) == a.shape[-2] and len(col_edges) == a.shape[-1]:
        return a
    ufunc = np.maximum if how == "max" else np.add
    out = ufunc.reduceat(ufunc.reduceat(a, row_edges, axis=-2), col_edges, axis=-1)
    if how == "mean":
        rows = np.diff(np.append(row_edges, a.shape[-2]))
        cols = np.diff(np.append(col_edges, a.shape[-1]))
        out = out / (rows[:, None] * cols[None, :])
    return out.astype(np.float32)


def downsample(
    a: np.ndarray, max_rows: int, max_cols: int | None = None, how: Pool = "max"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pooled, row_edges, col_edges) with at most ``max_rows`` x ``max_cols`` cells per matrix."""
    max_cols = max_rows if max_cols is None else max_cols
    rows, cols = bin_edges(a.shape[-2], max_rows), bin_edges(a.shape[-1], max_cols)
    return pool(a, rows, cols, how), rows, cols


def pooled_rows(
    get_rows: Callable[[slice], np.ndarray],
    n_rows: int,
    n_cols: int,
    max_side: int,
    how: Pool = "max",
    chunk_cells: int = 1 << 24,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pool a (..., n_rows, n_cols) matrix fetched in row chunks; never holds it all at once.

    ``get_rows(slice)`` returns (..., rows, n_cols). Chunks follow the row bins, so each bin is
    reduced inside one chunk; a chunk has about ``chunk_cells`` cells per leading index (e.g.
    per head). Returns (pooled, row_edges, col_edges).
    """
    row_e, col_e = bin_edges(n_rows, max_side), bin_edges(n_cols, max_side)
    per_bin = max(1, math.ceil(n_rows / len(row_e)))
    bins_per_chunk = max(1, chunk_cells // max(1, per_bin * n_cols))
    parts = []
    for i in range(0, len(row_e), bins_per_chunk):
        starts = row_e[i : i + bins_per_chunk]
        stop = int(row_e[i + bins_per_chunk]) if i + bins_per_chunk < len(row_e) else n_rows
        block = np.asarray(get_rows(slice(int(starts[0]), stop)), dtype=np.float32)
        parts.append(pool(block, starts - starts[0], col_e, how))
    return np.concatenate(parts, axis=-2), row_e, col_e


def grid_side(
    n_heads: int, max_cells: int = GRID_MAX_CELLS, max_side: int = GRID_MAX_SIDE, n_tokens: int | None = None
) -> int:
    """Pixels per side of each head in a grid so that all heads fit ``max_cells``. With
    ``n_tokens`` given, a text of up to ``max_side`` tokens stays unpooled while the grid is
    within twice the budget (pooling 128 tokens into 115 bins would only blur them)."""
    side = max(8, min(max_side, int(math.sqrt(max_cells / max(1, n_heads)))))
    if n_tokens is not None and side < n_tokens <= max_side and n_heads * n_tokens**2 <= 2 * max_cells:
        return n_tokens
    return side


def payload_bytes(fig: go.Figure) -> int:
    """Size of the JSON the browser receives for ``fig``."""
    return len(fig.to_json())


# ---------------------------------------------------------------------------------------------
# Colour
# ---------------------------------------------------------------------------------------------


def _colour(z: np.ndarray, log: bool) -> np.ndarray:
    if not log:
        return z
    out = np.log10(np.maximum(z, 10.0**LOG_FLOOR_EXP)).astype(np.float32)
    return np.clip(out, LOG_FLOOR_EXP, 0.0, out=out)


def _coloraxis(colorscale: str, log: bool, zmax: float | None, title: str = "weight") -> dict:
    if log:
        ticks = list(range(LOG_FLOOR_EXP, 1))
        return dict(
            colorscale=colorscale,
            cmin=LOG_FLOOR_EXP,
            cmax=0,
            colorbar=dict(
                title=dict(text=title), tickvals=ticks, ticktext=[f"1e{t}" if t else "1" for t in ticks]
            ),
        )
    return dict(colorscale=colorscale, cmin=0.0, cmax=zmax, colorbar=dict(title=dict(text=title)))


def _weight_hover(log: bool) -> str:
    return "log₁₀ weight %{z:.2f}" if log else "weight %{z:.4f}"


def _max(z: np.ndarray) -> float:
    m = float(np.nanmax(z)) if z.size else 1.0
    return m if m > 0 else 1.0


# ---------------------------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------------------------


def _token_heatmap(
    z: np.ndarray, row_labels: Sequence[str], k_labels: Sequence[str], *, log: bool, row_name: str = ""
) -> tuple[go.Figure, list[str], list[str]]:
    """One heatmap over token labels (escaped: tokens are text, never HTML) sharing the figure's
    colour axis; returns the figure and the escaped key (x) and row (y) labels."""
    x, y = [escape(s) for s in k_labels], [escape(s) for s in row_labels]
    hover = f"{row_name}%{{y}}<br>key %{{x}}<br>{_weight_hover(log)}<extra></extra>"
    return go.Figure(go.Heatmap(z=z, x=x, y=y, coloraxis="coloraxis", hovertemplate=hover)), x, y


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
) -> go.Figure:
    """One head's (query_pos, key_pos) weights; max-pooled when larger than ``max_cells``.

    Hover shows the query token, the key token (with positions) and the weight.
    """
    probs = np.asarray(probs, dtype=np.float32)
    k_labels = q_labels if k_labels is None else k_labels
    n_q, n_k = probs.shape
    if len(q_labels) != n_q or len(k_labels) != n_k:
        raise ValueError(f"labels ({len(q_labels)}, {len(k_labels)}) do not match probs {probs.shape}")
    note = ""
    if n_q * n_k > max_cells:
        side = int(math.sqrt(max_cells))
        rows_max = side if n_q >= side else n_q
        cols_max = max_cells // max(1, min(rows_max, n_q))
        probs, re, ce = downsample(probs, rows_max, cols_max, "max")
        q_labels, k_labels = bin_labels(q_labels, re), bin_labels(k_labels, ce)
        note = f" (max-pooled to {probs.shape[0]}×{probs.shape[1]})"
    fig, x, y = _token_heatmap(_colour(probs, log), q_labels, k_labels, log=log, row_name="query ")
    fig.update_layout(
        title=_title(escape(title) + note),
        coloraxis=_coloraxis(colorscale, log, zmax if zmax is not None else _max(probs)),
        height=height,
        margin=dict(l=10, r=10, t=TITLE_MARGIN, b=10),
        xaxis=dict(
            type="category", title=dict(text="key"), tickangle=-60, constrain="domain", **token_ticks(x)
        ),
        yaxis=dict(type="category", title=dict(text="query"), autorange="reversed", **token_ticks(y)),
    )
    return fig


def head_grid(
    layer_probs: np.ndarray,
    q_labels: Sequence[str],
    k_labels: Sequence[str] | None = None,
    *,
    heads: Sequence[int] | None = None,
    kv_heads: Sequence[int] | None = None,
    cols: int | None = None,
    titles: Sequence[str] | None = None,
    colorscale: str = "Viridis",
    log: bool = False,
    zmax: float | None = None,
    diverging: bool = False,
    max_cells: int = GRID_MAX_CELLS,
    facet_px: int = 190,
) -> go.Figure:
    """All heads of one layer, one heatmap each, in one figure with a shared colour axis.

    ``layer_probs`` is (heads, query_pos, key_pos), already pooled or not (pooled here to fit
    ``max_cells``). ``kv_heads[i]`` labels each facet "head h · kv g"; with GQA the grid puts
    one KV group per row. ``diverging`` draws signed differences around 0.
    """
    layer_probs = np.asarray(layer_probs, dtype=np.float32)
    k_labels = q_labels if k_labels is None else k_labels
    n_h = layer_probs.shape[0]
    heads = list(range(n_h)) if heads is None else [int(h) for h in heads]
    side = grid_side(n_h, max_cells, n_tokens=max(layer_probs.shape[-2:]))
    pooled, re, ce = downsample(layer_probs, side, side, "mean" if diverging else "max")
    ql, kl = bin_labels(q_labels, re), bin_labels(k_labels, ce)
    if cols is None:
        cols = _grid_cols(n_h, kv_heads)
    rows = math.ceil(n_h / cols)
    if titles is None:
        titles = [head_title(h, None if kv_heads is None else kv_heads[i]) for i, h in enumerate(heads)]
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=[escape(t) for t in titles],
        horizontal_spacing=0.02,
        vertical_spacing=min(0.08, 0.3 / rows),
        shared_xaxes="all",
        shared_yaxes="all",
    )
    x, y = [escape(s) for s in kl], [escape(s) for s in ql]
    z_all = pooled if diverging else _colour(pooled, log)
    hover = "%{z:+.4f}" if diverging else _weight_hover(log)
    for i in range(n_h):
        fig.add_trace(
            go.Heatmap(
                z=z_all[i],
                x=x,
                y=y,
                coloraxis="coloraxis",
                name=titles[i],
                hovertemplate=f"{escape(titles[i])}<br>query %{{y}}<br>key %{{x}}<br>{hover}<extra></extra>",
            ),
            row=i // cols + 1,
            col=i % cols + 1,
        )
    if diverging:
        bound = float(np.nanmax(np.abs(pooled))) if pooled.size else 1.0
        bound = bound or 1.0
        axis = dict(colorscale=DIVERGING, cmin=-bound, cmax=bound, cmid=0.0, colorbar=dict(title="Δ weight"))
    else:
        axis = _coloraxis(colorscale, log, zmax if zmax is not None else _max(pooled))
    show_ticks = len(ql) <= 16
    fig.update_xaxes(type="category", showticklabels=False, ticks="", tickangle=-60)
    fig.update_yaxes(type="category", autorange="reversed", showticklabels=False, ticks="")
    if show_ticks:
        small = dict(size=11 if len(ql) <= 8 else 9)
        fig.update_xaxes(**{**token_ticks(x), "tickfont": small})
        fig.update_yaxes(**{**token_ticks(y), "tickfont": small})
    if show_ticks:  # token labels on the left column and under the bottom facet of each column
        for i in range(n_h):
            r, c = i // cols + 1, i % cols + 1
            if i + cols >= n_h:
                fig.update_xaxes(showticklabels=True, row=r, col=c)
            if c == 1:
                fig.update_yaxes(showticklabels=True, row=r, col=c)
    fig.update_layout(
        coloraxis=axis,
        height=max(260, rows * facet_px + (120 if show_ticks else 60)),
        margin=dict(l=10, r=10, t=56, b=10),
        showlegend=False,
    )
    fig.update_annotations(font_size=12)
    return fig


def _grid_cols(n_heads: int, kv_heads: Sequence[int] | None) -> int:
    """One KV group per row under GQA (if groups are 2..8 wide), else up to 4 columns."""
    if kv_heads is not None:
        group = sum(1 for g in kv_heads if g == kv_heads[0])
        if 1 < group <= 8 and n_heads % group == 0:
            return group
    return min(n_heads, 4 if n_heads <= 16 else 8)


def model_mosaic(
    images: np.ndarray,
    *,
    colorscale: str = "Viridis",
    log: bool = False,
    kv_heads: Sequence[int] | None = None,
    q_labels: Sequence[str] | None = None,
    k_labels: Sequence[str] | None = None,
    layers_across: bool | None = None,
    width_px: int = 1100,
) -> go.Figure:
    """Every (layer, head) at once: (layers, heads, s_q, s_k) small images tiled into one heatmap.

    The longer of the two counts runs across (30 layers x 9 heads: layers are columns), so the
    tiles stay square and the figure short. A one-cell gap separates tiles. Hover names the
    layer, the head and (with ``q_labels`` / ``k_labels``, one per tile row / column) the tokens.
    Build ``images`` with `pooled_rows` to fit `MOSAIC_MAX_CELLS`.
    """
    images = np.asarray(images, dtype=np.float32)
    n_l, n_h, s_r, s_c = images.shape
    across = n_l > n_h if layers_across is None else layers_across
    grid = images.transpose(1, 0, 2, 3) if across else images  # (outer rows, outer cols, s_r, s_c)
    n_rows, n_cols = grid.shape[:2]
    tile_r, tile_c = s_r + 1, s_c + 1
    canvas = np.full((n_rows * tile_r, n_cols * tile_c), np.nan, dtype=np.float32)
    for i in range(n_rows):
        for j in range(n_cols):
            canvas[i * tile_r : i * tile_r + s_r, j * tile_c : j * tile_c + s_c] = grid[i, j]
    layer_names = [f"layer {i}" for i in range(n_l)]
    head_names = [head_title(h, None if kv_heads is None else kv_heads[h]) for h in range(n_h)]
    row_names, col_names = (head_names, layer_names) if across else (layer_names, head_names)
    ql = [escape(x) for x in q_labels] if q_labels is not None else [f"bin {r}" for r in range(s_r)]
    kl = [escape(x) for x in k_labels] if k_labels is not None else [f"bin {c}" for c in range(s_c)]
    ylab = [
        f"{row_names[r // tile_r]} · query {ql[r % tile_r]}"
        if r % tile_r < s_r
        else f"{row_names[r // tile_r]} ·"
        for r in range(canvas.shape[0])
    ]
    xlab = [
        f"{col_names[c // tile_c]} · key {kl[c % tile_c]}"
        if c % tile_c < s_c
        else f"{col_names[c // tile_c]} ·"
        for c in range(canvas.shape[1])
    ]
    fig = go.Figure(
        go.Heatmap(
            z=_colour(canvas, log),
            x=xlab,
            y=ylab,
            coloraxis="coloraxis",
            hoverongaps=False,
            hovertemplate=f"%{{y}}<br>%{{x}}<br>{_weight_hover(log)}<extra></extra>",
        )
    )
    short_rows = [f"H{h}" for h in range(n_h)] if across else [f"L{i}" for i in range(n_l)]
    short_cols = [f"L{i}" for i in range(n_l)] if across else [f"H{h}" for h in range(n_h)]
    cell_px = (width_px - 120) / canvas.shape[1]
    fig.update_layout(
        coloraxis=_coloraxis(colorscale, log, _max(images) if images.size else 1.0),
        height=int(min(2400, max(260, canvas.shape[0] * cell_px + 70))),
        margin=dict(l=10, r=10, t=40, b=10),
        xaxis=dict(
            type="category",
            side="top",
            tickmode="array",
            tickvals=[xlab[j * tile_c + s_c // 2] for j in range(n_cols)],
            ticktext=short_cols,
            showgrid=False,
        ),
        yaxis=dict(
            type="category",
            autorange="reversed",
            tickmode="array",
            tickvals=[ylab[i * tile_r + s_r // 2] for i in range(n_rows)],
            ticktext=short_rows,
            scaleanchor="x",
            showgrid=False,
        ),
        plot_bgcolor="rgba(0,0,0,0)",
    )
    return fig


def mosaic_side(n_layers: int, n_heads: int, max_cells: int = MOSAIC_MAX_CELLS, max_side: int = 64) -> int:
    """Pixels per side of each tile so that a (layers x heads) mosaic fits ``max_cells``."""
    return max(4, min(max_side, int(math.sqrt(max_cells / max(1, n_layers * n_heads))) - 1))


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
) -> go.Figure:
    """Attention rows of one query (one row per head, or per layer) over the key positions."""
    rows = np.asarray(rows, dtype=np.float32)
    note = ""
    if rows.shape[1] > max_cols:
        rows, _, ce = downsample(rows, rows.shape[0], max_cols, "max")
        k_labels = bin_labels(k_labels, ce)
        note = f" (keys max-pooled to {rows.shape[1]})"
    fig, x, y = _token_heatmap(_colour(rows, log), row_labels, k_labels, log=log)
    fig.update_layout(
        title=_title(escape(title) + note),
        coloraxis=_coloraxis(colorscale, log, _max(rows)),
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
