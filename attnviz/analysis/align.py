"""Compare attention across two texts or two models without comparing unrelated positions.

Two texts: tokens are aligned first (difflib's longest matching blocks over token ids, or over
normalised token text when the tokenizers differ), and heads are diffed on the aligned
positions only: the weight query a_i puts on key a_j against the weight b_i puts on b_j, for
every aligned pair of queries and keys. Weights on unaligned keys are left out (rows are not
renormalised: a diff is a difference of the model's own weights).

Two models with different layer/head counts: compared by a matched statistic instead of by
shape: per-layer profiles of a head statistic on a relative depth axis (0 = first layer,
1 = last), and pattern similarity of every head of one model with every head of the other on
the aligned positions of the same text.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from ..errors import AttnvizError
from ..layout import Stack
from ..result import AttentionResult
from ..tokens import Tokens

AlignBy = Literal["ids", "text"]
ALIGN_BY: tuple[str, ...] = get_args(AlignBy)
SIMILARITY_MAX_SIDE = 64  # aligned positions pooled to at most this many per side for similarity


@dataclass(frozen=True)
class Alignment:
    """Matched positions of two token sequences, in order: ``a[k]`` aligns with ``b[k]``."""

    a: tuple[int, ...]
    b: tuple[int, ...]
    n_a: int
    n_b: int
    by: AlignBy

    def __len__(self) -> int:
        return len(self.a)

    @property
    def coverage(self) -> float:
        """Aligned share of the longer sequence (1.0: same tokens)."""
        return len(self.a) / max(1, self.n_a, self.n_b)

    def pairs(self) -> list[tuple[int, int]]:
        return list(zip(self.a, self.b, strict=True))


def _norm(text: str) -> str:
    return text.strip().lower()


def align_tokens(a: Tokens, b: Tokens, *, by: AlignBy | None = None) -> Alignment:
    """Align two token sequences by their matching blocks.

    ``by="ids"`` (same tokenizer) compares token ids; ``by="text"`` compares display text,
    stripped and lower-cased (two tokenizers: a word split the same way aligns, a word split
    differently does not). Default: ids when both sequences come from the same vocabulary size
    and share at least one id sequence block, else text.
    """
    if by is None:
        by_ids = _align(list(a.ids), list(b.ids))
        by_text = _align([_norm(t) for t in a.display], [_norm(t) for t in b.display])
        by = "ids" if len(by_ids[0]) >= len(by_text[0]) else "text"
        pa, pb = by_ids if by == "ids" else by_text
    elif by == "ids":
        pa, pb = _align(list(a.ids), list(b.ids))
    elif by == "text":
        pa, pb = _align([_norm(t) for t in a.display], [_norm(t) for t in b.display])
    else:
        raise AttnvizError(f"unknown alignment {by!r}; use one of {ALIGN_BY}")
    return Alignment(a=tuple(pa), b=tuple(pb), n_a=len(a), n_b=len(b), by=by)


def _align(x: Sequence, y: Sequence) -> tuple[list[int], list[int]]:
    sm = difflib.SequenceMatcher(a=x, b=y, autojunk=False)
    pa: list[int] = []
    pb: list[int] = []
    for block in sm.get_matching_blocks():
        pa.extend(range(block.a, block.a + block.size))
        pb.extend(range(block.b, block.b + block.size))
    return pa, pb


def aligned(probs: np.ndarray, positions: Sequence[int]) -> np.ndarray:
    """(..., q, k) -> (..., m, m): the weights between aligned positions only."""
    idx = np.asarray(positions, dtype=np.int64)
    return np.asarray(probs)[..., idx[:, None], idx[None, :]]


def aligned_diff(probs_a: np.ndarray, probs_b: np.ndarray, al: Alignment) -> np.ndarray:
    """A − B on aligned positions: (..., m, m) float32; row/column k is the pair ``al.pairs()[k]``."""
    return (aligned(probs_a, al.a) - aligned(probs_b, al.b)).astype(np.float32)


def head_changes(
    res_a: AttentionResult, res_b: AttentionResult, al: Alignment, *, stack: Stack | None = None
) -> np.ndarray:
    """Mean |A − B| over aligned (query, key) pairs for every (layer, head): float64 (layers, heads).

    Both results must come from models with the same layer and head counts (two texts, one
    model); for two different models use `layer_profiles` / `head_similarity`.
    """
    if (res_a.n_layers(stack), res_a.n_heads) != (res_b.n_layers(stack), res_b.n_heads):
        raise AttnvizError(
            "the two results have different layer/head counts; compare two models with "
            "layer_profiles or head_similarity instead"
        )
    if len(al) == 0:
        raise AttnvizError("the two texts share no tokens; nothing to compare position by position")
    out = np.zeros((res_a.n_layers(stack), res_a.n_heads))
    for layer in range(out.shape[0]):
        d = aligned_diff(res_a.layer(layer, stack=stack), res_b.layer(layer, stack=stack), al)
        out[layer] = np.abs(d).mean(axis=(-2, -1))
    return out


def relative_depth(n_layers: int) -> np.ndarray:
    """0 for the first layer, 1 for the last (0.5 for a single layer)."""
    return np.linspace(0.0, 1.0, n_layers) if n_layers > 1 else np.array([0.5])


def layer_profiles(
    values_a: np.ndarray, values_b: np.ndarray, *, points: int = 21
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-layer head means of one statistic for two models, resampled on a shared relative
    depth axis: (depth (points,), profile_a (points,), profile_b (points,)); linear interpolation
    between layers, so a 30-layer and a 6-layer model compare at the same fractions of depth."""
    a, b = np.asarray(values_a, dtype=np.float64), np.asarray(values_b, dtype=np.float64)
    depth = np.linspace(0.0, 1.0, points)
    pa = np.interp(depth, relative_depth(a.shape[0]), a.mean(axis=1))
    pb = np.interp(depth, relative_depth(b.shape[0]), b.mean(axis=1))
    return depth, pa, pb


