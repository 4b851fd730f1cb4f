"""Why a head attends: one pre-softmax score split exactly into what wrote the query and the key.

The stream entering layer l at position p is the sum of what wrote it (`qk_parts`, checked):

    x(p) = embed(p) [+ pos(p)] + Σ_{m<l} ( Σ_g N_m(W_O^g z^g(p)) + mlp_m(p) ) + bias(p)

(``bias``: b_O and the norms' biases, owned by no head); in a hybrid, each earlier block's
branches: softmax heads ``L{m}H{g}``, mixer heads ``L{m}.{kind}{h}`` through their output
projection, per-channel mixers ``L{m}.{kind}`` and MLPs ``L{m}.mlp`` (`qk_mixed`).
With every norm frozen at its forward scale, the head's query and key are affine in x
(`qk_maps`), so the score is bilinear:

    s_h(i, j) = scaling · q(i) · k(j) = Σ_a Σ_b T[a, b],
    T[a, b]   = scaling · q_a(i) · k_b(j)

with q_a(i) the image of part a at i (the query side's constants, b_Q and the norm's β, go to
``bias``). What the model adds after the product is its own term (``position_bias``: ALiBi, a
relative bias, an additive mask's value). A soft-capped score (Gemma 2) is split before the cap,
c·tanh(s/c) acting on the whole sum; a learned sink (gpt-oss) is no pair of tokens and is not
in any score. With rotary tables, each term splits further by rotary band (`by_band`): the
dims of a head pair up, and a term is the sum of its pairs' products (`qk_bands`).

`qk_attribution` splits one cell; `qk_row` one query over all its keys (key side per key, query
side per key, and both per layer of origin). Parts are streamed by layer of origin, so a row at
8k tokens never holds every part at every position at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import AttnvizError
from ..layout import kv_heads_of
from ..loading import LoadedModel
from ..tokens import Tokens
from .qk_bands import BandSplit, band_split
from .qk_maps import SideMap, layer_maps
from .qk_mixed import MixedTrace
from .qk_parts import Source, block_of, parts, source
from .residual import Trace

POSITION_BIAS = "position_bias"


def origin(component: str) -> str:
    """The layer a part was written in (``L3H1`` and ``L3.mlp``: ``L3``), or the part itself."""
    return component.split(".")[0].split("H")[0] if component.startswith("L") else component


@dataclass(frozen=True)
class QKAttribution:
    """One score s_h(query, key) as T[a, b] (query-side part a x key-side part b) + position bias."""

    model_name: str
    tokens: Tokens
    layer: int
    head: int
    kv_head: int
    query: int
    key: int
    components: tuple[str, ...]  # the parts, the same on both sides
    terms: np.ndarray  # (parts, parts) float64: [query part, key part]
    position_bias: float  # added after the product (ALiBi, relative bias, mask value); 0 without
    score: float  # the model's own pre-softmax score (before any soft-cap), float32 tensors
    softcap: float | None
    notes: tuple[str, ...] = ()
    block: int = -1  # the model's own block index of ``layer`` (= layer but in hybrids)
    bands: BandSplit | None = None  # each part's image per rotary band (`by_band`)

    @property
    def total(self) -> float:
        return float(self.terms.sum()) + self.position_bias

    @property
    def error(self) -> float:
        """score − Σ terms: float rounding (tested ≤ 1e-4 relative)."""
        return self.score - self.total

    @property
    def capped(self) -> float:
        """The score after the soft-cap (the value the softmax sees); = score without one."""
        return self.score if not self.softcap else float(self.softcap * np.tanh(self.score / self.softcap))

    @property
    def query_marginal(self) -> np.ndarray:
        """(parts,) each query-side part with the whole key."""
        return self.terms.sum(axis=1)

    @property
    def key_marginal(self) -> np.ndarray:
        """(parts,) each key-side part with the whole query."""
        return self.terms.sum(axis=0)

    def top(self, k: int = 10) -> list[tuple[str, str, float]]:
        """(query part, key part, value), largest |value| first."""
        flat = np.argsort(-np.abs(self.terms), axis=None)[:k]
        c = self.components
        return [
            (c[a], c[b], float(self.terms[a, b]))
            for a, b in zip(*np.unravel_index(flat, self.terms.shape), strict=True)
        ]

    def by_origin(self) -> tuple[tuple[str, ...], np.ndarray]:
        """The terms summed per layer of origin on each side: (labels, (origins, origins))."""
        labels, index = _origins(self.components)
        m = np.zeros((len(labels), len(labels)))
        np.add.at(m, (index[:, None], index[None, :]), self.terms)
        return labels, m

    def by_band(self, k: int = 10) -> tuple[tuple[str, ...], list[tuple[str, str]], np.ndarray]:
        """The top ``k`` terms split by rotary band: (band labels, [(query part, key part)],
        (bands, k) values); each column sums to its term exactly (the dims of the bands
        partition d_head). Without rotary tables (ALiBi, NoPE, learned positions): one band."""
        if self.bands is None:
            raise AttnvizError("this split kept no per-band images")
        top = self.top(k)
        c = self.components
        pairs = [(c.index(a), c.index(b)) for a, b, _ in top]
        return self.bands.labels, [(a, b) for a, b, _ in top], self.bands.terms(pairs)

    def to_frame(self) -> Any:
        """One row per term: query_component, key_component, value (+ the position bias row)."""
        import pandas as pd

        c = self.components
        rows = [(c[a], c[b], float(self.terms[a, b])) for a in range(len(c)) for b in range(len(c))]
        if self.position_bias:
            rows.append((POSITION_BIAS, POSITION_BIAS, self.position_bias))
        return pd.DataFrame(rows, columns=["query_component", "key_component", "value"])


@dataclass(frozen=True)
class QKRow:
    """One query's scores over its visible keys, each split on one side at a time."""

    model_name: str
    tokens: Tokens
    layer: int
    head: int
    kv_head: int
    query: int
    components: tuple[str, ...]
    keys: np.ndarray  # (keys,) the key positions the query sees
    key_terms: np.ndarray  # (keys, parts) [j, b] = scaling · q(i) · k_b(j): the key side
    query_terms: np.ndarray  # (keys, parts) [j, a] = scaling · q_a(i) · k(j): the query side
    position_bias: np.ndarray  # (keys,)
    scores: np.ndarray  # (keys,) the model's own pre-softmax scores (before any soft-cap)
    softcap: float | None
    notes: tuple[str, ...] = ()
    block: int = -1  # the model's own block index of ``layer``

    def top_key_parts(self, key: int, k: int = 3) -> list[tuple[str, float]]:
        """The key-side parts that add most to key ``key``'s score (largest |value| first)."""
        where = np.flatnonzero(self.keys == key)
        if not len(where):
            raise AttnvizError(f"query {self.query} does not see key {key}")
        row = self.key_terms[where[0]]
        return [(self.components[b], float(row[b])) for b in np.argsort(-np.abs(row))[:k]]

    def by_origin(self, side: str = "key") -> tuple[tuple[str, ...], np.ndarray]:
        """(labels, (keys, origins)): one side's parts summed per layer of origin."""
        labels, index = _origins(self.components)
        terms = self.key_terms if side == "key" else self.query_terms
        out = np.zeros((terms.shape[0], len(labels)))
        np.add.at(out.T, index, terms.T)
        return labels, out


