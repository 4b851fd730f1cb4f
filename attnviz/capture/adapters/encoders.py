"""Adapters for encoder-style self-attention (see attnviz/adapters/families.py): MPNet (relative
position bias), BERT's self-attention as MegatronBERT, RemBERT and TAPAS copy it, RoFormer (rotary
applied in the module) and XLM / FlauBERT (query scaled first, a 0 / 1 key mask)."""

from __future__ import annotations

import math

from . import attention_output, record, recorder


def _mpnet_forward(
    self, hidden_states, attention_mask=None, position_bias=None, output_attentions=False, **kwargs
):
    rec = recorder(self)
    if rec is None or output_attentions:
        return type(self).forward(
            self, hidden_states, attention_mask=attention_mask, position_bias=position_bias,
            output_attentions=output_attentions, **kwargs,
        )  # fmt: skip
    shape = (*hidden_states.shape[:-1], -1, self.attention_head_size)
    query, key, value = (lin(hidden_states).view(shape).transpose(1, 2) for lin in (self.q, self.k, self.v))
    scaling = 1.0 / math.sqrt(self.attention_head_size)  # eager divides by sqrt(d_head)
    record(rec, self, query, key, value, attention_mask, scaling, position_bias)
    out = attention_output(query, key, value, attention_mask, scaling, position_bias)
    c = out.permute(0, 2, 1, 3).reshape(*hidden_states.shape[:-1], self.all_head_size)
    return (self.o(c),)


def _bert_forward(
    self, hidden_states, attention_mask=None, encoder_hidden_states=None, past_key_values=None,
    output_attentions=False, **kwargs,
):  # fmt: skip
    """BERT's self-attention as MegatronBERT, RemBERT and TAPAS copy it: QKᵀ / sqrt(d) + mask."""
    rec = recorder(self)
    if rec is None or encoder_hidden_states is not None or past_key_values is not None or output_attentions:
        return type(self).forward(
            self, hidden_states, attention_mask=attention_mask, encoder_hidden_states=encoder_hidden_states,
            past_key_values=past_key_values, output_attentions=output_attentions, **kwargs,
        )  # fmt: skip
    shape = (*hidden_states.shape[:-1], -1, self.attention_head_size)
    query, key, value = (
        lin(hidden_states).view(shape).transpose(1, 2) for lin in (self.query, self.key, self.value)
    )
    scaling = 1.0 / math.sqrt(self.attention_head_size)
    record(rec, self, query, key, value, attention_mask, scaling)
    out = attention_output(query, key, value, attention_mask, scaling)
    context = out.permute(0, 2, 1, 3).reshape(*hidden_states.shape[:-1], self.all_head_size)
    if type(self).__name__ == "TapasSelfAttention":  # TAPAS returns the weights only when asked
        return (context, past_key_values) if self.is_decoder else (context,)
    return context, None


def _xlm_forward(self, input, mask, kv=None, cache=None, output_attentions=False, **kwargs):
    """XLM / FlauBERT: the query divided by sqrt(d_head) first; ``mask`` (B, key_pos) or
    (B, q_pos, key_pos), a key is blocked where it is 0."""
    rec = recorder(self)
    own = getattr(cache, "self_attention_cache", cache)  # the model always passes a (fresh) cache
    if (
        rec is None
        or kv is not None
        or output_attentions
        or (own is not None and own.get_seq_length(self.layer_id))
    ):
        return type(self).forward(
            self, input, mask, kv=kv, cache=cache, output_attentions=output_attentions, **kwargs
        )  # fmt: skip
    b, n, _ = input.shape
    heads = (b, -1, self.n_heads, self.head_dim)
    query = self.q_lin(input).view(heads).transpose(1, 2) / math.sqrt(self.head_dim)
    key, value = (lin(input).view(heads).transpose(1, 2) for lin in (self.k_lin, self.v_lin))
    if own is not None:  # filled as eager fills it (an empty cache hands the same key / value back)
        key, value = own.update(key, value, self.layer_id)
    allowed = (mask != 0).view((b, 1, n, -1) if mask.dim() == 3 else (b, 1, 1, -1))
    allowed = allowed.expand(b, 1, n, allowed.shape[-1])  # one row per query (a view, no copy)
    record(rec, self, query, key, value, allowed, 1.0)
    out = attention_output(query, key, value, allowed, 1.0)
    return (self.out_lin(out.transpose(1, 2).reshape(b, n, self.n_heads * self.head_dim)),)


def _roformer_forward(
    self, hidden_states, attention_mask=None, sinusoidal_pos=None, encoder_hidden_states=None,
    past_key_values=None, output_attentions=False, **kwargs,
):  # fmt: skip
    """RoFormer: BERT's scores after its own rotary on query and key (and value, rotary_value)."""
    rec = recorder(self)
    if rec is None or encoder_hidden_states is not None or past_key_values is not None or output_attentions:
        return type(self).forward(
            self, hidden_states, attention_mask=attention_mask, sinusoidal_pos=sinusoidal_pos,
            encoder_hidden_states=encoder_hidden_states, past_key_values=past_key_values,
            output_attentions=output_attentions, **kwargs,
        )  # fmt: skip
    shape = (*hidden_states.shape[:-1], -1, self.attention_head_size)
    query, key, value = (
        lin(hidden_states).view(shape).transpose(1, 2) for lin in (self.query, self.key, self.value)
    )
    if sinusoidal_pos is not None:
        if self.rotary_value:
            query, key, value = self.apply_rotary_position_embeddings(sinusoidal_pos, query, key, value)
        else:
            query, key = self.apply_rotary_position_embeddings(sinusoidal_pos, query, key)
    scaling = 1.0 / math.sqrt(self.attention_head_size)
    record(rec, self, query, key, value, attention_mask, scaling)
    out = attention_output(query, key, value, attention_mask, scaling)
    return out.permute(0, 2, 1, 3).reshape(*hidden_states.shape[:-1], self.all_head_size), None
