"""What a page shows of a result: the view options (hidden tokens, no sink) applied to rows of
attention, pooled grids for long inputs, their labels, the value-weighted view, and the
`Drawing` one explorer run draws."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import streamlit as st
import torch

from attnviz import AttentionResult, AttnvizError
from attnviz import figures as F
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
