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

Where things live: the architecture families (where a layer's modules sit, how its weights are
laid out) in `families/` (rotary Llama-likes, GPT-2, BERT); the textbook steps in `steps.py`;
this module runs the model with hooks and compares.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import AttnvizError, BadIndex, InputTooLong
from ..extract import extract
from ..inputs import tokenize
from ..layout import AttentionLayout
from ..loading import Hook, LoadedModel
from ..tokens import Tokens
from .families import SUPPORTED, LayerModules, LayerWeights, family, layer_modules, layer_weights
from .steps import (
    Counterfactuals,
    allowed_mask,
    describe,
    pattern,
    recompute,
    rms_norm,
    rotate_half,
    shape_table,
)
from .steps import counterfactuals as counterfactuals_of

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 512  # every step keeps (heads, N, N) arrays; this is a teaching view

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "SUPPORTED",
    "Counterfactuals",
    "LayerWeights",
    "Step",
    "Walkthrough",
    "allowed_mask",
    "layer_walkthrough",
    "layer_weights",
    "pattern",
    "recompute",
    "rms_norm",
    "rotate_half",
    "shape_table",
]


@dataclass(frozen=True, eq=False)
class Step:
    """One intermediate of the layer: a stable name, what was done, the value and its shape."""

    name: str
    description: str
    value: np.ndarray
    shape: tuple[int, ...]


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


@dataclass
class _Seen:
    hidden: torch.Tensor | None = None
    cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None
    mask: torch.Tensor | None = None
    attn_out: torch.Tensor | None = None
    proj_in: torch.Tensor | None = None
    proj_out: torch.Tensor | None = None


def _hooks(mods: LayerModules) -> tuple[list[Hook], _Seen]:
    """Hooks keeping what the attention module and its output projection received and returned
    (first call), and where they keep it."""
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

    hooks = [
        Hook(mods.attn, pre, "before", with_kwargs=True),
        Hook(mods.attn, post, with_kwargs=True),
        Hook(mods.out_proj, proj),
    ]
    return hooks, seen


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
        family(lay.model_type)  # raises the message that names the supported architectures
    if not 0 <= int(layer) < lay.n_layers:
        raise BadIndex(f"layer {layer} is out of range: this model has layers 0..{lay.n_layers - 1}")
    n_ids = len(tokenize(lm, text, chat=chat)[0])
    if n_ids > max_tokens:
        raise InputTooLong(f"the walkthrough takes up to {max_tokens} tokens; the text has {n_ids}")
    mods = layer_modules(lm, layer)
    hooks, seen = _hooks(mods)
    with lm.hooked(hooks):  # on the model for this thread's eager forward only
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
        cf = counterfactuals_of(t, w, lay) if counterfactuals else None
    about = describe(w, lay, family(lay.model_type).X_FROM)
    steps = tuple(Step(name, about[name], _frozen(v), tuple(v.shape)) for name, v in t.items())
    T = t["x"].shape[1]
    model_allowed = _model_allowed(seen.mask, T)
    real_out = seen.proj_out if mods.output_is_projection else seen.attn_out
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
