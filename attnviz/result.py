"""The typed result of `extract`: tokens plus per-layer attention probabilities on demand."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Literal, get_args

import numpy as np
import torch

from .capture.layerwise import LayerInput
from .errors import BadIndex
from .exact.sources import Captured, Recomputed, Source, Stored
from .layout import AttentionLayout, Stack
from .mixers.store import MixerStore, meaning
from .records import CapturedAttention, Check, checks_caption
from .tokens import Tokens

# How a result was asked for: "fast" (captured Q/K/V, probabilities on demand) or "eager"
# (output_attentions=True). The one list of path names (the CLI's --path choices too).
PathName = Literal["fast", "eager"]
PATHS: tuple[str, ...] = get_args(PathName)
# Model types whose attention has learned sinks in the softmax (rows of visible keys sum to < 1).
SINK_MODELS = frozenset(
    {"gpt_oss", "flint", "granite_swa", "granitemoe_swa", "hy_v4", "mimo_v2_flash", "deepseek_v4"}
)


@dataclass(frozen=True, eq=False)
class AttentionResult:
    """Attention of one model on one text.

    ``layer(i)`` -> float32 ndarray (heads, query_pos, key_pos); ``head(i, h)`` -> (query_pos,
    key_pos). Self-attention models have the single stack ``"self"``; encoder-decoder models
    have ``"encoder"``, ``"decoder"`` and ``"cross"`` (queries: decoder tokens, keys: encoder
    tokens). The fast path keeps only the captured queries and keys and computes probabilities
    for what is asked; the eager path holds the full tensors the model returned. Dimension names:
    the glossary of `attnviz.reference.attention`.
    """

    model_name: str
    layout: AttentionLayout
    tokens: Tokens  # encoder / input tokens
    path: PathName
    decoder_tokens: Tokens | None = None
    _captured: dict[str, list[CapturedAttention]] = field(default_factory=dict, repr=False)
    _eager: dict[str, list[torch.Tensor]] = field(default_factory=dict, repr=False)
    seconds: float = 0.0
    # How the probabilities are computed: "fast exact" (captured Q/K), "eager exact (one layer at
    # a time)" (the model's eager attention module re-run on one layer's recorded input), or
    # "eager (all layers)" (output_attentions=True).
    method: str = ""
    _layers: dict[str, list[LayerInput]] = field(default_factory=dict, repr=False)
    _recompute: Callable[[], AbstractContextManager] | None = field(default=None, repr=False)
    # The self-check against eager, one layer of every stack, when `extract(verify=...)` ran it;
    # and one block of each non-softmax mixer kind (`Check.mixer`).
    checks: tuple[Check, ...] = ()
    # Non-softmax token mixers (Mamba-2, gated delta, ...): their captured kernel inputs.
    _mixers: MixerStore | None = field(default=None, repr=False)

    @property
    def check(self) -> Check | None:
        """The self-check's worst figure (largest max |Δ| for its tolerance: a mixer's Δ is against
        outputs of any scale, a stack's against probabilities), or None when it did not run."""
        return max(self.checks, key=lambda c: c.max_abs_diff / (c.tolerance or 1.0)) if self.checks else None

    def check_caption(self) -> str:
        """The self-check of every stack in one line ("" when it did not run)."""
        return checks_caption(self.checks)

    @property
    def stacks(self) -> tuple[Stack, ...]:
        return self.layout.stacks

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def n_layers(self, stack: Stack | None = None) -> int:
        return self.layout.layers_in(self.resolve_stack(stack))

    @property
    def n_heads(self) -> int:
        return self.layout.n_heads

    def axes(self, stack: Stack | None = None) -> tuple[Tokens, Tokens]:
        """(query tokens, key tokens) for a stack."""
        stack = self.resolve_stack(stack)
        dec = self.decoder_tokens or self.tokens
        if stack == "decoder":
            return dec, dec
        if stack == "cross":
            return dec, self.tokens
        return self.tokens, self.tokens

    def resolve_stack(self, stack: Stack | None) -> Stack:
        """The stack asked for (None: the first one), checked against this model's stacks."""
        if stack is None:
            return self.stacks[0]
        if stack not in self.stacks:
            raise BadIndex(f"stack {stack!r} not in this model; choose one of {self.stacks}")
        return stack

    def check_index(self, layer: int, heads: Sequence[int] | None, stack: Stack) -> None:
        """Raise `BadIndex` (saying the valid range) for a layer or head this model lacks."""
        n = self.layout.layers_in(stack)
        if not 0 <= int(layer) < n:
            raise BadIndex(f"layer {layer} is out of range: this model has layers 0..{n - 1}")
        for h in heads or ():
            if not 0 <= int(h) < self.layout.n_heads:
                raise BadIndex(f"head {h} is out of range: this model has heads 0..{self.layout.n_heads - 1}")

    def captured(self, layer: int, stack: Stack | None = None) -> CapturedAttention | None:
        """What the forward recorded for one layer (query, key, value, mask, scaling, ...) on the
        fast path; None for a result from the eager or the layer-at-a-time path."""
        stack = self.resolve_stack(stack)
        self.check_index(layer, None, stack)
        calls = self._captured.get(stack)
        return calls[layer] if calls else None

    def with_capture(self, layer: int, cap: CapturedAttention, stack: Stack | None = None) -> AttentionResult:
        """A copy of this fast-path result with one layer's record replaced (to ask "what if this
        layer had seen ...": a planted bias, mask or scale in a test, a counterfactual)."""
        stack = self.resolve_stack(stack)
        self.check_index(layer, None, stack)
        if not self._captured.get(stack):
            raise BadIndex("only a fast-path result has captured records to replace")
        calls = list(self._captured[stack])
        calls[layer] = cap
        return dataclasses.replace(self, _captured={**self._captured, stack: calls})

    def source(self, layer: int, stack: Stack | None = None) -> Source:
        """Where layer ``layer``'s probabilities come from (`attnviz.exact.sources`): the captured
        call (fast path), the layer's recorded input run again in eager mode (layer at a time),
        or the tensor the model returned (eager). The one place that branches on the form."""
        stack = self.resolve_stack(stack)
        self.check_index(layer, None, stack)
        if self._eager:
            return Stored(self._eager[stack][layer])
        if self._layers:
            assert self._recompute is not None
            return Recomputed(self._layers[stack][layer], self._recompute)
        return Captured(self._captured[stack][layer], self.layout, layer, stack)

    def layer_tensor(
        self,
        layer: int,
        *,
        heads: Sequence[int] | None = None,
        rows: slice | None = None,
        stack: Stack | None = None,
    ) -> torch.Tensor:
        """Probabilities as a float32 tensor on the model's device: (heads, query_pos, key_pos)."""
        stack = self.resolve_stack(stack)
        self.check_index(layer, heads, stack)
        return self.source(layer, stack).probabilities(heads, rows)

    def sink_share(
        self, layer: int, heads: Sequence[int] | None = None, *, stack: Stack | None = None
    ) -> np.ndarray:
        """float32 (heads, query_pos): the probability each row gives the learned attention sink
        (GPT-OSS), i.e. 1 - the row's sum over visible keys; all 0 for models without sinks."""
        probs = self.layer_tensor(layer, heads=heads, stack=stack)
        return (1.0 - probs.sum(-1)).clamp_(min=0.0).cpu().numpy()

    @property
    def has_sinks(self) -> bool:
        """Whether rows give part of their probability to learned sinks (rows sum to < 1)."""
        return any(c.sinks is not None for caps in self._captured.values() for c in caps) or (
            self.layout.model_type in SINK_MODELS
        )

    def layer(
        self, layer: int, *, stack: Stack | None = None, rows: slice | None = None, mixer: str | None = None
    ) -> np.ndarray:
        """float32 (heads, query_pos, key_pos) for one layer.

        ``mixer`` (a key of `attnviz.mixers.MIXERS`) reads ``layer`` as the model's own block index and
        returns that block's mixer: "attention" its softmax probabilities, another kind its exact
        effective attention (signed, not probabilities; see `mixer_meaning`). Without ``mixer``,
        ``layer`` is the i-th attention layer as always; a model with no attention at all (Mamba)
        then shows block ``layer``'s first mixer.
        """
        return self.mixer_tensor(layer, stack=stack, rows=rows, mixer=mixer).cpu().numpy()

    def head(
        self,
        layer: int,
        head: int,
        *,
        stack: Stack | None = None,
        rows: slice | None = None,
        mixer: str | None = None,
    ) -> np.ndarray:
        """float32 (query_pos, key_pos) for one head (``mixer``: as in `layer`)."""
        return self.mixer_tensor(layer, heads=[head], stack=stack, rows=rows, mixer=mixer)[0].cpu().numpy()

    def mixer_tensor(
        self,
        layer: int,
        *,
        heads: Sequence[int] | None = None,
        rows: slice | None = None,
        stack: Stack | None = None,
        mixer: str | None = None,
    ) -> torch.Tensor:
        """`layer_tensor` with the ``mixer`` choice of `layer` (float32, on the CPU for mixers)."""
        if mixer is None and self.layout.n_layers == 0 and self.layout.mixers:
            mixer = self.mixers(layer)[0]
        if mixer is None:
            return self.layer_tensor(layer, heads=heads, stack=stack, rows=rows)
        if mixer == "attention":
            return self.layer_tensor(
                self.layout.attention_layer_of(layer), heads=heads, stack=stack, rows=rows
            )
        if mixer not in self.mixers(layer):
            raise BadIndex(
                f"block {layer} has no {mixer} mixer; it has {', '.join(self.mixers(layer)) or 'none'}"
            )
        if self._mixers is None:
            raise BadIndex("this result kept no captured mixers (a result from an older extract)")
        return self._mixers.tensor(layer, mixer, heads, rows)

    def mixers(self, block: int) -> tuple[str, ...]:
        """Block ``block``'s token mixers, e.g. ("attention",), ("gated_delta",), ("attention", "mamba2")."""
        mixers = self.layout.mixers
        if not 0 <= int(block) < len(mixers):
            raise BadIndex(f"block {block} is out of range: this model has blocks 0..{len(mixers) - 1}")
        return mixers[block]

    def mixer_heads(self, block: int, mixer: str) -> int:
        """How many heads ``layer(block, mixer=...)`` returns (1 for a per-channel mixer's
        contribution view)."""
        if mixer == "attention":
            return self.layout.n_heads
        if self._mixers is None:
            raise BadIndex("this result kept no captured mixers")
        return self._mixers.n_heads(block, mixer)

    def mixer_check(self, block: int, mixer: str) -> Check:
        """Block ``block``'s self-check for a non-softmax mixer (runs it if it has not run;
        raises `MixerCheckFailed` with the reason when the matrix does not reproduce the kernel)."""
        if self._mixers is None:
            raise BadIndex("this result kept no captured mixers")
        return self._mixers.check(block, mixer)

    def mixer_contributions(
        self, block: int, mixer: str, *, heads: Sequence[int] | None = None, rows: slice | None = None
    ) -> np.ndarray:
        """float32 (heads, query_pos, key_pos): ‖c_{t,s}‖, how much source token s adds to the
        mixer's output at t through its output projection (per head: its channels), gates and
        norm scales frozen at their forward values; the value-weighted view of a mixer."""
        if self._mixers is None:
            raise BadIndex("this result kept no captured mixers")
        return self._mixers.contributions(block, mixer, heads, rows).cpu().numpy()

    def mixer_records(self) -> tuple[list, str]:
        """(the captured mixer records, the model dtype name) for export; ([], "") without mixers."""
        if self._mixers is None:
            return [], ""
        return self._mixers.records(), str(self._mixers.dtype).removeprefix("torch.")

    def mixer_pooled(self, block: int, mixer: str, head: int, cells: int = 256):
        """One mixer head's pooled view (`attnviz.mixers.pooling.MixerPooled`: signed mean and
        max |A| per block of tokens), computed without the (query_pos, key_pos) matrix."""
        from .mixers.pooling import mixer_pooled

        if self._mixers is None:
            raise BadIndex("this result kept no captured mixers")
        if not 0 <= int(head) < self._mixers.n_heads(block, mixer):
            raise BadIndex(f"head {head} is out of range for block {block}'s {mixer} mixer")
        return mixer_pooled(self._mixers, block, mixer, int(head), cells)

    def branch_shares(self, block: int):
        """Each parallel branch's share of block ``block``'s token-mixing output (Falcon-H1,
        Zamba2: `attnviz.mixers.branches.BranchShares`), measured in the forward this result
        came from; `BadIndex` for a block without measured branches."""
        if self._mixers is None:
            raise BadIndex("this result kept no captured mixers")
        return self._mixers.branch_shares(int(block))

    @staticmethod
    def mixer_meaning(mixer: str) -> str:
        """What ``layer(b, mixer=...)`` returns, in words, for a label."""
        return meaning(mixer)

    def iter_layers(self, stack: Stack | None = None) -> Iterator[tuple[int, torch.Tensor]]:
        """(layer, probabilities tensor) one layer at a time, never the whole stack at once."""
        stack = self.resolve_stack(stack)
        for i in range(self.layout.layers_in(stack)):
            yield i, self.layer_tensor(i, stack=stack)

    def all_layers(self, stack: Stack | None = None) -> np.ndarray:
        """float32 (layers, heads, query_pos, key_pos): the full stack (big; for export), filled
        one layer at a time into one array sized first: too big for the host's free memory is an
        `OutOfMemory` saying what it needs, not a crash."""
        from .limits import require

        n = self.layout.layers_in(self.resolve_stack(stack))
        if n == 0:  # no softmax layer (Mamba, RWKV): an empty stack, its mixers are `layer(b, mixer=)`
            queries, keys = self.axes(stack)
            return np.zeros((0, self.n_heads, len(queries), len(keys)), dtype=np.float32)
        layers = self.iter_layers(stack)
        _, first = next(layers)
        need = n * first.numel() * 4
        require(
            need,
            "cpu",
            what=f"the attention of all {n} layers ({n} × {tuple(first.shape)} float32)",
            hint="fewer tokens, or one layer or head at a time (result.layer(i), result.head(i, h))",
        )
        out = np.empty((n, *first.shape), dtype=np.float32)
        out[0] = first.float().cpu().numpy()
        del first
        for i, t in layers:
            out[i] = t.float().cpu().numpy()
        return out

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        """A notebook cell shows a summary and the head view (attnviz/figures/notebook.py)."""
        from .figures.notebook import mimebundle

        return mimebundle(self)

    @property
    def nbytes(self) -> int:
        """Bytes held by this result (captured Q/K/masks, or eager tensors)."""
        seen: set[int] = set()
        total = 0
        for caps in self._captured.values():
            for c in caps:
                for t in (c.query, c.key, c.mask, c.position_bias, c.value):
                    if t is not None and id(t) not in seen:
                        seen.add(id(t))
                        total += t.numel() * t.element_size()
        for tensors in self._eager.values():
            total += sum(t.numel() * t.element_size() for t in tensors)
        if self._mixers is not None:
            total += self._mixers.nbytes
        for inputs in self._layers.values():  # a mask shared by every layer counts once
            for i in inputs:
                for t in i.tensors():
                    if id(t) not in seen:
                        seen.add(id(t))
                        total += t.numel() * t.element_size()
        return total
