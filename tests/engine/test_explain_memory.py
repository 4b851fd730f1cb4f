"""Peak memory stays O(N · d_model) per layer: no (N, N, d_model) tensor is ever made.

A TorchDispatchMode sees every tensor an operator returns. The explanations of a 160-token text
(trace, routes at threshold 0, i.e. every node expanded, the lens, the attribution) make nothing
of N² · d_model / 8 elements or more; LLM-TT's dense decomposition (the test oracle) does, so the
spy would see one.
"""

from __future__ import annotations

import tiny_explain as TE
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from attnviz.explain import information_flow, logit_attribution, logit_lens, trace

N = 160


class Largest(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.largest, self.op = 0, ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if hasattr(t, "numel") and t.numel() > self.largest:
                self.largest, self.op = t.numel(), str(func)
        return out


def test_no_n_by_n_by_d_model_tensor():
    lm = TE.loaded("llama-gqa")
    ids = [3 + (i * 37) % 300 for i in range(N)]
    d, heads = lm.layout.d_model, lm.layout.n_heads
    spy = Largest()
    with spy:
        tr = trace(lm, ids)
        graph = information_flow(lm, tr, threshold=0.0)
        logit_lens(lm, tr)
        logit_attribution(lm, tr)
    assert graph.expanded >= N  # threshold 0: far more than one chain was expanded
    assert spy.largest < N * N * d // 8, (spy.largest, spy.op)
    assert spy.largest <= 4 * heads * N * d, (spy.largest, spy.op)  # O(heads · N · d_model)
    dense = Largest()
    with dense:
        TE.dense_parts(lm, tr, 0, tr.probs(0, N - 1)[:, None].expand(heads, N, N))
    assert dense.largest >= N * N * d  # the spy does see the dense decomposition's tensor
