"""Row log-sum-exp from PyTorch's fused attention kernels, and attentions whose values are features.

Notation per layer and query head: scores s_ij = scale · q_i·k_j (+ mask), L_i = log Σ_j exp s_ij,
p_ij = exp(s_ij − L_i). The fused kernels return L next to their output, so

- one probability is a gather: p_ij = exp(s_ij − L_i);
- a row expectation E_p[f] = Σ_j p_ij f_j is one attention call with V = f.

`attend(q, k, v, scale=..., spec=...)` returns (E_p[v], L) without an N×N tensor:
``aten._scaled_dot_product_flash_attention_for_cpu`` on CPU, ``_scaled_dot_product_efficient_attention``
(compute_log_sumexp) on CUDA, and an exact blocked softmax anywhere else or if a kernel refuses.

These identities hold only where the model's scores are exactly scale · q·k plus a causal,
sliding-window or no mask, and optionally a per-head key-only bias b_hj (ALiBi, `key_bias`):
folded into extra feature columns, so L and every expectation include it. `layer_spec` is the
one predicate that says so for a captured call; anything else (soft-capping, a query-dependent
position bias (T5), learned sinks or any other extra the capture records, an odd mask, an
eager-only result) goes to the exact dense fallback of the caller.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from ..capture.records import CapturedAttention
from ..capture.statistics import cross_terms
from ..layout import AttentionLayout, Stack, repeat_kv
from ..limits import require
from .masks import (
    BLOCK_ROWS,
    MaskSpec,
    PerTensor,
    allowed,
    key_bias,
    mask_bias,
    mask_matches,
    mask_of,
    recorded_bias,
)

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


def scores_tile(
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float,
    spec: MaskSpec,
    q0: int,
    k0: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Exact masked scores of a tile: q (h, rows, d) at query_pos q0.., k (h, cols, d) at key_pos k0..
    -> float32 (h, rows, cols), disallowed entries -inf. ``bias`` (h, key_pos), a key-only additive
    bias over every key (`key_bias`), is added at key_pos k0.."""
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)).mul_(scale)
    if bias is not None:
        s.add_(bias[:, None, k0 : k0 + k.shape[-2]])
    if spec.causal or spec.window is not None:
        ok = allowed(
            torch.arange(q0, q0 + q.shape[-2], device=q.device),
            torch.arange(k0, k0 + k.shape[-2], device=q.device),
            spec,
        )
        s.masked_fill_(~ok, float("-inf"))
    return s


