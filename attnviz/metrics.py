"""Per-head summary numbers computed from attention probabilities.

For every (layer, head): normalised entropy, sink mass, previous-token score, diagonal (self)
score, mean attention distance, and optionally the induction score (on a repeated random-token
probe) and GQA group coherence. Everything runs in torch on the device of the probabilities,
one batch of layers and one chunk of query rows at a time, so the full
(layer, head, query_pos, key_pos) stack is never held.

Row conventions (the same for every metric): a query row that has a single allowed key (row 0
of causal attention) is forced, not chosen, and is left out of every mean; the "row length" of
entropy is the number of keys the mask allows (query_pos + 1 for causal rows, capped by a
sliding window). A head with no eligible row scores 0.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import torch

from .errors import AttnvizError
from .extract import extract_ids
from .layout import AttentionLayout, Stack
from .loading import LoadedModel
from .result import AttentionResult

log = logging.getLogger(__name__)

Metric = Literal["entropy", "sink", "previous_token", "diagonal", "distance", "induction", "gqa_coherence"]
METRICS: tuple[str, ...] = get_args(Metric)
_ROW_METRICS = ("entropy", "sink", "previous_token", "diagonal", "distance")
# Elements of one (layers, head, query rows, key_pos) chunk; a few temporaries of this size live
# at once (float32: 128 MiB each).
CHUNK_ELEMENTS = 1 << 25
_LN2 = math.log(2.0)


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
    which: Sequence[str] = _ROW_METRICS,
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

    raw_entropy = None
    if "entropy" in which or "gqa_coherence" in which:
        raw_entropy = -torch.special.xlogy(probs, probs).sum(-1)  # (..., head, query_pos)
    if "entropy" in which:
        assert raw_entropy is not None
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
        assert raw_entropy is not None
        out["gqa_coherence"] = _coherence_sums(probs, raw_entropy, informative, group_size)
    return out


def _coherence_sums(
    probs: torch.Tensor, raw_entropy: torch.Tensor, informative: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum over rows and head pairs of 1 - JSD/ln2 within each KV group: (..., kv_head)."""
    *lead, n_heads, n_rows, n_keys = probs.shape
    n_kv = n_heads // group_size
    grouped = probs.reshape(*lead, n_kv, group_size, n_rows, n_keys)
    ent = raw_entropy.reshape(*lead, n_kv, group_size, n_rows)
    valid = informative.to(probs.dtype)  # (query_pos,) or (..., 1, query_pos): fits (..., kv_head, query_pos)
    total = probs.new_zeros((*lead, n_kv))
    pairs = list(itertools.combinations(range(group_size), 2))
    for a, b in pairs:
        mix = 0.5 * (grouped[..., a, :, :] + grouped[..., b, :, :])  # (..., kv_head, query_pos, key_pos)
        jsd = -torch.special.xlogy(mix, mix).sum(-1) - 0.5 * (ent[..., a, :] + ent[..., b, :])
        similarity = (1.0 - jsd / _LN2).clamp(0.0, 1.0)  # (..., kv_head, query_pos)
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

    Mean over rows and over head pairs in a group of 1 - JSD(p, q) / ln 2, so identical heads
    give 1 and heads on disjoint keys give 0. ``group_size`` query heads per KV head, in
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
    query_pos i of the second copy scores P[i, i - length + 1]. (..., q, k) -> (...).
    """
    p = _as_tensor(probs)
    if length < 1 or p.shape[-2] <= start + length:
        raise AttnvizError(f"no second copy: {p.shape[-2]} query rows, start {start}, length {length}")
    s, n = _induction_sums(p, 0, length, start)
    return (s / n.clamp(min=1)).cpu().double().numpy()


# ---------------------------------------------------------------------------------------------
# The induction probe: random tokens repeated twice, run from token ids (no lossy re-tokenizing)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class InductionProbe:
    """The attention of a model on ``random_ids`` repeated twice (plus the tokenizer's specials)."""

    result: AttentionResult
    random_ids: tuple[int, ...]  # one copy; length L
    seed: int

    @property
    def length(self) -> int:
        return len(self.random_ids)


def _special_ends(tokenizer) -> tuple[list[int], list[int]]:
    """The special ids the tokenizer puts before and after ordinary text (BOS, [CLS], [SEP], </s>)."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids = list(tokenizer("a")["input_ids"])
    lead = list(itertools.takewhile(lambda i: i in special, ids))
    trail = list(itertools.takewhile(lambda i: i in special, reversed(ids[len(lead) :])))
    return lead, trail[::-1]


def probe_candidates(lm: LoadedModel) -> np.ndarray:
    """Token ids the probe may draw: in both the tokenizer and the embedding, not special/added."""
    tok = lm.tokenizer
    embedding: torch.nn.Module = lm.model.get_input_embeddings()
    weight: torch.Tensor = embedding.weight  # type: ignore[assignment]
    n_embed = int(weight.shape[0])  # (vocab, d_model)
    n = int(min(len(tok), n_embed))  # type: ignore[arg-type]
    excluded = set(getattr(tok, "all_special_ids", []) or [])
    get_added = getattr(tok, "get_added_vocab", None)
    if callable(get_added):
        excluded |= set(get_added().values())
    keep = np.ones(n, dtype=bool)
    keep[[i for i in excluded if 0 <= i < n]] = False
    return np.flatnonzero(keep)


def induction_probe(
    lm: LoadedModel, *, length: int = 50, seed: int = 0, path: Literal["fast", "eager"] = "fast"
) -> InductionProbe:
    """Run ``lm`` on L random tokens repeated twice: the standard probe for induction heads.

    The ids are drawn (without replacement where the vocabulary allows, so every token of a copy
    is unique) from the model's vocabulary minus special and added tokens, wrapped in the special
    tokens the tokenizer adds to ordinary text, and fed as ids through `extract_ids` — decoding
    random ids to text and re-tokenizing would not give the same ids back.
    """
    if length < 2:
        raise AttnvizError("the induction probe needs length >= 2 tokens per copy")
    candidates = probe_candidates(lm)
    if len(candidates) < 2:
        raise AttnvizError(f"{lm.spec!r} has too few ordinary tokens for an induction probe")
    rng = np.random.default_rng(seed)
    random_ids = rng.choice(candidates, size=length, replace=len(candidates) < length).tolist()
    lead, trail = _special_ends(lm.tokenizer)
    ids = lead + random_ids + random_ids + trail
    result = extract_ids(lm, ids, path=path)
    return InductionProbe(result=result, random_ids=tuple(int(i) for i in random_ids), seed=seed)


def _first_copy(ids: Sequence[int], copy: Sequence[int]) -> int:
    """Position of ``copy`` in ``ids`` (followed by at least one token of the second copy)."""
    n = len(copy)
    for s in range(len(ids) - n):
        if tuple(ids[s : s + n]) == tuple(copy) and ids[s + n] == copy[0]:
            return s
    raise AttnvizError("the probe's random tokens are not in this stack's tokens; use a self-attention stack")


def head_induction(probe: InductionProbe, *, stack: Stack | None = None) -> np.ndarray:
    """Induction score of every (layer, head) on the probe: float64 (layer, head).

    Only the query rows of the second copy are computed.
    """
    res = probe.result
    stack = stack if stack is not None else res.stacks[0]
    if stack == "cross":
        raise AttnvizError("induction is defined on self-attention; pick the encoder or decoder stack")
    q_tokens, _ = res.axes(stack)
    start = _first_copy(q_tokens.ids, probe.random_ids)
    rows = slice(start + probe.length, min(start + 2 * probe.length, len(q_tokens)))
    out = np.zeros((res.n_layers(stack), res.n_heads))
    for layer in range(res.n_layers(stack)):
        probs = res.layer_tensor(layer, rows=rows, stack=stack)  # (head, second copy, key_pos)
        num, den = _induction_sums(probs, rows.start, probe.length, start)
        out[layer] = (num / den.clamp(min=1)).cpu().double().numpy()
    return out


# ---------------------------------------------------------------------------------------------
# Every head of a result
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class HeadMetrics:
    """Per-head metrics of one stack: each array is float64 (layer, head)."""

    stack: Stack
    n_tokens: int  # query positions the metrics were computed over
    group_size: int  # query heads per KV head
    entropy: np.ndarray
    sink: np.ndarray
    previous_token: np.ndarray
    diagonal: np.ndarray
    distance: np.ndarray
    induction: np.ndarray | None = None  # on the induction probe, not on this text
    gqa_coherence: np.ndarray | None = None  # the KV group's coherence, repeated for each head

    @property
    def n_layers(self) -> int:
        return int(self.entropy.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.entropy.shape[1])

    @property
    def metrics(self) -> tuple[str, ...]:
        """Names of the metrics present, in `METRICS` order."""
        return tuple(m for m in METRICS if getattr(self, m) is not None)

    def values(self, metric: Metric) -> np.ndarray:
        got = getattr(self, metric, None) if metric in METRICS else None
        if got is None:
            raise AttnvizError(f"metric {metric!r} was not computed; available: {self.metrics}")
        return got

    def kv_coherence(self) -> np.ndarray | None:
        """GQA coherence per (layer, kv_head), or None without GQA."""
        if self.gqa_coherence is None:
            return None
        return self.gqa_coherence[:, :: self.group_size]

    def top(self, metric: Metric, k: int = 5) -> list[tuple[int, int, float]]:
        """The k highest-scoring heads as (layer, head, value)."""
        vals = self.values(metric)
        order = np.argsort(-vals, axis=None, kind="stable")[:k]
        return [(int(i // self.n_heads), int(i % self.n_heads), float(vals.flat[i])) for i in order]

    def to_rows(self) -> list[dict[str, int | float]]:
        """One dict per head (layer, head, kv_head, then each metric) for a sortable table."""
        names = self.metrics
        return [
            {
                "layer": layer,
                "head": head,
                "kv_head": head // self.group_size,
                **{m: float(self.values(m)[layer, head]) for m in names},  # type: ignore[arg-type]
            }
            for layer in range(self.n_layers)
            for head in range(self.n_heads)
        ]


def mask_of(layout: AttentionLayout, layer: int, stack: Stack) -> tuple[bool, int | None]:
    """(causal, sliding window or None) of one layer, read from the layout."""
    causal = stack == "decoder" or (stack == "self" and layout.kind == "decoder")
    window = None
    if layout.sliding_window and stack != "cross":
        types = layout.layer_types
        if (not types and layout.kind == "decoder") or (
            layer < len(types) and types[layer] == "sliding_attention"
        ):
            window = int(layout.sliding_window)
    return causal, window


def _chunks(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def head_metrics(
    result: AttentionResult,
    *,
    stack: Stack | None = None,
    batch_layers: int | None = None,
    induction: InductionProbe | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> HeadMetrics:
    """Entropy, sink, previous-token, diagonal, distance (and GQA coherence) of every head.

    Layers are fetched with ``result.layer_tensor`` and reduced on the model's device,
    ``batch_layers`` layers at a time (default: as many as fit ``chunk_elements``); a layer too
    big for one chunk is split into query-row chunks. ``induction`` adds each head's score on
    that probe (same model).
    """
    t0 = time.perf_counter()
    stack = stack if stack is not None else result.stacks[0]
    layout = result.layout
    n_layers, n_heads = result.n_layers(stack), result.n_heads
    q_tokens, k_tokens = result.axes(stack)
    n_q, n_k = len(q_tokens), len(k_tokens)
    group = layout.group_size if stack != "cross" and layout.group_size > 1 else None
    per_layer = n_heads * n_q * n_k
    row_size = max(1, min(n_q, chunk_elements // max(1, n_heads * n_k)))
    if batch_layers is None:
        batch_layers = max(1, chunk_elements // max(1, per_layer)) if row_size == n_q else 1
    which = [*_ROW_METRICS, "gqa_coherence"]
    num: dict[str, list[np.ndarray]] = {}
    for batch in _chunks(n_layers, max(1, int(batch_layers))):
        layers = range(batch.start, batch.stop)
        acc: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for rows in _chunks(n_q, row_size):
            parts = [result.layer_tensor(i, rows=rows, stack=stack) for i in layers]
            dev = parts[0].device  # layers may sit on different GPUs (device_map="auto")
            probs = torch.stack([t.to(dev) for t in parts])  # (layer, head, query_pos, key_pos)
            del parts
            qpos = torch.arange(rows.start, rows.stop, device=probs.device)
            counts = torch.stack(
                [
                    key_counts(qpos, n_k, causal=c, window=w)
                    for c, w in (mask_of(layout, i, stack) for i in layers)
                ]
            )[:, None, :]  # (layer, 1, query_pos)
            sums = _row_sums(probs, rows.start, counts, which=which, group_size=group)
            for k, (total, rows_in) in sums.items():
                acc[k] = (total, rows_in) if k not in acc else (acc[k][0] + total, acc[k][1] + rows_in)
        for k, (total, rows_in) in acc.items():
            means = (total / rows_in.clamp(min=1)).cpu().double().numpy()
            if k == "gqa_coherence":
                means = np.repeat(means, layout.group_size, axis=-1)  # (layer, kv_head) -> (layer, head)
            num.setdefault(k, []).append(means)
    arrays = {k: np.concatenate(v) for k, v in num.items()}
    ind = None
    if induction is not None:
        probe_res = induction.result
        if probe_res.layout != layout:
            raise AttnvizError("the induction probe was run on a different model; probe this model")
        ind = head_induction(induction, stack=stack)
    log.info(
        "head_metrics model=%s stack=%s tokens=%d layers=%d seconds=%.3f",
        result.model_name,
        stack,
        n_q,
        n_layers,
        time.perf_counter() - t0,
    )
    return HeadMetrics(
        stack=stack,
        n_tokens=n_q,
        group_size=layout.group_size if stack != "cross" else 1,
        entropy=arrays["entropy"],
        sink=arrays["sink"],
        previous_token=arrays["previous_token"],
        diagonal=arrays["diagonal"],
        distance=arrays["distance"],
        induction=ind,
        gqa_coherence=arrays.get("gqa_coherence"),
    )
