"""One adapter per family: the module's own Q/K/V, recorded, and the output by SDPA.

Each adapter is installed on one attention module instance (attnviz/adapters/__init__.py) and
reproduces only the module's attention step, citing its modeling file's order of operations:

- GPT-J, CodeGen, GPT-Neo, GPT-NeoX-Japanese, OpenAI GPT: ``_attn(query, key, value, mask)``
  gets the post-rotary query and key; GPT-J, CodeGen and GPT-Neo upcast them to fp32 (kept so),
  GPT-Neo never scales and applies its own causal / local-window buffer, CodeGen adds the mask
  before dividing by sqrt(d_head), OpenAI GPT sets blocked scores to -1e4.
- Falcon: rotary (or ALiBi), multi-query (one key head), new_decoder_architecture (key/value
  heads broadcast to every query head: one kept per group). With ALiBi eager adds
  alibi · inv_norm_factor to the scores and its mask already holds alibi / sqrt(d_head).
- BLOOM: ``alibi.baddbmm(Q, Kᵀ, beta=1, alpha=inv_norm_factor)`` + mask.
- MPT: clip_qkv, softmax_scale, ALiBi as ``position_bias`` (the last key_pos entries) and a
  bool mask that is True where masked.
- XGLM, TrOCR: the query is scaled before QKᵀ (scale 1 after).
- attnviz/adapters/encoders.py: MPNet (relative position bias), BERT's self-attention as
  MegatronBERT, RemBERT and TAPAS copy it, RoFormer (rotary), XLM / FlauBERT (query scaled first).
- attnviz/adapters/seq2seq.py: FSMT and MVP, self- and cross-attention.

Each also names an eager formula for the self-check: the module's own ``_attn`` where it has
one; otherwise its scores written out in eager's order on the captured tensors.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...exact.masks import PerTensor
from ...layout import query_group, repeat_kv
from . import attention_output, record, recorder
from .encoders import _bert_forward, _mpnet_forward, _roformer_forward, _xlm_forward
from .seq2seq import _fsmt_forward, _mvp_forward


@dataclass(frozen=True)
class Adapter:
    method: str  # the method replaced on the instance
    fn: Callable
    eager: Callable  # (module, query, key, value, mask, scaling=, dropout=, position_bias=) -> (out, probs)


def _modeling(module: torch.nn.Module) -> Any:
    return sys.modules[type(module).__module__]


# --- GPT-J, CodeGen, GPT-Neo: the inner `_attn` ------------------------------------------------


def _gptj_attn(self, query, key, value, attention_mask=None):
    rec = recorder(self)
    if rec is None:
        return type(self)._attn(self, query, key, value, attention_mask)
    query, key = query.float(), key.float()  # eager's scores are fp32 whatever the model dtype
    scaling = 1.0 / float(self.scale_attn)  # GPT-J divides by sqrt(d_head); CodeGen after the mask
    record(rec, self, query, key, value, attention_mask, scaling)
    return attention_output(query, key, value, attention_mask, scaling), None


# The forward's mask combined with each layer kind's own buffer: layers of one kind share one.
_NEO_MASKS: PerTensor[torch.Tensor] = PerTensor()


def _neo_mask(self, n_q: int, n_k: int, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """GPT-Neo's own causal / local-window buffer with the model's mask added: additive (1, 1, q, k)."""
    allowed = self.bias[:, :, n_k - n_q : n_k, :n_k]
    if tuple(allowed.shape[-2:]) != (n_q, n_k):
        raise ValueError(f"GPT-Neo's attention mask covers {self.bias.shape[-1]} positions, not {n_k}")
    if attention_mask is None:
        return allowed
    hit = _NEO_MASKS.get(attention_mask, str(self.attention_type))
    if hit is not None:
        return hit
    # eager: where(allowed, s, min) + mask; a blocked score stays at (or below) min either way
    combined = attention_mask.float().masked_fill(~allowed, torch.finfo(torch.float32).min)
    return _NEO_MASKS.put(attention_mask, combined, str(self.attention_type))


def _neo_attn(self, query, key, value, attention_mask=None):
    rec = recorder(self)
    if rec is None:
        return type(self)._attn(self, query, key, value, attention_mask)
    query, key = query.float(), key.float()
    mask = _neo_mask(self, query.shape[-2], key.shape[-2], attention_mask)
    record(rec, self, query, key, value, mask, 1.0)  # GPT-Neo does not scale its scores
    return attention_output(query, key, value, mask, 1.0), None


def _own_attn(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **_):
    """The module's own eager ``_attn`` on the captured tensors (GPT-Neo adds its buffer again:
    the captured mask already holds it, so nothing changes)."""
    return type(module)._attn(module, query, key, value, attention_mask)


def _neox_jp_attn(self, query, key, value, attention_mask=None):
    rec = recorder(self)
    if rec is None:
        return type(self)._attn(self, query, key, value, attention_mask)
    scaling = 1.0 / float(self.norm_factor)  # eager: baddbmm(0, Q, Kᵀ, alpha=1 / norm_factor)
    record(rec, self, query, key, value, attention_mask, scaling)
    return attention_output(query, key, value, attention_mask, scaling), None


def _openai_attn(self, q, k, v, attention_mask=None, output_attentions=False):
    rec = recorder(self)
    if rec is None or output_attentions:
        return type(self)._attn(self, q, k, v, attention_mask, output_attentions)
    key = k.transpose(-1, -2)  # its split_heads(k=True) gave (B, heads, d_head, N)
    n_q, n_k = q.shape[-2], key.shape[-2]
    causal = self.bias[:, :, :n_q, :n_k]  # float 0 / 1
    if tuple(causal.shape[-2:]) != (n_q, n_k):
        raise ValueError(f"OpenAI GPT's attention mask covers {self.bias.shape[-1]} positions, not {n_k}")
    # eager: w * b + -1e4 * (1 - b) (+ mask): a blocked score is -1e4, exp(-1e4 - max) == 0 in float32
    mask = causal.bool() if attention_mask is None else attention_mask + (causal - 1) * 1e4
    scaling = 1.0 / math.sqrt(v.size(-1)) if self.scale else 1.0
    record(rec, self, q, key, v, mask, scaling)
    return [attention_output(q, key, v, mask, scaling)]


def _openai_own(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **_):
    """OpenAI GPT's own ``_attn`` (it takes the key transposed, returns the weights when asked)."""
    out = type(module)._attn(module, query, key.transpose(-1, -2), value, attention_mask, True)
    return out[0], out[1]


