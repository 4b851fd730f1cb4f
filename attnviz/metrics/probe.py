"""The induction probe: random tokens repeated twice, run from token ids (no lossy re-tokenizing).

`head_induction` scores every head on it: fast (a gather p_ij = exp(s_ij - L_i) with the
log-sum-exp) where the layer's scores are standard, the dense definition otherwise.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from ..errors import AttnvizError
from ..exact.lse import captured, layer_spec
from ..extract import extract_ids
from ..layout import Stack
from ..loading import LoadedModel
from ..result import AttentionResult
from .definitions import _induction_sums
from .fast import induction_sums


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


def head_induction(probe: InductionProbe, *, stack: Stack | None = None, dense: bool = False) -> np.ndarray:
    """Induction score of every (layer, head) on the probe: float64 (layer, head).

    Only the query rows of the second copy are computed; ``dense`` forces the dense definition.
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
        cap = captured(res, stack, layer)
        spec, _ = layer_spec(cap, res.layout, layer, stack)
        if spec is not None and cap is not None and not dense:
            num, den = induction_sums(cap, spec, rows, probe.length, start)
        else:
            probs = res.layer_tensor(layer, rows=rows, stack=stack)  # (head, second copy, key_pos)
            num, den = _induction_sums(probs, rows.start, probe.length, start)
        out[layer] = (num / den.clamp(min=1)).cpu().double().numpy()
    return out
