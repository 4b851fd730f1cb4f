"""Head search: which heads attend from this token to that one, and which attend to the previous
occurrence of the current token, across every layer, from an extracted result.

    res = attnviz.extract(lm, text)
    attnviz.explain.search_heads(res, query=12, key=4).ranking(5)   # (layer, head, α) best first
    attnviz.explain.previous_occurrence_heads(res).ranking(5)
    attnviz.explain.search_mixer_heads(res, 12, 4, by="signed A").ranking(5)  # hybrids, SSMs

Every α is exact, the model's own probability (`AttentionResult.layer_tensor` with ``rows``: on the
fast path one query row per head computed from the captured Q and K, never the full maps; the
eager path slices the maps it already holds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import AttnvizError
from ..layout import Stack
from ..result import AttentionResult
from ..tokens import Tokens, previous_occurrences

ROW_SPAN = 64  # query rows computed together at most (previous-occurrence search)
__all__ = [
    "CONTRIBUTION",
    "SIGNED",
    "HeadScores",
    "MixerHeadScores",
    "previous_occurrence_heads",
    "previous_occurrences",
    "search_heads",
    "search_mixer_heads",
]


@dataclass(frozen=True)
class HeadScores:
    """One number per (layer, head): float64 (layers, heads), with what it measures."""

    model_name: str
    tokens: Tokens
    what: str  # e.g. "α from query 12 'bank' to key 4 'bank'"
    scores: np.ndarray  # (layers, heads)
    query: int = -1  # the query position (-1: many, see ``rows``)
    key: int = -1
    rows: tuple[tuple[int, int], ...] = ()  # (query, key) pairs averaged, previous-occurrence search

    def ranking(self, top: int | None = None) -> list[tuple[int, int, float]]:
        """(layer, head, score), largest first."""
        order = np.argsort(-self.scores, axis=None, kind="stable")
        n_heads = self.scores.shape[1]
        out = [(int(i // n_heads), int(i % n_heads), float(self.scores.flat[i])) for i in order]
        return out if top is None else out[:top]

    def to_frame(self) -> Any:
        import pandas as pd

        return pd.DataFrame(self.ranking(), columns=["layer", "head", "score"])


def _position(res: AttentionResult, i: int, what: str) -> int:
    n = res.n_tokens
    if not -n <= int(i) < n:
        raise AttnvizError(f"{what} {i} is out of range: this text has tokens 0..{n - 1}")
    return int(i) % n


def search_heads(res: AttentionResult, query: int, key: int, *, stack: Stack | None = None) -> HeadScores:
    """Every head of every layer scored by its exact α from ``query`` to ``key`` (positions;
    negative counts from the end): one query row per layer."""
    q, k = _position(res, query, "query"), _position(res, key, "key")
    if k > q and res.layout.kind != "encoder":
        raise AttnvizError(f"key {k} comes after query {q}: a causal model's query never sees a later key")
    n_layers = res.n_layers(stack)
    scores = np.zeros((n_layers, res.n_heads))
    for layer in range(n_layers):
        row = res.layer_tensor(layer, rows=slice(q, q + 1), stack=stack)  # (heads, 1, keys)
        scores[layer] = row[:, 0, k].double().cpu().numpy()
    shown = res.tokens.display
    return HeadScores(
        model_name=res.model_name,
        tokens=res.tokens,
        what=f"α from query {q} {shown[q]!r} to key {k} {shown[k]!r}",
        scores=scores,
        query=q,
        key=k,
    )


def previous_occurrence_heads(
    res: AttentionResult, *, offset: int = 0, stack: Stack | None = None
) -> HeadScores:
    """Every head scored by its mean exact α from each token to the previous occurrence of the
    same token (``offset=1``: to the token after that occurrence, induction heads), over every
    position whose token occurred before (`attnviz.tokens.previous_occurrences`, the
    one definition). Rows are computed at most ``ROW_SPAN`` at a time."""
    pairs = previous_occurrences(list(res.tokens.ids), offset)
    if not pairs:
        raise AttnvizError("no token of this text occurs twice; use a text that repeats some tokens")
    n_layers = res.n_layers(stack)
    scores = np.zeros((n_layers, res.n_heads))
    chunks: list[list[tuple[int, int]]] = [[]]
    for p in pairs:
        if chunks[-1] and p[0] - chunks[-1][0][0] >= ROW_SPAN:
            chunks.append([])
        chunks[-1].append(p)
    for layer in range(n_layers):
        total = np.zeros(res.n_heads)
        for chunk in chunks:
            first = chunk[0][0]
            rows = res.layer_tensor(
                layer, rows=slice(first, chunk[-1][0] + 1), stack=stack
            )  # (heads, r, keys)
            for t, j in chunk:
                total += rows[:, t - first, j].double().cpu().numpy()
        scores[layer] = total / len(pairs)
    target = "the previous occurrence of the current token" + (" + 1" if offset else "")
    return HeadScores(
        model_name=res.model_name,
        tokens=res.tokens,
        what=f"mean α to {target} over {len(pairs)} positions",
        scores=scores,
        rows=tuple(pairs),
    )


SIGNED = "signed A"
CONTRIBUTION = "contribution size"


@dataclass(frozen=True)
class MixerHeadScores:
    """One number per head of every token mixer (softmax and non-softmax) from ``query`` to
    ``key``, with which measure it is (``by``): ``"signed A"`` (a mixer's exact effective
    attention, signed and not a probability; a softmax head's α) or ``"contribution size"``
    (‖c_{t,s}‖: how much token ``key`` adds to the mixer's output at ``query`` through its output
    projection, gates and norms frozen at their forward values). ``heads[i]`` is (block, mixer,
    head) for ``scores[i]``; ``skipped`` names the mixers not scored and why."""

    model_name: str
    tokens: Tokens
    by: str  # SIGNED or CONTRIBUTION
    what: str
    heads: tuple[tuple[int, str, int], ...]
    scores: np.ndarray  # (len(heads),) float64
    query: int
    key: int
    skipped: tuple[str, ...] = ()

    def ranking(self, top: int | None = None) -> list[tuple[int, str, int, float]]:
        """(block, mixer, head, score): signed A by |A| (its sign kept), contribution size by
        size, largest first."""
        order = np.argsort(-np.abs(self.scores), kind="stable")
        out = [(*self.heads[i], float(self.scores[i])) for i in order]
        return out if top is None else out[:top]

    def to_frame(self) -> Any:
        import pandas as pd

        return pd.DataFrame(self.ranking(), columns=["block", "mixer", "head", self.by])


def search_mixer_heads(res: AttentionResult, query: int, key: int, *, by: str = SIGNED) -> MixerHeadScores:
    """Every head of every block's token mixers scored from ``query`` to ``key`` (positions;
    negative counts from the end) by ``by``: ``"signed A"`` or ``"contribution size"`` (see
    `MixerHeadScores`). One query row per mixer; a mixer the measure does not apply to is named
    in ``skipped`` with the reason (a per-channel mixer has no signed A, only contribution sizes;
    a softmax head's contribution size is not computed here: its α · ‖W_O v‖ is the Explorer's
    value-weighted view)."""
    from ..mixers import MIXERS

    if by not in (SIGNED, CONTRIBUTION):
        raise AttnvizError(f"by must be {SIGNED!r} or {CONTRIBUTION!r}, not {by!r}")
    q, k = _position(res, query, "query"), _position(res, key, "key")
    if k > q and res.layout.kind != "encoder":
        raise AttnvizError(f"key {k} comes after query {q}: a causal model's query never sees a later key")
    rows = slice(q, q + 1)
    heads: list[tuple[int, str, int]] = []
    scores: list[float] = []
    skipped: list[str] = []
    for block, kinds in enumerate(res.layout.mixers):
        for kind in kinds:
            per_head = kind == "attention" or MIXERS[kind].per_head
            if by == SIGNED and not per_head:
                skipped.append(f"block {block}'s {kind}: mixes per channel, no signed A per head")
                continue
            if by == CONTRIBUTION and kind == "attention":
                skipped.append(f"block {block}'s attention: softmax heads are scored by signed A (α)")
                continue
            if by == SIGNED:
                row = res.mixer_tensor(block, rows=rows, mixer=kind)  # (heads, 1, keys)
            else:
                row = torch.as_tensor(res.mixer_contributions(block, kind, rows=rows))
            for h in range(row.shape[0]):
                heads.append((block, kind, h))
                scores.append(float(row[h, 0, k]))
    if not heads:
        raise AttnvizError(f"no mixer of this model has a {by} per head: {'; '.join(skipped)}")
    shown = res.tokens.display
    return MixerHeadScores(
        model_name=res.model_name,
        tokens=res.tokens,
        by=by,
        what=f"{by} from query {q} {shown[q]!r} to key {k} {shown[k]!r}",
        heads=tuple(heads),
        scores=np.asarray(scores, dtype=np.float64),
        query=q,
        key=k,
        skipped=tuple(skipped),
    )