# --- Falcon ----------------------------------------------------------------------------------


def _falcon_forward(
    self,
    hidden_states,
    alibi,
    attention_mask,
    position_ids=None,
    layer_past=None,
    use_cache=False,
    output_attentions=False,
    position_embeddings=None,
    **kwargs,
):
    rec = recorder(self)
    if rec is None or layer_past is not None or output_attentions:
        return type(self).forward(
            self, hidden_states, alibi, attention_mask, position_ids=position_ids, layer_past=layer_past,
            use_cache=use_cache, output_attentions=output_attentions,
            position_embeddings=position_embeddings, **kwargs,
        )  # fmt: skip
    heads, d = self.num_heads, self.head_dim
    kv_heads = heads if self.new_decoder_architecture else self.num_kv_heads
    query, key, value = self._split_heads(self.query_key_value(hidden_states))  # (B, N, h, d) each
    b, n = query.shape[:2]
    query = query.transpose(1, 2).reshape(b, heads, n, d)
    key = key.transpose(1, 2).reshape(b, kv_heads, n, d)
    value = value.transpose(1, 2).reshape(b, kv_heads, n, d)
    if alibi is None:
        cos, sin = position_embeddings
        query, key = _modeling(self).apply_rotary_pos_emb(query, key, cos, sin)
    groups = query_group(heads, self.num_kv_heads)
    if self.new_decoder_architecture and groups > 1:  # query head h uses key head h // groups
        key, value = key[:, ::groups], value[:, ::groups]
    if alibi is None:  # eager: softmax(QKᵀ / sqrt(d) + mask)
        scaling, bias = 1.0 / math.sqrt(d), None
    else:  # eager: softmax((QKᵀ + alibi) · inv_norm_factor + mask)
        scaling = self.inv_norm_factor
        bias = alibi.view(b, heads, 1, -1).float() * self.inv_norm_factor
    record(rec, self, query, key, value, attention_mask, scaling, bias)
    out = attention_output(query, key, value, attention_mask, scaling, bias)  # (B, heads, N, d)
    return self.dense(out.permute(0, 2, 1, 3).reshape(b, n, heads * d)), None