def _pooled_patterns(res: AttentionResult, positions: Sequence[int], stack: Stack | None) -> np.ndarray:
    """Every head's pattern on the aligned positions, mean-pooled to <= SIMILARITY_MAX_SIDE per
    side and centred per head: float64 (layers * heads, cells)."""
    m = len(positions)
    bins = max(1, min(m, SIMILARITY_MAX_SIDE))
    edges = np.unique(np.floor(np.arange(bins) * (m / bins))).astype(np.int64)
    counts = np.diff(np.append(edges, m))
    rows = []
    for layer in range(res.n_layers(stack)):
        p = aligned(res.layer(layer, stack=stack), positions).astype(np.float64)  # (h, m, m)
        p = np.add.reduceat(np.add.reduceat(p, edges, axis=-2), edges, axis=-1)
        p /= counts[:, None] * counts[None, :]
        rows.append(p.reshape(p.shape[0], -1))
    flat = np.concatenate(rows)
    return flat - flat.mean(axis=1, keepdims=True)


def head_similarity(
    res_a: AttentionResult, res_b: AttentionResult, al: Alignment, *, stack: Stack | None = None
) -> np.ndarray:
    """Pearson correlation of every head of A with every head of B on the aligned positions of
    the same text: float64 (layers_a, heads_a, layers_b, heads_b), in [-1, 1] (0 for a constant
    pattern). The models may have any layer and head counts."""
    if len(al) < 2:
        raise AttnvizError("fewer than 2 aligned tokens; pattern similarity needs a longer shared text")
    fa = _pooled_patterns(res_a, al.a, stack)
    fb = _pooled_patterns(res_b, al.b, stack)
    na, nb = np.linalg.norm(fa, axis=1), np.linalg.norm(fb, axis=1)
    sim = (fa @ fb.T) / np.maximum(na[:, None] * nb[None, :], 1e-12)
    sim[(na[:, None] == 0) | (nb[None, :] == 0)] = 0.0
    return sim.reshape(res_a.n_layers(stack), res_a.n_heads, res_b.n_layers(stack), res_b.n_heads)


def best_matches(sim: np.ndarray) -> list[tuple[int, int, int, int, float]]:
    """For every head (layer, head) of A, its most similar head of B: (la, ha, lb, hb, r)."""
    la, ha, lb, hb = sim.shape
    flat = sim.reshape(la * ha, lb * hb)
    best = flat.argmax(axis=1)
    return [
        (i // ha, i % ha, int(best[i]) // hb, int(best[i]) % hb, float(flat[i, best[i]]))
        for i in range(la * ha)
    ]
