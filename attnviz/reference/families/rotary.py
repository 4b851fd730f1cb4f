"""Llama-like decoders: q_proj/k_proj/v_proj/o_proj + RoPE (Llama, Mistral, Qwen2/3, Gemma 2)."""

from __future__ import annotations

from typing import Any

from .common import LayerModules, LayerWeights, cpu, from_linears

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma2")
X_FROM = "after the input norm"


def modules(base: Any, layer: int) -> LayerModules:
    attn = base.layers[layer].self_attn
    what = f"layers.{layer}.self_attn output (o_proj of the concatenated heads)"
    return LayerModules(attn, attn.o_proj, what)


def weights(attn: Any, mods: LayerModules, layer: int, config: Any) -> LayerWeights:
    p = f"layers.{layer}.self_attn"
    norms = {}
    for side in ("q", "k"):
        norm = getattr(attn, f"{side}_norm", None)
        if norm is not None:  # Qwen3: RMSNorm of each head's q / k
            norms[f"{side}_norm"] = (cpu(norm.weight), float(norm.variance_epsilon))
    return from_linears(
        attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
        scaling=float(attn.scaling),
        causal=bool(getattr(attn, "is_causal", True)),
        rotary=True,
        softcap=getattr(attn, "attn_logit_softcapping", None),
        # Qwen2/3 and Gemma 2 set it per layer (None on full layers); Mistral reads the config
        sliding_window=getattr(attn, "sliding_window", getattr(config, "sliding_window", None)),
        names={s: f"{p}.{s}_proj" for s in "qkvo"},
        **norms,
    )  # fmt: skip
