"""A routes node's vocabulary projection is its exact direct effect on the logits at its token."""

from __future__ import annotations

import tiny_explain as TE
import torch

from attnviz.explain import logit_attribution, node_writes, trace


def test_a_heads_projection_is_its_direct_logit_attribution_and_the_parts_add_up():
    lm = TE.loaded("llama-gqa")
    tr = trace(lm, TE.TEXT)
    pos = tr.n_tokens - 1
    w = node_writes(lm, tr, 1, pos, head=2, k=5)
    top_id = w.promoted[0][1]
    att = logit_attribution(lm, tr, token=pos, target=top_id)
    assert abs(w.logits[top_id].item() - att.heads[1, 2]) <= 1e-4 * max(1.0, abs(att.heads[1, 2]))
    assert [p[2] for p in w.promoted] == sorted((p[2] for p in w.promoted), reverse=True)
    assert w.suppressed[0][2] == w.logits.min().item() < 0 < w.promoted[0][2]
    # the block's write is its heads' writes plus what no head owns (b_O): the heads' sum is close
    heads = sum(node_writes(lm, tr, 1, pos, head=h).logits for h in range(tr.n_heads))
    block = node_writes(lm, tr, 1, pos, part="attention").logits
    assert torch.allclose(heads, block, atol=1e-4)
    mlp = att.mlps[0]
    assert abs(node_writes(lm, tr, 0, pos, part="ffn").logits[top_id].item() - mlp) <= 1e-4 * max(
        1.0, abs(mlp)
    )


def test_a_parallel_blocks_node_is_the_whole_blocks_write():
    """GPT-NeoX parallel: the stream entering layer l > 0 is written by block l - 1's attention and
    FFN together; its node clicks to that ("block"), whose Δlogits are the two parts' sum."""
    import attnviz

    lm = TE.loaded("gpt_neox-parallel")
    tr = trace(lm, TE.TEXT)
    graph = attnviz.information_flow(lm, tr, threshold=0.02)
    nodes = next(t for t in attnviz.flow_view(graph).data if t.name == "node (click)")
    assert {d[4] for d in nodes.customdata} == {"block"}
    pos = tr.n_tokens - 1
    block = node_writes(lm, tr, 0, pos, part="block")
    parts = (
        node_writes(lm, tr, 0, pos, part="attention").logits + node_writes(lm, tr, 0, pos, part="ffn").logits
    )
    assert torch.allclose(block.logits, parts, atol=1e-4) and block.name == "layer 0 block (attention + FFN)"
