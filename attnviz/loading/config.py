"""Reading a model's attention layout from its config, and the Auto class that loads it."""

from __future__ import annotations

from typing import Any

from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    PretrainedConfig,
)

from ..errors import ModelHasNoAttention
from ..layout import AttentionLayout, ModelKind, Stack

# Model types with no softmax attention at all.
_NO_ATTENTION = {"mamba", "mamba2", "rwkv", "falcon_mamba", "xlstm", "hyena"}


def _text_config(config: PretrainedConfig) -> PretrainedConfig:
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def _first(config: PretrainedConfig, *names: str, default=None):
    for n in names:
        v = getattr(config, n, None)
        if v is not None:
            return v
    return default


def model_kind(config: PretrainedConfig) -> ModelKind:
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder"
    archs = " ".join(getattr(config, "architectures", None) or [])
    if "CausalLM" in archs or "LMHead" in archs or getattr(config, "is_decoder", False):
        return "decoder"
    if config.model_type in {
        "bert",
        "roberta",
        "distilbert",
        "albert",
        "electra",
        "deberta",
        "deberta-v2",
        "xlm-roberta",
        "mpnet",
        "modernbert",
        "camembert",
    }:
        return "encoder"
    if "Masked" in archs or "SequenceClassification" in archs or archs[-5:] == "Model":
        return "encoder" if "ForMaskedLM" in archs else "decoder"
    if (
        type(config) in AutoModelForCausalLM._model_mapping
        or type(config) in AutoModelForImageTextToText._model_mapping
    ):
        return "decoder"
    # No causal-LM head anywhere in transformers (NomicBERT, ConvBERT, MobileBERT, ...): an encoder.
    return "encoder" if type(config) in AutoModel._model_mapping else "decoder"


def attention_layout(config: PretrainedConfig) -> AttentionLayout:
    """Read the attention layout from a config (text config for multimodal wrappers)."""
    if config.model_type in _NO_ATTENTION:
        raise ModelHasNoAttention(
            f"{config.model_type!r} models have no softmax attention layers; "
            "pick a transformer model (e.g. smollm2-135m, gpt2, meta-llama/Llama-3.2-3B-Instruct)"
        )
    kind = model_kind(config)
    c = _text_config(config)
    n_layers = _first(c, "num_hidden_layers", "n_layer", "encoder_layers", "num_layers")
    n_heads = _first(c, "num_attention_heads", "n_head", "encoder_attention_heads", "num_heads")
    d_model = _first(c, "hidden_size", "n_embd", "d_model")
    if n_layers is None or n_heads is None or d_model is None:
        raise ModelHasNoAttention(
            f"cannot find attention heads in the {config.model_type!r} config; "
            "pick a transformer model with softmax attention"
        )
    n_kv = _first(c, "num_key_value_heads", default=n_heads) or n_heads
    head_dim = _first(c, "head_dim", "d_kv", default=None) or d_model // n_heads
    layer_types = tuple(getattr(c, "layer_types", None) or ())
    n_dec = 0
    stacks: tuple[Stack, ...] = ("self",)
    if kind == "encoder-decoder":
        n_layers = _first(c, "encoder_layers", "num_layers", default=n_layers)
        n_dec = _first(c, "decoder_layers", "num_decoder_layers", default=n_layers) or n_layers
        stacks = ("encoder", "decoder", "cross")
    return AttentionLayout(
        model_type=config.model_type,
        kind=kind,
        n_layers=int(n_layers),
        n_heads=int(n_heads),
        n_kv_heads=int(n_kv),
        head_dim=int(head_dim),
        d_model=int(d_model),
        layer_types=layer_types,
        sliding_window=_first(c, "sliding_window", default=None),
        softcap=_first(c, "attn_logit_softcapping", default=None),
        n_decoder_layers=int(n_dec),
        stacks=stacks,
    )


def _auto_class(kind: ModelKind, config: PretrainedConfig):
    """The Auto class that loads this config: the LM head where there is one; a vision-language
    model loads whole (its language model then runs on text alone); otherwise the bare model."""
    if kind == "encoder-decoder":
        choices: tuple = (AutoModelForSeq2SeqLM, AutoModel)
    elif kind == "decoder":
        choices = (AutoModelForCausalLM, AutoModelForImageTextToText, AutoModel)
    else:
        choices = (AutoModel, AutoModelForMaskedLM)
    for auto in choices:
        if type(config) in auto._model_mapping:
            return auto
    raise ModelHasNoAttention(
        f"transformers has no text model class for {config.model_type!r} configs "
        f"({type(config).__name__}); attnviz loads causal LMs, encoders, encoder-decoders and "
        "vision-language models' language models"
    )


def loads_eager(auto: Any, config: PretrainedConfig) -> bool:
    """True when the class ``auto`` picks cannot switch its attention at run time (Falcon, GPT-J,
    BLOOM, ...): such a model is loaded in eager from the start."""
    try:
        cls = auto._model_mapping[type(config)]
    except (KeyError, AttributeError):
        return False
    can = getattr(cls, "_can_set_attn_implementation", None)
    return callable(can) and not can()
