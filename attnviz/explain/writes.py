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

import torch

from ..errors import AttnvizError
from ..loading import LoadedModel
from ..mixers.kinds import MIXERS
from ..tokens import displays
from .attribution import final_frozen, head_outputs, head_writes
from .block_trace import BlockTrace
from .residual import Trace, logit_multiplier

# "attention", "ffn", "block" (a parallel block's attention + FFN); on hybrids and recurrent models
# also a mixer kind ("gated_delta") and "mixing" (a block's token-mixing branches together)
Part = str
PART_NAMES = {
    "attention": "attention",
    "ffn": "FFN",
    "block": "block (attention + FFN)",
    "mixing": "token mixing (every branch)",
    **{k: f"{m.display} mixer" for k, m in MIXERS.items() if k != "attention"},
}
PROJECTION = (
    "direct effect on the logits at this token: W_U · N_f(v), the final norm frozen at this "
    "token's scale, times the model's logit multiplier, before any soft-capping (float32)"
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
        what = PART_NAMES.get(self.part, self.part)
        return f"layer {self.layer} " + (f"{what} head {self.head}" if self.head >= 0 else what)


@torch.inference_mode()
def node_writes(
    lm: LoadedModel,
    tr: Trace | BlockTrace,
    layer: int,
    position: int,
    *,
    part: Part = "attention",
    head: int = -1,
    k: int = 10,
) -> NodeWrites:
    """What a head (``head`` ≥ 0: of the attention, or of a per-head mixer on a `BlockTrace`), an
    attention block, a mixer, a block's token mixing or an FFN block writes to the stream at
    ``position``, projected on the vocabulary (see the module doc)."""
    if tr.unembed_problem:
        raise AttnvizError(f"no vocabulary projection: {tr.unembed_problem}")
    if not 0 <= layer < tr.n_layers:
        raise AttnvizError(f"layer {layer} is out of range: this model has layers 0..{tr.n_layers - 1}")
    row = tr.position(position)
    if isinstance(tr, BlockTrace):
        vec = block_write(tr, layer, row, part, head)
        final = tr.stream.stream[-1]
    elif head >= 0:
        if part != "attention" or head >= tr.n_heads:
            raise AttnvizError(f"no head {head} in layer {layer}'s {part}")
        if tr.heads_problem:
            raise AttnvizError(f"no per-head output: {tr.heads_problem}")
        vec = head_writes(lm, tr, layer, row, head_outputs(tr, layer, row))[head]
    elif part == "block":
        vec = tr.attn_added[layer][row].float() + tr.mlp_added[layer][row].float()
    else:
        vec = (tr.attn_added if part == "attention" else tr.mlp_added)[layer][row]
    if isinstance(tr, Trace):
        final = tr.stream[-1]
    vec = vec.float()
    frozen = final_frozen(lm, final[row : row + 1])
    normed = frozen.apply(vec[None].to(final.device), slice(0, 1))[0]
    w = lm.model.get_output_embeddings().weight.detach().float()
    logits = (w @ normed.to(w.device)).cpu() * logit_multiplier(lm)
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


def block_write(tr: BlockTrace, layer: int, row: int, part: str, head: int) -> torch.Tensor:
    """What block ``layer``'s ``part`` (one ``head`` of a per-head branch, or -1) of a hybrid or
    recurrent model writes at ``row``: a head's Σ_s c_{t,s} (no bias), a branch's checked write,
    "mixing" (every branch), "ffn", or "block" (all of it)."""
    if tr.problems[layer]:
        raise AttnvizError(f"{tr.model_name!r}: {tr.problems[layer]}")
    branches, mlp = tr.parts[layer], tr.mlp[layer]
    if head >= 0:
        found = branches.get(part)
        if found is None or not found.per_head or not 0 <= head < found.n_heads:
            have = ", ".join(f"{k} ({p.n_heads} heads)" for k, p in branches.items() if p.per_head)
            raise AttnvizError(
                f"no head {head} of a {part} branch in block {layer}; it has: {have or 'none'}"
            )
        return found.vectors(row)[head].sum(dim=0)
    if part in branches:
        return tr.added[layer][part][row]
    mixing = sum((tr.added[layer][k][row] for k in branches), torch.zeros_like(tr.residual_in[layer][row]))
    if part == "mixing":
        return mixing
    if part in ("ffn", "block") and mlp is not None:
        return mlp[row] if part == "ffn" else mixing + mlp[row]
    raise AttnvizError(f"block {layer} has no {part} part; it has {', '.join(tr.part_names(layer))}")