def _origins(components: tuple[str, ...]) -> tuple[tuple[str, ...], np.ndarray]:
    labels = tuple(dict.fromkeys(origin(c) for c in components))
    return labels, np.array([labels.index(origin(c)) for c in components])


def _side(lm: LoadedModel, tr: Source, layer: int, side: SideMap, head: int, rows: torch.Tensor):
    """(names, images (rows, parts, d_head)) of every part, the side's constant folded into ``bias``."""
    names: list[str] = []
    images = []
    for chunk_names, chunk in parts(lm, tr, layer, rows):
        img = side.linear(chunk, rows, head)
        if chunk_names == ("bias",):
            img = img + side.constant(rows, head)[:, None]
        names += chunk_names
        images.append(img)
    return tuple(names), torch.cat(images, 1)


def _checked(lm: LoadedModel, text: str | list[int] | Source, layer: int, head: int, chat: bool):
    tr = text if isinstance(text, Trace | MixedTrace) else source(lm, text, chat=chat)
    if not 0 <= layer < tr.n_layers:
        raise AttnvizError(f"layer {layer} is out of range: this model has layers 0..{tr.n_layers - 1}")
    if not 0 <= head < tr.n_heads:
        raise AttnvizError(f"head {head} is out of range: layer {layer} has heads 0..{tr.n_heads - 1}")
    if isinstance(tr, Trace) and tr.heads_problem:
        raise AttnvizError(f"no per-head parts: {tr.heads_problem}")
    cap = tr.captured[layer]
    kv = kv_heads_of([head], int(cap.query.shape[1]), int(cap.key.shape[1]))[0]
    return tr, cap, kv


def _notes(cap: Any, tr: Source) -> tuple[str, ...]:
    notes = list(tr.notes)
    if cap.softcap:
        notes.append(
            f"This layer soft-caps its scores (c·tanh(s/c), c = {cap.softcap:g}); the cap acts on the "
            "whole sum, so the split is of the pre-cap score s."
        )
    if cap.sinks is not None:
        notes.append(
            "This layer has learned sinks: a sink's logit joins the softmax's denominator but is no "
            "pair of tokens, so it is in no score and left out of the split."
        )
    return tuple(notes)


