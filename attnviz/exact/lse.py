"""Row log-sum-exp from PyTorch's fused attention kernels, and attentions whose values are features.

Notation per layer and query head: scores s_ij = scale · q_i·k_j (+ mask), L_i = log Σ_j exp s_ij,
p_ij = exp(s_ij − L_i). The fused kernels return L next to their output, so

- one probability is a gather: p_ij = exp(s_ij − L_i);
- a row expectation E_p[f] = Σ_j p_ij f_j is one attention call with V = f.

`attend(q, k, v, scale=..., spec=...)` (`attnviz.exact.fused`) returns (E_p[v], L, path) without
an N×N tensor: PyTorch's CPU flash kernel, the CUDA memory-efficient kernel, or an exact blocked
softmax where a kernel documents that it takes no such inputs — and says which ran.

These identities hold only where the model's scores are exactly scale · q·k plus a causal,
sliding-window or no mask, and optionally a per-head key-only bias b_hj (ALiBi, `key_bias`):
passed to the kernel as an additive bias, so L and every expectation include it. `layer_spec` is the
one predicate that says so for a captured call; anything else (soft-capping, a query-dependent
position bias (T5), learned sinks or any other extra the capture records, an odd mask, an
eager-only result) goes to the exact dense fallback of the caller.

The identity it must equal: the readable reference `attnviz.reference.attention.attention_probabilities`:
p_ij = exp(s_ij − L_i) is the reference's softmax written with its normaliser L_i = log Σ_j exp s_ij, and
E_p[f] = Σ_j p_ij f_j its rows times f (tests/engine/test_reference_attention.py checks both).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from .. import backend
from ..exact.statistics import cross_terms
from ..layout import AttentionLayout, Stack, by_kv_group, query_group, repeat_kv
from ..records import CapturedAttention
from .fused import Attended, attend, scores_tile
from .masks import MaskSpec, PerTensor, key_bias, mask_bias, mask_matches, mask_of, recorded_bias

__all__ = [  # with the fused pass and the masks' names the analyses import from here
    "NEG",
    "Attended",
    "Features",
    "LayerPass",
    "MaskSpec",
    "attend",
    "captured",
    "expand_kv",
    "key_bias",
    "layer_lse",
    "layer_lse_path",
    "layer_pass",
    "layer_spec",
    "lse_without_first",
    "mask_of",
    "scores_tile",
    "worst",
]

log = logging.getLogger(__name__)

# Fields of CapturedAttention that the fast formulas understand. Any other field that is set
# (e.g. learned attention sinks) makes the call non-standard: never silently wrong.
_KNOWN = {"module_name", "query", "key", "value", "mask", "is_causal", "scaling", "forward"}
_EXACT_WHEN_NONE = {"softcap": "soft-capping", "position_bias": "position bias"}
NEG = -3.0e4  # "log 0" for per-key biases: exp(NEG + any score) == 0 in float32


def _unset(value: object) -> bool:
    """None, False or a numeric 0: an extra the capture recorded as "off"."""
    return value is None or (isinstance(value, bool | int | float) and not value)


def layer_spec(
    cap: CapturedAttention | None, layout: AttentionLayout, layer: int, stack: Stack
) -> tuple[MaskSpec | None, str]:
    """The one predicate: (mask spec, "fused") when the captured scores are exactly scale · q·k plus
    a mask the kernels reproduce; (None, reason) otherwise — the caller then runs the dense path."""
    if cap is None:
        return None, "eager result"
    for f in dataclasses.fields(cap):
        value = getattr(cap, f.name)
        if f.name in _EXACT_WHEN_NONE:
            if value is not None and f.name != "position_bias":
                return None, _EXACT_WHEN_NONE[f.name]
        elif f.name not in _KNOWN and not _unset(value):
            return None, f"captured {f.name}"
    n_q, n_k = cap.query.shape[2], cap.key.shape[2]
    if cap.query.shape[1] % cap.key.shape[1]:
        return None, "head grouping"
    if cap.position_bias is not None and (cap.forward is not None or recorded_bias(cap) is None):
        return None, "position bias"
    if cap.mask is not None and cap.mask.dim() == 4 and cap.mask.shape[1] not in (1, cap.query.shape[1]):
        return None, "mask"
    if cap.forward is not None and mask_bias(cap.mask) is not None:
        return None, "mask"
    if cap.mask is None:  # eager then masks exactly key_pos > query_pos when is_causal
        return MaskSpec(causal=cap.is_causal and n_q > 1, window=None), "fused"
    causal, window = mask_of(layout, layer, stack)
    spec = MaskSpec(causal=causal, window=window)
    if not mask_matches(cap.mask, spec, n_q, n_k):
        return None, "mask"
    return spec, "fused"


def expand_kv(cap: CapturedAttention, t: torch.Tensor) -> torch.Tensor:
    """(kv_heads, pos, d) -> (heads, pos, d) in transformers' repeat_kv order."""
    return repeat_kv(
        t, query_group(cap.query.shape[1], t.shape[0]), dim=0
    )  # the reference's repeat_kv (transformers' order)