# --- BLOOM -----------------------------------------------------------------------------------


def _bloom_forward(
    self, hidden_states, residual, alibi, attention_mask, layer_past=None, use_cache=False,
    output_attentions=False, **kwargs,
):  # fmt: skip
    rec = recorder(self)
    if rec is None or layer_past is not None or output_attentions:
        return type(self).forward(
            self, hidden_states, residual, alibi, attention_mask, layer_past=layer_past,
            use_cache=use_cache, output_attentions=output_attentions, **kwargs,
        )  # fmt: skip
    b, n, _ = hidden_states.shape
    query, key, value = self._reshape(self.query_key_value(hidden_states))  # (B, heads, N, d)
    bias = alibi.view(b, self.num_heads, 1, -1) * self.beta  # baddbmm(beta · alibi, alpha · QKᵀ)
    record(rec, self, query, key, value, attention_mask, self.inv_norm_factor, bias)
    out = attention_output(query, key, value, attention_mask, self.inv_norm_factor, bias)
    context = out.permute(0, 2, 1, 3).reshape(b, n, self.num_heads * self.head_dim)
    if self.pretraining_tp > 1 and self.slow_but_exact:
        slices = self.hidden_size / self.pretraining_tp
        output = torch.zeros_like(context)
        for i in range(self.pretraining_tp):
            cols = slice(int(i * slices), int((i + 1) * slices))
            output = output + torch.nn.functional.linear(context[:, :, cols], self.dense.weight[:, cols])
    else:
        output = self.dense(context)
    return _modeling(self).dropout_add(output, residual, self.hidden_dropout, self.training), None


# --- MPT -------------------------------------------------------------------------------------

_MPT_MASKS: PerTensor[torch.Tensor] = PerTensor()


def _mpt_allowed(mask: torch.Tensor) -> torch.Tensor:
    """MPT's mask is True where masked: the inverse (True = attend), once per mask tensor."""
    hit = _MPT_MASKS.get(mask)
    return hit if hit is not None else _MPT_MASKS.put(mask, ~mask)


def _mpt_forward(self, hidden_states, position_bias, past_key_values=None, attention_mask=None, **kwargs):
    rec = recorder(self)
    if rec is None or past_key_values is not None:
        return type(self).forward(
            self, hidden_states, position_bias, past_key_values=past_key_values,
            attention_mask=attention_mask, **kwargs,
        )  # fmt: skip
    b, n = hidden_states.shape[:2]
    mixed = self.Wqkv(hidden_states)
    if self.clip_qkv:
        mixed = mixed.clamp(min=-self.clip_qkv, max=self.clip_qkv)
    query, key, value = (
        t.reshape(b, n, self.n_heads, self.head_dim).transpose(1, 2) for t in mixed.chunk(3, dim=2)
    )
    bias = None
    if position_bias is not None:  # eager: the bias's last q / key_pos entries, broadcast
        k_len = key.shape[-2]
        bias = position_bias[:, max(0, position_bias.size(1) - n) :, max(0, position_bias.size(2) - k_len) :]
        torch.broadcast_shapes((b, self.n_heads, n, k_len), bias.shape)  # eager's add fails here too
        bias = bias.unsqueeze(0) if bias.dim() == 3 else bias
    mask = None if attention_mask is None else _mpt_allowed(attention_mask)
    record(rec, self, query, key, value, mask, self.softmax_scale, bias)
    out = attention_output(query, key, value, mask, self.softmax_scale, bias)
    return self.out_proj(out.permute(0, 2, 1, 3).reshape(b, n, -1)), None


