"""What a page shows of a result, at any length: the view options (hidden tokens, no sink)
applied to rows of attention, the value-weighted view, the `Drawing` one explorer run draws, and
how a view too large to draw whole is drawn.

A layer or head larger than the payload budget is drawn block-pooled from
`attnviz.analysis.pooling.pooled` (computed on the model's device from Q/K and the log-sum-exp,
never a dense N×N on the host), and a zoomed region at full resolution from `pooling.region`.
Pooling on the device applies to the plain result when every token is shown and no key is
dropped (`applies`: the hide-special-tokens / without-sink options renormalise rows, which block
maxima cannot carry); otherwise, and for the value-weighted view, the pages keep the exact row
path (`rows_pooled_grid`, the head view's row window) and say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import streamlit as st
import torch

from attnviz import AttentionResult, AttnvizError
from attnviz import figures as F
from attnviz.analysis import pooling
from attnviz.analysis.rollout import drop_and_renormalize
from attnviz.analysis.value_weighted import ValueWeighted
from attnviz.layout import Stack
from ui import models


@dataclass(frozen=True)
class View:
    """Which attention is shown: the stack, hidden special/template tokens, the sink dropped.

    Hiding and dropping renormalise every row over the keys that are left."""

    stack: Stack
    hide: bool = False
    nosink: bool = False


@dataclass(frozen=True, eq=False)
class Axes:
    q_idx: np.ndarray  # original query positions shown
    k_idx: np.ndarray  # original key positions shown
    k_drop: np.ndarray  # bool over all key positions: True = dropped (renormalised away)
    q_labels: list[str]  # "(i) token", plain text
    k_labels: list[str]


def axes(res: AttentionResult, view: View) -> Axes:
    qt, kt = res.axes(view.stack)
    q_keep = ~qt.hidden if view.hide else np.ones(len(qt), dtype=bool)
    k_drop = kt.hidden.copy() if view.hide else np.zeros(len(kt), dtype=bool)
    if view.nosink and len(kt) > 1:
        k_drop[0] = True
    q_idx, k_idx = np.flatnonzero(q_keep), np.flatnonzero(~k_drop)
    q_all, k_all = F.token_labels(qt.display), F.token_labels(kt.display)
    return Axes(q_idx, k_idx, k_drop, [q_all[i] for i in q_idx], [k_all[i] for i in k_idx])


def rows(
    res: AttentionResult,
    layer: int,
    view: View,
    ax: Axes,
    sel: slice = slice(None),
    heads: list[int] | None = None,
) -> np.ndarray:
    """float32 (heads, shown query rows ``sel``, shown keys) with the view applied."""
    orig = ax.q_idx[sel]
    if orig.size == 0:
        n_h = res.n_heads if heads is None else len(heads)
        return np.zeros((n_h, 0, len(ax.k_idx)), dtype=np.float32)
    lo, hi = int(orig[0]), int(orig[-1]) + 1
    t = res.layer_tensor(layer, heads=heads, rows=slice(lo, hi), stack=view.stack)
    if hi - lo != orig.size:
        t = t[:, torch.as_tensor(orig - lo, device=t.device)]
    if ax.k_drop.any():
        t = drop_and_renormalize(t, ax.k_drop)
    return t.float().cpu().numpy()


def head_rows(res: AttentionResult, layer: int, head: int, view: View, ax: Axes, sel: slice = slice(None)):
    """float32 (shown query rows, shown keys) of one head."""
    return rows(res, layer, view, ax, sel, heads=[head])[0]


def rows_pooled_grid(
    res: AttentionResult, key: tuple, layer: int, view: View, ax: Axes, side: int
) -> tuple[np.ndarray, list[str], list[str]]:
    """All heads of a layer max-pooled to at most side x side each, fetched in row chunks
    (never the whole layer at once for long inputs); cached per result/layer/view."""

    def build():
        n_q, n_k = len(ax.q_idx), len(ax.k_idx)
        pooled, re, ce = F.pooled_rows(lambda sl: rows(res, layer, view, ax, sl), n_q, n_k, side)
        return pooled, F.bin_labels(ax.q_labels, re), F.bin_labels(ax.k_labels, ce)

    return models.cached("grid", (key, layer, view, side), build)


def window_rows(n_q: int, n_k: int) -> int:
    """Query rows of the single-head view: all of them when they fit the payload budget."""
    if n_q * n_k <= F.SINGLE_MAX_CELLS:
        return n_q
    return max(16, F.SINGLE_MAX_CELLS // min(n_k, F.SINGLE_MAX_KEYS))


VALUE_WEIGHTED_NAME = "‖α·W_O v‖ (rel.)"  # Kobayashi et al. 2020: each weight times its value's output norm


@dataclass(frozen=True, eq=False)
class Drawing:
    """What one run of the explorer draws: the result shown (or its value-weighted view) and its
    cache key, the layer, the view options and their axes, and the colour. Lives for one run:
    never hand it to a callable that outlives the run (downloads hold a `ui.models.ResultRef`)."""

    res: Any  # AttentionResult or a ValueWeighted view of it
    key: tuple  # the derived-values cache key of ``res``
    view: View
    layer: int
    ax: Axes
    kv: list[int] | None
    cmap: str
    choice: str  # the colour control's choice ("auto", "perhead", ...)
    scale: str  # what it resolves to here ("linear", "log", "rank")
    scale_note: str
    side: int  # bins per axis of one grid tile
    how: str  # block pooling: "max" or "mean"

    @property
    def stack(self) -> Stack:
        return self.view.stack

    @property
    def value_name(self) -> str:
        """What the colour is: the weight, or value-weighted attention's norm (relative)."""
        return VALUE_WEIGHTED_NAME if isinstance(self.res, ValueWeighted) else "weight"

    @property
    def stack_part(self) -> str:
        """The stack in titles and file names ("" for plain self-attention)."""
        return "" if self.view.stack == "self" else self.view.stack

    @property
    def n_shown(self) -> int:
        return max(len(self.ax.q_idx), len(self.ax.k_idx))


