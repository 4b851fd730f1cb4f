"""The dense definitions of the per-head statistics: the test oracle of the fast computation.

Each statistic is defined here on a probability tensor (..., query_pos, key_pos): normalised
entropy, sink mass, previous-token score, diagonal (self) score, mean attention distance, GQA
group coherence and the induction score. `attnviz.metrics.fast` computes the same numbers from
the fused kernels' log-sum-exp without an N×N tensor; tests hold the two equal.

Row conventions (the same for every metric): a query row that has a single allowed key (row 0
of causal attention) is forced, not chosen, and is left out of every mean; the "row length" of
entropy is the number of keys the mask allows (query_pos + 1 for causal rows, capped by a
sliding window). A head with no eligible row scores 0.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np
import torch

from ..errors import AttnvizError
from ..layout import by_kv_group
from ..tokens import previous_occurrences  # noqa: F401  (the one definition; M.definitions.* reads it)

log = logging.getLogger(__name__)

Metric = Literal["entropy", "sink", "previous_token", "diagonal", "distance", "induction", "gqa_coherence"]
METRICS: tuple[str, ...] = get_args(Metric)
ROW_METRICS = ("entropy", "sink", "previous_token", "diagonal", "distance")


# ---------------------------------------------------------------------------------------------
# Row-level core: sums over the query rows of one chunk
# ---------------------------------------------------------------------------------------------


def key_counts(
    query_pos: torch.Tensor, n_keys: int, *, causal: bool, window: int | None = None
) -> torch.Tensor:
    """Allowed keys per query row (int64, same shape as ``query_pos``).

    Causal rows allow keys 0..query_pos; a sliding window of W keeps the last W of them
    (transformers' convention: key_pos > query_pos - W).
    """
    counts = torch.full_like(query_pos, n_keys)
    if causal:
        counts = torch.minimum(counts, query_pos + 1)
    if window is not None:
        counts = counts.clamp(max=int(window))
    return counts


def _gather(probs: torch.Tensor, key_idx: torch.Tensor) -> torch.Tensor:
    """probs[..., r, key_idx[r]] -> (..., rows); key_idx must be in range."""
    idx = key_idx.view(-1, 1).expand(*probs.shape[:-1], 1)
    return probs.gather(-1, idx).squeeze(-1)


def _row_sums(
    probs: torch.Tensor,
    q0: int,
    counts: torch.Tensor,
    *,
    which: Sequence[str] = ROW_METRICS,
    group_size: int | None = None,
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per-metric (sum over eligible rows, number of eligible rows) for one chunk of rows.

    probs (..., head, query_pos, key_pos) float32; ``q0`` the absolute position of the first
    row; ``counts`` allowed keys per row, shaped to broadcast against (..., head, query_pos)
    (e.g. (query_pos,) or (layer, 1, query_pos)). Sums have shape (..., head) — (..., kv_head)
    for "gqa_coherence" — and counts broadcast against them.
    """
    n_rows, n_keys = probs.shape[-2:]
    dev = probs.device
    qpos = torch.arange(q0, q0 + n_rows, device=dev)  # (query_pos,)
    informative = counts >= 2  # (..., query_pos) broadcastable
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def reduce(values: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        valid = valid.to(values.dtype)
        return (values * valid).sum(-1), valid.sum(-1)

    if "entropy" in which:
        raw_entropy = -torch.special.xlogy(probs, probs).sum(-1)  # (..., head, query_pos)
        log_len = torch.log(counts.clamp(min=2).to(probs.dtype))
        out["entropy"] = reduce((raw_entropy / log_len).clamp(0.0, 1.0), informative)
    if "sink" in which:
        out["sink"] = reduce(probs[..., 0], informative)
    if "previous_token" in which:
        ok = informative & (qpos >= 1) & (qpos - 1 < n_keys)
        out["previous_token"] = reduce(_gather(probs, (qpos - 1).clamp(0, n_keys - 1)), ok)
    if "diagonal" in which:
        ok = informative & (qpos < n_keys)
        out["diagonal"] = reduce(_gather(probs, qpos.clamp(max=n_keys - 1)), ok)
    if "distance" in which:
        dist = (qpos[:, None] - torch.arange(n_keys, device=dev)[None, :]).abs().to(probs.dtype)
        out["distance"] = reduce((probs * dist).sum(-1), informative)
    if "gqa_coherence" in which and group_size and group_size > 1:
        out["gqa_coherence"] = _coherence_sums(probs, informative, group_size)
    return out


def _coherence_sums(
    probs: torch.Tensor, informative: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum over rows and head pairs of exp(-(KL(a||b) + KL(b||a)) / 2) in each KV group: (..., kv_head).

    Identical heads give 1, heads on disjoint keys 0. Defined through cross-entropies, which
    the fast path gets exactly from the log-sum-exp (KL(a||b) = CE(a, b) - H(a)).
    """
    grouped = by_kv_group(probs, group_size, dim=-3)  # (..., kv_head, group, query_pos, key_pos)
    *lead, n_kv = grouped.shape[:-3]
    neg_ent = torch.special.xlogy(grouped, grouped).sum(-1)  # (..., kv_head, group, query_pos)
    valid = informative.to(probs.dtype)  # (query_pos,) or (..., 1, query_pos): fits (..., kv_head, query_pos)
    total = probs.new_zeros((*lead, n_kv))
    pairs = list(itertools.combinations(range(group_size), 2))
    for a, b in pairs:
        pa, pb = grouped[..., a, :, :], grouped[..., b, :, :]
        kl_ab = neg_ent[..., a, :] - torch.special.xlogy(pa, pb).sum(-1)  # inf where pb = 0 < pa
        kl_ba = neg_ent[..., b, :] - torch.special.xlogy(pb, pa).sum(-1)
        similarity = torch.exp(-0.5 * (kl_ab + kl_ba).clamp(min=0.0))  # (..., kv_head, query_pos)
        total = total + (similarity * valid).sum(-1)
    rows = valid.sum(-1) * len(pairs)
    return total, rows


# ---------------------------------------------------------------------------------------------
# Pure functions on one probability tensor (hand-made patterns, one layer, one head)
# ---------------------------------------------------------------------------------------------


def _as_tensor(probs: np.ndarray | torch.Tensor) -> torch.Tensor:
    t = probs if isinstance(probs, torch.Tensor) else torch.as_tensor(np.asarray(probs))
    return t.float()


def looks_causal(probs: torch.Tensor) -> bool:
    """True when the pattern is square and nothing above the diagonal has any probability."""
    n_q, n_k = probs.shape[-2:]
    return n_q == n_k and n_q > 1 and bool((torch.triu(probs, diagonal=1) == 0).all())


def _means(
    probs: np.ndarray | torch.Tensor,
    which: Sequence[str],
    *,
    causal: bool | None,
    window: int | None,
    group_size: int | None = None,
) -> dict[str, np.ndarray]:
    p = _as_tensor(probs)
    if p.dim() < 2:
        raise AttnvizError("probabilities must have shape (..., query_pos, key_pos)")
    if causal is None:
        causal = looks_causal(p)
    qpos = torch.arange(p.shape[-2], device=p.device)
    counts = key_counts(qpos, p.shape[-1], causal=causal, window=window)
    sums = _row_sums(p, 0, counts, which=which, group_size=group_size)
    return {k: (s / n.clamp(min=1)).cpu().double().numpy() for k, (s, n) in sums.items()}


def entropy(probs, *, causal: bool | None = None, window: int | None = None) -> np.ndarray:
    """Mean over query rows of H(row) / log(allowed keys): 0 = one key, 1 = uniform.

    probs (..., query_pos, key_pos) -> (...). ``causal=None`` infers causality from an all-zero
    upper triangle. Rows with a single allowed key are left out.
    """
    return _means(probs, ["entropy"], causal=causal, window=window)["entropy"]


def sink_mass(probs, *, causal: bool | None = None, window: int | None = None) -> np.ndarray:
    """Mean attention on key_pos 0 (the first token: BOS / [CLS] / attention sink)."""
    return _means(probs, ["sink"], causal=causal, window=window)["sink"]


def previous_token_score(probs, *, causal: bool | None = None) -> np.ndarray:
    """Mean of P[query_pos, query_pos - 1] over query_pos >= 1."""
    return _means(probs, ["previous_token"], causal=causal, window=None)["previous_token"]


def diagonal_score(probs, *, causal: bool | None = None) -> np.ndarray:
    """Mean of P[query_pos, query_pos]: attention of each token to itself."""
    return _means(probs, ["diagonal"], causal=causal, window=None)["diagonal"]


def mean_distance(probs, *, causal: bool | None = None) -> np.ndarray:
    """Mean over rows of sum_key P[query_pos, key_pos] * |query_pos - key_pos|, in tokens."""
    return _means(probs, ["distance"], causal=causal, window=None)["distance"]


def group_coherence(probs, group_size: int, *, causal: bool | None = None) -> np.ndarray:
    """How alike the query heads sharing one KV head attend: (..., head, q, k) -> (..., kv_head).

    Mean over rows and over head pairs (a, b) in a group of exp(-(KL(a||b) + KL(b||a)) / 2), so
    identical heads give 1 and heads on disjoint keys give 0. ``group_size`` query heads per KV head, in
    transformers' order (head h reads KV head h // group_size).
    """
    p = _as_tensor(probs)
    if group_size < 2 or p.shape[-3] % group_size:
        raise AttnvizError(f"group_size must be >= 2 and divide the {p.shape[-3]} heads")
    return _means(p, ["gqa_coherence"], causal=causal, window=None, group_size=group_size)["gqa_coherence"]


def _induction_sums(
    probs: torch.Tensor, q0: int, length: int, start: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of P[i, i - length + 1] over rows i of the second copy, and their number."""
    n_rows, n_keys = probs.shape[-2:]
    qpos = torch.arange(q0, q0 + n_rows, device=probs.device)
    ok = (qpos >= start + length) & (qpos < start + 2 * length) & (qpos - length + 1 < n_keys)
    vals = _gather(probs, (qpos - length + 1).clamp(0, n_keys - 1))
    okf = ok.to(probs.dtype)
    return (vals * okf).sum(-1), okf.sum()


def induction_score(probs, length: int, *, start: int = 0) -> np.ndarray:
    """Mean attention from each token of the second copy to the token after its first occurrence.

    For a sequence whose positions start..start+length-1 are repeated at start+length..,
    query_pos i of the second copy scores P[i, i - length + 1]: `previous_occurrences` with
    offset 1 on such a sequence, by index (a copy that repeats a token, drawn from a vocabulary
    smaller than the copy, keeps i - length + 1). (..., query_pos, key_pos) -> (...).
    """
    p = _as_tensor(probs)
    if length < 1 or p.shape[-2] <= start + length:
        raise AttnvizError(f"no second copy: {p.shape[-2]} query rows, start {start}, length {length}")
    s, n = _induction_sums(p, 0, length, start)
    return (s / n.clamp(min=1)).cpu().double().numpy()
