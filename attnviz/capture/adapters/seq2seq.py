"""Adapters for encoder-decoders (see attnviz/adapters/families.py): FSMT's attention (encoder
self-attention, decoder self-attention and cross-attention in one class, on (seq, batch,
channels) tensors) and MVP's (BART's attention).

FSMT's eager: scores = (scaling · Q) Kᵀ + attn_mask (additive, the decoder's causal (q, k) with -inf),
then the key padding mask (True = padding) sets scores to the dtype's min; softmax. One additive
mask holds both here. A cache the model passes is filled as eager fills it when it is empty (the
decoder always passes one); a filled one (generation) runs the module's own code.
"""

from __future__ import annotations

import torch

from . import attention_output, record, recorder


def _fsmt_cache(self, layer_state):
    if layer_state is None:
        return None
    if hasattr(layer_state, "cross_attention_cache"):
        return (
            layer_state.cross_attention_cache
            if self.encoder_decoder_attention
            else layer_state.self_attention_cache
        )
    return layer_state


def _fsmt_forward(
    self,
    query,
    key,
    key_padding_mask=None,
    layer_state=None,
    attn_mask=None,
    output_attentions=False,
    **kwargs,
):
    rec = recorder(self)
    cache = _fsmt_cache(self, layer_state)
    if rec is None or output_attentions or (cache is not None and cache.get_seq_length(self.layer_idx)):
        return type(self).forward(
            self, query, key, key_padding_mask=key_padding_mask, layer_state=layer_state, attn_mask=attn_mask,
            output_attentions=output_attentions, **kwargs,
        )  # fmt: skip
    t, b, channels = query.shape
    heads = (-1, b, self.num_heads, self.head_dim)
    current = key if self.encoder_decoder_attention else query
    k = self.k_proj(current).view(heads).permute(1, 2, 0, 3)  # (B, heads, key_pos, d_head)
    v = self.v_proj(current).view(heads).permute(1, 2, 0, 3)
    if cache is not None:
        k, v = cache.update(k, v, self.layer_idx)
        if self.encoder_decoder_attention:
            layer_state.is_updated[self.layer_idx] = True
    q = (self.q_proj(query) * self.scaling).view(heads).permute(1, 2, 0, 3)
    s = k.shape[2]
    mask = None
    if attn_mask is not None:
        mask = attn_mask.reshape(1, 1, t, s) if attn_mask.dim() == 2 else attn_mask
    if key_padding_mask is not None and key_padding_mask.dim() > 0:
        pad = key_padding_mask.bool()[:, None, None, :]  # (B, 1, 1, key_pos), True = padding
        base = torch.zeros((), dtype=q.dtype, device=q.device) if mask is None else mask.to(q.dtype)
        mask = base.masked_fill(pad, torch.finfo(q.dtype).min)
    if mask is not None:
        mask = mask.expand(b, 1, t, s)  # one row per query (a view)
    record(rec, self, q, k, v, mask, 1.0)  # the query is already scaled
    out = attention_output(q, k, v, mask, 1.0)  # (B, heads, T, d_head)
    return self.out_proj(out.permute(2, 0, 1, 3).reshape(t, b, channels)), None


def _mvp_forward(
    self, hidden_states, key_value_states=None, past_key_values=None, attention_mask=None, attn_prompt=None,
    output_attentions=False, **kwargs,
):  # fmt: skip
    """MVP (BART's attention, self and cross): the query scaled first, + mask. Learned prompts
    (``use_prompt``) prepend keys the token axes do not have: the module's own code runs."""
    rec = recorder(self)
    cross = key_value_states is not None
    cache = past_key_values
    if hasattr(cache, "cross_attention_cache"):
        cache = cache.cross_attention_cache if cross else cache.self_attention_cache
    if (
        rec is None or output_attentions or attn_prompt is not None
        or (cache is not None and cache.get_seq_length(self.layer_idx))
    ):  # fmt: skip
        return type(self).forward(
            self, hidden_states, key_value_states=key_value_states, past_key_values=past_key_values,
            attention_mask=attention_mask, attn_prompt=attn_prompt, output_attentions=output_attentions,
            **kwargs,
        )  # fmt: skip
    b, t, _ = hidden_states.shape
    heads = (b, -1, self.num_heads, self.head_dim)
    query = (self.q_proj(hidden_states) * self.scaling).view(heads).transpose(1, 2)
    current = key_value_states if cross else hidden_states
    key, value = (lin(current).view(heads).transpose(1, 2) for lin in (self.k_proj, self.v_proj))
    if cache is not None:  # filled as eager fills it
        key, value = cache.update(key, value, self.layer_idx)
        if cross and hasattr(past_key_values, "is_updated"):
            past_key_values.is_updated[self.layer_idx] = True
    record(rec, self, query, key, value, attention_mask, 1.0)  # the query is already scaled
    out = attention_output(query, key, value, attention_mask, 1.0)
    return self.out_proj(out.transpose(1, 2).reshape(b, t, self.embed_dim)), None
