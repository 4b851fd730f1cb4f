"""What wrote the stream a head reads: its parts at some positions, one layer of origin at a time.

Two sources, the same names (`attnviz.explain.qk`'s module doc):
- a `Trace` (models whose every block is attention + MLP): each earlier head's α·W_O v through the
  norm between the heads and the stream, each MLP, the embedding (and a learned position table),
  and ``bias`` (b_O and the norms' biases);
- a `MixedTrace` (hybrids, Bloom, MPT): each earlier block's branches from `read_stream`, split by
  head through their output projections where they have heads (`attnviz.explain.qk_mixed`).

`source(lm, text)` picks: the trace where it reads the model, else the block-boundary stream.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..loading import LoadedModel
from .norms import close
from .qk_mixed import MixedTrace, mixed_parts, mixed_trace
from .residual import Trace, trace
from .stream import adds_residual_inside, needs_stream

Source = Trace | MixedTrace
ROW_CHUNK = 256  # query rows of an earlier layer's α recomputed at once (memory: chunk x heads x N)


def reads_blocks(lm: LoadedModel) -> bool:
    """Whether the split reads ``lm``'s stream at block boundaries (`MixedTrace`), not its trace:
    hybrids, and Bloom / MPT, whose branches add the residual inside their modules."""
    return needs_stream(lm.layout) or adds_residual_inside(lm)


def source(lm: LoadedModel, text: str | list[int], *, chat: bool = False, max_tokens: int = 8192) -> Source:
    """What the split reads for ``lm``: the trace, or the stream at block boundaries (`reads_blocks`)."""
    if reads_blocks(lm):
        return mixed_trace(lm, text, chat=chat, max_tokens=max_tokens)
    return trace(lm, text, chat=chat, max_tokens=max_tokens)


def block_of(src: Source, layer: int) -> int:
    """The model's block index of attention layer ``layer``."""
    return src.layer_blocks[layer] if isinstance(src, MixedTrace) else layer


def parts(
    lm: LoadedModel, src: Source, layer: int, rows: torch.Tensor
) -> Iterator[tuple[tuple[str, ...], torch.Tensor]]:
    """The parts of the stream entering ``layer`` at ``rows``, one layer of origin at a time:
    (names, (rows, parts, d_model) float32 on the CPU). ``bias`` comes last."""
    if isinstance(src, MixedTrace):
        yield from mixed_parts(lm, src, layer, rows)
    else:
        yield from trace_parts(lm, src, layer, rows)


def _position_split(lm: LoadedModel, tr: Trace) -> torch.Tensor | None:
    """A learned position table's rows (N, d_model), where the first stream is exactly wte + wpe."""
    base = getattr(lm.model, "base_model", lm.model)
    wte, wpe = getattr(base, "wte", None), getattr(base, "wpe", None)
    if not isinstance(wte, torch.nn.Embedding) or not isinstance(wpe, torch.nn.Embedding):
        return None
    ids = torch.tensor(tr.tokens.ids, device=wte.weight.device)
    pos = wpe.weight.detach()[: tr.n_tokens].float().cpu()
    whole = wte.weight.detach()[ids].float().cpu() + pos
    return pos if close(whole, tr.stream[0].float().cpu(), tr.stream[0].dtype) else None


def trace_parts(
    lm: LoadedModel, tr: Trace, layer: int, rows: torch.Tensor
) -> Iterator[tuple[tuple[str, ...], torch.Tensor]]:
    """The parts of the stream entering ``layer`` at ``rows``, one layer of origin at a time:
    (names, (rows, parts, d_model) float32 on the CPU). ``bias`` comes last."""
    first = tr.stream[0].float().cpu()[rows]
    pos = _position_split(lm, tr)
    if pos is None:
        yield ("embed",), first[:, None]
    else:
        yield ("embed", "pos"), torch.stack([first - pos[rows], pos[rows]], 1)
    bias = torch.zeros_like(first)
    for m in range(layer):
        heads = torch.cat(
            [_head_writes(lm, tr, m, rows[c : c + ROW_CHUNK]) for c in range(0, len(rows), ROW_CHUNK)]
        )
        names = (*tuple(f"L{m}H{g}" for g in range(heads.shape[1])), f"L{m}.mlp")
        yield names, torch.cat([heads, tr.mlp_added[m].float().cpu()[rows][:, None]], 1)
        bias += _layer_bias(tr, m, rows)
    yield ("bias",), bias[:, None]


def _head_writes(lm: LoadedModel, tr: Trace, layer: int, rows: torch.Tensor) -> torch.Tensor:
    """N(W_O^g z^g) of every head g at ``rows``: (rows, heads, d_model), float32 on the CPU."""
    alpha = tr.probs_rows(layer, rows.tolist()).cpu()  # (rows, heads, keys)
    z = torch.einsum("rhk,hkd->rhd", alpha, tr.values(layer).cpu()[:, : alpha.shape[-1]])
    vec = torch.einsum("hmd,rhd->rhm", tr.w_o(lm, layer).cpu(), z)
    norm = tr.attn_norm[layer]
    return vec if norm is None else norm.apply(vec, rows.to(norm.scale.device)).cpu()


def _layer_bias(tr: Trace, layer: int, rows: torch.Tensor) -> torch.Tensor:
    """What the layer's attention adds that no head owns: N(b_O) + the norm's bias, (rows, d_model)."""
    out = torch.zeros(len(rows), tr.stream[0].shape[-1])
    bias, norm = tr.out_bias[layer], tr.attn_norm[layer]
    if bias is not None:
        b = bias.cpu()[None].expand(len(rows), -1)
        out += b if norm is None else norm.apply(b.to(norm.scale.device), rows.to(norm.scale.device)).cpu()
    if norm is not None and norm.constant is not None:
        out += norm.constant.cpu()
    return out
