"""Stand-in for causal_conv1d, tests only: ``causal_conv1d_fn`` over (B, D, L) with varlen
``seq_idx`` and ``causal_conv1d_update`` (conv state updated in place), computed by
transformers' torch fallbacks (`standin_reference`)."""

from __future__ import annotations

import torch
from standin_reference import CALLS, cu_from_seq_idx, segments, torch_reference

__version__ = "1.5.0"


def _check(activation):
    if activation not in (None, "silu", "swish"):
        raise NotImplementedError("activation must be None, silu, or swish")


class CausalConv1dFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, cu_seqlens, activation):
        body = torch_reference("qwen3_next", "causal_conv1d_fn")
        act = None if activation is None else "silu"
        spans = segments(cu_seqlens, x.shape[-1])
        return torch.cat([body(x[..., a:b], weight, bias, activation=act) for a, b in spans], dim=-1)


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                     final_states_out=None, activation=None):  # fmt: skip
    CALLS.append("causal_conv1d.causal_conv1d_fn")
    _check(activation)
    if initial_states is not None or return_final_states:
        raise NotImplementedError("stand-in: conv initial / final states are not modelled")
    return CausalConv1dFn.apply(x, weight, bias, cu_from_seq_idx(seq_idx), activation)


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None):  # fmt: skip
    CALLS.append("causal_conv1d.causal_conv1d_update")
    _check(activation)
    body = torch_reference("qwen3_next", "causal_conv1d_update")
    one = x.dim() == 2
    out = body(
        x.unsqueeze(-1) if one else x,
        conv_state,
        weight,
        bias,
        activation=None if activation is None else "silu",
    )
    return out.squeeze(-1) if one else out
