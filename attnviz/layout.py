"""What a model's attention looks like: layers, heads, grouping, masks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch

ModelKind = Literal["encoder", "decoder", "encoder-decoder"]
Stack = Literal["self", "encoder", "decoder", "cross"]
MODEL_KINDS: tuple[str, ...] = get_args(ModelKind)


@dataclass(frozen=True)
class AttentionLayout:
    """The attention layout of a model, read from its config.

    For encoder-decoder models ``n_layers`` is the encoder depth and ``n_decoder_layers`` the
    decoder depth; ``stacks`` names what `AttentionResult.layer` accepts.
    """

    model_type: str
    kind: ModelKind
    n_layers: int
    n_heads: int  # query heads
    n_kv_heads: int  # == n_heads without GQA
    head_dim: int
    d_model: int
    layer_types: tuple[str, ...] = ()  # e.g. ("sliding_attention", "full_attention", ...)
    sliding_window: int | None = None
    softcap: float | None = None
    n_decoder_layers: int = 0
    stacks: tuple[Stack, ...] = field(default=("self",))
    # Hybrid models (Jamba, Zamba, Qwen3-Next, ...) have attention in only some blocks: the model's
    # own block index of each attention layer, in order (empty: attention layer i is block i).
    attention_layers: tuple[int, ...] = ()
    n_blocks: int = 0  # all blocks of the (decoder) stack, attention or not (0: same as n_layers)
    # Each block's token mixers (keys of `attnviz.mixers.MIXERS`), e.g. ("attention",), ("gated_delta",),
    # ("attention", "mamba2") for a block with two branches (Falcon-H1, Zamba2's hybrid blocks).
    mixers: tuple[tuple[str, ...], ...] = ()

    def attention_layer_of(self, block: int) -> int:
        """The attention layer index of the model's block ``block`` (inverse of `model_layer`)."""
        from .errors import BadIndex

        if not self.attention_layers:
            return block
        if block not in self.attention_layers:
            raise BadIndex(
                f"block {block} has no softmax attention; attention is in blocks {self.attention_layers}"
            )
        return self.attention_layers.index(block)

    def mixer_summary(self, name: Callable[[str], str] = str) -> str:
        """Where each token mixer is, e.g. "gated_delta in blocks 0, 1, 2; attention in block 3"
        ("" when every block is softmax attention); ``name`` turns a kind into what a page calls it
        (e.g. `attnviz.figures.mixers.kind_name`: "Gated DeltaNet")."""
        where: dict[str, list[int]] = {}
        for b, kinds in enumerate(self.mixers):
            for k in kinds:
                where.setdefault(k, []).append(b)
        if set(where) <= {"attention"}:
            return ""
        parts = [
            f"{name(k)} in block{'s' if len(bs) > 1 else ''} {', '.join(map(str, bs))}"
            for k, bs in where.items()
        ]
        both = [b for b, kinds in enumerate(self.mixers) if len(kinds) > 1]
        if both:
            parts.append(
                f"blocks {', '.join(map(str, both))} run "
                f"{' + '.join(map(name, self.mixers[both[0]]))} side by side"
            )
        return "; ".join(parts)

    def mixer_note(self, block: int) -> str:
        """What a page must say next to one mixer's map of block ``block`` ("" when nothing)."""
        kinds = self.mixers[block] if block < len(self.mixers) else ()
        notes = []
        if len(kinds) > 1:
            notes.append(
                f"block {block} mixes tokens in {len(kinds)} branches ({' + '.join(kinds)}); each map "
                "shows one branch, not the block's whole token mixing"
            )
        if "attention" in kinds and self.model_type in CONV_IN_ATTENTION:
            notes.append(CONV_IN_ATTENTION[self.model_type])
        return "; ".join(notes)

    def model_layer(self, layer: int) -> int:
        """The model's own block index of attention layer ``layer`` (they differ in hybrids)."""
        return self.attention_layers[layer] if self.attention_layers else layer

    def layer_label(self, layer: int) -> str:
        """How a page names attention layer ``layer``: by the model's own block index."""
        return f"layer {self.model_layer(layer)}"

    @property
    def has_mixers(self) -> bool:
        """Whether any block mixes tokens with something other than softmax attention."""
        return any(kind != "attention" for kinds in self.mixers for kind in kinds)

    @property
    def blocks_without_attention(self) -> tuple[int, ...]:
        """Block indices with no attention map (recurrent / state-space blocks of a hybrid)."""
        if not self.attention_layers:
            return ()
        have = set(self.attention_layers)
        return tuple(b for b in range(max(self.n_blocks, len(have))) if b not in have)

    @property
    def group_size(self) -> int:
        """Query heads per KV head (1 without GQA)."""
        return query_group(self.n_heads, self.n_kv_heads)

    def kv_head_of(self, head: int) -> int:
        """The KV head a query head reads (transformers' repeat_kv order)."""
        return kv_heads_of([head], self.n_heads, self.n_kv_heads)[0]

    def layers_in(self, stack: Stack) -> int:
        if stack in ("decoder", "cross"):
            return self.n_decoder_layers
        return self.n_layers


