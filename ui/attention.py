"""What the pages show of a result: the view options (hidden tokens, no sink) applied to rows of
attention, pooled grids for long inputs, and the labels that go with them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import streamlit as st
import torch

from attnviz import AttentionResult
from attnviz import figures as F
from attnviz.analysis.rollout import drop_and_renormalize
from attnviz.analysis.value_weighted import ValueWeighted
from attnviz.layout import Stack
from ui import models, state


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


def stack_picker(stacks: Sequence[Stack], format_func: Callable[[str], str] = str) -> Stack:
    """Which attention to show (key "stack"): a segmented control when the model has more than
    one (encoder, decoder, cross), else the only one."""
    options = list(stacks)
    stack: str | None = state.choose("stack", options, "attention")
    if len(options) > 1:
        stack = st.segmented_control(
            "Attention", options, key="stack", format_func=format_func, required=True
        )
    return cast(Stack, stack)


def kv_heads(res: AttentionResult, stack: Stack) -> list[int] | None:
    """The KV head of each query head, or None without GQA (and for cross-attention)."""
    lay = res.layout
    if lay.group_size <= 1 or stack == "cross":
        return None
    return [lay.kv_head_of(h) for h in range(lay.n_heads)]


def head_picker(n_heads: int, kv: list[int] | None) -> int:
    """The head selectbox (key "head"). Options are "head h" whatever the model: a label that
    names the KV head ("head 7 · kv 2") stayed on screen after a switch to a model without GQA;
    the KV head is in the help and in the view's title."""
    state.clamp("head", 0, n_heads - 1, "head")
    return int(
        st.selectbox(
            "Head",
            list(range(n_heads)),
            key="head",
            format_func=lambda h: f"head {h}",
            help="With grouped K/V (GQA) the view's title names the KV head the query head reads."
            if kv
            else None,
        )
    )


def window_rows(n_q: int, n_k: int) -> int:
    """Query rows of the single-head view: all of them when they fit the payload budget."""
    if n_q * n_k <= F.SINGLE_MAX_CELLS:
        return n_q
    return max(16, F.SINGLE_MAX_CELLS // min(n_k, F.SINGLE_MAX_KEYS))


METRIC_NAMES = {
    "entropy": "entropy (0 = one key, 1 = uniform)",
    "sink": "sink (weight on the first token)",
    "previous_token": "previous token",
    "diagonal": "self (diagonal)",
    "distance": "mean distance (tokens)",
    "induction": "induction (repeated random tokens)",
    "gqa_coherence": "GQA coherence (KV group agreement)",
}


def head_metrics(
    lm, res: AttentionResult, key: tuple, stack: Stack, *, induction: bool, token: str | None = None
):
    """`attnviz.metrics.head_metrics` of a result, cached; ``induction`` adds the probe (one more
    model run on 2 x 50 random tokens, cached per model). Returns (metrics, note)."""
    from attnviz import metrics

    probe, note = None, ""
    if induction and stack != "cross":
        try:
            probe = models.cached(
                "probe",
                (lm.spec, models.token_key(token)),
                lambda: metrics.induction_probe(lm),
                nbytes=lambda p: p.result.nbytes,
            )
        except Exception as err:  # noqa: BLE001 - the other metrics still show
            note = f"Induction scores are not available for this model ({err})."
    elif induction:
        note = "Induction is defined on self-attention; pick the encoder or decoder stack."
    hm = models.cached(
        "metrics",
        (key, stack, probe is not None),
        lambda: metrics.head_metrics(res, stack=stack, induction=probe),
        nbytes=lambda m: 8 * 8 * m.entropy.size,
    )
    return hm, note


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
