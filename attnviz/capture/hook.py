"""The fast path's hook into transformers: one registered attention function.

`AttentionInterface` lets a registered function see exactly what eager attention sees: the
post-RoPE query, the key before GQA repetition, the mask, the scaling, soft-capping and
position bias. While a `Recorder` is active (a ContextVar, so concurrent threads never share
one), the function keeps the query and key of every call; it always computes the layer's output
with SDPA, or with the exact eager math where SDPA cannot (soft-capping), so later layers see
the same hidden states as eager.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..exact.probabilities import attention_scores
from ..exact.statistics import forward_with_stats, fusable
from ..layout import query_group, repeat_kv
from ..records import CapturedAttention, CapturedMixer

IMPLEMENTATION = "attnviz"
# Keyword arguments of an attention call that the capture models (or that do not change the
# probabilities: the mask already holds the sliding window; flash-only varlen arguments).
MODELLED_KWARGS = frozenset(
    {
        "softcap",
        "position_bias",
        "s_aux",
        "is_causal",
        "sliding_window",
        "output_attentions",
        "position_ids",
        "cache_position",
        "use_cache",
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
        "deterministic",
    }
)


@dataclass
class Recorder:
    """Collects `CapturedAttention` in call order for one forward pass."""

    names: dict[int, str]
    calls: list[CapturedAttention] = field(default_factory=list)
    # Keyword arguments some call passed that the capture does not model (their probabilities
    # cannot be recomputed from Q and K): `extract` then runs the exact layer-at-a-time path.
    unsupported: set[str] = field(default_factory=set)
    on_call: Callable[[int], None] | None = None  # told the number of calls so far (progress)
    # Take each layer's log-sum-exp and feature expectations from its forward where the CPU flash
    # kernel runs it (attnviz.exact.statistics): `head_metrics` then needs no second pass there.
    statistics: bool = False
    # Non-softmax token mixers (attnviz.capture.mixers): what each core function got, in call order,
    # and the mixer modules this forward is inside (innermost last).
    mixers: list[CapturedMixer] = field(default_factory=list)
    mixer_stack: list[tuple[str, str, int]] = field(default_factory=list)  # (kind, name, block)
    # parallel branches' output norms by block until the block's mixer record takes them
    branch_norms: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)

    def record(
        self, module, query, key, mask, scaling, is_causal, softcap, position_bias, value=None, sinks=None
    ) -> CapturedAttention:
        cap = CapturedAttention(
            module_name=self.names.get(id(module), type(module).__name__),
            query=query.detach(),
            key=key.detach(),
            mask=None if mask is None else mask.detach(),
            is_causal=bool(is_causal),
            scaling=float(scaling if scaling is not None else query.shape[-1] ** -0.5),
            softcap=None if softcap is None else float(softcap),
            position_bias=None if position_bias is None else position_bias.detach(),
            value=None if value is None else value.detach(),
            sinks=None if sinks is None else sinks.detach().float().reshape(-1),
        )
        self.calls.append(cap)
        if self.on_call is not None:
            self.on_call(len(self.calls))  # may raise to cancel the forward
        return cap


def _changes_probabilities(name: str, value) -> bool:
    """Whether an attention keyword argument may change the probabilities beyond what we model
    (output flags such as ``output_router_logits`` do not)."""
    if value is None or name in MODELLED_KWARGS:
        return False
    return not (isinstance(value, bool) and name.startswith(("output_", "return_", "use_")))


_ACTIVE: ContextVar[Recorder | None] = ContextVar("attnviz_recorder", default=None)
# (module, output (1, q_pos, heads, d_head)) -> output: head ablation (attnviz.explain.ablation)
OutputEdit = Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]
_EDIT: ContextVar[OutputEdit | None] = ContextVar("attnviz_edit", default=None)


@contextlib.contextmanager
def editing(edit: OutputEdit):
    """In this context (this thread / task only) every attention call's output, per head
    (1, q_pos, heads, d_head), passes through ``edit`` before the output projection reads it:
    the model's own code is unchanged (head ablation; reading the heads' outputs)."""
    token = _EDIT.set(edit)
    try:
        yield
    finally:
        _EDIT.reset(token)


def active_recorder() -> Recorder | None:
    """The recorder of the `recording` block this thread / task is in (None outside one)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def recording(
    names: dict[int, str], on_call: Callable[[int], None] | None = None, *, statistics: bool = False
):
    """Record every attention call made in this context (this thread / task only); ``on_call``
    hears the count after each call (an exception it raises stops the forward); ``statistics``
    keeps each layer's log-sum-exp and expectations from the forward where it can."""
    recorder = Recorder(names=names, on_call=on_call, statistics=statistics)
    token = _ACTIVE.set(recorder)
    try:
        yield recorder
    finally:
        _ACTIVE.reset(token)