# Attention blocks that also mix tokens through a short convolution the softmax map does not show.
_CONV = (
    "its attention also mixes neighbouring tokens through a short convolution on {}, "
    "which this map does not show"
)
CONV_IN_ATTENTION = {
    "zaya": _CONV.format("q/k (and half of v comes from the previous token)"),
    "inkling": _CONV.format("k and v"),
    "inkling2": _CONV.format("k and v (and after attention)"),
}


def block_mixers(
    n_blocks: int, attention_blocks: Sequence[int], mixer_blocks: Sequence[tuple[int, str]]
) -> tuple[tuple[str, ...], ...]:
    """Each block's mixers: "attention" first where the block has softmax attention, then the
    non-softmax mixers found in it (``mixer_blocks``: (block, kind) pairs)."""
    n = max([n_blocks, *(b + 1 for b in attention_blocks), *(b + 1 for b, _ in mixer_blocks)])
    out: list[list[str]] = [[] for _ in range(n)]
    for b in attention_blocks:
        out[b].append("attention")
    for b, kind in mixer_blocks:
        if kind not in out[b]:
            out[b].append(kind)
    return tuple(tuple(k) for k in out)


# The one rule for grouped-query attention (GQA), in transformers' `repeat_kv` order: KV head g
# serves query heads g * group .. (g + 1) * group - 1, so query head h reads KV head h // group.
# The engine groups heads through these four (a fused path that expands K inside its own copy
# still takes the group from `query_group`).
def query_group(n_heads: int, n_kv_heads: int) -> int:
    """Query heads per KV head of one call (transformers' ``num_key_value_groups``), e.g. from a
    capture's shapes: ``query_group(cap.query.shape[1], cap.key.shape[1])``."""
    return n_heads // max(n_kv_heads, 1)


def kv_heads_of(heads: Sequence[int], n_heads: int, n_kv_heads: int) -> list[int]:
    """The KV head each of ``heads`` (query heads) reads."""
    group = query_group(n_heads, n_kv_heads)
    return [int(h) // group for h in heads]


def repeat_kv(t: torch.Tensor, group: int, dim: int = 1) -> torch.Tensor:
    """KV heads repeated for their query heads along ``dim``: (.., kv_heads, ..) -> (.., heads, ..)."""
    return t.repeat_interleave(group, dim=dim) if group > 1 else t


def by_kv_group(t: torch.Tensor, group: int, dim: int = 1) -> torch.Tensor:
    """Query heads split by the KV head they read along ``dim``: (.., heads, ..) ->
    (.., kv_heads, group, ..), [g, j] = query head g * group + j; always a view.
    ``.flatten(dim, dim + 1)`` undoes it; ``by_kv_group(repeat_kv(t, group, dim), group, dim)``
    holds each KV head ``group`` times."""
    return t.unflatten(dim, (-1, group))
