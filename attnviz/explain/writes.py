"""What one node of the routes graph writes (the LLM Transparency Tool's node inspection).

A head, an attention block or an FFN block adds a vector v to the residual stream at one token t.
Its vocabulary projection here is its *direct effect on the logits at t*:

    Δlogits = W_U · N_f(v)

with N_f the final norm frozen at t's actual scale (the same freezing as `logit_attribution`, so a
head's entry for a token equals its direct logit attribution there) and no bias: the exact linear
share of t's logits that v owns, before any soft-capping (float32). The tokens it raises most are
"promoted", those it lowers most "suppressed". (LLM-TT normalises v by itself instead, which is
not a share of any logit.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from ..errors import AttnvizError
from ..loading import LoadedModel
from ..tokens import displays
from .attribution import final_frozen, head_outputs, head_writes
from .residual import Trace

Part = Literal["attention", "ffn", "block"]  # "block": a parallel block's attention + FFN
PART_NAMES = {"attention": "attention", "ffn": "FFN", "block": "block (attention + FFN)"}
PROJECTION = (
    "direct effect on the logits at this token: W_U · N_f(v), the final norm frozen at this "
    "token's scale, before any soft-capping (float32)"
)


@dataclass(frozen=True)
class NodeWrites:
    """What ``part`` of block ``layer`` (one ``head`` of it, or -1: the whole block) writes at
    ``position``: ``promoted`` / ``suppressed`` are (token, id, Δlogit), largest effect first."""

    model_name: str
    layer: int
    part: Part
    head: int
    position: int
    norm: float  # ‖v‖₂ of what it writes
    promoted: tuple[tuple[str, int, float], ...]
    suppressed: tuple[tuple[str, int, float], ...]
    logits: torch.Tensor  # (vocab,) float32: the full Δlogits
    meaning: str = PROJECTION

    @property
    def name(self) -> str:
        return f"layer {self.layer} " + (f"head {self.head}" if self.head >= 0 else PART_NAMES[self.part])


@torch.inference_mode()
def node_writes(
    lm: LoadedModel,
    tr: Trace,
    layer: int,
    position: int,
    *,
    part: Part = "attention",
    head: int = -1,
    k: int = 10,
) -> NodeWrites:
    """What a head (``head`` ≥ 0, attention only), an attention block or an FFN block writes to
    the stream at ``position``, projected on the vocabulary (see the module doc)."""
    if tr.unembed_problem:
        raise AttnvizError(f"no vocabulary projection: {tr.unembed_problem}")
    if not 0 <= layer < tr.n_layers:
        raise AttnvizError(f"layer {layer} is out of range: this model has layers 0..{tr.n_layers - 1}")
    row = tr.position(position)
    if head >= 0:
        if part != "attention" or head >= tr.n_heads:
            raise AttnvizError(f"no head {head} in layer {layer}'s {part}")
        if tr.heads_problem:
            raise AttnvizError(f"no per-head output: {tr.heads_problem}")
        vec = head_writes(lm, tr, layer, row, head_outputs(tr, layer, row))[head]
    elif part == "block":
        vec = tr.attn_added[layer][row].float() + tr.mlp_added[layer][row].float()
    else:
        vec = (tr.attn_added if part == "attention" else tr.mlp_added)[layer][row]
    vec = vec.float()
    frozen = final_frozen(lm, tr.stream[-1][row : row + 1])
    normed = frozen.apply(vec[None].to(tr.stream[-1].device), slice(0, 1))[0]
    w = lm.model.get_output_embeddings().weight.detach().float()
    logits = (w @ normed.to(w.device)).cpu()
    k = max(1, min(int(k), logits.numel()))
    top, bottom = torch.topk(logits, k), torch.topk(-logits, k)

    def listed(ids: torch.Tensor) -> tuple[tuple[str, int, float], ...]:
        ids_list = [int(i) for i in ids]
        names = displays(lm.tokenizer, ids_list)
        return tuple((n, i, float(logits[i])) for n, i in zip(names, ids_list, strict=True))

    return NodeWrites(
        lm.spec,
        layer,
        part,
        head,
        row,
        float(vec.norm()),
        listed(top.indices),
        listed(bottom.indices),
        logits,
    )