def _eager_output(module, query, key, value, mask, scaling, softcap, position_bias, is_causal, sinks=None):
    """Eager attention output (1, q_pos, heads, d_head), computed in query chunks to bound memory.

    ``sinks`` (heads,) are learned logits that join each row's softmax and are then dropped
    (GPT-OSS): the visible keys' weights sum to less than 1, as in the model's eager attention.
    """
    groups = query_group(query.shape[1], key.shape[1])
    # The queries are the last q_pos of the key_pos positions (one new token against a cache).
    shift = key.shape[2] - query.shape[2]
    # eager's repeat_kv (expand + reshape) makes the same contiguous copy: the products are bit-equal
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    out = []
    chunk = 1024
    for start in range(0, query.shape[2], chunk):
        rows = slice(start, start + chunk)
        scores = attention_scores(
            query[:, :, rows],
            key,
            scaling=scaling,
            softcap=softcap,
            position_bias=_rows_of(position_bias, rows),
            mask=_rows_of(mask, rows),
            is_causal=is_causal,
            q_offset=shift + start,
        )
        if sinks is not None:  # GPT-OSS order: concat the sink logit, subtract the max, softmax, drop it
            sink = sinks.to(scores.dtype).reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
            combined = torch.cat([scores, sink], dim=-1)
            combined = combined - combined.amax(dim=-1, keepdim=True)
            probs = torch.softmax(combined, dim=-1, dtype=combined.dtype)[..., :-1].to(query.dtype)
        else:
            # torch's own softmax, as eager: later layers then see eager's hidden states bit for bit
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        out.append(torch.matmul(probs, value))
    return torch.cat(out, dim=2).transpose(1, 2).contiguous()


def _rows_of(t: torch.Tensor | None, rows: slice) -> torch.Tensor | None:
    """Query rows ``rows`` of a (..., q_pos, key_pos) mask or bias; one that has a single row for
    every query (a padding mask (1, 1, 1, key_pos), ALiBi) is that row for all of them."""
    return t if t is None or t.shape[-2] == 1 else t[..., rows, :]


def attnviz_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
):
    """Drop-in for transformers' SDPA attention that also records Q and K when asked (and
    passes each head's output through an `editing` function when one is active)."""
    output, weights = _attention(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    edit = _EDIT.get()
    return (output, weights) if edit is None else (edit(module, output), weights)


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
):
    """The attention output (1, q_pos, heads, d_head), recording Q, K and V when asked."""
    softcap = kwargs.get("softcap")
    position_bias = kwargs.get("position_bias")
    sinks = kwargs.get("s_aux")
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    recorder = _ACTIVE.get()
    cap = None
    if recorder is not None:
        recorder.unsupported.update(k for k, v in kwargs.items() if _changes_probabilities(k, v))
        cap = recorder.record(
            module, query, key, attention_mask, scale, is_causal, softcap, position_bias, value, sinks
        )
    if softcap is not None or position_bias is not None or sinks is not None:
        # SDPA has no soft-capping, and with a position bias it runs its math kernel anyway:
        # use eager's exact order of operations so later layers see eager's hidden states.
        output = _eager_output(
            module, query, key, value, attention_mask, scale, softcap, position_bias, is_causal, sinks
        )
        return output, None
    kwargs.pop("output_attentions", None)
    if (
        cap is not None
        and recorder is not None
        and recorder.statistics
        and fusable(module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs)
    ):
        output, cap.forward = forward_with_stats(query, key, value, attention_mask, scale, is_causal)
        return output, None
    return sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
    )


AttentionInterface.register(IMPLEMENTATION, attnviz_attention)
AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
