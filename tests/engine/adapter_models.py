"""Tiny random models of the families with their own adapters (GPT-J, CodeGen, GPT-Neo, Falcon,
BLOOM, MPT, XGLM, MPNet, ...), each beside a separate eager load of the same weights."""

from __future__ import annotations

import copy
import re

import torch

import attnviz

N = 300  # longer than the tiny configs' sizes (hidden 32, 256 positions by default)
ROWS = 64  # query rows per SDPA block on the ALiBi path (production: 1024): 5 blocks here
POSITIONS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len")

# variant -> (model_type, Auto kind, config overrides)
VARIANTS: dict[str, tuple[str, str, dict]] = {
    "gptj": ("gptj", "causal", {}),
    "codegen": ("codegen", "causal", {}),
    "gpt_neo": ("gpt_neo", "causal", {"window_size": 16}),  # layer 1 is local: the window bites
    "falcon": ("falcon", "causal", {}),  # rotary, multi-query
    "falcon-mha": ("falcon", "causal", {"multi_query": False}),
    "falcon-new-arch": ("falcon", "causal", {"new_decoder_architecture": True, "num_kv_heads": 2}),
    "falcon-alibi": ("falcon", "causal", {"alibi": True, "multi_query": False}),
    "bloom": ("bloom", "causal", {}),
    "mpt": ("mpt", "causal", {}),
    "mpt-clip": ("mpt", "causal", {"attn_config": {"clip_qkv": 0.3, "softmax_scale": 0.2}}),
    "xglm": ("xglm", "causal", {}),
    "mpnet": ("mpnet", "masked", {}),
    "megatron-bert": ("megatron-bert", "masked", {}),
    "megatron-bert-decoder": ("megatron-bert", "causal", {"is_decoder": True}),
    "rembert": ("rembert", "masked", {}),
    "tapas": ("tapas", "masked", {}),
    "gpt_neox_japanese": ("gpt_neox_japanese", "causal", {}),
    "openai-gpt": ("openai-gpt", "causal", {}),
    "xlm": ("xlm", "masked", {"emb_dim": 32}),
    "xlm-causal": ("xlm", "causal", {"emb_dim": 32, "causal": True}),
    "flaubert": ("flaubert", "masked", {"emb_dim": 32}),
    "roformer": ("roformer", "masked", {}),
    "trocr": ("trocr", "causal", {}),
    "fsmt": ("fsmt", "seq2seq", {}),  # encoder, decoder and cross attention: their own test
    "mvp": ("mvp", "seq2seq", {}),
    "mvp-prompt": ("mvp", "seq2seq", {"use_prompt": True, "prompt_length": 3, "prompt_mid_dim": 16}),
    "roformer-decoder-rotary-value": ("roformer", "causal", {"is_decoder": True, "rotary_value": True}),
}


def build(variant: str, dtype: torch.dtype = torch.float32):
    """(model attnviz wraps, the same weights in a separate eager load), both eval."""
    import archs
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    model_type, kind, overrides = VARIANTS[variant]
    cfg = archs.tiny_config(model_type)
    for name in POSITIONS:
        if hasattr(cfg, name):
            setattr(cfg, name, 2 * N)
    for name, value in overrides.items():
        if isinstance(value, dict):
            for k, v in value.items():
                setattr(getattr(cfg, name), k, v)
        else:
            setattr(cfg, name, value)
    auto = {"causal": AutoModelForCausalLM, "seq2seq": AutoModelForSeq2SeqLM}.get(kind, AutoModel)
    torch.manual_seed(0)
    model = auto.from_config(copy.deepcopy(cfg), attn_implementation="eager")
    with torch.no_grad():  # sharper attention than random init gives
        for name, p in model.named_parameters():
            if p.dim() == 2 and re.search(r"(q_proj|k_proj|query|key|\.q\.|\.k\.|qkv|Wqkv)", name):
                p.mul_(3.0)
    eager = auto.from_config(copy.deepcopy(cfg), attn_implementation="eager")
    eager.load_state_dict(model.state_dict())
    return model.to(dtype).eval(), eager.to(dtype).eval()


def wrap(model) -> attnviz.LoadedModel:
    import archs
    import transformers as tf

    tok = tf.PreTrainedTokenizerFast(tokenizer_object=archs._tokenizer(), pad_token="<pad>")
    return attnviz.wrap_model(model, tok, spec="tiny")


def ids(n: int = N) -> list[int]:
    return [3 + (i * 37) % 300 for i in range(n)]


def eager_reference(eager, token_ids: list[int]) -> list[torch.Tensor]:
    with torch.inference_mode():
        out = eager(input_ids=torch.tensor([token_ids]), output_attentions=True)
    return [a[0].float() for a in out.attentions]