def _bias_rows(cap: Any, head: int, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the bias the model adds to query i's scores, visible) over every key, float32 CPU."""
    n_k = cap.key.shape[2]
    add = torch.zeros(n_k)
    if cap.position_bias is not None:
        pb = cap.position_bias[0]
        add += pb[min(head, pb.shape[0] - 1), min(i, pb.shape[1] - 1)].float().cpu()
    visible = (
        torch.arange(n_k) <= i if cap.is_causal and cap.mask is None else torch.ones(n_k, dtype=torch.bool)
    )
    if cap.mask is not None:
        m = cap.mask[0, min(head, cap.mask.shape[1] - 1), i].cpu()
        if m.dtype == torch.bool:
            visible = m
        else:
            visible = m > torch.finfo(m.dtype).min / 2
            add += torch.where(visible, m.float(), torch.zeros_like(add))
    return add, visible


def _own_scores(cap: Any, head: int, kv: int, i: int) -> torch.Tensor:
    """scaling · q(i) · k(j) from the captured tensors (the model's own), float32 (keys,)."""
    return (cap.key[0, kv].float() @ cap.query[0, head, i].float()).cpu() * cap.scaling


def qk_attribution(
    lm: LoadedModel,
    text: str | list[int] | Source,
    *,
    layer: int,
    head: int,
    query: int = -1,
    key: int | None = None,
    chat: bool = False,
) -> QKAttribution:
    """Split ``head``'s score at ``layer`` for (``query``, ``key``) (default key: the one it attends
    to most) into T[query part, key part] (see the module doc). ``text``: a string, token ids or a
    `Trace` (reused, no new forward)."""
    tr, cap, kv = _checked(lm, text, layer, head, chat)
    i = tr.position(query)
    j = int(tr.probs(layer, i)[head].argmax()) if key is None else tr.position(key)
    add, visible = _bias_rows(cap, head, i)
    if not visible[j]:
        raise AttnvizError(
            f"query {i} does not see key {j} at layer {layer} (masked): there is no score to split"
        )
    qmap, kmap = layer_maps(lm, tr, layer)
    with torch.inference_mode():
        names, q_img = _side(lm, tr, layer, qmap, head, torch.tensor([i]))
        _, k_img = _side(lm, tr, layer, kmap, kv, torch.tensor([j]))
        terms = cap.scaling * (q_img[0].double() @ k_img[0].double().T)
        score = float(_own_scores(cap, head, kv, i)[j]) + float(add[j])
        bands = band_split(qmap, q_img[0], k_img[0], cap.scaling)
    return QKAttribution(
        **_head_fields(tr, cap, layer, head, kv, i, names),
        key=j,
        terms=terms.numpy(),
        position_bias=float(add[j]),
        score=score,
        bands=bands,
    )


def qk_row(
    lm: LoadedModel,
    text: str | list[int] | Source,
    *,
    layer: int,
    head: int,
    query: int = -1,
    chat: bool = False,
) -> QKRow:
    """``query``'s scores over every key it sees, split on the key side (the whole query with each
    key part) and on the query side (each query part with the whole key)."""
    tr, cap, kv = _checked(lm, text, layer, head, chat)
    i = tr.position(query)
    add, visible = _bias_rows(cap, head, i)
    keys = torch.nonzero(visible).flatten()
    qmap, kmap = layer_maps(lm, tr, layer)
    with torch.inference_mode():
        names, q_img = _side(lm, tr, layer, qmap, head, torch.tensor([i]))
        q_img = q_img[0].double()  # (parts, d_head)
        q_whole = q_img.sum(0)
        key_cols, k_whole = [], torch.zeros(len(keys), q_img.shape[-1], dtype=torch.float64)
        for chunk_names, chunk in parts(lm, tr, layer, keys):  # one layer of origin at a time
            img = kmap.linear(chunk, keys, kv).double()  # (keys, parts, d_head)
            if chunk_names == ("bias",):
                img = img + kmap.constant(keys, kv).double()[:, None]
            key_cols.append(cap.scaling * (img @ q_whole))
            k_whole += img.sum(1)
        key_terms = torch.cat(key_cols, 1)
        query_terms = cap.scaling * (k_whole @ q_img.T)
        scores = _own_scores(cap, head, kv, i)[keys] + add[keys]
    return QKRow(
        **_head_fields(tr, cap, layer, head, kv, i, names),
        keys=keys.numpy(),
        key_terms=key_terms.numpy(),
        query_terms=query_terms.numpy(),
        position_bias=add[keys].double().numpy(),
        scores=scores.double().numpy(),
    )


def _head_fields(
    tr: Source, cap: Any, layer: int, head: int, kv: int, query: int, names: tuple[str, ...]
) -> dict[str, Any]:
    """The fields `QKAttribution` and `QKRow` share: which head, which query, its parts, the
    soft-cap and the notes."""
    return {
        "model_name": tr.model_name,
        "tokens": tr.tokens,
        "layer": layer,
        "block": block_of(tr, layer),
        "head": head,
        "kv_head": kv,
        "query": query,
        "components": names,
        "softcap": cap.softcap,
        "notes": _notes(cap, tr),
    }
