"""Views at any length: a layer or head larger than the payload budget is drawn block-pooled
from `attnviz.analysis.pooling.pooled` (computed on the model's device from Q/K and the log-sum-exp,
never a dense N×N on the host), and a zoomed region at full resolution from `pooling.region`.

Pooling applies to the plain result when every token is shown and no key is dropped (the
hide-special-tokens / without-sink options renormalise rows, which block maxima cannot carry):
otherwise, and for the value-weighted view, the pages keep the exact row path
(`ui.shown.rows_pooled_grid`, the head view's row window) and say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import streamlit as st

from attnviz import AttentionResult
from attnviz import figures as F
from attnviz.analysis import pooling
from ui import models, shown, state

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


def applies(res: Any, view: shown.View, ax: shown.Axes) -> bool:
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


def layer_image(
    res: Any, key: tuple, layer: int, view: shown.View, ax: shown.Axes, side: int, how: str
) -> Image:
    """All heads of a layer at most ``side`` × ``side`` each: exact when the text fits, pooled on
    the device when it does not (``how``: "max" or "mean"), else pooled on the host from exact
    rows (`ui.shown.rows_pooled_grid`, max)."""
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
    z, q_lab, k_lab = shown.rows_pooled_grid(res, key, layer, view, ax, side)
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
    view: shown.View,
    ax: shown.Axes,
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


def zoom_controls(n_q: int, n_k: int) -> tuple[slice, slice]:
    """The zoom region's controls (keys ``zq``, ``zk``, ``zn``): its first query, first key and
    side; returns the (rows, cols) slices of shown positions, clipped to the text."""
    c1, c2, c3 = st.columns(3)
    side_max = min(HEAD_SIDE, max(n_q, n_k))
    state.clamp("zq", 0, max(0, n_q - 1), "first query")
    state.clamp("zk", 0, max(0, n_k - 1), "first key")
    state.clamp("zn", min(8, side_max), side_max, "zoom side")
    with c1:
        q0 = st.number_input("First query", 0, max(0, n_q - 1), key="zq", step=1)
    with c2:
        k0 = st.number_input("First key", 0, max(0, n_k - 1), key="zk", step=1)
    with c3:
        n = st.number_input("Side (tokens)", min(8, side_max), side_max, key="zn", step=8)
    return slice(int(q0), min(n_q, int(q0) + int(n))), slice(int(k0), min(n_k, int(k0) + int(n)))


def zoomed(
    res: Any, layer: int, head_: int, view: shown.View, ax: shown.Axes, rows: slice, cols: slice
) -> np.ndarray:
    """The region (rows, cols of shown positions) at full resolution: `pooling.region` on the
    device where pooling applies, else exact rows with the view's options applied."""
    if applies(res, view, ax):
        return pooling.region(res, layer, [head_], rows=rows, cols=cols, stack=view.stack)[0]
    return shown.rows(res, layer, view, ax, rows, heads=[head_])[0][:, cols]