# --- XGLM, TrOCR -----------------------------------------------------------------------------


def _xglm_forward(
    self, hidden_states, key_value_states=None, past_key_values=None, attention_mask=None, **kwargs
):
    rec = recorder(self)
    if (
        rec is None
        or key_value_states is not None
        or past_key_values is not None
        or kwargs.get("output_attentions")
    ):
        return type(self).forward(
            self, hidden_states, key_value_states=key_value_states, past_key_values=past_key_values,
            attention_mask=attention_mask, **kwargs,
        )  # fmt: skip
    b, n, _ = hidden_states.shape
    query = (self.q_proj(hidden_states) * self.scaling).view(b, n, -1, self.head_dim).transpose(1, 2)
    key = self.k_proj(hidden_states).view(b, n, -1, self.head_dim).transpose(1, 2)
    value = self.v_proj(hidden_states).view(b, n, -1, self.head_dim).transpose(1, 2)
    record(rec, self, query, key, value, attention_mask, 1.0)  # the query is already scaled
    out = attention_output(query, key, value, attention_mask, 1.0)
    return self.out_proj(out.transpose(1, 2).reshape(b, n, self.embed_dim)), None


def _written_out(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, position_bias=None, **_
):
    """Eager's scores written out for a module whose attention is inline in its forward:
    QKᵀ (fp32 where eager upcasts) · scale + bias + mask, fp32 softmax, back to the model dtype."""
    groups = query_group(query.shape[1], key.shape[1])
    # eager's repeat_kv (expand + reshape) makes the same contiguous copy: the products are bit-equal
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    scores = torch.matmul(query, key.transpose(-1, -2)).float() * (1.0 if scaling is None else scaling)
    if position_bias is not None:
        scores = scores + position_bias.float()
    if attention_mask is not None:
        scores = scores + attention_mask.float()
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    return torch.matmul(probs, value), probs


# "<family>.<class>": the family is the modeling package (transformers.models.<family>).
ADAPTERS: dict[str, Adapter] = {
    "gptj.GPTJAttention": Adapter("_attn", _gptj_attn, _own_attn),
    "codegen.CodeGenAttention": Adapter("_attn", _gptj_attn, _own_attn),
    "gpt_neo.GPTNeoSelfAttention": Adapter("_attn", _neo_attn, _own_attn),
    "gpt_neox_japanese.GPTNeoXJapaneseAttention": Adapter("_attn", _neox_jp_attn, _own_attn),
    "openai.Attention": Adapter("_attn", _openai_attn, _openai_own),
    "falcon.FalconAttention": Adapter("forward", _falcon_forward, _written_out),
    "bloom.BloomAttention": Adapter("forward", _bloom_forward, _written_out),
    "mpt.MptAttention": Adapter("forward", _mpt_forward, _written_out),
    "xglm.XGLMAttention": Adapter("forward", _xglm_forward, _written_out),
    "trocr.TrOCRAttention": Adapter("forward", _xglm_forward, _written_out),  # the same attention
    "fsmt.Attention": Adapter("forward", _fsmt_forward, _written_out),
    "mvp.MvpAttention": Adapter("forward", _mvp_forward, _written_out),
    "mpnet.MPNetSelfAttention": Adapter("forward", _mpnet_forward, _written_out),
    "megatron_bert.MegatronBertSelfAttention": Adapter("forward", _bert_forward, _written_out),
    "rembert.RemBertSelfAttention": Adapter("forward", _bert_forward, _written_out),
    "tapas.TapasSelfAttention": Adapter("forward", _bert_forward, _written_out),
    "roformer.RoFormerSelfAttention": Adapter("forward", _roformer_forward, _written_out),
    "xlm.MultiHeadAttention": Adapter("forward", _xlm_forward, _written_out),
    "flaubert.MultiHeadAttention": Adapter("forward", _xlm_forward, _written_out),
}
