"""The stream's parts for the QK split of models the trace cannot read head by head: hybrids
(softmax attention blocks among recurrent / state-space / short-conv ones: Qwen3.5, Qwen3-Next,
Bamba, Falcon-H1, Kimi Linear, LFM2) and Bloom / MPT (branches that add the residual inside
their module).

`mixed_trace(lm, text)` runs one forward (`read_stream`, its block boundaries and each branch's
write checked exactly, μP scalars included) with attnviz's capture of every softmax attention call
and plain hooks on each attention module (its rotary tables) and on the input of each branch's
output projection. The stream entering block B is then

    x(p) = embed(p) + Σ_{m<B} Σ_part added[m][part](p)

and a part with heads is split by head through its output projection W_out (columns of head h
times that head's slice of W_out's input, gates and norms at their forward values, times the
branch's scalar): ``L{m}H{h}`` a softmax head, ``L{m}.{kind}{h}`` a mixer head, with W_out's bias
in ``bias``. Each split is checked on every row (Σ heads + bias = the branch's write) before it is
used; a branch without heads (Mamba-1, short conv) or whose split does not check is one part,
``L{m}.{kind}``, and says so. Blocks whose parts do not add up (Zamba2's shared block) refuse the
split with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..capture.hook import recording
from ..capture.projections import output_bias, output_weight
from ..errors import AttnvizError
from ..exact.probabilities import probs_from_capture
from ..inputs import admit_ids, tokenize
from ..limits import bytes_per_element, capture_bytes, forward_bytes, require
from ..loading import Hook, LoadedModel
from ..records import CapturedAttention
from ..tokens import Tokens
from .blocks import Unsupported
from .norms import close
from .stream import Stream, read_stream

OUT_NAMES = ("o_proj", "out_proj", "dense", "c_proj")


@dataclass(frozen=True)
class HeadSplit:
    """A branch of one block split by head: W_out (heads, d_model, d_head), its bias, the scalar
    into the stream and W_out's input (N, heads · d_head), all float32 on the CPU."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    scale: float
    inputs: torch.Tensor

    def writes(self, rows: torch.Tensor) -> torch.Tensor:
        """Each head's write at ``rows``: (rows, heads, d_model)."""
        heads, _, d_head = self.weight.shape
        x = self.inputs[rows].reshape(len(rows), heads, d_head)
        return torch.einsum("hmd,rhd->rhm", self.weight, x) * self.scale


@dataclass(frozen=True)
class MixedTrace:
    """One forward of a model read at block boundaries, with each softmax attention call captured.
    Indexed by attention layer (``captured``, ``rotary``, ``attn_modules``, ``stream``: the stream
    entering that layer's block), as `Trace` is; ``blocks`` keeps every block's parts."""

    model_name: str
    tokens: Tokens
    blocks: Stream
    layer_blocks: tuple[int, ...]  # the model's block index of each attention layer
    captured: tuple[CapturedAttention, ...]
    attn_modules: tuple[str, ...]
    rotary: tuple[tuple[torch.Tensor, torch.Tensor] | None, ...]
    splits: dict[tuple[int, str], HeadSplit]  # (block, part) -> its split by head (checked)
    notes: tuple[str, ...] = ()

    @property
    def nbytes(self) -> int:
        """Bytes held (for caches): the stream, the captures and the heads' inputs."""
        caps = [
            t
            for c in self.captured
            for t in (c.query, c.key, c.value, c.mask, c.position_bias)
            if t is not None
        ]
        held = [*caps, *(s.inputs for s in self.splits.values())]
        return self.blocks.nbytes + sum(t.numel() * t.element_size() for t in held)

    @property
    def stream(self) -> tuple[torch.Tensor, ...]:
        return tuple(self.blocks.stream[b] for b in self.layer_blocks)

    @property
    def n_layers(self) -> int:
        return len(self.captured)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def n_heads(self) -> int:
        return int(self.captured[0].query.shape[1])

    def position(self, token: int) -> int:
        return self.blocks.position(token)

    def probs(self, layer: int, row: int) -> torch.Tensor:
        """α of query ``row`` at ``layer``: float32 (heads, key_pos), as eager."""
        return probs_from_capture(self.captured[layer], None, slice(row, row + 1))[:, 0]


def _attention_out(module: Any) -> Any:
    return next(
        (getattr(module, n) for n in OUT_NAMES if isinstance(getattr(module, n, None), torch.nn.Linear)), None
    )


