"""The textbook steps of one attention layer, architecture-independent: the shape table,
RoPE, q/k norm, masks, the pattern, `recompute` (every intermediate, in order), the sentence
that describes each step, and the counterfactual patterns (one ingredient changed)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from ..errors import AttnvizError
from ..layout import AttentionLayout, repeat_kv
from .families.common import LayerWeights
from .textbook import causal_mask


def shape_table(layout: AttentionLayout, n_tokens: int) -> list[tuple[str, str, tuple[int, ...]]]:
    """The tutorials' shape table, (step, operation, shape), with this model's sizes, batch 1.

    E.g. Llama-3.2-3B (d_model 3072, 24 query heads, 8 KV heads, head_dim 128): Q goes
    (1, N, 3072) -> view (1, N, 24, 128) -> transpose (1, 24, N, 128); K is (1, 8, N, 128),
    repeated to (1, 24, N, 128) so that each KV head serves its group of 3 query heads.
    """
    N, C = n_tokens, layout.d_model
    nh, nkv, hs, G = layout.n_heads, layout.n_kv_heads, layout.head_dim, layout.group_size
    rows: list[tuple[str, str, tuple[int, ...]]] = [
        ("Input x", "hidden states entering attention", (1, N, C))
    ]
    for name, heads in (("Q", nh), ("K", nkv), ("V", nkv)):
        rows.append((f"{name} = x W_{name.lower()}", f"linear {C} -> {heads} x {hs}", (1, N, heads * hs)))
    for name, heads in (("Q", nh), ("K", nkv), ("V", nkv)):
        rows.append((f"{name} view", f"view(1, N, {heads}, {hs}): split into heads", (1, N, heads, hs)))
        rows.append((f"{name} transpose", "transpose(1, 2): heads first", (1, heads, N, hs)))
    if G > 1:
        for name in ("K", "V"):
            rows.append((f"{name} repeat", f"repeat each of {nkv} KV heads {G}x (GQA)", (1, nh, N, hs)))
    rows += [
        ("scores", "Q K^T x scale", (1, nh, N, N)),
        ("attention weights", "mask, then softmax over keys", (1, nh, N, N)),
        ("attention", "weights @ V", (1, nh, N, hs)),
        ("transpose back", "transpose(1, 2)", (1, N, nh, hs)),
        ("concat", f"reshape(1, N, {nh * hs}): heads side by side", (1, N, nh * hs)),
        ("output", f"linear W_o {nh * hs} -> {C}", (1, N, C)),
    ]
    return rows


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(..., hs) -> (..., hs): [x1, x2] -> [-x2, x1], a quarter turn of each RoPE pair (i, i + hs/2)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension (Qwen3's q_norm / k_norm)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def allowed_mask(n: int, causal: bool, window: int | None = None) -> torch.Tensor:
    """(n, n) bool, True = may attend: causal (within the sliding window, if any), or all True."""
    if not causal:
        return torch.ones(n, n, dtype=torch.bool)
    allowed = causal_mask(n)  # (T, T): key <= query
    if window is not None:
        pos = torch.arange(n)
        allowed = allowed & (pos[None, :] > pos[:, None] - window)  # (T, T): query - key < window
    return allowed


def pattern(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    scaling: float,
    softcap: float | None = None,
    allowed: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(mask(softcap(q k^T * scaling))) for q (h, T, hs), k (h, S, hs) -> (h, T, S) float32."""
    scores = (q @ k.transpose(-2, -1)) * scaling  # (h, T, hs) @ (h, hs, S) -> (h, T, S)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap  # (h, T, S), squashed into (-cap, cap)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))  # (h, T, S)
    return torch.softmax(scores, dim=-1, dtype=torch.float32)  # (h, T, S)