def _blocked(q, k, v, scale: float, spec: MaskSpec, q_offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact softmax attention in query blocks (any device): (E_p[v], L)."""
    outs, lses = [], []
    rows = max(1, min(q.shape[1], (1 << 24) // max(1, q.shape[0] * k.shape[1])))
    for a in range(0, q.shape[1], rows):
        s = scores_tile(q[:, a : a + rows], k, scale, spec, q_offset + a, 0)
        lse = torch.logsumexp(s, -1)  # (h, rows)
        p = torch.exp(s - lse[..., None]).nan_to_num_(0.0)
        outs.append(torch.matmul(p, v.float()))
        lses.append(lse)
    return torch.cat(outs, 1), torch.cat(lses, 1)


def _kernel(q, k, v, scale: float, causal: bool, bias: torch.Tensor | None):
    """One fused call on (h, q, e) tensors -> (out (h, q, e), lse (h, q))."""
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q[None],
            k[None],
            v[None],
            0.0,
            causal,
            attn_mask=None if bias is None else bias[None],
            scale=scale,
        )
        return out[0], lse[0]
    if q.device.type == "cuda":
        e = q.shape[-1]
        pad = (-e) % 8  # the memory-efficient kernel wants 8-aligned head dims
        if pad:
            q, k, v = (torch.nn.functional.pad(t, (0, pad)) for t in (q, k, v))
        attn_bias = None
        if bias is not None:  # last dim of the bias buffer 16-aligned, then sliced
            n_k = bias.shape[-1]
            buf = bias.new_zeros(*bias.shape[:-1], n_k + (-n_k) % 16)
            buf[..., :n_k] = bias
            attn_bias = buf[..., :n_k][None].expand(1, q.shape[0], *bias.shape[-2:])
        out, lse, *_ = torch.ops.aten._scaled_dot_product_efficient_attention(
            q[None], k[None], v[None], attn_bias, True, 0.0, causal, scale=scale
        )
        return out[0, ..., :e], lse[0, :, : q.shape[1]]
    raise NotImplementedError(q.device.type)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    spec: MaskSpec,
    q_offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(E_p[v] (h, q, e), L (h, q)) for float32 q, k, v of shape (h, pos, e) with equal e.

    ``q_offset`` is the absolute position of the first query row (for the causal/window mask).
    A row with no allowed key comes back with L = -inf and E = 0.
    """
    h, n_q, e = q.shape
    n_k = k.shape[1]
    require(4 * h * (2 * n_q + 2 * n_k) * (e + 8), q.device, what="a fused attention pass",
            hint="fewer tokens")  # fmt: skip
    try:
        if spec.window is None and (not spec.causal or (n_q == n_k and q_offset == 0)):
            return _kernel(q, k, v, scale, spec.causal, None)
        outs, lses = [], []
        for a in range(0, n_q, BLOCK_ROWS):
            b = min(a + BLOCK_ROWS, n_q)
            hi = min(n_k, q_offset + b) if spec.causal else n_k
            lo = max(0, q_offset + a - spec.window + 1) if spec.window is not None else 0
            ok = allowed(
                torch.arange(q_offset + a, q_offset + b, device=q.device),
                torch.arange(lo, hi, device=q.device),
                spec,
            )
            bias = torch.zeros(ok.shape, dtype=q.dtype, device=q.device).masked_fill_(~ok, float("-inf"))
            out, lse = _kernel(q[:, a:b], k[:, lo:hi], v[:, lo:hi], scale, False, bias[None])
            outs.append(out)
            lses.append(lse)
        return torch.cat(outs, 1), torch.cat(lses, 1)
    except (RuntimeError, NotImplementedError) as err:
        if q.device.type not in ("cpu", "cuda") or isinstance(err, NotImplementedError):
            return _blocked(q, k, v, scale, spec, q_offset)
        log.warning("fused attention refused (%s); using the exact blocked softmax", err)
        return _blocked(q, k, v, scale, spec, q_offset)


def expand_kv(cap: CapturedAttention, t: torch.Tensor) -> torch.Tensor:
    """(kv_heads, pos, d) -> (heads, pos, d) in transformers' repeat_kv order."""
    group = cap.query.shape[1] // t.shape[0]
    return repeat_kv(t, group, dim=0)


@dataclass
class LayerPass:
    """One layer's statistics inputs (float32, every query head): L, the cross terms
    scale · q_b·E_{p_a}[k] within each KV group (`forward_stats.cross_terms`) and E_p[key_pos].

    ``source`` is "forward" when L and the expectations came from the model's own forward
    (``extract(statistics=True)``), "fused" when from a second fused pass. ``lse_causal`` /
    ``pos_causal`` come from a causal pass over a bidirectional layer (mean distance needs the
    keys before and after each query separately)."""

    lse: torch.Tensor  # (heads, q)
    cross: torch.Tensor  # (heads, group, q)
    e_pos: torch.Tensor  # (heads, q)
    source: str = "fused"
    lse_causal: torch.Tensor | None = None
    pos_causal: torch.Tensor | None = None


# L of each captured call, kept while its query lives (small: (heads, N)).
_LSE: PerTensor[torch.Tensor] = PerTensor(limit=512)


def _remember(cap: CapturedAttention, lse: torch.Tensor) -> None:
    _LSE.put(cap.query, lse)


def _features(cap: CapturedAttention) -> tuple[torch.Tensor, torch.Tensor]:
    """q1 = [q, 0] (heads, q, d + 1) and kv = [k, key_pos] (heads, k, d + 1), float32, GQA-expanded,
    each built in one copy. q1·kv = q·k, so kv serves as both keys and values.

    With a key-only bias b (`key_bias`), G more columns (G the KV group size): kv of head a holds
    the biases b_g of every head g of a's group, q1 holds 1 / scale in a's own column, so
    scale · q1·kv = scale · q·k + b_a and the output's columns d + 1.. are E_{p_a}[b_g]."""
    query, key = cap.query[0], cap.key[0]  # (heads, q, d), (kv_heads, k, d)
    h, n_q, d = query.shape
    n_kv, n_k, _ = key.shape
    group = h // n_kv
    bias = key_bias(cap)
    e = d + 1 + (group if bias is not None else 0)
    q1 = torch.zeros(h, n_q, e, dtype=torch.float32, device=query.device)
    q1[..., :d] = query
    kv = torch.empty(n_kv, group, n_k, e, dtype=torch.float32, device=key.device)
    kv[..., :d] = key[:, None]
    kv[..., d] = torch.arange(n_k, device=key.device, dtype=torch.float32)
    if bias is not None:
        q1.view(n_kv, group, n_q, e)[..., d + 1 :].diagonal(0, 1, 3).fill_(1.0 / cap.scaling)
        kv[..., d + 1 :] = bias.reshape(n_kv, 1, group, n_k).transpose(-1, -2)
    return q1, kv.view(h, n_k, e)


def _cross(q1: torch.Tensor, out: torch.Tensor, scale: float, group: int, d: int) -> torch.Tensor:
    """The cross terms [a, b] = scale · q_b·E_{p_a}[k] (+ E_{p_a}[b_b] with a key-only bias)."""
    cross = cross_terms(q1[..., :d], out[..., :d], scale, group)
    if out.shape[-1] > d + 1:  # (heads, q, group) -> (heads, group, q)
        cross += out[..., d + 1 :].transpose(1, 2)
    return cross


def layer_pass(cap: CapturedAttention, spec: MaskSpec, *, distance: bool = True) -> LayerPass:
    """L, the cross terms and E_p[key_pos] of every query head: from the forward when it kept
    them, else from one fused call (positions in float32)."""
    group = cap.query.shape[1] // cap.key.shape[1]
    fwd = cap.forward
    q1 = kv = None
    if fwd is not None:
        got = LayerPass(lse=fwd.lse, cross=fwd.cross, e_pos=fwd.e_pos, source="forward")
    else:
        d = cap.query.shape[-1]
        q1, kv = _features(cap)  # (h, pos, d + 1 [+ group])
        out, lse = attend(q1, kv, kv, scale=cap.scaling, spec=spec)
        cross = _cross(q1, out, cap.scaling, group, d)
        got = LayerPass(lse=lse, cross=cross, e_pos=out[..., d])
        _remember(cap, lse)
    if distance and not spec.causal:
        if q1 is None or kv is None:
            q1, kv = _features(cap)
        out_c, lse_c = attend(q1, kv, kv, scale=cap.scaling, spec=MaskSpec(True, spec.window))
        got.lse_causal, got.pos_causal = lse_c, out_c[..., cap.query.shape[-1]]
        if fwd is not None:
            got.source = "forward + causal pass"  # mean distance needs the keys before each query
    return got


def layer_lse(cap: CapturedAttention, spec: MaskSpec) -> torch.Tensor:
    """L (heads, q) float32 of one captured call: the forward's when it kept it, else computed
    once and remembered while the call lives."""
    if cap.forward is not None:
        return cap.forward.lse
    hit = _LSE.get(cap.query)
    if hit is not None:
        return hit
    q1, kv = _features(cap)
    _, lse = attend(q1, kv, kv, scale=cap.scaling, spec=spec)
    _remember(cap, lse)
    return lse


def lse_without_first(cap: CapturedAttention, spec: MaskSpec) -> torch.Tensor:
    """L'_i = log Σ_{j >= 1} exp s_ij (heads, q) float32: the log-sum-exp without key_pos 0, so
    that p_ij / (1 - p_i0) = exp(s_ij - L'_i) keeps full relative precision even when the first
    token takes almost all of a row. A row with no other key gives -inf."""
    q1, kv = _features(cap)
    if kv.shape[1] < 2:
        return torch.full(q1.shape[:2], float("-inf"), device=q1.device)
    rest = kv[:, 1:].contiguous()
    _, lse = attend(q1, rest, rest, scale=cap.scaling, spec=spec, q_offset=-1)  # key_pos shifted by 1
    if spec.causal:
        lse[:, 0] = float("-inf")  # row 0 sees only key 0
    return lse


def captured(result, stack: Stack, layer: int) -> CapturedAttention | None:
    """The captured call behind one layer of a fast-path result (None for an eager result)."""
    return result.captured(layer, stack)