def value_weighted(ref: models.ResultRef, res: AttentionResult, on: bool) -> tuple[Any, tuple]:
    """(result or its value-weighted view, cache key). A model the view cannot map shows why."""
    if not on:
        return res, ref.key
    lm = models.load(ref.spec, ref.token)
    if lm is None:
        return res, ref.key
    wrapped = models.cached("vw", ref.key, lambda: ValueWeighted(lm, res), nbytes=lambda _: 1 << 20)
    try:
        wrapped.norms(0, res.stacks[0])
    except AttnvizError as err:
        st.warning(f"Value-weighted attention is not available here: {err}.", icon=":material/info:")
        return res, ref.key
    return wrapped, (*ref.key, "vw")


HEAD_SIDE = math.isqrt(F.SINGLE_MAX_CELLS)  # bins per axis of one pooled head (632: ~2.7 MB)
FALLBACK_NOTE = (
    "hidden tokens / the dropped sink renormalise rows, which block pooling on the device cannot "
    "do: pooled on the server from exact rows instead"
)


@dataclass(frozen=True, eq=False)
class Image:
    """What a view draws: (heads, rows, cols) weights, their labels, and how they were made."""

    z: np.ndarray
    q_labels: list[str]
    k_labels: list[str]
    note: str  # how it was pooled; "" when exact and full size
    caveat: str = ""  # why the exact row path ran instead of device pooling


def applies(res: Any, view: View, ax: Axes) -> bool:
    """Block pooling on the device can draw this view: the plain result (not a value-weighted
    wrapper), every query shown and no key dropped."""
    if type(res) is not AttentionResult:
        return False
    n_q, n_k = (len(t) for t in res.axes(view.stack))
    return len(ax.q_idx) == n_q and len(ax.k_idx) == n_k and not ax.k_drop.any()


