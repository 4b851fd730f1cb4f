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

# Model types with no softmax attention at all (FNet mixes tokens with Fourier transforms).
_NO_ATTENTION = {"hyena", "fnet"}
# Model types whose every block is a non-softmax token mixer (attnviz.mixers shows them): no
# attention layers, one mixer per block.
MIXER_ONLY = {"mamba", "mamba2", "rwkv", "falcon_mamba"}
# ... and those whose only mixer attnviz cannot show yet (refused before any weights load).
_MIXER_NOT_SHOWN = {
    "xlstm": "has no softmax attention, and its mLSTM mixer (xLSTM) is not shown in this version: "
    "its exact parallel form is known but attnviz does not capture its kernel yet",
}
# Model types attnviz cannot show, and why (completes "this 'x' model ...").
_ONE_MAP = "; attnviz shows one token-by-token attention map per layer and cannot show it"
_ASSISTANT = (
    "is a speculative-decoding assistant: its layers attend to the keys and values of its target "
    "Gemma 4 model, so it does not run on text alone; load the target model instead"
)
_WINDOWED = (
    "attends within a sliding window plus a few global tokens and returns each layer's "
    "attention per window, not as a map over all tokens" + _ONE_MAP
)  # LED: its encoder
_CANNOT_SHOW = {
    "blt": "attends over bytes in small local transformers and over patches of bytes in a global "
    "transformer, with cross attention between bytes and patches" + _ONE_MAP,
    "funnel": "pools the sequence between blocks, so its later layers attend from fewer positions "
    "than there are tokens" + _ONE_MAP,
    "perceiver": "attends from a fixed set of latent vectors to the input and among those latents" + _ONE_MAP,
    "reformer": "attends within hashed buckets and local chunks (LSH attention), not over all tokens"
    + _ONE_MAP,
    "longformer": _WINDOWED,
    "led": "has an encoder that " + _WINDOWED,
    "longt5": "has an encoder that attends within local blocks of tokens (local or transient-global "
    "attention), not over all tokens" + _ONE_MAP,
    "pegasus_x": "has an encoder that attends within local blocks plus a few global tokens, returned as "
    "separate local and global parts rather than one map over all tokens" + _ONE_MAP,
    "mra": "approximates attention block-sparsely at several resolutions and does not return "
    "attention probabilities" + _ONE_MAP,
    "yoso": "approximates softmax attention by hashing (LSH-based sampling) and does not return "
    "attention probabilities" + _ONE_MAP,
    "prophetnet": "predicts several future tokens at once: its decoder runs one stream per "
    "predicted position, and its cross attention has a query row per token and stream" + _ONE_MAP,
    "squeezebert": "returns pre-softmax attention scores, not probabilities, from transformers' "
    "eager attention, so attnviz cannot check its probabilities against the model",
    "voxtral_realtime": "is a speech model: its encoder reads audio features, not text, so it "
    "does not run on text alone",
    "gemma4_assistant": _ASSISTANT,
    "gemma4_unified_assistant": _ASSISTANT,
}


def _text_config(config: PretrainedConfig) -> PretrainedConfig:
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def _first(config: PretrainedConfig, *names: str, default=None):
    for n in names:
        try:
            v = getattr(config, n, None)
        except RuntimeError:  # a per-layer attribute of a heterogeneous config: read per layer
            v = _in_every_layer(config, n)
        if v is not None:
            return v
    return default


def _in_every_layer(config: PretrainedConfig, name: str):
    """The value of per-layer attribute ``name`` when every layer has the same one, else None."""
    values = [getattr(lc, name, None) for lc in _per_layer(config)]
    return values[0] if values and all(v == values[0] for v in values) else None


def _per_layer(config: PretrainedConfig) -> list[PretrainedConfig]:
    """Each layer's own config: a heterogeneous config (transformers' ``per_layer_config``, e.g.
    Gemma 4's wider full-attention heads) answers per-layer attributes only layer by layer."""
    if getattr(config, "is_heterogeneous", False):
        return list(config.per_layer_config)
    return [config]


def _same_in_every_layer(layers: list[PretrainedConfig], model_type: str, what: str, *names: str):
    """The one value of a per-layer attribute, or a refusal when the layers disagree."""
    values = [_first(c, *names) for c in layers]
    distinct = sorted({v for v in values if v is not None})
    if len(distinct) > 1:
        raise ModelHasNoAttention(
            f"this {model_type!r} model has a different number of {what} in different layers "
            f"({' / '.join(map(str, distinct))}); attnviz shows models whose attention layers all "
            "have the same heads"
        )
    return distinct[0] if distinct else None


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
    if config.model_type in _CANNOT_SHOW:
        raise ModelHasNoAttention(f"this {config.model_type!r} model {_CANNOT_SHOW[config.model_type]}")
    if config.model_type in _MIXER_NOT_SHOWN:
        raise ModelHasNoAttention(f"this {config.model_type!r} model {_MIXER_NOT_SHOWN[config.model_type]}")
    kind = model_kind(config)
    c = _text_config(config)
    if config.model_type in MIXER_ONLY:  # no attention layers: its blocks are listed by `prepare`
        n_blocks = _first(c, "num_hidden_layers", "n_layer", "num_blocks", "num_layers", default=0)
        d_model = _first(c, "hidden_size", "embedding_dim", "d_model", default=0)
        return AttentionLayout(
            model_type=config.model_type,
            kind="decoder",
            n_layers=0,
            n_heads=0,
            n_kv_heads=0,
            head_dim=0,
            d_model=int(d_model),
            n_blocks=int(n_blocks),
        )
    layers = _per_layer(c)
    n_layers = _first(c, "num_hidden_layers", "n_layer", "encoder_layers", "num_layers")
    n_heads = _same_in_every_layer(
        layers,
        config.model_type,
        "query heads",
        "num_attention_heads",
        "n_head",
        "encoder_attention_heads",
        "num_heads",
    )
    d_model = _first(c, "hidden_size", "n_embd", "d_model")
    if n_layers is None or n_heads is None or d_model is None:
        raise ModelHasNoAttention(
            f"cannot find attention heads in the {config.model_type!r} config; "
            "pick a transformer model with softmax attention"
        )
    n_kv = (
        _same_in_every_layer(layers, config.model_type, "key/value heads", "num_key_value_heads") or n_heads
    )
    # Per-layer head sizes (Gemma 4): the largest, so that memory estimates stay upper bounds.
    head_dim = max(_first(lc, "head_dim", "d_kv", default=None) or d_model // n_heads for lc in layers)
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
        sliding_window=_sliding_window(layers),
        softcap=_first(c, "attn_logit_softcapping", default=None),
        n_decoder_layers=int(n_dec),
        stacks=stacks,
    )


def _sliding_window(layers: list[PretrainedConfig]) -> int | None:
    """The sliding window, when every windowed layer has the same one (a layer whose mask differs
    from the layout's is found by the mask check and computed densely, still exact)."""
    windows = {w for w in (_first(lc, "sliding_window") for lc in layers) if w is not None}
    return windows.pop() if len(windows) == 1 else None


def auto_class(kind: ModelKind, config: PretrainedConfig):
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