def mixed_trace(
    lm: LoadedModel, text: str | list[int], *, chat: bool = False, max_tokens: int = 8192
) -> MixedTrace:
    """One forward of ``text`` keeping the stream's parts per block and every attention call."""
    ids = tokenize(lm, text, chat=chat)[0] if isinstance(text, str) else [int(i) for i in text]
    if not ids:
        raise AttnvizError("an empty text; type a few words")
    admit_ids(lm, ids, max_tokens=max_tokens, memory=False).check()
    dtype = next(lm.model.parameters()).dtype
    lay = lm.layout
    blocks = lay.n_blocks or lay.n_layers
    # the stream at each boundary and up to 3 branches per block, + each branch's heads' inputs
    held = (blocks + 1 + 3 * blocks) * len(ids) * lay.d_model * bytes_per_element(dtype)
    require(
        capture_bytes(lay, len(ids), dtype) + forward_bytes(lay, len(ids), dtype) + 2 * held,
        lm.device,
        what=f"reading {len(ids)} tokens block by block (the stream and every branch's write)",
        hint="a shorter text",
    )
    if lm.probe is None or not lm.fast_exact:
        raise Unsupported(f"{lm.spec!r}: attnviz does not capture its attention exactly; no score to split")
    names = [s.module_name for s in lm.probe.sites.get("self", ())]
    modules = [lm.model.get_submodule(n) for n in names]
    rotary: dict[str, Any] = {}
    head_in: dict[str, torch.Tensor] = {}

    def tables(name: str):
        def hook(_m, _args, kwargs):
            pe = kwargs.get("position_embeddings")
            rotary[name] = tuple(t.detach() for t in pe) if isinstance(pe, tuple) else None

        return hook

    def into(name: str):
        def hook(_m, args):
            head_in[name] = args[0][0].detach().float().cpu()

        return hook

    hooks = [Hook(m, tables(n), "before", with_kwargs=True) for n, m in zip(names, modules, strict=True)]
    hooks += [
        Hook(_attention_out(m), into(n), "before")
        for n, m in zip(names, modules, strict=True)
        if _attention_out(m)
    ]
    with recording(lm.module_names) as rec:
        st = read_stream(lm, ids, extra=hooks)
    if len(rec.calls) != len(names) or rec.unsupported:
        raise Unsupported(
            f"{lm.spec!r}: the forward did not run each attention layer once as attnviz captures it"
        )
    layer_blocks = tuple(lay.model_layer(layer) for layer in range(len(names)))
    splits, notes = _splits(lm, st, list(rec.calls), layer_blocks, head_in)
    return MixedTrace(
        model_name=lm.spec,
        tokens=st.tokens,
        blocks=st,
        layer_blocks=layer_blocks,
        captured=tuple(rec.calls),
        attn_modules=tuple(c.module_name for c in rec.calls),
        rotary=tuple(rotary.get(c.module_name) for c in rec.calls),
        splits=splits,
        notes=tuple(notes),
    )


def _splits(
    lm: LoadedModel,
    st: Stream,
    calls: list[CapturedAttention],
    layer_blocks: tuple[int, ...],
    head_in: dict[str, torch.Tensor],
) -> tuple[dict[tuple[int, str], HeadSplit], list[str]]:
    """Every branch with heads split by head, each split checked on every row against the write."""
    dtype = next(lm.model.parameters()).dtype
    found: dict[tuple[int, str], HeadSplit] = {}
    for cap, b in zip(calls, layer_blocks, strict=True):
        name = cap.module_name
        if name not in head_in or "attention" not in st.scales[b]:
            continue
        try:
            heads = int(cap.query.shape[1])
            d_head = head_in[name].shape[-1] // heads
            w = output_weight(lm.model, name, heads, d_head).cpu()
        except AttnvizError:
            continue
        bias = output_bias(lm.model, name)
        b_o = None if bias is None else bias.detach().float().cpu()
        found[(b, "attention")] = HeadSplit(w, b_o, st.scales[b]["attention"], head_in[name])
    for b, parts in enumerate(st.head_inputs):
        for part, (proj, n_heads, x) in parts.items():
            if part not in st.scales[b]:
                continue
            w = proj.weight.detach().float().cpu()
            w = w.reshape(w.shape[0], n_heads, -1).permute(1, 0, 2)  # (heads, d_model, d_head)
            b_o = None if proj.bias is None else proj.bias.detach().float().cpu()
            found[(b, part)] = HeadSplit(w, b_o, st.scales[b][part], x.float().cpu())
    splits, notes = {}, []
    rows = torch.arange(st.n_tokens)
    for key, split in found.items():
        whole = split.writes(rows).sum(1) + (0 if split.bias is None else split.bias * split.scale)
        if close(whole, st.added[key[0]][key[1]].float().cpu(), dtype):
            splits[key] = split
        else:
            notes.append(
                f"block {key[0]}'s {key[1]} is one part: its heads through its output projection do not "
                "add up to what it writes (another path between them and the stream)"
            )
    return splits, notes


def mixed_parts(
    lm: LoadedModel, mt: MixedTrace, layer: int, rows: torch.Tensor
) -> Iterator[tuple[tuple[str, ...], torch.Tensor]]:
    """The parts of the stream entering ``layer``'s block at ``rows``, one block of origin at a time:
    (names, (rows, parts, d_model) float32 on the CPU). ``bias`` comes last."""
    st = mt.blocks
    block = mt.layer_blocks[layer]
    problems = [p for p in st.problem[:block] if p]
    if problems:
        raise Unsupported(
            f"{lm.spec!r}: {problems[0]}; the parts of the stream entering block {block} would not add up"
        )
    yield ("embed",), st.stream[0].float().cpu()[rows][:, None]
    bias = torch.zeros(len(rows), st.stream[0].shape[-1])
    for m in range(block):
        names: list[str] = []
        chunks: list[torch.Tensor] = []
        for part, added in st.added[m].items():
            split = mt.splits.get((m, part))
            if split is None:
                names.append(f"L{m}.{part}")
                chunks.append(added.float().cpu()[rows][:, None])
                continue
            writes = split.writes(rows)
            names += [
                f"L{m}H{h}" if part == "attention" else f"L{m}.{part}{h}" for h in range(writes.shape[1])
            ]
            chunks.append(writes)
            if split.bias is not None:
                bias += split.bias * split.scale
        yield tuple(names), torch.cat(chunks, 1)
    yield ("bias",), bias[:, None]