def device_pooled(
    res: AttentionResult, key: tuple, layer: int, stack, heads: list[int] | None, side: int, how: str
) -> pooling.PooledView:
    """`pooling.pooled` of ``heads`` (None: all) on bins of one width, at most ``side`` per axis
    (`pooling.equal_edges`: pooled by reshapes), only the ``how`` pool ("max" or "mean");
    cached per result, layer, heads, bins and pool."""
    n_q, n_k = (len(t) for t in res.axes(stack))
    re, ce = pooling.equal_edges(n_q, side), pooling.equal_edges(n_k, side)
    hs = None if heads is None else tuple(heads)
    return models.cached(
        "pooled",
        (key, layer, stack, hs, side, how),
        lambda: pooling.pooled(res, layer, heads, stack=stack, row_edges=re, col_edges=ce, pools=[how]),
        nbytes=lambda v: v.values(how).nbytes,
    )


def layer_image(res: Any, key: tuple, layer: int, view: View, ax: Axes, side: int, how: str) -> Image:
    """All heads of a layer at most ``side`` × ``side`` each: exact when the text fits, pooled on
    the device when it does not (``how``: "max" or "mean"), else pooled on the host from exact
    rows (`ui.rows_pooled_grid`, max)."""
    n_q, n_k = len(ax.q_idx), len(ax.k_idx)
    fits = len(F.bin_edges(n_q, side)) == n_q and len(F.bin_edges(n_k, side)) == n_k
    if not fits and applies(res, view, ax):
        pv = device_pooled(res, key, layer, view.stack, None, side, how)
        z = pv.values(how)
        return Image(
            z,
            F.bin_labels(ax.q_labels, pv.row_edges),
            F.bin_labels(ax.k_labels, pv.col_edges),
            f"{how}-pooled to {z.shape[1]}×{z.shape[2]} on the {_where(pv)}",
        )
    z, q_lab, k_lab = rows_pooled_grid(res, key, layer, view, ax, side)
    if z.shape[1:] == (n_q, n_k):
        return Image(z, q_lab, k_lab, "")
    why = "" if type(res) is AttentionResult else "value-weighted: pooled on the server from exact rows"
    if not why and not applies(res, view, ax):
        why = FALLBACK_NOTE
    return Image(
        z,
        q_lab,
        k_lab,
        f"max-pooled to {z.shape[1]}×{z.shape[2]}",
        why[0].upper() + why[1:] + "." if why else "",
    )


def _where(pv: pooling.PooledView) -> str:
    return "device from Q/K" if pv.path == "fused" else f"device from exact rows ({pv.path})"


def head_image(
    res: AttentionResult,
    key: tuple,
    layer: int,
    head_: int,
    view: View,
    ax: Axes,
    how: str,
) -> Image:
    """One head of a text too long to draw whole, pooled on the device to at most
    `HEAD_SIDE` × `HEAD_SIDE` (call only where `applies`)."""
    pv = device_pooled(res, key, layer, view.stack, [head_], HEAD_SIDE, how)
    z = pv.values(how)[0]
    return Image(
        z,
        F.bin_labels(ax.q_labels, pv.row_edges),
        F.bin_labels(ax.k_labels, pv.col_edges),
        f"{how}-pooled to {z.shape[0]}×{z.shape[1]} on the {_where(pv)}",
    )


def zoomed(res: Any, layer: int, head_: int, view: View, ax: Axes, q_sel: slice, k_sel: slice) -> np.ndarray:
    """The region (``q_sel`` x ``k_sel`` of shown positions) at full resolution: `pooling.region`
    on the device where pooling applies, else exact rows with the view's options applied."""
    if applies(res, view, ax):
        return pooling.region(res, layer, [head_], rows=q_sel, cols=k_sel, stack=view.stack)[0]
    return rows(res, layer, view, ax, q_sel, heads=[head_])[0][:, k_sel]
