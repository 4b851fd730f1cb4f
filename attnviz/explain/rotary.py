"""Rotary frequency bands: a query-key score split by the rotary pair each part comes from.

RoPE turns each pair of query/key dimensions (a, b) by position × θ_m, so the raw score splits
exactly into one term per pair plus the dimensions left unrotated (partial-rotary models):

    scaling · q_i · k_j = Σ_m scaling (q_i,a k_j,a + q_i,b k_j,b) + scaling Σ_rest q_i,r k_j,r

The pairs follow the model's own convention, read from the cos/sin tables the model passed to
the layer: "half" (dims m and m + rot/2, Llama, NeoX, Qwen ...) or "interleaved" (2m and 2m+1,
GPT-J, Cohere, GLM), θ_m from the table at position 1; partial rotary leaves the dims past
``rot`` unrotated. For one query across all the keys it sees, each band's term is compared with
two counterfactuals built from the un-rotated vectors q̃ = R(−iθ) q, k̃ = R(−jθ) k:

- *content only*: q̃_i · k̃_j, every key as if at the query's position (distance removed);
- *position only*: q̃_i · R((j − i)θ) k̄̃, every key carrying the average key content;

a band whose score changes across keys mostly with distance carries position (high frequency:
previous-token and local heads); one whose score changes mostly with the key's content carries
content (low frequency: wavelengths longer than the text).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from ..errors import AttnvizError
from ..layout import kv_heads_of
from ..loading import LoadedModel
from .residual import Trace, trace

Pairing = Literal["half", "interleaved"]


@dataclass(frozen=True)
class RotarySpec:
    """The rotary pairs of a layer: dims (a, b) and θ (radians per position) of each."""

    pairing: Pairing
    pairs: tuple[tuple[int, int], ...]
    theta: tuple[float, ...]
    rest: tuple[int, ...]  # dims without rotation (partial rotary)
    head_dim: int

    @property
    def wavelengths(self) -> np.ndarray:
        """Tokens per full turn of each pair: 2π / θ."""
        return 2 * math.pi / np.maximum(np.asarray(self.theta, dtype=np.float64), 1e-30)


def spec_from_tables(cos: torch.Tensor, sin: torch.Tensor, head_dim: int) -> RotarySpec:
    """The pairing and θ from the cos/sin tables a model passes to its attention ((…, N, rot), N ≥ 2)."""
    c, s = cos.reshape(-1, cos.shape[-1]).float(), sin.reshape(-1, sin.shape[-1]).float()
    rot = c.shape[-1]
    if c.shape[0] < 2 or rot % 2 or rot > head_dim:
        raise AttnvizError("the rotary tables need at least 2 positions and an even width within the head")
    angle = torch.atan2(s[1], c[1])  # position 1: θ per dim (θ ≤ 1 rad, no wrap)
    half = rot // 2
    tol = 1e-4 * float(angle.abs().max().clamp(min=1e-12))
    if torch.allclose(angle[:half], angle[half:], atol=tol):
        pairs = tuple((m, m + half) for m in range(half))
        pairing: Pairing = "half"
    elif torch.allclose(angle[0::2], angle[1::2], atol=tol):
        pairs = tuple((2 * m, 2 * m + 1) for m in range(half))
        pairing = "interleaved"
    else:
        raise AttnvizError(
            "the rotary tables pair dimensions in a way attnviz does not know (neither halves nor neighbours)"
        )
    theta = tuple(float(angle[a]) for a, _ in pairs)
    return RotarySpec(pairing, pairs, theta, tuple(range(rot, head_dim)), head_dim)


# Models that rotate inside their attention module (no tables passed): interleaved, first rotary_dim dims
_INTERNAL = ("gptj", "codegen")


def spec_from_config(config, head_dim: int) -> RotarySpec:
    """GPT-J / CodeGen build their rotation inside the attention: interleaved over the first
    ``rotary_dim`` dims with θ_m = base^(−2m / rotary_dim)."""
    if getattr(config, "model_type", "") not in _INTERNAL:
        raise AttnvizError(
            "this model's attention gets no rotary tables: it has no rotary embedding (learned or "
            "absolute positions, ALiBi, relative bias), so its scores have no frequency bands"
        )
    rot = int(getattr(config, "rotary_dim", None) or head_dim)
    base = float(getattr(config, "rope_theta", 10000.0) or 10000.0)
    theta = tuple(base ** (-2 * m / rot) for m in range(rot // 2))
    pairs = tuple((2 * m, 2 * m + 1) for m in range(rot // 2))
    return RotarySpec("interleaved", pairs, theta, tuple(range(rot, head_dim)), head_dim)


@dataclass(frozen=True)
class RotaryBands:
    """One head's score of (query, key) by band, and each band's behaviour across the query's keys."""

    spec: RotarySpec
    layer: int
    head: int
    query: int
    key: int
    score: float  # scaling · q · k (before soft-capping, bias and mask)
    pair_terms: np.ndarray  # (pairs,) each band's term of the score; the rest in `rest_term`
    rest_term: float
    spread: np.ndarray  # (pairs,) std over keys 0..query of each band's term
    content_spread: np.ndarray  # (pairs,) std of the content-only term
    position_spread: np.ndarray  # (pairs,) std of the position-only term

    @property
    def carries(self) -> list[str]:
        """ "position" or "content" per band: which counterfactual moves its term more across keys."""
        return [
            "position" if p > c else "content"
            for p, c in zip(self.position_spread, self.content_spread, strict=True)
        ]