def recompute(
    x: torch.Tensor,
    w: LayerWeights,
    layout: AttentionLayout,
    cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """The layer's attention on x (1, T, C), every intermediate in order, keyed by step name.

    Pure: float32 in, float32 out. ``cos_sin`` (each (1, T, hs)) are the rotary tables the
    model passed to this layer (needed when ``w.rotary``).
    """
    nh, nkv, hs, G = layout.n_heads, layout.n_kv_heads, layout.head_dim, layout.group_size
    B, T, _ = x.shape
    t: dict[str, torch.Tensor] = {"x": x}  # (B, T, C)
    t["q_proj"] = q = F.linear(x, w.q, w.bq)  # (B, T, C) -> (B, T, nh*hs)
    t["k_proj"] = k = F.linear(x, w.k, w.bk)  # (B, T, C) -> (B, T, nkv*hs)
    t["v_proj"] = v = F.linear(x, w.v, w.bv)  # (B, T, C) -> (B, T, nkv*hs)
    t["q_view"] = q = q.view(B, T, nh, hs)  # (B, T, nh, hs)
    t["k_view"] = k = k.view(B, T, nkv, hs)  # (B, T, nkv, hs)
    t["v_view"] = v = v.view(B, T, nkv, hs)  # (B, T, nkv, hs)
    if w.q_norm is not None and w.k_norm is not None:
        t["q_norm"] = q = rms_norm(q, *w.q_norm)  # (B, T, nh, hs), each head normalised alone
        t["k_norm"] = k = rms_norm(k, *w.k_norm)  # (B, T, nkv, hs)
    t["q_heads"] = q = q.transpose(1, 2)  # (B, nh, T, hs)
    t["k_heads"] = k = k.transpose(1, 2)  # (B, nkv, T, hs)
    t["v_heads"] = v = v.transpose(1, 2)  # (B, nkv, T, hs)
    if w.rotary:
        if cos_sin is None:
            raise AttnvizError(
                "internal: a rotary layer got no position_embeddings; please report this model"
            )
        t["rope_cos"], t["rope_sin"] = cos, sin = cos_sin  # (B, T, hs) each
        if cos.shape[-1] != hs:
            raise AttnvizError(f"partial rotary embeddings ({cos.shape[-1]} of {hs} dims) are not supported")
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, hs): the same rotation for every head
        t["q_rope"] = q = q * cos + rotate_half(q) * sin  # (B, nh, T, hs)
        t["k_rope"] = k = k * cos + rotate_half(k) * sin  # (B, nkv, T, hs)
    if G > 1:
        t["k_repeated"] = k = repeat_kv(k, G)  # (B, nkv, T, hs) -> (B, nh, T, hs)
        t["v_repeated"] = v = repeat_kv(v, G)  # (B, nkv, T, hs) -> (B, nh, T, hs)
    t["scores_raw"] = s = q @ k.transpose(-2, -1)  # (B, nh, T, hs) @ (B, nh, hs, T) -> (B, nh, T, T)
    t["scores_scaled"] = s = s * w.scaling  # (B, nh, T, T)
    if w.softcap is not None:
        t["scores_softcapped"] = s = torch.tanh(s / w.softcap) * w.softcap  # (B, nh, T, T)
    t["mask"] = allowed = allowed_mask(T, w.causal, w.sliding_window)  # (T, T) bool
    t["scores_masked"] = s = s.masked_fill(~allowed, float("-inf"))  # (B, nh, T, T)
    t["probs"] = p = torch.softmax(s, dim=-1, dtype=torch.float32)  # (B, nh, T, T), rows sum to 1
    t["context_heads"] = c = p @ v  # (B, nh, T, T) @ (B, nh, T, hs) -> (B, nh, T, hs)
    t["context_transposed"] = c = c.transpose(1, 2)  # (B, T, nh, hs)
    t["concat"] = c = c.reshape(B, T, nh * hs)  # (B, T, nh*hs)
    t["output"] = F.linear(c, w.o, w.bo)  # (B, T, nh*hs) -> (B, T, C)
    return t


_DESCRIPTIONS = {
    "x": "hidden states entering the attention module ({x_from})",
    "q_proj": "Q = x W_q^T{bq}: {q}",
    "k_proj": "K = x W_k^T{bk}: {k}",
    "v_proj": "V = x W_v^T{bv}: {v}",
    "q_view": "view: split Q into {nh} heads of {hs} dims",
    "k_view": "view: split K into {nkv} heads of {hs} dims",
    "v_view": "view: split V into {nkv} heads of {hs} dims",
    "q_norm": "q_norm: RMSNorm of each query head over its {hs} dims, before RoPE",
    "k_norm": "k_norm: RMSNorm of each key head over its {hs} dims, before RoPE",
    "q_heads": "transpose(1, 2): heads first, queries before RoPE",
    "k_heads": "transpose(1, 2): heads first, keys before RoPE",
    "v_heads": "transpose(1, 2): heads first",
    "rope_cos": "RoPE table cos(position x frequency), one row per position",
    "rope_sin": "RoPE table sin(position x frequency), one row per position",
    "q_rope": "RoPE: q * cos + rotate_half(q) * sin turns each pair of dims by position x frequency",
    "k_rope": "RoPE on the keys: after it, q . k depends on the distance between the two positions",
    "k_repeated": "GQA: each of the {nkv} key heads is repeated for its {G} query heads (repeat_interleave)",
    "v_repeated": "GQA: each of the {nkv} value heads is repeated for its {G} query heads",
    "scores_raw": "Q K^T: the dot product of every query with every key, per head",
    "scores_scaled": "times the scale {scaling:.6g} ({scale_from})",
    "scores_softcapped": "soft-capping: {softcap:g} * tanh(scores / {softcap:g}), within +-{softcap:g}",
    "mask": "mask, True = may attend: {mask_what}",
    "scores_masked": "blocked scores set to -inf, so their weight becomes exactly 0",
    "probs": "softmax over the keys: each row sums to 1 (these are the attention weights)",
    "context_heads": "weights @ V: each query's weighted mix of the values, per head",
    "context_transposed": "transpose(1, 2) back: positions first",
    "concat": "reshape: the {nh} heads side by side ({nh} x {hs} = {nh_hs})",
    "output": "output = concat W_o^T{bo}: {o}",
}