@dataclass
class LayerPass:
    """One layer's statistics inputs (float32, every query head): L, the cross terms
    scale · q_b·E_{p_a}[k] within each KV group (`exact.statistics.cross_terms`) and E_p[key_pos].

    ``source`` says where L and the expectations came from: "forward" (the model's own forward,
    ``extract(statistics=True)``), "fused" (a second fused pass), "blocked: <why>" (the exact
    blocked softmax, where a kernel took no such inputs). ``lse_causal`` / ``pos_causal`` come
    from a causal pass over a bidirectional layer (mean distance needs the keys before and after
    each query separately); "forward + causal pass" then."""

    lse: torch.Tensor  # (heads, q)
    cross: torch.Tensor  # (heads, group, q)
    e_pos: torch.Tensor  # (heads, q)
    source: str = "fused"
    lse_causal: torch.Tensor | None = None
    pos_causal: torch.Tensor | None = None


def worst(*paths: str) -> str:
    """The path to report for a result made of several passes: the first that is not fused."""
    return next((p for p in paths if p not in ("fused", "forward")), paths[0])


# L of each captured call and where it came from, kept while its query lives (small: (heads, N)).
_LSE: PerTensor[tuple[torch.Tensor, str]] = PerTensor(limit=512)


def _remember(cap: CapturedAttention, lse: torch.Tensor, path: str) -> None:
    _LSE.put(cap.query, (lse, path))


@dataclass(frozen=True)
class Features:
    """q1 (heads, q, w) = [q, 0] and kv (heads, k, w) = [k, b_g.., key_pos, 0..]: float32,
    GQA-expanded, each built in one copy; q1·kv = q·k (q1 is zero past column d), so kv serves
    as keys and values. With a key-only bias b (`key_bias`) kv carries the biases b_g of every
    head g of a's KV group (the output's columns d.. are then E_{p_a}[b_g]) and the kernel gets
    a's own b_a as an additive bias. w is padded to the CUDA kernel's alignment there (4)."""

    q1: torch.Tensor
    kv: torch.Tensor
    bias: torch.Tensor | None  # (heads, key_pos) b_a, or None
    d: int  # head dim: the score columns
    pos: int  # column of key_pos (d + G with a bias, else d)


