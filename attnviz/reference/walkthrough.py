"""The textbook, run on a real layer: recompute one attention layer from its own weights.

    wt = layer_walkthrough(lm, "the financial bank is located on river bank", layer=3)
    for s in wt.steps:
        print(s.name, s.shape, s.description)
    wt.max_abs_diff_probs, wt.max_abs_diff_output   # vs the model itself: <= 1e-6 in float32

The model runs once (its eager attention, as `extract(path="eager")`), with hooks on layer
``layer`` that keep what its attention module really received (the hidden states after the
layer's input norm, RoPE's cos/sin, the mask) and what it returned. The walkthrough then does
the textbook steps by hand, in float32 on the CPU, with that layer's weights: projections, split
into heads, q/k norm (Qwen3), RoPE, K/V repetition (GQA), scores, scaling, soft-capping
(Gemma 2), mask, softmax, weighted sum of values, concatenation and W_o. Every intermediate
is kept as a `Step` with its shape. Shapes in steps keep the batch dimension (1, ...) as the
model computes them; the named fields (``probs``, ``output`` ...) drop it. Steps share memory
(a view is a view), so all arrays are read-only: copy one before changing it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from ..errors import AttnvizError, BadIndex, InputTooLong
from ..extract import extract, tokenize
from ..layout import AttentionLayout
from ..loading import LoadedModel
from ..tokens import Tokens
from .textbook import causal_mask

log = logging.getLogger(__name__)

_ROTARY = ("llama", "mistral", "qwen2", "qwen3", "gemma2")  # q_proj/k_proj/v_proj/o_proj + RoPE
SUPPORTED: tuple[str, ...] = (*_ROTARY, "gpt2", "bert")
DEFAULT_MAX_TOKENS = 512  # every step keeps (heads, N, N) arrays; this is a teaching view


@dataclass(frozen=True, eq=False)
class Step:
    """One intermediate of the layer: a stable name, what was done, the value and its shape."""

    name: str
    description: str
    value: np.ndarray
    shape: tuple[int, ...]


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


@dataclass(frozen=True, eq=False)
class Walkthrough:
    """Layer ``layer`` of ``model_name`` recomputed step by step on ``tokens``.

    ``max_abs_diff_probs`` compares ``probs`` with the model's eager attention weights
    (`extract(path="eager")`); ``max_abs_diff_output`` compares ``output`` with the module named
    in ``compared_output``; ``max_abs_diff_context`` compares the concatenated heads with the
    input of the model's output projection. In float32 all three are <= 1e-6 (on CPU the steps
    repeat the model's own operations and agree bit for bit); in bfloat16/float16 models they
    show the model's rounding (~1e-2), since the walkthrough always computes in float32.
    """

    model_name: str
    model_type: str
    layer: int
    layout: AttentionLayout
    tokens: Tokens
    steps: tuple[Step, ...]
    x: np.ndarray  # (query_pos, d_model) hidden states entering the attention module
    q: np.ndarray  # (heads, query_pos, d_head) as used in the scores (after norm / RoPE)
    k: np.ndarray  # (kv_heads, key_pos, d_head) as used in the scores, before GQA repetition
    v: np.ndarray  # (kv_heads, key_pos, d_head)
    mask: np.ndarray  # (query_pos, key_pos) bool, True = may attend
    probs: np.ndarray  # (heads, query_pos, key_pos)
    context: np.ndarray  # (query_pos, heads * d_head) heads concatenated, input of W_o
    output: np.ndarray  # (query_pos, d_model) W_o output
    scaling: float
    softcap: float | None
    sliding_window: int | None
    causal: bool
    rotary: bool
    qk_norm: bool
    max_abs_diff_probs: float
    max_abs_diff_output: float
    max_abs_diff_context: float
    compared_output: str
    mask_matches_model: bool | None  # our mask vs the mask the module received (None: it got none)
    counterfactuals: Counterfactuals | None = None
    seconds: float = 0.0

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"no step {name!r}; steps: {', '.join(self.names)}")

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.steps]


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


# -- one layer's weights, read from a supported architecture -----------------------------------


@dataclass(frozen=True, eq=False)
class LayerWeights:
    """One attention layer as the textbook needs it: float32 CPU tensors, nn.Linear layout (out, in)."""

    q: torch.Tensor  # (nh*hs, C)
    k: torch.Tensor  # (nkv*hs, C)
    v: torch.Tensor  # (nkv*hs, C)
    o: torch.Tensor  # (C, nh*hs)
    bq: torch.Tensor | None
    bk: torch.Tensor | None
    bv: torch.Tensor | None
    bo: torch.Tensor | None
    scaling: float
    causal: bool
    rotary: bool
    softcap: float | None = None
    sliding_window: int | None = None
    q_norm: tuple[torch.Tensor, float] | None = None  # (weight (hs,), eps)
    k_norm: tuple[torch.Tensor, float] | None = None
    names: dict[str, str] = field(default_factory=dict)  # q/k/v/o -> the model's module path


@dataclass(frozen=True, eq=False)
class _Modules:
    attn: torch.nn.Module  # hooked for its inputs and output
    out_proj: torch.nn.Module  # hooked for its input (the concatenated heads) and output
    compared_output: str


def _cpu(t: torch.Tensor) -> torch.Tensor:
    if t.device.type == "meta":
        raise AttnvizError("this layer's weights are offloaded (not in memory); load the model on one device")
    return t.detach().to("cpu", torch.float32).clone()


def _maybe(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else _cpu(t)


def _modules(lm: LoadedModel, layer: int) -> _Modules:
    mt = lm.layout.model_type
    base: Any = lm.model.base_model
    if mt in _ROTARY:
        attn = base.layers[layer].self_attn
        what = f"layers.{layer}.self_attn output (o_proj of the concatenated heads)"
        return _Modules(attn, attn.o_proj, what)
    if mt == "gpt2":
        attn = base.h[layer].attn
        what = f"h.{layer}.attn output (c_proj of the concatenated heads, before the residual add)"
        return _Modules(attn, attn.c_proj, what)
    if mt == "bert":
        att = base.encoder.layer[layer].attention
        what = (
            f"encoder.layer.{layer}.attention.output.dense output (W_o of the concatenated heads), "
            "before the dropout, residual add and LayerNorm that BERT's attention block applies next"
        )
        return _Modules(att.self, att.output.dense, what)
    raise AttnvizError(
        f"the step-by-step walkthrough does not know the {mt!r} architecture; it supports "
        f"{', '.join(SUPPORTED)} (e.g. the built-in models smollm2-135m and minilm-l6)"
    )


def _from_linears(q: Any, k: Any, v: Any, o: Any, **facts: Any) -> LayerWeights:
    """LayerWeights from four nn.Linear modules (weights (out, in), optional biases)."""
    return LayerWeights(
        q=_cpu(q.weight), k=_cpu(k.weight), v=_cpu(v.weight), o=_cpu(o.weight),
        bq=_maybe(q.bias), bk=_maybe(k.bias), bv=_maybe(v.bias), bo=_maybe(o.bias),
        **facts,
    )  # fmt: skip


def layer_weights(lm: LoadedModel, layer: int) -> LayerWeights:
    """The weights and settings of attention layer ``layer`` (call while holding ``lm.lock``)."""
    mods = _modules(lm, layer)
    mt, cfg = lm.layout.model_type, lm.model.config
    attn: Any = mods.attn
    if mt in _ROTARY:
        p = f"layers.{layer}.self_attn"
        norms = {}
        for side in ("q", "k"):
            norm = getattr(attn, f"{side}_norm", None)
            if norm is not None:
                norms[f"{side}_norm"] = (_cpu(norm.weight), float(norm.variance_epsilon))
        return _from_linears(
            attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
            scaling=float(attn.scaling),
            causal=bool(getattr(attn, "is_causal", True)),
            rotary=True,
            softcap=getattr(attn, "attn_logit_softcapping", None),
            # Qwen2/3 and Gemma 2 set it per layer (None on full layers); Mistral reads the config
            sliding_window=getattr(attn, "sliding_window", getattr(cfg, "sliding_window", None)),
            names={s: f"{p}.{s}_proj" for s in "qkvo"},
            **norms,
        )  # fmt: skip
    if mt == "gpt2":
        p, C = f"h.{layer}.attn", lm.layout.d_model
        W, b = _cpu(attn.c_attn.weight), _cpu(attn.c_attn.bias)  # Conv1D stores (in, out): (C, 3C)
        Wq, Wk, Wv = (W[:, i * C : (i + 1) * C].T.contiguous() for i in range(3))  # (C, C) as (out, in)
        bq, bk, bv = (b[i * C : (i + 1) * C] for i in range(3))  # (C,) each
        return LayerWeights(
            q=Wq, k=Wk, v=Wv, o=_cpu(attn.c_proj.weight).T.contiguous(),
            bq=bq, bk=bk, bv=bv, bo=_cpu(attn.c_proj.bias),
            scaling=float(attn.scaling),
            causal=True,
            rotary=False,
            names={"q": f"{p}.c_attn[:, :C]", "k": f"{p}.c_attn[:, C:2C]", "v": f"{p}.c_attn[:, 2C:]",
                   "o": f"{p}.c_proj"},
        )  # fmt: skip
    p = f"encoder.layer.{layer}.attention"  # bert
    return _from_linears(
        attn.query, attn.key, attn.value, mods.out_proj,
        scaling=float(attn.scaling),
        causal=bool(getattr(attn, "is_causal", False)),
        rotary=False,
        names={"q": f"{p}.self.query", "k": f"{p}.self.key", "v": f"{p}.self.value",
               "o": f"{p}.output.dense"},
    )  # fmt: skip


@dataclass
class _Seen:
    hidden: torch.Tensor | None = None
    cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None
    mask: torch.Tensor | None = None
    attn_out: torch.Tensor | None = None
    proj_in: torch.Tensor | None = None
    proj_out: torch.Tensor | None = None


@contextlib.contextmanager
def _hooks(mods: _Modules):
    """Keep what the attention module and its output projection received and returned (first call)."""
    seen = _Seen()

    def pre(module, args, kwargs):
        if seen.hidden is None:
            seen.hidden = (args[0] if args else kwargs["hidden_states"]).detach().clone()
            pe = kwargs.get("position_embeddings")
            seen.cos_sin = None if pe is None else (pe[0].detach().clone(), pe[1].detach().clone())
            m = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
            seen.mask = None if m is None else m.detach().clone()

    def post(module, args, kwargs, output):
        if seen.attn_out is None:
            seen.attn_out = (output[0] if isinstance(output, tuple) else output).detach().clone()

    def proj(module, args, output):
        if seen.proj_in is None:
            seen.proj_in, seen.proj_out = args[0].detach().clone(), output.detach().clone()

    handles = [
        mods.attn.register_forward_pre_hook(pre, with_kwargs=True),
        mods.attn.register_forward_hook(post, with_kwargs=True),
        mods.out_proj.register_forward_hook(proj),
    ]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


# -- the textbook steps ----------------------------------------------------------------------


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
        t["k_repeated"] = k = k.repeat_interleave(G, dim=1)  # (B, nkv, T, hs) -> (B, nh, T, hs)
        t["v_repeated"] = v = v.repeat_interleave(G, dim=1)  # (B, nkv, T, hs) -> (B, nh, T, hs)
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


def _describe(w: LayerWeights, layout: AttentionLayout) -> dict[str, str]:
    mask_what = "causal" if w.causal else "everything (an encoder: every token sees every token)"
    if w.causal and w.sliding_window is not None:
        mask_what += f", within a sliding window of {w.sliding_window} positions"
    ctx = {
        **w.names,
        "x_from": "the previous layer's output" if layout.model_type == "bert" else "after the input norm",
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


def _counterfactuals(t: dict[str, torch.Tensor], w: LayerWeights, layout: AttentionLayout) -> Counterfactuals:
    nh, nkv, G = layout.n_heads, layout.n_kv_heads, layout.group_size
    q = t.get("q_rope", t["q_heads"])[0]  # (nh, T, hs) as scored
    k_kv = t.get("k_rope", t["k_heads"])[0]  # (nkv, T, hs), before repetition
    k = k_kv.repeat_interleave(G, dim=0)  # (nh, T, hs)
    scale, cap, allowed = w.scaling, w.softcap, t["mask"]
    no_rope = None
    if w.rotary:
        k_pre = t["k_heads"][0].repeat_interleave(G, dim=0)  # (nh, T, hs) before RoPE
        no_rope = pattern(t["q_heads"][0], k_pre, scaling=scale, softcap=cap, allowed=allowed).numpy()
    no_mask = pattern(q, k, scaling=scale, softcap=cap).numpy() if w.causal else None
    no_scaling = pattern(q, k, scaling=1.0, softcap=cap, allowed=allowed).numpy()
    ungrouped, kv_heads = None, None
    if G > 1:
        kv_heads = tuple(h % nkv for h in range(nh))  # instead of h // G
        k_other = k_kv[list(kv_heads)]  # (nh, T, hs)
        ungrouped = pattern(q, k_other, scaling=scale, softcap=cap, allowed=allowed).numpy()
    return Counterfactuals(no_rope, no_mask, no_scaling, ungrouped, kv_heads)


def _model_allowed(mask: torch.Tensor | None, n: int) -> torch.Tensor | None:
    """The (n, n) may-attend pattern of the mask the module received (bool, or additive 0 / -big)."""
    if mask is None or mask.dim() < 2:
        return None
    m = mask.reshape(-1, *mask.shape[-2:])[0][-n:, -n:].cpu()  # (T, S)
    return m if m.dtype == torch.bool else m == 0


def _frozen(t: torch.Tensor) -> np.ndarray:
    a = t.numpy()
    a.flags.writeable = False
    return a


def _diff(ours: torch.Tensor, theirs: torch.Tensor | np.ndarray | None) -> float:
    if theirs is None:
        return float("nan")
    theirs = torch.as_tensor(theirs).to("cpu", torch.float32)
    return float((ours - theirs).abs().max())


def layer_walkthrough(
    lm: LoadedModel,
    text: str,
    layer: int,
    *,
    chat: bool = False,
    counterfactuals: bool = True,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> Walkthrough:
    """Recompute attention layer ``layer`` of ``lm`` on ``text`` step by step (see the module doc).

    Raises `AttnvizError` for architectures outside `SUPPORTED`, `BadIndex` for a layer out of
    range and `InputTooLong` over ``max_tokens`` tokens.
    """
    t0 = time.perf_counter()
    lay = lm.layout
    if lay.model_type not in SUPPORTED:
        _modules(lm, 0)  # raises the message that names the supported architectures
    if not 0 <= int(layer) < lay.n_layers:
        raise BadIndex(f"layer {layer} is out of range: this model has layers 0..{lay.n_layers - 1}")
    n_ids = len(tokenize(lm, text, chat=chat)[0])
    if n_ids > max_tokens:
        raise InputTooLong(f"the walkthrough takes up to {max_tokens} tokens; the text has {n_ids}")
    with lm.lock:  # nobody else runs the model while our hooks are on it
        mods = _modules(lm, layer)
        with _hooks(mods) as seen:
            eager = extract(lm, text, path="eager", chat=chat, max_tokens=max_tokens)
        w = layer_weights(lm, layer)
    if seen.hidden is None:
        raise AttnvizError(
            f"internal: layer {layer}'s attention module did not run; please report this model"
        )

    def f32(a: torch.Tensor) -> torch.Tensor:
        return a.to("cpu", torch.float32)

    cos_sin = None if seen.cos_sin is None else (f32(seen.cos_sin[0]), f32(seen.cos_sin[1]))
    with torch.no_grad():
        t = recompute(f32(seen.hidden), w, lay, cos_sin)
        cf = _counterfactuals(t, w, lay) if counterfactuals else None
    about = _describe(w, lay)
    steps = tuple(Step(name, about[name], _frozen(v), tuple(v.shape)) for name, v in t.items())
    T = t["x"].shape[1]
    model_allowed = _model_allowed(seen.mask, T)
    real_out = seen.proj_out if lay.model_type == "bert" else seen.attn_out
    result = Walkthrough(
        model_name=lm.spec,
        model_type=lay.model_type,
        layer=int(layer),
        layout=lay,
        tokens=eager.tokens,
        steps=steps,
        x=_frozen(t["x"][0]),
        q=_frozen(t.get("q_rope", t["q_heads"])[0]),
        k=_frozen(t.get("k_rope", t["k_heads"])[0]),
        v=_frozen(t["v_heads"][0]),
        mask=_frozen(t["mask"]),
        probs=_frozen(t["probs"][0]),
        context=_frozen(t["concat"][0]),
        output=_frozen(t["output"][0]),
        scaling=w.scaling,
        softcap=w.softcap,
        sliding_window=w.sliding_window if w.causal else None,
        causal=w.causal,
        rotary=w.rotary,
        qk_norm=w.q_norm is not None,
        max_abs_diff_probs=_diff(t["probs"][0], eager.layer(layer)),
        max_abs_diff_output=_diff(t["output"], real_out),
        max_abs_diff_context=_diff(t["concat"], seen.proj_in),
        compared_output=mods.compared_output,
        mask_matches_model=None if model_allowed is None else bool(torch.equal(model_allowed, t["mask"])),
        counterfactuals=cf,
        seconds=time.perf_counter() - t0,
    )
    log.info(
        "walkthrough model=%s layer=%d tokens=%d probs_diff=%.2e output_diff=%.2e seconds=%.3f",
        lm.spec, layer, T, result.max_abs_diff_probs, result.max_abs_diff_output, result.seconds,
    )  # fmt: skip
    return result