def describe(w: LayerWeights, layout: AttentionLayout, x_from: str) -> dict[str, str]:
    """One sentence per step with this layer's names and sizes; ``x_from``: where x comes from."""
    mask_what = "causal" if w.causal else "everything (an encoder: every token sees every token)"
    if w.causal and w.sliding_window is not None:
        mask_what += f", within a sliding window of {w.sliding_window} positions"
    ctx = {
        **w.names,
        "x_from": x_from,
        "nh": layout.n_heads,
        "nkv": layout.n_kv_heads,
        "hs": layout.head_dim,
        "G": layout.group_size,
        "nh_hs": layout.n_heads * layout.head_dim,
        "scaling": w.scaling,
        "scale_from": "query_pre_attn_scalar^-0.5" if layout.model_type == "gemma2" else "1/sqrt(head_dim)",
        "softcap": w.softcap or 0.0,
        "mask_what": mask_what,
        **{b: "" if getattr(w, b) is None else f" + b_{b[1]}" for b in ("bq", "bk", "bv", "bo")},
    }
    return {name: text.format(**ctx) for name, text in _DESCRIPTIONS.items()}


@dataclass(frozen=True, eq=False)
class Counterfactuals:
    """Attention patterns (heads, query_pos, key_pos) float32 with one ingredient changed.

    - ``no_rope``: queries and keys before the rotary embedding (after q/k norm), everything
      else as in the model. None for models without RoPE (GPT-2 and BERT add positions to the
      input embeddings instead; there is nothing to remove inside the layer).
    - ``no_mask``: no mask at all, causal or sliding window: every query sees every key,
      including later ones. None for encoders, which have no mask to remove.
    - ``no_scaling``: scores not multiplied by the layer's scale (1/sqrt(head_dim), or Gemma 2's
      query_pre_attn_scalar**-0.5); soft-capping and mask as in the model.
    - ``ungrouped`` (GQA models only, else None): the checkpoint has one key/value head per
      group of query heads and no separate keys to give each query head. Copying the group's
      K/V to every head of the group (the "K repeated" step, what ``repeat_kv`` does) gives
      exactly the real pattern, so that is not a counterfactual. This one instead ignores the
      trained grouping: query head h reads KV head ``h % n_kv_heads`` (``ungrouped_kv_heads``)
      instead of ``h // group_size`` - the pattern a from-scratch implementation gets when it
      uses ``.repeat`` where the model uses ``.repeat_interleave``. Heads whose two indices
      agree (head 0 always) keep their real pattern; the others show that the pairing of query
      and key heads is learned, not arbitrary.
    """

    no_rope: np.ndarray | None
    no_mask: np.ndarray | None
    no_scaling: np.ndarray
    ungrouped: np.ndarray | None
    ungrouped_kv_heads: tuple[int, ...] | None


def counterfactuals(t: dict[str, torch.Tensor], w: LayerWeights, layout: AttentionLayout) -> Counterfactuals:
    """The patterns of `Counterfactuals` from the steps ``t`` of `recompute`."""
    nh, nkv, G = layout.n_heads, layout.n_kv_heads, layout.group_size
    q = t.get("q_rope", t["q_heads"])[0]  # (nh, T, hs) as scored
    k_kv = t.get("k_rope", t["k_heads"])[0]  # (nkv, T, hs), before repetition
    k = repeat_kv(k_kv, G, dim=0)  # (nh, T, hs)
    scale, cap, allowed = w.scaling, w.softcap, t["mask"]
    no_rope = None
    if w.rotary:
        k_pre = repeat_kv(t["k_heads"][0], G, dim=0)  # (nh, T, hs) before RoPE
        no_rope = pattern(t["q_heads"][0], k_pre, scaling=scale, softcap=cap, allowed=allowed).numpy()
    no_mask = pattern(q, k, scaling=scale, softcap=cap).numpy() if w.causal else None
    no_scaling = pattern(q, k, scaling=1.0, softcap=cap, allowed=allowed).numpy()
    ungrouped, kv_heads = None, None
    if G > 1:
        kv_heads = tuple(h % nkv for h in range(nh))  # instead of h // G
        k_other = k_kv[list(kv_heads)]  # (nh, T, hs)
        ungrouped = pattern(q, k_other, scaling=scale, softcap=cap, allowed=allowed).numpy()
    return Counterfactuals(no_rope, no_mask, no_scaling, ungrouped, kv_heads)
