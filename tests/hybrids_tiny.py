"""Tiny random hybrid models (no network) for the mixer views' tests, served to the app as
``hybrid:<model_type>``: Qwen3.5-shaped (Gated DeltaNet + attention), Falcon-H1 (attention and
Mamba-2 in parallel in every block), Bamba (Mamba-2 + attention), and the pure
recurrent / state-space models Mamba-1, Mamba-2, FalconMamba and RWKV-4 (no attention at all), and
ZAYA (softmax attention that also mixes tokens through a short conv on q/k)."""

from __future__ import annotations

import functools

import archs
import tiny
import torch
import transformers as tf

# Sizes that keep the models tiny (the kernels' chunk is crossed by a 20-token text or more).
SHAPES: dict[str, dict] = {
    "qwen3_5_text": {
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
    },
    "falcon_h1": {"mamba_d_state": 8, "mamba_chunk_size": 16},
    "bamba": {"mamba_d_state": 8, "mamba_chunk_size": 16},
    "mamba": {},
    "mamba2": {"n_groups": 2, "state_size": 8, "chunk_size": 16, "num_heads": 4, "head_dim": 16},
    "falcon_mamba": {},
    "rwkv": {},  # RWKV-4 WKV, per channel
    "zaya": {},  # softmax attention with a short conv on q/k (the Explorer says so)
    "qwen3_next": {},  # gated delta + attention, MoE MLPs
    "zamba2": {},  # Mamba-2 blocks and a shared attention block
    "kimi_linear": {},  # Kimi delta attention + attention
    "lfm2": {"layer_types": ("conv", "full_attention")},  # short conv + attention
}


@functools.cache
def model(model_type: str, **overrides) -> tf.PreTrainedModel:
    """The tiny model of ``model_type`` (``overrides``: config fields, e.g. Falcon-H1's μP
    multipliers; lists given as tuples)."""
    cfg = archs.tiny_config(model_type)
    for k, v in {**SHAPES[model_type], **overrides}.items():
        setattr(cfg, k, list(v) if isinstance(v, tuple) else v)
    cfg.vocab_size = max(int(getattr(cfg, "vocab_size", 0) or 0), tiny.VOCAB)
    if hasattr(cfg, "initializer_range"):
        cfg.initializer_range = 0.2  # activations O(1)
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(cfg).eval()


def loaded(model_type: str, **overrides):
    import attnviz

    return attnviz.wrap_model(model(model_type, **overrides), tiny.tokenizer(), spec=f"hybrid-{model_type}")


def register() -> None:
    """Serve ``hybrid:<model_type>`` through `attnviz.server.specs` (like ``tiny:<arch>``)."""
    from attnviz.server import specs

    specs.register("hybrid", loaded, "tiny hybrid test model")