def _features(cap: CapturedAttention) -> Features:
    query, key = cap.query[0], cap.key[0]  # (heads, q, d), (kv_heads, k, d)
    h, n_q, d = query.shape
    n_kv, n_k, _ = key.shape
    group = query_group(h, n_kv)
    bias = key_bias(cap)
    g = group if bias is not None else 0
    w = d + g + 1
    if backend.on_cuda(query.device):
        w = -(-w // 4) * 4  # the efficient kernel's fp32 alignment: K and V are views of kv
    q1 = torch.zeros(h, n_q, w, dtype=torch.float32, device=query.device)
    q1[..., :d] = query
    kv = torch.zeros(n_kv, group, n_k, w, dtype=torch.float32, device=key.device)
    kv[..., :d] = key[:, None]
    if bias is not None:
        kv[..., d : d + g] = by_kv_group(bias, group, 0)[:, None].transpose(-1, -2)
    kv[..., d + g] = torch.arange(n_k, device=key.device, dtype=torch.float32)
    return Features(q1, kv.view(h, n_k, w), bias, d, d + g)


def _pass(f: Features, cap: CapturedAttention, spec: MaskSpec) -> Attended:
    return attend(f.q1, f.kv, f.kv, scale=cap.scaling, spec=spec, key_bias=f.bias, score_dim=f.d)


def _cross(f: Features, out: torch.Tensor, scale: float, group: int) -> torch.Tensor:
    """The cross terms [a, b] = scale · q_b·E_{p_a}[k] (+ E_{p_a}[b_b] with a key-only bias)."""
    cross = cross_terms(f.q1[..., : f.d], out[..., : f.d], scale, group)
    if f.pos > f.d:  # (heads, q, group) -> (heads, group, q)
        cross += out[..., f.d : f.pos].transpose(1, 2)
    return cross


def layer_pass(cap: CapturedAttention, spec: MaskSpec, *, distance: bool = True) -> LayerPass:
    """L, the cross terms and E_p[key_pos] of every query head: from the forward when it kept
    them, else from one fused call (positions in float32)."""
    group = query_group(cap.query.shape[1], cap.key.shape[1])
    fwd = cap.forward
    f = None
    if fwd is not None:
        got = LayerPass(lse=fwd.lse, cross=fwd.cross, e_pos=fwd.e_pos, source="forward")
    else:
        f = _features(cap)  # (h, pos, w)
        out, lse, path = _pass(f, cap, spec)
        got = LayerPass(lse=lse, cross=_cross(f, out, cap.scaling, group), e_pos=out[..., f.pos], source=path)
        _remember(cap, lse, path)
    if distance and not spec.causal:
        f = f or _features(cap)
        out_c, lse_c, path_c = _pass(f, cap, MaskSpec(True, spec.window))
        got.lse_causal, got.pos_causal = lse_c, out_c[..., f.pos]
        if fwd is not None:
            got.source = "forward + causal pass"  # mean distance needs the keys before each query
        got.source = worst(got.source, path_c)
    return got


def layer_lse_path(cap: CapturedAttention, spec: MaskSpec) -> tuple[torch.Tensor, str]:
    """(L (heads, q) float32, where it came from) of one captured call: the forward's when it
    kept it, else computed once and remembered while the call lives."""
    if cap.forward is not None:
        return cap.forward.lse, "forward"
    hit = _LSE.get(cap.query)
    if hit is not None:
        return hit
    _, lse, path = _pass(_features(cap), cap, spec)
    _remember(cap, lse, path)
    return lse, path


def layer_lse(cap: CapturedAttention, spec: MaskSpec) -> torch.Tensor:
    """L (heads, q) float32 of one captured call (`layer_lse_path` without the path)."""
    return layer_lse_path(cap, spec)[0]


def lse_without_first(cap: CapturedAttention, spec: MaskSpec) -> tuple[torch.Tensor, str]:
    """(L'_i = log Σ_{j >= 1} exp s_ij (heads, q) float32, path): the log-sum-exp without
    key_pos 0, so that p_ij / (1 - p_i0) = exp(s_ij - L'_i) keeps full relative precision even
    when the first token takes almost all of a row. A row with no other key gives -inf."""
    f = _features(cap)
    if f.kv.shape[1] < 2:
        return torch.full(f.q1.shape[:2], float("-inf"), device=f.q1.device), "fused"
    rest = f.kv[:, 1:]
    bias = None if f.bias is None else f.bias[:, 1:]
    _, lse, path = attend(
        f.q1, rest, rest, scale=cap.scaling, spec=spec, q_offset=-1, key_bias=bias, score_dim=f.d
    )  # fmt: skip  (key_pos shifted by 1)
    if spec.causal:
        lse[:, 0] = float("-inf")  # row 0 sees only key 0
    return lse, path


def captured(result, stack: Stack, layer: int) -> CapturedAttention | None:
    """The captured call behind one layer of a fast-path result (None for an eager result)."""
    return result.captured(layer, stack)