def _unrotate(x: torch.Tensor, spec: RotarySpec, angles: torch.Tensor) -> torch.Tensor:
    """x (N, d_head) rotated back by −angle (N, pairs) in every pair."""
    a, b = [p[0] for p in spec.pairs], [p[1] for p in spec.pairs]
    c, s = torch.cos(angles), torch.sin(angles)
    out = x.clone()
    out[:, a] = x[:, a] * c + x[:, b] * s
    out[:, b] = x[:, b] * c - x[:, a] * s
    return out


def bands(
    query: torch.Tensor,
    key: torch.Tensor,
    spec: RotarySpec,
    scaling: float,
    *,
    i: int,
    j: int,
    layer: int = 0,
    head: int = 0,
) -> RotaryBands:
    """Bands of one head from its post-rotary queries and keys (N, d_head) (key: the head's KV
    head), at positions 0..N-1."""
    q, k = query.double(), key.double()
    a = [p[0] for p in spec.pairs]
    b = [p[1] for p in spec.pairs]
    rest = list(spec.rest)
    terms = scaling * (q[i, a][None] * k[: i + 1, a] + q[i, b][None] * k[: i + 1, b])  # (keys, pairs)
    rest_terms = (
        scaling * (q[i, rest][None] * k[: i + 1, rest]).sum(-1) if rest else torch.zeros(i + 1, dtype=q.dtype)
    )
    theta = torch.tensor(spec.theta, dtype=torch.float64)
    pos = torch.arange(q.shape[0], dtype=torch.float64)
    q_t = _unrotate(q[i : i + 1], spec, pos[i : i + 1, None] * theta)[0]
    k_t = _unrotate(k[: i + 1], spec, pos[: i + 1, None] * theta)
    content = scaling * (q_t[a][None] * k_t[:, a] + q_t[b][None] * k_t[:, b])
    mean_k = k_t.mean(dim=0)
    turn = (pos[: i + 1, None] - pos[i]) * theta  # (keys, pairs): R((j − i)θ) k̄̃
    ka = mean_k[a][None] * torch.cos(turn) - mean_k[b][None] * torch.sin(turn)
    kb = mean_k[b][None] * torch.cos(turn) + mean_k[a][None] * torch.sin(turn)
    position = scaling * (q_t[a][None] * ka + q_t[b][None] * kb)
    return RotaryBands(
        spec=spec,
        layer=layer,
        head=head,
        query=i,
        key=j,
        score=float(scaling * (q[i] @ k[j])),
        pair_terms=terms[j].numpy(),
        rest_term=float(rest_terms[j]),
        spread=terms.std(dim=0, unbiased=False).numpy(),
        content_spread=content.std(dim=0, unbiased=False).numpy(),
        position_spread=position.std(dim=0, unbiased=False).numpy(),
    )


def rotary_bands(
    lm: LoadedModel,
    text: str | Trace,
    layer: int,
    head: int,
    query: int = -1,
    key: int | None = None,
    *,
    chat: bool = False,
) -> RotaryBands:
    """The rotary bands of ``head`` at ``layer`` for (query, key) (default: the last token and
    the key it attends to most) and across the query's keys."""
    tr = text if isinstance(text, Trace) else trace(lm, text, chat=chat)
    if not 0 <= layer < tr.n_layers or not 0 <= head < tr.n_heads:
        raise AttnvizError(f"layer {layer} / head {head} is out of range for this model")
    cap = tr.captured[layer]
    d_head = int(cap.query.shape[-1])
    tables = tr.rotary[layer]
    if tables is not None:
        spec = spec_from_tables(tables[0], tables[1], d_head)
    else:
        spec = spec_from_config(lm.model.config.get_text_config(), d_head)
    i = tr.position(query)
    kv = kv_heads_of([head], cap.query.shape[1], cap.key.shape[1])[0]  # GQA: the one rule
    j = int(tr.probs(layer, i)[head].argmax()) if key is None else tr.position(key)
    if j > i:
        raise AttnvizError(f"key {j} comes after query {i}; a decoder's query sees keys 0..{i}")
    return bands(cap.query[0, head], cap.key[0, kv], spec, cap.scaling, i=i, j=j, layer=layer, head=head)
